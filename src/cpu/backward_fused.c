/* The CPU backward's one-pass schedule: FlashAttention-2's five products per tile pair,
 * with dQ accumulated in a fixed order, so results stay bit-identical across thread
 * counts. The work on one tile pair is backward_tile.h's; the entry, delta and the threads
 * are backward_run.c's.
 *
 * One work item per (b, kv head), run by one thread from start to end, with f32 dK, dV
 * accumulators for all its keys. For each query head of the GQA group (ascending), for
 * each key tile (ascending), K and V are packed, and for each query tile that visits it
 * (ascending): p and dS (fa_bwd_tile), and
 *     dV += P^T dO,   dK += dS^T Q,   dQ += dS K.
 * A query tile's Q and dO are packed once per head, at its first pair, and its f32 dQ rows
 * zeroed then; they are written (scaled) after its last key tile, and a key tile's dK
 * (scaled) and dV after its pairs in the group's last head: each while still in cache
 * (fused_item). dbias, where asked, is zeroed by the item and summed in the same walk.
 *
 * Every output element belongs to one item and every sum runs in the walk's fixed order,
 * whatever the thread count. The order is also the two-pass schedule's (backward.c): dK, dV
 * over (head, query tile) ascending, dQ over key tiles ascending, through the same
 * microkernel calls on the same tile shapes, so both schedules give the same bits.
 *
 * Against the two-pass schedule, it saves the recomputation of S, dP and p in the dQ pass
 * (3 of 8 products; 10 x m x n x D flops per pair instead of 14) and one exp per score,
 * and packs Q and dO once per head instead of once per tile pair, at the price of a
 * thread scratch that grows with Sq and Sk (the packed head, dQ, dK and dV: about
 * 4 (2 Sq (D + Dv) + Sq D + Sk (D + Dv)) bytes) and fewer work items (B x Hk). The plan
 * takes it when the shapes make that worthwhile (fa_cpu_backward_fused_fits);
 * FA_BWD_SCHEDULE=fused|two-pass forces either. */
#include "backward_run.h"

#include <stdlib.h>
#include <string.h>

/* Below this many (b, kv head) items, the two-pass schedule's finer items keep more
 * threads busy. A shape-only rule: the schedule never depends on the thread count. */
#define FUSED_MIN_ITEMS 8
/* Above this, a thread's scratch (which grows with Sq and Sk) costs more memory than the
 * recomputation it saves is worth; the two-pass schedule's is a few tiles. */
#define FUSED_MAX_SCRATCH ((int64_t)64 << 20)

typedef struct {
    void *qa, *ga;     /* every query tile of the head's Q, dO packed as A (S = Q K^T, dP = dO V^T) */
    void *qb, *gb;     /* ... and as B (dK += dS^T Q, dV += P^T dO); tile qt at qt x the stride */
    int64_t sa_q, sa_g; /* bytes from one packed query tile of Q, dO to the next (A and B alike) */
    fa_bwd_tile_buf t; /* the key side and the pair */
    float *dk, *dv;    /* Sk x D, Sk x Dv: the item's accumulators */
    float *dq;         /* Sq x D: the head's dQ accumulators */
    int64_t *q_last;   /* per query tile: the last key tile it may visit (-1: none) */
    int8_t *q_state;   /* per query tile: Q bad, dO bad (-1: not checked yet), dQ zeroed */
} fused_scratch;

/* Lays the pieces out from base (or only measures, when base is NULL); returns the bytes. */
static int64_t fused_carve(const fa_plan *pl, char *base, fused_scratch *w) {
    const fa_isa *isa = pl->isa;
    const fa_dtype t = pl->p.dtype;
    const int64_t bq = pl->bwd_bq, D = pl->p.head_dim, Dv = pl->p.head_dim_v;
    const int64_t Sq = pl->p.seq_q, Sk = pl->p.seq_k, nq = (Sq + bq - 1) / bq;
    w->sa_q = fa_bwd_round_up(isa->packed_bytes(bq, D, t));
    w->sa_g = fa_bwd_round_up(isa->packed_bytes(bq, Dv, t));
    /* packed_bytes covers every pack_* layout (isa.h): the B packs take the A strides */
    int64_t off = fa_bwd_lay(base, 0, &w->qa, nq * w->sa_q);
    off = fa_bwd_lay(base, off, &w->ga, nq * w->sa_g);
    off = fa_bwd_lay(base, off, &w->qb, nq * w->sa_q);
    off = fa_bwd_lay(base, off, &w->gb, nq * w->sa_g);
    off = fa_bwd_lay_tile(pl, base, off, &w->t);
    off = fa_bwd_lay(base, off, &w->dk, 4 * Sk * D);
    off = fa_bwd_lay(base, off, &w->dv, 4 * Sk * Dv);
    off = fa_bwd_lay(base, off, &w->dq, 4 * Sq * D);
    off = fa_bwd_lay(base, off, &w->q_last, 8 * nq);
    return fa_bwd_lay(base, off, &w->q_state, 3 * nq);
}

int64_t fa_cpu_backward_fused_scratch_bytes(const struct fa_plan *plan) {
    fused_scratch w;
    return fused_carve(plan, NULL, &w) + FA_BWD_ALIGN; /* slack to align each thread's start */
}

int fa_cpu_backward_fused_fits(const struct fa_plan *plan) {
    const fa_problem *p = &plan->p;
    const char *force = getenv("FA_BWD_SCHEDULE");
    /* dbias slices must each belong to one item (one (b, kv head)) for a fixed order */
    const int dbias_shared = p->bias_grad && ((p->bias_batch == 1 && p->batch > 1) ||
                                              (p->bias_heads == 1 && p->heads_kv > 1));
    if (dbias_shared) return 0;
    if (force && strcmp(force, "fused") == 0) return 1;
    if (force && strcmp(force, "two-pass") == 0) return 0;
    return p->batch * p->heads_kv >= FUSED_MIN_ITEMS &&
           fa_cpu_backward_fused_scratch_bytes(plan) <= FUSED_MAX_SCRATCH;
}

/* The last key tile query rows [r0, r1) of (b, h) may visit, -1 if none: the schedule's
 * key tiles (schedule.h: exactly those whose fa_sched_query_tiles hold the query tile), cut
 * to the mask's non-empty ones (schedule_mask.h), so every pair the walk runs lies before. */
static int64_t fused_last_key_tile(const fa_plan *pl, const fa_sched *sched, int64_t b, int64_t h, int64_t r0,
                                   int64_t r1) {
    int64_t k0, k1;
    fa_sched_key_tiles(sched, r0, r1, pl->bwd_bk, &k0, &k1);
    const fa_sched_mask v = fa_mask_view(pl->p.mask, b, h);
    fa_sched_mask_narrow_key_tiles(&v, r0, r1, pl->bwd_bk, &k0, &k1);
    return k0 < k1 ? k1 - 1 : -1;
}

/* Writes query tile qt's dQ rows (scaled), zeroed first if no pair of it ran. */
static void fused_write_dq(const fa_bwd_ctx *c, const fused_scratch *w, int64_t b, int64_t h, int64_t qt) {
    const fa_plan *pl = c->pl;
    const int64_t r0 = qt * pl->bwd_bq, D = pl->p.head_dim;
    const int m = fa_bwd_rows(pl, r0);
    if (!w->q_state[3 * qt + 2]) memset(w->dq + r0 * D, 0, sizeof(float) * (size_t)(m * D));
    fa_bwd_store(c, c->a->dq, &pl->p.q_stride, b, h, r0, m, (int)D, w->dq + r0 * D, pl->scale);
}

/* One (b, kv head): dK, dV of all its keys, dQ (and dbias) of its query heads
 * (fa_bwd_item_fn, t = b Hk + hk). A query tile's dQ rows are zeroed at its first pair and
 * written after its last key tile, and a key tile's dK, dV rows written after its pairs in
 * the group's last head (zeroed before them when the group is one head): each while it is
 * still in cache, where zeroing and writing whole Sq x D and Sk x D buffers went to memory
 * when they outgrow L2 (the sums and their order are unchanged). Inf and NaN in a query
 * tile's Q and dO are checked once per head (guard.h), at its first pair that may hide. */
static int64_t fused_item(const fa_bwd_ctx *c, char *scratch, int64_t t, fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim, Dv = (int)p->head_dim_v;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, Sq = p->seq_q, Sk = p->seq_k;
    const int64_t b = t / p->heads_kv, hk = t % p->heads_kv;
    const int64_t group = p->heads_q / p->heads_kv, h0 = hk * group;
    const int64_t nq = (Sq + bq - 1) / bq, nk = (Sk + bk - 1) / bk;
    const fa_sched sched = fa_plan_sched(pl);
    fused_scratch w;
    fused_carve(pl, scratch, &w);

    if (group > 1) { /* summed over the group's heads */
        memset(w.dk, 0, sizeof(float) * (size_t)(Sk * D));
        memset(w.dv, 0, sizeof(float) * (size_t)(Sk * Dv));
    }
    if (p->bias_grad) /* the item's slices (one when the heads share it) */
        for (int64_t h = h0; h < h0 + group && (h == h0 || p->bias_heads != 1); h++)
            memset(fa_bwd_dbias_row(c, b, h, 0), 0, sizeof(float) * (size_t)(p->bias_seq_q * Sk));
    for (int64_t h = h0; h < h0 + group; h++) {
        const int last_head = h == h0 + group - 1;
        for (int64_t qt = 0; qt < nq; qt++) {
            const int64_t r0 = qt * bq;
            w.q_last[qt] = fused_last_key_tile(pl, &sched, b, h, r0, r0 + fa_bwd_rows(pl, r0));
            w.q_state[3 * qt] = w.q_state[3 * qt + 1] = -1;
            w.q_state[3 * qt + 2] = 0;
            if (w.q_last[qt] < 0) fused_write_dq(c, &w, b, h, qt); /* no pair: its dQ is 0 */
        }
        for (int64_t kt = 0; kt < nk; kt++) {
            const int64_t c0 = kt * bk;
            const int n = fa_bwd_keys(pl, c0);
            int64_t q0, q1; /* the query tiles that visit this key tile */
            fa_sched_query_tiles(&sched, bq, bk, kt, &q0, &q1);
            if (group == 1) {
                memset(w.dk + c0 * D, 0, sizeof(float) * (size_t)(n * D));
                memset(w.dv + c0 * Dv, 0, sizeof(float) * (size_t)(n * Dv));
            }
            fa_tile_src ks;
            int k_bad = -1; /* checked once, when a pair can hide a key (guard.h) */
            for (int64_t qt = q0, packed = 0; qt < q1; qt++) {
                const int64_t r0 = qt * bq;
                const int m = fa_bwd_rows(pl, r0);
                const int kind = p->mask ? fa_plan_tile_kind(pl, b, h, r0, r0 + m, c0, c0 + n) : FA_TILE_PARTIAL;
                if (kind == FA_TILE_EMPTY) continue;
                if (!packed) {
                    ks = fa_bwd_pack_keys(c, &w.t, b, hk, c0, n);
                    isa->pack_b(&ks, n, D, w.t.kb);
                    packed = 1;
                }
                int8_t *st = w.q_state + 3 * qt;
                fa_tile_src qs, gs;
                if (!st[2]) { /* the query tile's first pair: Q and dO packed, dQ zeroed */
                    fa_bwd_pack_rows(c, b, h, r0, m, &qs, &gs, (char *)w.qa + qt * w.sa_q, (char *)w.ga + qt * w.sa_g);
                    isa->pack_b(&qs, m, D, (char *)w.qb + qt * w.sa_q);
                    isa->pack_b(&gs, m, Dv, (char *)w.gb + qt * w.sa_g);
                    memset(w.dq + r0 * D, 0, sizeof(float) * (size_t)(m * D));
                    st[2] = 1;
                } else {
                    fa_bwd_pack_rows(c, b, h, r0, m, &qs, &gs, NULL, NULL);
                }
                float *db = fa_bwd_dbias_row(c, b, h, r0);
                fa_bwd_tile(c, &w.t, b, h, r0, m, c0, n, (char *)w.qa + qt * w.sa_q, (char *)w.ga + qt * w.sa_g,
                            1, db ? db + c0 : NULL, fa_bwd_dbias_ld(pl), cnt);
                /* inf or NaN in q, dO (a NaN row) or k must not cross a zero weight into keys or
                 * rows that cannot see each other: guarded products, each packed head kept */
                const int hide = fa_pair_may_hide(pl, kind, r0, r0 + m, c0, n);
                if (hide && k_bad < 0) k_bad = fa_tile_nonfinite(&ks, n, D);
                if (hide && st[0] < 0) st[0] = (int8_t)fa_tile_nonfinite(&qs, m, D);
                if (hide && st[1] < 0) st[1] = (int8_t)fa_tile_nonfinite(&gs, m, Dv);
                fa_bwd_dkdv(c, &w.t, m, n, &qs, (char *)w.qb + qt * w.sa_q, hide && st[0], &gs,
                            (char *)w.gb + qt * w.sa_g, hide && st[1], 1, w.dk + c0 * D, w.dv + c0 * Dv, cnt);
                fa_bwd_dq(c, &w.t, m, n, &ks, hide && k_bad, 1, w.dq + r0 * D, cnt);
            }
            for (int64_t qt = q0; qt < q1; qt++) /* dQ of the query tiles whose last key tile this is */
                if (w.q_last[qt] == kt) fused_write_dq(c, &w, b, h, qt);
            if (last_head) {
                fa_bwd_store(c, a->dk, &p->k_stride, b, hk, c0, n, D, w.dk + c0 * D, pl->scale);
                fa_bwd_store(c, a->dv, &p->v_stride, b, hk, c0, n, Dv, w.dv + c0 * Dv, fa_bwd_dv_scale(c));
            }
        }
    }
    return 1;
}

/* The one-pass schedule; fa_cpu_backward calls it for plans that chose it, with the
 * arguments and the workspace size already checked. */
fa_status fa_cpu_backward_fused(const struct fa_plan *plan, const fa_backward_args *a, char *ws) {
    const int64_t items = plan->p.batch * plan->p.heads_kv;
    return fa_bwd_run(plan, a, ws, fa_cpu_backward_fused_scratch_bytes(plan), items, items, fused_item);
}
