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
