/* An independent quantizer for the tests, written from docs/caches.md ("The quantization
 * rule"), never from the library's code: int8 rounds half to even by floor; fp8 e4m3fn takes
 * the nearest of the 127 magnitudes by search, ties to the even code. Used by
 * test_quantize.c, test_decode_quant.c and test_decode_fp16.c. */
#ifndef FA_TESTS_QUANT_REF_H
#define FA_TESTS_QUANT_REF_H

#include "flashattn.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static inline double e4m3_magnitude(int c) { /* c < 0x7f */
    const int e = c >> 3, m = c & 7;
    return e ? (8 + m) * ldexp(1.0, e - 10) : m * ldexp(1.0, -9);
}
static inline uint8_t ind_e4m3(float y) {
    const double a = fabs((double)y);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(e4m3_magnitude(c) - a), db = fabs(e4m3_magnitude(best) - a);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    if (a >= 448.0) best = 0x7e;
    return (uint8_t)((signbit(y) ? 0x80 : 0) | best); /* -0 keeps its sign: 0x80, as ml_dtypes gives */
}
static inline int8_t ind_int8(float y) {
    double f = floor((double)y), r = (double)y - f;
    double q = r > 0.5 ? f + 1 : r < 0.5 ? f : (fmod(f, 2.0) == 0 ? f : f + 1);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}
static inline double ind_value(fa_dtype t, uint8_t c) {
    if (t == FA_INT8) return (double)(int8_t)c;
    return (c & 0x80 ? -1.0 : 1.0) * e4m3_magnitude(c & 0x7f);
}
/* One row's codes and scale (scale = amax / 127 or / 448 in f32; 1 where that is 0: amax 0, or
 * small enough to underflow; y = x / scale in f32). */
static inline float ind_quant(fa_dtype t, const float *x, int64_t n, uint8_t *codes) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float q = amax / (t == FA_INT8 ? 127.0f : 448.0f);
    const float scale = amax == 0.0f ? 1.0f : q < FLT_MIN ? FLT_MIN : q; /* docs/caches.md */
    for (int64_t i = 0; i < n; i++) {
        const float y = x[i] / scale;
        codes[i] = t == FA_INT8 ? (uint8_t)ind_int8(y) : ind_e4m3(y);
    }
    return scale;
}

#endif
