/* The Hopper (sm_90a) forward, FlashAttention-3's structure without its later refinements:
 * warp specialization in one CTA of 3 warpgroups per 128-row query tile.
 *   warpgroup 0, the producer: gives back registers (setmaxnreg.dec) and one thread
 *     issues the TMA copies: the Q tile once, then the K and V tiles of
 *     fa_sched_key_tiles (schedule.h) into a ring of ST shared-memory stages, each stage
 *     guarded by a "full" mbarrier (TMA bytes arrived) and an "empty" one (both consumers done);
 *   warpgroups 1 and 2, the consumers (64 query rows each): take the registers
 *     (setmaxnreg.inc), and per key tile S = Q K^T (wgmma, A and B from shared memory),
 *     the scores and online softmax of the mma.sync kernel (cuda_forward.cuh, the same
 *     dev_tile_full / dev_row_bounds masks), O += P V (wgmma, P from registers, V
 *     MN-major from shared memory), then release the stage; the softmax of tile t runs
 *     while the tensor cores do P_{t-1} V_{t-1} (intra-warpgroup overlap, see the loop).
 * Ping-pong ordering of the two consumers' products (named barriers) is a run-time
 * opt-in (FA_CUDA_HOPPER_PINGPONG=1) so that one device run can time both.
 *
 * Scope, checked by the launcher (fa_cuda_hopper_fwd_eligible): head dim class 64, 128
 * or 256 with D == Dv == the class, unit column strides with 16-byte rows (TMA); other
 * problems run the mma.sync kernel. Softcap, bias, ALiBi and segment ids take a GEN
 * instantiation that scores each element with score_one, as fwd_kernel's GEN does. Tiles are
 * the plan's (FA_CUDA_FWD_BQ x fa_cuda_fwd_bk = 128 x 64), so counts equal the plan's:
 * per CTA the same formula as fwd_kernel. Selected only with FA_CUDA_KERNEL=hopper on a
 * compute capability 9.0 device (cuda_hopper_dispatch.cu): unverified on a device. The GEN
 * instantiations spill a few bytes at D 128/256 (score_one's tanhf and bias reads). */
#ifndef FA_CUDA_HOPPER_FWD_CUH
#define FA_CUDA_HOPPER_FWD_CUH

#include "cuda_hopper.h"
#include "cuda_hopper_ptx.cuh"
#include "cuda_hopper_wgmma.cuh"

namespace {

/* One configuration: tile sizes, stages, shared-memory layout (byte offsets from a
 * 1024-aligned base; every tile a whole number of 1024-byte swizzle atoms). A "box" is
 * the TMA unit: rows x 64 columns (128 bytes per row, swizzled). */
template <int HD_, bool BF16_, bool GEN_> struct hopper_fwd_traits {
    static constexpr int HD = HD_, BQ = 128, BK = 64, NBOX = HD / 64;
    static constexpr bool BF16 = BF16_;
    static constexpr bool GEN = GEN_; /* softcap, bias, ALiBi or segment ids: score_one per element */
    static constexpr int ST = HD == 256 ? 2 : 4;            /* K/V ring depth */
    static constexpr int THREADS = 384;                      /* producer + 2 consumers */
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
    static constexpr int Q_BOX = BQ * 128, KV_BOX = BK * 128; /* bytes per box */
    static constexpr int Q_BYTES = NBOX * Q_BOX, KV_BYTES = NBOX * KV_BOX;
    static constexpr int OFF_Q = 0, OFF_K = Q_BYTES, OFF_V = OFF_K + ST * KV_BYTES;
    static constexpr int SMEM = OFF_V + ST * KV_BYTES + 1024; /* + alignment slack */
    static_assert(SMEM <= 227 * 1024, "shared memory per block");
    static_assert(HD % 64 == 0, "boxes of 64 columns");
};

template <class T>
__global__ void __launch_bounds__(T::THREADS, 1)
    hopper_fwd_kernel(const __grid_constant__ fa_cuda_params p, const __grid_constant__ CUtensorMap tmq,
                      const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                      int pingpong) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int HD = T::HD, BQ = T::BQ, BK = T::BK, ST = T::ST, NBOX = T::NBOX;
    constexpr bool BF16 = T::BF16, GEN = T::GEN;
    extern __shared__ __align__(1024) uint8_t hsmem[];
    __shared__ __align__(8) uint64_t bars[2 * ST + 1]; /* full[ST], empty[ST], q */
    const uint32_t base = (smem_addr(hsmem) + 1023u) & ~1023u;
    const uint32_t sQ = base + T::OFF_Q, sK = base + T::OFF_K, sV = base + T::OFF_V;
    const uint32_t full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[ST]), qbar = smem_addr(&bars[2 * ST]);

    const int tid = threadIdx.x, wg = tid >> 7;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
    const int r0 = blockIdx.x * BQ, m = min(BQ, p.Sq - r0);
    int kt0, kt1;
    dev_key_tile_range(p, r0, r0 + m, BK, &kt0, &kt1);
    const int ntiles = kt1 - kt0;

    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, 1);  /* the producer's arrive_expect_tx */
            mbar_init(empty0 + 8 * s, 8); /* lane 0 of each consumer warp */
        }
        mbar_init(qbar, 1);
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        regs_release<T::PRODUCER_REGS>();
        if (tid == 0 && ntiles > 0) {
            tma_prefetch_map(&tmq);
            tma_prefetch_map(&tmk);
            tma_prefetch_map(&tmv);
            mbar_arrive_expect_tx(qbar, T::Q_BYTES);
            for (int x = 0; x < NBOX; x++) tma_load_4d(sQ + x * T::Q_BOX, &tmq, qbar, x * 64, r0, h, b);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST, k0 = (kt0 + t) * BK;
                if (t >= ST) mbar_wait(empty0 + 8 * s, ((t / ST) + 1) & 1);
                mbar_arrive_expect_tx(full0 + 8 * s, 2 * T::KV_BYTES);
                for (int x = 0; x < NBOX; x++) {
                    tma_load_4d(sK + s * T::KV_BYTES + x * T::KV_BOX, &tmk, full0 + 8 * s, x * 64, k0, hk, b);
                    tma_load_4d(sV + s * T::KV_BYTES + x * T::KV_BOX, &tmv, full0 + 8 * s, x * 64, k0, hk, b);
                }
            }
        }
        return;
    }

    /* ---- consumers ---- */
    regs_claim<T::CONSUMER_REGS>();
    const int cw = wg - 1, tw = tid - 128 * wg, warp = tw >> 5, lane = tw & 31, g = lane >> 2, tg = lane & 3;
    const int rowbase = r0 + 64 * cw + 16 * warp; /* this thread's rows: rowbase + g + 8 * hr */

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
    const float slope = GEN && p.has_alibi ? p.slopes[h] : 0.f;

    /* Software pipeline inside the warpgroup: iteration t issues S_t = Q K_t^T and then
     * O += P_{t-1} V_{t-1}, waits for S_t only (wait_group 1: groups complete in order),
     * and computes the softmax of S_t while the tensor cores still run P_{t-1} V_{t-1};
     * only the rescale of O waits for that product. P lives in pa (16 registers), so
     * the S accumulators are free for the next tile. */
    float sc[32];
    uint32_t pa[4][4];
    auto issue_s = [&](int s) {
        const uint32_t kst = sK + s * T::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t qa = sQ + (kk / 4) * T::Q_BOX + 64 * cw * 128 + (kk % 4) * 32;
            const uint32_t ka = kst + (kk / 4) * T::KV_BOX + (kk % 4) * 32;
            wgmma_ss_n64<BF16>(sc, wgmma_desc(qa, 16, 1024), wgmma_desc(ka, 16, 1024), kk > 0);
        }
        wgmma_commit();
    };
    /* V stage s as the MN-major B operand: 16 keys (2 KB) per step, 64-column boxes 8 KB apart */
    auto issue_pv = [&](int s) {
        const uint32_t vst = sV + s * T::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t dv = wgmma_desc(vst + kk * 16 * 128, T::KV_BOX, 1024);
            if constexpr (HD == 64) wgmma_rs_n64<BF16>(o, pa[kk], dv, 1);
            else if constexpr (HD == 128) wgmma_rs_n128<BF16>(o, pa[kk], dv, 1);
            else wgmma_rs_n256<BF16>(o, pa[kk], dv, 1);
        }
        wgmma_commit();
    };
    /* scores (base 2, the mma.sync kernel's non-general path), then the online softmax of
     * S_t in place: row maxima, exps, row sums; alpha[hr] rescales O afterwards */
    auto softmax = [&](int k0, float (&alpha)[2]) {
        if constexpr (GEN) { /* the mma.sync kernel's general path: score_one (cuda_common.cuh) */
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int64_t i = rowbase + g + 8 * hr;
                int lo, hi;
                dev_row_bounds(p, i, &lo, &hi);
                const int32_t qseg = (p.has_seg && i < p.Sq) ? p.q_seg[(int64_t)b * p.Sq + i] : 0;
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float th;
                        float &x = sc[4 * nt + 2 * hr + e];
                        x = score_one(p, x, b, h, i, k0 + nt * 8 + tg * 2 + e, lo, hi, qseg, slope, &th);
                    }
            }
        } else if (dev_tile_full(p, r0, r0 + m, k0, BK)) {
#pragma unroll
            for (int i = 0; i < 32; i++) sc[i] *= p.scale_log2;
        } else {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                int lo, hi;
                dev_row_bounds(p, rowbase + g + 8 * hr, &lo, &hi);
                lo -= k0 + tg * 2;
                hi -= k0 + tg * 2;
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int j = nt * 8 + e; /* key - k0 - 2*tg */
                        float &x = sc[4 * nt + 2 * hr + e];
                        x = (j >= lo && j <= hi) ? x * p.scale_log2 : -INFINITY;
                    }
            }
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) { /* one rescale exp per row */
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) mx = fmaxf(mx, fmaxf(sc[4 * nt + 2 * hr], sc[4 * nt + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(row_m[hr], mx);
            const float muse = mnew == -INFINITY ? 0.f : mnew;
            alpha[hr] = fast_exp2(row_m[hr] - muse);
            row_m[hr] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pv = fast_exp2(sc[4 * nt + 2 * hr + e] - muse);
                    sc[4 * nt + 2 * hr + e] = pv;
                    sum += pv;
                }
            row_l[hr] = row_l[hr] * alpha[hr] + sum;
        }
    };
    auto rescale_and_pack = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[4 * dt + e] *= alpha[e >> 1];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++) pa[kk][r] = pack2<BF16>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
    };

    /* Ping-pong (run-time opt-in, FA_CUDA_HOPPER_PINGPONG=1): the two consumers take turns
     * to issue their products, on named barriers 1 (consumer 0's turn) and 2 (consumer
     * 1's), so one's softmax runs while the other's products occupy the tensor cores.
     * Each issue waits for its turn (bar.sync, 256 = its 128 threads + the other's 128
     * arrivals) and then hands the turn over (bar.arrive); consumer 1 opens with one
     * hand-over so consumer 0 goes first, and skips its last one, so every barrier
     * completes as often as it is waited on. Both consumers issue ntiles + 1 times. */
    const int events = ntiles + 1;
    int event = 0;
    auto turn_begin = [&]() {
        if (pingpong) named_bar_sync(1 + cw, 256);
    };
    auto turn_end = [&]() {
        if (pingpong && !(cw == 1 && event == events - 1)) named_bar_arrive(2 - cw, 256);
        event++;
    };
    if (pingpong && ntiles > 0 && cw == 1) named_bar_arrive(1, 256);

    if (ntiles > 0) {
        mbar_wait(qbar, 0);
        mbar_wait(full0, 0);
        turn_begin();
        wgmma_fence();
        issue_s(0);
        turn_end();
        wgmma_wait<0>();
        reg_fence(sc);
        float alpha[2];
        softmax(kt0 * BK, alpha);
        rescale_and_pack(alpha);
    }
    for (int t = 1; t < ntiles; t++) {
        const int s = t % ST, sp = (t - 1) % ST;
        mbar_wait(full0 + 8 * s, (t / ST) & 1);
        reg_fence(o);
        turn_begin();
        wgmma_fence();
        issue_s(s);
        issue_pv(sp);
        turn_end();
        wgmma_wait<1>();
        reg_fence(sc);
        float alpha[2];
        softmax((kt0 + t) * BK, alpha);
        wgmma_wait<0>();
        reg_fence(o);
        if (lane == 0) mbar_arrive(empty0 + 8 * sp); /* K and V of tile t - 1 read */
        rescale_and_pack(alpha);
    }
    if (ntiles > 0) {
        const int sp = (ntiles - 1) % ST;
        reg_fence(o);
        turn_begin();
        wgmma_fence();
        issue_pv(sp);
        turn_end();
        wgmma_wait<0>();
        reg_fence(o);
        if (lane == 0) mbar_arrive(empty0 + 8 * sp);
    }

    /* normalise, lse, store (4-byte pairs straight from the accumulators) */
    uint16_t *og = (uint16_t *)p.o + b * p.os[0] + h * p.os[1];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = row_l[hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int64_t i = rowbase + g + 8 * hr;
        if (i >= p.Sq) continue;
        if (p.lse && tg == 0)
            p.lse[((int64_t)b * p.Hq + h) * p.Sq + i] = l > 0.f ? row_m[hr] * FA_LN2 + logf(l) : -INFINITY;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *reinterpret_cast<uint32_t *>(og + i * p.os[2] + dt * 8 + tg * 2) =
                pack2<BF16>(o[4 * dt + 2 * hr] * inv, o[4 * dt + 2 * hr + 1] * inv);
    }

    if (p.counts && tid == 128) {
        const unsigned long long mm = (unsigned long long)m;
        unsigned long long nk = 0;
        if (ntiles > 0) nk = (unsigned long long)(min(kt1 * BK, p.Sk) - kt0 * BK);
        const unsigned long long mn = mm * nk;
        atomicAdd(&p.counts[0], 2ull * mn * (unsigned long long)(p.D + p.Dv));
        atomicAdd(&p.counts[1], mn * (p.softcap > 0.f ? 2ull : 1ull) + mm * (unsigned long long)ntiles + mm);
    }
#else
    (void)p, (void)tmq, (void)tmk, (void)tmv, (void)pingpong; /* no sm_90a code in this pass: the launcher never runs it */
#endif
}

template <int HD, bool BF16, bool GEN> cudaError_t launch_hopper_fwd_hd(const fa_cuda_params &p, cudaStream_t st) {
    using T = hopper_fwd_traits<HD, BF16, GEN>;
    static_assert(T::BQ == FA_CUDA_FWD_BQ, "the plan's query tile");
    if (T::BK != fa_cuda_fwd_bk(HD)) return cudaErrorInvalidConfiguration; /* plan != kernel */
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, hopper_fwd_kernel<T>);
    if (e != cudaSuccess) return e;
    /* sm_90a machine code (FA_CUDA_SM90A: 90a is among FA_CUDA_ARCHS, cmake/cuda.cmake), not
     * the empty body the driver would JIT-compile from another target's PTX */
#ifndef FA_CUDA_SM90A
    return cudaErrorNotSupported;
#endif
    if (fa.binaryVersion != 90) return cudaErrorNoKernelImageForDevice;
    CUtensorMap mq, mk, mv;
    if ((e = fa_cuda_tmap_bhsd(&mq, p.q, BF16, p.D, p.Sq, p.Hq, p.B, p.qs, 64, T::BQ)) != cudaSuccess) return e;
    if ((e = fa_cuda_tmap_bhsd(&mk, p.k, BF16, p.D, p.Sk, p.Hk, p.B, p.ks, 64, T::BK)) != cudaSuccess) return e;
    if ((e = fa_cuda_tmap_bhsd(&mv, p.v, BF16, p.Dv, p.Sk, p.Hk, p.B, p.vs, 64, T::BK)) != cudaSuccess) return e;
    e = cudaFuncSetAttribute(hopper_fwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::SMEM);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)((p.Sq + T::BQ - 1) / T::BQ), (unsigned)p.Hq, (unsigned)p.B);
    hopper_fwd_kernel<T><<<grid, T::THREADS, T::SMEM, st>>>(p, mq, mk, mv, fa_cuda_hopper_pingpong());
    e = cudaGetLastError();
    if (e == cudaSuccess) fa_cuda_hopper_note_launch();
    return e;
}

/* The Hopper forward for this dtype, or cudaErrorNotSupported when its scope excludes p. */
template <bool BF16> cudaError_t launch_hopper_fwd(const fa_cuda_params &p, int hd, cudaStream_t st) {
    if (!fa_cuda_hopper_fwd_eligible(&p, hd)) return cudaErrorNotSupported;
    const bool gen = p.has_mods || p.has_seg;
    switch (hd) {
    case 64: return gen ? launch_hopper_fwd_hd<64, BF16, true>(p, st) : launch_hopper_fwd_hd<64, BF16, false>(p, st);
    case 128: return gen ? launch_hopper_fwd_hd<128, BF16, true>(p, st) : launch_hopper_fwd_hd<128, BF16, false>(p, st);
    case 256: return gen ? launch_hopper_fwd_hd<256, BF16, true>(p, st) : launch_hopper_fwd_hd<256, BF16, false>(p, st);
    default: return cudaErrorNotSupported;
    }
}

} // namespace

#endif /* FA_CUDA_HOPPER_FWD_CUH */
