/* The block-sparse mask object (flashattn.h, "masks as data"; docs/masks.md): its layout,
 * the builder every constructor goes through (mask.c) and the view the schedule reads
 * (schedule_mask.h). */
#ifndef FA_MASK_H
#define FA_MASK_H

#include "flashattn.h"
#include "schedule_mask.h"

#include <stdint.h>

struct fa_mask {
    int refs;            /* the caller's and each plan's (atomic builtins: plans may be made on many threads) */
    fa_mask_shape s;     /* blocks resolved (never 0) */
    int64_t nqb, nkb;    /* blocks per column and per row */
    int8_t *kinds;       /* [batch, heads, nqb, nkb] fa_block_kind */
    int64_t *bitmap_at;  /* same shape: a partial block's offset in bits, else -1 */
    uint8_t *bits;       /* the partial blocks' bitmaps, block_q x block_k bytes each, 0 or 1,
                            0 past seq_q / seq_k */
    int64_t *pop;        /* same shape: visible pairs of each block (precomputed, so that a
                            plan's cost takes time proportional to the blocks) */
    int32_t *col_lo, *col_hi; /* same shape: the first and last key of each block that one of
                            its rows sees, from the block's first key (-1 in an empty block):
                            the forward's pairs compute only keys between (schedule_mask.h) */
    int16_t *row_stats;  /* the partial blocks' rows, block_q a block in the order of bits: the
                            row's first and last visible key (from the block's first key) and
                            their count, 3 each (0, -1, 0: none), so that the plan counts a
                            row the problem's masks show whole without reading it */
    int64_t visible, full, partial; /* totals over every block */
};

/* A plan's own reference (released by fa_mask_destroy). NULL is fine. */
void fa_mask_retain(const fa_mask *m);
/* FA_ERR_INVALID unless m (NULL: no mask) fits problem p: seq_q and seq_k equal, batch 1 or
 * B, heads 1 or Hq. */
fa_status fa_mask_check_problem(const fa_mask *m, const fa_problem *p);
/* FA_OK if the shape is one a mask can have (sizes >= 1, blocks in [1, 4096], at most 2^40
 * blocks), with *r the shape and its default blocks (0: 128) resolved; else the error, in fn's
 * name. Every constructor checks it before it reads anything the shape sizes. */
fa_status fa_mask_check_shape(const fa_mask_shape *s, const char *fn, fa_mask_shape *r);

/* The view of batch item b, query head h (broadcast dims read index 0); NULL: no mask. */
static inline fa_sched_mask fa_mask_view(const fa_mask *m, int64_t b, int64_t h) {
    fa_sched_mask v = {1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (!m) return v;
    const int64_t bb = m->s.batch == 1 ? 0 : b, hh = m->s.heads == 1 ? 0 : h;
    const int64_t base = (bb * m->s.heads + hh) * m->nqb * m->nkb;
    v.bq = m->s.block_q, v.bk = m->s.block_k, v.nqb = m->nqb, v.nkb = m->nkb;
    v.kinds = m->kinds + base, v.bitmap_at = m->bitmap_at + base, v.bits = m->bits, v.pop = m->pop + base;
    v.col_lo = m->col_lo + base, v.col_hi = m->col_hi + base, v.row_stats = m->row_stats;
    return v;
}

/* Tiles that fit the mask's blocks (docs/masks.md): a tile edge that neither divides nor is
 * a multiple of the block edge becomes the largest multiple of the block not above it, or,
 * for a block larger than the edge, the block itself (up to 1024: the scratch grows with
 * the tile). Any tiling is exact; fitted ones skip whole blocks and run full ones unmasked. */
static inline void fa_mask_fit_edge(int64_t block, int64_t *edge) {
    if (*edge % block == 0 || block % *edge == 0) return;
    if (block < *edge) *edge = *edge / block * block;
    else if (block <= 1024) *edge = block;
}
static inline void fa_mask_fit_tile(const fa_mask *m, int64_t *bq, int64_t *bk) {
    if (!m) return;
    fa_mask_fit_edge(m->s.block_q, bq);
    fa_mask_fit_edge(m->s.block_k, bk);
}

/* The constructors' one builder. For every block, in row-major order of
 * [batch, heads, nqb, nkb], block() names its kind over rows [r0, r1) x keys [c0, c1)
 * (FA_BLOCK_*, or -1: not known, look at the elements); for a partial or unknown block
 * row() then writes each of its rows i, the c1 - c0 bytes of keys [c0, c1) (1: attend, 0:
 * not), a row at a time so that an interval or a copied bitmap row costs a memset or a
 * copy rather than a call per element; the block is kept as partial when keep_partial, else
 * classified by its elements (none: empty, all: full). */
typedef struct {
    int (*block)(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
    void (*row)(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out);
    void *ctx;
    int keep_partial;
} fa_mask_source;
fa_status fa_mask_build(const fa_mask_shape *s, const fa_mask_source *src, const char *fn, fa_mask **out);

#endif /* FA_MASK_H */
