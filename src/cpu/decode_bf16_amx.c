/* The bf16 decode step in the AMX tile unit (the amx table's `step`: bf16 caches of bf16
 * problems on CPUs with AMX-BF16, head and value dims multiples of 32 up to 128; other
 * tiles, and those whose products show an inf or NaN, take decode_avx512bf16.c's step,
 * fa_decode_step_bf16). A
 * kv head's query rows go 4 at a time, as in that step.
 *
 * Why: on the AMX Xeons measured here `vdpbf16ps` issues one every two cycles, so the
 * AVX512_BF16 step (32 of them per key and kv head at D = 128) took about 21 ns per key and
 * head even in L1. The tile unit does the same products in a few of its cycles per key,
 * reading the key and value rows as they lie in the cache (docs/caches.md, bench/RESULTS.md).
 *
 * The same step as fa_decode_step_bf16 (decode_kernels.h), with the same softmax fold
 * (decode_group.h): scores are the bf16 products summed in f32, times the scale; the row
 * max (a NaN never wins), base = the new max (0 while it is -inf), alpha = exp(old max -
 * base); p = exp(score - base) summed unrounded into the row's sum and rounded to bf16
 * (nearest even) for p V; acc = acc alpha + p V. Only the order of the f32 sums inside the
 * products differs (the tile unit's), so the last bits may differ from that step's
 * (tests/test_decode_bf16_amx.c checks both against the float64 reference).
 *
 * Scores come out transposed, S^T = K Q^T: A tiles are 16 key rows x 32 dims read in place
 * (stride: the cache's row stride), B tiles q^T as 16 dim pairs x 4 query rows, so a C tile
 * stored 16 bytes a row is 16 keys x 4 rows, lane 4 j + r of each vector of 4 keys: one
 * permute makes it decode_group.h's lane 4 r + j. p V takes the value rows in place as B
 * tiles too: a row's 32-bit words are the pairs of columns (2 c, 2 c + 1), so A tiles of
 * (p, 0) and of (0, p) words (16 keys a block) give the even and the odd columns into two C
 * tiles, interleaved back when they are added to the accumulators; nothing reorders the
 * cache's rows. The zero half of a pair multiplies the neighbouring column: 0 * inf makes
 * it NaN, so a tile whose p V products hold an inf or NaN (a value row's inf or NaN always
 * leaves a NaN there: v times the other tile's 0) is taken again by the AVX512_BF16 step
 * from the state before it. That check reads the products the step has anyway: reading
 * the value rows for it, once more from L2 per kv head, made the step about 10% slower
 * from L3 (bench/RESULTS.md, 2026-12-07). Keys past n are zeros from staging, never read
 * from the cache. */
#include "amx_tiles.h"
#include "decode_group.h"
#include "decode_kernels.h"
#include "isa_avx512.h"

#include <string.h>

#define KEYS FA_DECODE_MAX_TILE /* keys per step at most (128) */
#define DIM 128                 /* head dims and value columns at most */

/* Prefetched lines of the next tile, before the table's prefetch_x (3 on amx): per tile
 * product of the scores (4: 16 keys x 32 dims), per 4 keys of the softmax (1) and per tile
 * product of p V (3: two a 16-key block of a column group): 3 x (8 x 4 x 4 + 32 x 1 + 64 x 3)
 * = 1056 lines a step at D = 128 and 128 keys, so 8 kv heads' steps cover the next tile's
 * 8192 lines of keys and values, and the touch reads none (decode.c, touch_rest). With 4 a
 * p V block (864 lines, 84% of the tile, the rest read by the touch before the tile) it ran
 * about 3% slower from memory. Issued after each product rather than 48 and 18 at a time
 * after each block: a burst waits on the core's outstanding misses while the tile unit
 * idles, 6% slower from memory (bench/RESULTS.md, 2026-12-07). */
#define PF_QK 4
#define PF_EXP 1
#define PF_PV 3

/* Tiles 0, 1: the scores' C (16 keys x 4 rows); 4, 5: q^T (16 dim pairs x 4 rows); 2, 3:
 * key rows (A) for the scores, value rows (B) and p pairs (A) for p V; 6, 7: p V's C (even
 * and odd columns). Rows past the 4 query rows in 3, 6, 7 are never read back. */
static const fa_tile_config cfg = {.palette = 1,
                                   .colsb = {16, 16, 64, 64, 16, 16, 64, 64},
                                   .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

int fa_decode_step_bf16_amx_takes(const fa_decode_step *t) {
    return t->d % 32 == 0 && t->d <= DIM && t->dv % 32 == 0 && t->dv <= DIM && t->m >= 1 && t->n >= 1 &&
           t->n <= KEYS;
}

/* q^T for the scores: qb[c][p][r] = (q[r][32 c + 2 p], q[r][32 c + 2 p + 1]) for r < 4, rows
 * past m zero. */
static void q_pairs(const uint16_t *q, int m, int d, uint32_t *qb) {
    for (int c = 0; c < d / 32; c++)
        for (int r = 0; r < 4; r++) {
            uint32_t w[16];
            if (r < m) memcpy(w, q + (int64_t)r * d + 32 * c, 64);
            else memset(w, 0, sizeof w);
            for (int p = 0; p < 16; p++) qb[(c * 16 + p) * 4 + r] = w[p];
        }
}

/* Rows j0.. (16) of a cache (x, stride elements apart) as a tile's source: in place, or (a
 * last block of fewer than n - j0 < 16 rows) copied into staged, zeros past n. */
static const uint16_t *rows16(const uint16_t *x, int64_t stride, int n, int j0, int cols, uint16_t *staged,
                              long *bytes) {
    const int rows = n - j0 < 16 ? n - j0 : 16;
    const uint16_t *a = x + (int64_t)j0 * stride;
    *bytes = (long)(stride * 2);
    if (rows == 16) return a;
    memset(staged, 0, 16 * DIM * 2);
    for (int j = 0; j < rows; j++) memcpy(staged + j * DIM, a + (int64_t)j * stride, (size_t)cols * 2);
    *bytes = DIM * 2;
    return staged;
}

/* One 16-key block's products into C tile c: key rows through tiles 2, 3, q^T through 4, 5. */
#define QK_ISSUE(c, j0)                                                                  \
    do {                                                                                 \
        long sa_;                                                                        \
        const uint16_t *a_ = rows16(t->k, t->kstride, t->n, j0, t->d, staged[c], &sa_);   \
        TILE_ZERO(c);                                                                    \
        for (int c_ = 0; c_ < nc; c_ += 2) {                                             \
            TILE_LOAD(2, a_ + 32 * c_, sa_);                                             \
            TILE_LOAD(4, qb + c_ * 64, 16);                                              \
            TILE_DP(c, 2, 4);                                                            \
            fa_decode_prefetch_scaled(t->pf, PF_QK);                                     \
            if (c_ + 1 < nc) {                                                           \
                TILE_LOAD(3, a_ + 32 * (c_ + 1), sa_);                                   \
                TILE_LOAD(5, qb + (c_ + 1) * 64, 16);                                    \
                TILE_DP(c, 3, 5);                                                        \
                fa_decode_prefetch_scaled(t->pf, PF_QK);                                 \
            }                                                                            \
        }                                                                                \
    } while (0)

/* s[j][r] = k_j . q_r for the tile's keys (r < 4), 16 a block, the next block's products
 * issued before this one's C tile is stored; each product followed by its share of the next
 * tile's prefetches. */
static void scores(const fa_decode_step *t, const uint32_t *qb, float *s) {
    uint16_t staged[2][16 * DIM] __attribute__((aligned(64)));
    const int nc = t->d / 32, nb = (t->n + 15) / 16;
    QK_ISSUE(0, 0);
    for (int i = 0; i < nb; i++) {
        if (i % 2 == 0) {
            if (i + 1 < nb) QK_ISSUE(1, 16 * (i + 1));
            TILE_STORE(0, s + 64 * i, 16);
        } else {
            if (i + 1 < nb) QK_ISSUE(0, 16 * (i + 1));
            TILE_STORE(1, s + 64 * i, 16);
        }
    }
}
#undef QK_ISSUE

/* The softmax between the products, fa_decode_step_bf16's own (decode_group.h's fold on
 * vectors of 4 rows x 4 keys, lane 4 r + j): s holds the products of keys [0, n) as the
 * tiles leave them (lane 4 j + r), turned by one permute. pe and po get each 16-key block's
 * p V A tiles: row r, dword u = (p[r][16 b + u], 0) and (0, p[r][16 b + u]); alpha the rows'
 * rescales. */
static void softmax_pairs(const fa_decode_step *t, const float *s, float *alpha, uint32_t *pe, uint32_t *po) {
    static const __mmask16 keys_live[4] = {0xffff, 0x1111, 0x3333, 0x7777}; /* by n % 4 */
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(t->scale);
    const __m512i rows_first = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const int nb = (t->n + 3) / 4, n16 = (t->n + 15) / 16;
    __m512 S[KEYS / 4], top = neg_inf;
    for (int b = 0; b < nb; b++) {
        S[b] = _mm512_mul_ps(_mm512_permutexvar_ps(rows_first, _mm512_load_ps(s + 16 * b)), scale);
        if (b == nb - 1) S[b] = _mm512_mask_blend_ps(keys_live[t->n % 4], neg_inf, S[b]);
        top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
    }
    const __m512 vbase = fa_group_bases(top, t->mx, t->m, alpha);
    __m512 total = _mm512_setzero_ps();
    for (int b16 = 0; b16 < n16; b16++) {
        __m512 e[4]; /* keys 16 b16 + 4 i.., lane 4 r + j */
        for (int i = 0; i < 4; i++) {
            const int b = 4 * b16 + i;
            e[i] = _mm512_setzero_ps();
            if (b < nb) {
                e[i] = fa_avx512_exp_nonpos(_mm512_sub_ps(S[b], vbase)); /* <= 0 or NaN */
                total = _mm512_add_ps(total, e[i]);
            }
            fa_decode_prefetch_scaled(t->pf, PF_EXP);
        }
        /* row r's 16 keys: 128-bit lane r of e[0..3] */
        const __m512 x01 = _mm512_shuffle_f32x4(e[0], e[1], 0x44), y01 = _mm512_shuffle_f32x4(e[0], e[1], 0xee);
        const __m512 x23 = _mm512_shuffle_f32x4(e[2], e[3], 0x44), y23 = _mm512_shuffle_f32x4(e[2], e[3], 0xee);
        const __m512 row[4] = {_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd),
                               _mm512_shuffle_f32x4(y01, y23, 0x88), _mm512_shuffle_f32x4(y01, y23, 0xdd)};
        for (int r = 0; r < 4; r++) {
            const __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(row[r])); /* (p, 0) */
            _mm512_store_si512(pe + (b16 * 16 + r) * 16, w);
            _mm512_store_si512(po + (b16 * 16 + r) * 16, _mm512_slli_epi32(w, 16));
        }
    }
    fa_group_sums(total, alpha, t->m, t->sum);
}

/* acc rows (m) = acc alpha + P V, 32 columns a group: the value rows as they lie in the
 * cache are the B tiles, their 32-bit words column pairs (2 c, 2 c + 1); A tiles (p, 0) and
 * (0, p) take the even and the odd columns into C tiles 6 and 7, summed over the 16-key
 * blocks, then interleaved back into column order. Returns 1, with acc untouched, where a
 * product of the query rows holds an inf or NaN (a value row's inf or NaN reaches its pair
 * column through the 0, 0 * inf): the caller redoes the rows in the AVX512_BF16 step. */
static int weighted_values(const fa_decode_step *t, const uint32_t *pe, const uint32_t *po, const float *alpha) {
    uint16_t staged[16 * DIM] __attribute__((aligned(64)));
    float oe[DIM / 32][16 * 16] __attribute__((aligned(64))), oo[DIM / 32][16 * 16] __attribute__((aligned(64)));
    const __m512i back0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i back1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512 expo = _mm512_castsi512_ps(_mm512_set1_epi32(0x7f800000));
    const int n16 = (t->n + 15) / 16;
    long sv;
    const uint16_t *last = t->n % 16 ? rows16(t->v, t->vstride, t->n, 16 * (n16 - 1), t->dv, staged, &sv) : NULL;
    __mmask16 bad = 0;
    for (int g = 0; g < t->dv / 32; g++) {
        TILE_ZERO(6);
        TILE_ZERO(7);
        for (int b = 0; b < n16; b++) {
            if (last && b == n16 - 1) TILE_LOAD(2, last + 32 * g, DIM * 2);
            else TILE_LOAD(2, t->v + (int64_t)16 * b * t->vstride + 32 * g, t->vstride * 2);
            TILE_LOAD(3, pe + b * 256, 64);
            TILE_DP(6, 3, 2);
            fa_decode_prefetch_scaled(t->pf, PF_PV);
            TILE_LOAD(3, po + b * 256, 64);
            TILE_DP(7, 3, 2);
            fa_decode_prefetch_scaled(t->pf, PF_PV);
        }
        TILE_STORE(6, oe[g], 64);
        TILE_STORE(7, oo[g], 64);
        for (int r = 0; r < t->m; r++) /* exponent bits all ones: inf or NaN */
            for (int x = 0; x < 2; x++) {
                const __m512 e = _mm512_and_ps(_mm512_load_ps((x ? oo[g] : oe[g]) + 16 * r), expo);
                bad |= _mm512_cmpeq_epi32_mask(_mm512_castps_si512(e), _mm512_castps_si512(expo));
            }
    }
    if (bad) return 1;
    for (int g = 0; g < t->dv / 32; g++)
        for (int r = 0; r < t->m; r++) {
            float *row = t->acc + (int64_t)r * t->ldacc + 32 * g;
            const __m512 e = _mm512_load_ps(oe[g] + 16 * r), o = _mm512_load_ps(oo[g] + 16 * r);
            const __m512 lo = _mm512_unpacklo_ps(e, o), hi = _mm512_unpackhi_ps(e, o);
            const __m512 al = _mm512_set1_ps(alpha[r]);
            _mm512_storeu_ps(row, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(row), al),
                                                _mm512_permutex2var_ps(lo, back0, hi)));
            _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(row + 16), al),
                                                     _mm512_permutex2var_ps(lo, back1, hi)));
        }
    return 0;
}

void fa_decode_step_bf16_amx(const fa_decode_step *t) {
    if (!fa_decode_step_bf16_amx_takes(t)) {
        fa_decode_step_bf16(t);
        return;
    }
    uint32_t qb[(DIM / 32) * 16 * 4] __attribute__((aligned(64)));
    float s[KEYS * 4] __attribute__((aligned(64)));
    uint32_t pe[(KEYS / 16) * 16 * 16] __attribute__((aligned(64))), po[(KEYS / 16) * 16 * 16]
        __attribute__((aligned(64)));
    float alpha[4];
    fa_tiles_load(&cfg);
    for (int r0 = 0; r0 < t->m; r0 += 4) { /* 4 rows a pass, as in the AVX512_BF16 step */
        fa_decode_step g = *t;
        g.q += (int64_t)r0 * t->d, g.m = t->m - r0 < 4 ? t->m - r0 : 4;
        g.mx += r0, g.sum += r0, g.acc += (int64_t)r0 * t->ldacc;
        float mx0[4], sum0[4];
        memcpy(mx0, g.mx, sizeof(float) * (size_t)g.m);
        memcpy(sum0, g.sum, sizeof(float) * (size_t)g.m);
        q_pairs(g.q, g.m, g.d, qb);
        scores(&g, qb, s);
        softmax_pairs(&g, s, alpha, pe, po);
        if (weighted_values(&g, pe, po, alpha)) {
            memcpy(g.mx, mx0, sizeof(float) * (size_t)g.m);
            memcpy(g.sum, sum0, sizeof(float) * (size_t)g.m);
            g.pf = NULL;
            fa_decode_step_bf16(&g);
        }
    }
    fa_tiles_release();
}
