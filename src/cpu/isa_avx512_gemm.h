/* The register-blocked products of the AVX-512 tables, written once for both kinds of
 * packed element, a 32-bit word: an f32 (isa_avx512.c: dot = a b, vfmadd231ps) or a pair
 * of bf16 (isa_avx512bf16.c: dot = a0 b0 + a1 b1, vdpbf16ps). The including file defines
 * FA_AVX512_DOT(acc, a, b), acc + dot of a (one word of A broadcast) and b (16 words of B),
 * then includes this header, once, after isa_avx512.h.
 *
 *   gemm_abt: S = Q K^T, 12 query rows x 32 keys (24 accumulators); K^T in panels of 32
 *             keys, K words of each key: BT[p][x][32]
 *   gemm_pb:  O += P V,  6 rows x 64 value columns (24 accumulators); V in panels of 64
 *             columns (pb_width), np words a column: B[p][x][w]
 * Each is C[MR x 16NV] (+)= sum_x A[r, x] B[x, :]: a row of B is NV vectors, A[r, x] is
 * broadcast straight from memory into the dot. */
#ifndef FA_CPU_ISA_AVX512_GEMM_H
#define FA_CPU_ISA_AVX512_GEMM_H

#ifndef FA_AVX512_DOT
#error "define FA_AVX512_DOT(acc, a, b) before including isa_avx512_gemm.h"
#endif

#include "isa_avx512.h"

#include <string.h>

#define ABT_MR 12 /* query rows per block of gemm_abt */
#define ABT_NR 32 /* keys per panel of packed K^T */
#define PB_MR 6   /* rows per block of gemm_pb */
#define PB_NR 64  /* value columns per panel of packed V */

/* Width in words of column panel p of a packed V with `cols` columns. */
static inline int pb_width(int cols, int p) {
    const int rest = cols - p * PB_NR;
    return rest >= PB_NR ? PB_NR : (rest + 15) / 16 * 16;
}

/* C[r, 16v + l] (+)= sum_{x<K} dot(A[r*lda + x], B[x*ldb + 16v + l]), r < MR, v < NV; the
 * last vector's store is masked by `last`. accumulate: C starts from its stored values. */
static inline __attribute__((always_inline)) void kernel(const int MR, const int NV, int K,
                                                         const uint32_t *restrict A, int64_t lda,
                                                         const uint32_t *restrict Bm, int64_t ldb, float *restrict C,
                                                         int64_t ldc, __mmask16 last, const int accumulate) {
    __m512 acc[ABT_MR][4];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, C + r * ldc + 16 * v)
                                   : _mm512_setzero_ps();
    for (int x = 0; x < K; x++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(Bm + (int64_t)x * ldb + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            float w; /* the word's bits, whatever it holds */
            memcpy(&w, A + r * lda + x, sizeof w);
            const __m512 a = _mm512_set1_ps(w);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = FA_AVX512_DOT(acc[r][v], a, b[v]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            if (v == NV - 1) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, last, acc[r][v]);
            else _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
        }
}

/* Instances for a runtime row count mr (1 <= mr <= the block's MR). */
#define KCASE(MR_, NV_, ACC_) \
    case MR_: kernel(MR_, NV_, K, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES6(NV_, ACC_) KCASE(6, NV_, ACC_) KCASE(5, NV_, ACC_) KCASE(4, NV_, ACC_) \
    KCASE(3, NV_, ACC_) KCASE(2, NV_, ACC_) default: kernel(1, NV_, K, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES12(NV_, ACC_) KCASE(12, NV_, ACC_) KCASE(11, NV_, ACC_) KCASE(10, NV_, ACC_) KCASE(9, NV_, ACC_) \
    KCASE(8, NV_, ACC_) KCASE(7, NV_, ACC_) KCASES6(NV_, ACC_)

static void abt_block(int mr, int nv, int K, const uint32_t *A, int64_t lda, const uint32_t *Bm, int64_t ldb,
                      float *C, int64_t ldc, __mmask16 last) {
    if (nv == 2) {
        switch (mr) { KCASES12(2, 0) }
    } else {
        switch (mr) { KCASES12(1, 0) }
    }
}

static void pb_block(int mr, int nv, int K, const uint32_t *A, int64_t lda, const uint32_t *Bm, int64_t ldb,
                     float *C, int64_t ldc, __mmask16 last) {
    switch (nv) {
    case 4: switch (mr) { KCASES6(4, 1) } break;
    case 3: switch (mr) { KCASES6(3, 1) } break;
    case 2: switch (mr) { KCASES6(2, 1) } break;
    default: switch (mr) { KCASES6(1, 1) } break;
    }
}

/* s[i*lds + j] = sum_{x<K} dot(A[i*K + x], key j's word x) for i < m, j < n. */
static void gemm_abt_words(int m, int n, int K, const uint32_t *A, const uint32_t *BT, float *s, int lds) {
    for (int j0 = 0; j0 < n; j0 += ABT_NR) {
        const int nj = n - j0 < ABT_NR ? n - j0 : ABT_NR, nv = (nj + 15) / 16;
        const __mmask16 last = fa_mask16(nj - 16 * (nv - 1));
        const uint32_t *panel = BT + (int64_t)j0 * K;
        for (int i0 = 0; i0 < m; i0 += ABT_MR) {
            const int mr = m - i0 < ABT_MR ? m - i0 : ABT_MR;
            abt_block(mr, nv, K, A + (int64_t)i0 * K, K, panel, ABT_NR, s + (int64_t)i0 * lds + j0, lds, last);
        }
    }
}

/* o[i*ldo + c] += sum_{x<K} dot(A[i*lda + x], column c's word x0 + x) for i < m, c < cols,
 * V packed with np words a column. */
static void gemm_pb_words(int m, int K, int cols, const uint32_t *A, int64_t lda, const uint32_t *V, int64_t np,
                          int x0, float *o, int ldo) {
    for (int c0 = 0, pi = 0; c0 < cols; c0 += PB_NR, pi++) {
        const int w = pb_width(cols, pi), nc = cols - c0 < PB_NR ? cols - c0 : PB_NR, nv = w / 16;
        const __mmask16 last = fa_mask16(nc - 16 * (nv - 1));
        const uint32_t *panel = V + (int64_t)c0 * np + (int64_t)x0 * w;
        for (int i0 = 0; i0 < m; i0 += PB_MR) {
            const int mr = m - i0 < PB_MR ? m - i0 : PB_MR;
            pb_block(mr, nv, K, A + (int64_t)i0 * lda, lda, panel, w, o + (int64_t)i0 * ldo + c0, ldo, last);
        }
    }
}

#endif /* FA_CPU_ISA_AVX512_GEMM_H */
