/* What the AMX decode steps over int8 and fp8 caches share (decode_cache_amx.c,
 * decode_cache_amx_fp8.c): the tile configuration, the lane layout of their scores (a
 * vector per 4 keys, lane 4 j + r: key j, query row r of a group of 4) and the online
 * softmax between the two products, whose rules are decode_cache_avx512.c's step_all's. */
#ifndef FA_CPU_DECODE_CACHE_AMX_H
#define FA_CPU_DECODE_CACHE_AMX_H

#include "amx_tiles.h"
#include "decode_cache_avx512.h"
#include "vexp.h"

#include <math.h>

#define FA_AMX_KEYS FA_DECODE_MAX_TILE /* keys per step at most (128) */
#define FA_AMX_DIM 128                 /* head dims (and value columns) at most */

/* Every tile 16 rows x 64 bytes (rows past what a product uses are zeros). */
static const fa_tile_config fa_amx_cfg = {.palette = 1,
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

/* s[j][r] (lane 4 j + r) of keys j0.. j0 + 15 from their C tile c (16 keys x 16 int32 or f32
 * columns, column 4 p + r: piece p of row r), each column times cs's lane. */
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
INLINE __m512 fa_amx_softmax_weights(const float *s, int n, const float *ksc, const float *vsc, float scale,
                                     fa_dtype pd, int mr, float *mx, float *sum, float *w, float *alpha) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    const __m512i to_key = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int nv = (n + 3) / 4, n64 = (n + 63) & ~63;
    __m512 S[FA_AMX_KEYS / 4], top = neg_inf;
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

/* Row r's weights of keys j0.. j0 + 15 (w in lane 4 j + r, as fa_amx_softmax_weights leaves it). */
INLINE __m512 fa_amx_row_weights(const float *w, int j0, int r) {
    const __m512 *wv = (const __m512 *)(w + 4 * j0);
    const __m512i idx = _mm512_setr_epi32(r, 4 + r, 8 + r, 12 + r, 16 + r, 20 + r, 24 + r, 28 + r, r, 4 + r, 8 + r,
                                          12 + r, 16 + r, 20 + r, 24 + r, 28 + r);
    const __m512 lo = _mm512_permutex2var_ps(wv[0], idx, wv[1]), hi = _mm512_permutex2var_ps(wv[2], idx, wv[3]);
    return _mm512_shuffle_f32x4(lo, hi, 0x44);
}

#endif
