/* The analytic cost model (docs/semantics.md, "The plan and what its figures mean"). It
 * sums the kernels' own tile schedule (schedule.h), the same for every (batch, head), in
 * closed form (fa_tile_walk_sums: O(log) in the number of query tiles, cost_walk.c), or under
 * a mask per (batch, head) of the mask (cost_mask.c), and applies the
 * counting rules written beside it; no allocation. Sums run in 128 bits and must fit int64
 * at the end. */
#include "backend.h"

#include <string.h>

typedef __int128 wide;
typedef fa_tile_walk tile_walk;

/* What both passes' figures share: the (query, key) pairs visible under causal, window and
 * the mask, over every (batch, head), and with a mask the q and k/v rows an ideal kernel
 * reads (cost_mask.c). Under a mask each walks the mask's blocks, so a plan sums them once. */
typedef struct {
    wide pairs, q_rows, kv_rows;
} shared_sums;

static shared_sums shared(const struct fa_plan *pl) {
    shared_sums ss = {fa_visible_pairs_all(pl), 0, 0};
    if (pl->p.mask) fa_mask_needed_rows(pl, &ss.q_rows, &ss.kv_rows);
    return ss;
}

/* The inputs an ideal kernel must read, each once (min_bytes, docs/semantics.md): the q
 * rows (the backward: also o, dO and lse) of the rows that see a key, the k and v rows of
 * the keys some row sees, the bias at the visible pairs, those rows' and keys' segment ids,
 * and the slopes. Every schedule reads at least these, so min_bytes <= bytes_accessed. */
static wide needed_inputs(const struct fa_plan *pl, const shared_sums *ss, int backward) {
    const fa_problem *p = &pl->p;
    const fa_sched s = fa_plan_sched(pl);
    int64_t r0, r1, lo, hi;
    fa_sched_live_rows(&s, &r0, &r1);
    const wide rows = r1 - r0, keys = fa_sched_span(&s, 0, p->seq_q, &lo, &hi) ? hi - lo + 1 : 0;
    const wide es = (wide)fa_dtype_size(p->dtype), b = p->batch, D = p->head_dim, Dv = p->head_dim_v;
    /* with a mask: the keys of the mask blocks some row may see (cost_mask.c) */
    const wide kv_rows = p->mask ? ss->kv_rows : b * p->heads_kv * keys;
    const wide q_rows = p->mask ? ss->q_rows : b * p->heads_q * rows;
    wide need = q_rows * (backward ? (D + 2 * Dv) * es + 4 : D * es) + kv_rows * (D + Dv) * es;
    /* the bias at the visible pairs (with a mask: their mean over the heads that share a
     * slice); a bias row shared by every query row (bias_seq_q 1) at the keys some row sees
     * (with a mask: their mean over the kv heads) */
    if (p->has_bias && p->bias_seq_q == 1)
        need += (wide)p->bias_batch * p->bias_heads * (p->mask ? kv_rows / (b * p->heads_kv) : keys) * 4;
    else if (p->has_bias)
        need += ss->pairs / (b * p->heads_q / ((wide)p->bias_batch * p->bias_heads)) * 4;
    /* segment ids of those rows and keys (with a mask: their mean over the heads) */
    if (p->has_segment_ids) need += (p->mask ? q_rows / p->heads_q + kv_rows / p->heads_kv : b * (rows + keys)) * 4;
    if (p->has_alibi) need += (wide)p->heads_q * 4;
    if (p->has_sinks) need += (wide)p->heads_q * 4; /* the sinks (the backward's dsink: among its outputs) */
    return need;
}

/* The tile sums over every (batch, query head) (cost_mask.c). */
static tile_walk walk_tiles(const struct fa_plan *pl, int64_t bq, int64_t bk) { return fa_tile_walk_all(pl, bq, bk); }

static int store(wide v, int64_t *out) {
    if (v < 0 || v > (wide)INT64_MAX) return 0;
    *out = (int64_t)v;
    return 1;
}

/* Bytes of every input and output (the optional ones as used), for min and peak figures. */
typedef struct {
    wide q, k, v, o, lse, bias, slopes, segments, dbias, sinks;
} tensor_bytes;

static tensor_bytes sizes(const fa_problem *p) {
    tensor_bytes t;
    const wide es = (wide)fa_dtype_size(p->dtype), b = p->batch;
    t.q = b * p->heads_q * p->seq_q * p->head_dim * es;
    t.k = b * p->heads_kv * p->seq_k * p->head_dim * es;
    t.v = b * p->heads_kv * p->seq_k * p->head_dim_v * es;
    t.o = b * p->heads_q * p->seq_q * p->head_dim_v * es;
    t.lse = b * p->heads_q * p->seq_q * 4;
    t.bias = p->has_bias ? (wide)p->bias_batch * p->bias_heads * p->bias_seq_q * p->seq_k * 4 : 0;
    t.slopes = p->has_alibi ? (wide)p->heads_q * 4 : 0;
    t.segments = p->has_segment_ids ? b * (p->seq_q + p->seq_k) * 4 : 0;
    t.dbias = p->bias_grad ? t.bias : 0; /* f32, the bias's shape */
    t.sinks = p->has_sinks ? (wide)p->heads_q * 4 : 0; /* sinks, and dsink alike */
    return t;
}

static fa_status forward_cost(struct fa_plan *pl, const shared_sums *ss) {
    const fa_problem *p = &pl->p;
    const wide heads = (wide)p->batch * p->heads_q, D = p->head_dim, Dv = p->head_dim_v;
    const wide es = (wide)fa_dtype_size(p->dtype);
    const int softcap = p->softcap > 0;
    tile_walk w = fa_tile_walk_forward(pl, pl->fwd_bq, pl->fwd_bk); /* each pair's keys as computed */
    tensor_bytes t = sizes(p);

    wide flops = w.rows_keys * 2 * (D + Dv);
    /* the log of lse per row, and with sinks the sink's exp per row (sinks.h) */
    wide trans = w.rows_keys * (1 + softcap) + w.rows_tiles + heads * p->seq_q * (1 + p->has_sinks);
    /* per (b, h): q read once, each visited k/v tile once per query tile, o and lse written
     * once; bias read per computed element; kv segment ids per visited key, q's once;
     * the head's slope once per query tile (w sums over every (b, h)) */
    wide all_heads = heads * (wide)p->seq_q * (D * es + Dv * es + 4) + w.keys * (D + Dv) * es;
    if (p->has_bias) all_heads += w.rows_keys * 4;
    if (p->has_segment_ids) all_heads += heads * (wide)p->seq_q * 4 + w.keys * 4;
    if (p->has_alibi) all_heads += w.qtiles * 4;
    wide inputs = t.q + t.k + t.v + t.bias + t.slopes + t.segments + t.sinks, outputs = t.o + t.lse;
    wide work = pl->be->workspace_bytes(pl, FA_FORWARD); /* the backend's own figure (backend.h) */
    wide score = heads * p->seq_q * p->seq_k * 4;

    fa_cost *c = &pl->fwd;
    if (!store(flops, &c->flops) || !store(ss->pairs * 2 * (D + Dv), &c->flops_useful) ||
        !store(trans, &c->transcendentals) || !store(all_heads + t.sinks, &c->bytes_accessed) ||
        !store(needed_inputs(pl, ss, 0) + outputs, &c->min_bytes) || !store(work, &c->workspace_bytes) ||
        !store(inputs + outputs + work, &c->peak_bytes) || !store(inputs + outputs + score, &c->naive_peak_bytes))
        return fa_error(FA_ERR_OVERFLOW, "the forward cost of this problem overflows int64");
    return FA_OK;
}

/* The one-pass backward (backward_fused.c): Delta, then per (b, kv head) every key tile
 * once, visiting the query tiles of its query heads: per computed pair the q and dO tiles
 * and the rows' lse and Delta are read; k, v read and dk, dv written once; dq written once. */
static wide backward_fused_bytes(const struct fa_plan *pl, const tile_walk *w, wide *kv_once) {
    const fa_problem *p = &pl->p;
    const wide D = p->head_dim, Dv = p->head_dim_v, es = (wide)fa_dtype_size(p->dtype), sq = p->seq_q;
    const wide heads = (wide)p->batch * p->heads_q; /* w sums over every (b, h) */
    wide all_heads = heads * sq * (2 * Dv * es + 4) + w->rows_tiles * ((D + Dv) * es + 8) + heads * sq * D * es;
    if (p->has_bias) all_heads += w->rows_keys * 4;
    if (p->has_segment_ids) all_heads += w->rows_tiles * 4 + w->keys * 4;
    if (p->has_alibi) all_heads += w->qtiles * 4;
    if (p->bias_grad) all_heads += w->rows_keys * 8; /* dbias read and written per element */
    tensor_bytes t = sizes(p);
    *kv_once = 2 * (t.k + t.v) + t.dbias;           /* dbias zeroed once */
    return all_heads;
}

/* The backward: Delta = rowsum(dO o); a dk/dv pass over (b, kv head, key tile) visiting
 * the query tiles of its query heads; a dq pass over (b, q head, query tile). Or the
 * one-pass schedule, where the plan chose it. */
static fa_status backward_cost(struct fa_plan *pl, const shared_sums *ss) {
    const fa_problem *p = &pl->p;
    const wide heads = (wide)p->batch * p->heads_q, D = p->head_dim, Dv = p->head_dim_v;
    const wide es = (wide)fa_dtype_size(p->dtype), sq = p->seq_q;
    const int softcap = p->softcap > 0;
    tile_walk w = walk_tiles(pl, pl->bwd_bq, pl->bwd_bk);
    tensor_bytes t = sizes(p);

    const int fused = pl->backend == FA_BACKEND_CPU && pl->bwd_fused;
    wide flops = w.rows_keys * 2 * (fused ? 3 * D + 2 * Dv : (2 * D + 2 * Dv) + (2 * D + Dv));
    /* with sinks, dsink takes one exp per row (backward_run.c) */
    wide trans = (fused ? 1 : 2) * w.rows_keys * (1 + softcap) + (p->has_sinks ? heads * sq : 0);
    /* bytes per query head: Delta reads o and dO and writes Delta; the dk/dv pass reads,
     * per computed pair, the q and dO tiles and the rows' lse and Delta; the dq pass reads
     * q, dO, lse, Delta once per query tile and k, v per computed pair, and writes dq. */
    wide rows_pairs = w.rows_tiles; /* sum over pairs of m (w sums over every (b, h)) */
    wide all_heads = heads * sq * (2 * Dv * es + 4);
    all_heads += rows_pairs * ((D + Dv) * es + 8);
    all_heads += heads * sq * ((D + Dv) * es + 8) + w.keys * (D + Dv) * es + heads * sq * D * es;
    if (p->has_bias) all_heads += 2 * w.rows_keys * 4;
    if (p->has_segment_ids) all_heads += 2 * (rows_pairs * 4 + w.keys * 4);
    if (p->has_alibi) all_heads += 2 * w.qtiles * 4;
    /* dbias: the dq pass zeroes it once, then reads and writes it per computed element */
    if (p->bias_grad) all_heads += w.rows_keys * 8;
    /* per kv head: k and v read once, dk and dv written once, by the dk/dv pass */
    wide kv_once = 2 * (t.k + t.v) + t.dbias;
    if (fused) all_heads = backward_fused_bytes(pl, &w, &kv_once);
    kv_once += 2 * t.sinks; /* sinks read and dsink written once */

    wide inputs = t.q + t.k + t.v + 2 * t.o + t.lse + t.bias + t.slopes + t.segments + t.sinks; /* o and dO */
    wide outputs = t.q + t.k + t.v + t.dbias + t.sinks; /* dq, dk, dv, dbias, dsink */
    wide work = pl->be->workspace_bytes(pl, FA_BACKWARD);
    wide score = heads * sq * p->seq_k * 4;

    fa_cost *c = &pl->bwd;
    if (!store(flops, &c->flops) || !store(ss->pairs * 2 * (3 * D + 2 * Dv), &c->flops_useful) ||
        !store(trans, &c->transcendentals) || !store(all_heads + kv_once, &c->bytes_accessed) ||
        !store(needed_inputs(pl, ss, 1) + outputs, &c->min_bytes) || !store(work, &c->workspace_bytes) ||
        !store(inputs + outputs + work, &c->peak_bytes) || !store(inputs + outputs + score, &c->naive_peak_bytes))
        return fa_error(FA_ERR_OVERFLOW, "the backward cost of this problem overflows int64");
    return FA_OK;
}

/* A dense or decode problem with nothing to compute (fa_problem_empty; packed batches sum
 * their sequences in cost_inference.c, by the same rules): no flops; the forward writes o
 * and lse (rows exist only when seq_k is 0: one log each, as cpu/empty.c counts), the
 * backward zeros dq, dk, dv and dbias; nothing is read but the sinks where rows take lse =
 * sink, no workspace. */
static fa_status empty_cost(struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    const int decode = pl->shape == FA_SHAPE_DECODE;
    tensor_bytes t = sizes(p);
    const wide es = (wide)fa_dtype_size(p->dtype), B = p->batch, Hk = p->heads_kv, D = p->head_dim;
    const wide cache_rows = decode && p->page_size ? (wide)p->num_pages * p->page_size : B * p->seq_k;
    t.k = cache_rows * Hk * D * es, t.v = cache_rows * Hk * p->head_dim_v * es;
    wide extra = 0; /* decode's own inputs: lengths, new rows, the block table */
    if (decode) extra = B * 4 + (p->has_new_kv ? B * p->seq_q * Hk * (D + p->head_dim_v) * es : 0) +
                        (p->page_size ? B * p->max_pages * 4 : 0);
    const wide in = t.q + t.k + t.v + t.bias + t.slopes + t.segments + t.sinks + extra, out = t.o + t.lse;
    /* rows see no key: a log each, and with sinks an exp (cpu/empty.c), lse = sink read from sinks */
    const wide rows = B * p->heads_q * p->seq_q, read = rows > 0 ? t.sinks : 0;
    const wide fwd[8] = {0, 0, rows * (1 + p->has_sinks), out + read, out + read, 0, in + out, in + out};
    /* dq, dk, dv, dbias, dsink */
    const wide bin = in + 2 * t.o + t.lse, bout = t.q + t.k + t.v + t.dbias + t.sinks;
    const wide bwd[8] = {0, 0, 0, bout, bout, 0, bin + bout, bin + bout}; /* decoding's: 0 (fa_cost_compute) */
    fa_cost *c[2] = {&pl->fwd, &pl->bwd};
    const wide *f[2] = {fwd, bwd};
    for (int k = 0; k < 2; k++)
        if (!store(f[k][0], &c[k]->flops) || !store(f[k][1], &c[k]->flops_useful) ||
            !store(f[k][2], &c[k]->transcendentals) || !store(f[k][3], &c[k]->bytes_accessed) ||
            !store(f[k][4], &c[k]->min_bytes) || !store(f[k][5], &c[k]->workspace_bytes) ||
            !store(f[k][6], &c[k]->peak_bytes) || !store(f[k][7], &c[k]->naive_peak_bytes))
            return fa_error(FA_ERR_OVERFLOW, "the cost of this problem overflows int64");
    return FA_OK;
}

fa_status fa_cost_figures(struct fa_plan *pl) {
    if (fa_problem_empty(&pl->p) && pl->shape != FA_SHAPE_VARLEN) return empty_cost(pl);
    if (pl->shape != FA_SHAPE_DENSE) return fa_cost_inference(pl); /* cost_inference.c */
    const shared_sums ss = shared(pl);
    fa_status s = forward_cost(pl, &ss);
    return s || pl->bwd_none ? s : backward_cost(pl, &ss);
}

/* A plan whose backward no backend runs (its supports say so: decoding, lengths per call)
 * states none: every backward figure is 0, for every shape alike (docs/semantics.md), and
 * fa_backward gives the reason. Callers have no error pending: the refusal's is dropped. */
fa_status fa_cost_compute(struct fa_plan *pl) {
    pl->bwd_none = pl->be->supports(&pl->p, FA_BACKWARD, 0) != FA_OK;
    if (pl->bwd_none) fa_clear_error();
    fa_status s = fa_cost_figures(pl);
    if (!s && pl->bwd_none) memset(&pl->bwd, 0, sizeof pl->bwd);
    return s;
}
