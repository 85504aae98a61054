/* A block-sparse mask's part of the tile schedule (docs/masks.md): schedule.h's visibility
 * ANDed with the blocks of one (batch, head) of a mask. Plain C on a plain view of the mask
 * (src/mask.h makes one), so that the plan, the cost model and every CPU driver read the
 * same blocks through the same functions:
 *   fa_sched_mask_tile_kind   the kind of a (query tile, key tile) pair: the mask blocks it
 *                             covers combined, then combined with fa_sched_tile_kind
 *   fa_sched_mask_visible     one (row, key) pair
 *   fa_sched_mask_pairs       visible pairs of a rectangle (the cost model's flops_useful)
 *   fa_sched_mask_key_span    the keys of a pair the forward computes (and the plan counts)
 *   fa_sched_mask_slice_keys  of those, the ones a slice of the pair's rows computes
 * A tile may cover several mask blocks, or part of one: any alignment is exact; tiles whose
 * edges fall on block edges are simply the ones that skip and run unmasked the most. */
#ifndef FA_SCHEDULE_MASK_H
#define FA_SCHEDULE_MASK_H

#include "schedule.h"

#include <stdint.h>

/* One (batch, head) of a mask; kinds NULL: no mask (every pair visible). */
typedef struct fa_sched_mask {
    int64_t bq, bk, nqb, nkb;  /* block edges, blocks per column and per row */
    const int8_t *kinds;       /* [nqb, nkb] of FA_BLOCK_* (flashattn.h: EMPTY 0, PARTIAL 1, FULL 2) */
    const int64_t *bitmap_at;  /* [nqb, nkb]: a partial block's offset in bits (else -1) */
    const uint8_t *bits;       /* each partial block's bq x bk bytes, row-major, nonzero = visible */
    const int64_t *pop;        /* [nqb, nkb]: visible pairs of each block */
    const int32_t *col_lo, *col_hi; /* [nqb, nkb]: a block's first and last key some row sees,
                                     * from its first key (-1: empty) */
    const int16_t *row_stats;  /* per row of each partial block (bitmap_at / (bq bk) of them, bq rows
                                * each): its first and last visible key from the block's first
                                * key and their count (0, -1, 0: none); every mask with a
                                * partial block has them (mask.c builds every mask) */
} fa_sched_mask;

/* The block kinds and the tile kinds share their values (checked in mask.c). */
static inline int fa_sched_mask_block(const fa_sched_mask *v, int64_t qb, int64_t kb) {
    return v->kinds[qb * v->nkb + kb];
}

/* The mask blocks that rows [r0, r1) x keys [c0, c1) cover, combined: empty when all are,
 * full when all are, else partial. */
static inline int fa_sched_mask_only_kind(const fa_sched_mask *v, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (!v->kinds) return FA_TILE_FULL;
    if (r1 <= r0 || c1 <= c0) return FA_TILE_EMPTY;
    int any_other = 0, all_full = 1;
    for (int64_t qb = r0 / v->bq; qb <= (r1 - 1) / v->bq; qb++)
        for (int64_t kb = c0 / v->bk; kb <= (c1 - 1) / v->bk; kb++) {
            const int k = fa_sched_mask_block(v, qb, kb);
            if (k != FA_TILE_EMPTY) any_other = 1;
            if (k != FA_TILE_FULL) all_full = 0;
        }
    if (!any_other) return FA_TILE_EMPTY;
    return all_full ? FA_TILE_FULL : FA_TILE_PARTIAL;
}

/* The kind of the pair rows [r0, r1) x keys [c0, c1): the mask's and the problem's masks'
 * (fa_sched_tile_kind) combined by AND. */
static inline int fa_sched_mask_tile_kind(const fa_sched *s, const fa_sched_mask *v, int64_t r0, int64_t r1,
                                          int64_t c0, int64_t c1) {
    const int k = fa_sched_tile_kind(s, r0, r1, c0, c1);
    if (k == FA_TILE_EMPTY || !v->kinds) return k;
    const int m = fa_sched_mask_only_kind(v, r0, r1, c0, c1);
    if (m == FA_TILE_EMPTY) return FA_TILE_EMPTY;
    return k == FA_TILE_FULL && m == FA_TILE_FULL ? FA_TILE_FULL : FA_TILE_PARTIAL;
}

/* Narrows the key tiles [*kt0, *kt1) (bk keys each) of rows [r0, r1) to the span of key
 * tiles that hold a mask block not empty for one of the rows' mask blocks ([*kt1, *kt1)
 * when none does). Every tile cut off pairs with the rows as an empty tile (fa_sched_mask_tile_kind),
 * so a driver that skips empty pairs runs the same pairs; it just does not ask each one's
 * kind (a chunked mask without causal would otherwise ask every key tile). */
static inline void fa_sched_mask_narrow_key_tiles(const fa_sched_mask *v, int64_t r0, int64_t r1, int64_t bk,
                                                  int64_t *kt0, int64_t *kt1) {
    if (!v->kinds || *kt0 >= *kt1 || r1 <= r0) return;
    const int64_t kb0 = *kt0 * bk / v->bk, last = (*kt1 * bk - 1) / v->bk, kb1 = last < v->nkb - 1 ? last : v->nkb - 1;
    int64_t lo = kb1 + 1, hi = kb0 - 1; /* the first and last key block not empty for some row */
    for (int64_t qb = r0 / v->bq; qb <= (r1 - 1) / v->bq; qb++) {
        const int8_t *row = v->kinds + qb * v->nkb;
        for (int64_t kb = kb0; kb < lo; kb++)
            if (row[kb] != FA_TILE_EMPTY) {
                lo = kb;
                break;
            }
        for (int64_t kb = kb1; kb > hi; kb--)
            if (row[kb] != FA_TILE_EMPTY) {
                hi = kb;
                break;
            }
    }
    if (hi < lo) {
        *kt0 = *kt1;
        return;
    }
    const int64_t t0 = lo * v->bk / bk, t1 = ((hi + 1) * v->bk - 1) / bk + 1;
    if (t0 > *kt0) *kt0 = t0;
    if (t1 < *kt1) *kt1 = t1;
    if (*kt0 > *kt1) *kt0 = *kt1;
}

/* The keys [*first, *first + n) of the forward's pair rows [r0, r1) x keys [c0, c1) (not
 * empty) that it computes under a mask, n returned: from the first to the last key a row of
 * the pair may see, by the problem's masks (lo of the first row, hi of the last: both grow
 * with the row) and by the mask's blocks (their first and last keys that a row sees, over
 * the blocks the pair covers), widened to FA_SCHED_TRIM-key steps from c0 (the products'
 * step). Every key outside is hidden from every row of the pair, so the forward skips it: a
 * chunked mask's tile of 256 keys over a chunk's first 128 rows computes 128 of them, and a
 * document's first key tile starts at the step holding its first key. Without a mask the
 * whole tile: unmasked plans keep their tiles as they are. Planned and run alike
 * (cost_mask.c walks it, forward.c computes it). */
#define FA_SCHED_TRIM 32
static inline int64_t fa_sched_mask_key_span(const fa_sched *s, const fa_sched_mask *v, int64_t r0, int64_t r1,
                                             int64_t c0, int64_t c1, int64_t *first) {
    *first = c0;
    if (!v->kinds || r1 <= r0 || c1 <= c0) return c1 - c0;
    int64_t lo = fa_sched_lo(s, r0), hi = fa_sched_hi(s, r1 - 1), mlo = c1, mhi = -1;
    for (int64_t qb = r0 / v->bq; qb <= (r1 - 1) / v->bq; qb++)
        for (int64_t kb = c0 / v->bk; kb <= (c1 - 1) / v->bk; kb++) {
            const int64_t at = qb * v->nkb + kb;
            if (v->kinds[at] == FA_TILE_EMPTY) continue;
            const int64_t a = kb * v->bk + v->col_lo[at], z = kb * v->bk + v->col_hi[at];
            mlo = a < mlo ? a : mlo;
            mhi = z > mhi ? z : mhi;
        }
    lo = lo > mlo ? lo : mlo, hi = hi < mhi ? hi : mhi;
    lo = lo > c0 ? lo : c0, hi = hi < c1 - 1 ? hi : c1 - 1;
    if (hi < lo) return c1 - c0 < FA_SCHED_TRIM ? c1 - c0 : FA_SCHED_TRIM; /* no row sees a key here: one step */
    const int64_t f = (lo - c0) / FA_SCHED_TRIM * FA_SCHED_TRIM;
    const int64_t end = (hi + 1 - c0 + FA_SCHED_TRIM - 1) / FA_SCHED_TRIM * FA_SCHED_TRIM;
    *first = c0 + f;
    return (end < c1 - c0 ? end : c1 - c0) - f;
}

/* Of a pair's computed keys [jf, jf + nt) (fa_sched_mask_key_span), the first ones that its
 * rows [a, b) compute where the forward runs a pair in slices of rows (a plan's fwd_slice):
 * up to the last key a row of them may see, widened to FA_SCHED_TRIM-key steps from jf as the
 * products take prefixes; 0 where no row of them sees a key there. Without a mask that last
 * key is the last row's hi (causal, window); under a mask, the last key the mask's blocks show
 * one of the rows within it (a full block's last key, a partial block's rows' last visible
 * keys, row_stats), and none where the first row's lo is past it. Every key past it is hidden
 * from every row of the slice, so a diagonal pair's first rows skip the keys of its last: a
 * 128 x 128 causal triangle computes 10240 elements in slices of 32 rows instead of 16384.
 * Planned and run alike (cost_walk.c and cost_mask.c, forward.c). */
static inline int64_t fa_sched_mask_slice_keys(const fa_sched *s, const fa_sched_mask *v, int64_t a, int64_t b,
                                               int64_t jf, int64_t nt) {
    if (b <= a || nt <= 0) return nt;
    int64_t hi = fa_sched_hi(s, b - 1), last = -1;
    hi = hi < jf + nt - 1 ? hi : jf + nt - 1;
    if (hi < jf) return 0;
    if (!v->kinds) {
        last = hi;
    } else {
        if (fa_sched_lo(s, a) > hi) return 0;
        for (int64_t qb = a / v->bq; qb <= (b - 1) / v->bq; qb++)
            for (int64_t kb = hi / v->bk; kb >= jf / v->bk && kb * v->bk + v->bk - 1 > last; kb--) {
                const int64_t at = qb * v->nkb + kb;
                const int kind = v->kinds[at];
                if (kind == FA_TILE_EMPTY) continue;
                int64_t z = kb * v->bk + v->bk - 1; /* a full block: its last key */
                if (kind != FA_TILE_FULL) {
                    const int64_t nth = v->bitmap_at[at] / (v->bq * v->bk), r0 = qb * v->bq;
                    const int64_t i0 = a > r0 ? a : r0, i1 = b < r0 + v->bq ? b : r0 + v->bq;
                    int64_t most = -1;
                    for (int64_t i = i0; i < i1; i++) {
                        const int16_t l = v->row_stats[(nth * v->bq + i - r0) * 3 + 1];
                        most = l > most ? l : most;
                    }
                    if (most < 0) continue; /* these rows see nothing in this block */
                    z = kb * v->bk + most;
                }
                z = z < hi ? z : hi;
                last = z > last ? z : last;
                break; /* blocks to the left end sooner */
            }
    }
    if (last < jf) return 0;
    const int64_t end = (last + 1 - jf + FA_SCHED_TRIM - 1) / FA_SCHED_TRIM * FA_SCHED_TRIM;
    return end < nt ? end : nt;
}

/* Does the mask let row i see key j (0 <= i < Sq, 0 <= j < Sk)? */
static inline int fa_sched_mask_visible(const fa_sched_mask *v, int64_t i, int64_t j) {
    if (!v->kinds) return 1;
    const int64_t qb = i / v->bq, kb = j / v->bk;
    const int k = fa_sched_mask_block(v, qb, kb);
    if (k != FA_TILE_PARTIAL) return k == FA_TILE_FULL;
    return v->bits[v->bitmap_at[qb * v->nkb + kb] + (i - qb * v->bq) * v->bk + (j - kb * v->bk)] != 0;
}

/* The bitmap row of row i in key block kb when that block is partial (else NULL): bytes for
 * keys kb * bk .. kb * bk + bk - 1. */
static inline const uint8_t *fa_sched_mask_row(const fa_sched_mask *v, int64_t i, int64_t kb) {
    const int64_t qb = i / v->bq, at = v->bitmap_at[qb * v->nkb + kb];
    return at < 0 ? (const uint8_t *)0 : v->bits + at + (i - qb * v->bq) * v->bk;
}

/* 1 when the mask shows row i every key of [j0, j0 + n): its blocks there are all full. */
static inline int fa_sched_mask_row_full(const fa_sched_mask *v, int64_t i, int64_t j0, int64_t n) {
    if (!v->kinds) return 1;
    const int64_t qb = i / v->bq;
    for (int64_t kb = j0 / v->bk; kb <= (j0 + n - 1) / v->bk; kb++)
        if (fa_sched_mask_block(v, qb, kb) != FA_TILE_FULL) return 0;
    return 1;
}

#if !defined(__CUDACC__)
/* Pairs of rows [r0, r1) x keys [c0, c1) that the problem's masks show, in closed form: for
 * each row, clamp(hi + 1, c0, c1) - clamp(lo, c0, c1), each end a clamped line
 * (fa_sched_pairs' rule on a window of keys). */
static inline __int128 fa_sched_rect_pairs(const fa_sched *s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return 0;
    const __int128 n = (__int128)r1 - r0, w = c1 - c0, d0 = (__int128)s->off + r0 - c0;
    __int128 hi_sum = n * w, lo_sum = 0;
    if (s->causal || s->window_right >= 0)
        hi_sum = fa_sched_sum_clamped(d0 + (s->causal ? 0 : s->window_right) + 1, n, w);
    if (s->window_left >= 0) lo_sum = fa_sched_sum_clamped(d0 - s->window_left, n, w);
    return hi_sum - lo_sum;
}

/* Visible pairs of rows [r0, r1) x keys [c0, c1) under the problem's masks AND the mask:
 * per mask block, its popcount where the problem's masks show all of it, the closed form
 * where the mask shows all of it, element by element only where both are partial (blocks
 * along the problem masks' edges). */
static inline __int128 fa_sched_mask_pairs(const fa_sched *s, const fa_sched_mask *v, int64_t r0, int64_t r1,
                                           int64_t c0, int64_t c1) {
    if (!v->kinds) return fa_sched_rect_pairs(s, r0, r1, c0, c1);
    if (r1 <= r0 || c1 <= c0) return 0;
    __int128 total = 0;
    for (int64_t qb = r0 / v->bq; qb <= (r1 - 1) / v->bq; qb++)
        for (int64_t kb = c0 / v->bk; kb <= (c1 - 1) / v->bk; kb++) {
            const int m = fa_sched_mask_block(v, qb, kb);
            if (m == FA_TILE_EMPTY) continue;
            const int64_t a0 = qb * v->bq > r0 ? qb * v->bq : r0, a1 = qb * v->bq + v->bq < r1 ? qb * v->bq + v->bq : r1;
            const int64_t b0 = kb * v->bk > c0 ? kb * v->bk : c0, b1 = kb * v->bk + v->bk < c1 ? kb * v->bk + v->bk : c1;
            const int k = fa_sched_tile_kind(s, a0, a1, b0, b1);
            if (k == FA_TILE_EMPTY) continue;
            const int64_t qe = (qb + 1) * v->bq < s->seq_q ? (qb + 1) * v->bq : s->seq_q;
            const int64_t ke = (kb + 1) * v->bk < s->seq_k ? (kb + 1) * v->bk : s->seq_k;
            const int whole = a0 == qb * v->bq && a1 == qe && b0 == kb * v->bk && b1 == ke;
            if (m == FA_TILE_FULL) total += fa_sched_rect_pairs(s, a0, a1, b0, b1);
            else if (k == FA_TILE_FULL && whole) total += v->pop[qb * v->nkb + kb];
            else { /* per row, the bitmap's ones over the keys [lo, hi] the row sees (bytes are 0 or
                    * 1): the row's count where those keys hold all its ones, else read between */
                const int64_t nth = v->bitmap_at[qb * v->nkb + kb] / (v->bq * v->bk); /* of the partial blocks */
                for (int64_t i = a0; i < a1; i++) {
                    const uint8_t *row = fa_sched_mask_row(v, i, kb) - kb * v->bk;
                    const int64_t lo = fa_sched_lo(s, i), hi = fa_sched_hi(s, i);
                    int64_t j0 = lo > b0 ? lo : b0, j1 = hi + 1 < b1 ? hi + 1 : b1;
                    const int16_t *st = v->row_stats + (nth * v->bq + i - qb * v->bq) * 3;
                    const int64_t f = kb * v->bk + st[0], l = kb * v->bk + st[1];
                    if (j0 <= f && l < j1) {
                        total += st[2];
                        continue;
                    }
                    j0 = j0 > f ? j0 : f, j1 = j1 < l + 1 ? j1 : l + 1;
                    uint32_t ones = 0; /* a block row has at most 4096 keys (mask.c) */
                    for (int64_t j = j0; j < j1; j++) ones += row[j];
                    total += ones;
                }
            }
        }
    return total;
}
#endif

#endif /* FA_SCHEDULE_MASK_H */
