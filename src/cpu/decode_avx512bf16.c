/* Decode tile kernels for bf16 caches with AVX512_BF16: the cache is read straight from its
 * rows (no packing), so a decode step streams each cache byte once at close to memory
 * speed. Compiled with -mavx512bf16; decode.c calls these only when the plan's ISA table
 * is avx512bf16 or amx (both imply the instructions). */
#include "decode_kernels.h"

#include "isa_avx512.h"

#include <immintrin.h>
#include <string.h>

/* The sums of 16 vectors, one per lane, in order: pairwise unpacks add within 128-bit
 * lanes, then two rounds of 128-bit lane shuffles add across them (15 adds, not 16
 * horizontal reductions). */
static inline __m512 sum16(const __m512 a[16]) {
    __m512 u[8], v[4];
    for (int i = 0; i < 8; i++) /* per lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
        u[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per lane: the lane sums of four vectors */
        const __m512d x = _mm512_castps_pd(u[2 * i]), y = _mm512_castps_pd(u[2 * i + 1]);
        v[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xdd));
    const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x88), _mm512_shuffle_f32x4(v[2], v[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd));
}

/* s[r * lds + j] = dot(q[r], k[j]) for r < m, j < n: q is m x d contiguous bf16, key j
 * starts at k + j * kstride (d contiguous bf16). Blocks of 4 rows x 4 keys: each 32-dim
 * slice of a key is loaded once for the 4 rows, pairs of products go through vdpbf16ps
 * into 16 accumulators, and sum16 turns them into the block's 16 scores. Meanwhile the
 * ranges ahead (the driver's next tile, or NULL) are prefetched, spread over the keys. */
void fa_decode_qk_bf16(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s,
                       int lds, const fa_decode_fetch *ahead) {
    int64_t done = 0;
    for (int j0 = 0; j0 < n; j0 += 4) {
        const int nj = n - j0 < 4 ? n - j0 : 4;
        if (ahead) {
            const int64_t upto = ahead->bytes * (j0 + nj) / n;
            for (; done < upto; done += 64) {
                _mm_prefetch(ahead->k + done, _MM_HINT_T1);
                _mm_prefetch(ahead->v + done, _MM_HINT_T1);
            }
        }
        const uint16_t *kr[4]; /* missing keys and rows: row 0 under an empty mask (never read) */
        __mmask32 klive[4];
        for (int j = 0; j < 4; j++) kr[j] = k + (j < nj ? j0 + j : j0) * kstride, klive[j] = j < nj ? ~0u : 0u;
        for (int r0 = 0; r0 < m; r0 += 4) {
            const int mr = m - r0 < 4 ? m - r0 : 4;
            const uint16_t *qr[4];
            __mmask32 qlive[4];
            for (int r = 0; r < 4; r++) qr[r] = q + (int64_t)(r < mr ? r0 + r : r0) * d, qlive[r] = r < mr ? ~0u : 0u;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
            for (int c = 0; c < d; c += 32) {
                const __mmask32 mk = fa_mask32(d - c);
                __m512bh kv[4], qv;
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) kv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mk & klive[j], kr[j] + c);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    qv = (__m512bh)_mm512_maskz_loadu_epi16(mk & qlive[r], qr[r] + c);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) acc[4 * r + j] = _mm512_dpbf16_ps(acc[4 * r + j], qv, kv[j]);
                }
            }
            float out[16]; /* lane 4 r + j: row r0 + r, key j0 + j */
            _mm512_storeu_ps(out, sum16(acc));
            for (int r = 0; r < mr; r++)
                for (int j = 0; j < nj; j++) s[(int64_t)(r0 + r) * lds + j0 + j] = out[4 * r + j];
        }
    }
}

/* o[r * ldo + c] += sum_j p[r * ldp + j] * v[j][c] for r < m, c < cols: value j starts at
 * v + j * vstride; p holds values already rounded to bf16 (SPEC section 1), so their bf16
 * bits are exact. Keys go in pairs through vdpbf16ps: rows j and j+1 interleaved by
 * unpacklo/hi_epi16 against the broadcast pair (p_j, p_j+1), which leaves the columns of
 * each 32 in a lane-interleaved order (lo: 0-3, 8-11, 16-19, 24-27; hi: 4-7, 12-15, ...);
 * the accumulators are loaded into that order and stored back out of it. Blocks of 4 rows
 * x 64 columns (16 accumulators). */
void fa_decode_pv_bf16(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                       int ldo) {
    static const uint16_t zero_row[64];
    const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i to_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i back0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i back1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const int np = (n + 1) / 2;
    for (int r0 = 0; r0 < m; r0 += 4) {
        const int mr = m - r0 < 4 ? m - r0 : 4;
        uint32_t pp[4][FA_DECODE_MAX_TILE / 2]; /* (p_j, p_j+1) as bf16 pairs; missing rows and keys: 0 */
        for (int r = 0; r < 4; r++)
            for (int jp = 0; jp < np; jp++) {
                uint32_t lo = 0, hi = 0;
                if (r < mr) {
                    const float *pr = p + (int64_t)(r0 + r) * ldp;
                    memcpy(&lo, &pr[2 * jp], 4);
                    if (2 * jp + 1 < n) memcpy(&hi, &pr[2 * jp + 1], 4);
                }
                pp[r][jp] = (lo >> 16) | (hi & 0xffff0000u);
            }
        for (int c0 = 0; c0 < cols; c0 += 64) {
            __m512 acc[4][4]; /* [row][lo 0-31, hi 0-31, lo 32-63, hi 32-63] */
            __mmask32 mk[2];
            for (int h = 0; h < 2; h++) mk[h] = fa_mask32(cols - c0 - 32 * h);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __mmask16 live = r < mr ? 0xffff : 0;
                const float *orow = o + (int64_t)(r0 + (r < mr ? r : 0)) * ldo + c0;
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m512 a = _mm512_maskz_loadu_ps(live & (__mmask16)mk[h], orow + 32 * h);
                    const __m512 b = _mm512_maskz_loadu_ps(live & (__mmask16)(mk[h] >> 16), orow + 32 * h + 16);
                    acc[r][2 * h] = _mm512_permutex2var_ps(a, to_lo, b);
                    acc[r][2 * h + 1] = _mm512_permutex2var_ps(a, to_hi, b);
                }
            }
            for (int jp = 0; jp < np; jp++) {
                const uint16_t *va = v + 2 * jp * vstride + c0;
                const uint16_t *vb = 2 * jp + 1 < n ? va + vstride : zero_row;
                const __mmask32 bm = 2 * jp + 1 < n ? ~0u : 0u;
                __m512bh x[4];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m512i a = _mm512_maskz_loadu_epi16(mk[h], va + 32 * h);
                    const __m512i b = _mm512_maskz_loadu_epi16(mk[h] & bm, vb + (bm ? 32 * h : 0));
                    x[2 * h] = (__m512bh)_mm512_unpacklo_epi16(a, b);
                    x[2 * h + 1] = (__m512bh)_mm512_unpackhi_epi16(a, b);
                }
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pp[r][jp]);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], w, x[q]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __mmask16 live = r < mr ? 0xffff : 0;
                float *orow = o + (int64_t)(r0 + (r < mr ? r : 0)) * ldo + c0;
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    _mm512_mask_storeu_ps(orow + 32 * h, live & (__mmask16)mk[h],
                                          _mm512_permutex2var_ps(acc[r][2 * h], back0, acc[r][2 * h + 1]));
                    _mm512_mask_storeu_ps(orow + 32 * h + 16, live & (__mmask16)(mk[h] >> 16),
                                          _mm512_permutex2var_ps(acc[r][2 * h], back1, acc[r][2 * h + 1]));
                }
            }
        }
    }
}
