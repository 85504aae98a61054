/* Decode tile kernels for bf16 caches with AVX512_BF16: the cache is read straight from its
 * rows (no packing), so a decode step streams each cache byte once at close to memory
 * speed. Compiled with -mavx512bf16; decode.c calls these only when the plan's ISA table
 * is avx512bf16 or amx (both imply the instructions). */
#include "decode_kernels.h"

#include "isa_avx512.h"

#include <immintrin.h>

/* s[r * lds + j] = dot(q[r], k[j]) for r < m, j < n: q is m x d contiguous bf16, key j
 * starts at k + j * kstride (d contiguous bf16). Pairs of products go through
 * vdpbf16ps into f32 lanes, then one horizontal sum per (r, j). The driver has prefetched
 * the rows (decode.c). */
void fa_decode_qk_bf16(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s,
                       int lds, const fa_decode_fetch *ahead) {
    int64_t done = 0; /* bytes of the ranges ahead prefetched so far, spread evenly over the keys */
    for (int j = 0; j < n; j++) {
        const uint16_t *kr = k + j * kstride;
        if (ahead) {
            const int64_t upto = ahead->bytes * (j + 1) / n;
            for (; done < upto; done += 64) {
                _mm_prefetch(ahead->k + done, _MM_HINT_T2);
                _mm_prefetch(ahead->v + done, _MM_HINT_T2);
            }
        }
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
 * v + j * vstride. A block of 4 rows x 64 columns (16 accumulators) stays in registers
 * across the keys, so each cache line of a value row is used whole once it is loaded. */
void fa_decode_pv_bf16(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                       int ldo) {
    static const float zeros[FA_DECODE_MAX_TILE];
    for (int c0 = 0; c0 < cols; c0 += 64) {
        int nc[4];
        __mmask16 mk[4];
        for (int b = 0; b < 4; b++) nc[b] = cols - c0 - 16 * b, mk[b] = fa_mask16(nc[b]);
        for (int r0 = 0; r0 < m; r0 += 4) {
            const int mr = m - r0 < 4 ? m - r0 : 4; /* missing rows read zeros and are not stored */
            const float *pr[4];
            __m512 acc[4][4];
            for (int r = 0; r < 4; r++) {
                pr[r] = r < mr ? p + (int64_t)(r0 + r) * ldp : zeros;
                for (int b = 0; b < 4; b++)
                    acc[r][b] = r < mr ? _mm512_maskz_loadu_ps(mk[b], o + (int64_t)(r0 + r) * ldo + c0 + 16 * b)
                                       : _mm512_setzero_ps();
            }
            for (int j = 0; j < n; j++) {
                const uint16_t *vr = v + j * vstride + c0;
                __m512 x[4];
                for (int b = 0; b < 4; b++) x[b] = load16(vr + 16 * b, nc[b]);
                for (int r = 0; r < 4; r++) {
                    const __m512 w = _mm512_set1_ps(pr[r][j]);
                    for (int b = 0; b < 4; b++) acc[r][b] = _mm512_fmadd_ps(w, x[b], acc[r][b]);
                }
            }
            for (int r = 0; r < mr; r++)
                for (int b = 0; b < 4; b++) _mm512_mask_storeu_ps(o + (int64_t)(r0 + r) * ldo + c0 + 16 * b, mk[b], acc[r][b]);
        }
    }
}
