/* The block-sparse mask object (flashattn.h, "masks as data"; docs/masks.md): its layout,
 * the builder every constructor goes through (mask.c) and the view the schedule reads
 * (schedule_mask.h). */
#ifndef FA_MASK_H
#define FA_MASK_H

#include "flashattn.h"
#include "schedule_mask.h"

#include <stdatomic.h>
#include <stdint.h>

struct fa_mask {
    atomic_int refs;     /* the caller's and each plan's */
    fa_mask_shape s;     /* blocks resolved (never 0) */
    int64_t nqb, nkb;    /* blocks per column and per row */
    int8_t *kinds;       /* [batch, heads, nqb, nkb] fa_block_kind */
    int64_t *bitmap_at;  /* same shape: a partial block's offset in bits, else -1 */
    uint8_t *bits;       /* the partial blocks' bitmaps, block_q x block_k bytes each, 0 or 1,
                            0 past seq_q / seq_k */
    int64_t *pop;        /* same shape: visible pairs of each block (precomputed, so that a
                            plan's cost takes time proportional to the blocks) */
    int64_t visible, full, partial; /* totals over every block */
};

/* A plan's own reference (released by fa_mask_destroy). */
void fa_mask_retain(const fa_mask *m);

/* The view of batch item b, query head h (broadcast dims read index 0); NULL: no mask. */
static inline fa_sched_mask fa_mask_view(const fa_mask *m, int64_t b, int64_t h) {
    fa_sched_mask v = {1, 1, 0, 0, 0, 0, 0, 0};
    if (!m) return v;
    const int64_t bb = m->s.batch == 1 ? 0 : b, hh = m->s.heads == 1 ? 0 : h;
    const int64_t base = (bb * m->s.heads + hh) * m->nqb * m->nkb;
    v.bq = m->s.block_q, v.bk = m->s.block_k, v.nqb = m->nqb, v.nkb = m->nkb;
    v.kinds = m->kinds + base, v.bitmap_at = m->bitmap_at + base, v.bits = m->bits, v.pop = m->pop + base;
    return v;
}

/* The constructors' one builder. For every block, in row-major order of
 * [batch, heads, nqb, nkb], block() names its kind over rows [r0, r1) x keys [c0, c1)
 * (FA_BLOCK_*, or -1: not known, look at the elements); for a partial or unknown block
 * elem() then gives each element (nonzero: attend), and the block is kept as partial when
 * keep_partial, else classified by its elements (none: empty, all: full). */
typedef struct {
    int (*block)(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
    int (*elem)(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j);
    void *ctx;
    int keep_partial;
} fa_mask_source;
fa_status fa_mask_build(const fa_mask_shape *s, const fa_mask_source *src, const char *fn, fa_mask **out);

#endif /* FA_MASK_H */
