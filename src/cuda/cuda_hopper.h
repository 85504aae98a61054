/* Between the Hopper forward (cuda_hopper_fwd.cuh) and the rest of the CUDA backend: the
 * run-time choice of kernel, the scope check, and the TMA tensor maps (host code in
 * cuda_hopper_dispatch.cu). Internal C++ linkage. */
#ifndef FA_CUDA_HOPPER_H
#define FA_CUDA_HOPPER_H

#include <cuda.h> /* CUtensorMap, a type only */
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "cuda_config.h"

/* FA_CUDA_KERNEL=hopper in the environment (read at each call) and a compute capability
 * 9.0 current device. Until a device run has verified the Hopper kernels, nothing else
 * selects them. */
bool fa_cuda_hopper_selected(void);
/* FA_CUDA_HOPPER_PINGPONG=1: the consumers take turns to issue their products (1 or 0). */
int fa_cuda_hopper_pingpong(void);
/* Does the Hopper forward cover this problem (head-dim class hd)? See cuda_hopper_fwd.cuh. */
bool fa_cuda_hopper_fwd_eligible(const fa_cuda_params *p, int hd);
/* A 4-d tensor map over a [B, H, S, W] tensor of 16-bit elements (unit column stride,
 * element strides st[0..2] for b, h, s), boxes of box_w x box_s elements, 128-byte
 * swizzle, zeros outside. Through the driver entry point, so libcuda is not linked. */
cudaError_t fa_cuda_tmap_bhsd(CUtensorMap *map, const void *ptr, bool bf16, int W, int S, int H, int B,
                              const int64_t st[4], int box_w, int box_s);
/* Counts the Hopper kernel launches (the tests check that the opt-in reached it). */
void fa_cuda_hopper_note_launch(void);

/* cudaErrorNotSupported: outside the Hopper forward's scope (the caller falls back). */
cudaError_t fa_cuda_launch_hopper_forward_bf16(const fa_cuda_params *p, int hd, cudaStream_t st);
cudaError_t fa_cuda_launch_hopper_forward_f16(const fa_cuda_params *p, int hd, cudaStream_t st);

#endif
