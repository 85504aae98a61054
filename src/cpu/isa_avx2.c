/* AVX2 + FMA microkernels in f32 (fa_isa_avx2), for x86-64 CPUs without AVX-512. Any input
 * dtype is packed to f32 (F16C converts f16).
 *
 * Packing and exp_sum are isa_f32_simd.h's at 8 lanes: K^T in panels of 16 keys (8 x 8
 * blocks transposed in registers), V in panels of 16 columns: B[p][j][16].
 *
 * Both products are one register-blocked kernel, C[MR x 8NV] (+)= sum_x A[r, x] B[x, :],
 * 6 rows x 16 columns (12 of the 16 ymm registers hold accumulators); A[r, x] is
 * broadcast from memory. exp_sum uses vexp.h's method and polynomial. */
#include "isa.h"
#include "isa_pack.h"
#include "vexp.h"

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#define MR 6  /* rows per block of both products */
#define NR 16 /* keys (gemm_abt) or value columns (gemm_pb) per panel: 2 vectors */

static int avx2_available(void) {
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C from cpuid leaf 1: clang 14's __builtin_cpu_supports lacks "f16c" */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
           (c & bit_F16C);
}

static int64_t avx2_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    (void)t;
    return fa_round_up(rows, NR) * fa_round_up(cols, NR) * (int64_t)sizeof(float);
}

/* Lanes [0, n) set, for masked loads and stores of 8 floats. */
static inline __m256i lane_mask(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* 8 elements of a row from `p` as f32; only the first n (<= 8) are read, the rest are 0. */
static inline __m256 load8(fa_dtype t, const void *p, int n) {
    if (t == FA_F32) {
        if (n >= 8) return _mm256_loadu_ps((const float *)p);
        return _mm256_maskload_ps((const float *)p, lane_mask(n));
    }
    uint16_t tmp[8] = {0};
    const uint16_t *h = (const uint16_t *)p;
    __m128i raw;
    if (n >= 8) {
        raw = _mm_loadu_si128((const __m128i *)h);
    } else {
        memcpy(tmp, h, (size_t)n * sizeof(uint16_t));
        raw = _mm_loadu_si128((const __m128i *)tmp);
    }
    if (t == FA_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    return _mm256_cvtph_ps(raw);
}

/* Transposes the 8 x 8 block r[0..7] (rows) in place into columns. */
static inline void transpose8(__m256 r[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
        b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
        b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
        b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
    }
    /* b[4g + c], lane L (128 bits): column 4L + c of rows 4g..4g+3 */
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
}

/* ---- the register-blocked kernel ---------------------------------------------------- *
 * C[r, 8v + l] (+)= sum_{x<K} A[r*lda + x] * B[x*NR + 8v + l], r < ROWS, v < 2; only the
 * first nc (<= 16) columns of C are read and written. */
static inline __attribute__((always_inline)) void kernel(const int ROWS, int K, const float *restrict A, int64_t lda,
                                                         const float *restrict Bm, float *restrict C, int64_t ldc,
                                                         int nc, const int accumulate) {
    __m256 acc[MR][2];
    const __m256i m0 = lane_mask(nc), m1 = lane_mask(nc - 8);
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++) {
        acc[r][0] = accumulate ? _mm256_maskload_ps(C + r * ldc, m0) : _mm256_setzero_ps();
        acc[r][1] = accumulate ? _mm256_maskload_ps(C + r * ldc + 8, m1) : _mm256_setzero_ps();
    }
    for (int x = 0; x < K; x++) {
        const __m256 b0 = _mm256_loadu_ps(Bm + (int64_t)x * NR), b1 = _mm256_loadu_ps(Bm + (int64_t)x * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < ROWS; r++) {
            const __m256 a = _mm256_broadcast_ss(A + r * lda + x);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++) {
        _mm256_maskstore_ps(C + r * ldc, m0, acc[r][0]);
        _mm256_maskstore_ps(C + r * ldc + 8, m1, acc[r][1]);
    }
}

#define KCASES(ACC_)                                                                      \
    switch (rows) {                                                                       \
    case 6: kernel(6, K, A, lda, Bm, C, ldc, nc, ACC_); break;                            \
    case 5: kernel(5, K, A, lda, Bm, C, ldc, nc, ACC_); break;                            \
    case 4: kernel(4, K, A, lda, Bm, C, ldc, nc, ACC_); break;                            \
    case 3: kernel(3, K, A, lda, Bm, C, ldc, nc, ACC_); break;                            \
    case 2: kernel(2, K, A, lda, Bm, C, ldc, nc, ACC_); break;                            \
    default: kernel(1, K, A, lda, Bm, C, ldc, nc, ACC_); break;                           \
    }

static void block(int rows, int K, const float *A, int64_t lda, const float *Bm, float *C, int64_t ldc, int nc,
                  int accumulate) {
    if (accumulate) {
        KCASES(1)
    } else {
        KCASES(0)
    }
}

static void avx2_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    const float *A = (const float *)a, *BT = (const float *)bt;
    for (int j0 = 0; j0 < n; j0 += NR) {
        const int nc = n - j0 < NR ? n - j0 : NR;
        for (int i0 = 0; i0 < m; i0 += MR)
            block(m - i0 < MR ? m - i0 : MR, k, A + (int64_t)i0 * k, k, BT + (int64_t)j0 * k,
                  s + (int64_t)i0 * lds + j0, lds, nc, 0);
    }
}

static void avx2_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    const float *V = (const float *)b;
    for (int c0 = 0; c0 < cols; c0 += NR) {
        const int nc = cols - c0 < NR ? cols - c0 : NR;
        for (int i0 = 0; i0 < m; i0 += MR)
            block(m - i0 < MR ? m - i0 : MR, n, p + (int64_t)i0 * ldp, ldp, V + (int64_t)c0 * n,
                  o + (int64_t)i0 * ldo + c0, ldo, nc, 1);
    }
}

/* ---- exp (vexp.h's method on 8 lanes), packing and exp_sum (isa_f32_simd.h) ---------- */

static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(FA_EXP_LO), hi = _mm256_set1_ps(FA_EXP_HI);
    __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); /* NaN passes through */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(FA_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_HI), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(fa_exp_coef[0]);
#pragma GCC unroll 8
    for (int i = 1; i < FA_EXP_NCOEF; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(fa_exp_coef[i]));
    /* 2^n in the exponent bits (n in [-126, 127] after the clamps; NaN gives garbage, fixed below) */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The sum of the 8 lanes. */
static inline float hsum8(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

/* The vector traits of isa_f32_simd.h: 8 lanes, masks as all-ones lanes. */
#define FA_V_FN(name) avx2_##name
#define FA_V_PANEL NR
#define FA_VW 8
#define FA_V __m256
#define FA_VM __m256i
#define FA_V_TAIL(n) lane_mask(n)
#define FA_V_LOADT(t, p, n) load8(t, p, n)
#define FA_V_LOAD(p) _mm256_loadu_ps(p)
#define FA_V_STORE(p, v) _mm256_storeu_ps(p, v)
#define FA_V_MLOAD(m, p) _mm256_maskload_ps(p, m)
#define FA_V_MSTORE(p, m, v) _mm256_maskstore_ps(p, m, v)
#define FA_V_ZERO() _mm256_setzero_ps()
#define FA_V_SET1(x) _mm256_set1_ps(x)
#define FA_V_ADD(a, b) _mm256_add_ps(a, b)
#define FA_V_SUB(a, b) _mm256_sub_ps(a, b)
#define FA_V_KEEP(m, v) _mm256_and_ps(v, _mm256_castsi256_ps(m))
#define FA_V_EXP(x) exp8(x)
#define FA_V_HSUM(v) hsum8(v)
#define FA_V_TRANSPOSE(r) transpose8(r)
#include "isa_f32_simd.h"
_Static_assert(FA_V_KEYS == NR, "pack_bt packs the panels gemm_abt reads");

const fa_isa fa_isa_avx2 = {.name = "avx2", FA_ISA_KERNELS(avx2), .bt_prefix = 1, .packed_bytes = avx2_packed_bytes,
                             .exp_sum = avx2_exp_sum, .tiles = &fa_isa_tiles_default};
