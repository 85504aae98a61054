/* The Hopper (sm_90a) primitives the warp-specialized forward is built from, as thin PTX
 * wrappers: mbarriers (the producer/consumer handshake), bulk tensor copies (TMA, 4-d
 * tiles described by a CUtensorMap passed as a __grid_constant__ kernel parameter),
 * wgmma shared-memory descriptors, the wgmma fences, and register reallocation.
 *
 * Shared-memory tiles use the 128-byte swizzle on both sides: TMA writes a box whose rows
 * are 64 16-bit elements (128 bytes) with 16-byte chunk c of row r stored at chunk
 * c ^ (r % 8), and the descriptors below tell wgmma the same. Every tile starts on a
 * 1024-byte boundary (one 8-row swizzle atom), so the descriptors' base offset is 0. */
#ifndef FA_CUDA_HOPPER_PTX_CUH
#define FA_CUDA_HOPPER_PTX_CUH

#include <cuda.h> /* CUtensorMap (a type only: nothing here links libcuda) */
#include <stdint.h>

#include "cuda_common.cuh"

/* ---- mbarriers --------------------------------------------------------------------- */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the async proxy (TMA) before first use. */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival that also announces tx bytes the copies issued next will complete. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase with this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}

/* ---- TMA --------------------------------------------------------------------------- */

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
/* The box at coordinates (c0 innermost .. c3) of a 4-d map into shared memory at dst;
 * completion counts its bytes on bar. Elements outside the tensor arrive as zeros. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

/* ---- wgmma ------------------------------------------------------------------------- */

/* Descriptor of a 128-byte-swizzled shared-memory operand at byte address addr:
 * lbo/sbo the leading and stride byte offsets (the PTX ISA's "matrix descriptor").
 *   K-major (rows of K contiguous): sbo = 1024 (8 rows of 128 bytes), lbo unused (1);
 *     the next k16 step inside a 64-element row block is addr + 32.
 *   MN-major (rows of N contiguous, 64 N per 128-byte row): sbo = 1024 (the next 8 rows
 *     of K), lbo = the byte distance to the next 64 columns of N. */
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = 0;
    d |= (uint64_t)((addr & 0x3FFFFu) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32;
    d |= (uint64_t)1 << 62; /* layout type 1: 128-byte swizzle */
    return d;
}
/* Orders this thread's register accesses before the wgmma that follows reads them. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of an accumulator across the asynchronous
 * wgmma that writes it (the register is "used and redefined" here). */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* ---- named barriers (ids 1..15; 0 is __syncthreads) ------------------------------- */

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- register reallocation (per warpgroup; needs a register cap at kernel entry) ---- */

template <int R> __device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

#endif /* FA_CUDA_HOPPER_PTX_CUH */
