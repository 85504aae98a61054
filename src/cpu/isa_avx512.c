/* AVX-512 microkernels in f32 (fa_isa_avx512): any input dtype is packed to f32.
 *
 * Packing and exp_sum are isa_f32_simd.h's at 16 lanes: K^T in panels of 32 keys, V in
 * panels of 64 columns (w = min(64, c - 64p rounded up to 16)).
 *
 * Both products are the register-blocked kernel of isa_avx512_gemm.h with an f32 per word
 * (gemm_abt 12 query rows x 32 keys, gemm_pb 6 rows x 64 value columns).
 *
 * exp_sum uses the polynomial of vexp.h (degree-7 Taylor on |r| <= ln2/2), 16 lanes at a
 * time, so the numbers match the scalar kernels to an ulp or two. */
#include "isa_avx512.h"

#include <immintrin.h>
#include <string.h>

#define FA_AVX512_DOT(acc, a, b) _mm512_fmadd_ps(a, b, acc)
#include "isa_avx512_gemm.h"

/* 16 (or the `mask` lanes) contiguous elements of dtype t at p as f32. */
static inline __m512 load16(fa_dtype t, const void *p, __mmask16 mask) {
    switch (t) {
    case FA_F32:
        return _mm512_maskz_loadu_ps(mask, p);
    case FA_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
    default:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
    }
}

/* The vector traits of isa_f32_simd.h: 16 lanes, masks in k registers. */
#define FA_V_FN(name) avx512_##name
#define FA_V_PANEL PB_NR
#define FA_VW 16
#define FA_V __m512
#define FA_VM __mmask16
#define FA_V_TAIL(n) fa_mask16(n)
#define FA_V_LOADT(t, p, n) load16(t, p, fa_mask16(n))
#define FA_V_LOAD(p) _mm512_loadu_ps(p)
#define FA_V_STORE(p, v) _mm512_storeu_ps(p, v)
#define FA_V_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define FA_V_MSTORE(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define FA_V_ZERO() _mm512_setzero_ps()
#define FA_V_SET1(x) _mm512_set1_ps(x)
#define FA_V_ADD(a, b) _mm512_add_ps(a, b)
#define FA_V_SUB(a, b) _mm512_sub_ps(a, b)
#define FA_V_KEEP(m, v) _mm512_maskz_mov_ps(m, v)
#define FA_V_EXP(x) fa_avx512_exp(x)
#define FA_V_HSUM(v) _mm512_reduce_add_ps(v)
#define FA_V_TRANSPOSE(r) fa_avx512_transpose16(r)
#include "isa_f32_simd.h"
_Static_assert(FA_V_KEYS == ABT_NR, "pack_bt packs the panels gemm_abt reads");

static int avx512_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* Big enough for every layout above: rows and columns padded to 64. */
int64_t fa_avx512_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    (void)t;
    return fa_round_up(rows, 64) * fa_round_up(cols, 64) * (int64_t)sizeof(float);
}

/* ---- products (isa_avx512_gemm.h) ----------------------------------------------------- */

static void avx512_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    gemm_abt_words(m, n, k, (const uint32_t *)a, (const uint32_t *)bt, s, lds);
}

void fa_avx512_gemm_pb_prefix(int m, int n, int rows, int cols, const float *p, int ldp, const void *b, float *o,
                              int ldo) {
    gemm_pb_words(m, n, cols, (const uint32_t *)p, ldp, (const uint32_t *)b, rows, 0, o, ldo);
}

static void avx512_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    fa_avx512_gemm_pb_prefix(m, n, n, cols, p, ldp, b, o, ldo);
}

float fa_avx512_exp_sum(float *x, int n, float mx) { return avx512_exp_sum(x, n, mx); }

/* ---- per-element passes of the backward ---------------------------------------------- */

/* tr = x^T in 16 x 16 blocks, each transposed in registers (fa_avx512_transpose16): rows
 * past m and columns past n are loaded as 0 and never stored. */
void fa_avx512_transpose(const float *x, int ld, int m, int n, float *tr) {
    for (int i0 = 0; i0 < m; i0 += 16) {
        const int rows = m - i0 < 16 ? m - i0 : 16;
        for (int j0 = 0; j0 < n; j0 += 16) {
            const int cols = n - j0 < 16 ? n - j0 : 16;
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(fa_mask16(cols), x + (int64_t)(i0 + i) * ld + j0)
                                : _mm512_setzero_ps();
            fa_avx512_transpose16(r);
            for (int c = 0; c < cols; c++)
                _mm512_mask_storeu_ps(tr + (int64_t)(j0 + c) * m + i0, fa_mask16(rows), r[c]);
        }
    }
}

/* fa_vround_bf16 / fa_vround_f16 (vexp.h), 16 lanes at a time, bit for bit. */
static inline __m512i round_bf16_16(__m512i u) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), hi);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_and_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
}

static inline __m512i round_f16_16(__m512i u) {
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512i rs = _mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(a), half), half));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 13), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0xfff)), lsb),
                                 _mm512_set1_epi32((int)~0x1fffu));
    r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x38800000)), rs);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x477ff000)),
                              _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000)),
                              _mm512_or_si512(a, _mm512_set1_epi32(0x00400000)));
    return _mm512_or_si512(r, _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)));
}

void fa_avx512_round_row(float *x, int n, fa_dtype t) {
    if (t == FA_F32) return;
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = n - j < 16 ? fa_mask16(n - j) : (__mmask16)0xffff;
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + j));
        _mm512_mask_storeu_ps(x + j, m, _mm512_castsi512_ps(t == FA_BF16 ? round_bf16_16(u) : round_f16_16(u)));
    }
}

void fa_avx512_store_bf16(uint16_t *dst, const float *x, float a, int n) {
    const __m512 va = _mm512_set1_ps(a);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = n - j < 16 ? fa_mask16(n - j) : (__mmask16)0xffff;
        const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), va));
        _mm256_mask_storeu_epi16(dst + j, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_16(u), 16)));
    }
}

void fa_avx512_hide_row(float *x, const uint8_t *vis, int n) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = n - j < 16 ? fa_mask16(n - j) : (__mmask16)0xffff;
        const __mmask16 hide = vis ? (__mmask16)(m & ~_mm_test_epi8_mask(_mm_maskz_loadu_epi8(m, vis + j), _mm_set1_epi8(-1))) : m;
        _mm512_mask_storeu_ps(x + j, hide, neg_inf);
    }
}

void fa_avx512_scale_row(float *x, int n, float a) {
    const __m512 va = _mm512_set1_ps(a);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = n - j < 16 ? fa_mask16(n - j) : (__mmask16)0xffff;
        _mm512_mask_storeu_ps(x + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), va));
    }
}

/* The cache decode kernels of decode_cache_avx512.c, for every cache type here (bf16 too:
 * this table has no AVX512_BF16 step). The table runs on Intel's cores (dispatch.c), where
 * the steps prefetch the next tile line for line and the driver's touch reads only what
 * they left (isa.h, prefetch_per_line and touch_rest). */
const fa_decode_kernels fa_decode_avx512_kernels = {.cache_qk = fa_decode_cache_qk_avx512,
                                                    .cache_pv = fa_decode_cache_pv_avx512,
                                                    .cache_step = fa_decode_cache_step_avx512,
                                                    .prefetch_x = 1,
                                                    .touch_rest = 1,
                                                    .prefetch_per_line = 1};

const fa_isa fa_isa_avx512 = {.name = "avx512", FA_ISA_KERNELS(avx512), .bt_prefix = 1,
                               .packed_bytes = fa_avx512_packed_bytes,
                               .exp_sum = fa_avx512_exp_sum, .transpose = fa_avx512_transpose,
                               .round_row = fa_avx512_round_row, .hide_row = fa_avx512_hide_row,
                               .scale_row = fa_avx512_scale_row, .store_bf16 = fa_avx512_store_bf16,
                               .tiles = &fa_isa_tiles_default,
    .dropout_tile = fa_dropout_tile_avx512,
                               .decode = &fa_decode_avx512_kernels};
