/* The decode step over int8 caches in the AMX tile unit, with integer products (the amx
 * table's cache_step where the CPU has AMX-INT8 and AVX512_VBMI; the rest takes
 * decode_cache_avx512.c's step: fp8 caches of bf16 problems in decode_cache_fp16.c's f16
 * arithmetic where the CPU has AVX512_FP16 and GFNI; f16 and other fp8 caches, head dims
 * past 128 and a q with a non-finite element in f32). There, four f32 multiply-adds per cache
 * element (four query rows share a kv head) and the codes' conversions keep the vector ports
 * busier than the memory is; here the codes are read by the tile unit as they lie in the
 * cache, as int8, and the ports do little.
 *
 * Each of q and the weights w = p_j * vscale_j (p rounded to the problem's dtype first, the
 * product an f32, as the f32 step has them) is written, per query row, as an integer
 * X = round(x * 2^E) with |X| < 2^30 in four signed base-256 digits, X = sum_p x_p 256^p,
 * x_p in [-128, 127]: the tiles' sums of digit times code are exact int32 (at most 128 x 127
 * x 128 < 2^24 per sum, so their conversion to f32 is exact too) and a row's result is
 * sum_p 2^(8 p - E) * sum_p, rounded in f32 as the f32 step's sums are. What rounding to
 * X drops is at most 2^-31 of the row's largest |x| per element: a query element or a
 * weight below that (2^-30 of the largest) counts as nearly 0 (docs/caches.md, "How a tile
 * computes").
 *
 * Tiles (all 16 rows x 64 bytes): 0, 1 C (16 keys x 16 columns, column 4 p + r: digit p,
 * row r; for p V, 16 rows 4 p + r x 16 value columns), two blocks in flight. Scores: 2, 3
 * B, q's digits for head dims 0..63 and 64..127 (16 quads of dims x 16 columns); 4, 5 and
 * 6, 7 A, 16 key rows x 64 dims as they lie in the cache. p V: 4, 5 A, the weights' digits
 * for keys 0..63 and 64..127 (16 rows x 64 keys); 2, 3 and 6, 7 B, 64 keys (16 quads) x 16
 * value columns interleaved from the cache rows (vb). */
#include "amx_tiles.h"
#include "decode_cache_avx512.h"
#include "vexp.h"

#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define KEYS FA_DECODE_MAX_TILE /* keys per step at most (128) */
#define DIM 128                 /* head dims (and value columns) at most */
/* Lines of the next tile prefetched per 16 keys of scores (12), per 4 value rows interleaved
 * (6), per 4 keys of the softmax (3), per 16 keys of the weights' digits (12) and per 16
 * columns of p V (12): 96 + 192 + 96 + 96 + 96 = 576 a head at D = 128 (the f32 step issues
 * 608), the whole next tile by the eighth of 8 heads: on the amx table nothing else brings
 * it (decode.c reads only what they left: isa.h, touch_rest). Spread over every phase of
 * the step: with 24 a block in the scores and in p V and none in the softmax and digits,
 * p V's bursts waited on the core's outstanding misses while the phases between issued
 * none, 7% slower; half or two thirds of the old counts were 2-18% slower
 * (bench/RESULTS.md, 2026-12-05 late and 2026-12-06). */
#define PF_QK 12
#define PF_EXP 3
#define PF_QUAD 6
#define PF_PV 12
#define PF_DIG 12

#define TILE_DPI(c, a, b) _tile_dpbssd(c, a, b)

/* cpuid: AMX-INT8 and AVX512_VBMI (value_quads' byte permutes; the amx table's probe has seen
 * AMX-TILE and the OS's permission). */
static int int8_tiles(void) {
    static atomic_int state; /* 0: not asked yet, 1: yes, 2: no */
    int s = atomic_load(&state);
    if (!s) {
        unsigned a, b, c, d;
        s = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25)) && (c & (1u << 1)) ? 1 : 2;
        atomic_store(&state, s);
    }
    return s == 1;
}

/* Scores and weights are laid out a vector per 4 keys: lane 4 j + r, key j, query row r of a
 * group of 4. */

/* Every tile 16 rows x 64 bytes (rows past what a product uses are zeros). */
static const fa_tile_config amx_cfg = {.palette = 1,
                                          .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                          .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

/* Lanes 4 j + r of x reduced over j: row r's result in lane r of every 128 bits. */
INLINE __m512 rows_max(__m512 x) {
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4e));
    return _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
}
INLINE __m512 rows_sum(__m512 x) {
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4e));
    return _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
}
/* Lane 4 k + r: the sum over p of lanes 4 p + r of y[k] (4 keys' C rows, scaled). */
INLINE __m512 sum_digits(const __m512 y[4]) {
    const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x44), _mm512_shuffle_f32x4(y[0], y[1], 0xee));
    const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x44), _mm512_shuffle_f32x4(y[2], y[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
}

/* s[j][r] (lane 4 j + r) of keys j0.. j0 + 15 from their C tile c (16 keys x 16 int32
 * columns, column 4 p + r: digit p of row r), each column times cs's lane. */
INLINE void score_rows(const int32_t *c, __m512 cs, int rows, float *s) {
    for (int x = 0; x < 4 && 4 * x < rows; x++) {
        __m512 y[4];
        for (int k = 0; k < 4; k++) y[k] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * (4 * x + k))), cs);
        _mm512_store_ps(s + 16 * x, sum_digits(y));
    }
}

/* The online-softmax step between the products, for rows r0.. (mr <= 4; mx, sum: theirs) of a
 * tile of n keys: s the scores' products (lane 4 j + r), ksc and vsc the keys' and values'
 * scales (padded with 1s to n rounded up to 64): scores times the key's scale and the
 * softmax scale, the row max (a NaN never wins), base = the new max (0 while it is -inf),
 * alpha = exp(old max - base), p = exp(score - base) summed unrounded into sum (times alpha)
 * and rounded to pd, and w = p times the value's scale (lane 4 j + r, 0 past n up to the
 * 64-key block). Returns the largest w of each row (lane r of every 128 bits). */
INLINE __m512 softmax_weights(const float *s, int n, const float *ksc, const float *vsc, float scale,
                                     fa_dtype pd, int mr, float *mx, float *sum, float *w, float *alpha,
                                     fa_decode_prefetch *pf) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    const __m512i to_key = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int nv = (n + 3) / 4, n64 = (n + 63) & ~63;
    __m512 S[KEYS / 4], top = neg_inf;
    for (int b = 0; b < nv; b++) { /* keys 4 b.. 4 b + 3 */
        const __m512 ks = _mm512_permutexvar_ps(to_key, _mm512_castps128_ps512(_mm_loadu_ps(ksc + 4 * b)));
        S[b] = _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(s + 16 * b), ks), vscale);
        if (4 * b + 4 > n) S[b] = _mm512_mask_mov_ps(neg_inf, (__mmask16)((1u << (4 * (n - 4 * b))) - 1), S[b]);
        top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
    }
    float tops[16], base[4] = {0, 0, 0, 0};
    _mm512_storeu_ps(tops, rows_max(top));
    for (int r = 0; r < 4; r++) alpha[r] = 1.0f;
    for (int r = 0; r < mr; r++) {
        const float m_old = mx[r], m_new = m_old > tops[r] ? m_old : tops[r];
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = fa_vexpf(m_old - base[r]);
        mx[r] = m_new;
    }
    const __m512 vbase = _mm512_broadcast_f32x4(_mm_loadu_ps(base));
    __m512 total = _mm512_setzero_ps(), wtop = _mm512_setzero_ps();
    for (int b = 0; b < n64 / 4; b++) {
        fa_decode_prefetch_lines(pf, PF_EXP);
        __m512 x = _mm512_setzero_ps();
        if (b < nv) {
            const __m512 e = fa_avx512_exp_nonpos(_mm512_sub_ps(S[b], vbase));
            total = _mm512_add_ps(total, e);
            const __m512 vs = _mm512_permutexvar_ps(to_key, _mm512_castps128_ps512(_mm_loadu_ps(vsc + 4 * b)));
            x = _mm512_mul_ps(round_to(e, pd), vs);
            wtop = _mm512_max_ps(wtop, x);
        }
        _mm512_store_ps(w + 16 * b, x);
    }
    float sums[16];
    _mm512_storeu_ps(sums, rows_sum(total));
    for (int r = 0; r < mr; r++) sum[r] = sum[r] * alpha[r] + sums[r];
    return rows_max(wtop);
}

/* Row r's weights of keys j0.. j0 + 15 (w in lane 4 j + r, as softmax_weights leaves it). */
INLINE __m512 row_weights(const float *w, int j0, int r) {
    const __m512 *wv = (const __m512 *)(w + 4 * j0);
    const __m512i idx = _mm512_setr_epi32(r, 4 + r, 8 + r, 12 + r, 16 + r, 20 + r, 24 + r, 28 + r, r, 4 + r, 8 + r,
                                          12 + r, 16 + r, 20 + r, 24 + r, 28 + r);
    const __m512 lo = _mm512_permutex2var_ps(wv[0], idx, wv[1]), hi = _mm512_permutex2var_ps(wv[2], idx, wv[3]);
    return _mm512_shuffle_f32x4(lo, hi, 0x44);
}

/* The four digits of X = round(x * 2^e) (|X| < 2^30) as bytes, digit p in dig[p]. */
INLINE void digits(__m512 x, __m512 e, __m128i dig[4]) {
    __m512i v = _mm512_cvt_roundps_epi32(_mm512_scalef_ps(x, e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    for (int p = 0; p < 3; p++) {
        const __m512i low = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
        dig[p] = _mm512_cvtepi32_epi8(low);
        v = _mm512_srai_epi32(_mm512_sub_epi32(v, low), 8);
    }
    dig[3] = _mm512_cvtepi32_epi8(v);
}

/* E for a row whose largest |x| is top: top * 2^E < 2^30 (0 for top 0). */
INLINE int row_exponent(float top) { return top > 0.0f ? 29 - ilogbf(top) : 0; }

/* Whether all m rows of q (d floats each) are finite. */
static int q_finite(const float *q, int m, int d) {
    __mmask16 bad = 0;
    for (int r = 0; r < m; r++)
        for (int c = 0; c < d; c += 16) {
            const __m512 x = _mm512_maskz_loadu_ps(fa_mask16(d - c), q + (int64_t)r * d + c);
            bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_NEQ_UQ); /* inf - inf, NaN */
        }
    return !bad;
}

/* q's digits of rows r0.. (mr <= 4; rows past mr zero; all finite) as B tiles
 * qb[h][kk][16] (dword column 4 p + r: digit p of dims 64 h + 4 kk.. + 3 of row r), and cs:
 * lane 4 p + r holds 2^(8 p - E_r). */
static void q_digits(const float *q, int d, int mr, uint32_t *qb, __m512 *cs) {
    uint8_t dig[16][DIM] __attribute__((aligned(64))); /* row 4 p + r */
    float e[16];
    memset(dig, 0, sizeof dig);
    for (int r = 0; r < 4; r++) {
        __m512 top = _mm512_setzero_ps();
        if (r < mr)
            for (int c = 0; c < d; c += 16) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(fa_mask16(d - c), q + (int64_t)r * d + c)));
        const int E = row_exponent(_mm512_reduce_max_ps(top));
        for (int p = 0; p < 4; p++) e[4 * p + r] = ldexpf(1.0f, 8 * p - E);
        for (int c = 0; r < mr && c < d; c += 16) {
            __m128i x[4];
            digits(_mm512_maskz_loadu_ps(fa_mask16(d - c), q + (int64_t)r * d + c), _mm512_set1_ps((float)E), x);
            for (int p = 0; p < 4; p++) _mm_store_si128((__m128i *)&dig[4 * p + r][c], x[p]);
        }
    }
    *cs = _mm512_loadu_ps(e);
    for (int h = 0; h < (d + 63) / 64; h++) {
        __m512 rows[16]; /* column 4 p + r: its 16 dwords (dim quads) of block h */
        for (int c = 0; c < 16; c++) rows[c] = _mm512_load_ps((const float *)&dig[c][64 * h]);
        fa_avx512_transpose16(rows);
        for (int kk = 0; kk < 16; kk++) _mm512_storeu_ps((float *)(qb + (h * 16 + kk) * 16), rows[kk]);
    }
}

/* q's digits as the steps of an item use them: every tile of a sequence's chunk has the same
 * q for a kv head, so the step keeps the digits of the q rows it saw, 4 rows an entry, in the
 * workspace the driver keeps for it in the thread's scratch (fa_decode_cache_tile.ws, zeroed
 * at the call's start), entries indexed by the rows' address and known by their address and
 * the driver's tag for them (fa_decode_cache_tile.q_tag), or without a tag by a copy of them
 * (compared whole, 3% of an int8 call: the driver stages each item's q at the same address). */
#define MEMO_ENTRIES 16
typedef struct {
    const float *at; /* the rows' address */
    uint64_t tag;    /* their tag, 0: none */
    int d, mr, finite;
    float q[4 * DIM];
    uint32_t qb[2 * 16 * 16];
    float cs[16];
} __attribute__((aligned(64))) q_memo;
_Static_assert(sizeof(q_memo) * MEMO_ENTRIES <= FA_DECODE_CACHE_WS_BYTES, "the driver's workspace holds the memo");

/* The entry for rows q.. (mr <= 4 of d floats; tag: fa_decode_cache_tile.q_tag) in the
 * table (NULL: the one-off entry own), made if it holds other rows. */
static const q_memo *memo_of(q_memo *table, q_memo *own, const float *q, int mr, int d, uint64_t tag) {
    q_memo *mm = table ? &table[((uintptr_t)q / (sizeof(float) * 4 * (size_t)d)) % MEMO_ENTRIES] : own;
    const size_t bytes = sizeof(float) * (size_t)mr * (size_t)d;
    if (table && mm->mr == mr && mm->d == d &&
        (tag ? mm->tag == tag && mm->at == q : !memcmp(mm->q, q, bytes)))
        return mm;
    mm->mr = 0; /* invalid until complete */
    mm->at = q, mm->tag = tag;
    memcpy(mm->q, q, bytes);
    mm->finite = q_finite(q, mr, d);
    if (mm->finite) {
        __m512 cs;
        q_digits(q, d, mr, mm->qb, &cs);
        _mm512_storeu_ps(mm->cs, cs);
    }
    mm->mr = mr, mm->d = d;
    return mm;
}

/* vpermt2b's picks for value_quads: word 8 L + 4 h + k of the pairs of rows a, b is the pair
 * of column 16 h + 4 L + k (+ 32 for the high half), so that unpacking words of the pairs of
 * rows 0, 1 with those of rows 2, 3 leaves each quad's dword in column order. */
#define PAIR(w, hi) (uint8_t)(16 * (((w) >> 2) & 1) + 4 * ((w) >> 3) + ((w) & 3) + 32 * (hi))
#define PAIRS4(w, hi) PAIR(w, hi), 64 + PAIR(w, hi), PAIR((w) + 1, hi), 64 + PAIR((w) + 1, hi), \
                      PAIR((w) + 2, hi), 64 + PAIR((w) + 2, hi), PAIR((w) + 3, hi), 64 + PAIR((w) + 3, hi)
#define PAIRS32(hi) PAIRS4(0, hi), PAIRS4(4, hi), PAIRS4(8, hi), PAIRS4(12, hi), PAIRS4(16, hi), \
                    PAIRS4(20, hi), PAIRS4(24, hi), PAIRS4(28, hi)
static const uint8_t pair_lo[64] __attribute__((aligned(64))) = {PAIRS32(0)};
static const uint8_t pair_hi[64] __attribute__((aligned(64))) = {PAIRS32(1)};
#undef PAIRS32
#undef PAIRS4
#undef PAIR

/* Keys 4 kk.. 4 kk + 3 (x0..x3: 64 columns each) as the quads of 64 columns, to dst and the
 * three column blocks after it (a block KEYS / 4 quads of 16 dwords); plo, phi: pair_lo, pair_hi. */
INLINE void quads_of(__m512i x0, __m512i x1, __m512i x2, __m512i x3, __m512i plo, __m512i phi, uint32_t *dst,
                     int blocks) {
    const __m512i ab0 = _mm512_permutex2var_epi8(x0, plo, x1), ab1 = _mm512_permutex2var_epi8(x0, phi, x1);
    const __m512i cd0 = _mm512_permutex2var_epi8(x2, plo, x3), cd1 = _mm512_permutex2var_epi8(x2, phi, x3);
    const int64_t bs = (KEYS / 4) * 16;
    _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(ab0, cd0));
    if (blocks > 1) _mm512_storeu_si512(dst + bs, _mm512_unpackhi_epi16(ab0, cd0));
    if (blocks > 2) _mm512_storeu_si512(dst + 2 * bs, _mm512_unpacklo_epi16(ab1, cd1));
    if (blocks > 3) _mm512_storeu_si512(dst + 3 * bs, _mm512_unpackhi_epi16(ab1, cd1));
}

/* Quads [kk0, kk1) of the value rows as B tiles vb[cb][kk][16] (dword c: the codes of keys
 * 4 kk.. 4 kk + 3, column 16 cb + c), zero past n up to the 64-key block. Per 4 keys and 64 columns, 4 byte
 * permutes and 4 word unpacks (byte and word unpacks with lane shuffles took 16, all on
 * the one shuffle port); quads of whole rows and columns take plain loads, unrolled (the
 * general loop's arrays went through the stack: 0.75 of its time, bench/RESULTS.md). */
INLINE void value_quads(const fa_decode_cache_tile *t, uint32_t *vb, int kk0, int kk1) {
    const int cbs = (t->dv + 15) / 16, whole = t->dv % 64 == 0 ? t->n / 4 : 0;
    const int8_t *v = (const int8_t *)t->v;
    const int64_t vs = t->vstride;
    const __m512i plo = _mm512_load_si512(pair_lo), phi = _mm512_load_si512(pair_hi);
    for (int kk = kk0; kk < kk1; kk++) {
        if (kk < whole) {
            const int8_t *x = v + 4 * kk * vs;
            for (int c0 = 0; c0 < t->dv; c0 += 64, x += 64)
                quads_of(_mm512_loadu_si512(x), _mm512_loadu_si512(x + vs), _mm512_loadu_si512(x + 2 * vs),
                         _mm512_loadu_si512(x + 3 * vs), plo, phi, vb + ((int64_t)(c0 / 16) * (KEYS / 4) + kk) * 16, 4);
        } else {
            for (int c0 = 0; c0 < t->dv; c0 += 64) {
                const __mmask64 m = t->dv - c0 >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (t->dv - c0)) - 1;
                __m512i x[4];
                for (int i = 0; i < 4; i++) {
                    const int j = 4 * kk + i;
                    x[i] = j < t->n ? _mm512_maskz_loadu_epi8(m, v + (int64_t)j * vs + c0) : _mm512_setzero_si512();
                }
                quads_of(x[0], x[1], x[2], x[3], plo, phi, vb + ((int64_t)(c0 / 16) * (KEYS / 4) + kk) * 16,
                         cbs - c0 / 16);
            }
        }
        fa_decode_prefetch_lines(t->pf, PF_QUAD);
    }
}

/* The A tile of keys j0.. (16 rows; rows past n or dims past d from a zeroed copy, never
 * read from the cache). */
INLINE const int8_t *key_rows(const fa_decode_cache_tile *t, int j0, int8_t *staged, long *stride) {
    const int rows = t->n - j0 < 16 ? t->n - j0 : 16;
    const int8_t *a = (const int8_t *)t->k + (int64_t)j0 * t->kstride;
    *stride = (long)t->kstride;
    if (t->d % 64 == 0 && rows == 16) return a;
    memset(staged, 0, 16 * DIM);
    for (int j = 0; j < rows; j++) memcpy(staged + j * DIM, a + (int64_t)j * t->kstride, (size_t)t->d);
    *stride = DIM;
    return staged;
}

/* The products of keys j0.. j0 + 15 into C tile c (A tiles a0, a1 for dims 0..63, 64..127). */
#define QK_ISSUE(c, a0, a1, j0)                                  \
    do {                                                         \
        long sa_;                                                \
        const int8_t *a_ = key_rows(t, j0, staged[c], &sa_);     \
        TILE_ZERO(c);                                            \
        TILE_LOAD(a0, a_, sa_);                                  \
        TILE_DPI(c, a0, 2);                                      \
        if (two) {                                               \
            TILE_LOAD(a1, a_ + 64, sa_);                         \
            TILE_DPI(c, a1, 3);                                  \
        }                                                        \
    } while (0)

/* s[j][r] = q_r . code_j (rows r0.., all 4 lanes of a key) for keys [0, n rounded up to 4),
 * 16 keys a block, pipelined: block i + 1's products are issued (C tile and A tiles of the
 * other parity) before block i's C tile is stored, so the tile unit works while the ports
 * finish block i, and (vb not NULL) build the value quads of block i's keys. */
static void scores(const fa_decode_cache_tile *t, const uint32_t *qb, __m512 cs, float *s, uint32_t *vb) {
    int32_t c[16 * 16] __attribute__((aligned(64)));
    int8_t staged[2][16 * DIM] __attribute__((aligned(64)));
    const int two = t->d > 64, nb = (t->n + 15) / 16;
    TILE_LOAD(2, qb, 64);
    if (two) TILE_LOAD(3, qb + 256, 64);
    QK_ISSUE(0, 4, 5, 0);
    for (int i = 0; i < nb; i++) {
        if (vb) value_quads(t, vb, 4 * i, 4 * i + 4); /* while the tile unit works */
        if (i % 2 == 0) {
            if (i + 1 < nb) QK_ISSUE(1, 6, 7, 16 * (i + 1));
            TILE_STORE(0, c, 64);
        } else {
            if (i + 1 < nb) QK_ISSUE(0, 4, 5, 16 * (i + 1));
            TILE_STORE(1, c, 64);
        }
        score_rows(c, cs, t->n - 16 * i, s + (int64_t)i * 64);
        fa_decode_prefetch_lines(t->pf, PF_QK);
    }
}
#undef QK_ISSUE

/* cols (<= 16) columns of o rows r0.. (mr <= 4) = o * alpha + sum_p f[4 p + r] * C[4 p + r]
 * (the C tile c's digit sums). */
INLINE void add_columns(const int32_t *c, const float *f, int mr, int cols, const float *alpha, float *o, int ldo) {
    const __mmask16 k = cols >= 16 ? (__mmask16)0xffff : fa_mask16(cols);
    for (int r = 0; r < mr; r++) {
        __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + (int64_t)r * ldo), _mm512_set1_ps(alpha[r]));
        for (int p = 3; p >= 0; p--) /* the largest first */
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * (4 * p + r))), _mm512_set1_ps(f[4 * p + r]), acc);
        _mm512_mask_storeu_ps(o + (int64_t)r * ldo, k, acc);
    }
}

/* The products of column block cb into C tile c (B tiles b0, b1 for keys 0..63, 64..127). */
#define PV_ISSUE(c, b0, b1, cb)                                               \
    do {                                                                      \
        const uint32_t *b_ = vb + (int64_t)(cb) * (KEYS / 4) * 16;            \
        TILE_ZERO(c);                                                         \
        TILE_LOAD(b0, b_, 64);                                                \
        TILE_DPI(c, 4, b0);                                                   \
        if (two) {                                                            \
            TILE_LOAD(b1, b_ + 256, 64);                                      \
            TILE_DPI(c, 5, b1);                                               \
        }                                                                     \
    } while (0)

/* o rows r0.. (mr <= 4) = o * alpha + W V: wa the weights' digits (row 4 p + r, KEYS keys),
 * ws lane 4 p + r: 2^(8 p - E_r). Column blocks of 16, pipelined as the scores are (C tiles
 * 0, 1; B tiles 2, 3 and 6, 7). */
static void weighted_values(const fa_decode_cache_tile *t, const int8_t *wa, __m512 ws, const uint32_t *vb, int mr,
                            const float *alpha, float *o, int ldo) {
    int32_t c[16 * 16] __attribute__((aligned(64)));
    const int two = t->n > 64, cbs = (t->dv + 15) / 16;
    TILE_LOAD(4, wa, KEYS);
    if (two) TILE_LOAD(5, wa + 64, KEYS);
    float f[16];
    _mm512_storeu_ps(f, ws);
    PV_ISSUE(0, 2, 3, 0);
    for (int cb = 0; cb < cbs; cb++) {
        if (cb % 2 == 0) {
            if (cb + 1 < cbs) PV_ISSUE(1, 6, 7, cb + 1);
            TILE_STORE(0, c, 64);
        } else {
            if (cb + 1 < cbs) PV_ISSUE(0, 2, 3, cb + 1);
            TILE_STORE(1, c, 64);
        }
        add_columns(c, f, mr, t->dv - 16 * cb, alpha, o + 16 * cb, ldo);
        fa_decode_prefetch_lines(t->pf, PF_PV);
    }
}
#undef PV_ISSUE

/* The online-softmax step of decode_cache_avx512.c's step_all (the same rules: scores
 * times the key's scale and the softmax scale, the row max, base, alpha, p summed unrounded
 * and rounded to pd, then o = o alpha + p V with the value rows' scales). */
static void step_int8(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum, float *acc,
                      int ldacc) {
    uint32_t vb[(DIM / 16) * (KEYS / 4) * 16] __attribute__((aligned(64)));
    int8_t wa[16 * KEYS] __attribute__((aligned(64)));
    float s[KEYS * 4] __attribute__((aligned(64)));
    float ksc[SCALES_MAX], vsc[SCALES_MAX]; /* padded with 1s: p = 0 for missing keys, 0 * 1 */
    const int n = t->n, n64 = (n + 63) & ~63;
    tile_scales(t->kscale, t->sstride, n, 1.0f, ksc);
    tile_scales(t->vscale, t->sstride, n, 1.0f, vsc);
    for (int j = n; j < n64; j++) ksc[j] = vsc[j] = 1.0f;
    fa_tiles_load(&amx_cfg);
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        q_memo own;
        const q_memo *qm = memo_of(t->ws, &own, t->q + (int64_t)r0 * t->d, mr, t->d, t->q_tag); /* finite: checked */
        scores(t, qm->qb, _mm512_loadu_ps(qm->cs), s, r0 == 0 ? vb : NULL);
        if (r0 == 0) value_quads(t, vb, 4 * ((n + 15) / 16), n64 / 4);
        float w[KEYS * 4] __attribute__((aligned(64))); /* lane 4 j + r */
        float alpha[4];
        const __m512 wtop = softmax_weights(s, n, ksc, vsc, scale, pd, mr, mx + r0, sum + r0, w, alpha, t->pf);
        float wt[16], ws[16];
        _mm512_storeu_ps(wt, wtop);
        for (int r = 0; r < 4; r++) {
            const int E = row_exponent(wt[r]);
            for (int p = 0; p < 4; p++) ws[4 * p + r] = ldexpf(1.0f, 8 * p - E);
            wt[r] = (float)E;
        }
        for (int j0 = 0; j0 < n64; j0 += 16) { /* 16 keys: row r's weights */
            for (int r = 0; r < 4; r++) {
                __m128i dg[4];
                digits(row_weights(w, j0, r), _mm512_set1_ps(wt[r]), dg);
                for (int p = 0; p < 4; p++) _mm_store_si128((__m128i *)(wa + (4 * p + r) * KEYS + j0), dg[p]);
            }
            fa_decode_prefetch_lines(t->pf, PF_DIG);
        }
        weighted_values(t, wa, _mm512_loadu_ps(ws), vb, mr, alpha, acc + (int64_t)r0 * ldacc, ldacc);
    }
    fa_tiles_release();
}

void fa_decode_cache_step_amx(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                              float *acc, int ldacc) {
    /* a q element that is not finite has no digits: the f32 step gives its NaN scores */
    if (t->t == FA_INT8 && t->d <= DIM && t->dv <= DIM && int8_tiles()) {
        int finite = 1;
        q_memo own;
        for (int r0 = 0; r0 < t->m && finite; r0 += 4)
            finite = memo_of(t->ws, &own, t->q + (int64_t)r0 * t->d, t->m - r0 < 4 ? t->m - r0 : 4, t->d,
                             t->q_tag)->finite;
        if (finite) {
            step_int8(t, scale, pd, mx, sum, acc, ldacc);
            return;
        }
    }
    /* fp8 of bf16 problems in f16 arithmetic where the CPU has it; the rest in f32 */
    fa_decode_cache_step_avx512(t, scale, pd, mx, sum, acc, ldacc);
}
