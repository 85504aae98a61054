/* The CPU backward's two-pass schedule: FlashAttention-2's two passes, deterministic and
 * without atomics. The work on one tile pair is backward_tile.h's; the entry, delta and
 * the threads are backward_run.c's.
 *
 *   (1) dK/dV: one item per (b, kv head, key tile). The item owns its dK and dV tiles (f32
 *       accumulators) and visits, for each query head of its GQA group, every query tile
 *       whose key tiles hold this key tile (schedule.h, fa_sched_query_tiles): it
 *       recomputes p and dS (fa_bwd_tile), then dV += P^T dO and dK += dS^T Q; dK is
 *       scaled and both are written once.
 *   (2) dQ: one item per (b, query head, query tile): the same tiles, dQ += dS K, written
 *       once. With dbias, one item per (bias slice, query tile) instead: it zeroes its rows
 *       of the slice and visits the (b, query head) pairs that read the slice, b then h
 *       ascending, each adding bias_scale * p (dP - delta) to them. No scratch, no extra
 *       products. A bias row shared by all query rows (bias_seq_q 1): one item per slice,
 *       its query tiles ascending within each (b, h).
 *
 * Every output element is owned by one item and summed in a fixed order, so results are
 * bit-identical across runs and thread counts. Counting follows the COUNTING RULES in
 * internal.h. */
#include "backward_run.h"

#include <string.h>

/* One thread's scratch (two_pass_carve). */
typedef struct {
    void *qa, *ga;      /* Q, dO tile packed as A (S = Q K^T, dP = dO V^T) */
    void *qb, *gb;      /* Q, dO tile packed as B (dK += dS^T Q, dV += P^T dO) */
    fa_bwd_tile_buf t;  /* the key side and the pair */
    float *acc, *acc_v; /* dK (bk x D) or dQ (bq x D); dV (bk x Dv) */
} two_pass_scratch;

/* Lays the pieces out from base (or only measures, when base is NULL); returns the bytes. */
static int64_t two_pass_carve(const fa_plan *pl, char *base, two_pass_scratch *w) {
    const fa_isa *isa = pl->isa;
    const fa_dtype t = pl->p.dtype;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, D = pl->p.head_dim, Dv = pl->p.head_dim_v;
    int64_t off = fa_bwd_lay(base, 0, &w->qa, isa->packed_bytes(bq, D, t));
    off = fa_bwd_lay(base, off, &w->ga, isa->packed_bytes(bq, Dv, t));
    off = fa_bwd_lay(base, off, &w->qb, isa->packed_bytes(bq, D, t));
    off = fa_bwd_lay(base, off, &w->gb, isa->packed_bytes(bq, Dv, t));
    off = fa_bwd_lay_tile(pl, base, off, &w->t);
    off = fa_bwd_lay(base, off, &w->acc, 4 * (bq > bk ? bq : bk) * D);
    return fa_bwd_lay(base, off, &w->acc_v, 4 * bk * Dv);
}

int64_t fa_cpu_backward_two_pass_scratch_bytes(const fa_plan *plan) {
    two_pass_scratch w;
    return two_pass_carve(plan, NULL, &w) + FA_BWD_ALIGN; /* slack to align each thread's start */
}

/* (1) One (b, kv head, key tile): dK and dV of keys [c0, c0 + n). */
static void dkdv_item(const fa_bwd_ctx *c, two_pass_scratch *w, int64_t b, int64_t hk, int64_t kt,
                      fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim, Dv = (int)p->head_dim_v;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, group = p->heads_q / p->heads_kv;
    const int64_t c0 = kt * bk;
    const int n = fa_bwd_keys(pl, c0);

    fa_bwd_pack_keys(c, &w->t, b, hk, c0, n); /* (K's source: only the dQ product needs it) */
    memset(w->acc, 0, sizeof(float) * (size_t)n * (size_t)D);
    memset(w->acc_v, 0, sizeof(float) * (size_t)n * (size_t)Dv);
    const fa_sched sched = fa_plan_sched(pl);
    int64_t q0, q1;
    fa_sched_query_tiles(&sched, bq, bk, kt, &q0, &q1);

    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t qt = q0; qt < q1; qt++) {
            const int64_t r0 = qt * bq;
            const int m = fa_bwd_rows(pl, r0);
            const int kind = p->mask ? fa_plan_tile_kind(pl, b, h, r0, r0 + m, c0, c0 + n) : FA_TILE_PARTIAL;
            if (kind == FA_TILE_EMPTY) continue;
            fa_tile_src qs, gs;
            fa_bwd_pack_rows(c, b, h, r0, m, &qs, &gs, w->qa, w->ga);
            /* a NaN row must not reach keys it cannot see through 0 * q or 0 * do (guard.h);
             * such a tile is not packed as B: the guarded product packs its finite runs */
            const int hide = fa_pair_may_hide(pl, kind, r0, r0 + m, c0, n);
            const int q_bad = hide && fa_tile_nonfinite(&qs, m, D);
            const int g_bad = hide && fa_tile_nonfinite(&gs, m, Dv);
            if (!q_bad) isa->pack_b(&qs, m, D, w->qb);
            if (!g_bad) isa->pack_b(&gs, m, Dv, w->gb);
            fa_bwd_tile(c, &w->t, b, h, r0, m, c0, n, w->qa, w->ga, 1, NULL, 0, cnt);
            fa_bwd_dkdv(c, &w->t, m, n, &qs, w->qb, q_bad, &gs, w->gb, g_bad, 0, w->acc, w->acc_v, cnt);
        }
    fa_bwd_store(c, a->dk, &p->k_stride, b, hk, c0, n, D, w->acc, pl->scale);
    fa_bwd_store(c, a->dv, &p->v_stride, b, hk, c0, n, Dv, w->acc_v, fa_bwd_dv_scale(c));
}

/* (2) One (b, query head, query tile): dQ of rows [r0, r0 + m); with dbias (its rows
 * [r0, r0 + m) of the bias slice of (b, h), Sk wide), adds this head's share to it. */
static void dq_item(const fa_bwd_ctx *c, two_pass_scratch *w, int64_t b, int64_t h, int64_t qt, float *dbias,
                    fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, hk = h / (p->heads_q / p->heads_kv);
    const int64_t r0 = qt * bq;
    const int m = fa_bwd_rows(pl, r0);

    memset(w->acc, 0, sizeof(float) * (size_t)m * (size_t)D);
    int64_t k0, k1;
    fa_key_tile_range(pl, r0, r0 + m, bk, &k0, &k1);
    if (k0 < k1) {
        fa_tile_src qs, gs;
        fa_bwd_pack_rows(c, b, h, r0, m, &qs, &gs, w->qa, w->ga);
    }
    for (int64_t kt = k0; kt < k1; kt++) {
        const int64_t c0 = kt * bk;
        const int n = fa_bwd_keys(pl, c0);
        const int kind = p->mask ? fa_plan_tile_kind(pl, b, h, r0, r0 + m, c0, c0 + n) : FA_TILE_PARTIAL;
        if (kind == FA_TILE_EMPTY) continue;
        const fa_tile_src ks = fa_bwd_pack_keys(c, &w->t, b, hk, c0, n);
        const int k_bad = fa_pair_may_hide(pl, kind, r0, r0 + m, c0, n) && fa_tile_nonfinite(&ks, n, D); /* guard.h */
        if (!k_bad) isa->pack_b(&ks, n, D, w->t.kb);
        fa_bwd_tile(c, &w->t, b, h, r0, m, c0, n, w->qa, w->ga, 0, dbias ? dbias + c0 : NULL, fa_bwd_dbias_ld(pl),
                    cnt);
        fa_bwd_dq(c, &w->t, m, n, &ks, k_bad, 0, w->acc, cnt);
    }
    fa_bwd_store(c, a->dq, &p->q_stride, b, h, r0, m, D, w->acc, pl->scale);
}

/* Query tiles per dQ item: 1, or all nq where every query row adds to one dbias row
 * (bias_seq_q 1), so that the item sums them in a fixed order (no two threads share it). */
static int64_t dq_item_tiles(const fa_plan *pl, int64_t nq) {
    return pl->p.bias_grad && pl->p.bias_seq_q == 1 ? nq : 1;
}

/* Item t: the dK/dV items first, then the dQ items (fa_bwd_item_fn). */
static int64_t two_pass_item(const fa_bwd_ctx *c, char *scratch, int64_t t, fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q, bq = pl->bwd_bq;
    const int64_t nq = (Sq + bq - 1) / bq, nk = (p->seq_k + pl->bwd_bk - 1) / pl->bwd_bk;
    two_pass_scratch w;
    two_pass_carve(pl, scratch, &w);
    if (t < B * Hk * nk) {
        dkdv_item(c, &w, t / (Hk * nk), t / nk % Hk, t % nk, cnt);
        return 1;
    }
    t -= B * Hk * nk;
    /* (b, h) pairs per dq item: those that share a dbias slice (1 x 1 without dbias) */
    const int64_t nb = p->bias_grad ? B / p->bias_batch : 1, nh = p->bias_grad ? Hq / p->bias_heads : 1;
    const int64_t nt = dq_item_tiles(pl, nq); /* query tiles per dq item */
    const int64_t items = nq / nt, qt0 = t % items * nt, sb = t / items / (Hq / nh), sh = t / items % (Hq / nh);
    float *db = fa_bwd_dbias_row(c, sb, sh, qt0 * bq); /* the item's rows of its slice */
    if (db) memset(db, 0, sizeof(float) * (size_t)(p->bias_seq_q == 1 ? 1 : fa_bwd_rows(pl, qt0 * bq)) * (size_t)p->seq_k);
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t hi = 0; hi < nh; hi++)
            for (int64_t qt = qt0; qt < qt0 + nt; qt++) dq_item(c, &w, nb == 1 ? sb : bi, nh == 1 ? sh : hi, qt, db, cnt);
    return nb * nh * nt;
}

fa_status fa_cpu_backward_two_pass(const fa_plan *plan, const fa_backward_args *a, char *ws) {
    const fa_problem *p = &plan->p;
    const int64_t B = p->batch, Hq = p->heads_q, bq = plan->bwd_bq, bk = plan->bwd_bk;
    const int64_t nq = (p->seq_q + bq - 1) / bq, nk = (p->seq_k + bk - 1) / bk;
    const int64_t nb = p->bias_grad ? B / p->bias_batch : 1, nh = p->bias_grad ? Hq / p->bias_heads : 1;
    const int64_t dkdv_items = B * p->heads_kv * nk, dq_items = B / nb * (Hq / nh) * (nq / dq_item_tiles(plan, nq));
    return fa_bwd_run(plan, a, ws, fa_cpu_backward_two_pass_scratch_bytes(plan), dkdv_items + dq_items,
                      dkdv_items + B * Hq * nq, two_pass_item);
}
