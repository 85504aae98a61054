/* AVX512_BF16 microkernels (fa_isa_avx512bf16): bf16 problems multiply with vdpbf16ps,
 * which takes pairs of bf16 values and adds both products to an f32 lane. The products of
 * two bf16 numbers are exact in f32, and the driver rounds p to bf16 before O += P V, so
 * both products see exactly the problem's values (vdpbf16ps flushes bf16 subnormals,
 * below 1.2e-38, to zero). f16 values are not all bf16 values, so f16 problems (and f32
 * ones) use the f32 kernels of isa_avx512.c unchanged.
 *
 * Every packed buffer starts with a 64-byte header naming its payload (f32 or bf16 pairs),
 * since the products are not told the dtype. bf16 payloads, zero padded:
 *   pack_a  (q, m x k):  A[r][x/2]              row-major pairs (x, x+1) as 32-bit words
 *   pack_bt (k, n x k):  BT[p][x/2][32]          panels of 32 keys, a pair of head dims each
 *   pack_b  (v, n x c):  B[p][j/2][w]            panels of 64 columns, a pair of keys each
 * The products are the register-blocked kernel of isa_avx512.c with a pair per step:
 * gemm_abt 12 rows x 32 keys, gemm_pb 6 rows x 64 columns (p converted to pairs per block
 * of rows, in a stack buffer). */
#include "isa_avx512.h"

#include <immintrin.h>
#include <string.h>

#define FMT_F32 1u
#define FMT_BF16 2u
#define ABT_MR 12
#define ABT_NR 32
#define PB_MR 6
#define PB_NR 64
#define PB_MAX_PAIRS 2048 /* p pairs per row converted at a time (4096 keys) */

static int bf16_available(void) {
    __builtin_cpu_init();
    return fa_isa_avx512.available() && __builtin_cpu_supports("avx512bf16");
}

static int64_t bf16_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    return FA_PACK_HDR + fa_avx512_packed_bytes(rows, cols, t);
}

/* Element (r, c) of a bf16 source as raw bits. */
static inline uint16_t raw(const fa_tile_src *s, int r, int c) {
    return ((const uint16_t *)s->base)[r * s->row_stride + c * s->col_stride];
}

/* ---- packing ------------------------------------------------------------------------ */

static void bf16_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (src->dtype != FA_BF16) {
        fa_pack_set_fmt(dst, FMT_F32);
        fa_isa_avx512.pack_a(src, rows, cols, fa_pack_payload(dst));
        return;
    }
    fa_pack_set_fmt(dst, FMT_BF16);
    const int kp = (cols + 1) / 2;
    uint16_t *out = (uint16_t *)fa_pack_payload(dst);
    for (int r = 0; r < rows; r++) {
        uint16_t *d = out + (int64_t)r * 2 * kp;
        if (src->col_stride == 1) {
            const uint16_t *s = (const uint16_t *)src->base + r * src->row_stride;
            int c = 0;
            for (; c + 32 <= cols; c += 32) _mm512_storeu_si512(d + c, _mm512_loadu_si512(s + c));
            if (c < cols) _mm512_mask_storeu_epi16(d + c, fa_mask32(cols - c), _mm512_maskz_loadu_epi16(fa_mask32(cols - c), s + c));
        } else {
            for (int c = 0; c < cols; c++) d[c] = raw(src, r, c);
        }
        if (cols & 1) d[cols] = 0;
    }
}

/* K (n keys x k) into panels of 32 keys of head-dim pairs: dst[p][x/2][32]. */
static void bf16_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (src->dtype != FA_BF16) {
        fa_pack_set_fmt(dst, FMT_F32);
        fa_isa_avx512.pack_bt(src, rows, cols, fa_pack_payload(dst));
        return;
    }
    fa_pack_set_fmt(dst, FMT_BF16);
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    const int kp = (cols + 1) / 2;
    for (int j0 = 0; j0 < rows; j0 += 16) {
        const int nj = rows - j0 < 16 ? rows - j0 : 16;
        uint32_t *panel = out + (int64_t)(j0 / ABT_NR) * ABT_NR * kp + (j0 % ABT_NR);
        for (int x0 = 0; x0 < kp; x0 += 16) { /* 16 pairs = 32 head dims */
            const int nx = kp - x0 < 16 ? kp - x0 : 16, ne = cols - 2 * x0 < 32 ? cols - 2 * x0 : 32;
            __m512 r[16];
            for (int j = 0; j < 16; j++) {
                if (j >= nj) {
                    r[j] = _mm512_setzero_ps();
                } else if (src->col_stride == 1) {
                    const uint16_t *row = (const uint16_t *)src->base + (j0 + j) * src->row_stride + 2 * x0;
                    if (j0 + 32 + j < rows) _mm_prefetch((const char *)(row + 32 * src->row_stride), _MM_HINT_T0);
                    r[j] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(fa_mask32(ne), row));
                } else {
                    uint16_t tmp[32] = {0};
                    for (int e = 0; e < ne; e++) tmp[e] = raw(src, j0 + j, 2 * x0 + e);
                    r[j] = _mm512_castsi512_ps(_mm512_loadu_si512(tmp));
                }
            }
            fa_avx512_transpose16(r);
            for (int x = 0; x < nx; x++) _mm512_storeu_ps(panel + (int64_t)(x0 + x) * ABT_NR, r[x]);
        }
    }
    if (rows % ABT_NR && rows % ABT_NR <= 16) {
        uint32_t *panel = out + (int64_t)(rows / ABT_NR) * ABT_NR * kp + 16;
        for (int x = 0; x < kp; x++) _mm512_storeu_si512(panel + (int64_t)x * ABT_NR, _mm512_setzero_si512());
    }
}

static inline int pb_width(int cols, int p) {
    const int rest = cols - p * PB_NR;
    return rest >= PB_NR ? PB_NR : (rest + 15) / 16 * 16;
}

/* 16 bf16 values of row r from column c (masked) as zero-extended 32-bit words. */
static inline __m512i row16(const fa_tile_src *s, int r, int c, int nc) {
    if (s->col_stride == 1)
        return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(fa_mask16(nc), (const uint16_t *)s->base + r * s->row_stride + c));
    uint16_t tmp[16] = {0};
    for (int e = 0; e < nc && e < 16; e++) tmp[e] = raw(s, r, c + e);
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)tmp));
}

/* V (n keys x cols) into panels of 64 columns of key pairs: dst[p][j/2][w]. */
static void bf16_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (src->dtype != FA_BF16) {
        fa_pack_set_fmt(dst, FMT_F32);
        fa_isa_avx512.pack_b(src, rows, cols, fa_pack_payload(dst));
        return;
    }
    fa_pack_set_fmt(dst, FMT_BF16);
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    const int np = (rows + 1) / 2;
    /* word i of the low (high) half: element i (16 + i) of a in its low 16 bits, of b above */
    uint16_t lo_idx[32], hi_idx[32];
    for (int i = 0; i < 32; i++) {
        lo_idx[i] = (uint16_t)(i / 2 + (i % 2) * 32);
        hi_idx[i] = (uint16_t)(16 + i / 2 + (i % 2) * 32);
    }
    const __m512i interleave_lo = _mm512_loadu_si512(lo_idx), interleave_hi = _mm512_loadu_si512(hi_idx);
    for (int p = 0; p * PB_NR < cols; p++) {
        const int w = pb_width(cols, p), c0 = p * PB_NR;
        uint32_t *panel = out + (int64_t)c0 * np;
        for (int jp = 0; jp < np; jp++) {
            const int j = 2 * jp;
            if (src->col_stride == 1) { /* 32 columns of rows j, j + 1 at a time, interleaved by vpermt2w */
                const uint16_t *r0 = (const uint16_t *)src->base + (int64_t)j * src->row_stride + c0;
                for (int c = 0; c < w; c += 32) {
                    const __mmask32 mk = fa_mask32(cols - c0 - c); /* none in the padding */
                    const __m512i a = _mm512_maskz_loadu_epi16(mk, r0 + c);
                    const __m512i b = j + 1 < rows ? _mm512_maskz_loadu_epi16(mk, r0 + src->row_stride + c)
                                                   : _mm512_setzero_si512();
                    _mm512_storeu_si512(panel + (int64_t)jp * w + c, _mm512_permutex2var_epi16(a, interleave_lo, b));
                    if (c + 16 < w)
                        _mm512_storeu_si512(panel + (int64_t)jp * w + c + 16,
                                            _mm512_permutex2var_epi16(a, interleave_hi, b));
                }
                continue;
            }
            for (int c = 0; c < w; c += 16) {
                const int nc = cols - c0 - c; /* may be <= 0 in the padding */
                __m512i v = _mm512_setzero_si512();
                if (nc > 0) {
                    v = row16(src, j, c0 + c, nc);
                    if (j + 1 < rows) v = _mm512_or_si512(v, _mm512_slli_epi32(row16(src, j + 1, c0 + c, nc), 16));
                }
                _mm512_storeu_si512(panel + (int64_t)jp * w + c, v);
            }
        }
    }
}

/* ---- products ----------------------------------------------------------------------- *
 * C[r, 16v + l] (+)= sum_{x<KP} dot(A pair [r, x], B pair [x, 16v + l]). */
static inline __attribute__((always_inline)) void kernel(const int MR, const int NV, int KP,
                                                         const uint32_t *restrict A, int64_t lda,
                                                         const uint32_t *restrict Bm, int64_t ldb, float *restrict C,
                                                         int64_t ldc, __mmask16 last, const int accumulate) {
    __m512 acc[12][4];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, C + r * ldc + 16 * v)
                                   : _mm512_setzero_ps();
    for (int x = 0; x < KP; x++) {
        __m512bh b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = (__m512bh)_mm512_loadu_si512(Bm + (int64_t)x * ldb + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[r * lda + x]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
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

#define KCASE(MR_, NV_, ACC_) \
    case MR_: kernel(MR_, NV_, KP, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES6(NV_, ACC_) KCASE(6, NV_, ACC_) KCASE(5, NV_, ACC_) KCASE(4, NV_, ACC_) \
    KCASE(3, NV_, ACC_) KCASE(2, NV_, ACC_) default: kernel(1, NV_, KP, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES12(NV_, ACC_) KCASE(12, NV_, ACC_) KCASE(11, NV_, ACC_) KCASE(10, NV_, ACC_) KCASE(9, NV_, ACC_) \
    KCASE(8, NV_, ACC_) KCASE(7, NV_, ACC_) KCASES6(NV_, ACC_)

static void abt_block(int mr, int nv, int KP, const uint32_t *A, int64_t lda, const uint32_t *Bm, int64_t ldb,
                      float *C, int64_t ldc, __mmask16 last) {
    if (nv == 2) {
        switch (mr) { KCASES12(2, 0) }
    } else {
        switch (mr) { KCASES12(1, 0) }
    }
}

static void pb_block(int mr, int nv, int KP, const uint32_t *A, int64_t lda, const uint32_t *Bm, int64_t ldb,
                     float *C, int64_t ldc, __mmask16 last) {
    switch (nv) {
    case 4: switch (mr) { KCASES6(4, 1) } break;
    case 3: switch (mr) { KCASES6(3, 1) } break;
    case 2: switch (mr) { KCASES6(2, 1) } break;
    default: switch (mr) { KCASES6(1, 1) } break;
    }
}

static void bf16_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_pack_fmt(a) != FMT_BF16) {
        fa_isa_avx512.gemm_abt(m, n, k, fa_pack_cpayload(a), fa_pack_cpayload(bt), s, lds);
        return;
    }
    const uint32_t *A = (const uint32_t *)fa_pack_cpayload(a), *BT = (const uint32_t *)fa_pack_cpayload(bt);
    const int kp = (k + 1) / 2;
    for (int j0 = 0; j0 < n; j0 += ABT_NR) {
        const int nj = n - j0 < ABT_NR ? n - j0 : ABT_NR, nv = (nj + 15) / 16;
        const __mmask16 last = fa_mask16(nj - 16 * (nv - 1));
        const uint32_t *panel = BT + (int64_t)j0 * kp;
        for (int i0 = 0; i0 < m; i0 += ABT_MR) {
            const int mr = m - i0 < ABT_MR ? m - i0 : ABT_MR;
            abt_block(mr, nv, kp, A + (int64_t)i0 * kp, kp, panel, ABT_NR, s + (int64_t)i0 * lds + j0, lds, last);
        }
    }
}

/* Rows [0, mr) of p, keys [2 j0, 2 j0 + 2 np), as bf16 pairs (exact: p is rounded to bf16). */
static void p_pairs(const float *p, int ldp, int mr, int n, int j0, int np, uint32_t *dst) {
    for (int r = 0; r < mr; r++) {
        const float *row = p + (int64_t)r * ldp + 2 * j0;
        uint32_t *d = dst + (int64_t)r * np;
        const int ne = n - 2 * j0 < 2 * np ? n - 2 * j0 : 2 * np; /* valid keys in this chunk */
        int e = 0;
        for (; e + 32 <= ne; e += 32)
            _mm512_storeu_si512(d + e / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + e + 16), _mm512_loadu_ps(row + e)));
        if (e < ne) {
            const int t = ne - e;
            __m512 lo = _mm512_maskz_loadu_ps(fa_mask16(t), row + e);
            __m512 hi = t > 16 ? _mm512_maskz_loadu_ps(fa_mask16(t - 16), row + e + 16) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(d + e / 2, fa_mask16((t + 1) / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

static void bf16_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    if (fa_pack_fmt(b) != FMT_BF16) {
        fa_isa_avx512.gemm_pb(m, n, cols, p, ldp, fa_pack_cpayload(b), o, ldo);
        return;
    }
    const uint32_t *V = (const uint32_t *)fa_pack_cpayload(b);
    const int np = (n + 1) / 2;
    uint32_t pp[PB_MR * PB_MAX_PAIRS];
    for (int i0 = 0; i0 < m; i0 += PB_MR) {
        const int mr = m - i0 < PB_MR ? m - i0 : PB_MR;
        for (int j0 = 0; j0 < np; j0 += PB_MAX_PAIRS) {
            const int nj = np - j0 < PB_MAX_PAIRS ? np - j0 : PB_MAX_PAIRS;
            p_pairs(p + (int64_t)i0 * ldp, ldp, mr, n, j0, nj, pp);
            for (int c0 = 0, pi = 0; c0 < cols; c0 += PB_NR, pi++) {
                const int w = pb_width(cols, pi), nc = cols - c0 < PB_NR ? cols - c0 : PB_NR, nv = w / 16;
                const __mmask16 last = fa_mask16(nc - 16 * (nv - 1));
                const uint32_t *panel = V + (int64_t)c0 * np + (int64_t)j0 * w;
                pb_block(mr, nv, nj, pp, nj, panel, w, o + (int64_t)i0 * ldo + c0, ldo, last);
            }
        }
    }
}

static void bf16_gemm_pb_pairs(int m, int n, int cols, const uint32_t *pp, int ldpp, const void *b, float *o,
                               int ldo) {
    const uint32_t *V = (const uint32_t *)fa_pack_cpayload(b);
    const int np = (n + 1) / 2;
    for (int i0 = 0; i0 < m; i0 += PB_MR) {
        const int mr = m - i0 < PB_MR ? m - i0 : PB_MR;
        for (int c0 = 0, pi = 0; c0 < cols; c0 += PB_NR, pi++) {
            const int w = pb_width(cols, pi), nc = cols - c0 < PB_NR ? cols - c0 : PB_NR, nv = w / 16;
            pb_block(mr, nv, np, pp + (int64_t)i0 * ldpp, ldpp, V + (int64_t)c0 * np, w, o + (int64_t)i0 * ldo + c0,
                     ldo, fa_mask16(nc - 16 * (nv - 1)));
        }
    }
}

/* ---- the forward's p as pairs --------------------------------------------------------- */

static float bf16_max_row(const float *x, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(_mm512_loadu_ps(x + j), mx); /* NaN: keeps mx */
    if (j < n) mx = _mm512_mask_max_ps(mx, fa_mask16(n - j), _mm512_maskz_loadu_ps(fa_mask16(n - j), x + j), mx);
    return _mm512_reduce_max_ps(mx);
}

/* exp(x * scale - base) of the lanes under t (others 0), as exp_sum computes them. */
static inline __m512 exp_lanes(const float *x, __mmask16 t, __m512 vscale, __m512 vbase) {
    return _mm512_maskz_mov_ps(t, fa_avx512_exp_nonpos(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(t, x), vscale), vbase)));
}

/* vcvtne2ps2bf16 rounds to nearest even as round_row does; it reads f32 subnormals as 0,
 * where round_row could carry one up to FLT_MIN, but fa_avx512_exp returns none (0 below
 * ln(FLT_MIN), normal numbers above: test_isa_pairs walks every float there). */
static float bf16_exp_pairs(float *x, int n, float scale, float base) {
    const __m512 vscale = _mm512_set1_ps(scale), vbase = _mm512_set1_ps(base);
    uint32_t *out = (uint32_t *)x; /* words j/2 .. are written after floats j .. j+31 are read */
    __m512 sum = _mm512_setzero_ps();
    int j = 0;
    for (; j + 32 <= n; j += 32) { /* the sum takes 16 lanes at a time in order, as exp_sum */
        const __m512 lo = fa_avx512_exp_nonpos(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + j), vscale), vbase));
        const __m512 hi = fa_avx512_exp_nonpos(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + j + 16), vscale), vbase));
        sum = _mm512_add_ps(_mm512_add_ps(sum, lo), hi);
        _mm512_storeu_si512(out + j / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    if (j < n) {
        const int t = n - j;
        const __m512 lo = exp_lanes(x + j, fa_mask16(t), vscale, vbase);
        const __m512 hi = t > 16 ? exp_lanes(x + j + 16, fa_mask16(t - 16), vscale, vbase) : _mm512_setzero_ps();
        sum = _mm512_add_ps(sum, lo);
        if (t > 16) sum = _mm512_add_ps(sum, hi);
        _mm512_mask_storeu_epi32(out + j / 2, fa_mask16((t + 1) / 2),
                                 (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return _mm512_reduce_add_ps(sum);
}

/* The decode kernels of decode_avx512bf16.c, for the tables whose CPUs run them. */
const fa_decode_kernels fa_decode_bf16_kernels = {fa_decode_qk_bf16, fa_decode_pv_bf16, fa_decode_step_bf16};

const fa_isa fa_isa_avx512bf16 = {.name = "avx512bf16", FA_ISA_KERNELS(bf16), .packed_bytes = bf16_packed_bytes,
                                   .exp_sum = fa_avx512_exp_sum, .transpose = fa_avx512_transpose,
                                   .round_row = fa_avx512_round_row, .max_row = bf16_max_row,
                                   .exp_pairs = bf16_exp_pairs, .gemm_pb_pairs = bf16_gemm_pb_pairs,
                                   .tiles = &fa_isa_tiles_bf16_pairs, .decode = &fa_decode_bf16_kernels};
