/* The cost model's sums under a block-sparse mask (docs/masks.md): the tile walk, the
 * visible pairs and the keys an ideal kernel reads, per (batch, head) of the mask and
 * multiplied out over the problem's (b, h) that share it. No closed form here: the walk
 * visits each query tile's key tiles (schedule.h) and asks schedule_mask.h for the pair's
 * kind, so planning takes time proportional to the tiles times the mask blocks each covers,
 * which is the number of blocks where tiles fit them; visible pairs come from each block's
 * precomputed popcount (element by element only where a partial block meets the edge of
 * causal or window). */
#include "internal.h"

typedef __int128 wide;

/* How many of the problem's (b, h) share mask slice (mb, mh). */
static wide sharing(const struct fa_plan *pl) {
    const fa_mask *m = pl->p.mask;
    return (wide)(pl->p.batch / m->s.batch) * (pl->p.heads_q / m->s.heads);
}

/* The walk of one (b, h) under tiles of bq x bk; forward: each pair's keys as the forward
 * computes them (fa_sched_mask_key_span, and per slice of rows fa_sched_mask_slice_keys),
 * else the whole tile's. */
static void walk_one(const struct fa_plan *pl, const fa_sched_mask *v, int64_t bq, int64_t bk, int forward,
                     fa_tile_walk *w) {
    const fa_sched s = fa_plan_sched(pl);
    const int64_t sq = pl->p.seq_q, sk = pl->p.seq_k, nq = (sq + bq - 1) / bq;
    w->qtiles += nq;
    for (int64_t t = 0; t < nq; t++) {
        const int64_t r0 = t * bq, r1 = r0 + bq < sq ? r0 + bq : sq;
        int64_t kt0, kt1;
        fa_sched_key_tiles(&s, r0, r1, bk, &kt0, &kt1);
        fa_sched_mask_narrow_key_tiles(v, r0, r1, bk, &kt0, &kt1); /* only empty pairs cut */
        for (int64_t kt = kt0; kt < kt1; kt++) {
            const int64_t c0 = kt * bk, c1 = c0 + bk < sk ? c0 + bk : sk;
            const int kind = fa_sched_mask_tile_kind(&s, v, r0, r1, c0, c1);
            if (kind == FA_TILE_EMPTY) continue;
            int64_t first;
            const int64_t n = forward ? fa_sched_mask_key_span(&s, v, r0, r1, c0, c1, &first) : c1 - c0;
            if (forward && pl->fwd_slice && kind != FA_TILE_FULL) { /* each slice over its own keys (forward.c) */
                for (int64_t a = r0; a < r1; a += pl->fwd_slice) {
                    const int64_t b = a + pl->fwd_slice < r1 ? a + pl->fwd_slice : r1;
                    const int64_t ns = fa_sched_mask_slice_keys(&s, v, a, b, first, n);
                    w->rows_keys += (wide)(b - a) * ns;
                    w->rows_tiles += ns ? b - a : 0;
                }
            } else {
                w->rows_keys += (wide)(r1 - r0) * n;
                w->rows_tiles += r1 - r0;
            }
            w->keys += c1 - c0;
            w->pairs += 1;
        }
    }
}

static fa_tile_walk walk_all(const struct fa_plan *pl, int64_t bq, int64_t bk, int forward) {
    const fa_problem *p = &pl->p;
    fa_tile_walk w = {0};
    if (!p->mask) {
        fa_tile_walk one = fa_tile_walk_sums(pl, bq, bk);
        if (forward && pl->fwd_slice) { /* each slice over its own keys (forward.c) */
            wide keys, rows;
            fa_tile_walk_slice_cut(pl, bq, bk, pl->fwd_slice, &keys, &rows);
            one.rows_keys -= keys, one.rows_tiles -= rows;
        }
        const wide heads = (wide)p->batch * p->heads_q;
        w.rows_keys = heads * one.rows_keys, w.rows_tiles = heads * one.rows_tiles, w.keys = heads * one.keys;
        w.pairs = heads * one.pairs, w.qtiles = heads * one.qtiles;
        return w;
    }
    const fa_mask *m = p->mask;
    const wide share = sharing(pl);
    for (int64_t b = 0; b < m->s.batch; b++)
        for (int64_t h = 0; h < m->s.heads; h++) {
            fa_tile_walk one = {0};
            const fa_sched_mask v = fa_mask_view(m, b, h);
            walk_one(pl, &v, bq, bk, forward, &one);
            w.rows_keys += share * one.rows_keys, w.rows_tiles += share * one.rows_tiles, w.keys += share * one.keys;
            w.pairs += share * one.pairs, w.qtiles += share * one.qtiles;
        }
    return w;
}

fa_tile_walk fa_tile_walk_all(const struct fa_plan *pl, int64_t bq, int64_t bk) { return walk_all(pl, bq, bk, 0); }
fa_tile_walk fa_tile_walk_forward(const struct fa_plan *pl, int64_t bq, int64_t bk) { return walk_all(pl, bq, bk, 1); }

wide fa_visible_pairs_all(const struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    const fa_sched s = fa_plan_sched(pl);
    if (!p->mask) return (wide)p->batch * p->heads_q * fa_sched_pairs(&s, 0, p->seq_q);
    const fa_mask *m = p->mask;
    wide total = 0;
    for (int64_t b = 0; b < m->s.batch; b++)
        for (int64_t h = 0; h < m->s.heads; h++) {
            const fa_sched_mask v = fa_mask_view(m, b, h);
            total += fa_sched_mask_pairs(&s, &v, 0, p->seq_q, 0, p->seq_k);
        }
    return total * sharing(pl);
}

/* Of mask block (qb, kb) of v, if it is not empty: the keys that causal and window show to
 * some of its rows (the rows' intervals overlap, so these are one interval), and the rows
 * that see some of its keys (one interval: both ends grow); 0 where none. */
static void block_reach(const fa_sched *s, const fa_sched_mask *v, int64_t qb, int64_t kb, int64_t *keys, int64_t *rows) {
    const int64_t r0 = qb * v->bq, r1 = r0 + v->bq < s->seq_q ? r0 + v->bq : s->seq_q;
    const int64_t c0 = kb * v->bk, c1 = c0 + v->bk < s->seq_k ? c0 + v->bk : s->seq_k;
    *keys = *rows = 0;
    if (fa_sched_mask_block(v, qb, kb) == FA_TILE_EMPTY) return;
    const int kind = fa_sched_tile_kind(s, r0, r1, c0, c1);
    if (kind == FA_TILE_EMPTY) return;
    if (kind == FA_TILE_FULL) { /* every row sees every key: no search */
        *keys = c1 - c0, *rows = r1 - r0;
        return;
    }
    int64_t lo, hi;
    fa_sched_span(s, r0, r1, &lo, &hi);
    *keys = (hi < c1 - 1 ? hi : c1 - 1) - (lo > c0 ? lo : c0) + 1;
    int64_t a = r0, z = r1; /* the first row whose hi reaches c0 */
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        if (fa_sched_hi(s, mid) >= c0) z = mid;
        else a = mid + 1;
    }
    const int64_t first = a;
    z = r1; /* the first row past it whose lo passes c1 - 1 */
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        if (fa_sched_lo(s, mid) > c1 - 1) z = mid;
        else a = mid + 1;
    }
    *rows = a - first;
}

/* Keys (rows) of (b, h) that some pair may need: per key (query) block, the most any one
 * block of it reaches, which is at most their union, which every schedule reads. */
static void needed_one(const struct fa_plan *pl, const fa_sched_mask *v, int64_t *keys, int64_t *rows) {
    const fa_sched s = fa_plan_sched(pl);
    *keys = *rows = 0;
    for (int64_t kb = 0; kb < v->nkb; kb++) {
        int64_t most = 0, k, r;
        for (int64_t qb = 0; qb < v->nqb; qb++) {
            block_reach(&s, v, qb, kb, &k, &r);
            most = k > most ? k : most;
        }
        *keys += most;
    }
    for (int64_t qb = 0; qb < v->nqb; qb++) {
        int64_t most = 0, k, r;
        for (int64_t kb = 0; kb < v->nkb; kb++) {
            block_reach(&s, v, qb, kb, &k, &r);
            most = r > most ? r : most;
        }
        *rows += most;
    }
}

/* q rows over every (b, query head) and kv rows over every (b, kv head), the most any of
 * its query heads needs (their union is at least that): each distinct slice of the mask
 * once, since a slice shared by heads or batch items needs the same rows for each. */
void fa_mask_needed_rows(const struct fa_plan *pl, wide *q_rows, wide *kv_rows) {
    const fa_problem *p = &pl->p;
    const fa_mask *m = p->mask;
    const int64_t group = p->heads_q / p->heads_kv;
    wide q = 0, kv = 0;
    for (int64_t b = 0; b < m->s.batch; b++) {
        if (m->s.heads == 1) {
            const fa_sched_mask v = fa_mask_view(m, b, 0);
            int64_t keys, rows;
            needed_one(pl, &v, &keys, &rows);
            q += (wide)rows * p->heads_q, kv += (wide)keys * p->heads_kv;
            continue;
        }
        for (int64_t hk = 0; hk < p->heads_kv; hk++) {
            int64_t most = 0;
            for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
                const fa_sched_mask v = fa_mask_view(m, b, h);
                int64_t keys, rows;
                needed_one(pl, &v, &keys, &rows);
                q += rows, most = keys > most ? keys : most;
            }
            kv += most;
        }
    }
    const wide share = p->batch / m->s.batch;
    *q_rows = q * share, *kv_rows = kv * share;
}
