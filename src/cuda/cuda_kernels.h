/* Between the CUDA launchers (cuda_forward.cu, cuda_backward.cu) and the entry points
 * (cuda_api.cu). Internal C++ linkage, hidden from the library's exports. */
#ifndef FA_CUDA_KERNELS_H
#define FA_CUDA_KERNELS_H

#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "cuda_config.h"

/* hd: the head-dim class (cuda_config.h). Launch errors come back as the cudaError_t of
 * the failing call. One launcher per dtype (cuda_forward_bf16.cu, ..._f16.cu). */
cudaError_t fa_cuda_launch_forward_bf16(const fa_cuda_params *p, int hd, cudaStream_t st);
cudaError_t fa_cuda_launch_forward_f16(const fa_cuda_params *p, int hd, cudaStream_t st);
/* Delta, then the dk/dv pass, then the dq pass, in stream order. p->delta must be set. */
cudaError_t fa_cuda_launch_backward_bf16(const fa_cuda_params *p, int hd, cudaStream_t st);
cudaError_t fa_cuda_launch_backward_f16(const fa_cuda_params *p, int hd, cudaStream_t st);

#endif
