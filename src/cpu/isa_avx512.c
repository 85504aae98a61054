/* AVX-512 microkernels in f32 (fa_isa_avx512): any input dtype is packed to f32.
 *
 * Packed layouts (f32, zero padded, so the products never need masks inside a loop):
 *   pack_a  (q, m x k):   A[r * k + x]                        row-major
 *   pack_bt (k, n x k):   panels of 32 keys: BT[p][x][32]      keys run fastest: 2 vectors
 *   pack_b  (v, n x c):   panels of 64 columns: B[p][j][w]     w = min(64, c - 64p rounded up to 16)
 *
 * Both products are one register-blocked kernel, C[MR x 16NV] (+)= sum_x A[r, x] B[x, :]:
 * a row of B is NV vectors, A[r, x] is broadcast straight from memory into the FMA.
 *   gemm_abt: S = Q K^T, 12 query rows x 32 keys (24 accumulators)
 *   gemm_pb:  O += P V,  6 rows x 64 value columns (24 accumulators)
 * K is transposed while it is packed (16 x 16 blocks in registers), so 16 keys are one
 * vector; that cost is paid once per key tile and shared by all query rows of the tile.
 *
 * exp_sum uses the polynomial of vexp.h (degree-7 Taylor on |r| <= ln2/2), 16 lanes at a
 * time, so the numbers match the scalar kernels to an ulp or two. */
#include "isa.h"

#include "isa_avx512.h"

#include <immintrin.h>
#include <string.h>

#define ABT_MR 12 /* query rows per block of gemm_abt */
#define ABT_NR 32 /* keys per panel of packed K^T */
#define PB_MR 6   /* rows per block of gemm_pb */
#define PB_NR 64  /* value columns per panel of packed V */

static int avx512_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Big enough for every layout above: rows and columns padded to 64. */
int64_t fa_avx512_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    (void)t;
    return round_up(rows, 64) * round_up(cols, 64) * (int64_t)sizeof(float);
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

static inline __mmask16 tail_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* Copies a rows x cols tile to f32 rows of `ld` floats (ld >= cols). */
void fa_avx512_pack_rows(const fa_tile_src *src, int rows, int cols, float *dst, int64_t ld) {
    const size_t esz = fa_dtype_size(src->dtype);
    if (src->col_stride != 1) {
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                dst[r * ld + c] = fa_load(src->dtype, src->base, r * src->row_stride + c * src->col_stride);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)src->base + (size_t)(r * src->row_stride) * esz;
        float *d = dst + r * ld;
        int c = 0;
        for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(d + c, load16(src, row + (size_t)c * esz, 0xffff));
        if (c < cols) _mm512_mask_storeu_ps(d + c, tail_mask(cols - c), load16(src, row + (size_t)c * esz, tail_mask(cols - c)));
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
                    r[j] = load16(src, row, tail_mask(nx));
                } else {
                    float tmp[16] = {0};
                    for (int x = 0; x < nx; x++)
                        tmp[x] = fa_load(src->dtype, src->base, (j0 + j) * src->row_stride + (x0 + x) * src->col_stride);
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

/* Width in floats of column panel p of a packed V with `cols` columns. */
static inline int pb_width(int cols, int p) {
    const int rest = cols - p * PB_NR;
    return rest >= PB_NR ? PB_NR : (rest + 15) / 16 * 16;
}

/* V (n x cols) into panels of 64 columns: dst[p][j][w], w = pb_width. */
static void avx512_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    float *out = (float *)dst;
    for (int p = 0; p * PB_NR < cols; p++) {
        const int w = pb_width(cols, p), c0 = p * PB_NR, nc = cols - c0 < PB_NR ? cols - c0 : PB_NR;
        fa_tile_src s = *src;
        s.base = (const char *)src->base + (size_t)(c0 * src->col_stride) * fa_dtype_size(src->dtype);
        float *panel = out + (int64_t)c0 * rows;
        if (nc < w)
            for (int j = 0; j < rows; j++) _mm512_storeu_ps(panel + (int64_t)j * w + w - 16, _mm512_setzero_ps());
        fa_avx512_pack_rows(&s, rows, nc, panel, w);
    }
}

/* ---- the register-blocked kernel ---------------------------------------------------- *
 * C[r, 16v + l] (+)= sum_{x<K} A[r*lda + x] * B[x*ldb + 16v + l], r < MR, v < NV; the last
 * vector's store is masked by `last`. accumulate: C starts from its stored values. */
static inline __attribute__((always_inline)) void kernel(const int MR, const int NV, int K, const float *restrict A,
                                                         int64_t lda, const float *restrict Bm, int64_t ldb,
                                                         float *restrict C, int64_t ldc, __mmask16 last,
                                                         const int accumulate) {
    __m512 acc[14][4];
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, C + r * ldc + 16 * v)
                                   : _mm512_setzero_ps();
    for (int x = 0; x < K; x++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(Bm + (int64_t)x * ldb + 16 * v);
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(A[r * lda + x]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            if (v == NV - 1) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, last, acc[r][v]);
            else _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
        }
}

/* Instances for a runtime row count mr (1 <= mr <= the block's MR). */
#define KCASE(MR_, NV_, ACC_) \
    case MR_: kernel(MR_, NV_, K, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES6(NV_, ACC_) KCASE(6, NV_, ACC_) KCASE(5, NV_, ACC_) KCASE(4, NV_, ACC_) \
    KCASE(3, NV_, ACC_) KCASE(2, NV_, ACC_) default: kernel(1, NV_, K, A, lda, Bm, ldb, C, ldc, last, ACC_); break;
#define KCASES12(NV_, ACC_) KCASE(12, NV_, ACC_) KCASE(11, NV_, ACC_) KCASE(10, NV_, ACC_) KCASE(9, NV_, ACC_) \
    KCASE(8, NV_, ACC_) KCASE(7, NV_, ACC_) KCASES6(NV_, ACC_)

static void abt_block(int mr, int nv, int K, const float *A, int64_t lda, const float *Bm, int64_t ldb, float *C,
                      int64_t ldc, __mmask16 last) {
    if (nv == 2) {
        switch (mr) { KCASES12(2, 0) }
    } else {
        switch (mr) { KCASES12(1, 0) }
    }
}

static void avx512_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    const float *A = (const float *)a, *BT = (const float *)bt;
    for (int j0 = 0; j0 < n; j0 += ABT_NR) {
        const int nj = n - j0 < ABT_NR ? n - j0 : ABT_NR;
        const int nv = (nj + 15) / 16;
        const __mmask16 last = tail_mask(nj - 16 * (nv - 1));
        const float *panel = BT + (int64_t)j0 * k;
        for (int i0 = 0; i0 < m; i0 += ABT_MR) {
            const int mr = m - i0 < ABT_MR ? m - i0 : ABT_MR;
            abt_block(mr, nv, k, A + (int64_t)i0 * k, k, panel, ABT_NR, s + (int64_t)i0 * lds + j0, lds, last);
        }
    }
}

static void pb_block(int mr, int nv, int K, const float *A, int64_t lda, const float *Bm, int64_t ldb, float *C,
                     int64_t ldc, __mmask16 last) {
    switch (nv) {
    case 4: switch (mr) { KCASES6(4, 1) } break;
    case 3: switch (mr) { KCASES6(3, 1) } break;
    case 2: switch (mr) { KCASES6(2, 1) } break;
    default: switch (mr) { KCASES6(1, 1) } break;
    }
}

static void avx512_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    const float *V = (const float *)b;
    for (int c0 = 0, pi = 0; c0 < cols; c0 += PB_NR, pi++) {
        const int w = pb_width(cols, pi), nc = cols - c0 < PB_NR ? cols - c0 : PB_NR;
        const int nv = w / 16;
        const __mmask16 last = tail_mask(nc - 16 * (nv - 1));
        const float *panel = V + (int64_t)c0 * n;
        for (int i0 = 0; i0 < m; i0 += PB_MR) {
            const int mr = m - i0 < PB_MR ? m - i0 : PB_MR;
            pb_block(mr, nv, n, p + (int64_t)i0 * ldp, ldp, panel, w, o + (int64_t)i0 * ldo + c0, ldo, last);
        }
    }
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
        const __mmask16 t = tail_mask(n - j);
        __m512 e = fa_avx512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + j), vmx));
        _mm512_mask_storeu_ps(x + j, t, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(t, e));
    }
    return _mm512_reduce_add_ps(sum);
}

/* ---- per-element passes of the backward ---------------------------------------------- */

/* One 16 x 16 block: rows r (r < rows) of x, columns c0.. under cmask, into rows of tr
 * (row j of tr = column j of x; j < cols, lanes under rmask). Three shuffle stages: 32-bit
 * pairs, 64-bit pairs, then 128-bit lanes (two steps). */
static inline void transpose16(const float *x, int64_t ld, int rows, __mmask16 cmask, float *tr, int64_t ldt,
                               int cols, __mmask16 rmask) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = i < rows ? _mm512_maskz_loadu_ps(cmask, x + i * ld) : _mm512_setzero_ps();
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; k++) { /* lane L of r[4k + c]: column 4L + c of rows 4k..4k+3 */
        const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
        r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 xlo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), xhi = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee);
        const __m512 ylo = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        const __m512 yhi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
        const __m512 out[4] = {_mm512_shuffle_f32x4(xlo, ylo, 0x88), _mm512_shuffle_f32x4(xlo, ylo, 0xdd),
                               _mm512_shuffle_f32x4(xhi, yhi, 0x88), _mm512_shuffle_f32x4(xhi, yhi, 0xdd)};
        for (int q = 0; q < 4; q++)
            if (4 * q + c < cols) _mm512_mask_storeu_ps(tr + (4 * q + c) * ldt, rmask, out[q]);
    }
}

void fa_avx512_transpose(const float *x, int ld, int m, int n, float *tr) {
    for (int i0 = 0; i0 < m; i0 += 16) {
        const int rows = m - i0 < 16 ? m - i0 : 16;
        for (int j0 = 0; j0 < n; j0 += 16) {
            const int cols = n - j0 < 16 ? n - j0 : 16;
            transpose16(x + (int64_t)i0 * ld + j0, ld, rows, tail_mask(cols), tr + (int64_t)j0 * m + i0, m, cols,
                        tail_mask(rows));
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
        const __mmask16 m = n - j < 16 ? tail_mask(n - j) : (__mmask16)0xffff;
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + j));
        _mm512_mask_storeu_ps(x + j, m, _mm512_castsi512_ps(t == FA_BF16 ? round_bf16_16(u) : round_f16_16(u)));
    }
}

const fa_isa fa_isa_avx512 = {.name = "avx512", FA_ISA_KERNELS(avx512), .packed_bytes = fa_avx512_packed_bytes,
                               .exp_sum = fa_avx512_exp_sum, .transpose = fa_avx512_transpose,
                               .round_row = fa_avx512_round_row, .tiles = &fa_isa_tiles_default};
