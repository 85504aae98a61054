/* Packing helpers of every ISA file: a tile's sub-tile, and the portable copy of any dtype
 * to f32 that the scalar table packs with and the vector tables take for strided sources
 * (their vector loads need contiguous rows). Plain C, static inline: each ISA file compiles
 * them with its own flags. */
#ifndef FA_CPU_ISA_PACK_H
#define FA_CPU_ISA_PACK_H

#include "isa.h"

static inline int64_t fa_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The tile of src that starts at its element (r, c). */
static inline fa_tile_src fa_tile_at(const fa_tile_src *src, int64_t r, int64_t c) {
    fa_tile_src s = *src;
    s.base = (const char *)src->base + (size_t)(r * src->row_stride + c * src->col_stride) * fa_dtype_size(src->dtype);
    return s;
}

/* dst[r * drs + c * dcs] = src[r, c] as f32 for r < rows, c < cols; the dtype switch sits
 * outside the loops, so that each loop vectorizes. */
static inline void fa_pack_f32(const fa_tile_src *src, int rows, int cols, float *restrict dst, int64_t drs,
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
    default: /* cache codes (int8, fp8) are dequantized by decode_cache.c, never packed */
        break;
    }
}

#endif /* FA_CPU_ISA_PACK_H */
