/* The CUDA backward: FlashAttention-2's gradients in two deterministic passes, no atomics
 * on gradients.
 *
 *   delta:  Delta_i = rowsum(dO_i o_i), f32, into the workspace.
 *   dk/dv:  one CTA per (key tile, kv head, batch). Warps own 16 keys each (with CS = 2 two
 *           warps share 16 keys and split the head dim of dK/dV). The CTA keeps K and V in
 *           shared memory and walks, for each query head of its GQA group, the query tiles
 *           whose key tiles (schedule.h) hold its key tile, Q/dO double-buffered:
 *           S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - Delta),
 *           dV += P^T dO, dK += dS^T Q.
 *   dq:     one CTA per (QPC query tiles, head, batch), warps splitting the query rows,
 *           K/V double-buffered: S, P, dP = dO V^T, dS, dQ += dS K.
 *
 * Both passes visit exactly the (query tile, key tile) pairs of the schedule with the
 * plan's backward blocks, and count per pair m*n*2*(2D+2Dv) resp. m*n*2*(2D+Dv) flops and
 * m*n exps (+ m*n tanh under softcap) each. Sub-chunks inside a tile change no count. */
#ifndef FA_CUDA_BACKWARD_CUH
#define FA_CUDA_BACKWARD_CUH
#include "cuda_bwd_dkdv.cuh"
#include "cuda_bwd_dq.cuh"

namespace {

template <int HD, int NW, int CS, int MTK, int SUBQ, int QPC, int MT, int KS, int SUBK, bool BF16, bool GEN>
cudaError_t launch_bwd(const fa_cuda_params &p, cudaStream_t st) {
    constexpr int BC = 16 * MTK * NW / CS, SROW = HD + 8, BR = BWD_BR;
    constexpr int NWQ = QPC * BR / (16 * MT) * KS;
    if (BR != FA_CUDA_BWD_BQ || BC != fa_cuda_bwd_bk(HD)) return cudaErrorInvalidConfiguration; /* plan != kernel */
    cudaError_t e;
    {
        const dim3 grid((unsigned)(((int64_t)p.B * p.Hq * p.Sq + 7) / 8));
        delta_kernel<BF16><<<grid, 256, 0, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    {
        const size_t smem = (size_t)(2 * BC + 4 * BR) * SROW * 2 + 4 * BR * sizeof(float) +
                            (CS > 1 ? (size_t)2 * BC * (SUBQ + 8) * 2 : 0);
        if ((e = cudaFuncSetAttribute(dkdv_kernel<HD, NW, CS, MTK, SUBQ, BF16, GEN>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return e;
        const dim3 grid((unsigned)((p.Sk + BC - 1) / BC), (unsigned)p.Hk, (unsigned)p.B);
        dkdv_kernel<HD, NW, CS, MTK, SUBQ, BF16, GEN><<<grid, NW * 32, smem, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    {
        const size_t smem = (size_t)(2 * QPC * BR + 4 * BC) * SROW * 2;
        if ((e = cudaFuncSetAttribute(dq_kernel<HD, QPC, MT, KS, BC, SUBK, BF16, GEN>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return e;
        const dim3 grid((unsigned)((p.Sq + QPC * BR - 1) / (QPC * BR)), (unsigned)p.Hq, (unsigned)p.B);
        dq_kernel<HD, QPC, MT, KS, BC, SUBK, BF16, GEN><<<grid, NWQ * 32, smem, st>>>(p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int HD, int NW, int CS, int MTK, int SUBQ, int QPC, int MT, int KS, int SUBK, bool BF16>
cudaError_t launch_bwd_gen(const fa_cuda_params &p, cudaStream_t st) {
    if (p.has_mods || p.has_seg) return launch_bwd<HD, NW, CS, MTK, SUBQ, QPC, MT, KS, SUBK, BF16, true>(p, st);
    return launch_bwd<HD, NW, CS, MTK, SUBQ, QPC, MT, KS, SUBK, BF16, false>(p, st);
}

/* head-dim class -> dk/dv: warps, CS, MTK, query sub-chunk; dq: query tiles per CTA, MT,
 * KS, key sub-chunk. Keys per tile 16 * MTK * warps / CS must match cuda_config.h. */
template <bool BF16> cudaError_t launch_bwd_dtype(const fa_cuda_params &p, int hd, cudaStream_t st) {
    switch (hd) {
    case 32: return launch_bwd_gen<32, 8, 1, 1, 64, 2, 2, 2, 64, BF16>(p, st);
    case 64: return launch_bwd_gen<64, 8, 1, 1, 64, 2, 2, 2, 64, BF16>(p, st);
    case 96: return launch_bwd_gen<96, 8, 2, 2, 64, 2, 2, 2, 64, BF16>(p, st);
    case 128: return launch_bwd_gen<128, 8, 2, 2, 64, 2, 2, 2, 64, BF16>(p, st);
    case 192: return launch_bwd_gen<192, 8, 2, 1, 64, 1, 1, 2, 32, BF16>(p, st);
    case 256: return launch_bwd_gen<256, 8, 2, 1, 64, 1, 1, 2, 32, BF16>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

#endif
