/* Products that a hidden key cannot poison (docs/nonfinite.md).
 *
 * o += P V (forward) and dQ += dS K (backward) weigh each key's row of V or K by p or dS,
 * which are exactly 0 for keys the query row cannot see. A product computes 0 * x for
 * those, and 0 * inf = 0 * NaN = NaN: garbage at a hidden key (a kv cache past its
 * length) would poison the row, differently for each tiling. Only tiles where a key can be
 * hidden from a row need care (fa_tile_may_hide: a mask edge crosses the tile, or a bias or
 * segment ids may hide keys anywhere); the drivers check those tiles' source rows
 * (fa_tile_nonfinite, one read of n x cols elements, next to the m x n x cols multiply-adds
 * of the product), and only a tile that holds inf or NaN takes fa_gemm_pb_guarded, which sends the finite runs of keys through the ISA's own
 * packing and product and adds each non-finite key's row, element by element, only to
 * the query rows whose weight for it is not 0. */
#ifndef FA_CPU_GUARD_H
#define FA_CPU_GUARD_H

#include "isa.h"
#include "isa_pack.h"

#include <string.h>

/* 1 unless every key of [j0, j0 + n) is visible to every row of [r0, r1) by the masks and
 * no bias or segment ids can hide one. In such a tile a non-finite k or v reaches rows that
 * see it, as it should; the one exception, a score of exactly -inf made by the product
 * itself (inf in q or k, or its f32 overflow), is stated in docs/nonfinite.md. Visible keys
 * form [lo(i), hi(i)], both growing with i (internal.h): the last row's lo and the first
 * row's hi bound the tile. */
static inline int fa_tile_may_hide(const struct fa_plan *pl, int64_t r0, int64_t r1, int64_t j0, int n) {
    if (pl->p.has_bias || pl->p.has_segment_ids || pl->p.mask) return 1; /* a mask: any tile may hide keys */
    return fa_key_lo(pl, r1 - 1) > j0 || fa_key_hi(pl, r0) < j0 + n - 1;
}

/* fa_tile_may_hide for a pair whose kind (fa_plan_tile_kind: the mask's blocks ANDed with
 * causal and window) the driver has at hand: under a mask, only a pair that is not full
 * may hide a key. */
static inline int fa_pair_may_hide(const struct fa_plan *pl, int kind, int64_t r0, int64_t r1, int64_t j0, int n) {
    if (pl->p.mask && !pl->p.has_bias && !pl->p.has_segment_ids) return kind != FA_TILE_FULL;
    return fa_tile_may_hide(pl, r0, r1, j0, n);
}

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

/* 1 if the rows x cols tile holds inf or NaN. The contiguous cases keep running maxima of
 * |x|'s bits (non-finite: all exponent bits set, the largest magnitudes) in lanes that
 * live across rows, so that the loop vectorizes with no reduction per row (as forward.c's
 * row_max: the lane loop must stay a loop). */
static inline int fa_tile_nonfinite(const fa_tile_src *src, int rows, int cols) {
    if (src->col_stride == 1 && src->dtype == FA_F32) {
        int32_t lane[8] = {0, 0, 0, 0, 0, 0, 0, 0}, mx = 0;
        for (int r = 0; r < rows; r++) {
            const int32_t *x = (const int32_t *)((const float *)src->base + r * src->row_stride);
            int c = 0;
            for (; c + 8 <= cols; c += 8)
#pragma GCC unroll 1
                for (int l = 0; l < 8; l++) {
                    const int32_t a = x[c + l] & 0x7fffffff;
                    lane[l] = a > lane[l] ? a : lane[l];
                }
            for (; c < cols; c++) mx = (x[c] & 0x7fffffff) > mx ? (x[c] & 0x7fffffff) : mx;
        }
        for (int l = 0; l < 8; l++) mx = lane[l] > mx ? lane[l] : mx;
        return mx >= 0x7f800000;
    }
    if (src->col_stride == 1) {
        int16_t lane[16] = {0}, mx = 0;
        for (int r = 0; r < rows; r++) {
            const int16_t *x = (const int16_t *)src->base + r * src->row_stride;
            int c = 0;
            for (; c + 16 <= cols; c += 16)
#pragma GCC unroll 1
                for (int l = 0; l < 16; l++) {
                    const int16_t a = (int16_t)(x[c + l] & 0x7fff);
                    lane[l] = a > lane[l] ? a : lane[l];
                }
            for (; c < cols; c++) {
                const int16_t a = (int16_t)(x[c] & 0x7fff);
                mx = a > mx ? a : mx;
            }
        }
        for (int l = 0; l < 16; l++) mx = lane[l] > mx ? lane[l] : mx;
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
        const fa_tile_src run = fa_tile_at(src, j, 0);
        isa->pack_b(&run, e - j, cols, buf);
        isa->gemm_pb(m, e - j, cols, p + j, ldp, buf, o, ldo);
        j = e;
    }
}

#endif /* FA_CPU_GUARD_H */
