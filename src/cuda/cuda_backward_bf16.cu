/* The backward kernels for bf16 inputs (cuda_backward.cuh); one file per dtype so they compile in parallel. */
#include "cuda_backward.cuh"

cudaError_t fa_cuda_launch_backward_bf16(const fa_cuda_params *p, int hd, cudaStream_t st) {
    return launch_bwd_dtype<true>(*p, hd, st);
}
