/* The backward's dK, dV pass (cuda_backward.cuh has the overview and the launch). */
#ifndef FA_CUDA_BWD_DKDV_CUH
#define FA_CUDA_BWD_DKDV_CUH
#include "cuda_bwd_common.cuh"

namespace {

/* ---- dK, dV -------------------------------------------------------------------------- *
 * Warps form key groups of 16*MTK keys; the CS warps of a group split the queries of the S
 * phase and the head dim of dK/dV. With CS = 1 P^T and dS^T go from the accumulators
 * straight into the next products; with CS > 1 the group exchanges them through shared
 * memory (a named barrier per group), so each warp's dV/dK tile is 16*MTK keys x HD/CS:
 * twice the reuse of every ldmatrix of dO and Q for MTK = 2. */
template <int HD, int NW, int CS, int MTK, int SUBQ, bool BF16, bool GEN>
__global__ void __launch_bounds__(NW * 32, 1) dkdv_kernel(const fa_cuda_params p) {
    constexpr int NT = NW * 32, BR = BWD_BR, KG = 16 * MTK, BC = KG * NW / CS, SROW = HD + 8;
    constexpr int QW = SUBQ / CS;   /* queries per warp in the S phase */
    constexpr int NQT = QW / 8;     /* their n8 tiles */
    constexpr int HDW = HD / CS;    /* dK/dV columns per warp */
    constexpr int NDW = HDW / 8;
    constexpr int PROW = SUBQ + 8;  /* pitch of the P^T / dS^T exchange (CS > 1) */
    static_assert(QW % 16 == 0 && HDW % 16 == 0 && BR % SUBQ == 0, "bad dk/dv tiling");
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sK = smem, *sV = sK + BC * SROW, *sQ = sV + BC * SROW, *sO = sQ + 2 * BR * SROW;
    float *sL = reinterpret_cast<float *>(sO + 2 * BR * SROW), *sD = sL + 2 * BR;
    uint16_t *sP = reinterpret_cast<uint16_t *>(sD + 2 * BR), *sS = sP + BC * PROW;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int kg = warp / CS, cw = warp % CS;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int kt = blockIdx.x, k0 = kt * BC, n = min(BC, p.Sk - k0);

    /* query tiles whose range holds this key tile: contiguous (both ends grow with i), schedule.h */
    int qlo, qend;
    dev_query_tile_range(p, BR, BC, kt, &qlo, &qend);
    const int qhi = qend - 1;
    const int nq = qhi >= qlo ? qhi - qlo + 1 : 0, total = p.G * nq;

    const uint16_t *kgp = (const uint16_t *)p.k + b * p.ks[0] + hk * p.ks[1] + (int64_t)k0 * p.ks[2];
    const uint16_t *vgp = (const uint16_t *)p.v + b * p.vs[0] + hk * p.vs[1] + (int64_t)k0 * p.vs[2];
    load_tile<BC, HD, NT, BF16>(sK, kgp, p.ks[2], p.ks[3], n, p.D, p.vec_k, tid);
    load_tile<BC, HD, NT, BF16>(sV, vgp, p.vs[2], p.vs[3], n, p.Dv, p.vec_v, tid);

    auto load_item = [&](int it, int buf) {
        const int hq = hk * p.G + it / nq, q0 = (qlo + it % nq) * BR, m = min(BR, p.Sq - q0);
        const uint16_t *qgp = (const uint16_t *)p.q + b * p.qs[0] + hq * p.qs[1] + (int64_t)q0 * p.qs[2];
        const uint16_t *ogp = (const uint16_t *)p.d_o + b * p.os[0] + hq * p.os[1] + (int64_t)q0 * p.os[2];
        load_tile<BR, HD, NT, BF16>(sQ + buf * BR * SROW, qgp, p.qs[2], p.qs[3], m, p.D, p.vec_q, tid);
        load_tile<BR, HD, NT, BF16>(sO + buf * BR * SROW, ogp, p.os[2], p.os[3], m, p.Dv, p.vec_o, tid);
        const int64_t rowoff = ((int64_t)b * p.Hq + hq) * p.Sq + q0;
        for (int r = tid; r < BR; r += NT) {
            const bool ok = r < m;
            cp_async4(smem_addr(sL + buf * BR + r), ok ? p.lse_in + rowoff + r : p.lse_in, ok ? 4 : 0);
            cp_async4(smem_addr(sD + buf * BR + r), ok ? p.delta + rowoff + r : p.delta, ok ? 4 : 0);
        }
    };
    if (total > 0) load_item(0, 0);
    cp_async_commit();
    if (total > 1) {
        load_item(1, 1);
        cp_async_commit();
    }

    float dk[MTK][NDW][4], dv[MTK][NDW][4];
#pragma unroll
    for (int mt = 0; mt < MTK; mt++)
#pragma unroll
        for (int d = 0; d < NDW; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mt][d][e] = dv[mt][d][e] = 0.f;

    /* this thread's keys: k0 + kg*KG + mt*16 + g + 8*hr */
    const int jrow = k0 + kg * KG + g;
    const uint32_t sKa = smem_addr(sK), sVa = smem_addr(sV);
    for (int it = 0; it < total; it++) {
        if (it + 1 < total) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        const int buf = it & 1;
        const int hq = hk * p.G + it / nq, q0 = (qlo + it % nq) * BR, m = min(BR, p.Sq - q0);
        const bool full = !GEN && dev_tile_full(p, q0, q0 + m, k0, BC);
        const float slope = GEN && p.has_alibi ? p.slopes[hq] : 0.f;
        const uint32_t sQa = smem_addr(sQ + buf * BR * SROW), sOa = smem_addr(sO + buf * BR * SROW);
        const float *lrow = sL + buf * BR, *drow = sD + buf * BR;

#pragma unroll 1
        for (int sq = 0; sq < BR / SUBQ; sq++) {
            const int qb = sq * SUBQ + cw * QW; /* first local query of this warp */
            float st[MTK][NQT][4], dp[MTK][NQT][4];
#pragma unroll
            for (int mt = 0; mt < MTK; mt++)
#pragma unroll
                for (int nt = 0; nt < NQT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) st[mt][nt][e] = dp[mt][nt][e] = 0.f;
            /* S^T = K Q^T, dP^T = V dO^T */
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ak[MTK][4], av[MTK][4];
#pragma unroll
                for (int mt = 0; mt < MTK; mt++) {
                    const uint32_t aoff =
                        (uint32_t)((kg * KG + mt * 16 + (lane & 15)) * SROW + kk * 16 + (lane >> 4) * 8) * 2u;
                    ldsm_x4(ak[mt], sKa + aoff);
                    ldsm_x4(av[mt], sVa + aoff);
                }
#pragma unroll
                for (int nb = 0; nb < QW / 16; nb++) {
                    const uint32_t boff = (uint32_t)((qb + nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * SROW +
                                                     kk * 16 + ((lane >> 3) & 1) * 8) * 2u;
                    uint32_t bq[4], bo[4];
                    ldsm_x4(bq, sQa + boff);
                    ldsm_x4(bo, sOa + boff);
#pragma unroll
                    for (int mt = 0; mt < MTK; mt++) {
                        mma16816<BF16>(st[mt][2 * nb], ak[mt], bq[0], bq[1]);
                        mma16816<BF16>(st[mt][2 * nb + 1], ak[mt], bq[2], bq[3]);
                        mma16816<BF16>(dp[mt][2 * nb], av[mt], bo[0], bo[1]);
                        mma16816<BF16>(dp[mt][2 * nb + 1], av[mt], bo[2], bo[3]);
                    }
                }
            }
            /* P^T and dS^T: rows are keys, columns queries */
            if (full) {
#pragma unroll
                for (int nt = 0; nt < NQT; nt++) {
                    const int iq = qb + nt * 8 + tg * 2;
                    const float2 l2 = *reinterpret_cast<const float2 *>(lrow + iq);
                    const float2 d2 = *reinterpret_cast<const float2 *>(drow + iq);
                    const float lse2[2] = {lse_log2(l2.x), lse_log2(l2.y)}, del[2] = {d2.x, d2.y};
#pragma unroll
                    for (int mt = 0; mt < MTK; mt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float pv = fast_exp2(st[mt][nt][e] * p.scale_log2 - lse2[e & 1]);
                            dp[mt][nt][e] = pv * (dp[mt][nt][e] - del[e & 1]);
                            st[mt][nt][e] = pv;
                        }
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < NQT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int iq = qb + nt * 8 + tg * 2 + c;
                        const int64_t i = (int64_t)q0 + iq;
                        int lo, hi;
                        dev_row_bounds(p, i, &lo, &hi);
                        const int32_t qseg = (GEN && p.has_seg && i < p.Sq) ? p.q_seg[(int64_t)b * p.Sq + i] : 0;
                        const float lse2 = lse_log2(lrow[iq]), del = drow[iq];
#pragma unroll
                        for (int mt = 0; mt < MTK; mt++)
#pragma unroll
                            for (int hr = 0; hr < 2; hr++) {
                                const int e = 2 * hr + c, j = jrow + mt * 16 + 8 * hr;
                                float ds;
                                st[mt][nt][e] = grad_one<GEN>(p, false, st[mt][nt][e], dp[mt][nt][e], lse2, del, b,
                                                              hq, i, j, lo, hi, qseg, slope, &ds);
                                dp[mt][nt][e] = ds;
                            }
                    }
            }
            if (CS == 1) {
                /* dV += P^T dO, dK += dS^T Q with A straight from the accumulators */
#pragma unroll
                for (int kq = 0; kq < QW / 16; kq++) {
                    uint32_t ap[MTK][4], as[MTK][4];
#pragma unroll
                    for (int mt = 0; mt < MTK; mt++) {
                        ap[mt][0] = pack2<BF16>(st[mt][2 * kq][0], st[mt][2 * kq][1]);
                        ap[mt][1] = pack2<BF16>(st[mt][2 * kq][2], st[mt][2 * kq][3]);
                        ap[mt][2] = pack2<BF16>(st[mt][2 * kq + 1][0], st[mt][2 * kq + 1][1]);
                        ap[mt][3] = pack2<BF16>(st[mt][2 * kq + 1][2], st[mt][2 * kq + 1][3]);
                        as[mt][0] = pack2<BF16>(dp[mt][2 * kq][0], dp[mt][2 * kq][1]);
                        as[mt][1] = pack2<BF16>(dp[mt][2 * kq][2], dp[mt][2 * kq][3]);
                        as[mt][2] = pack2<BF16>(dp[mt][2 * kq + 1][0], dp[mt][2 * kq + 1][1]);
                        as[mt][3] = pack2<BF16>(dp[mt][2 * kq + 1][2], dp[mt][2 * kq + 1][3]);
                    }
#pragma unroll
                    for (int nb = 0; nb < HD / 16; nb++) {
                        const uint32_t boff = (uint32_t)((qb + kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SROW +
                                                         nb * 16 + (lane >> 4) * 8) * 2u;
                        uint32_t bo[4], bq[4];
                        ldsm_x4_t(bo, sOa + boff);
                        ldsm_x4_t(bq, sQa + boff);
#pragma unroll
                        for (int mt = 0; mt < MTK; mt++) {
                            mma16816<BF16>(dv[mt][2 * nb], ap[mt], bo[0], bo[1]);
                            mma16816<BF16>(dv[mt][2 * nb + 1], ap[mt], bo[2], bo[3]);
                            mma16816<BF16>(dk[mt][2 * nb], as[mt], bq[0], bq[1]);
                            mma16816<BF16>(dk[mt][2 * nb + 1], as[mt], bq[2], bq[3]);
                        }
                    }
                }
            } else {
                /* the CS warps of a key group exchange their query parts through shared memory */
#pragma unroll
                for (int mt = 0; mt < MTK; mt++)
#pragma unroll
                    for (int nt = 0; nt < NQT; nt++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const int off = (kg * KG + mt * 16 + g + 8 * hr) * PROW + cw * QW + nt * 8 + tg * 2;
                            *reinterpret_cast<uint32_t *>(sP + off) =
                                pack2<BF16>(st[mt][nt][2 * hr], st[mt][nt][2 * hr + 1]);
                            *reinterpret_cast<uint32_t *>(sS + off) =
                                pack2<BF16>(dp[mt][nt][2 * hr], dp[mt][nt][2 * hr + 1]);
                        }
                bar_sync(1 + kg, CS * 32);
                const uint32_t sPa = smem_addr(sP), sSa = smem_addr(sS);
#pragma unroll
                for (int kq = 0; kq < SUBQ / 16; kq++) {
                    uint32_t ap[MTK][4], as[MTK][4];
#pragma unroll
                    for (int mt = 0; mt < MTK; mt++) {
                        const uint32_t aoff =
                            (uint32_t)((kg * KG + mt * 16 + (lane & 15)) * PROW + kq * 16 + (lane >> 4) * 8) * 2u;
                        ldsm_x4(ap[mt], sPa + aoff);
                        ldsm_x4(as[mt], sSa + aoff);
                    }
#pragma unroll
                    for (int nb = 0; nb < HDW / 16; nb++) {
                        const uint32_t boff =
                            (uint32_t)((sq * SUBQ + kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SROW + cw * HDW +
                                       nb * 16 + (lane >> 4) * 8) * 2u;
                        uint32_t bo[4], bq[4];
                        ldsm_x4_t(bo, sOa + boff);
                        ldsm_x4_t(bq, sQa + boff);
#pragma unroll
                        for (int mt = 0; mt < MTK; mt++) {
                            mma16816<BF16>(dv[mt][2 * nb], ap[mt], bo[0], bo[1]);
                            mma16816<BF16>(dv[mt][2 * nb + 1], ap[mt], bo[2], bo[3]);
                            mma16816<BF16>(dk[mt][2 * nb], as[mt], bq[0], bq[1]);
                            mma16816<BF16>(dk[mt][2 * nb + 1], as[mt], bq[2], bq[3]);
                        }
                    }
                }
                bar_sync(1 + kg, CS * 32);
            }
        }
        __syncthreads();
        if (it + 2 < total) {
            load_item(it + 2, buf);
            cp_async_commit();
        }
    }

    /* stage dK (scaled) in sK and dV in sV, then store */
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MTK; mt++)
#pragma unroll
        for (int d = 0; d < NDW; d++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int off = (kg * KG + mt * 16 + g + 8 * hr) * SROW + cw * HDW + d * 8 + tg * 2;
                *reinterpret_cast<uint32_t *>(sK + off) =
                    pack2<BF16>(dk[mt][d][2 * hr] * p.scale, dk[mt][d][2 * hr + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(sV + off) = pack2<BF16>(dv[mt][d][2 * hr], dv[mt][d][2 * hr + 1]);
            }
    __syncthreads();
    store_tile<BC, HD, NT>(sK, (uint16_t *)p.dk + b * p.ks[0] + hk * p.ks[1] + (int64_t)k0 * p.ks[2], p.ks[2],
                           p.ks[3], n, p.D, p.vec_k, tid);
    store_tile<BC, HD, NT>(sV, (uint16_t *)p.dv + b * p.vs[0] + hk * p.vs[1] + (int64_t)k0 * p.vs[2], p.vs[2],
                           p.vs[3], n, p.Dv, p.vec_v, tid);

    if (p.counts && tid == 0 && nq > 0) {
        unsigned long long rows = 0;
        for (int qt = qlo; qt <= qhi; qt++) rows += (unsigned long long)min(BR, p.Sq - qt * BR);
        const unsigned long long mn = rows * (unsigned long long)p.G * (unsigned long long)n;
        atomicAdd(&p.counts[0], 2ull * mn * (unsigned long long)(2 * p.D + 2 * p.Dv));
        atomicAdd(&p.counts[1], mn * (p.softcap > 0.f ? 2ull : 1ull));
    }
}

} // namespace

#endif
