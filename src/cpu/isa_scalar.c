/* The portable microkernels: plain C that GCC and Clang vectorize at -O3 for whatever the
 * baseline target is. Every operand is packed to f32 (any dtype, any strides, via
 * fa_load), laid out so each product's inner loop runs over contiguous memory:
 *
 *   pack_a  (q):  A[r * cols + c]               rows x cols, row-major
 *   pack_bt (k):  BT[c * rows + r]              transposed: keys run fastest
 *   pack_b  (v):  B[r * cols + c]               rows x cols, row-major
 *
 * The products work on strips of FA_SC_W output columns of one row, held in a small
 * local array that the compiler keeps in vector registers, so the accumulators never
 * round-trip through memory inside the reduction loop. (Blocks of several rows measured
 * slower with GCC 12: it spills them when the reduction length is not a constant.) The
 * ragged last strip of a row takes a plain loop. */
#include "isa.h"
#include "vexp.h"

#include <string.h>

#define FA_SC_W 16 /* output columns per strip: 4 SSE or 2 AVX registers */

static int scalar_available(void) { return 1; }

static int64_t scalar_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    (void)t;
    return rows * cols * (int64_t)sizeof(float);
}

/* dst[r * drs + c * dcs] = src[r, c] as f32; the dtype switch sits outside the loops. */
static void pack_f32(const fa_tile_src *src, int rows, int cols, float *restrict dst, int64_t drs,
                     int64_t dcs) {
    const int64_t rs = src->row_stride, cs = src->col_stride;
    switch (src->dtype) {
    case FA_F32: {
        const float *s = (const float *)src->base;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) dst[r * drs + c * dcs] = s[r * rs + c * cs];
        break;
    }
    case FA_BF16: {
        const uint16_t *s = (const uint16_t *)src->base;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) dst[r * drs + c * dcs] = fa_bf16_to_f32(s[r * rs + c * cs]);
        break;
    }
    case FA_F16: {
        const uint16_t *s = (const uint16_t *)src->base;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) dst[r * drs + c * dcs] = fa_f16_to_f32(s[r * rs + c * cs]);
        break;
    }
    }
}

static void scalar_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    pack_f32(src, rows, cols, (float *)dst, cols, 1);
}
static void scalar_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    pack_f32(src, rows, cols, (float *)dst, 1, rows);
}
static void scalar_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    pack_f32(src, rows, cols, (float *)dst, cols, 1);
}

/* s[i, j] = sum_x A[i, x] BT[x, j]. */
static void scalar_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    const float *restrict A = (const float *)a;
    const float *restrict BT = (const float *)bt;
    for (int i = 0; i < m; i++) {
        const float *restrict arow = A + (int64_t)i * k;
        float *restrict srow = s + (int64_t)i * lds;
        int j0 = 0;
        for (; j0 + FA_SC_W <= n; j0 += FA_SC_W) {
            float acc[FA_SC_W] = {0};
            for (int x = 0; x < k; x++) {
                const float av = arow[x];
                const float *restrict b = BT + (int64_t)x * n + j0;
                for (int c = 0; c < FA_SC_W; c++) acc[c] += av * b[c];
            }
            for (int c = 0; c < FA_SC_W; c++) srow[j0 + c] = acc[c];
        }
        if (j0 < n) { /* the ragged last strip */
            const int w = n - j0;
            for (int c = 0; c < w; c++) srow[j0 + c] = 0.0f;
            for (int x = 0; x < k; x++) {
                const float av = arow[x];
                const float *restrict b = BT + (int64_t)x * n + j0;
                for (int c = 0; c < w; c++) srow[j0 + c] += av * b[c];
            }
        }
    }
}

/* o[i, c] += sum_j p[i, j] B[j, c]. Zero weights (masked keys) are skipped. */
static void scalar_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    const float *restrict B = (const float *)b;
    for (int i = 0; i < m; i++) {
        const float *restrict prow = p + (int64_t)i * ldp;
        float *restrict orow = o + (int64_t)i * ldo;
        int c0 = 0;
        for (; c0 + FA_SC_W <= cols; c0 += FA_SC_W) {
            float acc[FA_SC_W];
            for (int c = 0; c < FA_SC_W; c++) acc[c] = orow[c0 + c];
            for (int j = 0; j < n; j++) {
                const float pv = prow[j];
                if (pv == 0.0f) continue;
                const float *restrict brow = B + (int64_t)j * cols + c0;
                for (int c = 0; c < FA_SC_W; c++) acc[c] += pv * brow[c];
            }
            for (int c = 0; c < FA_SC_W; c++) orow[c0 + c] = acc[c];
        }
        if (c0 < cols) { /* the ragged last strip */
            for (int j = 0; j < n; j++) {
                const float pv = prow[j];
                if (pv == 0.0f) continue;
                const float *restrict brow = B + (int64_t)j * cols;
                for (int c = c0; c < cols; c++) orow[c] += pv * brow[c];
            }
        }
    }
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
