/* The naive float64 reference, for tests only (never linked into the library).
 * It follows docs/semantics.md ("The score of a query row and a key", "The outputs") literally: inputs read as given (already in their dtype),
 * every score, mask and sum in double, whole score rows materialised. */
#ifndef FA_REF_H
#define FA_REF_H

#include "flashattn.h"

#include <math.h>

/* Non-finite values (docs/nonfinite.md): each step of a score (the dot product, the scale,
 * the softcap, the bias, ALiBi) keeps f32's range, beyond which it is +-inf as the kernels'
 * f32 arithmetic is; a score of -inf (or a bias term of -inf, whatever the product) hides
 * its key; NaN or +inf in a visible score makes the row's o and lse NaN. */
static inline double fa_ref_f32_range(double x) {
    const double edge = 0x1.ffffffp127; /* from here f32 rounds to inf */
    return x >= edge ? INFINITY : x <= -edge ? -INFINITY : x;
}

/* o [B,Hq,Sq,Dv] and lse [B,Hq,Sq], contiguous doubles. Tensor pointers and strides as in
 * fa_forward_args / the problem (strides all zero = contiguous). */
void fa_ref_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);

/* dq [B,Hq,Sq,D], dk [B,Hk,Sk,D], dv [B,Hk,Sk,Dv], contiguous doubles: gradients of
 * sum(o * do). Uses a->q, k, v, d_o (and bias, slopes, segment ids); o and lse are
 * recomputed in double, not taken from a. */
void fa_ref_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                     double *dv);
/* The same, and (when dbias is not NULL) dbias [bias_batch, bias_heads, bias_seq_q, Sk]
 * (bias_seq_q 1, or Sq), contiguous doubles: bias_scale times the gradient of each final
 * score, summed over the (b, h, i) that read the bias entry. */
void fa_ref_backward_dbias(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                           double *dv, double *dbias);

/* Packed varlen (cu_seqlens): o [total_q, Hq, Dv], lse [Hq, total_q]; gradients packed
 * like q, k, v ([total, H, W] contiguous doubles). */
void fa_ref_varlen_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);
void fa_ref_varlen_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk, double *dv);
/* KV-cache decoding (cache_seqlens, paged via a->block_table, k_new/v_new appended):
 * o [B, Sq, Hq, Dv], lse [B, Hq, Sq]. Reads the caches as they were before the call. */
void fa_ref_decode(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);
/* fa_ref_backward_dbias, but with delta_i = do_i . o_i taken from a->o (the saved forward output, in the
 * problem's dtype and o_stride) as a kernel's backward does: the exact gradients the
 * kernel should give for that saved o. Its rounding shifts delta by do_i . (o_saved - o),
 * which dominates dq and dk where they nearly cancel (few visible keys, a peaked softmax);
 * through softcap that shift is weighted by 1 - tanh^2 per key. */
void fa_ref_backward_saved_o(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                             double *dv, double *dbias);
/* Per element of dq, dk, dv, the sum of the magnitudes of the terms fa_ref_backward_saved_o
 * adds up (|dS_ij k_j|, |dS_ij q_i|, p_ij |do_i|): a kernel that rounds each term's factor
 * (p, dS) to the dtype is off by up to u times this, however much the terms cancel. */
void fa_ref_backward_abs_terms(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk, double *dv);

#endif
