/* What every CUDA kernel of flashattn shares: the launch parameters, the tile schedule on
 * the device (schedule.h's functions, as the host runs them), and thin wrappers
 * of the PTX they are built from (cp.async, ldmatrix, mma.sync m16n8k16 with f32
 * accumulate, ex2.approx).
 *
 * Shared-memory tiles hold rows of HD elements (HD: the head dim padded to a multiple of
 * 16) at a row pitch of HD + 8 elements: the pitch is an odd number of 16-byte chunks, so
 * the 8 row addresses of one ldmatrix phase land in 8 different bank groups.
 *
 * Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
 *   A 16x16: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
 *   B 16x8:  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
 *   C 16x8:  c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
 * so a C fragment pair (columns 16kk..16kk+15) repacked to 16-bit is the A fragment of the
 * next product, without going through shared memory. */
#ifndef FA_CUDA_COMMON_CUH
#define FA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "../schedule.h"

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Everything a kernel needs, by value. Element strides; lse/delta rows are contiguous. */
typedef struct {
    const void *q, *k, *v;   /* inputs */
    const void *o_in, *d_o;  /* backward: saved o and the incoming gradient */
    void *o;                 /* forward output */
    float *lse;              /* forward output, may be NULL */
    const float *lse_in;     /* backward input */
    void *dq, *dk, *dv;      /* backward outputs */
    float *delta;            /* backward workspace: rowsum(dO o), [B, Hq, Sq] */
    const float *bias, *slopes;
    const int32_t *q_seg, *kv_seg;
    unsigned long long *counts; /* [flops, transcendentals] or NULL */

    int64_t qs[4], ks[4], vs[4], os[4], bs[4]; /* q, k, v, o (do, dq as o/q) and bias strides */
    int vec_q, vec_k, vec_v, vec_o;             /* 1: rows are 16-byte aligned and contiguous */
    int B, Hq, Hk, G, Sq, Sk, D, Dv;
    int64_t off, wl, wr;
    int causal;
    float scale, scale_log2, softcap, inv_softcap;
    float bias_scale; /* s += bias_scale * bias */
    int has_bias, has_alibi, has_seg, has_mods; /* has_mods: softcap, bias or alibi */
} fa_cuda_params;

/* ---- the tile schedule (schedule.h, on the device) --------------------------------
 * The kernels' names for schedule.h's functions, with the launch parameters in hand and
 * the int tile indices the kernels use; no arithmetic of their own. */

__device__ __forceinline__ fa_sched dev_sched(const fa_cuda_params &p) {
    fa_sched s = {p.Sq, p.Sk, p.off, p.causal, p.wl, p.wr};
    return s;
}
/* Key tiles [*kt0, *kt1) visited by query rows [r0, r1) with tiles of bk keys. */
__device__ __forceinline__ void dev_key_tile_range(const fa_cuda_params &p, int64_t r0, int64_t r1,
                                                   int64_t bk, int *kt0, int *kt1) {
    const fa_sched s = dev_sched(p);
    int64_t a, b;
    fa_sched_key_tiles(&s, r0, r1, bk, &a, &b);
    *kt0 = (int)a;
    *kt1 = (int)b;
}
/* Query tiles [*qt0, *qt1) of br rows whose key-tile range holds key tile kt. */
__device__ __forceinline__ void dev_query_tile_range(const fa_cuda_params &p, int64_t br, int64_t bk, int64_t kt,
                                                     int *qt0, int *qt1) {
    const fa_sched s = dev_sched(p);
    int64_t a, b;
    fa_sched_query_tiles(&s, br, bk, kt, &a, &b);
    *qt0 = (int)a;
    *qt1 = (int)b;
}
/* Visible keys of row i as a closed interval clipped to [0, Sk - 1] (empty: lo > hi). */
__device__ __forceinline__ void dev_row_bounds(const fa_cuda_params &p, int64_t i, int *lo, int *hi) {
    const fa_sched s = dev_sched(p);
    int64_t l, h;
    fa_sched_span(&s, i, i + 1, &l, &h);
    *lo = (int)l;
    *hi = (int)h;
}
/* Does every (row, key) of rows [r0, r1) x keys [k0, k0 + bk) stay visible and in range? */
__device__ __forceinline__ bool dev_tile_full(const fa_cuda_params &p, int64_t r0, int64_t r1, int64_t k0,
                                              int64_t bk) {
    if (k0 + bk > p.Sk) return false;
    const fa_sched s = dev_sched(p);
    return fa_sched_tile_kind(&s, r0, r1, k0, k0 + bk) == FA_TILE_FULL;
}

/* ---- PTX wrappers ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared; src_bytes 0 writes zeros (the source is not read). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* c += a * b, one m16n8k16 tile, f32 accumulate. */
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Two f32 rounded to nearest-even into one 32-bit word, lo in the low half. */
template <bool BF16> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    }
    return r;
}
template <bool BF16> __device__ __forceinline__ float to_f32(uint16_t x) {
    if (BF16) return __uint_as_float((uint32_t)x << 16);
    return __half2float(__ushort_as_half(x));
}
template <bool BF16> __device__ __forceinline__ uint16_t from_f32(float x) {
    if (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- tile copies ------------------------------------------------------------------- *
 * ROWS x HD tile of a [.., S, W] tensor, rows from g (row stride rs, column stride cs),
 * nrows and ncols (a multiple of 8) in range, the rest zero. vec: cs == 1 and rows
 * 16-byte aligned, so each 8-element chunk is one cp.async (straight-line code, a fixed
 * chunk column per thread where NT is a multiple of the chunks per row); else element
 * loads, synchronous. */
template <int ROWS, int HD, int NT, bool BF16>
__device__ __forceinline__ void load_tile(uint16_t *s, const uint16_t *g, int64_t rs, int64_t cs, int nrows,
                                          int ncols, int vec, int tid) {
    constexpr int CPR = HD / 8, TOTAL = ROWS * CPR;
    static_assert(TOTAL % NT == 0, "tile chunks must split evenly over the threads");
    const uint32_t base = smem_addr(s);
    if (vec) {
#pragma unroll
        for (int it = 0; it < TOTAL / NT; it++) {
            int r, ch;
            if (NT % CPR == 0) {
                r = tid / CPR + it * (NT / CPR);
                ch = tid % CPR;
            } else {
                r = (tid + it * NT) / CPR;
                ch = (tid + it * NT) % CPR;
            }
            const bool ok = r < nrows && ch * 8 < ncols;
            const uint16_t *src = g + (ok ? r * rs + ch * 8 : 0);
            cp_async16(base + (uint32_t)(r * (HD + 8) + ch * 8) * 2u, src, ok ? 16 : 0);
        }
        return;
    }
#pragma unroll 1
    for (int c = tid; c < TOTAL; c += NT) {
        const int r = c / CPR, ch = c % CPR;
        uint32_t w[4] = {0, 0, 0, 0};
        if (r < nrows && ch * 8 < ncols) {
            const uint16_t *src = g + r * rs + (int64_t)ch * 8 * cs;
#pragma unroll
            for (int e = 0; e < 4; e++)
                w[e] = (uint32_t)src[(2 * e) * cs] | ((uint32_t)src[(2 * e + 1) * cs] << 16);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + (uint32_t)(r * (HD + 8) + ch * 8) * 2u),
                     "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
    }
}
/* The reverse: nrows x ncols of a staged tile (pitch HD + 8) to global memory. */
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void store_tile(const uint16_t *s, uint16_t *g, int64_t rs, int64_t cs, int nrows,
                                           int ncols, int vec, int tid) {
    constexpr int CPR = HD / 8, TOTAL = ROWS * CPR;
    if (vec) {
#pragma unroll 4
        for (int c = tid; c < TOTAL; c += NT) {
            const int r = c / CPR, ch = c % CPR;
            if (r < nrows && ch * 8 < ncols)
                *reinterpret_cast<uint4 *>(g + r * rs + ch * 8) =
                    *reinterpret_cast<const uint4 *>(s + r * (HD + 8) + ch * 8);
        }
        return;
    }
#pragma unroll 1
    for (int c = tid; c < TOTAL; c += NT) {
        const int r = c / CPR, ch = c % CPR;
        if (r >= nrows || ch * 8 >= ncols) continue;
        const uint4 v = *reinterpret_cast<const uint4 *>(s + r * (HD + 8) + ch * 8);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint16_t *dst = g + r * rs + (int64_t)ch * 8 * cs;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            dst[(2 * e) * cs] = (uint16_t)(w[e] & 0xffffu);
            dst[(2 * e + 1) * cs] = (uint16_t)(w[e] >> 16);
        }
    }
}

/* One score after the dot product: scale, softcap, bias_scale * bias, ALiBi, masks (the CPU's
 * src/cpu/scores.h, mirrored; a bias term of -inf hides the key whatever its product).
 * Returns the score times log2(e) (the kernels' exponent domain), -inf where the key is
 * hidden; *dcap gets the softcap's derivative sech^2(y) = 4e / (1 + e)^2, e = exp(-2|y|),
 * which keeps its digits where tanh saturates (1 - tanh^2 would not). i, j in range is the
 * caller's business only for the bias read: out-of-range keys come back hidden. */
__device__ __forceinline__ float score_one(const fa_cuda_params &p, float acc, int b, int h, int64_t i, int j,
                                           int lo, int hi, int32_t qseg, float slope, float *dcap) {
    const bool in = j >= lo && j <= hi && i < p.Sq;
    bool vis = in;
    if (p.has_seg && in) vis = qseg == p.kv_seg[(int64_t)b * p.Sk + j];
    float x = acc * p.scale;
    *dcap = 0.f;
    if (p.softcap > 0.f) {
        const float y = x * p.inv_softcap, e = expf(-2.f * fabsf(y)), d1 = 1.f + e;
        *dcap = 4.f * e / (d1 * d1);
        x = p.softcap * tanhf(y);
    }
    if (p.has_bias && in) {
        const float t = p.bias_scale * p.bias[b * p.bs[0] + h * p.bs[1] + i * p.bs[2] + (int64_t)j * p.bs[3]];
        x = t == -INFINITY ? t : x + t;
    }
    if (p.has_alibi) x -= slope * fabsf((float)(i + p.off - j));
    return vis ? x * FA_LOG2E : -INFINITY;
}

#endif /* FA_CUDA_COMMON_CUH */
