/* What both backward passes share (cuda_backward.cuh): the tile rows, Delta = rowsum(dO o),
 * the gradient of one score and a named barrier. */
#ifndef FA_CUDA_BWD_COMMON_CUH
#define FA_CUDA_BWD_COMMON_CUH
#include "cuda_kernels.h"

namespace {

constexpr int BWD_BR = 64; /* query rows of a backward tile (FA_CUDA_BWD_BQ) */

/* Delta = rowsum(dO o), one warp per row; Dv <= 256 so one 8-element chunk per lane. */
template <bool BF16> __global__ void __launch_bounds__(256) delta_kernel(const fa_cuda_params p) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int64_t nrows = (int64_t)p.B * p.Hq * p.Sq;
    if (row >= nrows) return;
    const int64_t i = row % p.Sq, bh = row / p.Sq;
    const int h = (int)(bh % p.Hq), b = (int)(bh / p.Hq);
    const int64_t base = b * p.os[0] + h * p.os[1] + i * p.os[2];
    const uint16_t *o = (const uint16_t *)p.o_in + base, *d = (const uint16_t *)p.d_o + base;
    float sum = 0.f;
    const int c0 = lane * 8;
    if (c0 < p.Dv) {
        if (p.vec_o) {
            const uint4 ov = *reinterpret_cast<const uint4 *>(o + c0), dv = *reinterpret_cast<const uint4 *>(d + c0);
            const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                sum += to_f32<BF16>((uint16_t)(ow[e] & 0xffffu)) * to_f32<BF16>((uint16_t)(dw[e] & 0xffffu)) +
                       to_f32<BF16>((uint16_t)(ow[e] >> 16)) * to_f32<BF16>((uint16_t)(dw[e] >> 16));
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                sum += to_f32<BF16>(o[(c0 + e) * p.os[3]]) * to_f32<BF16>(d[(c0 + e) * p.os[3]]);
        }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (lane == 0) p.delta[row] = sum;
}

/* lse in the exponent domain; a row that saw no key (lse -inf) gives p = 0 everywhere. */
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * FA_LOG2E; }

/* P and dS for one score: x the raw dot product; returns p, *ds = p (dp - delta) (times
 * the softcap's sech^2). GEN: the general score path (softcap, bias, ALiBi, segment
 * ids); else only causal/window masks, skipped on full tiles. A hidden key has p = 0 and
 * dS = 0 even in a NaN row (lse NaN) or where dp is inf or NaN (docs/nonfinite.md). */
template <bool GEN>
__device__ __forceinline__ float grad_one(const fa_cuda_params &p, bool full, float x, float dp, float lse2,
                                          float delta, int b, int h, int64_t i, int j, int lo, int hi, int32_t qseg,
                                          float slope, float *ds) {
    float e;
    float dcap = 0.f;
    if (!GEN) e = (full || (j >= lo && j <= hi)) ? x * p.scale_log2 : -INFINITY;
    else e = score_one(p, x, b, h, i, j, lo, hi, qseg, slope, &dcap);
    const float pv = e == -INFINITY ? 0.f : fast_exp2(e - lse2);
    float d = pv * (dp - delta);
    if (GEN && p.softcap > 0.f) d *= dcap;
    *ds = pv == 0.f ? 0.f : d;
    return pv;
}

/* Barrier among the n threads (a multiple of 32) of named barrier id (1..15). */
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n)); }

} // namespace

#endif
