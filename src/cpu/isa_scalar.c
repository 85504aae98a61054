/* The portable microkernels: plain C that GCC and Clang vectorize at -O3 for whatever the
 * baseline target is. Every operand is packed to f32 (any dtype, any strides, by
 * isa_pack.h's fa_pack_f32), laid out so each product's inner loop runs over contiguous memory:
 *
 *   pack_a  (q):  A[r * cols + c]               rows x cols, row-major
 *   pack_bt (k):  BT[c * rows + r]              transposed: keys run fastest
 *   pack_b  (v):  B[r * cols + c]               rows x cols, row-major
 *
 * The products work on strips of FA_SC_W output columns of one row, held in a small
 * local array that the compiler keeps in vector registers, so the accumulators never
 * round-trip through memory inside the reduction loop. (Blocks of several rows measured
 * slower with GCC 12: it spills them when the reduction length is not a constant.) Both
 * products are one row kernel; the ragged last strip of a row takes a plain loop. */
#include "isa.h"
#include "isa_pack.h"
#include "vexp.h"

#include <string.h>

#define FA_SC_W 16 /* output columns per strip: 4 SSE or 2 AVX registers */

static int scalar_available(void) { return 1; }

static int64_t scalar_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    (void)t;
    return rows * cols * (int64_t)sizeof(float);
}

static void scalar_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    fa_pack_f32(src, rows, cols, (float *)dst, cols, 1);
}
static void scalar_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    fa_pack_f32(src, rows, cols, (float *)dst, 1, rows);
}
static void scalar_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    fa_pack_f32(src, rows, cols, (float *)dst, cols, 1);
}

/* One output row of both products: out[c] (+)= sum_{x<K} a[x] B[x * ldb + c] for c < n,
 * in strips of FA_SC_W columns. accumulate: out starts from its values, else from 0.
 * skip_zero: terms with a[x] == 0 are left out (gemm_pb's masked keys; gemm_abt keeps
 * them, so that inf or NaN in k reaches the score). */
static inline __attribute__((always_inline)) void row_product(const float *restrict a, int K,
                                                              const float *restrict B, int64_t ldb, int n,
                                                              float *restrict out, const int accumulate,
                                                              const int skip_zero) {
    int c0 = 0;
    for (; c0 + FA_SC_W <= n; c0 += FA_SC_W) {
        float acc[FA_SC_W] = {0};
        if (accumulate)
            for (int c = 0; c < FA_SC_W; c++) acc[c] = out[c0 + c];
        for (int x = 0; x < K; x++) {
            const float av = a[x];
            if (skip_zero && av == 0.0f) continue;
            const float *restrict b = B + (int64_t)x * ldb + c0;
            for (int c = 0; c < FA_SC_W; c++) acc[c] += av * b[c];
        }
        for (int c = 0; c < FA_SC_W; c++) out[c0 + c] = acc[c];
    }
    if (c0 < n) { /* the ragged last strip */
        if (!accumulate)
            for (int c = c0; c < n; c++) out[c] = 0.0f;
        for (int x = 0; x < K; x++) {
            const float av = a[x];
            if (skip_zero && av == 0.0f) continue;
            const float *restrict b = B + (int64_t)x * ldb;
            for (int c = c0; c < n; c++) out[c] += av * b[c];
        }
    }
}

/* s[i, j] = sum_x A[i, x] BT[x, j]. */
static void scalar_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    for (int i = 0; i < m; i++)
        row_product((const float *)a + (int64_t)i * k, k, (const float *)bt, n, n, s + (int64_t)i * lds, 0, 0);
}

/* o[i, c] += sum_j p[i, j] B[j, c]. Zero weights (masked keys) are skipped. */
static void scalar_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    for (int i = 0; i < m; i++)
        row_product(p + (int64_t)i * ldp, n, (const float *)b, cols, cols, o + (int64_t)i * ldo, 1, 1);
}

/* x[j] = exp(x[j] - mx), returns the sum (eight partial sums, so it vectorizes). */
static float scalar_exp_sum(float *x, int n, float mx) {
    for (int j = 0; j < n; j++) x[j] = fa_vexpf(x[j] - mx);
    float part[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int c = 0; c < 8; c++) part[c] += x[j + c];
    float sum = 0.0f;
    for (; j < n; j++) sum += x[j];
    for (int c = 0; c < 8; c++) sum += part[c];
    return sum;
}

const fa_isa fa_isa_scalar = {.name = "scalar", FA_ISA_KERNELS(scalar), .packed_bytes = scalar_packed_bytes,
                               .exp_sum = scalar_exp_sum, .tiles = &fa_isa_tiles_default};
