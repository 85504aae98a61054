/* The element conversions every path shares: f32 to bf16 and f16 round to nearest, ties to
 * even (docs/semantics.md, "Rounding"), and back exactly. Inline where the kernels' scalar
 * edges call them per element; fa_convert (flashattn.h, dtype.c) is the public form. */
#ifndef FA_DTYPE_H
#define FA_DTYPE_H

#include "flashattn.h"

#include <stdint.h>

static inline float fa_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t fa_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
float fa_f16_to_f32(uint16_t h);
uint16_t fa_f32_to_f16(float f);

/* Reads element idx of a q/k/v-like tensor of dtype t as f32. */
static inline float fa_load(fa_dtype t, const void *base, int64_t idx) {
    if (t == FA_F32) return ((const float *)base)[idx];
    if (t == FA_BF16) return fa_bf16_to_f32(((const uint16_t *)base)[idx]);
    return fa_f16_to_f32(((const uint16_t *)base)[idx]);
}
static inline void fa_store(fa_dtype t, void *base, int64_t idx, float x) {
    if (t == FA_F32) ((float *)base)[idx] = x;
    else if (t == FA_BF16) ((uint16_t *)base)[idx] = fa_f32_to_bf16(x);
    else ((uint16_t *)base)[idx] = fa_f32_to_f16(x);
}
/* x rounded to dtype t and back (p before the second product: docs/semantics.md, "Rounding"). */
static inline float fa_round_to(fa_dtype t, float x) {
    if (t == FA_BF16) return fa_bf16_to_f32(fa_f32_to_bf16(x));
    if (t == FA_F16) return fa_f16_to_f32(fa_f32_to_f16(x));
    return x;
}

#endif /* FA_DTYPE_H */
