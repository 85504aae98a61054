/* The naive float64 reference, for tests only (never linked into the library).
 * It follows docs/semantics.md ("The score of a query row and a key", "The outputs") literally: inputs read as given (already in their dtype),
 * every score, mask and sum in double, whole score rows materialised. */
#ifndef FA_REF_H
#define FA_REF_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>

/* Non-finite values (docs/nonfinite.md): each step of a score (the dot product, the scale,
 * the softcap, the bias, ALiBi) keeps f32's range, beyond which it is +-inf as the kernels'
 * f32 arithmetic is; a score of -inf (or a bias term of -inf, whatever the product) hides
 * its key; NaN or +inf in a visible score makes the row's o and lse NaN. */
static inline double fa_ref_f32_range(double x) {
    const double edge = 0x1.ffffffp127; /* from here f32 rounds to inf */
    return x >= edge ? INFINITY : x <= -edge ? -INFINITY : x;
}

/* A dense mask for every reference call that follows (NULL: none): attend [B, Hq, Sq, Sk]
 * contiguous, 0 hides key j from row i of (b, h), ANDed with causal, window and segment ids.
 * The references never read fa_problem.mask: a test states its mask here, per element, from
 * its own definition (docs/masks.md). Tests only (one global, not thread-safe). */
void fa_ref_attend(const unsigned char *attend);
const unsigned char *fa_ref_attend_get(void);

/* o [B,Hq,Sq,Dv] and lse [B,Hq,Sq], contiguous doubles. Tensor pointers and strides as in
 * fa_forward_args / the problem (strides all zero = contiguous). */
void fa_ref_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);

/* Dropout (docs/semantics.md, "Dropout"): o with each p_ij replaced by
 * p_ij keep[b, h, i, j] / (1 - dropout_p), lse undropped; keep [B, Hq, Sq, Sk] contiguous
 * bytes, 1 = kept (the test takes it from fa_dropout_keep_mask). NULL keep: fa_ref_forward. */
void fa_ref_forward_dropout(const fa_problem *p, const fa_forward_args *a, const uint8_t *keep, double *o,
                            double *lse);
/* Its gradients: dv_j += p_j z_j do / (1 - dropout_p), dS_j = p_j (z_j dp_j / (1 - dropout_p)
 * - delta), z = keep; saved_o as fa_ref_backward_saved_o (delta from a->o), abs_terms as
 * fa_ref_backward_abs_terms (the magnitudes of the terms instead). */
void fa_ref_backward_dropout(const fa_problem *p, const fa_backward_args *a, const uint8_t *keep, int saved_o,
                             int abs_terms, double *dq, double *dk, double *dv);

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
/* With attention sinks (a->sinks, problem has_sinks): dq, dk, dv as fa_ref_backward (or,
 * saved_o, as fa_ref_backward_saved_o) and dsink [Hq]: the gradient of sum(o * do) with
 * respect to each head's sink logit, summed over batch and rows. */
void fa_ref_backward_sinks(const fa_problem *p, const fa_backward_args *a, int saved_o, double *dq, double *dk,
                           double *dv, double *dsink);

#endif
