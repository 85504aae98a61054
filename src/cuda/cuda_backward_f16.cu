/* The backward kernels for f16 inputs (cuda_backward.cuh); one file per dtype so they compile in parallel. */
#include "cuda_backward.cuh"

cudaError_t fa_cuda_launch_backward_f16(const fa_cuda_params *p, int hd, cudaStream_t st) {
    return launch_bwd_dtype<false>(*p, hd, st);
}
