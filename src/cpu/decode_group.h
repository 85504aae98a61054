/* The online-softmax fold of the AVX-512 decode steps (decode_avx512bf16.c,
 * decode_cache_avx512.c, decode_cache_fp16.c), which hold a tile's scores as vectors of 4
 * query rows x 4 keys (lane 4 r + j: row r, key j): one home for the row max, the base and
 * the rescale, so that every step folds a tile into (max, sum, accumulators) the same way.
 * Included only by files built for AVX-512F. */
#ifndef FA_CPU_DECODE_GROUP_H
#define FA_CPU_DECODE_GROUP_H

#include "vexp.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* Lanes 4 r + j of x reduced over j (max or sum), in every lane of their group. */
static inline __m512 fa_group_max(__m512 x) {
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0xb1));
    return _mm512_max_ps(x, _mm512_permute_ps(x, 0x4e));
}
static inline __m512 fa_group_sum(__m512 x) {
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xb1));
    return _mm512_add_ps(x, _mm512_permute_ps(x, 0x4e));
}

/* Rows 0..mr-1 (mr <= 4) of a group whose tile's scores have the maxima top (lane 4 r + j;
 * a NaN never wins): each row's running max mx[r] moves to the new max, alpha[r] =
 * exp(old max - base) rescales what it held; returns the bases (the new max, 0 while it is
 * -inf, so never -inf + inf) in their group's lanes, for p = exp(score - base). */
static inline __m512 fa_group_bases(__m512 top, float *mx, int mr, float alpha[4]) {
    const __m512i to_group = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    float tops[16], base[4] = {0, 0, 0, 0};
    _mm512_storeu_ps(tops, fa_group_max(top));
    for (int r = 0; r < 4; r++) alpha[r] = 1.0f;
    for (int r = 0; r < mr; r++) {
        const float m_old = mx[r], m_new = m_old > tops[4 * r] ? m_old : tops[4 * r];
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = fa_vexpf(m_old - base[r]);
        mx[r] = m_new;
    }
    return _mm512_permutexvar_ps(to_group, _mm512_castps128_ps512(_mm_loadu_ps(base)));
}

/* The rows' sums after the exps (total: lane 4 r + j, the unrounded p summed): sum[r] =
 * sum[r] alpha[r] + the row's part. */
static inline void fa_group_sums(__m512 total, const float alpha[4], int mr, float *sum) {
    float sums[16];
    _mm512_storeu_ps(sums, fa_group_sum(total));
    for (int r = 0; r < mr; r++) sum[r] = sum[r] * alpha[r] + sums[4 * r];
}

/* The rows' accumulators (dv floats, ldo apart) rescaled by alpha where it is not 1. */
static inline void fa_group_rescale(float *o, int64_t ldo, int mr, int dv, const float alpha[4]) {
    for (int r = 0; r < mr; r++)
        if (alpha[r] != 1.0f)
            for (int c = 0; c < dv; c++) o[(int64_t)r * ldo + c] *= alpha[r];
}

#endif
