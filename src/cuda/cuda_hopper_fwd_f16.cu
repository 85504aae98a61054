/* The Hopper forward for f16 inputs (cuda_hopper_fwd.cuh): 6 instantiations (D 64, 128,
 * 256; plain and GEN), sm_90a code only (other targets compile an empty body). One file
 * per dtype so they build in parallel. */
#include "cuda_hopper_fwd.cuh"

cudaError_t fa_cuda_launch_hopper_forward_f16(const fa_cuda_params *p, int hd, cudaStream_t st) {
    return launch_hopper_fwd<false>(*p, hd, st);
}
