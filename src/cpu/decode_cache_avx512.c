/* Decode tile kernels for caches of f16, bf16, int8 or fp8 e4m3 elements with AVX-512F (and
 * F16C's vcvtph2ps, part of AVX-512F): each row is read in place, 16 elements at a time, and
 * converted in registers (f16: vcvtph2ps; bf16: its bits moved up 16; int8: sign extension
 * and vcvtdq2ps; fp8: its bits moved into an f16's, 32 codes at once at 512 bits, which is
 * exact for every e4m3 value at 2^-8 of it, then vcvtph2ps), so a cache byte is read once
 * and no packed copy is written. The math is f32
 * (fused multiply-adds): the scores of a block of 4 rows x 4 keys in 16 accumulators,
 * reduced together into one vector (lane 4 r + j), then the key's scale; p V over 4 rows x
 * 64 columns in 16 accumulators, with p times the value row's scale broadcast.
 * decode.c calls these for rows with contiguous elements; bf16 caches come here only on the
 * tables without decode_avx512bf16.c's step (the avx512 table: CPUs whose vdpbf16ps runs
 * fewer products a cycle than f32 multiply-adds, dispatch.c). The conversions live in
 * decode_cache_avx512.h; the amx table's int8 step is decode_cache_amx.c's. */
#include "decode_cache_avx512.h"
#include "decode_group.h"
#include "vexp.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Lines of the next tile prefetched per block of 4 keys in the scores and per key and 64
 * columns in p V (decode_avx512bf16.c's scheme). f16 (and bf16, 2 bytes alike): at half
 * decode_avx512bf16.c's rate. int8 and fp8
 * (tiles of 128 keys, 4096 lines with Hk = 8, D = 128): 3 and 2 issue 608 lines per head,
 * all of the next tile by the 7th of 8 heads, so that its touch finds it in cache; 2 and
 * 1 (320 lines) left 38% of it to the touch, which does not overlap the arithmetic.
 * Measured (1 thread, 32K tokens, cpu seconds, medians of 8-10 alternating runs on a
 * loaded machine): fp8 0.89x the time of 2 and 1, int8 0.96x; 4 and 2 no better. */
#define PF_QK(t) ((t) == FA_F16 || (t) == FA_BF16 ? 2 : 3)
#define PF_PV(t) ((t) == FA_F16 || (t) == FA_BF16 ? 1 : 2)
/* The ISA table's multiple of them (isa.h prefetch_x) for f16 and int8; fp8, bound by its
 * arithmetic rather than by the reads, keeps its own: twice the lines made its step 3%
 * slower on the amx table's cores, where f16 read 5% faster (bench/RESULTS.md). */
INLINE void prefetch(fa_decode_prefetch *pf, int lines, const fa_dtype ty) {
    if (ty == FA_FP8_E4M3) fa_decode_prefetch_lines(pf, lines);
    else fa_decode_prefetch_scaled(pf, lines);
}
/* Where the table says so (isa.h, prefetch_per_line), a line of the next tile for each line
 * of this one read instead: `bytes` read since the last call, in lines (a block of scores
 * reads 4 keys' rows, a key's p V its 64 columns), so that the next tile is all asked for by
 * the end of the last head's step and the requests keep pace with the reads. */
INLINE void prefetch_read(fa_decode_prefetch *pf, int lines, int64_t bytes, const fa_dtype ty) {
    if (pf && pf->per_line) fa_decode_prefetch_lines(pf, (int)((bytes + 63) / 64));
    else prefetch(pf, lines, ty);
}

/* Lane 4 g + j: the sum of lanes 4 g .. 4 g + 3 of a_j, within each 128-bit lane. */
static inline __m512 pair_sum(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
static inline __m512 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512d x = _mm512_castps_pd(pair_sum(a0, a1)), y = _mm512_castps_pd(pair_sum(a2, a3));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
/* Lane 4 r + j: the sum of all 16 lanes of acc[r][j]. */
static inline __m512 sum16(__m512 acc[4][4]) {
    const __m512 x0 = sum4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]), x1 = sum4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
    const __m512 x2 = sum4(acc[2][0], acc[2][1], acc[2][2], acc[2][3]), x3 = sum4(acc[3][0], acc[3][1], acc[3][2], acc[3][3]);
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xee));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xdd));
}


/* 32 bf16 elements from one 64-byte load as two f32 vectors with no shuffle: lane i of lo
 * holds element 2 i (its bits moved up 16), of hi element 2 i + 1 (the 32-bit word's upper
 * half as it is). The step pairs them with q and o's columns in that order (step_all's
 * q_pairs, pv_block's permutes): 2 instructions per 32 elements instead of 4. */
INLINE void bf16_pairs32(const void *x, __m512 *lo, __m512 *hi) {
    const __m512i w = _mm512_loadu_si512(x);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Lane picks for _mm512_permutex2var_ps (a, idx, b): the even and the odd elements of a:b,
 * the order bf16_pairs32 gives. */
#define EVENS _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define ODDS _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)

/* load32 and load16, or (fast) fp8's fp8_fast16 (rows fp8_fast_row passed) and bf16's
 * bf16_pairs32 (32 whole elements; load16 takes the rest in order). */
INLINE void load32_or_fast(fa_dtype ty, const void *x, __m512 *lo, __m512 *hi, int fast) {
    if (fast && ty == FA_BF16) bf16_pairs32(x, lo, hi);
    else if (fast) *lo = fp8_fast16(x, 0xffff), *hi = fp8_fast16((const char *)x + 16, 0xffff);
    else load32(ty, x, lo, hi);
}
INLINE __m512 load16_or_fast(fa_dtype ty, const void *x, __mmask16 mask, int fast) {
    return fast && ty == FA_FP8_E4M3 ? fp8_fast16(x, mask) : load16(ty, x, mask);
}

/* Scores of rows r0.. (mr <= 4) against keys j0.. (nj <= 4; missing ones repeat the first):
 * lane 4 r + j, times ksc[j0 + j] (tile_scales). */
INLINE __m512 qk_block(const fa_decode_cache_tile *t, const float *q, int mr, int j0, int nj, const float *ksc,
                       const fa_dtype ty, const int fast) {
    const int d = t->d;
    const void *k[4];
    for (int j = 0; j < 4; j++) k[j] = at(ty, t->k, (int64_t)(j0 + (j < nj ? j : 0)) * t->kstride);
    const float *qr[4];
    for (int r = 0; r < 4; r++) qr[r] = q + (int64_t)(r < mr ? r : 0) * d;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= d; c += 32) { /* whole 32-element slices */
        __m512 kv[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) load32_or_fast(ty, at(ty, k[j], c), &kv[j][0], &kv[j][1], fast);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512 qv = _mm512_loadu_ps(qr[r] + c + 16 * h);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(qv, kv[j][h], acc[r][j]);
            }
    }
    for (; c < d; c += 16) { /* the rest, 16 (or fewer) at a time */
        const __mmask16 m = d - c >= 16 ? (__mmask16)0xffff : fa_mask16(d - c);
        __m512 kv[4], qv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = load16_or_fast(ty, at(ty, k[j], c), m, fast);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) qv[r] = _mm512_maskz_loadu_ps(m, qr[r] + c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(qv[r], kv[j], acc[r][j]);
    }
    return _mm512_mul_ps(sum16(acc), _mm512_broadcast_f32x4(_mm_loadu_ps(ksc + j0)));
}

INLINE void qk_all(const fa_decode_cache_tile *t, float *s, int lds, const fa_dtype ty) {
    float ksc[SCALES_MAX];
    tile_scales(t->kscale, t->sstride, t->n, unit(ty), ksc);
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        for (int j0 = 0; j0 < t->n; j0 += 4) {
            const int nj = t->n - j0 < 4 ? t->n - j0 : 4;
            float out[16];
            _mm512_storeu_ps(out, qk_block(t, t->q + (int64_t)r0 * t->d, mr, j0, nj, ksc, ty, 0));
            for (int r = 0; r < mr; r++)
                for (int j = 0; j < nj; j++) s[(int64_t)(r0 + r) * lds + j0 + j] = out[4 * r + j];
        }
    }
}

/* Each pair of accumulators a = acc[r][2 h], b = acc[r][2 h + 1] as (a, b) picked by i0 and
 * by i1 (_mm512_permutex2var_ps): pv_block's change of column order for bf16_pairs32. */
INLINE void permute_pairs(__m512 acc[4][4], __m512i i0, __m512i i1) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 a = acc[r][2 * h], b = acc[r][2 * h + 1];
            acc[r][2 * h] = _mm512_permutex2var_ps(a, i0, b);
            acc[r][2 * h + 1] = _mm512_permutex2var_ps(a, i1, b);
        }
}

/* o rows r0.. (mr <= 4) += sum_j w[r][j] v_j over columns [c0, c0 + 64) (cols of them);
 * try_fast: fp8 value rows that fp8_fast_row passes take fp8_fast16. */
INLINE void pv_block(const fa_decode_cache_tile *t, const float (*w)[FA_DECODE_MAX_TILE], int mr, int c0, float *o,
                     int ldo, const fa_dtype ty, const int try_fast) {
    const int cols = t->dv - c0 < 64 ? t->dv - c0 : 64;
    __mmask16 mk[4];
    for (int q = 0; q < 4; q++) {
        const int left = cols - 16 * q;
        mk[q] = left >= 16 ? (__mmask16)0xffff : left > 0 ? fa_mask16(left) : 0;
    }
    /* bf16 (bf16_pairs32): accumulators q = 2 h, 2 h + 1 hold the even and the odd columns
     * of the 32 at c0 + 32 h */
    const int pairs = ty == FA_BF16 && try_fast && cols == 64;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            acc[r][q] = _mm512_maskz_loadu_ps(r < mr ? mk[q] : 0, o + (int64_t)(r < mr ? r : 0) * ldo + c0 + 16 * q);
    if (pairs) permute_pairs(acc, EVENS, ODDS);
    for (int j = 0; j < t->n; j++) {
        const void *vr = at(ty, t->v, (int64_t)j * t->vstride + c0);
        __m512 x[4];
        const int fast = ty == FA_BF16 ? pairs : ty == FA_FP8_E4M3 && try_fast && fp8_fast_row(vr, cols);
        if (cols == 64) {
            load32_or_fast(ty, vr, &x[0], &x[1], fast);
            load32_or_fast(ty, at(ty, vr, 32), &x[2], &x[3], fast);
        } else {
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                x[q] = mk[q] ? load16_or_fast(ty, at(ty, vr, 16 * q), mk[q], fast) : _mm512_setzero_ps();
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512 p = _mm512_set1_ps(w[r][j]);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_fmadd_ps(p, x[q], acc[r][q]);
        }
        prefetch_read(t->pf, PF_PV(ty), (int64_t)cols * elem_bytes(ty), ty);
    }
    if (pairs) /* back into column order: lanes of the evens and the odds interleaved */
        permute_pairs(acc, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            if (r < mr) _mm512_mask_storeu_ps(o + (int64_t)r * ldo + c0 + 16 * q, mk[q], acc[r][q]);
}

INLINE void pv_all(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo, const fa_dtype ty) {
    float w[4][FA_DECODE_MAX_TILE]; /* p times the value row's scale (and fp8's 2^8); rows past m: 0 */
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < t->n; j++)
                w[r][j] = r < mr ? p[(int64_t)(r0 + r) * ldp + j] * (t->vscale ? t->vscale[(int64_t)j * t->sstride] : 1.0f) *
                                       unit(ty)
                                 : 0.0f;
        for (int c0 = 0; c0 < t->dv; c0 += 64)
            pv_block(t, (const float(*)[FA_DECODE_MAX_TILE])w, mr, c0, o + (int64_t)r0 * ldo, ldo, ty, 0);
    }
}

/* q's rows r < mr (d floats each, contiguous) into out (rows d apart) for bf16_pairs32's
 * keys: each whole 32-element slice as its 16 even elements then its 16 odd ones, the rest
 * as it is. */
#define PAIRS_MAX_D 512
INLINE void q_pairs(const float *q, int mr, int d, float *out) {
    for (int r = 0; r < mr; r++) {
        const float *x = q + (int64_t)r * d;
        float *y = out + (int64_t)r * d;
        int c = 0;
        for (; c + 32 <= d; c += 32) {
            const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
            _mm512_storeu_ps(y + c, _mm512_permutex2var_ps(a, EVENS, b));
            _mm512_storeu_ps(y + c + 16, _mm512_permutex2var_ps(a, ODDS, b));
        }
        for (; c < d; c++) y[c] = x[c];
    }
}

/* The online-softmax step of dec_row (decode.c) for a tile every row sees whole, 4 rows at
 * a time, in registers: scores (the key's scale applied), the row max (a NaN never wins),
 * base = the new max (0 while it is -inf), alpha = exp(old max - base), p = exp(score -
 * base) summed unrounded and rounded to the problem's dtype pd, then p V with the value
 * rows' scales. */
INLINE void step_all(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum, float *acc,
                     int ldacc, const fa_dtype ty) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    static const __mmask16 keys_live[4] = {0xffff, 0x1111, 0x3333, 0x7777}; /* by n % 4 */
    const int nb = (t->n + 3) / 4;
    float ksc[SCALES_MAX], vsc[SCALES_MAX]; /* padded with 1s: p = 0 for missing keys, 0 * 1 */
    tile_scales(t->kscale, t->sstride, t->n, unit(ty), ksc);
    tile_scales(t->vscale, t->sstride, t->n, unit(ty), vsc);
    /* bf16 keys in bf16_pairs32's order where q's rows fit qp, q's whole 32-element slices
     * laid out to match (the even elements, then the odd ones) */
    const int pairs = ty == FA_BF16 && t->d <= PAIRS_MAX_D;
    float qp[4 * PAIRS_MAX_D] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        const float *q = t->q + (int64_t)r0 * t->d;
        if (pairs) {
            q_pairs(q, mr, t->d, qp);
            q = qp;
        }
        __m512 S[FA_DECODE_MAX_TILE / 4], top = neg_inf;
        for (int b = 0; b < nb; b++) {
            const int nj = t->n - 4 * b < 4 ? t->n - 4 * b : 4;
            int fast = ty == FA_FP8_E4M3; /* the keys' rows all pass fp8_fast_row */
            for (int j = 0; j < nj && fast; j++) fast = fp8_fast_row(at(ty, t->k, (int64_t)(4 * b + j) * t->kstride), t->d);
            const __m512 x = fast || pairs ? qk_block(t, q, mr, 4 * b, nj, ksc, ty, 1) : qk_block(t, q, mr, 4 * b, nj, ksc, ty, 0);
            S[b] = _mm512_mul_ps(x, vscale);
            if (b == nb - 1) S[b] = _mm512_mask_blend_ps(keys_live[t->n % 4], neg_inf, S[b]);
            top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
            prefetch_read(t->pf, PF_QK(ty), (int64_t)nj * t->d * elem_bytes(ty), ty);
        }
        float alpha[4];
        const __m512 vbase = fa_group_bases(top, mx + r0, mr, alpha);
        __m512 total = _mm512_setzero_ps();
        float w[4][FA_DECODE_MAX_TILE]; /* p rounded, times the value row's scale (and fp8's 2^8) */
        for (int b = 0; b < nb; b++) {
            const __m512 e = fa_avx512_exp_nonpos(_mm512_sub_ps(S[b], vbase));
            total = _mm512_add_ps(total, e);
            float out[16];
            _mm512_storeu_ps(out, _mm512_mul_ps(round_to(e, pd), _mm512_broadcast_f32x4(_mm_loadu_ps(vsc + 4 * b))));
            for (int r = 0; r < 4; r++) memcpy(&w[r][4 * b], &out[4 * r], 16);
        }
        fa_group_sums(total, alpha, mr, sum + r0);
        float *o = acc + (int64_t)r0 * ldacc;
        fa_group_rescale(o, ldacc, mr, t->dv, alpha);
        for (int c0 = 0; c0 < t->dv; c0 += 64) pv_block(t, (const float(*)[FA_DECODE_MAX_TILE])w, mr, c0, o, ldacc, ty, 1);
    }
}

void fa_decode_cache_step_f32_avx512(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                                     float *acc, int ldacc) {
    if (t->t == FA_F16) step_all(t, scale, pd, mx, sum, acc, ldacc, FA_F16);
    else if (t->t == FA_BF16) step_all(t, scale, pd, mx, sum, acc, ldacc, FA_BF16);
    else if (t->t == FA_INT8) step_all(t, scale, pd, mx, sum, acc, ldacc, FA_INT8);
    else step_all(t, scale, pd, mx, sum, acc, ldacc, FA_FP8_E4M3);
}

void fa_decode_cache_step_avx512(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                                 float *acc, int ldacc) {
    if (t->t != FA_FP8_E4M3 || !fa_decode_cache_step_fp16(t, scale, pd, mx, sum, acc, ldacc))
        fa_decode_cache_step_f32_avx512(t, scale, pd, mx, sum, acc, ldacc);
}

void fa_decode_cache_qk_avx512(const fa_decode_cache_tile *t, float *s, int lds) {
    if (t->t == FA_F16) qk_all(t, s, lds, FA_F16);
    else if (t->t == FA_BF16) qk_all(t, s, lds, FA_BF16);
    else if (t->t == FA_INT8) qk_all(t, s, lds, FA_INT8);
    else qk_all(t, s, lds, FA_FP8_E4M3);
}

void fa_decode_cache_pv_avx512(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo) {
    if (t->t == FA_F16) pv_all(t, p, ldp, o, ldo, FA_F16);
    else if (t->t == FA_BF16) pv_all(t, p, ldp, o, ldo, FA_BF16);
    else if (t->t == FA_INT8) pv_all(t, p, ldp, o, ldo, FA_INT8);
    else pv_all(t, p, ldp, o, ldo, FA_FP8_E4M3);
}
