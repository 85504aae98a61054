/* AVX-512 microkernels in f32 (fa_isa_avx512): any input dtype is packed to f32.
 *
 * Packed layouts (f32, zero padded, so the products never need masks inside a loop):
 *   pack_a  (q, m x k):   A[r * k + x]                        row-major
 *   pack_bt (k, n x k):   panels of 32 keys: BT[p][x][32]      keys run fastest: 2 vectors
 *   pack_b  (v, n x c):   panels of 64 columns: B[p][j][w]     w = min(64, c - 64p rounded up to 16)
 *
 * Both products are the register-blocked kernel of isa_avx512_gemm.h with an f32 per word
 * (gemm_abt 12 query rows x 32 keys, gemm_pb 6 rows x 64 value columns).
 * K is transposed while it is packed (16 x 16 blocks in registers), so 16 keys are one
 * vector; that cost is paid once per key tile and shared by all query rows of the tile.
 *
 * exp_sum uses the polynomial of vexp.h (degree-7 Taylor on |r| <= ln2/2), 16 lanes at a
 * time, so the numbers match the scalar kernels to an ulp or two. */
#include "isa_avx512.h"

#define FA_AVX512_DOT(acc, a, b) _mm512_fmadd_ps(a, b, acc)
#include "isa_avx512_gemm.h"
#include "isa_pack.h"

#include <immintrin.h>
#include <string.h>

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

/* ---- loading rows of any dtype as f32 ------------------------------------------------ */

/* 16 (or the `mask` lanes) contiguous elements of row `row` from column c as f32. */
static inline __m512 load16(const fa_tile_src *src, const void *row, __mmask16 mask) {
    switch (src->dtype) {
    case FA_F32:
        return _mm512_maskz_loadu_ps(mask, row);
    case FA_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row)), 16));
    default:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row));
    }
}

/* Copies a rows x cols tile to f32 rows of `ld` floats (ld >= cols). */
void fa_avx512_pack_rows(const fa_tile_src *src, int rows, int cols, float *dst, int64_t ld) {
    const size_t esz = fa_dtype_size(src->dtype);
    if (src->col_stride != 1) {
        fa_pack_f32(src, rows, cols, dst, ld, 1);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)src->base + (size_t)(r * src->row_stride) * esz;
        float *d = dst + r * ld;
        int c = 0;
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(d + c, load16(src, row + (size_t)c * esz, 0xffff));
        if (c < cols) _mm512_mask_storeu_ps(d + c, fa_mask16(cols - c), load16(src, row + (size_t)c * esz, fa_mask16(cols - c)));
    }
}

static void avx512_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    fa_avx512_pack_rows(src, rows, cols, (float *)dst, cols);
}

/* K (n keys x k) into panels of 32 keys: dst[p][x][32], zero padded keys. */
static void avx512_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    float *out = (float *)dst;
    const size_t esz = fa_dtype_size(src->dtype);
    const int contiguous = src->col_stride == 1;
    for (int j0 = 0; j0 < rows; j0 += 16) {
        const int nj = rows - j0 < 16 ? rows - j0 : 16;
        float *panel = out + (int64_t)(j0 / ABT_NR) * ABT_NR * cols + (j0 % ABT_NR);
        for (int x0 = 0; x0 < cols; x0 += 16) {
            const int nx = cols - x0 < 16 ? cols - x0 : 16;
            __m512 r[16];
            for (int j = 0; j < 16; j++) {
                if (j >= nj) {
                    r[j] = _mm512_setzero_ps();
                } else if (contiguous) {
                    const char *row = (const char *)src->base + (size_t)((j0 + j) * src->row_stride + x0) * esz;
                    /* the same columns two groups of keys ahead: 16 row streams defeat the
                     * hardware prefetcher when K comes from L3 */
                    if (j0 + 32 + j < rows) _mm_prefetch(row + (size_t)(32 * src->row_stride) * esz, _MM_HINT_T0);
                    r[j] = load16(src, row, fa_mask16(nx));
                } else {
                    float tmp[16] = {0};
                    const fa_tile_src row = fa_tile_at(src, j0 + j, x0);
                    fa_pack_f32(&row, 1, nx, tmp, 0, 1);
                    r[j] = _mm512_loadu_ps(tmp);
                }
            }
            fa_avx512_transpose16(r);
            for (int x = 0; x < nx; x++) _mm512_storeu_ps(panel + (int64_t)(x0 + x) * ABT_NR, r[x]);
        }
    }
    /* an odd last half panel: zero its second 16 keys */
    if (rows % ABT_NR && rows % ABT_NR <= 16) {
        float *panel = out + (int64_t)(rows / ABT_NR) * ABT_NR * cols + 16;
        for (int x = 0; x < cols; x++) _mm512_storeu_ps(panel + (int64_t)x * ABT_NR, _mm512_setzero_ps());
    }
}

/* V (n x cols) into panels of 64 columns: dst[p][j][w], w = pb_width. */
static void avx512_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    float *out = (float *)dst;
    for (int p = 0; p * PB_NR < cols; p++) {
        const int w = pb_width(cols, p), c0 = p * PB_NR, nc = cols - c0 < PB_NR ? cols - c0 : PB_NR;
        const fa_tile_src s = fa_tile_at(src, 0, c0);
        float *panel = out + (int64_t)c0 * rows;
        if (nc < w)
            for (int j = 0; j < rows; j++) _mm512_storeu_ps(panel + (int64_t)j * w + w - 16, _mm512_setzero_ps());
        fa_avx512_pack_rows(&s, rows, nc, panel, w);
    }
}

/* ---- products (isa_avx512_gemm.h) ----------------------------------------------------- */

static void avx512_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    gemm_abt_words(m, n, k, (const uint32_t *)a, (const uint32_t *)bt, s, lds);
}

static void avx512_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    gemm_pb_words(m, n, cols, (const uint32_t *)p, ldp, (const uint32_t *)b, n, 0, o, ldo);
}

/* ---- exp ---------------------------------------------------------------------------- */

float fa_avx512_exp_sum(float *x, int n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = fa_avx512_exp(_mm512_sub_ps(_mm512_loadu_ps(x + j), vmx));
        _mm512_storeu_ps(x + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
        const __mmask16 t = fa_mask16(n - j);
        __m512 e = fa_avx512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + j), vmx));
        _mm512_mask_storeu_ps(x + j, t, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(t, e));
    }
    return _mm512_reduce_add_ps(sum);
}

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
            for (int c = 0; c < cols; c++) _mm512_mask_storeu_ps(tr + (int64_t)(j0 + c) * m + i0, fa_mask16(rows), r[c]);
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

const fa_isa fa_isa_avx512 = {
    .name = "avx512",
    .available = avx512_available,
    .packed_bytes = fa_avx512_packed_bytes,
    .pack_a = avx512_pack_a,
    .pack_bt = avx512_pack_bt,
    .pack_b = avx512_pack_b,
    .gemm_abt = avx512_gemm_abt,
    .gemm_pb = avx512_gemm_pb,
    .exp_sum = fa_avx512_exp_sum,
    .transpose = fa_avx512_transpose,
    .round_row = fa_avx512_round_row,
};
