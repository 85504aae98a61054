/* The quantized kv-cache element types (docs/caches.md): int8 codes and OCP fp8 e4m3fn codes,
 * each with one f32 scale per (cache row, kv head). The exact rounding rules live here, once:
 * fa_quantize_rows (public), the decode append (cpu/decode.c) and fa_convert use them. */
#ifndef FA_QUANTIZE_H
#define FA_QUANTIZE_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The cache's element type of problem p (its dtype unless has_cache_dtype says otherwise). */
static inline fa_dtype fa_cache_dtype(const fa_problem *p) { return p->has_cache_dtype ? p->cache_dtype : p->dtype; }
static inline int fa_dtype_quantized(fa_dtype t) { return t == FA_INT8 || t == FA_FP8_E4M3; }

/* The largest code magnitude: scale = amax / this. */
static inline float fa_quant_max(fa_dtype t) { return t == FA_INT8 ? 127.0f : 448.0f; }

/* int8 code of x (already divided by the scale): nearest, ties to even, clamped to +-127;
 * NaN gives 0 (fa_convert only: the quantizer refuses non-finite rows). */
static inline int8_t fa_f32_to_int8(float x) {
    if (!(x == x)) return 0;
    const float r = nearbyintf(x); /* the default rounding mode: to nearest, ties to even */
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
}

/* e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinity, S.1111.111 is
 * NaN; largest 448): nearest, ties to even, saturated to +-448; NaN gives 0x7f. */
static inline uint8_t fa_f32_to_e4m3(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448, inf included */
    if (a < 0x3c800000u) /* below 2^-6, the smallest normal: multiples of 2^-9 (8 rounds up to 0x08, 2^-6) */
        return (uint8_t)(sign | (uint8_t)nearbyintf(fabsf(x) * 512.0f));
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20; /* 3 mantissa bits left, ties to even */
    r -= 120u << 3;                                        /* exponent bias 127 -> 7 */
    return (uint8_t)(sign | (r > 0x7eu ? 0x7eu : r));      /* rounding up past 448 saturates */
}

static inline float fa_e4m3_to_f32(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return c & 0x80 ? -v : v;
}

/* Element i of a code row of type t, as a float (the scale not applied). */
static inline float fa_code_to_f32(fa_dtype t, const void *codes, int64_t i) {
    if (t == FA_INT8) return (float)((const int8_t *)codes)[i];
    return fa_e4m3_to_f32(((const uint8_t *)codes)[i]);
}

/* Quantizes one row x[0..n) (finite; dtype from, contiguous) into codes of type t, code i
 * at codes + i * stride (bytes); returns the row's scale. */
float fa_quantize_row(fa_dtype t, fa_dtype from, const void *x, int64_t n, uint8_t *codes, int64_t stride);

#endif /* FA_QUANTIZE_H */
