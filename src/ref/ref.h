/* The naive float64 reference, for tests only (never linked into the library).
 * It follows SPEC section 2 literally: inputs read as given (already in their dtype),
 * every score, mask and sum in double, whole score rows materialised. */
#ifndef FA_REF_H
#define FA_REF_H

#include "flashattn.h"

/* o [B,Hq,Sq,Dv] and lse [B,Hq,Sq], contiguous doubles. Tensor pointers and strides as in
 * fa_forward_args / the problem (strides all zero = contiguous). */
void fa_ref_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);

/* dq [B,Hq,Sq,D], dk [B,Hk,Sk,D], dv [B,Hk,Sk,Dv], contiguous doubles: gradients of
 * sum(o * do). Uses a->q, k, v, d_o (and bias, slopes, segment ids); o and lse are
 * recomputed in double, not taken from a. */
void fa_ref_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                     double *dv);
/* The same, and (when dbias is not NULL) dbias [bias_batch, bias_heads, Sq, Sk], contiguous
 * doubles: bias_scale times the gradient of each final score, summed over the (b, h) that
 * read the bias entry. */
void fa_ref_backward_dbias(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                           double *dv, double *dbias);

/* Packed varlen (cu_seqlens): o [total_q, Hq, Dv], lse [Hq, total_q]; gradients packed
 * like q, k, v ([total, H, W] contiguous doubles). */
void fa_ref_varlen_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);
void fa_ref_varlen_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk, double *dv);
/* KV-cache decoding (cache_seqlens, paged via a->block_table, k_new/v_new appended):
 * o [B, Sq, Hq, Dv], lse [B, Hq, Sq]. Reads the caches as they were before the call. */
void fa_ref_decode(const fa_problem *p, const fa_forward_args *a, double *o, double *lse);

#endif
