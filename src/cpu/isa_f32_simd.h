/* The f32 packing and exp_sum of the vector tables (isa_avx2.c: 8 lanes, isa_avx512.c: 16),
 * written once over the vector width, as ggml writes its vector loops once over per-ISA
 * macros. The including file defines, then includes this header once:
 *   FA_V_FN(name)               the name of the table's function `name` (pack_a, pack_bt,
 *                               pack_b, exp_sum): avx2_pack_a, ...
 *   FA_V_PANEL                  columns per panel of packed V (a multiple of 16)
 *   FA_VW                       lanes of a vector (8 or 16); FA_V its type, FA_VM a lane mask's
 *   FA_V_TAIL(n)                the mask of lanes [0, n) (n clamped to [0, FA_VW])
 *   FA_V_LOADT(t, p, n)         elements [0, n) of dtype t at p as f32, 0 in the other lanes
 *   FA_V_LOAD(p), FA_V_STORE(p, v), FA_V_MLOAD(m, p), FA_V_MSTORE(p, m, v)   f32 loads, stores
 *   FA_V_ZERO(), FA_V_SET1(x), FA_V_ADD(a, b), FA_V_SUB(a, b), FA_V_KEEP(m, v) (0 outside m)
 *   FA_V_EXP(x)                 exp by vexp.h's method; FA_V_HSUM(v) the sum of the lanes
 *   FA_V_TRANSPOSE(r)           the FA_VW x FA_VW block r[0 .. FA_VW) transposed in place
 * Packed layouts (f32, zero padded, so the products never need masks inside a loop):
 *   pack_a  (q, m x k):  A[r * k + x]                 row-major
 *   pack_bt (k, n x k):  panels of 2 FA_VW keys: BT[p][x][2 FA_VW]   keys run fastest
 *   pack_b  (v, n x c):  panels of FA_V_PANEL columns: B[p][j][w], w = simd_panel_width */
#ifndef FA_CPU_ISA_F32_SIMD_H
#define FA_CPU_ISA_F32_SIMD_H

#ifndef FA_VW
#error "define the vector traits (FA_VW ...) before including isa_f32_simd.h"
#endif

#include "isa_pack.h"

#define FA_V_KEYS (2 * FA_VW) /* keys per panel of packed K^T: two vectors */

/* Copies a rows x cols tile to f32 rows of `ld` floats (ld >= cols). */
static inline void simd_pack_rows(const fa_tile_src *src, int rows, int cols, float *dst, int64_t ld) {
    if (src->col_stride != 1) {
        fa_pack_f32(src, rows, cols, dst, ld, 1);
        return;
    }
    const size_t esz = fa_dtype_size(src->dtype);
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)src->base + (size_t)(r * src->row_stride) * esz;
        float *d = dst + r * ld;
        int c = 0;
        for (; c + FA_VW <= cols; c += FA_VW) FA_V_STORE(d + c, FA_V_LOADT(src->dtype, row + (size_t)c * esz, FA_VW));
        if (c < cols) FA_V_MSTORE(d + c, FA_V_TAIL(cols - c), FA_V_LOADT(src->dtype, row + (size_t)c * esz, cols - c));
    }
}

/* Q (m x k) row-major. */
static void FA_V_FN(pack_a)(const fa_tile_src *src, int rows, int cols, void *dst) {
    simd_pack_rows(src, rows, cols, (float *)dst, cols);
}

/* K (n keys x k) into panels of FA_V_KEYS keys, transposed in FA_VW x FA_VW blocks in
 * registers, so FA_VW keys are one vector: that cost is paid once per key tile and shared
 * by all query rows of the tile. Keys past n (to the end of the last panel) are zeros. */
static void FA_V_FN(pack_bt)(const fa_tile_src *src, int rows, int cols, void *dst) {
    float *out = (float *)dst;
    const size_t esz = fa_dtype_size(src->dtype);
    for (int j0 = 0; j0 < fa_round_up(rows, FA_V_KEYS); j0 += FA_VW) {
        const int nj = rows - j0 < FA_VW ? (rows > j0 ? rows - j0 : 0) : FA_VW;
        float *panel = out + (int64_t)(j0 / FA_V_KEYS) * FA_V_KEYS * cols + (j0 % FA_V_KEYS);
        for (int x0 = 0; x0 < cols; x0 += FA_VW) {
            const int nx = cols - x0 < FA_VW ? cols - x0 : FA_VW;
            FA_V r[FA_VW];
            for (int j = 0; j < FA_VW; j++) {
                if (j >= nj) {
                    r[j] = FA_V_ZERO();
                } else if (src->col_stride == 1) {
                    const char *row = (const char *)src->base + (size_t)((j0 + j) * src->row_stride + x0) * esz;
                    /* the same columns 32 keys ahead: many row streams defeat the hardware
                     * prefetcher when K comes from L3 */
                    if (j0 + 32 + j < rows) _mm_prefetch(row + (size_t)(32 * src->row_stride) * esz, _MM_HINT_T0);
                    r[j] = FA_V_LOADT(src->dtype, row, nx);
                } else {
                    float tmp[FA_VW] = {0};
                    const fa_tile_src key = fa_tile_at(src, j0 + j, x0);
                    fa_pack_f32(&key, 1, nx, tmp, 0, 1);
                    r[j] = FA_V_LOAD(tmp);
                }
            }
            FA_V_TRANSPOSE(r);
            for (int x = 0; x < nx; x++) FA_V_STORE(panel + (int64_t)(x0 + x) * FA_V_KEYS, r[x]);
        }
    }
}

/* Width in floats of column panel p of a packed V with `cols` columns. */
static inline int simd_panel_width(int cols, int p) {
    const int rest = cols - p * FA_V_PANEL;
    return rest >= FA_V_PANEL ? FA_V_PANEL : (rest + 15) / 16 * 16;
}

/* V (n x cols) into panels of FA_V_PANEL columns: dst[p][j][w]. */
static void FA_V_FN(pack_b)(const fa_tile_src *src, int rows, int cols, void *dst) {
    float *out = (float *)dst;
    for (int p = 0; p * FA_V_PANEL < cols; p++) {
        const int w = simd_panel_width(cols, p), c0 = p * FA_V_PANEL;
        const int nc = cols - c0 < FA_V_PANEL ? cols - c0 : FA_V_PANEL;
        const fa_tile_src s = fa_tile_at(src, 0, c0);
        float *panel = out + (int64_t)c0 * rows;
        if (nc < w) /* the padding: within the last 16 columns */
            for (int j = 0; j < rows; j++)
                for (int c = w - 16; c < w; c += FA_VW) FA_V_STORE(panel + (int64_t)j * w + c, FA_V_ZERO());
        simd_pack_rows(&s, rows, nc, panel, w);
    }
}

/* x[j] = exp(x[j] - mx) for j < n, returns their sum (FA_VW partial sums, then the lanes'). */
static float FA_V_FN(exp_sum)(float *x, int n, float mx) {
    const FA_V vmx = FA_V_SET1(mx);
    FA_V sum = FA_V_ZERO();
    int j = 0;
    for (; j + FA_VW <= n; j += FA_VW) {
        const FA_V e = FA_V_EXP(FA_V_SUB(FA_V_LOAD(x + j), vmx));
        FA_V_STORE(x + j, e);
        sum = FA_V_ADD(sum, e);
    }
    if (j < n) {
        const FA_VM m = FA_V_TAIL(n - j);
        const FA_V e = FA_V_KEEP(m, FA_V_EXP(FA_V_SUB(FA_V_MLOAD(m, x + j), vmx)));
        FA_V_MSTORE(x + j, m, e);
        sum = FA_V_ADD(sum, e);
    }
    return FA_V_HSUM(sum);
}

#endif /* FA_CPU_ISA_F32_SIMD_H */
