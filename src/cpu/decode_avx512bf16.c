/* Decode tile kernels for bf16 caches with AVX512_BF16: the cache is read straight from its
 * rows (no packing), so a decode step streams each cache byte once at close to memory
 * speed. Compiled with -mavx512bf16; decode.c calls these only when the plan's ISA table
 * is avx512bf16 or amx (both imply the instructions). */
#include "decode_kernels.h"

#include "isa_avx512.h"

#include <immintrin.h>

/* s[r * lds + j] = dot(q[r], k[j]) for r < m, j < n: q is m x d contiguous bf16, key j
 * starts at k + j * kstride (d contiguous bf16). Pairs of products go through
 * vdpbf16ps into f32 lanes, then one horizontal sum per (r, j). */
void fa_decode_qk_bf16(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s,
                       int lds, const uint16_t *v, int64_t vstride, int dv) {
    /* Cache rows are far apart (Hk x D apart): fetch keys 16 rows ahead and this tile's
     * values meanwhile, so both streams keep many lines in flight. */
    for (int j = 0; j < n; j++) {
        const uint16_t *kr = k + j * kstride;
        if (j + 16 < n)
            for (int c = 0; c < d; c += 32) _mm_prefetch((const char *)(kr + 16 * kstride + c), _MM_HINT_T0);
        for (int c = 0; c < dv; c += 32) _mm_prefetch((const char *)(v + j * vstride + c), _MM_HINT_T1);
        for (int r = 0; r < m; r++) {
            const uint16_t *qr = q + (int64_t)r * d;
            __m512 acc = _mm512_setzero_ps();
            int c = 0;
            for (; c + 32 <= d; c += 32)
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qr + c), (__m512bh)_mm512_loadu_si512(kr + c));
            if (c < d) {
                const __mmask32 mk = fa_mask32(d - c);
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(mk, qr + c),
                                       (__m512bh)_mm512_maskz_loadu_epi16(mk, kr + c));
            }
            s[(int64_t)r * lds + j] = _mm512_reduce_add_ps(acc);
        }
    }
}

/* 16 bf16 values at x (nc of them, the rest zero) as f32. */
static inline __m512 load16(const uint16_t *x, int nc) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(fa_mask16(nc), x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* o[r * ldo + c] += sum_j p[r * ldp + j] * v[j][c] for r < m, c < cols: value j starts at
 * v + j * vstride. Blocks of 16 columns x 8 rows stay in registers across the keys. */
void fa_decode_pv_bf16(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                       int ldo) {
    for (int c0 = 0; c0 < cols; c0 += 16) {
        const int nc = cols - c0 < 16 ? cols - c0 : 16;
        const __mmask16 mk = fa_mask16(nc);
        for (int r0 = 0; r0 < m; r0 += 4) {
            /* four rows at a time, all in registers; missing rows read zeros and are not stored */
            static const float zeros[FA_DECODE_MAX_TILE];
            const int mr = m - r0 < 4 ? m - r0 : 4;
            const float *p0 = p + (int64_t)r0 * ldp, *p1 = mr > 1 ? p0 + ldp : zeros;
            const float *p2 = mr > 2 ? p0 + 2 * ldp : zeros, *p3 = mr > 3 ? p0 + 3 * ldp : zeros;
            float *o0 = o + (int64_t)r0 * ldo + c0;
            __m512 a0 = _mm512_maskz_loadu_ps(mk, o0), a1 = _mm512_setzero_ps(), a2 = a1, a3 = a1;
            if (mr > 1) a1 = _mm512_maskz_loadu_ps(mk, o0 + ldo);
            if (mr > 2) a2 = _mm512_maskz_loadu_ps(mk, o0 + 2 * ldo);
            if (mr > 3) a3 = _mm512_maskz_loadu_ps(mk, o0 + 3 * ldo);
            for (int j = 0; j < n; j++) {
                const __m512 x = load16(v + j * vstride + c0, nc);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[j]), x, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(p1[j]), x, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(p2[j]), x, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(p3[j]), x, a3);
            }
            _mm512_mask_storeu_ps(o0, mk, a0);
            if (mr > 1) _mm512_mask_storeu_ps(o0 + ldo, mk, a1);
            if (mr > 2) _mm512_mask_storeu_ps(o0 + 2 * ldo, mk, a2);
            if (mr > 3) _mm512_mask_storeu_ps(o0 + 3 * ldo, mk, a3);
        }
    }
}
