/* The CPU microkernel interface: one table per instruction set (isa_scalar.c,
 * isa_avx512.c, ...), chosen once at run time (dispatch.c; FA_ISA forces one).
 *
 * The drivers (forward.c, backward.c) own tiling, threading, masking and the online
 * softmax bookkeeping; a microkernel does one fixed job on one tile. Operands are packed
 * first, into the kernel's own layout, so an ISA may keep them in f32, bf16 pairs (VNNI)
 * or AMX tiles. A packed buffer is determined by the (rows, cols) it was packed with, and
 * the same (rows, cols) are passed to the products that read it. */
#ifndef FA_CPU_ISA_H
#define FA_CPU_ISA_H

#include "../internal.h"
#include "../philox.h"
#include "decode_kernels.h"
#include "vexp.h"

/* Where a tile comes from: element [0, 0] of a rows x cols block of a strided tensor. */
typedef struct {
    const void *base;
    fa_dtype dtype;
    int64_t row_stride, col_stride; /* in elements */
} fa_tile_src;

/* Default tile sizes of an ISA's kernels (query rows x keys), the rule around them in
 * cpu/backend_cpu.c; measured on 2 Zen 4 cores, bench/RESULTS.md says why each exists. */
typedef struct {
    int64_t bq, bk;             /* masked problems, and the backward */
    int64_t open_bq;            /* forward, no mask, f32 and f16: more rows per tile */
    int64_t bf16_open_bq, bf16_open_bk; /* forward, no mask, bf16 */
    int64_t long_keys, long_bk; /* f32 forward, no mask, seq_k >= long_keys: bk = long_bk */
    int64_t bwd_long_keys, bwd_long_dim, bwd_long_bk; /* f32 backward, no mask, seq_k and D from these */
    int64_t bf16_long_bk; /* bf16: forward bk where it costs little (any seq_k and D); backward bk with
                           * seq_k >= long_keys, D >= 128, without a mask or window (backend_cpu.c) */
    int64_t bf16_wider_bk; /* the forward's, tried after bf16_long_bk (0: none) */
    int64_t fwd_run_bytes; /* the L2 a forward item's run of q tiles and accumulators may take
                            * (forward.c, run_length; 0: 1 MiB, a Zen 4 core's L2) */
} fa_isa_tiles;

/* The tiles of every ISA, of those with the bf16-pair passes (exp_pairs below), and AMX's. */
extern const fa_isa_tiles fa_isa_tiles_default, fa_isa_tiles_bf16_pairs, fa_isa_tiles_amx;

/* Optional decode kernels that read cache rows in place (decode_kernels.h): bf16 (qk, pv,
 * step; NULL where the ISA has no AVX512_BF16) and f16 / int8 / fp8 (cache_qk, cache_pv). */
typedef struct fa_decode_kernels {
    void (*qk)(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s, int lds);
    void (*pv)(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o, int ldo);
    void (*step)(const fa_decode_step *t);
    /* Optional (NULL: decode_cache.c's portable loops): f16, int8 and fp8 caches with
     * contiguous rows, and bf16 ones where step above is NULL (decode_kernels.h,
     * fa_decode_cache_tile). */
    void (*cache_qk)(const fa_decode_cache_tile *t, float *s, int lds);
    void (*cache_pv)(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo);
    void (*cache_step)(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum, float *acc,
                       int ldacc);
    /* Nonzero: cache_step keeps FA_DECODE_CACHE_WS_BYTES of the thread's scratch across the
     * tiles a thread runs in a call (fa_decode_cache_tile.ws; zeroed at the call's start). */
    int cache_ws;
    /* The lines of the next tile that the bf16 steps (decode_avx512bf16.c) and the AVX-512
     * f16 and int8 cache steps (decode_cache_avx512.c; fp8 keeps its own) prefetch per
     * block of keys, times this (0: 1).
     * Their counts were measured on Zen 4, where more was slower; a Sapphire Rapids core
     * (the amx table) read faster with twice as many (bench/RESULTS.md, 2026-12-02), and with
     * three times, which reach all of the next tile, once the driver stopped reading it again
     * (touch_rest; 2026-12-05 late). */
    int prefetch_x;
    /* Nonzero: before a tile computes, the driver reads only the lines of it that the last
     * tile's prefetches did not reach (decode.c, dec_touch_rest), not the whole tile again.
     * With prefetch_x 3 the amx table's steps prefetch all of the next tile (bf16, int8, fp8)
     * or 94% of it (f16), and on its cores the second read cost more than it saved
     * (bench/RESULTS.md, 2026-12-05 late). */
    int touch_rest;
    /* Nonzero: the cache steps (decode_cache_avx512.c) prefetch one line of the next tile for
     * each line of this tile they read, instead of the counts above (their prefetch_x is
     * then 1): all of the next tile by the end of the last head's step, spread as evenly as
     * the reads. The avx512 table's (Intel cores without AMX): with touch_rest, 0.82-0.90 of
     * the time of the counts above (bench/RESULTS.md, 2026-12-07 nineteenth session). */
    int prefetch_per_line;
} fa_decode_kernels;
extern const fa_decode_kernels fa_decode_bf16_kernels; /* isa_avx512bf16.c */
extern const fa_decode_kernels fa_decode_avx512_kernels; /* isa_avx512.c: the cache kernels alone */

typedef struct fa_isa {
    const char *name;   /* "scalar", "avx2", "avx512", "avx512bf16", "amx" */
    int (*available)(void); /* cpuid (and OS permission) check */
    /* Bytes of a packed buffer holding up to rows x cols (any pack_* below). */
    int64_t (*packed_bytes)(int64_t rows, int64_t cols, fa_dtype t);
    /* Pack the left operand A of S = A B^T (q: rows = query rows, cols = head dim). */
    void (*pack_a)(const fa_tile_src *src, int rows, int cols, void *dst);
    /* Pack the right operand B of S = A B^T (k: rows = keys, cols = head dim). */
    void (*pack_bt)(const fa_tile_src *src, int rows, int cols, void *dst);
    /* Pack the right operand B of O += P B (v: rows = keys, cols = value dim). */
    void (*pack_b)(const fa_tile_src *src, int rows, int cols, void *dst);
    /* s[i*lds + j] = sum_{x<k} A[i,x] B[j,x] for i < m, j < n (a: pack_a(m,k), bt:
     * pack_bt(n,k), or with bt_prefix any pack_bt(n', k), n' >= n: its first n keys).
     * Overwrites s. */
    void (*gemm_abt)(int m, int n, int k, const void *a, const void *bt, float *s, int lds);
    /* 1 where pack_bt lays keys out in panels that do not depend on the keys packed, so
     * that gemm_abt takes any prefix of them (the masked forward's trimmed pairs,
     * schedule_mask.h); 0: the driver packs k again for fewer keys. */
    int bt_prefix;
    /* 1 where gemm_pb and gemm_pb_pairs take a prefix of a packed v (in steps of 32 keys:
     * the bf16 tables, whose packed buffers name their rows); 0: the driver packs v again. */
    int b_prefix;
    /* o[i*ldo + c] += sum_{j<n} p[i*ldp + j] B[j,c] for i < m, c < cols (b: pack_b(n,
     * cols), or with b_prefix any pack_b(n', cols), n' >= n, n a multiple of 32: its first
     * n keys). p is f32, already rounded to the problem's dtype by the caller. */
    void (*gemm_pb)(int m, int n, int cols, const float *p, int ldp, const void *b, float *o,
                    int ldo);
    /* x[j] = exp(x[j] - mx) for j < n, returns their sum. exp(-inf) = 0. */
    float (*exp_sum)(float *x, int n, float mx);
    /* Optional per-element passes of the drivers (NULL: the drivers' portable loops, with
     * the same results bit for bit). tr[j*m + i] = x[i*ld + j] for i < m, j < n. */
    void (*transpose)(const float *x, int ld, int m, int n, float *tr);
    /* x[j] rounded to dtype t and back, as fa_vround_bf16 / fa_vround_f16 (vexp.h). */
    void (*round_row)(float *x, int n, fa_dtype t);
    /* Optional, bf16 problems (NULL: the forward takes exp_sum, round_row and gemm_pb). The
     * forward's p written once, as the bf16 pairs its PV product reads, instead of f32 p
     * rounded in one pass and paired in another. max_row: the max of x[j] for j < n, NaN
     * skipped (-inf if none). exp_pairs: e[j] = exp(x[j] * scale - base) as exp_sum
     * computes it (the product rounded to f32 first), returns their sum in exp_sum's order,
     * and writes e rounded to bf16 as round_row does, pairs (e[2i], e[2i+1]) in the 32-bit
     * words ((uint32_t *)x)[i], i < (n + 1) / 2 (in place; an odd n pairs its last e with
     * 0). gemm_pb_pairs: gemm_pb with p given as those pairs, rows ldpp words apart. */
    float (*max_row)(const float *x, int n);
    float (*exp_pairs)(float *x, int n, float scale, float base);
    void (*gemm_pb_pairs)(int m, int n, int cols, const uint32_t *pp, int ldpp, const void *b, float *o, int ldo);
    /* Optional, both or neither (NULL: the forward runs whole pairs): gemm_abt and
     * gemm_pb_pairs over a ragged pair, whose rows [32 i, 32 i + 32) (FA_FWD_SLICE) take only
     * their first ns[i] keys (a multiple of 32, or the pair's n; 0: none; the keys packed are
     * at least the largest): s written there alone, o given those keys' terms alone, with the
     * same bits as the whole products give the rows there. gemm_abt_rows takes any dtype's
     * packs, gemm_pb_pairs_rows bf16 pairs (the forward's other products go a slice at a time).
     * A diagonal pair's first rows then skip the keys of its last (internal.h, fwd_slice). */
    void (*gemm_abt_rows)(int m, const int *ns, int k, const void *a, const void *bt, float *s, int lds);
    void (*gemm_pb_pairs_rows)(int m, const int *ns, int cols, const uint32_t *pp, int ldpp, const void *b, float *o,
                               int ldo);
    /* Optional per-row passes of the forward's masks and rescale (NULL: fa_hide_row's and
     * fa_scale_row's portable loops, the same bits): hide_row: x[j] = -inf where vis[j] is 0
     * (vis NULL: every j), j < n; scale_row: x[j] *= a. */
    void (*hide_row)(float *x, const uint8_t *vis, int n);
    void (*scale_row)(float *x, int n, float a);
    /* Optional (NULL: the forward's loop, the same bits): dst[j] = the bf16 bits of x[j] * a
     * rounded to nearest even (fa_vround_bf16), j < n: a row of o, dq, dk or dv written. */
    void (*store_bf16)(uint16_t *dst, const float *x, float a, int n);
    /* The block sizes these kernels run best at (registered with them, as BLIS does). */
    const fa_isa_tiles *tiles;
    /* Optional (NULL: decode packs its tiles and takes gemm_abt / gemm_pb). */
    const fa_decode_kernels *decode;
    /* Optional (NULL: dropout.h's portable pass, the same bits): dropout of rows i0 .. i0 + m - 1
     * of (b, h), keys j0 .. j0 + n - 1 (philox.h's rule), row r at x + r * ldx floats: x[j] =
     * kept ? x[j] * scale : 0 for f32 rows, or, with pairs, the 16-bit elements of a row's
     * (n + 1) / 2 words (exp_pairs) zeroed where dropped. */
    void (*dropout_tile)(const struct fa_dropout *d, int64_t b, int64_t h, int64_t i0, int m, int64_t j0, int n,
                         void *x, int ldx, float scale, int pairs);
} fa_isa;

/* dropout_tile at AVX-512 width (dropout_avx512.c), for the tables of AVX-512 ISAs. */
void fa_dropout_tile_avx512(const struct fa_dropout *d, int64_t b, int64_t h, int64_t i0, int m, int64_t j0, int n,
                            void *x, int ldx, float scale, int pairs);

/* The kernels every table names the same way (pre##_available, ...); a table adds its
 * name, packed_bytes, exp_sum, tiles and the optional entries. */
#define FA_ISA_KERNELS(pre)                                                                            \
    .available = pre##_available, .pack_a = pre##_pack_a, .pack_bt = pre##_pack_bt, .pack_b = pre##_pack_b, \
    .gemm_abt = pre##_gemm_abt, .gemm_pb = pre##_gemm_pb

/* Every table compiled in, best first; the scalar one is always last and available. */
extern const fa_isa fa_isa_scalar;

/* The table to use: FA_ISA if set (FA_ERR_INVALID if it is unknown, not built or not on
 * this CPU: the caller's setting to fix), else the best available. */
fa_status fa_isa_select(const fa_isa **out);

/* x[j] rounded to dtype t and back, j < n (p before the second product, docs/semantics.md,
 * "Rounding"), for the forward and the backward alike: the ISA's pass where it has one (the
 * same bits, at its vector width), else vexp.h's branch-free roundings, whose loops
 * vectorize at the driver's baseline width. */
static inline void fa_round_row(const fa_isa *isa, fa_dtype t, float *restrict x, int n) {
    if (t == FA_F32) return;
    if (isa->round_row) {
        isa->round_row(x, n, t);
        return;
    }
    if (t == FA_F16)
        for (int j = 0; j < n; j++) x[j] = fa_vround_f16(x[j]);
    else
        for (int j = 0; j < n; j++) x[j] = fa_vround_bf16(x[j]);
}

/* x[j] = -inf where vis[j] == 0 (vis NULL: all of x[0..n)): keys a row cannot see. */
static inline void fa_hide_row(const fa_isa *isa, float *restrict x, const uint8_t *restrict vis, int64_t n) {
    if (n <= 0) return;
    if (isa->hide_row) {
        isa->hide_row(x, vis, (int)n);
        return;
    }
    if (!vis)
        for (int64_t j = 0; j < n; j++) x[j] = -INFINITY;
    else
        for (int64_t j = 0; j < n; j++) x[j] = vis[j] ? x[j] : -INFINITY;
}

/* x[j] *= a, j < n (the accumulators' rescale when a row's max grows). */
static inline void fa_scale_row(const fa_isa *isa, float *restrict x, int64_t n, float a) {
    if (isa->scale_row) {
        isa->scale_row(x, (int)n, a);
        return;
    }
    for (int64_t c = 0; c < n; c++) x[c] *= a;
}

#endif /* FA_CPU_ISA_H */
