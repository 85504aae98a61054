/* AVX512_BF16 microkernels (fa_isa_avx512bf16): bf16 problems multiply with vdpbf16ps,
 * which takes pairs of bf16 values and adds both products to an f32 lane. The products of
 * two bf16 numbers are exact in f32, and the driver rounds p to bf16 before O += P V, so
 * both products see exactly the problem's values (vdpbf16ps flushes bf16 subnormals,
 * below 1.2e-38, to zero). f16 values are not all bf16 values, so f16 problems (and f32
 * ones) use the f32 kernels of isa_avx512.c unchanged.
 *
 * Every packed buffer starts with a 64-byte header naming its payload (f32 or bf16 pairs),
 * since the products are not told the dtype (isa_avx512bf16.h). bf16 payloads, zero padded:
 *   pack_a  (q, m x k):  A[r][x/2]              row-major pairs (x, x+1) as 32-bit words
 *   pack_bt (k, n x k):  BT[p][x/2][32]          panels of 32 keys, a pair of head dims each
 *   pack_b  (v, n x c):  B[p][j/2][w]            panels of 64 columns, a pair of keys each
 * The products are the register-blocked kernel of isa_avx512_gemm.h with a pair per word:
 * gemm_abt 12 rows x 32 keys, gemm_pb 6 rows x 64 columns (p converted to pairs per block
 * of rows, in a stack buffer). */
#include "isa_avx512bf16.h"

#define FA_AVX512_DOT(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#include "isa_avx512_gemm.h"

#include <immintrin.h>
#include <string.h>

#define FMT_BF16 2u
#define PB_MAX_PAIRS 2048 /* p pairs per row converted at a time (4096 keys) */

static int bf16_available(void) {
    __builtin_cpu_init();
    return fa_isa_avx512.available() && __builtin_cpu_supports("avx512bf16");
}

static int64_t bf16_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    return FA_PACK_HDR + fa_avx512_packed_bytes(rows, cols, t);
}

/* ---- packing ------------------------------------------------------------------------ */

static void bf16_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_a, src, rows, cols, dst, FMT_BF16)) return;
    const int kp = (cols + 1) / 2;
    uint16_t *out = (uint16_t *)fa_pack_payload(dst);
    for (int r = 0; r < rows; r++) {
        uint16_t *d = out + (int64_t)r * 2 * kp;
        for (int c = 0; c < cols; c += 32)
            _mm512_mask_storeu_epi16(d + c, fa_mask32(cols - c), fa_bf16_load32(src, r, c, cols - c));
        if (cols & 1) d[cols] = 0;
    }
}

/* K (n keys x k) into panels of 32 keys of head-dim pairs: dst[p][x/2][32]. */
static void bf16_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_bt, src, rows, cols, dst, FMT_BF16)) return;
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    const int kp = (cols + 1) / 2;
    for (int j0 = 0; j0 < rows; j0 += 16) {
        uint32_t *panel = out + (int64_t)(j0 / ABT_NR) * ABT_NR * kp + (j0 % ABT_NR);
        for (int x0 = 0; x0 < kp; x0 += 16) { /* 16 pairs = 32 head dims */
            const int nx = kp - x0 < 16 ? kp - x0 : 16;
            __m512 r[16];
            fa_bf16_load_keys16(src, j0, rows, 2 * x0, cols - 2 * x0, r);
            fa_avx512_transpose16(r);
            for (int x = 0; x < nx; x++) _mm512_storeu_ps(panel + (int64_t)(x0 + x) * ABT_NR, r[x]);
        }
    }
    if (rows % ABT_NR && rows % ABT_NR <= 16) {
        uint32_t *panel = out + (int64_t)(rows / ABT_NR) * ABT_NR * kp + 16;
        for (int x = 0; x < kp; x++) _mm512_storeu_si512(panel + (int64_t)x * ABT_NR, _mm512_setzero_si512());
    }
}

/* V (n keys x cols) into panels of 64 columns of key pairs: dst[p][j/2][w]. */
static void bf16_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_b, src, rows, cols, dst, FMT_BF16)) return;
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    const int np = (rows + 1) / 2;
    for (int p = 0; p * PB_NR < cols; p++) {
        const int w = pb_width(cols, p), c0 = p * PB_NR;
        uint32_t *panel = out + (int64_t)c0 * np;
        for (int jp = 0; jp < np; jp++)
            for (int c = 0; c < w; c += 32) { /* 32 columns of rows 2 jp, 2 jp + 1 */
                __m512i lo, hi;
                fa_bf16_pair_rows(src, 2 * jp, rows, c0 + c, cols, &lo, &hi);
                _mm512_storeu_si512(panel + (int64_t)jp * w + c, lo);
                if (c + 16 < w) _mm512_storeu_si512(panel + (int64_t)jp * w + c + 16, hi);
            }
    }
}

/* ---- products (isa_avx512_gemm.h) ----------------------------------------------------- */

static void bf16_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_gemm_abt_f32(m, n, k, a, bt, s, lds)) return;
    gemm_abt_words(m, n, (k + 1) / 2, (const uint32_t *)fa_pack_cpayload(a), (const uint32_t *)fa_pack_cpayload(bt),
                   s, lds);
}

/* Rows [0, mr) of p, keys [2 j0, 2 j0 + 2 np), as bf16 pairs (exact: p is rounded to bf16). */
static void p_pairs(const float *p, int ldp, int mr, int n, int j0, int np, uint32_t *dst) {
    for (int r = 0; r < mr; r++) {
        const float *row = p + (int64_t)r * ldp + 2 * j0;
        uint32_t *d = dst + (int64_t)r * np;
        const int ne = n - 2 * j0 < 2 * np ? n - 2 * j0 : 2 * np; /* valid keys in this chunk */
        for (int e = 0; e < ne; e += 32)
            _mm512_mask_storeu_epi32(d + e / 2, fa_mask16((ne - e + 1) / 2), fa_bf16_pairs32(row + e, ne - e));
    }
}

static void bf16_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    if (fa_gemm_pb_f32(m, n, cols, p, ldp, b, o, ldo)) return;
    const uint32_t *V = (const uint32_t *)fa_pack_cpayload(b);
    const int np = (n + 1) / 2, packed = (fa_pack_rows(b) + 1) / 2; /* pairs to multiply; pairs a column holds */
    uint32_t pp[PB_MR * PB_MAX_PAIRS];
    for (int i0 = 0; i0 < m; i0 += PB_MR) {
        const int mr = m - i0 < PB_MR ? m - i0 : PB_MR;
        for (int j0 = 0; j0 < np; j0 += PB_MAX_PAIRS) {
            const int nj = np - j0 < PB_MAX_PAIRS ? np - j0 : PB_MAX_PAIRS;
            p_pairs(p + (int64_t)i0 * ldp, ldp, mr, n, j0, nj, pp);
            gemm_pb_words(mr, nj, cols, pp, nj, V, packed, j0, o + (int64_t)i0 * ldo, ldo);
        }
    }
}

static void bf16_gemm_pb_pairs(int m, int n, int cols, const uint32_t *pp, int ldpp, const void *b, float *o,
                               int ldo) {
    const int np = (n + 1) / 2, packed = (fa_pack_rows(b) + 1) / 2;
    gemm_pb_words(m, np, cols, pp, ldpp, (const uint32_t *)fa_pack_cpayload(b), packed, 0, o, ldo);
}

/* isa.h: a slice of 32 rows at a time (the products' rows are independent: the same bits) */
static void bf16_gemm_abt_rows(int m, const int *ns, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_gemm_abt_rows_f32(m, ns, k, a, bt, s, lds)) return;
    const int K = (k + 1) / 2;
    for (int i0 = 0; i0 < m; i0 += 32)
        if (ns[i0 / 32])
            gemm_abt_words(m - i0 < 32 ? m - i0 : 32, ns[i0 / 32], K,
                           (const uint32_t *)fa_pack_cpayload(a) + (int64_t)i0 * K, (const uint32_t *)fa_pack_cpayload(bt),
                           s + (int64_t)i0 * lds, lds);
}

static void bf16_gemm_pb_pairs_rows(int m, const int *ns, int cols, const uint32_t *pp, int ldpp, const void *b,
                                    float *o, int ldo) {
    const int packed = (fa_pack_rows(b) + 1) / 2;
    for (int i0 = 0; i0 < m; i0 += 32)
        if (ns[i0 / 32])
            gemm_pb_words(m - i0 < 32 ? m - i0 : 32, (ns[i0 / 32] + 1) / 2, cols, pp + (int64_t)i0 * ldpp, ldpp,
                          (const uint32_t *)fa_pack_cpayload(b), packed, 0, o + (int64_t)i0 * ldo, ldo);
}

/* ---- the forward's p as pairs --------------------------------------------------------- */

float fa_bf16_max_row(const float *x, int n) {
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
float fa_bf16_exp_pairs(float *x, int n, float scale, float base) {
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
        _mm512_mask_storeu_epi32(out + j / 2, fa_mask16((t + 1) / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return _mm512_reduce_add_ps(sum);
}

/* The decode kernels of decode_avx512bf16.c, for the tables whose CPUs run them. */
const fa_decode_kernels fa_decode_bf16_kernels = {fa_decode_qk_bf16, fa_decode_pv_bf16, fa_decode_step_bf16,
                                                   fa_decode_cache_qk_avx512, fa_decode_cache_pv_avx512,
                                                   fa_decode_cache_step_avx512, 0, 1, 0, 0};

const fa_isa fa_isa_avx512bf16 = {.name = "avx512bf16", FA_ISA_KERNELS(bf16), .packed_bytes = bf16_packed_bytes,
                                   .bt_prefix = 1, .b_prefix = 1, .gemm_abt_rows = bf16_gemm_abt_rows,
                                   .gemm_pb_pairs_rows = bf16_gemm_pb_pairs_rows,
                                   .exp_sum = fa_avx512_exp_sum, .transpose = fa_avx512_transpose,
                                   .round_row = fa_avx512_round_row, .max_row = fa_bf16_max_row,
                            .hide_row = fa_avx512_hide_row, .scale_row = fa_avx512_scale_row,
                            .store_bf16 = fa_avx512_store_bf16,
                                   .exp_pairs = fa_bf16_exp_pairs, .gemm_pb_pairs = bf16_gemm_pb_pairs,
                                   .tiles = &fa_isa_tiles_bf16_pairs, .decode = &fa_decode_bf16_kernels,
    .dropout_tile = fa_dropout_tile_avx512};
