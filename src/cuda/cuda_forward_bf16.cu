/* The forward kernels for bf16 inputs (cuda_forward.cuh); one file per dtype so they compile in parallel. */
#include "cuda_forward.cuh"
#include "cuda_hopper.h"

cudaError_t fa_cuda_launch_forward_bf16(const fa_cuda_params *p, int hd, cudaStream_t st) {
    if (fa_cuda_hopper_selected()) { /* opt-in: FA_CUDA_KERNEL=hopper on sm_90 */
        const cudaError_t e = fa_cuda_launch_hopper_forward_bf16(p, hd, st);
        if (e != cudaErrorNotSupported) return e; /* else outside its scope: mma.sync */
    }
    return launch_fwd_dtype<true>(*p, hd, st);
}
