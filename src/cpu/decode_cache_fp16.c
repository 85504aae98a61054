/* The decode step over fp8 e4m3 caches in f16 arithmetic (AVX512_FP16), for bf16 problems:
 * the amx table's cache_step takes it on CPUs with AVX512_FP16 (every CPU with AMX so far),
 * the others keep decode_cache_avx512.c's f32 step. There, each cache element costs four
 * f32 multiply-adds (four query rows share a kv head) and a third of a conversion per 16
 * lanes, and fp8 ran at about 0.55 of the streaming read, bound by those ports; here a
 * multiply-add covers 32 lanes and a conversion 32 codes, half the work per element.
 *
 * The numbers (docs/caches.md, "How a tile computes"):
 * - codes become f16 exactly: (sign-extended byte << 7) & 0xbf80 is the e4m3 value times
 *   2^-8 as an f16, subnormals included (the NaN codes would not be: a tile holding one
 *   takes the f32 step, whose scores and outputs are then NaN);
 * - q rows: each scaled by a power of two 2^-E to a largest |q| in [32, 64) and rounded to
 *   f16, exact for bf16 q (8 significant bits) down to 2^-19 of the row's largest element;
 *   each lane sums d / 32 products in f16 (at most 8 x 64 x 1.75 < 2^10 at d = 256: no
 *   overflow), the 32 lanes are added in f16 (5 more roundings), and the sum is scaled back
 *   in f32: a score's error is at most about 2^-8 of sum_c |q_c k_c| (2^-11 per rounding,
 *   at most 12 of them along any product's path), far below fp8's own 2^-4;
 * - p V: the weights w_j = p_j * vscale_j (as the f32 step has them) of a row, scaled by a
 *   power of two to below 1 over the tile and rounded to f16 (2^-11), are summed into f16
 *   lanes over blocks of KB = 16 keys (at most 16 x 1.75: no overflow; each addition's
 *   rounding at most 2^-11 of the block's sum of |w_j v_j|), then added into the f32
 *   accumulators with the scale undone: at most about 2^-7 of sum_j |w_j v_j| in all.
 * A row with a non-finite q element, a non-finite scale, or head dims not multiples of 32 up
 * to 256 takes the f32 step. */
#include "decode_cache_avx512.h"
#include "vexp.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define DMAX 256 /* head dims (and value columns) at most */
#define QV (DMAX / 32)
#define KB 16 /* keys a p V block sums in f16 */
/* Lines of the next tile prefetched per block of 4 keys in the scores and per key and 64
 * 128 columns in p V. */
#define PF_QK 8
#define PF_PV 2

/* cpuid: AVX512_FP16 (leaf 7, EDX bit 23; the table's probe has seen AVX-512 and the OS's
 * permission for its registers). */
static int fp16_arith(void) {
    static atomic_int state; /* 0: not asked yet, 1: yes, 2: no */
    int s = atomic_load(&state);
    if (!s) {
        unsigned a, b, c, d;
        s = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)) ? 1 : 2;
        atomic_store(&state, s);
    }
    return s == 1;
}

/* 32 codes as f16: the e4m3 value times 2^-8 (not the NaN codes). */
INLINE __m512h codes32(const void *x) {
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)x));
    return _mm512_castsi512_ph(_mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16((short)0xbf80)));
}

/* Whether any of n rows (len bytes each, a multiple of 32, stride apart) holds a NaN code
 * (magnitude 0x7f): the bytes' largest value with the sign bit set is 0xff then. */
static int nan_codes(const void *x, int64_t stride, int n, int len) {
    const __m512i hi = _mm512_set1_epi8((char)0x80);
    __m512i top = _mm512_setzero_si512();
    const int whole = len / 64 * 64;
    const __mmask64 rest = len - whole ? 0xffffffffu : 0; /* the last 32 bytes of a row, if any */
    for (int j = 0; j < n; j++) {
        const char *row = (const char *)x + j * stride;
        for (int c = 0; c < whole; c += 64) top = _mm512_max_epu8(top, _mm512_or_si512(_mm512_loadu_si512(row + c), hi));
        if (rest) top = _mm512_max_epu8(top, _mm512_or_si512(_mm512_maskz_loadu_epi8(rest, row + whole), hi));
    }
    return _mm512_cmpeq_epi8_mask(top, _mm512_set1_epi8((char)0xff)) != 0;
}

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

/* The f16 sums q_r . k_j of rows 0..3 (qh, QV vectors a row) against keys j0.. (nj <= 4;
 * missing ones repeat the first), lane 4 r + j, in f32. */
INLINE __m512 qk_block(const fa_decode_cache_tile *t, const __m512h *qh, int j0, int nj) {
    const char *k[4];
    for (int j = 0; j < 4; j++) k[j] = (const char *)t->k + (int64_t)(j0 + (j < nj ? j : 0)) * t->kstride;
    __m512h acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ph();
    for (int c = 0; c < t->d / 32; c++) {
        __m512h kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = codes32(k[j] + 32 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[4 * r + j] = _mm512_fmadd_ph(qh[r * QV + c], kv[j], acc[4 * r + j]);
    }
    return sum16_ph(acc);
}

/* o rows 0..3 (mr live) += undo * sum_j w_rj v_j over columns [c0, c0 + 32 nv) (w_rj: w16's lane
 * 4 r + j % 4 of block j / 4),
 * nv <= 4: f16 sums over KB keys at a time, each then added into o in f32. */
INLINE void pv_block(const fa_decode_cache_tile *t, const uint32_t *w16, float undo, int mr, int c0, int nv, float *o,
                     int ldo) {
    const __m512 e = _mm512_set1_ps(undo);
    for (int j0 = 0; j0 < t->n; j0 += KB) {
        const int j1 = t->n - j0 < KB ? t->n : j0 + KB;
        __m512h h[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) h[r][q] = _mm512_setzero_ph();
        for (int j = j0; j < j1; j++) {
            const char *vr = (const char *)t->v + (int64_t)j * t->vstride + c0;
            __m512h x[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) x[q] = q < nv ? codes32(vr + 32 * q) : _mm512_setzero_ph();
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512h w = _mm512_castsi512_ph(_mm512_set1_epi32((int)w16[16 * (j / 4) + 4 * r + j % 4]));
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    if (q < nv) h[r][q] = _mm512_fmadd_ph(w, x[q], h[r][q]);
            }
            fa_decode_prefetch_lines(t->pf, PF_PV);
        }
        for (int r = 0; r < mr; r++) {
            float *orow = o + (int64_t)r * ldo + c0;
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                if (q < nv) {
                    const __m512i hb = _mm512_castph_si512(h[r][q]);
                    _mm512_storeu_ps(orow + 32 * q, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(hb)), e,
                                                                    _mm512_loadu_ps(orow + 32 * q)));
                    _mm512_storeu_ps(orow + 32 * q + 16, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(hb, 1)),
                                                                         e, _mm512_loadu_ps(orow + 32 * q + 16)));
                }
        }
    }
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
    for (int j = 0; j < t->n; j += 16)
        _mm512_storeu_ps(vsc + j, _mm512_scalef_ps(_mm512_loadu_ps(vsc + j), _mm512_set1_ps((float)ew)));
    const float undo_w = ldexpf(1.0f, -ew);
    for (int r = 0; r < t->m; r++)
        if (!isfinite(abs_max(t->q + (int64_t)r * t->d, t->d))) return 0;
    if (nan_codes(t->k, t->kstride, t->n, t->d) || nan_codes(t->v, t->vstride, t->n, t->dv)) return 0;

    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    const __m512i to_group = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    static const __mmask16 keys_live[4] = {0xffff, 0x1111, 0x3333, 0x7777}; /* by n % 4 */
    const int nb = (t->n + 3) / 4;
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        /* q's rows in f16, each scaled by 2^eq (rows past m: row 0's) */
        __m512h qh[4 * QV];
        float eq[4];
        for (int r = 0; r < 4; r++) {
            const float *q = t->q + (int64_t)(r0 + (r < mr ? r : 0)) * t->d;
            const int e = exponent_to(abs_max(q, t->d), 5);
            eq[r] = (float)-e;
            for (int c = 0; c < t->d; c += 32) {
                const __m512 f = _mm512_set1_ps((float)e);
                const __m256i lo = _mm512_cvtps_ph(_mm512_scalef_ps(_mm512_loadu_ps(q + c), f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m256i hi = _mm512_cvtps_ph(_mm512_scalef_ps(_mm512_loadu_ps(q + c + 16), f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                qh[r * QV + c / 32] = _mm512_castsi512_ph(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
            }
        }
        const __m512 undo_q = _mm512_permutexvar_ps(to_group, _mm512_castps128_ps512(_mm_loadu_ps(eq)));
        __m512 S[FA_DECODE_MAX_TILE / 4], top = neg_inf;
        for (int b = 0; b < nb; b++) {
            const int nj = t->n - 4 * b < 4 ? t->n - 4 * b : 4;
            const __m512 x = _mm512_scalef_ps(qk_block(t, qh, 4 * b, nj), undo_q);
            S[b] = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_broadcast_f32x4(_mm_loadu_ps(ksc + 4 * b))), vscale);
            if (b == nb - 1) S[b] = _mm512_mask_blend_ps(keys_live[t->n % 4], neg_inf, S[b]);
            top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
            fa_decode_prefetch_lines(t->pf, PF_QK);
        }
        float tops[16], base[4] = {0, 0, 0, 0}, alpha[4] = {1, 1, 1, 1};
        {
            __m512 g = _mm512_max_ps(top, _mm512_permute_ps(top, 0xb1));
            _mm512_storeu_ps(tops, _mm512_max_ps(g, _mm512_permute_ps(g, 0x4e)));
        }
        for (int r = 0; r < mr; r++) {
            const float m_old = mx[r0 + r], m_new = m_old > tops[4 * r] ? m_old : tops[4 * r];
            base[r] = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = fa_vexpf(m_old - base[r]);
            mx[r0 + r] = m_new;
        }
        const __m512 vbase = _mm512_permutexvar_ps(to_group, _mm512_castps128_ps512(_mm_loadu_ps(base)));
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
        float sums[16];
        {
            const __m512 g = _mm512_add_ps(total, _mm512_permute_ps(total, 0xb1));
            _mm512_storeu_ps(sums, _mm512_add_ps(g, _mm512_permute_ps(g, 0x4e)));
        }
        for (int r = 0; r < mr; r++) sum[r0 + r] = sum[r0 + r] * alpha[r] + sums[4 * r];
        float *o = acc + (int64_t)r0 * ldacc;
        for (int r = 0; r < mr; r++)
            if (alpha[r] != 1.0f)
                for (int c = 0; c < t->dv; c++) o[(int64_t)r * ldacc + c] *= alpha[r];
        for (int c0 = 0; c0 < t->dv; c0 += 128)
            pv_block(t, w16, undo_w, mr, c0, t->dv - c0 < 128 ? (t->dv - c0) / 32 : 4, o, ldacc);
    }
    return 1;
}
