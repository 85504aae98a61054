/* The CUDA forward, FlashAttention-2's structure: one CTA per (query tile, head, batch),
 * its warps splitting the tile's query rows (MT tiles of 16 rows each), K and V tiles
 * double-buffered in shared memory by cp.async, S = Q K^T and O += P V on the tensor cores
 * (mma.sync m16n8k16, f32 accumulate), online softmax in base 2 (log2(e) folded into the
 * scale), P handed from the S accumulators to the second product in registers.
 *
 * Key tiles are those of fa_sched_key_tiles (schedule.h), nothing more and nothing less, so
 * the counts match the cost model: per computed tile m*n*(D + Dv)*2 flops and m*n exps (+
 * m*n tanh under softcap) + m rescale exps; one log per query row. */
#ifndef FA_CUDA_FORWARD_CUH
#define FA_CUDA_FORWARD_CUH
#include "cuda_kernels.h"

namespace {

/* GEN: the general score path (softcap, bias, ALiBi, segment ids), a kernel of its own so
 * the plain one keeps its registers for the accumulators. */
template <int HD, int NW, int MT, int BC, bool BF16, bool GEN>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1) fwd_kernel(const fa_cuda_params p) {
    constexpr int NT = NW * 32, BR = NW * MT * 16, SROW = HD + 8;
    constexpr int NKT = BC / 8, NDT = HD / 8;
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sQ = smem, *sK = smem + BR * SROW, *sV = sK + 2 * BC * SROW;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
    const int r0 = blockIdx.x * BR, m = min(BR, p.Sq - r0);
    int kt0, kt1;
    dev_key_tile_range(p, r0, r0 + m, BC, &kt0, &kt1);
    const int ntiles = kt1 - kt0;

    const uint16_t *qg = (const uint16_t *)p.q + b * p.qs[0] + h * p.qs[1] + (int64_t)r0 * p.qs[2];
    const uint16_t *kg = (const uint16_t *)p.k + b * p.ks[0] + hk * p.ks[1];
    const uint16_t *vg = (const uint16_t *)p.v + b * p.vs[0] + hk * p.vs[1];

    auto load_kv = [&](int kt, int buf) {
        const int k0 = kt * BC, n = min(BC, p.Sk - k0);
        load_tile<BC, HD, NT, BF16>(sK + buf * BC * SROW, kg + (int64_t)k0 * p.ks[2], p.ks[2], p.ks[3], n, p.D,
                                    p.vec_k, tid);
        load_tile<BC, HD, NT, BF16>(sV + buf * BC * SROW, vg + (int64_t)k0 * p.vs[2], p.vs[2], p.vs[3], n, p.Dv,
                                    p.vec_v, tid);
    };
    if (ntiles > 0) {
        load_tile<BR, HD, NT, BF16>(sQ, qg, p.qs[2], p.qs[3], m, p.D, p.vec_q, tid);
        load_kv(kt0, 0);
        cp_async_commit();
        if (ntiles > 1) {
            load_kv(kt0 + 1, 1);
            cp_async_commit();
        }
    }

    /* this thread's rows: rowbase + mt*16 + g + 8*hr */
    const int rowbase = r0 + warp * MT * 16;
    const float slope = GEN && p.has_alibi ? p.slopes[h] : 0.f;

    float acc[MT][NDT][4];
    float row_m[MT][2], row_l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < NDT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][dt][e] = 0.f;
        row_m[mt][0] = row_m[mt][1] = -INFINITY;
        row_l[mt][0] = row_l[mt][1] = 0.f;
    }

    const uint32_t sQa = smem_addr(sQ);
    for (int t = 0; t < ntiles; t++) {
        if (t + 1 < ntiles) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        const int buf = t & 1, k0 = (kt0 + t) * BC;
        const uint32_t sKa = smem_addr(sK + buf * BC * SROW), sVa = smem_addr(sV + buf * BC * SROW);

        /* S = Q K^T */
        float s[MT][NKT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldsm_x4(a[mt], sQa + (uint32_t)((warp * MT * 16 + mt * 16 + (lane & 15)) * SROW + kk * 16 +
                                                (lane >> 4) * 8) * 2u);
#pragma unroll
            for (int nb = 0; nb < BC / 16; nb++) {
                uint32_t bb[4];
                ldsm_x4(bb, sKa + (uint32_t)((nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * SROW + kk * 16 +
                                             ((lane >> 3) & 1) * 8) * 2u);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<BF16>(s[mt][2 * nb], a[mt], bb[0], bb[1]);
                    mma16816<BF16>(s[mt][2 * nb + 1], a[mt], bb[2], bb[3]);
                }
            }
        }

        /* scores, base 2 */
        if (!GEN) {
            if (dev_tile_full(p, r0, r0 + m, k0, BC)) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] *= p.scale_log2;
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        int lo, hi;
                        dev_row_bounds(p, rowbase + mt * 16 + g + 8 * hr, &lo, &hi);
                        lo -= k0 + tg * 2;
                        hi -= k0 + tg * 2;
#pragma unroll
                        for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int j = nt * 8 + e; /* key - k0 - 2*tg */
                                float &x = s[mt][nt][2 * hr + e];
                                x = (j >= lo && j <= hi) ? x * p.scale_log2 : -INFINITY;
                            }
                    }
            }
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int64_t i = rowbase + mt * 16 + g + 8 * hr;
                    int lo, hi;
                    dev_row_bounds(p, i, &lo, &hi);
                    const int32_t qseg = (p.has_seg && i < p.Sq) ? p.q_seg[(int64_t)b * p.Sq + i] : 0;
#pragma unroll
                    for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int j = k0 + nt * 8 + tg * 2 + e;
                            float th;
                            s[mt][nt][2 * hr + e] =
                                score_one(p, s[mt][nt][2 * hr + e], b, h, i, j, lo, hi, qseg, slope, &th);
                        }
                }
        }

        /* online softmax: one rescale exp per row */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NKT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(row_m[mt][hr], mx);
                const float muse = mnew == -INFINITY ? 0.f : mnew;
                const float alpha = fast_exp2(row_m[mt][hr] - muse);
                row_m[mt][hr] = mnew;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float pv = fast_exp2(s[mt][nt][2 * hr + e] - muse);
                        s[mt][nt][2 * hr + e] = pv;
                        sum += pv;
                    }
                row_l[mt][hr] = row_l[mt][hr] * alpha + sum;
#pragma unroll
                for (int dt = 0; dt < NDT; dt++) {
                    acc[mt][dt][2 * hr] *= alpha;
                    acc[mt][dt][2 * hr + 1] *= alpha;
                }
            }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int nb = 0; nb < HD / 16; nb++) {
                uint32_t bb[4];
                ldsm_x4_t(bb, sVa + (uint32_t)((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SROW + nb * 16 +
                                               (lane >> 4) * 8) * 2u);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<BF16>(acc[mt][2 * nb], a[mt], bb[0], bb[1]);
                    mma16816<BF16>(acc[mt][2 * nb + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
        if (t + 2 < ntiles) {
            load_kv(kt0 + t + 2, buf);
            cp_async_commit();
        }
    }

    /* normalise, lse, stage O in sQ, store */
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float l = row_l[mt][hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            /* l = 0: no visible key (o = 0, lse = -inf); l NaN: NaN or +inf among the
             * visible scores (o = NaN, lse = NaN; docs/nonfinite.md) */
            const float inv = l > 0.f ? 1.f / l : l == 0.f ? 0.f : __int_as_float(0x7fffffff);
            const int lrow = warp * MT * 16 + mt * 16 + g + 8 * hr;
            const int64_t i = (int64_t)r0 + lrow;
            if (p.lse && tg == 0 && i < p.Sq)
                p.lse[((int64_t)b * p.Hq + h) * p.Sq + i] =
                    l > 0.f ? row_m[mt][hr] * FA_LN2 + logf(l) : l == 0.f ? -INFINITY : __int_as_float(0x7fffffff);
#pragma unroll
            for (int dt = 0; dt < NDT; dt++)
                *reinterpret_cast<uint32_t *>(sQ + lrow * SROW + dt * 8 + tg * 2) =
                    pack2<BF16>(acc[mt][dt][2 * hr] * inv, acc[mt][dt][2 * hr + 1] * inv);
        }
    __syncthreads();
    uint16_t *og = (uint16_t *)p.o + b * p.os[0] + h * p.os[1] + (int64_t)r0 * p.os[2];
    store_tile<BR, HD, NT>(sQ, og, p.os[2], p.os[3], m, p.Dv, p.vec_o, tid);

    if (p.counts && tid == 0) {
        const unsigned long long mm = (unsigned long long)m;
        unsigned long long nk = 0;
        if (ntiles > 0) nk = (unsigned long long)(min(kt1 * BC, p.Sk) - kt0 * BC);
        const unsigned long long mn = mm * nk;
        atomicAdd(&p.counts[0], 2ull * mn * (unsigned long long)(p.D + p.Dv));
        atomicAdd(&p.counts[1], mn * (p.softcap > 0.f ? 2ull : 1ull) + mm * (unsigned long long)ntiles + mm);
    }
}

template <int HD, int NW, int MT, int BC, bool BF16, bool GEN>
cudaError_t launch_fwd(const fa_cuda_params &p, cudaStream_t st) {
    constexpr int BR = NW * MT * 16;
    if (BR != FA_CUDA_FWD_BQ || BC != fa_cuda_fwd_bk(HD)) return cudaErrorInvalidConfiguration; /* plan != kernel */
    const size_t smem = (size_t)(BR + 4 * BC) * (HD + 8) * 2;
    cudaError_t e = cudaFuncSetAttribute(fwd_kernel<HD, NW, MT, BC, BF16, GEN>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)((p.Sq + BR - 1) / BR), (unsigned)p.Hq, (unsigned)p.B);
    fwd_kernel<HD, NW, MT, BC, BF16, GEN><<<grid, NW * 32, smem, st>>>(p);
    return cudaGetLastError();
}

template <int HD, int NW, int MT, int BC, bool BF16>
cudaError_t launch_fwd_gen(const fa_cuda_params &p, cudaStream_t st) {
    if (p.has_mods || p.has_seg) return launch_fwd<HD, NW, MT, BC, BF16, true>(p, st);
    return launch_fwd<HD, NW, MT, BC, BF16, false>(p, st);
}

/* head-dim class -> warps, 16-row tiles per warp, keys per tile (cuda_config.h) */
template <bool BF16> cudaError_t launch_fwd_dtype(const fa_cuda_params &p, int hd, cudaStream_t st) {
    switch (hd) {
    case 32: return launch_fwd_gen<32, 4, 2, 64, BF16>(p, st);
    case 64: return launch_fwd_gen<64, 4, 2, 64, BF16>(p, st);
    case 96: return launch_fwd_gen<96, 4, 2, 64, BF16>(p, st);
    case 128: return launch_fwd_gen<128, 4, 2, 64, BF16>(p, st);
    case 192: return launch_fwd_gen<192, 8, 1, 64, BF16>(p, st);
    case 256: return launch_fwd_gen<256, 8, 1, 64, BF16>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

#endif
