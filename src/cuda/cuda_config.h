/* The tile configurations compiled into the CUDA kernels, in plain C: the plan picks its
 * block sizes from here (cuda_plan.c) without a device, and the launchers dispatch on the
 * same head-dim class, so plan and kernels cannot disagree.
 *
 * Head dims are padded up to a class (32, 64, 96, 128, 192, 256) that both D and Dv fit;
 * padding columns are zero in shared memory and never counted. */
#ifndef FA_CUDA_CONFIG_H
#define FA_CUDA_CONFIG_H

#include <stdint.h>

/* The smallest class holding max(D, Dv), or 0 when none does (D > 256). */
static inline int fa_cuda_hd_class(int64_t d, int64_t dv) {
    const int64_t x = d > dv ? d : dv;
    static const int classes[] = {32, 64, 96, 128, 192, 256};
    for (int i = 0; i < 6; i++)
        if (x <= classes[i]) return classes[i];
    return 0;
}

/* Forward: 128 query rows per CTA, 64 keys per tile. */
#define FA_CUDA_FWD_BQ 128
static inline int64_t fa_cuda_fwd_bk(int hd) {
    (void)hd;
    return 64;
}

/* Backward (both passes): 64 query rows; 128 keys up to D 128, else 64. */
#define FA_CUDA_BWD_BQ 64
static inline int64_t fa_cuda_bwd_bk(int hd) { return hd <= 128 ? 128 : 64; }

/* Workspace layout: the counters first, then Delta rows (backward), each 256-aligned. */
#define FA_CUDA_COUNTER_BYTES 256

#endif
