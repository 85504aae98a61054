/* Branch-free f32 helpers that compilers vectorize: no libm call, only arithmetic, integer
 * conversion and selects, so a loop of calls becomes SIMD code at -O3 on any target (SSE2
 * included). Used by the scalar microkernels, the drivers and any ISA file that wants the
 * same numbers. (They rely on IEEE arithmetic: not for -ffast-math builds.)
 *
 * fa_vexpf: exp. fa_vround_f16, fa_vround_bf16: x rounded to f16 / bf16 and back.
 *
 * Method: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split in a high
 * part with few bits and a low part, so n * ln2_hi is exact); exp(r) by its Taylor
 * polynomial of degree 7 (truncation below 6e-9 on that interval); 2^n built directly in
 * the exponent bits. Relative error about 1e-7 (a couple of ulps).
 *
 * Domain: exp(-inf) = 0 and every x below ln(FLT_MIN) gives 0 (the true value is below
 * 1.2e-38); x above 88 gives +inf (the true value is within a factor 2 of FLT_MAX there;
 * the kernels only call it with x <= 0); NaN gives NaN. */
#ifndef FA_CPU_VEXP_H
#define FA_CPU_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The method's constants, shared with the vector versions (isa_avx2.c, isa_avx512.h) so
 * that every ISA computes the same numbers. */
#define FA_EXP_LO (-87.33654f)          /* ln(FLT_MIN): 2^n stays a normal number above it */
#define FA_EXP_HI 88.0f                 /* keeps n <= 127 */
#define FA_EXP_LOG2E 1.44269504088896341f
#define FA_EXP_LN2_HI 0.693359375f      /* 355/512: n * ln2_hi is exact for |n| < 2^15 */
#define FA_EXP_LN2_LO (-2.12194440e-4f) /* ln2 - ln2_hi */
/* exp(r) = 1 + r + r^2/2 + ... + r^7/7!, in Horner order: p = c[0]; p = p r + c[i]. */
#define FA_EXP_NCOEF 8
static const float fa_exp_coef[FA_EXP_NCOEF] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                                 1.0f / 6.0f,    0.5f,           1.0f,           1.0f};

static inline float fa_vexpf(float x) {
    const float lo = FA_EXP_LO, hi = FA_EXP_HI;
    const float round_magic = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */

    float xc = x >= lo ? x : lo; /* NaN too: keeps the integer conversion defined */
    xc = xc > hi ? hi : xc;
    float n = (xc * FA_EXP_LOG2E + round_magic) - round_magic;
    float r = xc - n * FA_EXP_LN2_HI;
    r = r - n * FA_EXP_LN2_LO;
    float p = fa_exp_coef[0];
#pragma GCC unroll 8
    for (int i = 1; i < FA_EXP_NCOEF; i++) p = p * r + fa_exp_coef[i];
    int32_t e = (int32_t)n + 127; /* in [1, 254] after the clamps */
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    y = x == x ? y : x; /* NaN in, NaN out */
    return y;
}

/* x rounded to f16 and back (round to nearest, ties to even): equal to
 * fa_round_to(FA_F16, x) for every x, without its out-of-line calls. Normal f16 range:
 * round the f32 mantissa to 10 bits in the integer domain (the carry may step the
 * exponent, as it should); below 2^-14 (f16 subnormals, spacing 2^-24): adding and
 * removing 0.5 rounds to a multiple of 2^-24 in f32 arithmetic; from 65520 up: inf. */
static inline float fa_vround_f16(float x) {
    uint32_t u, a, r, rs;
    memcpy(&u, &x, sizeof u);
    a = u & 0x7fffffffu;
    float ax, sub;
    memcpy(&ax, &a, sizeof ax);
    sub = (ax + 0.5f) - 0.5f;
    memcpy(&rs, &sub, sizeof rs);
    r = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
    r = a < 0x38800000u ? rs : r;
    r = a >= 0x477ff000u ? 0x7f800000u : r;
    r = a > 0x7f800000u ? (a | 0x00400000u) : r; /* NaN: quiet NaN */
    r |= u & 0x80000000u;
    float y;
    memcpy(&y, &r, sizeof y);
    return y;
}

/* x rounded to bf16 and back (round to nearest, ties to even): equal to
 * fa_round_to(FA_BF16, x) for every x (its bits >> 16 are fa_f32_to_bf16(x)), without the
 * early return for NaN that keeps that one from vectorizing. Adding 0x7fff plus the lowest
 * kept bit rounds the low 16 bits away in the integer domain (the carry may step the
 * exponent, up to inf, as it should); NaN becomes a quiet NaN instead, so that the carry
 * can never turn it into inf. */
static inline float fa_vround_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : r;
    float y;
    memcpy(&y, &r, sizeof y);
    return y;
}

#endif /* FA_CPU_VEXP_H */
