/* Delta = rowsum(dO * o), the backward's one per-row term that is not a matrix product.
 * Both backward schedules (backward.c, backward_fused.c) compute it here, in the same order,
 * which is part of why their gradients are bit-identical. */
#ifndef FA_CPU_BACKWARD_DELTA_H
#define FA_CPU_BACKWARD_DELTA_H

#include "../internal.h"

/* Delta of row r of the flattened [B, Hq, Sq] rows. */
static inline float fa_bwd_delta_row(const fa_problem *p, const fa_backward_args *a, int64_t r) {
    const int64_t Hq = p->heads_q, Sq = p->seq_q;
    const int64_t b = r / (Hq * Sq), h = r / Sq % Hq, i = r % Sq;
    float sum = 0.0f;
    for (int64_t x = 0; x < p->head_dim_v; x++)
        sum += fa_load(p->dtype, a->d_o, fa_offset(&p->o_stride, b, h, i, x)) *
               fa_load(p->dtype, a->o, fa_offset(&p->o_stride, b, h, i, x));
    return sum;
}

#endif /* FA_CPU_BACKWARD_DELTA_H */
