/* Products that a hidden key cannot poison (docs/nonfinite.md).
 *
 * o += P V (forward) and dQ += dS K (backward) weigh each key's row of V or K by p or dS,
 * which are exactly 0 for keys the query row cannot see. A product computes 0 * x for
 * those, and 0 * inf = 0 * NaN = NaN: garbage at a hidden key (a kv cache past its
 * length) would poison the row, differently for each tiling. So the drivers first check
 * the tile's source rows (fa_tile_nonfinite, one read of n x cols elements per tile, next
 * to the m x n x cols multiply-adds of the product); only a tile that holds inf or NaN
 * takes fa_gemm_pb_guarded, which sends the finite runs of keys through the ISA's own
 * packing and product and adds each non-finite key's row, element by element, only to
 * the query rows whose weight for it is not 0. */
#ifndef FA_CPU_GUARD_H
#define FA_CPU_GUARD_H

#include "isa.h"

#include <string.h>

/* 1 if element c of row r of the tile is inf or NaN (all exponent bits set). */
static inline int fa_elem_nonfinite(const fa_tile_src *src, int64_t r, int64_t c) {
    const int64_t at = r * src->row_stride + c * src->col_stride;
    if (src->dtype == FA_F32) {
        uint32_t u;
        memcpy(&u, (const float *)src->base + at, sizeof u);
        return (u & 0x7f800000u) == 0x7f800000u;
    }
    const uint16_t h = ((const uint16_t *)src->base)[at];
    return src->dtype == FA_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
}

/* 1 if row r of the tile (cols elements) holds inf or NaN. */
static inline int fa_row_nonfinite(const fa_tile_src *src, int64_t r, int cols) {
    int bad = 0;
    for (int c = 0; c < cols; c++) bad |= fa_elem_nonfinite(src, r, c);
    return bad;
}

/* 1 if the rows x cols tile holds inf or NaN. The contiguous cases take the running max of
 * |x|'s bits (non-finite: all exponent bits set, the largest magnitudes), which vectorizes. */
static inline int fa_tile_nonfinite(const fa_tile_src *src, int rows, int cols) {
    if (src->col_stride == 1 && src->dtype == FA_F32) {
        int32_t mx = 0;
        for (int r = 0; r < rows; r++) {
            const int32_t *x = (const int32_t *)((const float *)src->base + r * src->row_stride);
            for (int c = 0; c < cols; c++) {
                const int32_t a = x[c] & 0x7fffffff;
                mx = a > mx ? a : mx;
            }
        }
        return mx >= 0x7f800000;
    }
    if (src->col_stride == 1) {
        int16_t mx = 0;
        for (int r = 0; r < rows; r++) {
            const int16_t *x = (const int16_t *)src->base + r * src->row_stride;
            for (int c = 0; c < cols; c++) {
                const int16_t a = (int16_t)(x[c] & 0x7fff);
                mx = a > mx ? a : mx;
            }
        }
        return mx >= (src->dtype == FA_BF16 ? 0x7f80 : 0x7c00);
    }
    int bad = 0;
    for (int r = 0; r < rows; r++) bad |= fa_row_nonfinite(src, r, cols);
    return bad;
}

/* o[i*ldo + c] += sum_{j<n} p[i*ldp + j] B[j, c] for i < m, c < cols, B the tile at src,
 * where a key row j of B holding inf or NaN reaches only the rows i with p[i, j] != 0
 * (0 * NaN is never formed). buf: room for pack_b(n, cols). The finite runs keep the
 * ISA's product; the sums differ from one product over the tile only in their order. */
static inline void fa_gemm_pb_guarded(const fa_isa *isa, int m, int n, int cols, const float *p, int ldp,
                                      const fa_tile_src *src, void *buf, float *o, int ldo) {
    const size_t esz = fa_dtype_size(src->dtype);
    for (int j = 0; j < n;) {
        if (fa_row_nonfinite(src, j, cols)) {
            for (int i = 0; i < m; i++) {
                const float w = p[(int64_t)i * ldp + j];
                if (w == 0.0f) continue;
                for (int c = 0; c < cols; c++)
                    o[(int64_t)i * ldo + c] += w * fa_load(src->dtype, src->base, j * src->row_stride + c * src->col_stride);
            }
            j++;
            continue;
        }
        int e = j + 1;
        while (e < n && !fa_row_nonfinite(src, e, cols)) e++;
        fa_tile_src run = *src;
        run.base = (const char *)src->base + (size_t)(j * src->row_stride) * esz;
        isa->pack_b(&run, e - j, cols, buf);
        isa->gemm_pb(m, e - j, cols, p + j, ldp, buf, o, ldo);
        j = e;
    }
}

#endif /* FA_CPU_GUARD_H */
