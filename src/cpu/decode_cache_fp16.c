/* The decode step over fp8 e4m3 caches in f16 arithmetic (AVX512_FP16, GFNI), for bf16
 * problems: every table's cache step for fp8 (decode_cache_avx512.c's
 * fa_decode_cache_step_avx512, which the amx table's calls too) takes it on CPUs with both
 * (every CPU with AMX so far, and Intel's that hide AMX from a virtual machine, which run the
 * avx512 table); CPUs without them keep decode_cache_avx512.c's f32 step. There, each cache
 * element costs four f32 multiply-adds (four query rows share a kv head) and a third of a conversion per 16
 * lanes, and fp8 ran at about 0.55 of the streaming read, bound by those ports; here a
 * multiply-add covers 32 lanes and 64 codes convert in four instructions: 16.1 against
 * 27.7 ns per key and kv head (bench/RESULTS.md).
 *
 * The numbers (docs/caches.md, "How a tile computes" and "The error"):
 * - codes become f16 exactly, 64 at a time (codes64): the e4m3 value times 2^-8, subnormals
 *   included (not the NaN codes: a tile holding one takes the f32 step, whose outputs are
 *   NaN then);
 * - q rows: each scaled by a power of two to a largest |q| in [32, 64) and rounded to f16,
 *   exact for a bf16 q down to 2^-19 of the row's largest element; each lane sums d / 32
 *   products in f16, the 32 lanes are added in f16 (at most d x 64 x 1.75 = 28672 at d =
 *   256: no overflow), and the sum is scaled back in f32: a score's error is at most about
 *   (d / 32 + 6) 2^-11 of sum_c |q_c k_c|, far below fp8's own 2^-4;
 * - p V: the weights w_j = p_j * vscale_j (as the f32 step has them), scaled by one power of
 *   two per tile to below 1 (p <= 1) and rounded to f16, are summed into f16 lanes over
 *   blocks of KB = 16 keys (at most 16 x 1.75: no overflow), then added into the f32
 *   accumulators with the scale undone: at most about 2^-6.8 of max_j |v_j| in all.
 * A tile with a non-finite q element or scale, or head dims not multiples of 32 up to 256,
 * takes the f32 step. */
#include "decode_cache_avx512.h"
#include "decode_group.h"
#include "vexp.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define DMAX 256 /* head dims (and value columns) at most */
#define QV (DMAX / 32)
#define KB 16 /* keys a p V block sums in f16 */
/* Lines of the next tile prefetched per block of 4 keys in the scores and per key and 128
 * columns in p V: 512 a head at D = 128, the whole next tile by the last of 8 heads, which
 * on the amx table is all that brings it (decode.c reads only what they left: isa.h,
 * touch_rest). Spread this evenly, they beat 6 and 2, 12 and 3, and 16 and 4 (up to
 * 17% slower; bench/RESULTS.md, 2026-12-05 late). */
#define PF_QK 8
#define PF_PV 2

/* cpuid: AVX512_FP16 (leaf 7, EDX bit 23) and GFNI (ECX bit 8; the table's probe has seen
 * AVX-512 and the OS's permission for its registers). */
static int fp16_arith(void) {
    static atomic_int state; /* 0: not asked yet, 1: yes, 2: no */
    int s = atomic_load(&state);
    if (!s) {
        unsigned a, b, c, d;
        s = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)) && (c & (1u << 8)) ? 1 : 2;
        atomic_store(&state, s);
    }
    return s == 1;
}

/* 64 codes (the bytes outside m read as 0) as two vectors of f16, the e4m3 value times 2^-8
 * (not the NaN codes), in the lanes' order of a byte unpack: *a holds codes 0..7, 16..23,
 * 32..39, 48..55, *b codes 8..15, 24..31, 40..47, 56..63. GF2P8AFFINEQB moves each code's
 * bits into an f16's high byte (sign, 0, the four exponent bits, two mantissa bits) and its
 * low byte (the last mantissa bit at bit 7), which the unpacks interleave into words: two
 * instructions per 32 codes. *nan (where check) keeps the least (~code & 0x7f) seen: 0 after
 * a NaN code (a local of the caller's, always there, so that it stays in a register). */
#define GF_HI 0x0204081020400080LL
#define GF_LO 0x0000000000000001LL
#define GF_NOT_MAG 0x0102040810204000LL
INLINE void codes64(const void *x, __mmask64 m, __m512h *a, __m512h *b, __m512i *nan, const int check) {
    /* a masked load costs the whole step a tenth more: whole chunks load plainly */
    const __m512i raw = m == ~(__mmask64)0 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi8(m, x);
    const __m512i hi = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(GF_HI), 0);
    const __m512i lo = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(GF_LO), 0);
    *a = _mm512_castsi512_ph(_mm512_unpacklo_epi8(lo, hi));
    *b = _mm512_castsi512_ph(_mm512_unpackhi_epi8(lo, hi));
    if (check) *nan = _mm512_min_epu8(*nan, _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(GF_NOT_MAG), 0x7f));
}
/* The live bytes of the 64 from column c of a row of len (a multiple of 32). */
INLINE __mmask64 live64(int len, int c) { return len - c >= 64 ? ~(__mmask64)0 : (__mmask64)0xffffffffu; }
/* Word indices into (x, y) (x: words 0..31, y: 32..63): codes64's lane order from the
 * natural one (to_a, to_b), and the natural one from codes64's (from_lo: columns 0..31,
 * from_hi: 32..63). */
static const uint16_t to_a[32] = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23,
                                  32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
static const uint16_t to_b[32] = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
                                  40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
static const uint16_t from_lo[32] = {0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39,
                                     8, 9, 10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47};
static const uint16_t from_hi[32] = {16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55,
                                     24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};

INLINE __m512i add_ph(__m512i a, __m512i b) {
    return _mm512_castph_si512(_mm512_add_ph(_mm512_castsi512_ph(a), _mm512_castsi512_ph(b)));
}
/* Lane i (< 16): the sum of the 32 f16 lanes of acc[i], in f32 (the tree's additions in f16). */
INLINE __m512 sum16_ph(const __m512h acc[16]) {
    __m512i p[8], r[4], t[2];
    for (int i = 0; i < 8; i++) { /* words alternate acc 2i, 2i + 1 */
        const __m512i a = _mm512_castph_si512(acc[2 * i]), b = _mm512_castph_si512(acc[2 * i + 1]);
        p[i] = add_ph(_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b));
    }
    for (int i = 0; i < 4; i++) /* words: acc 4i .. 4i + 3, twice per 128 bits */
        r[i] = add_ph(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 2; i++) /* words: acc 8i .. 8i + 7 per 128 bits */
        t[i] = add_ph(_mm512_unpacklo_epi64(r[2 * i], r[2 * i + 1]), _mm512_unpackhi_epi64(r[2 * i], r[2 * i + 1]));
    const __m512i x = add_ph(_mm512_shuffle_i32x4(t[0], t[1], 0x44), _mm512_shuffle_i32x4(t[0], t[1], 0xee));
    const __m512i y = add_ph(_mm512_shuffle_i32x4(x, x, 0x08), _mm512_shuffle_i32x4(x, x, 0x0d));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(y));
}

/* The f16 sums q_r . k_j of rows 0..3 (qh: QV vectors a row, in codes64's lane order)
 * against keys j0.. (nj <= 4; missing ones repeat the first), lane 4 r + j, in f32; nan as
 * codes64's. */
INLINE __m512 qk_block(const fa_decode_cache_tile *t, const __m512h *qh, int j0, int nj, __m512i *nan, const int check,
                       const int whole) {
    const char *k[4];
    for (int j = 0; j < 4; j++) k[j] = (const char *)t->k + (int64_t)(j0 + (j < nj ? j : 0)) * t->kstride;
    __m512h acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ph();
    for (int c = 0; c < t->d; c += 64) {
        const __mmask64 m = whole ? ~(__mmask64)0 : live64(t->d, c);
        __m512h ka[4], kb[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) codes64(k[j] + c, m, &ka[j], &kb[j], nan, check);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512h qa = qh[r * QV + c / 32], qb = qh[r * QV + c / 32 + 1];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[4 * r + j] = _mm512_fmadd_ph(qb, kb[j], _mm512_fmadd_ph(qa, ka[j], acc[4 * r + j]));
        }
    }
    return sum16_ph(acc);
}

/* o rows 0..3 (mr live) += undo * sum_j w_rj v_j over columns [c0, c0 + 128) (fewer at the
 * end; w_rj: w16's lane 4 r + j % 4 of block j / 4): f16 sums over KB keys at a time, in
 * codes64's lane order, each then put in column order and added into o in f32. */
INLINE void pv_block(const fa_decode_cache_tile *t, const uint32_t *w16, float undo, int mr, int c0, float *o, int ldo,
                     __m512i *nan_io, const int check, const int whole) {
    __m512i nan = *nan_io; /* a local, so that it stays in a register across o's stores */
    const __m512 e = _mm512_set1_ps(undo);
    const int cols = whole ? 128 : t->dv - c0 < 128 ? t->dv - c0 : 128, halves = cols > 64 ? 2 : 1;
    const __mmask64 m0 = whole ? ~(__mmask64)0 : live64(cols, 0), m1 = whole ? ~(__mmask64)0 : halves == 2 ? live64(cols, 64) : 0;
    const __m512i lo_idx = _mm512_loadu_si512(from_lo), hi_idx = _mm512_loadu_si512(from_hi);
    for (int j0 = 0; j0 < t->n; j0 += KB) {
        const int j1 = t->n - j0 < KB ? t->n : j0 + KB;
        __m512h h[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) h[r][q] = _mm512_setzero_ph();
        for (int j = j0; j < j1; j++) {
            const char *vr = (const char *)t->v + (int64_t)j * t->vstride + c0;
            __m512h x[4] = {_mm512_setzero_ph(), _mm512_setzero_ph(), _mm512_setzero_ph(), _mm512_setzero_ph()};
            codes64(vr, m0, &x[0], &x[1], &nan, check);
            if (halves == 2) codes64(vr + 64, m1, &x[2], &x[3], &nan, check);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512h w = _mm512_castsi512_ph(_mm512_set1_epi32((int)w16[16 * (j / 4) + 4 * r + j % 4]));
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    if (q < 2 * halves) h[r][q] = _mm512_fmadd_ph(w, x[q], h[r][q]);
            }
            fa_decode_prefetch_lines(t->pf, PF_PV);
        }
        for (int r = 0; r < mr; r++) {
            float *orow = o + (int64_t)r * ldo + c0;
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++) {
                if (g >= halves) break;
                const __m512i a = _mm512_castph_si512(h[r][2 * g]), b = _mm512_castph_si512(h[r][2 * g + 1]);
                const __m512i nat[2] = {_mm512_permutex2var_epi16(a, lo_idx, b), _mm512_permutex2var_epi16(a, hi_idx, b)};
#pragma GCC unroll 2
                for (int y = 0; y < 2; y++) {
                    const int c = 64 * g + 32 * y;
                    if (c >= cols) break;
                    _mm512_storeu_ps(orow + c, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(nat[y])), e,
                                                               _mm512_loadu_ps(orow + c)));
                    _mm512_storeu_ps(orow + c + 16, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(nat[y], 1)), e,
                                                                    _mm512_loadu_ps(orow + c + 16)));
                }
            }
        }
    }
    *nan_io = nan;
}

/* The largest |x| of n floats; NaN if one is NaN. */
static float abs_max(const float *x, int n) {
    __m512 top = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int c = 0; c < n; c += 16) {
        const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(fa_mask16(n - c), x + c));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        top = _mm512_max_ps(top, v);
    }
    return nan ? NAN : _mm512_reduce_max_ps(top);
}

/* The power of two 2^e that brings x's magnitude x > 0 to [2^lo, 2^(lo+1)): e = lo - ilogb(x). */
static int exponent_to(float x, int lo) { return x > 0.0f ? lo - ilogbf(x) : 0; }

int fa_decode_cache_step_fp16(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                              float *acc, int ldacc) {
    if (t->t != FA_FP8_E4M3 || pd != FA_BF16 || t->d < 32 || t->d > DMAX || t->d % 32 || t->dv < 32 ||
        t->dv > DMAX || t->dv % 32 || !fp16_arith())
        return 0;
    float ksc[SCALES_MAX], vsc[SCALES_MAX]; /* padded with the unit: p = 0 for missing keys */
    tile_scales(t->kscale, t->sstride, t->n, unit(FA_FP8_E4M3), ksc);
    tile_scales(t->vscale, t->sstride, t->n, unit(FA_FP8_E4M3), vsc);
    const float vtop = abs_max(vsc, t->n);
    if (!isfinite(abs_max(ksc, t->n)) || !isfinite(vtop)) return 0;
    /* p <= 1: the weights p_j * vsc_j are at most vtop; scaled by 2^-ew below 1 for f16 */
    const int ew = exponent_to(vtop, -1);
    if (ew < -126) return 0; /* 2^-ew would not be an f32 */
    for (int j = 0; j < t->n; j += 16)
        _mm512_storeu_ps(vsc + j, _mm512_scalef_ps(_mm512_loadu_ps(vsc + j), _mm512_set1_ps((float)ew)));
    const float undo_w = ldexpf(1.0f, -ew);
    /* every row's q first: a later group's could not decline once the first had moved the state */
    for (int r = 0; r < t->m; r++)
        if (!isfinite(abs_max(t->q + (int64_t)r * t->d, t->d))) return 0;

    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    const __m512i to_group = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    static const __mmask16 keys_live[4] = {0xffff, 0x1111, 0x3333, 0x7777}; /* by n % 4 */
    const int nb = (t->n + 3) / 4;
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        /* q's rows in f16, each scaled by 2^eq (rows past m: row 0's), 64 columns at a time in
         * codes64's lane order (columns past d: 0) */
        __m512h qh[4 * QV];
        float eq[4];
        const __m512i ia = _mm512_loadu_si512(to_a), ib = _mm512_loadu_si512(to_b);
        for (int r = 0; r < 4; r++) {
            const float *q = t->q + (int64_t)(r0 + (r < mr ? r : 0)) * t->d;
            const int e = exponent_to(abs_max(q, t->d), 5);
            eq[r] = (float)-e;
            const __m512 f = _mm512_set1_ps((float)e);
            for (int c = 0; c < t->d; c += 64) {
                __m256i w[4];
                for (int y = 0; y < 4; y++)
                    w[y] = _mm512_cvtps_ph(_mm512_scalef_ps(_mm512_maskz_loadu_ps(fa_mask16(t->d - c - 16 * y), q + c + 16 * y), f),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(w[0]), w[1], 1);
                const __m512i y = _mm512_inserti64x4(_mm512_castsi256_si512(w[2]), w[3], 1);
                qh[r * QV + c / 32] = _mm512_castsi512_ph(_mm512_permutex2var_epi16(x, ia, y));
                qh[r * QV + c / 32 + 1] = _mm512_castsi512_ph(_mm512_permutex2var_epi16(x, ib, y));
            }
        }
        const __m512 undo_q = _mm512_permutexvar_ps(to_group, _mm512_castps128_ps512(_mm_loadu_ps(eq)));
        __m512 S[FA_DECODE_MAX_TILE / 4], top = neg_inf;
        __m512i nan = _mm512_set1_epi8(0x7f);
        for (int b = 0; b < nb; b++) {
            const int nj = t->n - 4 * b < 4 ? t->n - 4 * b : 4;
            /* the first group of rows sees every key's codes: a NaN among them leaves the tile,
             * untouched, to the f32 step */
            const int ck = !r0;
            const __m512 x = _mm512_scalef_ps(t->d % 64 ? qk_block(t, qh, 4 * b, nj, &nan, ck, 0) : qk_block(t, qh, 4 * b, nj, &nan, ck, 1), undo_q);
            S[b] = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_broadcast_f32x4(_mm_loadu_ps(ksc + 4 * b))), vscale);
            if (b == nb - 1) S[b] = _mm512_mask_blend_ps(keys_live[t->n % 4], neg_inf, S[b]);
            top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
            fa_decode_prefetch_lines(t->pf, PF_QK);
        }
        if (!r0 && _mm512_cmpeq_epi8_mask(nan, _mm512_setzero_si512())) return 0;
        /* the first group sees every value row's codes too, in p V, after its state has
         * moved on: kept here, to be put back if one is NaN */
        float keep[4 * DMAX + 8];
        if (!r0)
            for (int r = 0; r < mr; r++) {
                memcpy(keep + r * t->dv, acc + (int64_t)r * ldacc, sizeof(float) * (size_t)t->dv);
                keep[4 * DMAX + r] = mx[r], keep[4 * DMAX + 4 + r] = sum[r];
            }
        float alpha[4];
        const __m512 vbase = fa_group_bases(top, mx + r0, mr, alpha);
        __m512 total = _mm512_setzero_ps();
        /* the weights p (rounded) times the value rows' scales and 2^-ew, in f16, two copies a
         * dword, lane 4 r + j of each block of 4 keys (w16[16 b + 4 r + j]) */
        uint32_t w16[FA_DECODE_MAX_TILE * 4];
        for (int b = 0; b < nb; b++) {
            const __m512 e = fa_avx512_exp_nonpos(_mm512_sub_ps(S[b], vbase));
            total = _mm512_add_ps(total, e);
            const __m512 wb = _mm512_mul_ps(round_to(e, pd), _mm512_broadcast_f32x4(_mm_loadu_ps(vsc + 4 * b)));
            const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(wb, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            _mm512_storeu_si512(w16 + 16 * b, _mm512_or_si512(h, _mm512_slli_epi32(h, 16)));
        }
        fa_group_sums(total, alpha, mr, sum + r0);
        float *o = acc + (int64_t)r0 * ldacc;
        fa_group_rescale(o, ldacc, mr, t->dv, alpha);
        const int cv = !r0; /* no byte of nan is 0 after the scores' check */
        for (int c0 = 0; c0 < t->dv; c0 += 128)
            if (t->dv - c0 >= 128) pv_block(t, w16, undo_w, mr, c0, o, ldacc, &nan, cv, 1);
            else pv_block(t, w16, undo_w, mr, c0, o, ldacc, &nan, cv, 0);
        if (!r0 && _mm512_cmpeq_epi8_mask(nan, _mm512_setzero_si512())) {
            for (int r = 0; r < mr; r++) {
                memcpy(acc + (int64_t)r * ldacc, keep + r * t->dv, sizeof(float) * (size_t)t->dv);
                mx[r] = keep[4 * DMAX + r], sum[r] = keep[4 * DMAX + 4 + r];
            }
            return 0;
        }
    }
    return 1;
}
