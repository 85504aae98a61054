/* The online-softmax step of one row, shared by the forward (forward.c), decode (decode.c)
 * and the shared prefix's pass (cascade.c): scores from raw products (scores.h), the row
 * max, then the fold into the running (max, sum, accumulators). One home, so that the three
 * paths give the same bits for the same row and tile. */
#ifndef FA_CPU_SOFTMAX_ROW_H
#define FA_CPU_SOFTMAX_ROW_H

#include "isa.h"
#include "scores.h"
#include "vexp.h"

/* max of x[0..n), -inf if n == 0. Eight running maxima so that it vectorizes: the inner
 * loop over them must stay a loop (GCC 12 vectorizes it as maxps, but fails on the eight
 * scalar reductions it becomes when unrolled). A NaN never wins a comparison, so it is
 * skipped, here and in fa_scale_max. */
static inline float fa_row_max(const float *x, int n) {
    float part[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 8 <= n; j += 8)
#pragma GCC unroll 1
        for (int c = 0; c < 8; c++) part[c] = x[j + c] > part[c] ? x[j + c] : part[c];
    float mx = -INFINITY;
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    for (int c = 0; c < 8; c++) mx = part[c] > mx ? part[c] : mx;
    return mx;
}

/* x[j] *= scale and returns the max of the results, in one pass: in the common case (no
 * softcap, bias, ALiBi or mask on the row) this is all that turns products into scores,
 * and scaling then taking the max in two passes would read the row twice. The same
 * products and comparisons as the two passes, so the same results. */
static inline float fa_scale_max(float *restrict x, int n, float scale) {
    float part[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 8 <= n; j += 8)
#pragma GCC unroll 1 /* as in fa_row_max */
        for (int c = 0; c < 8; c++) {
            const float s = x[j + c] * scale;
            x[j + c] = s;
            part[c] = s > part[c] ? s : part[c];
        }
    float mx = -INFINITY;
    for (; j < n; j++) {
        x[j] *= scale;
        mx = x[j] > mx ? x[j] : mx;
    }
    for (int c = 0; c < 8; c++) mx = part[c] > mx ? part[c] : mx;
    return mx;
}

/* The scores of query row i of (b, h) against keys j0 .. j0 + n - 1 (srow: their raw
 * products, in place; scores.h defines them), returning the row's max. Row by row, so that
 * the row stays in L1 from here through the exps and the rounding (a whole tile of S does
 * not fit). The common row (only a scale) takes fa_scale_max, one pass. */
static inline float fa_score_row_max(const fa_score_ctx *sc, int64_t b, int64_t h, int64_t i, int64_t j0, int n,
                                     float *restrict srow) {
    if (fa_score_plain(sc, i, j0, n)) return fa_scale_max(srow, n, sc->scale);
    fa_score_row(sc, b, h, i, j0, n, srow, NULL);
    return fa_row_max(srow, n);
}

/* The online-softmax fold, in two steps so that a tile's rows can take the first together.
 * fa_softmax_bases, for rows r < nr whose scores' maxima are mt[r]: the new running max
 * (written to M[r]), the base the exponents are taken from and the rescale alpha of the old
 * sum and accumulators, exp(m_old - base). Independent rows: their exps are taken together,
 * by the ISA's exp_sum, the exp of p itself (a vector ISA's differs from the scalar
 * fa_vexpf in the last bit for some arguments: it fuses the multiply-adds). */
/* Rows whose bases a driver takes together: 16 rows of S (8 KiB at 128 keys) stay in L1
 * from their max to their exps. */
#define FA_SOFTMAX_GROUP 16

static inline void fa_softmax_bases(const fa_isa *isa, int nr, const float *restrict mt, float *restrict M,
                                    float *restrict base, float *restrict alpha) {
    int moved = 0;
    uint32_t fresh = 0; /* rows that had seen only -inf: their sum and accumulators hold 0 (or NaN) */
    for (int r = 0; r < nr; r++) {
        const float m_old = M[r], m_new = m_old > mt[r] ? m_old : mt[r];
        fresh |= (uint32_t)(m_old == -INFINITY) << r;
        /* A row that has seen only -inf keeps m = -inf; exponents are then taken relative
         * to 0, so every p and the rescale are exp(-inf) = 0, never exp(-inf + inf). */
        const float b = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = m_old - b; /* inf - inf is NaN, not 0: an infinite max still takes the exp */
        moved |= alpha[r] != 0.0f;
        base[r] = b;
        M[r] = m_new;
    }
    /* an unchanged max (the common case) rescales by exp(0) = 1 exactly: no exps at all
     * when no row's max moved */
    if (!moved) {
        for (int r = 0; r < nr; r++) alpha[r] = 1.0f;
    } else {
        (void)isa->exp_sum(alpha, nr, 0.0f);
        /* their rescale by exp(-inf) = 0 would leave 0 as 0 and NaN as NaN: 1 skips it
         * (a row's first key tile; a short row has few) */
        for (int r = 0; r < nr; r++)
            if (fresh >> r & 1) alpha[r] = 1.0f;
    }
}

/* The second step for one row (srow, n scores or raw products): srow becomes p (rounded to
 * the dtype t), *L is updated and arow (dv floats) is rescaled, ready for acc += p V.
 * pair_scale > 0: srow holds the raw products instead, whose scores are the products times
 * pair_scale, and p is written as the ISA's bf16 pairs (isa.h, exp_pairs). */
static inline void fa_softmax_finish(const fa_isa *isa, fa_dtype t, int64_t dv, float *restrict srow, int n,
                                     float base, float alpha, float *L, float *restrict arow, float pair_scale) {
    float rowsum;
    if (pair_scale > 0.0f) {
        rowsum = isa->exp_pairs(srow, n, pair_scale, base);
    } else {
        rowsum = isa->exp_sum(srow, n, base);
        fa_round_row(isa, t, srow, n);
    }
    *L = *L * alpha + rowsum;
    if (alpha != 1.0f) fa_scale_row(isa, arow, dv, alpha);
}

/* Both steps for one row whose max is mt: *M, *L, srow and arow as above. */
static inline void fa_softmax_row(const fa_isa *isa, fa_dtype t, int64_t dv, float *restrict srow, int n, float mt,
                                  float *M, float *L, float *restrict arow, float pair_scale) {
    float base, alpha;
    fa_softmax_bases(isa, 1, &mt, M, &base, &alpha);
    fa_softmax_finish(isa, t, dv, srow, n, base, alpha, L, arow, pair_scale);
}

#endif
