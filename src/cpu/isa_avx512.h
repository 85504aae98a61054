/* Shared by the AVX-512 files (isa_avx512.c, isa_avx512bf16.c, isa_amx.c, decode_avx512bf16.c):
 * the vector exp (vexp.h's method), lane masks, the 16 x 16 transpose, and the f32 kernels
 * the bf16 tables reuse for f32 and f16 inputs. Include only from files compiled with
 * AVX-512 flags (static inline: each file compiles them with its own). */
#ifndef FA_CPU_ISA_AVX512_H
#define FA_CPU_ISA_AVX512_H

#include "isa.h"
#include "vexp.h"

#include <immintrin.h>
#include <string.h>

extern const fa_isa fa_isa_avx512;

int64_t fa_avx512_packed_bytes(int64_t rows, int64_t cols, fa_dtype t);
float fa_avx512_exp_sum(float *x, int n, float mx);
void fa_avx512_transpose(const float *x, int ld, int m, int n, float *tr);
/* gemm_pb over the first n of the rows keys that pack_b packed (the bf16 tables' f32 path,
 * with b_prefix: isa.h). */
void fa_avx512_gemm_pb_prefix(int m, int n, int rows, int cols, const float *p, int ldp, const void *b, float *o,
                              int ldo);
void fa_avx512_round_row(float *x, int n, fa_dtype t);
void fa_avx512_hide_row(float *x, const uint8_t *vis, int n);
void fa_avx512_scale_row(float *x, int n, float a);
void fa_avx512_store_bf16(uint16_t *dst, const float *x, float a, int n);

/* The part after the clamps: exp of xc in lanes under keep, 0 in the others. */
static inline __m512 fa_avx512_exp_kept(__m512 xc, __mmask16 keep) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(FA_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FA_EXP_LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FA_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(fa_exp_coef[0]);
#pragma GCC unroll 8
    for (int i = 1; i < FA_EXP_NCOEF; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(fa_exp_coef[i]));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* exp of 16 floats, as vexp.h computes it: x = n ln2 + r, |r| <= ln2/2 (ln2 split in a
 * short high part and a low part, so n ln2_hi is exact), the degree-7 Taylor polynomial of
 * exp(r) (truncation below 6e-9), then 2^n applied by vscalefps. Below ln(FLT_MIN) the
 * result is 0, as in vexp.h (exp(-inf) = 0; no subnormal p reaches the products), above
 * 88.73 it is +inf, and NaN stays NaN (the clamps return their second operand on NaN). */
static inline __m512 fa_avx512_exp(__m512 x) {
    const __m512 lo = _mm512_set1_ps(FA_EXP_LO);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= lo, or NaN */
    return fa_avx512_exp_kept(_mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(lo, x)), keep);
}

/* fa_avx512_exp(x) bit for bit for x <= 88 (the softmax's exponents are <= 0: the base is
 * the row max) or NaN, without the clamps: below ln(FLT_MIN), -inf included, the keep
 * mask still gives 0 whatever the arithmetic made of x, and NaN flows through as NaN. */
static inline __m512 fa_avx512_exp_nonpos(__m512 x) {
    return fa_avx512_exp_kept(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(FA_EXP_LO), _CMP_NLT_UQ));
}

/* Lane masks for the first n lanes (n clamped to [0, 16] / [0, 32]). */
static inline __mmask16 fa_mask16(int n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}
static inline __mmask32 fa_mask32(int n) {
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u);
}

/* Transposes the 16 x 16 block of 32-bit lanes r[0..15] (rows) in place into columns. */
static inline void fa_avx512_transpose16(__m512 r[16]) {
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        b[i] = _mm512_shuffle_ps(a[i], a[i + 2], 0x44);
        b[i + 1] = _mm512_shuffle_ps(a[i], a[i + 2], 0xEE);
        b[i + 2] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0x44);
        b[i + 3] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
    }
    /* b[4g + c], lane L: column 4L + c of rows 4g..4g+3 */
    for (int c = 0; c < 4; c++) {
        __m512 x = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), y = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xDD);
        __m512 z = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88), w = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(x, z, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(x, z, 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(y, w, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(y, w, 0xDD);
    }
}

#endif /* FA_CPU_ISA_AVX512_H */
