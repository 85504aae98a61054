/* The forward kernels for f16 inputs (cuda_forward.cuh); one file per dtype so they compile in parallel. */
#include "cuda_forward.cuh"

cudaError_t fa_cuda_launch_forward_f16(const fa_cuda_params *p, int hd, cudaStream_t st) {
    return launch_fwd_dtype<false>(*p, hd, st);
}
