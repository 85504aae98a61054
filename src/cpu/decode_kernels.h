/* Decode tile kernels that read cache rows in place (decode_avx512bf16.c). Only called
 * where the CPU has the instructions (the plan's ISA table says so). */
#ifndef FA_CPU_DECODE_KERNELS_H
#define FA_CPU_DECODE_KERNELS_H

#include "flashattn.h"

#include <stdint.h>

/* Keys per tile at most (fa_decode_tile). */
#define FA_DECODE_MAX_TILE 128
/* A cache step's workspace across the tiles a thread runs in a call (decode_cache_amx.c: 16
 * entries of q's digits, 4224 bytes each). */
#define FA_DECODE_CACHE_WS_BYTES (16 * 4224)

/* One tile of one kv head for the fused kernel: m query rows (d contiguous bf16 each)
 * against n keys and values (rows kstride / vstride elements apart), and the rows'
 * online-softmax state (running max, sum, and accumulators of dv floats, ldacc apart). */
/* Lines to prefetch while a step computes (the next tile's rows): bytes [off, len) of base,
 * then [0, len2) of base2. The step issues a few per block of keys, so that they overlap
 * its arithmetic, and moves off on. */
typedef struct {
    const char *base, *base2;
    int64_t off, len, len2;
    int x; /* the ISA table's prefetch_x (isa.h), >= 1: fa_decode_prefetch_scaled's multiple */
    int per_line; /* the ISA table's prefetch_per_line (isa.h): the counts follow the lines read */
} fa_decode_prefetch;

/* Issues the next `lines` 64-byte lines of pf (none if pf is NULL or spent), to the outer
 * cache levels (prefetcht2: the tile is read once, later in the step). */
static inline void fa_decode_prefetch_lines(fa_decode_prefetch *pf, int lines) {
    if (!pf) return;
    for (int i = 0; i < lines; i++, pf->off += 64) {
        if (pf->off >= pf->len) {
            if (!pf->base2) return;
            pf->base = pf->base2, pf->len = pf->len2, pf->off = 0, pf->base2 = NULL;
        }
        __builtin_prefetch(pf->base + pf->off, 0, 1);
    }
}

/* fa_decode_prefetch_lines of `lines` times pf->x: for the steps whose counts the ISA table
 * scales (fa_decode_kernels.prefetch_x). */
static inline void fa_decode_prefetch_scaled(fa_decode_prefetch *pf, int lines) {
    if (pf) fa_decode_prefetch_lines(pf, lines * pf->x);
}

typedef struct {
    const uint16_t *q, *k, *v;
    int64_t kstride, vstride;
    int m, d, n, dv, ldacc;
    float scale;
    float *mx, *sum, *acc;
    fa_decode_prefetch *pf; /* or NULL */
} fa_decode_step;

/* One tile of one kv head over a cache of f16, bf16, int8 or fp8 e4m3 elements (decode_cache.c,
 * portable; decode_cache_avx512.c, AVX-512): m query rows of d floats (contiguous) against
 * n key and value rows; the element of key j, column c is
 * code(k[j * kstride + c * kcol]) * kscale[j * sstride] (scale NULL: 1), and likewise v. */
typedef struct {
    const float *q;
    const void *k, *v;
    fa_dtype t;
    int64_t kstride, vstride, kcol, vcol;
    const float *kscale, *vscale;
    int64_t sstride;
    int m, d, n, dv;
    fa_decode_prefetch *pf; /* or NULL: the next tile's lines, issued through the step */
    void *ws; /* or NULL: FA_DECODE_CACHE_WS_BYTES the step keeps across a call's tiles (isa.h) */
    /* Nonzero: q's rows at this address hold what they held in every earlier tile of the call
     * with the same tag (the driver stages an item's q once: the tag names the item), so a
     * step may reuse what it made of them without comparing them; 0: unknown. */
    uint64_t q_tag;
} fa_decode_cache_tile;

/* s[r * lds + j] = q_r . k_j for r < m, j < n (the dequantized keys). */
void fa_decode_cache_qk(const fa_decode_cache_tile *t, float *s, int lds);
/* o[r * ldo + c] += sum_j p[r * ldp + j] v_j[c] for r < m, c < dv; guarded: terms with
 * p = 0 left out (a value row a row cannot see may hold inf or NaN: guard.h). */
void fa_decode_cache_pv(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo, int guarded);
/* The AVX-512 forms (contiguous rows: kcol = vcol = 1; pv never guarded). */
void fa_decode_cache_qk_avx512(const fa_decode_cache_tile *t, float *s, int lds);
void fa_decode_cache_pv_avx512(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo);
/* A whole online-softmax step where the scores are the scaled products and every key is
 * visible to every row (as fa_decode_step_bf16): running max mx, sum and accumulators acc
 * (ldacc apart) of the m rows; p rounded to pd (the problem's dtype) before p V. The tables'
 * step: fp8 caches take fa_decode_cache_step_fp16 below where it runs, the rest the f32 step. */
void fa_decode_cache_step_avx512(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                                 float *acc, int ldacc);
/* The same step in f32 for every cache type (decode_cache_avx512.c's vector loops). */
void fa_decode_cache_step_f32_avx512(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                                     float *acc, int ldacc);
/* The same step with integer products in the AMX tile unit (decode_cache_amx.c): int8 caches
 * with head dims up to 128 on CPUs with AMX-INT8; others take the AVX-512 step. */
void fa_decode_cache_step_amx(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                              float *acc, int ldacc);
/* The same step for fp8 caches and bf16 problems in f16 arithmetic (decode_cache_fp16.c) on
 * CPUs with AVX512_FP16 and GFNI, whatever the ISA table: 1 where it ran, 0 where it
 * declined (nothing changed then: another CPU, other head dims, a non-finite q element or
 * scale, a NaN code). */
int fa_decode_cache_step_fp16(const fa_decode_cache_tile *t, float scale, fa_dtype pd, float *mx, float *sum,
                              float *acc, int ldacc);

/* The head dims the bf16 kernels below take (their scores read q and key rows in 8-dim
 * halves of 16-dim slices, 16 slices at most): decode.c sends them no other problem. */
#define FA_DECODE_BF16_MAX_D 256
static inline int fa_decode_bf16_head_dim(int64_t d) { return d >= 8 && d % 8 == 0 && d <= FA_DECODE_BF16_MAX_D; }

/* Scores of m query rows against n keys (d: fa_decode_bf16_head_dim). */
void fa_decode_qk_bf16(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s, int lds);
/* acc += p V over n value rows. */
void fa_decode_pv_bf16(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                       int ldo);
/* A whole online-softmax step of a tile whose scores are the scaled products and nothing
 * else (every key visible to every row, no softcap, ALiBi or bias): scores, row max,
 * exp, bf16 rounding of p, sum, rescale and p V, in registers. */
void fa_decode_step_bf16(const fa_decode_step *t);
/* The same step in the AMX tile unit (decode_bf16_amx.c; CPUs with AMX-BF16, the amx
 * table's step): where fa_decode_step_bf16_amx_takes(t) (head and value dims multiples of 32
 * up to 128) and its p V products hold no inf or NaN (as where a value row holds one); other
 * steps go to fa_decode_step_bf16. */
void fa_decode_step_bf16_amx(const fa_decode_step *t);
int fa_decode_step_bf16_amx_takes(const fa_decode_step *t);

#endif
