/* f16 <-> f32 conversion in portable C (round to nearest, ties to even), fa_convert, and
 * dtype names and sizes. */
#include "dtype.h"

#include "internal.h" /* fa_error */
#include "quantize.h"

#include <string.h>

float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf or NaN */
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fa_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;          /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                /* below 2^-14: subnormal or 0 */
        if (a < 0x33000000u) return sign;                 /* below half the smallest: 0 */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* value / 2^-24 = man * 2^(exp - 126) */
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = ((a >> 13) - ((127 - 15) << 10));
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return sign | (uint16_t)r;
}

const char *fa_dtype_name(fa_dtype t) {
    switch (t) {
    case FA_F32: return "f32";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    case FA_INT8: return "int8";
    case FA_FP8_E4M3: return "fp8_e4m3";
    }
    return "unknown";
}

/* 0 for a value outside fa_dtype: no size to multiply by (fa_convert refuses it) */
size_t fa_dtype_size(fa_dtype t) {
    switch (t) {
    case FA_F32: return 4;
    case FA_F16:
    case FA_BF16: return 2;
    case FA_INT8:
    case FA_FP8_E4M3: return 1;
    }
    return 0;
}

/* No status to return (the signature predates it): a bad argument writes nothing and
 * leaves its message in fa_last_error(). A good call leaves the message alone, since
 * callers convert between a failed call and reading its message (the tests' chk_load). */
void fa_convert(fa_dtype from, const void *src, fa_dtype to, void *dst, size_t n) {
    if (!fa_dtype_size(from) || !fa_dtype_size(to)) {
        const int bad = fa_dtype_size(from) ? (int)to : (int)from;
        fa_error(FA_ERR_INVALID, "fa_convert: %s dtype %d is not f32, f16, bf16, int8 or fp8_e4m3",
                 fa_dtype_size(from) ? "the destination" : "the source", bad);
        return;
    }
    if (n && (!src || !dst)) {
        fa_error(FA_ERR_NULL, "fa_convert: %s is NULL (n = %zu)", !src ? "src" : "dst", n);
        return;
    }
    size_t sb, db; /* the buffers' bytes: they must not meet (an element read after one written) */
    if (__builtin_mul_overflow(n, fa_dtype_size(from), &sb) || __builtin_mul_overflow(n, fa_dtype_size(to), &db)) {
        fa_error(FA_ERR_OVERFLOW, "fa_convert: n = %zu elements overflow size_t bytes", n);
        return;
    }
    if (n && (uintptr_t)dst < (uintptr_t)src + sb && (uintptr_t)src < (uintptr_t)dst + db) {
        fa_error(FA_ERR_INVALID, "fa_convert: src and dst share memory (they must not overlap); nothing converted");
        return;
    }
    if (from == to) {
        if (n) memcpy(dst, src, n * fa_dtype_size(from));
        return;
    }
    for (size_t i = 0; i < n; i++) { /* codes convert with scale 1 */
        const float x = fa_dtype_quantized(from) ? fa_code_to_f32(from, src, (int64_t)i) : fa_load(from, src, (int64_t)i);
        if (to == FA_INT8) ((int8_t *)dst)[i] = fa_f32_to_int8(x);
        else if (to == FA_FP8_E4M3) ((uint8_t *)dst)[i] = fa_f32_to_e4m3(x);
        else fa_store(to, dst, (int64_t)i, x);
    }
}
