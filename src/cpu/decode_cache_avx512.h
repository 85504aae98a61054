/* The element conversions and per-tile helpers that the AVX-512 and AMX decode kernels over
 * f16, int8 and fp8 caches share (decode_cache_avx512.c, decode_cache_amx.c): included
 * only by files built for AVX-512F, BW, DQ and F16C. */
#ifndef FA_CPU_DECODE_CACHE_AVX512_H
#define FA_CPU_DECODE_CACHE_AVX512_H

#include "decode_kernels.h"
#include "isa_avx512.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
/* The kernels are instantiated once per element type (the type a constant: no branch or
 * size lookup in the loops). */
/* Bytes of one element of a cache of type t (f16, bf16, int8, fp8), and element i of a row. */
INLINE int64_t elem_bytes(fa_dtype t) { return t == FA_F16 || t == FA_BF16 ? 2 : 1; }
INLINE const void *at(fa_dtype t, const void *base, int64_t i) { return (const char *)base + i * elem_bytes(t); }
/* 16 elements (mask: the live ones) of row x as f32: the value (f16, bf16: its bits moved
 * up 16), the code (int8), or 2^-8 of it (fp8: unit() undoes it in the scale). */
INLINE __m512 load16(fa_dtype t, const void *x, __mmask16 mask) {
    if (t == FA_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, x));
    if (t == FA_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x)), 16));
    const __m128i b = _mm_maskz_loadu_epi8(mask, x);
    if (t == FA_INT8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                _mm256_slli_epi16(mag, 7)); /* sign, then exponent and mantissa: e4m3 x 2^-8 as f16 */
    h = _mm256_mask_mov_epi16(h, _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7e00));
    return _mm512_cvtph_ps(h);
}
/* 32 whole elements of row x as two halves (as load16): fp8 converts all 32 at once, at
 * 512 bits: words w = code, h = w << 7 puts the sign at bit 14 and exponent and mantissa at
 * bits 7..13; h + (h & 0x4000) moves the sign to bit 15, which is sign << 15 | mag << 7,
 * the e4m3 value times 2^-8 as an f16 bit for bit (subnormals too); the NaN codes (mag
 * 0x7f) become an f16 NaN. */
INLINE void load32(fa_dtype t, const void *x, __m512 *lo, __m512 *hi) {
    if (t != FA_FP8_E4M3) {
        *lo = load16(t, x, 0xffff), *hi = load16(t, at(t, x, 16), 0xffff);
        return;
    }
    const __m512i h = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)x)), 7);
    const __m512i bit14 = _mm512_set1_epi16(0x4000);
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_or_si512(h, bit14), _mm512_set1_epi16(0x7f80));
    const __m512i f = _mm512_mask_add_epi16(_mm512_set1_epi16(0x7e00), ~nan, h, _mm512_and_si512(h, bit14));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(f)), *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f, 1));
}
/* The steps' faster fp8 form (decode_cache_avx512.c): 16 codes as f32 of the value times
 * 2^-8, as load16 gives them, for rows fp8_exact_row says hold no code it gets wrong. The
 * byte sign-extended to a dword and shifted left 20 puts the mantissa at bits 20..22, the
 * exponent at 23..26 and copies of the sign at 27..31; & 0x87f00000 | 0x38000000 keeps the
 * sign at 31 and adds 112 to the exponent: exact for every code whose exponent is not 0
 * and that is not NaN (lanes outside mask 0). */
INLINE __m512 fp8_fast16(const void *x, __mmask16 mask) {
    const __m512i d = _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, x)), 20);
    return _mm512_castsi512_ps(_mm512_maskz_ternarylogic_epi32(mask, d, _mm512_set1_epi32((int)0x87f00000u),
                                                               _mm512_set1_epi32(0x38000000), 0xea));
}
/* Whether fp8_fast16 is exact on all n codes at x: none has a magnitude of 0..14 or 0x7f
 * (((x + 1) & 0x70) == 0 there: the zeros, subnormals and NaNs, and the 7 smallest
 * normals, which the other route takes too). */
INLINE int fp8_fast_row(const void *x, int n) {
    const __m512i one = _mm512_set1_epi8(1), bits = _mm512_set1_epi8(0x70);
    __mmask64 odd = 0;
    for (int c = 0; c < n; c += 64) {
        const __mmask64 m = n - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - c)) - 1;
        odd |= _mm512_mask_testn_epi8_mask(m, _mm512_add_epi8(_mm512_maskz_loadu_epi8(m, (const char *)x + c), one), bits);
    }
    return !odd;
}
INLINE float unit(fa_dtype t) { return t == FA_FP8_E4M3 ? 256.0f : 1.0f; }

/* The scales of the tile's n rows (stride apart; NULL: 1) times unit, contiguous in out,
 * padded with unit to a multiple of 16. Gathered in vectors and stored whole: a block's four
 * read back from scalar stores would wait on store forwarding (measured: an eighth of the
 * int8 tile's time). */
INLINE void tile_scales(const float *sc, int64_t stride, int n, float u, float *out) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)stride));
    const __m512 vu = _mm512_set1_ps(u);
    for (int j = 0; j < n; j += 16) {
        const __m512 one = _mm512_set1_ps(1.0f);
        const __m512 x = sc ? _mm512_mask_i32gather_ps(one, fa_mask16(n - j), idx, sc + (int64_t)j * stride, 4) : one;
        _mm512_storeu_ps(out + j, _mm512_mul_ps(x, vu));
    }
}
#define SCALES_MAX (FA_DECODE_MAX_TILE + 16)

/* x rounded to dtype t and back, nearest even (vexp.h's rule; x is finite here, in [0, 1]). */
INLINE __m512 round_to(__m512 x, fa_dtype t) {
    if (t == FA_F16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (t != FA_BF16) return x;
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

#endif
