/* Quantization of kv-cache rows (quantize.h; docs/caches.md, "Quantized caches"). */
#include "quantize.h"

#include <float.h>

#include "dtype.h"
#include "internal.h"

/* The rule must not depend on the caller's floating-point modes: XLA runs its custom calls
 * with denormals-are-zero and flush-to-zero set (and torch.set_flush_denormal sets them),
 * under which a subnormal amax read as 0 and its row got scale 1 and zero codes. So the
 * magnitudes are compared as bits (a finite float's magnitude orders as its bits do), and a
 * subnormal x is divided without a subnormal operand (quotient). A quotient that is itself
 * subnormal gives the same code either way: it rounds to a zero code of its sign. */
static uint32_t magnitude_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

/* x / scale, correctly rounded (scale normal and positive). A subnormal x = m 2^-149 gives
 * m / (scale 2^149): both exact (m < 2^23; scale below 2^-100 there), the same quotient; for a
 * scale of 2^-100 or more it is below 2^-26, a zero code, so 0 of x's sign. */
static float quotient(float x, float scale) {
    const uint32_t a = magnitude_bits(x);
    if (a >= 0x00800000u || a == 0) return x / scale;
    const float y = scale < 0x1p-100f ? (float)(int32_t)a / (scale * 0x1p126f * 0x1p23f) : 0.0f;
    return signbit(x) ? -y : y; /* the sign from the bits: a comparison would read 0 under the modes */
}

float fa_quantize_row(fa_dtype t, fa_dtype from, const void *x, int64_t n, uint8_t *codes, int64_t stride) {
    uint32_t most = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t a = magnitude_bits(fa_load(from, x, i));
        most = a > most ? a : most;
    }
    float amax;
    memcpy(&amax, &most, 4);
    /* 1 where amax is 0 (0 / 0 codes otherwise). FLT_MIN where amax / max is below it (or
     * flushed to 0): a subnormal quotient keeps too few bits, rounded far below amax / max,
     * and the codes then passed the clamp (up to 126 times the error bound at amax 2.7e-43);
     * x / FLT_MIN is exact and within +-max there. */
    const float q = amax / fa_quant_max(t), scale = !most ? 1.0f : q >= FLT_MIN ? q : FLT_MIN;
    for (int64_t i = 0; i < n; i++) {
        const float y = quotient(fa_load(from, x, i), scale); /* a division, not a reciprocal's product: the rule */
        codes[i * stride] = t == FA_INT8 ? (uint8_t)fa_f32_to_int8(y) : fa_f32_to_e4m3(y);
    }
    return scale;
}

fa_status fa_quantize_rows(fa_dtype to, fa_dtype from, const void *src, int64_t rows, int64_t width, void *codes,
                           float *scales) {
    if (!fa_dtype_quantized(to))
        return fa_error(FA_ERR_INVALID, "fa_quantize_rows: the code type must be int8 or fp8_e4m3, got %s",
                        fa_dtype_name(to));
    if (from != FA_F32 && from != FA_F16 && from != FA_BF16)
        return fa_error(FA_ERR_INVALID, "fa_quantize_rows: the source dtype must be f32, f16 or bf16, got %d", (int)from);
    if (rows < 0 || width < 0)
        return fa_error(FA_ERR_INVALID, "fa_quantize_rows: rows (%lld) and width (%lld) must be >= 0", (long long)rows,
                        (long long)width);
    if (!rows || !width) {
        for (int64_t r = 0; scales && r < rows; r++) scales[r] = 1.0f;
        return FA_OK;
    }
    if (!src || !codes || !scales)
        return fa_error(FA_ERR_NULL, "fa_quantize_rows: %s is NULL", !src ? "src" : !codes ? "codes" : "scales");
    int64_t total, bytes, scale_bytes;
    if (__builtin_mul_overflow(rows, width, &total) ||
        __builtin_mul_overflow(total, (int64_t)fa_dtype_size(from), &bytes) ||
        __builtin_mul_overflow(rows, (int64_t)sizeof(float), &scale_bytes))
        return fa_error(FA_ERR_OVERFLOW, "fa_quantize_rows: %lld x %lld %s elements (and their scales) overflow "
                        "int64 bytes", (long long)rows, (long long)width, fa_dtype_name(from));
    /* codes and scales are written while src is read, row by row: a buffer over another gives
     * codes of half-overwritten rows (and the fa_convert rule: buffers do not overlap) */
    const uintptr_t s0 = (uintptr_t)src, c0 = (uintptr_t)codes, k0 = (uintptr_t)scales;
    const uintptr_t s1 = s0 + (uintptr_t)bytes, c1 = c0 + (uintptr_t)total, k1 = k0 + (uintptr_t)scale_bytes;
    if ((c0 < s1 && s0 < c1) || (k0 < s1 && s0 < k1) || (k0 < c1 && c0 < k1))
        return fa_error(FA_ERR_INVALID, "fa_quantize_rows: %s share memory; src, codes and scales must not overlap",
                        c0 < s1 && s0 < c1 ? "codes and src" : k0 < s1 && s0 < k1 ? "scales and src" : "codes and scales");
    for (int64_t i = 0; i < total; i++) /* every element first: on error nothing is written */
        if (!isfinite(fa_load(from, src, i)))
            return fa_error(FA_ERR_INVALID,
                            "fa_quantize_rows: element %lld (row %lld) is not finite; an %s cache cannot hold it",
                            (long long)(i % width), (long long)(i / width), fa_dtype_name(to));
    for (int64_t r = 0; r < rows; r++)
        scales[r] = fa_quantize_row(to, from, (const char *)src + r * width * (int64_t)fa_dtype_size(from), width,
                                    (uint8_t *)codes + r * width, 1);
    return FA_OK;
}
