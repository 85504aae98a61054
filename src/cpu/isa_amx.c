/* AMX microkernels (fa_isa_amx): bf16 problems multiply in the tile unit. tdpbf16ps adds
 * a 16 x 32 bf16 tile A times a 32 x 16 bf16 tile B (stored as 16 rows of 16 pairs, the
 * "VNNI" layout: row kk holds B[2kk][c], B[2kk+1][c] for c = 0..15) into a 16 x 16 f32
 * tile C. As with vdpbf16ps (isa_avx512bf16.c) the products of bf16 numbers are exact in
 * f32 and the driver rounds p to bf16 before O += P V, so both products see exactly the
 * problem's values (bf16 subnormals, below 1.2e-38, are flushed to zero). f32 and f16
 * problems use the f32 kernels of isa_avx512.c unchanged, so their results are avx512's.
 *
 * Every packed buffer starts with a 64-byte header naming its payload (f32 or AMX bf16),
 * since the products are not told the dtype (isa_avx512bf16.h). AMX payloads, zero padded
 * (kp = cols rounded up to 32, np = rows rounded up to 32):
 *   pack_a  (q, m x k):  A[r][kp]                 bf16 rows, m rounded up to 16 rows
 *   pack_bt (k, n x k):  BT[n/16][kp/2][16]        panels of 16 keys, a pair of head dims each
 *   pack_b  (v, n x c):  B[c/16][np/2][16]         panels of 16 columns, a pair of keys each
 * so a B tile (32 head dims or keys x 16 keys or columns) is 1 KiB of contiguous memory,
 * and an A tile is 16 rows of 64 bytes at the row stride.
 *
 * Both products use all eight tiles: C = tiles 0..3 (2 x 2 blocks of 16 x 16 f32, 32 rows
 * x 32 columns), A = tiles 4, 5 and B = tiles 6, 7. Edge blocks use 1 x 2, 2 x 1 or 1 x 1
 * of them; a C tile that is cut by m, n or cols goes through a 1 KiB stack buffer, so only
 * the caller's m x n of s (m x cols of o) is ever read or written. gemm_pb converts up to
 * PB_KC keys of 32 rows of p to bf16 at a time (exact: p is already rounded to bf16);
 * gemm_pb_pairs takes the forward's p already as bf16 pairs (isa.h, exp_pairs), which are
 * A tiles as they lie, copying only the blocks cut by m or n (zero padded: a tile reads 16
 * rows and 32 keys, and past n the words hold leftover scores). Both walk the same blocks
 * in the same order, so they give the same bits.
 *
 * Tile state belongs to the thread (amx_tiles.h): each product loads the configuration
 * (all tiles 16 rows x 64 bytes) on entry and releases the tiles on exit. */
#define _DEFAULT_SOURCE /* syscall() */
#include "amx_tiles.h"
#include "isa_avx512bf16.h"
#include "isa_pack.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FMT_AMX 2u
#define PB_KC 512 /* keys of p converted to bf16 at a time (32 rows: 32 KiB of stack) */

#define ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an extended state component */
#define XFEATURE_XTILEDATA 18      /* the AMX tile data */

/* ---- the tile configuration ------------------------------------------------------ */

/* Palette 1, tiles 0..7 all 16 rows x 64 bytes (16 f32, or 32 bf16 = 16 pairs). */
static const fa_tile_config amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
static inline __attribute__((always_inline)) void tiles_begin(void) { fa_tiles_load(&amx_config); }
static inline __attribute__((always_inline)) void tiles_end(void) { fa_tiles_release(); }

/* ---- availability ------------------------------------------------------------------- */

/* cpuid says AMX-TILE and AMX-BF16, the AVX-512 the packing uses is there, and Linux lets
 * this process use the tile data (a refusal, or an older kernel, means unavailable). */
static int amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 0; /* AMX-TILE, AMX-BF16 */
    if (!fa_isa_avx512.available()) return 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static int amx_available(void) {
    static atomic_int state; /* 0: not asked yet, 1: available, 2: not */
    int s = atomic_load(&state);
    if (!s) {
        s = amx_probe() ? 1 : 2;
        atomic_store(&state, s);
    }
    return s == 1;
}

/* ---- helpers ------------------------------------------------------------------------ */

static int64_t amx_packed_bytes(int64_t rows, int64_t cols, fa_dtype t) {
    if (t != FA_BF16) return FA_PACK_HDR + fa_avx512_packed_bytes(rows, cols, t);
    return FA_PACK_HDR + fa_round_up(rows, 32) * fa_round_up(cols, 32) * 2; /* covers all three layouts */
}

/* ---- packing ------------------------------------------------------------------------ */

/* Q (m x k) as bf16 rows of kp values, m rounded up to 16 rows. */
static void amx_pack_a(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_a, src, rows, cols, dst, FMT_AMX)) return;
    const int kp = (int)fa_round_up(cols, 32), mp = (int)fa_round_up(rows, 16);
    uint16_t *out = (uint16_t *)fa_pack_payload(dst);
    for (int r = 0; r < mp; r++)
        for (int c = 0; c < kp; c += 32)
            _mm512_storeu_si512(out + (int64_t)r * kp + c,
                                r < rows ? fa_bf16_load32(src, r, c, cols - c) : _mm512_setzero_si512());
}

/* K (n keys x k) into panels of 16 keys of head-dim pairs: dst[n/16][kp/2][16]. Each 16
 * keys x 32 head dims block is transposed as 16 x 16 words (a word = a pair). */
static void amx_pack_bt(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_bt, src, rows, cols, dst, FMT_AMX)) return;
    const int kp = (int)fa_round_up(cols, 32);
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    for (int j0 = 0; j0 < rows; j0 += 16) {
        uint32_t *panel = out + (int64_t)(j0 / 16) * (kp / 2) * 16;
        for (int c = 0; c < kp; c += 32) {
            __m512 r[16];
            fa_bf16_load_keys16(src, j0, rows, c, cols - c, r);
            fa_avx512_transpose16(r); /* r[x] lane j: pair x of key j0 + j */
            for (int x = 0; x < 16; x++) _mm512_storeu_ps(panel + (int64_t)(c / 2 + x) * 16, r[x]);
        }
    }
}

/* V (n keys x cols) into panels of 16 columns of key pairs: dst[c/16][np/2][16]. Two rows
 * of 32 columns are interleaved into the pairs of two panels. */
static void amx_pack_b(const fa_tile_src *src, int rows, int cols, void *dst) {
    if (fa_pack_f32_unless_bf16(fa_isa_avx512.pack_b, src, rows, cols, dst, FMT_AMX)) return;
    const int np2 = (int)fa_round_up(rows, 32) / 2;
    uint32_t *out = (uint32_t *)fa_pack_payload(dst);
    for (int kk = 0; kk < np2; kk++) {
        for (int c = 0; c < cols; c += 32) {
            __m512i lo, hi;
            fa_bf16_pair_rows(src, 2 * kk, rows, c, cols, &lo, &hi);
            uint32_t *row = out + ((int64_t)(c / 16) * np2 + kk) * 16;
            _mm512_storeu_si512(row, lo);
            if (c + 16 < cols) _mm512_storeu_si512(row + (int64_t)np2 * 16, hi);
        }
    }
}

/* ---- C tiles at the edges ----------------------------------------------------------- */

/* rows x cols (<= 16 x 16) of a 16 x 16 f32 tile buffer to / from a matrix of stride ld. */
static inline void tile_to(const float *t, float *dst, int ld, int rows, int cols) {
    const __mmask16 k = fa_mask16(cols);
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(dst + (int64_t)r * ld, k, _mm512_loadu_ps(t + 16 * r));
}
static inline void tile_from(float *t, const float *src, int ld, int rows, int cols) {
    const __mmask16 k = fa_mask16(cols);
    for (int r = 0; r < 16; r++)
        _mm512_storeu_ps(t + 16 * r, r < rows ? _mm512_maskz_loadu_ps(k, src + (int64_t)r * ld) : _mm512_setzero_ps());
}

/* C tile t <-> rows x cols (<= 16 x 16) of a matrix at p with stride ld (the whole tile if
 * it is all valid, else through a stack buffer). */
#define STORE_C(t, p, ld, rows, cols)                                    \
    do {                                                                 \
        if ((rows) >= 16 && (cols) >= 16) {                              \
            TILE_STORE(t, p, (long)(ld) * 4);                            \
        } else {                                                         \
            float buf_[256] __attribute__((aligned(64)));                \
            TILE_STORE(t, buf_, 64);                                     \
            tile_to(buf_, p, ld, rows, cols);                            \
        }                                                                \
    } while (0)
#define LOAD_C(t, p, ld, rows, cols)                                     \
    do {                                                                 \
        if ((rows) >= 16 && (cols) >= 16) {                              \
            TILE_LOAD(t, p, (long)(ld) * 4);                             \
        } else {                                                         \
            float buf_[256] __attribute__((aligned(64)));                \
            tile_from(buf_, p, ld, rows, cols);                          \
            TILE_LOAD(t, buf_, 64);                                      \
        }                                                                \
    } while (0)

/* ---- the block kernel --------------------------------------------------------------- *
 * C[16 MT x 16 NT] (+)= A B over KT steps of 32: A tiles at a + 16 ti rows (stride lda
 * bf16), B tiles at b0 / b1 + 512 bf16 per step. C is the matrix at c (stride ldc), of
 * which rows x cols are valid. accumulate: C starts from c, else from zero. */
static inline __attribute__((always_inline)) void block(const int MT, const int NT, int KT, const uint16_t *a,
                                                        int64_t lda, const uint32_t *b0, const uint32_t *b1,
                                                        float *c, int ldc, int rows, int cols, const int accumulate) {
    const long sa = (long)lda * 2;
    const int r0 = rows < 16 ? rows : 16, c0 = cols < 16 ? cols : 16, r1 = rows - 16, c1 = cols - 16;
    if (accumulate) {
        LOAD_C(0, c, ldc, r0, c0);
        if (NT > 1) LOAD_C(1, c + 16, ldc, r0, c1);
        if (MT > 1) LOAD_C(2, c + 16 * (int64_t)ldc, ldc, r1, c0);
        if (MT > 1 && NT > 1) LOAD_C(3, c + 16 * (int64_t)ldc + 16, ldc, r1, c1);
    } else {
        TILE_ZERO(0);
        if (NT > 1) TILE_ZERO(1);
        if (MT > 1) TILE_ZERO(2);
        if (MT > 1 && NT > 1) TILE_ZERO(3);
    }
    for (int x = 0; x < KT; x++) {
        TILE_LOAD(4, a + 32 * x, sa);
        TILE_LOAD(6, b0 + 256 * x, 64);
        if (NT > 1) TILE_LOAD(7, b1 + 256 * x, 64);
        TILE_DP(0, 4, 6);
        if (NT > 1) TILE_DP(1, 4, 7);
        if (MT > 1) {
            TILE_LOAD(5, a + 16 * lda + 32 * x, sa);
            TILE_DP(2, 5, 6);
            if (NT > 1) TILE_DP(3, 5, 7);
        }
    }
    STORE_C(0, c, ldc, r0, c0);
    if (NT > 1) STORE_C(1, c + 16, ldc, r0, c1);
    if (MT > 1) STORE_C(2, c + 16 * (int64_t)ldc, ldc, r1, c0);
    if (MT > 1 && NT > 1) STORE_C(3, c + 16 * (int64_t)ldc + 16, ldc, r1, c1);
}

/* The instance for mt x nt tiles (1 or 2 each). */
static void block_any(int mt, int nt, int KT, const uint16_t *a, int64_t lda, const uint32_t *b0, const uint32_t *b1,
                      float *c, int ldc, int rows, int cols, int accumulate) {
    if (accumulate) {
        if (mt == 2 && nt == 2) block(2, 2, KT, a, lda, b0, b1, c, ldc, rows, cols, 1);
        else if (mt == 2) block(2, 1, KT, a, lda, b0, b1, c, ldc, rows, cols, 1);
        else if (nt == 2) block(1, 2, KT, a, lda, b0, b1, c, ldc, rows, cols, 1);
        else block(1, 1, KT, a, lda, b0, b1, c, ldc, rows, cols, 1);
    } else {
        if (mt == 2 && nt == 2) block(2, 2, KT, a, lda, b0, b1, c, ldc, rows, cols, 0);
        else if (mt == 2) block(2, 1, KT, a, lda, b0, b1, c, ldc, rows, cols, 0);
        else if (nt == 2) block(1, 2, KT, a, lda, b0, b1, c, ldc, rows, cols, 0);
        else block(1, 1, KT, a, lda, b0, b1, c, ldc, rows, cols, 0);
    }
}

/* ---- products ----------------------------------------------------------------------- */

/* S = A B^T, rows in slices of 32 (the row blocks), slice i over its first ns[i] keys (ns
 * NULL: n each; n: the most). */
static void abt_blocks(int m, int n, const int *ns, int k, const void *a, const void *bt, float *s, int lds) {
    const uint16_t *A = (const uint16_t *)fa_pack_cpayload(a);
    const uint32_t *BT = (const uint32_t *)fa_pack_cpayload(bt);
    const int kp = (int)fa_round_up(k, 32);
    const int64_t panel = (int64_t)(kp / 2) * 16; /* words per panel of 16 keys */
    tiles_begin();
    for (int j0 = 0; j0 < n; j0 += 32) {
        const uint32_t *b0 = BT + (int64_t)(j0 / 16) * panel;
        for (int i0 = 0; i0 < m; i0 += 32) {
            const int ni = ns ? ns[i0 / 32] : n;
            if (j0 >= ni) continue;
            const int mr = m - i0 < 32 ? m - i0 : 32, nc = ni - j0 < 32 ? ni - j0 : 32;
            block_any(mr > 16 ? 2 : 1, nc > 16 ? 2 : 1, kp / 32, A + (int64_t)i0 * kp, kp, b0, b0 + panel,
                      s + (int64_t)i0 * lds + j0, lds, mr, nc, 0);
        }
    }
    tiles_end();
}

static void amx_gemm_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_gemm_abt_f32(m, n, k, a, bt, s, lds)) return;
    abt_blocks(m, n, NULL, k, a, bt, s, lds);
}

/* isa.h: the tile unit's blocks are 32 rows, so one call takes every slice */
static void amx_gemm_abt_rows(int m, const int *ns, int k, const void *a, const void *bt, float *s, int lds) {
    if (fa_gemm_abt_rows_f32(m, ns, k, a, bt, s, lds)) return;
    int n = 0;
    for (int i0 = 0; i0 < m; i0 += 32) n = ns[i0 / 32] > n ? ns[i0 / 32] : n;
    abt_blocks(m, n, ns, k, a, bt, s, lds);
}

/* Rows [0, rows) of p, keys [0, kn), as bf16 rows of kc (kn rounded up to 32) values,
 * zero padded to 16 mt rows (exact: p is already rounded to bf16). */
static void p_to_bf16(const float *p, int ldp, int rows, int mt, int kn, int kc, uint16_t *dst) {
    for (int r = 0; r < 16 * mt; r++) {
        uint16_t *d = dst + (int64_t)r * kc;
        if (r >= rows) {
            for (int e = 0; e < kc; e += 32) _mm512_storeu_si512(d + e, _mm512_setzero_si512());
            continue;
        }
        const float *row = p + (int64_t)r * ldp;
        for (int e = 0; e < kc; e += 32) _mm512_storeu_si512(d + e, fa_bf16_pairs32(row + e, kn - e));
    }
}

/* Rows [0, rows) of the pairs pp (row r at pp + r ldpp words), keys [k0, k0 + kn), as bf16
 * rows of kc (kn rounded up to 32) values, zero padded to 16 mt rows and past kn. */
static void pairs_to_tile_rows(const uint32_t *pp, int ldpp, int rows, int mt, int k0, int kn, int kc, uint16_t *dst) {
    for (int r = 0; r < 16 * mt; r++) {
        uint16_t *d = dst + (int64_t)r * kc;
        const uint16_t *row = (const uint16_t *)(pp + (int64_t)r * ldpp) + k0;
        for (int e = 0; e < kc; e += 32)
            _mm512_storeu_si512(d + e, r < rows && e < kn ? _mm512_maskz_loadu_epi16(fa_mask32(kn - e), row + e)
                                                         : _mm512_setzero_si512());
    }
}

/* O += P V for p given as f32 rows (p, ldp: converted to bf16 per block) or as the bf16
 * pairs of exp_pairs (pp, ldpp words: A tiles in place, cut blocks copied): the same blocks
 * in the same order either way, so the same bits. Rows in slices of 32 (the row blocks),
 * slice i over its first ns[i] keys (ns NULL: n each): the blocks a whole product would add
 * for those keys, the rest skipped. */
static void pb_blocks(int m, int n, const int *ns, int cols, const float *p, int ldp, const uint32_t *pp, int ldpp,
                      const void *b, float *o, int ldo) {
    const uint32_t *V = (const uint32_t *)fa_pack_cpayload(b);
    const int np2 = (int)fa_round_up(fa_pack_rows(b), 32) / 2; /* the rows packed: n may be fewer (b_prefix) */
    const int64_t panel = (int64_t)np2 * 16; /* words per panel of 16 columns */
    uint16_t buf[32 * PB_KC] __attribute__((aligned(64)));
    tiles_begin();
    for (int i0 = 0; i0 < m; i0 += 32) {
        const int mr = m - i0 < 32 ? m - i0 : 32, mt = mr > 16 ? 2 : 1, ni = ns ? ns[i0 / 32] : n;
        for (int k0 = 0; k0 < ni; k0 += PB_KC) {
            const int kn = ni - k0 < PB_KC ? ni - k0 : PB_KC, kc = (int)fa_round_up(kn, 32);
            const uint16_t *a = buf;
            int64_t lda = kc;
            if (p) {
                p_to_bf16(p + (int64_t)i0 * ldp + k0, ldp, mr, mt, kn, kc, buf);
            } else if (mr != 16 * mt || kn != kc) { /* a cut block: its rows and keys padded with zeros */
                pairs_to_tile_rows(pp + (int64_t)i0 * ldpp, ldpp, mr, mt, k0, kn, kc, buf);
            } else {
                a = (const uint16_t *)(pp + (int64_t)i0 * ldpp) + k0, lda = 2 * (int64_t)ldpp;
            }
            for (int c0 = 0; c0 < cols; c0 += 32) {
                const int nc = cols - c0 < 32 ? cols - c0 : 32;
                const uint32_t *b0 = V + (int64_t)(c0 / 16) * panel + (int64_t)(k0 / 2) * 16;
                block_any(mt, nc > 16 ? 2 : 1, kc / 32, a, lda, b0, b0 + panel, o + (int64_t)i0 * ldo + c0, ldo, mr,
                          nc, 1);
            }
        }
    }
    tiles_end();
}

static void amx_gemm_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    if (fa_gemm_pb_f32(m, n, cols, p, ldp, b, o, ldo)) return;
    pb_blocks(m, n, NULL, cols, p, ldp, NULL, 0, b, o, ldo);
}

static void amx_gemm_pb_pairs(int m, int n, int cols, const uint32_t *pp, int ldpp, const void *b, float *o,
                              int ldo) {
    pb_blocks(m, n, NULL, cols, NULL, 0, pp, ldpp, b, o, ldo);
}

static void amx_gemm_pb_pairs_rows(int m, const int *ns, int cols, const uint32_t *pp, int ldpp, const void *b,
                                   float *o, int ldo) {
    pb_blocks(m, 0, ns, cols, NULL, 0, pp, ldpp, b, o, ldo);
}

/* decode: the bf16 kernels of avx512bf16 (the whole step in the tile unit where its shapes
 * fit: decode_bf16_amx.c), the f16 and fp8 cache kernels of avx512, and the int8 caches' step
 * in the tile unit (decode_cache_amx.c); the first two prefetch three
 * times the lines they take on Zen 4, the whole next tile (isa.h, prefetch_x), so that the
 * driver reads only what the prefetches left (touch_rest) */
static const fa_decode_kernels amx_decode = {.qk = fa_decode_qk_bf16,
                                             .pv = fa_decode_pv_bf16,
                                             .step = fa_decode_step_bf16_amx,
                                             .cache_qk = fa_decode_cache_qk_avx512,
                                             .cache_pv = fa_decode_cache_pv_avx512,
                                             .cache_step = fa_decode_cache_step_amx,
                                             .cache_ws = 1,
                                             .prefetch_x = 3,
                                             .touch_rest = 1};

const fa_isa fa_isa_amx = {.name = "amx", FA_ISA_KERNELS(amx), .packed_bytes = amx_packed_bytes,
                            .bt_prefix = 1, .b_prefix = 1,
                            .exp_sum = fa_avx512_exp_sum, .transpose = fa_avx512_transpose,
                            .round_row = fa_avx512_round_row, .max_row = fa_bf16_max_row,
                            .hide_row = fa_avx512_hide_row, .scale_row = fa_avx512_scale_row,
                            .store_bf16 = fa_avx512_store_bf16,
                            .exp_pairs = fa_bf16_exp_pairs, .gemm_pb_pairs = amx_gemm_pb_pairs,
                            .gemm_abt_rows = amx_gemm_abt_rows, .gemm_pb_pairs_rows = amx_gemm_pb_pairs_rows,
                            .tiles = &fa_isa_tiles_amx,
                            .decode = &amx_decode,
    .dropout_tile = fa_dropout_tile_avx512};
