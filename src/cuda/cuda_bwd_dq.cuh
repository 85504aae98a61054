/* The backward's dQ pass (cuda_backward.cuh has the overview and the launch). */
#ifndef FA_CUDA_BWD_DQ_CUH
#define FA_CUDA_BWD_DQ_CUH
#include "cuda_bwd_common.cuh"

namespace {

/* ---- dQ ------------------------------------------------------------------------------ *
 * QPC query tiles per CTA; warps form row groups of 16*MT rows, and the KS warps of a
 * group split each key sub-chunk: each keeps a partial dQ over its keys, and the parts
 * are summed in a fixed order (through shared memory) at the end. */
template <int HD, int QPC, int MT, int KS, int BC, int SUBK, bool BF16, bool GEN>
__global__ void __launch_bounds__(QPC * BWD_BR / (16 * MT) * KS * 32, 1) dq_kernel(const fa_cuda_params p) {
    constexpr int BR = BWD_BR, ROWS = QPC * BR, RG = 16 * MT, NW = ROWS / RG * KS, NT = NW * 32;
    constexpr int SROW = HD + 8, KW = SUBK / KS, NKT = KW / 8, NDT = HD / 8;
    static_assert(KW % 16 == 0 && BC % SUBK == 0 && BR % RG == 0, "bad dq tiling");
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sQ = smem, *sO = sQ + ROWS * SROW, *sK = sO + ROWS * SROW, *sV = sK + 2 * BC * SROW;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int rg = warp / KS, kh = warp % KS;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
    const int r0 = blockIdx.x * ROWS, mrows = min(ROWS, p.Sq - r0);

    /* each query tile's key range; the CTA walks their union */
    const int qi = rg * RG / BR;
    int my0 = 0, my1 = 0, u0 = INT32_MAX, u1 = 0;
#pragma unroll
    for (int t = 0; t < QPC; t++) {
        const int q0 = r0 + t * BR;
        int a0 = 0, a1 = 0;
        if (q0 < p.Sq) dev_key_tile_range(p, q0, min(q0 + BR, p.Sq), BC, &a0, &a1);
        if (a1 > a0) {
            u0 = min(u0, a0);
            u1 = max(u1, a1);
        }
        if (t == qi) {
            my0 = a0;
            my1 = a1;
        }
    }
    const int ntiles = u1 > u0 ? u1 - u0 : 0;
    const int q0w = r0 + qi * BR, mq = max(0, min(BR, p.Sq - q0w)); /* this warp's query tile */

    const uint16_t *qgp = (const uint16_t *)p.q + b * p.qs[0] + h * p.qs[1] + (int64_t)r0 * p.qs[2];
    const uint16_t *ogp = (const uint16_t *)p.d_o + b * p.os[0] + h * p.os[1] + (int64_t)r0 * p.os[2];
    const uint16_t *kgp = (const uint16_t *)p.k + b * p.ks[0] + hk * p.ks[1];
    const uint16_t *vgp = (const uint16_t *)p.v + b * p.vs[0] + hk * p.vs[1];
    auto load_kv = [&](int kt, int buf) {
        const int k0 = kt * BC, n = min(BC, p.Sk - k0);
        load_tile<BC, HD, NT, BF16>(sK + buf * BC * SROW, kgp + (int64_t)k0 * p.ks[2], p.ks[2], p.ks[3], n, p.D,
                                    p.vec_k, tid);
        load_tile<BC, HD, NT, BF16>(sV + buf * BC * SROW, vgp + (int64_t)k0 * p.vs[2], p.vs[2], p.vs[3], n, p.Dv,
                                    p.vec_v, tid);
    };
    if (ntiles > 0) {
        load_tile<ROWS, HD, NT, BF16>(sQ, qgp, p.qs[2], p.qs[3], mrows, p.D, p.vec_q, tid);
        load_tile<ROWS, HD, NT, BF16>(sO, ogp, p.os[2], p.os[3], mrows, p.Dv, p.vec_o, tid);
        load_kv(u0, 0);
        cp_async_commit();
        if (ntiles > 1) {
            load_kv(u0 + 1, 1);
            cp_async_commit();
        }
    }

    /* this thread's rows: r0 + rg*RG + mt*16 + g + 8*hr */
    float lse2[MT][2], del[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int64_t i = (int64_t)r0 + rg * RG + mt * 16 + g + 8 * hr;
            const int64_t ri = ((int64_t)b * p.Hq + h) * p.Sq + i;
            lse2[mt][hr] = i < p.Sq ? lse_log2(p.lse_in[ri]) : INFINITY;
            del[mt][hr] = i < p.Sq ? p.delta[ri] : 0.f;
        }
    const float slope = GEN && p.has_alibi ? p.slopes[h] : 0.f;

    float acc[MT][NDT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int d = 0; d < NDT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][d][e] = 0.f;

    const uint32_t sQa = smem_addr(sQ), sOa = smem_addr(sO);
    for (int t = 0; t < ntiles; t++) {
        if (t + 1 < ntiles) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        const int buf = t & 1, kt = u0 + t, k0 = kt * BC;
        if (kt >= my0 && kt < my1) { /* warp-uniform: does this warp's query tile visit kt? */
            const bool full = !GEN && dev_tile_full(p, q0w, q0w + mq, k0, BC);
            const uint32_t sKa = smem_addr(sK + buf * BC * SROW), sVa = smem_addr(sV + buf * BC * SROW);
#pragma unroll 1
            for (int sk = 0; sk < BC / SUBK; sk++) {
                const int kb = sk * SUBK + kh * KW; /* first local key of this warp */
                float s[MT][NKT][4], dp[MT][NKT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] = dp[mt][nt][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    uint32_t aq[MT][4], ao[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t aoff =
                            (uint32_t)((rg * RG + mt * 16 + (lane & 15)) * SROW + kk * 16 + (lane >> 4) * 8) * 2u;
                        ldsm_x4(aq[mt], sQa + aoff);
                        ldsm_x4(ao[mt], sOa + aoff);
                    }
#pragma unroll
                    for (int nb = 0; nb < KW / 16; nb++) {
                        const uint32_t boff = (uint32_t)((kb + nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * SROW +
                                                         kk * 16 + ((lane >> 3) & 1) * 8) * 2u;
                        uint32_t bk[4], bv[4];
                        ldsm_x4(bk, sKa + boff);
                        ldsm_x4(bv, sVa + boff);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16816<BF16>(s[mt][2 * nb], aq[mt], bk[0], bk[1]);
                            mma16816<BF16>(s[mt][2 * nb + 1], aq[mt], bk[2], bk[3]);
                            mma16816<BF16>(dp[mt][2 * nb], ao[mt], bv[0], bv[1]);
                            mma16816<BF16>(dp[mt][2 * nb + 1], ao[mt], bv[2], bv[3]);
                        }
                    }
                }
                if (full) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int hr = e >> 1;
                                const float pv = fast_exp2(s[mt][nt][e] * p.scale_log2 - lse2[mt][hr]);
                                s[mt][nt][e] = pv * (dp[mt][nt][e] - del[mt][hr]);
                            }
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const int64_t i = (int64_t)r0 + rg * RG + mt * 16 + g + 8 * hr;
                            int lo, hi;
                            dev_row_bounds(p, i, &lo, &hi);
                            const int32_t qseg =
                                (GEN && p.has_seg && i < p.Sq) ? p.q_seg[(int64_t)b * p.Sq + i] : 0;
#pragma unroll
                            for (int nt = 0; nt < NKT; nt++)
#pragma unroll
                                for (int c = 0; c < 2; c++) {
                                    const int e = 2 * hr + c, j = k0 + kb + nt * 8 + tg * 2 + c;
                                    float ds;
                                    grad_one<GEN>(p, false, s[mt][nt][e], dp[mt][nt][e], lse2[mt][hr], del[mt][hr], b,
                                                  h, i, j, lo, hi, qseg, slope, &ds);
                                    s[mt][nt][e] = ds;
                                }
                        }
                }
                /* dQ += dS K */
#pragma unroll
                for (int kq = 0; kq < KW / 16; kq++) {
                    uint32_t as[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        as[mt][0] = pack2<BF16>(s[mt][2 * kq][0], s[mt][2 * kq][1]);
                        as[mt][1] = pack2<BF16>(s[mt][2 * kq][2], s[mt][2 * kq][3]);
                        as[mt][2] = pack2<BF16>(s[mt][2 * kq + 1][0], s[mt][2 * kq + 1][1]);
                        as[mt][3] = pack2<BF16>(s[mt][2 * kq + 1][2], s[mt][2 * kq + 1][3]);
                    }
#pragma unroll
                    for (int nb = 0; nb < HD / 16; nb++) {
                        uint32_t bk[4];
                        ldsm_x4_t(bk, sKa + (uint32_t)((kb + kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SROW +
                                                          nb * 16 + (lane >> 4) * 8) * 2u);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16816<BF16>(acc[mt][2 * nb], as[mt], bk[0], bk[1]);
                            mma16816<BF16>(acc[mt][2 * nb + 1], as[mt], bk[2], bk[3]);
                        }
                    }
                }
            }
        }
        __syncthreads();
        if (t + 2 < ntiles) {
            load_kv(u0 + t + 2, buf);
            cp_async_commit();
        }
    }

    cp_async_wait<0>();
    __syncthreads();
    /* sum the KS partial dQ of a row group in a fixed order: part 0 + part 1 + ... (the
     * parts of kh > 0 travel through the K/V buffers, lane-major, conflict-free) */
    if (KS > 1) {
        float *red = reinterpret_cast<float *>(sK);
        constexpr int PER = MT * NDT * 4; /* floats per thread */
        if (kh > 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int d = 0; d < NDT; d++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        red[((size_t)((rg * (KS - 1) + kh - 1) * PER + (mt * NDT + d) * 4 + e)) * 32 + lane] =
                            acc[mt][d][e];
        }
        __syncthreads();
        if (kh == 0) {
#pragma unroll 1
            for (int part = 1; part < KS; part++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int d = 0; d < NDT; d++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mt][d][e] +=
                                red[((size_t)((rg * (KS - 1) + part - 1) * PER + (mt * NDT + d) * 4 + e)) * 32 + lane];
        }
    }
    /* stage dQ (scaled) in sQ, store */
    if (kh == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int d = 0; d < NDT; d++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    *reinterpret_cast<uint32_t *>(sQ + (rg * RG + mt * 16 + g + 8 * hr) * SROW + d * 8 + tg * 2) =
                        pack2<BF16>(acc[mt][d][2 * hr] * p.scale, acc[mt][d][2 * hr + 1] * p.scale);
    }
    __syncthreads();
    store_tile<ROWS, HD, NT>(sQ, (uint16_t *)p.dq + b * p.qs[0] + h * p.qs[1] + (int64_t)r0 * p.qs[2], p.qs[2],
                             p.qs[3], mrows, p.D, p.vec_q, tid);

    if (p.counts && tid == 0) {
        unsigned long long fl = 0, tr = 0;
        for (int t = 0; t < QPC; t++) {
            const int q0 = r0 + t * BR;
            if (q0 >= p.Sq) break;
            const int m = min(BR, p.Sq - q0);
            int a0, a1;
            dev_key_tile_range(p, q0, q0 + m, BC, &a0, &a1);
            if (a1 <= a0) continue;
            const unsigned long long mn = (unsigned long long)m * (unsigned long long)(min(a1 * BC, p.Sk) - a0 * BC);
            fl += 2ull * mn * (unsigned long long)(2 * p.D + p.Dv);
            tr += mn * (p.softcap > 0.f ? 2ull : 1ull);
        }
        atomicAdd(&p.counts[0], fl);
        atomicAdd(&p.counts[1], tr);
    }
}

} // namespace

#endif
