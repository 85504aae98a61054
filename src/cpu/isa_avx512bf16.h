/* Shared by the two bf16 tables (isa_avx512bf16.c: vdpbf16ps, isa_amx.c: tile products):
 * the packed buffer's format header, the f32 path both take for f32 and f16 problems, and
 * the bf16 loads, pairings and conversions of their packing. Include only from files
 * compiled with AVX512_BF16 flags (static inline: each file compiles them with its own). */
#ifndef FA_CPU_ISA_AVX512BF16_H
#define FA_CPU_ISA_AVX512BF16_H

#include "isa_avx512.h"

#include <immintrin.h>
#include <string.h>

/* Packed buffers start with a 64-byte header naming their format, so one table can hold
 * f32 (for f32/f16 problems: f16 values are not all bf16 values) or its own bf16 layout,
 * and the products know which they were given; and the rows packed, so that gemm_pb can
 * take a prefix of a packed v (isa.h, b_prefix): its panels are laid out by them. */
#define FA_PACK_HDR 64
#define FA_PACK_F32 1u /* the payload is fa_isa_avx512's f32 layout */
static inline uint32_t fa_pack_fmt(const void *packed) {
    uint32_t f;
    memcpy(&f, packed, sizeof f);
    return f;
}
static inline void fa_pack_set_fmt(void *packed, uint32_t f) { memcpy(packed, &f, sizeof f); }
static inline int fa_pack_rows(const void *packed) {
    int r;
    memcpy(&r, (const char *)packed + 4, sizeof r);
    return r;
}
static inline void fa_pack_set_rows(void *packed, int r) { memcpy((char *)packed + 4, &r, sizeof r); }
static inline void *fa_pack_payload(void *packed) { return (char *)packed + FA_PACK_HDR; }
static inline const void *fa_pack_cpayload(const void *packed) { return (const char *)packed + FA_PACK_HDR; }

/* The start of every pack: a source that is not bf16 is packed by `f32_pack` (one of
 * fa_isa_avx512's) as FA_PACK_F32, and 1 is returned; a bf16 one marks dst as `fmt`, the
 * table's bf16 layout that the caller then writes, and 0 is returned. */
static inline int fa_pack_f32_unless_bf16(void (*f32_pack)(const fa_tile_src *, int, int, void *),
                                          const fa_tile_src *src, int rows, int cols, void *dst, uint32_t fmt) {
    fa_pack_set_rows(dst, rows);
    if (src->dtype != FA_BF16) {
        fa_pack_set_fmt(dst, FA_PACK_F32);
        f32_pack(src, rows, cols, fa_pack_payload(dst));
        return 1;
    }
    fa_pack_set_fmt(dst, fmt);
    return 0;
}

/* isa.h's max_row and exp_pairs at AVX512_BF16 width (isa_avx512bf16.c), for both bf16
 * tables: their pairs are row-major bf16 p, which either product reads as it is. */
float fa_bf16_max_row(const float *x, int n);
float fa_bf16_exp_pairs(float *x, int n, float scale, float base);

/* The start of every product: operands packed as FA_PACK_F32 go to fa_isa_avx512's
 * product (1 is returned), others stay with the caller (0). */
static inline int fa_gemm_abt_f32(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_pack_fmt(a) != FA_PACK_F32) return 0;
    fa_isa_avx512.gemm_abt(m, n, k, fa_pack_cpayload(a), fa_pack_cpayload(bt), s, lds);
    return 1;
}
/* gemm_abt_rows (isa.h) for packs of f32 (f32 and f16 problems): a slice of 32 rows at a time
 * through avx512's product, whose packed q is row-major (isa_f32_simd.h). 0: not f32 packs. */
static inline int fa_gemm_abt_rows_f32(int m, const int *ns, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_pack_fmt(a) != FA_PACK_F32) return 0;
    for (int i0 = 0; i0 < m; i0 += 32)
        if (ns[i0 / 32])
            fa_isa_avx512.gemm_abt(m - i0 < 32 ? m - i0 : 32, ns[i0 / 32], k,
                                   (const float *)fa_pack_cpayload(a) + (int64_t)i0 * k, fa_pack_cpayload(bt),
                                   s + (int64_t)i0 * lds, lds);
    return 1;
}
static inline int fa_gemm_pb_f32(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    if (fa_pack_fmt(b) != FA_PACK_F32) return 0;
    fa_avx512_gemm_pb_prefix(m, n, fa_pack_rows(b), cols, p, ldp, fa_pack_cpayload(b), o, ldo);
    return 1;
}

/* 32 bf16 values of row r of a bf16 tile from column c, as raw bits: those below column
 * c + nc, zeros after (all zeros if nc <= 0). */
static inline __m512i fa_bf16_load32(const fa_tile_src *s, int r, int c, int nc) {
    if (nc <= 0) return _mm512_setzero_si512();
    if (s->col_stride == 1)
        return _mm512_maskz_loadu_epi16(fa_mask32(nc), (const uint16_t *)s->base + r * s->row_stride + c);
    uint16_t tmp[32] = {0};
    for (int e = 0; e < nc && e < 32; e++)
        tmp[e] = ((const uint16_t *)s->base)[r * s->row_stride + (int64_t)(c + e) * s->col_stride];
    return _mm512_loadu_si512(tmp);
}

/* Keys j0 .. j0 + 15 of a bf16 K tile (zeros from key `rows` on), 32 head dims from
 * column c (nc valid) each: r[j] holds 16 pairs of key j0 + j, ready for
 * fa_avx512_transpose16. The same columns 32 keys ahead are prefetched: 16 row streams
 * defeat the hardware prefetcher when K comes from L3. */
static inline void fa_bf16_load_keys16(const fa_tile_src *s, int j0, int rows, int c, int nc, __m512 r[16]) {
    for (int j = 0; j < 16; j++) {
        if (j0 + j >= rows) {
            r[j] = _mm512_setzero_ps();
            continue;
        }
        if (s->col_stride == 1 && j0 + 32 + j < rows)
            _mm_prefetch((const char *)((const uint16_t *)s->base + (j0 + 32 + j) * s->row_stride + c), _MM_HINT_T0);
        r[j] = _mm512_castsi512_ps(fa_bf16_load32(s, j0 + j, c, nc));
    }
}

/* vpermt2w indices that pair two rows a and b (element i of a is index i, of b 32 + i):
 * word i of the result is (a[i], b[i]) for [0], (a[16 + i], b[16 + i]) for [1]. */
static const uint16_t fa_bf16_pair_idx[2][32] = {
    {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
    {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};

/* Rows j and j + 1 of a bf16 V tile (zeros from row `rows` on), 32 columns from c (zeros
 * from column `cols` on), as pairs of keys: word i of *lo holds (V[j][c + i],
 * V[j + 1][c + i]) (low, high 16 bits), word i of *hi the same for column c + 16 + i. */
static inline void fa_bf16_pair_rows(const fa_tile_src *s, int j, int rows, int c, int cols, __m512i *lo,
                                     __m512i *hi) {
    const __m512i a = j < rows ? fa_bf16_load32(s, j, c, cols - c) : _mm512_setzero_si512();
    const __m512i b = j + 1 < rows ? fa_bf16_load32(s, j + 1, c, cols - c) : _mm512_setzero_si512();
    *lo = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(fa_bf16_pair_idx[0]), b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(fa_bf16_pair_idx[1]), b);
}

/* Floats x[0 .. 32) rounded to bf16 (to nearest even; those from x[t] on read as 0), as
 * 16 pairs (x[2i], x[2i + 1]). Exact for the products' p, already rounded to bf16. */
static inline __m512i fa_bf16_pairs32(const float *x, int t) {
    if (t >= 32) return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    const __m512 lo = _mm512_maskz_loadu_ps(fa_mask16(t), x);
    const __m512 hi = t > 16 ? _mm512_maskz_loadu_ps(fa_mask16(t - 16), x + 16) : _mm512_setzero_ps();
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

#endif /* FA_CPU_ISA_AVX512BF16_H */
