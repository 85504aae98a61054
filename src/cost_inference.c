/* The cost model of the inference shapes (docs/semantics.md, "The plan and what its
 * figures mean").
 *
 * Varlen: each packed sequence runs as its own dense problem (fa_varlen_subplan), one after
 * another, so every figure that sums (flops, transcendentals, bytes) is the sum of the
 * sequences' dense figures, and the workspace is the largest sequence's (they share it).
 * O(batch) plus each sequence's closed-form tile sums (cost_walk.c).
 *
 * Decode: one work item per (sequence, kv head, chunk: fa_decode_chunk keys) computes the
 * M = (Hq / Hk) x seq_q rows of its kv head's query heads against its key tiles (tiles of
 * fa_decode_tile keys over the keys some row may see, clipped to the sequence), then a merge
 * per query row combines the chunks in order. Counting rules, per (b, kv head):
 *   per computed tile of n keys: flops 2*M*n*(D + Dv), trans M*n (+ M*n tanh with softcap) + M
 * and per (b, query head, row): trans C_b (one rescale exp per chunk) + 1 (the log of lse)
 * + 1 with sinks (the sink's exp, added once by the merge).
 * Bytes: q, o, lse once; cache bytes of every computed tile once per kv head (the query
 * heads share them); k_new/v_new read and written into the cache; one block-table entry
 * per computed tile; the partial results written and read back by the merge. A quantized
 * cache (cache_dtype int8, fp8) counts its 1-byte codes and an f32 scale per (row, kv head)
 * for k and v each, wherever rows are read or written, and the call's check before anything
 * is written reads the scales of the cached rows and k_new / v_new once more. */
#include "backend.h"

typedef __int128 wide;

static int put(wide v, int64_t *out) {
    if (v < 0 || v > (wide)INT64_MAX) return 0;
    *out = (int64_t)v;
    return 1;
}

static fa_status store_cost(fa_cost *c, const wide f[8], const char *what) {
    if (!put(f[0], &c->flops) || !put(f[1], &c->flops_useful) || !put(f[2], &c->transcendentals) ||
        !put(f[3], &c->bytes_accessed) || !put(f[4], &c->min_bytes) || !put(f[5], &c->workspace_bytes) ||
        !put(f[6], &c->peak_bytes) || !put(f[7], &c->naive_peak_bytes))
        return fa_error(FA_ERR_OVERFLOW, "the %s cost of this problem overflows int64", what);
    return FA_OK;
}

static fa_status varlen_cost(fa_plan *pl) {
    const fa_problem *p = &pl->p;
    const wide es = (wide)fa_dtype_size(p->dtype), Hq = p->heads_q, Hk = p->heads_kv;
    const wide D = p->head_dim, Dv = p->head_dim_v, tq = p->seq_q, tk = p->seq_k;
    wide fwd[8] = {0}, bwd[8] = {0}, ran = 0, keyless = 0; /* sequences computed; sequences of rows without keys */
    for (int64_t b = 0; b < p->batch; b++) {
        fa_plan sub;
        fa_varlen_subplan(pl, b, &sub);
        const wide sq = sub.p.seq_q, sk = sub.p.seq_k;
        if (sq == 0) { /* the backward writes this sequence's dk, dv as zeros */
            bwd[3] += sk * Hk * (D + Dv) * es;
            bwd[4] += sk * Hk * (D + Dv) * es;
            continue;
        }
        if (sk == 0) { /* rows see no key: o = 0, lse = -inf or sink_h (a log each, + an exp with sinks); dq = 0 */
            const wide sink_read = p->has_sinks ? Hq * 4 : 0; /* lse = sink */
            fwd[2] += Hq * sq * (1 + p->has_sinks);
            fwd[3] += Hq * sq * (Dv * es + 4) + sink_read;
            fwd[4] += Hq * sq * (Dv * es + 4) + sink_read;
            bwd[3] += Hq * sq * D * es;
            bwd[4] += Hq * sq * D * es;
            keyless++;
            continue;
        }
        fa_status s = fa_cost_figures(&sub); /* dense: the sequence as its own problem (the parent's bwd_none) */
        if (s) return s;
        const fa_cost *f = &sub.fwd, *g = &sub.bwd;
        fwd[0] += f->flops, fwd[1] += f->flops_useful, fwd[2] += f->transcendentals, fwd[3] += f->bytes_accessed;
        bwd[0] += g->flops, bwd[1] += g->flops_useful, bwd[2] += g->transcendentals, bwd[3] += g->bytes_accessed;
        fwd[4] += f->min_bytes, bwd[4] += g->min_bytes; /* each counts the slopes: once below */
        ran++;
        if (f->workspace_bytes > fwd[5]) fwd[5] = f->workspace_bytes;
        if (g->workspace_bytes > bwd[5]) bwd[5] = g->workspace_bytes;
    }
    if (pl->capacity && ran) { /* made from capacities: the most any call's tiles can take (backend_cpu.c) */
        const wide most = pl->be->workspace_bytes(pl, FA_FORWARD);
        if (most < 0) return fa_error(FA_ERR_OVERFLOW, "the forward's workspace does not fit in int64");
        if (most > fwd[5]) fwd[5] = most;
    }
    const wide q = tq * Hq * D * es, k = tk * Hk * D * es, v = tk * Hk * Dv * es, o = tq * Hq * Dv * es;
    const wide lse = tq * Hq * 4, lens = 2 * ((wide)p->batch + 1) * 4, slopes = p->has_alibi ? Hq * 4 : 0;
    const wide sinks = p->has_sinks ? Hq * 4 : 0;
    const wide score = Hq * tq * tk * 4; /* the naive way: one packed score matrix, masked per segment */
    wide in = q + k + v + lens + slopes + sinks, out = o + lse;
    /* min_bytes: the sequences' own (each a dense problem's needed inputs and outputs), the
     * slopes and sinks (the backward: and dsink) once if any sequence reads them */
    const wide extra = ran > 1 ? ran - 1 : 0, sink_extra = ran + keyless > 1 ? ran + keyless - 1 : 0;
    fwd[4] -= extra * slopes + sink_extra * sinks, bwd[4] -= extra * (slopes + 2 * sinks);
    fwd[6] = in + out + fwd[5], fwd[7] = in + out + score;
    in += 2 * o + lse, out = q + k + v + sinks; /* the backward also reads o, do, lse; writes dq, dk, dv, dsink */
    bwd[6] = in + out + bwd[5], bwd[7] = in + out + score;
    fa_status s = store_cost(&pl->fwd, fwd, "forward");
    return s || pl->bwd_none ? s : store_cost(&pl->bwd, bwd, "backward"); /* none: 0s (fa_cost_compute) */
}

/* Chunks of sequence b that some row sees, and its computed tiles and their keys (a plan
 * made from capacities: the most of any call, fa_decode_chunks and fa_decode_blocks). */
static void decode_walk(const fa_plan *pl, int64_t b, wide *chunks, wide *tiles, wide *keys) {
    int64_t lo, hi;
    fa_decode_key_span(pl, b, &lo, &hi);
    *chunks = *tiles = *keys = 0;
    if (lo > hi) return;
    const int64_t T = fa_decode_tile(&pl->p), sk = fa_decode_keys(pl, b);
    const int64_t t0 = lo / T, t1 = hi / T + 1, end = t1 * T < sk ? t1 * T : sk;
    *chunks = fa_decode_chunks(pl, b, lo, hi);
    *tiles = fa_decode_blocks(pl, lo, hi, T);
    /* where a window cuts a plan's full caches (lo > 0), a shorter call's span of as many
     * keys can start anywhere in a tile and cross more tiles, and its last tile, ending at
     * its last key, can be fuller than the full cache's: whole tiles bound every call then */
    if (pl->capacity && lo > 0) *keys = *tiles * T < sk ? *tiles * T : sk;
    else *keys = end - t0 * T;
}

/* Partial results of one decode work item: M rows of Dv accumulators plus max and sum. */
static wide decode_partial_bytes(const fa_problem *p) {
    return (wide)(p->heads_q / p->heads_kv) * p->seq_q * (p->head_dim_v + 2) * 4;
}

/* The shared prefix's pass (cpu/cascade.c): per prefix tile of n keys and kv head, the
 * R = B x M rows of every sequence computed (flops 2 R n (D + Dv), trans R n (+ R n tanh) + R);
 * per (b, query head, row) one merge exp per prefix chunk. Bytes: the prefix's K and V once
 * (the point of sharing), q read again, the partials written and read by the merge. Useful
 * pairs: sequence b's visible pairs over prefix plus cache less those over its cache (masks
 * are translation-invariant: the cache's own view). Returns the prefix's bytes; adds the
 * needed prefix keys (the hull of the sequences' visible spans) and the q rows that see only
 * prefix keys to *needed. */
static wide shared_prefix_cost(const fa_plan *pl, wide *flops, wide *trans, wide *bytes, wide *useful, wide *needed) {
    const fa_problem *p = &pl->p;
    const wide es = (wide)fa_dtype_size(p->dtype), Hq = p->heads_q, Hk = p->heads_kv, P = p->shared_prefix_len;
    const wide D = p->head_dim, Dv = p->head_dim_v, Sq = p->seq_q, R = (wide)p->batch * (Hq / Hk) * Sq;
    const wide tiles = fa_cascade_tiles(pl), chunks = fa_cascade_chunks(pl);
    const wide pbytes = P * Hk * (D + Dv) * es;
    *flops += Hk * 2 * R * P * (D + Dv);
    *trans += Hk * (R * P * (1 + (p->softcap > 0)) + R * tiles) + (wide)p->batch * Hq * Sq * chunks;
    *bytes += pbytes + (wide)p->batch * Sq * Hq * D * es + 2 * chunks * Hk * R * (Dv + 2) * 4;
    int64_t lo_all = P, hi_all = -1;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t sk = fa_decode_keys(pl, b);
        const fa_sched all = fa_sched_make(p->seq_q, P + sk, 0, 0, p->causal, p->window_left, p->window_right);
        const fa_sched own = fa_decode_sched(pl, b);
        *useful += Hq * (fa_sched_pairs(&all, 0, p->seq_q) - fa_sched_pairs(&own, 0, p->seq_q)) * 2 * (D + Dv);
        int64_t a0, a1, o0, o1, lo, hi; /* q rows that see a prefix key but none of their own */
        fa_sched_live_rows(&all, &a0, &a1);
        fa_sched_live_rows(&own, &o0, &o1);
        *needed += Hq * (wide)((a1 - a0) - (o1 - o0)) * D * es;
        if (fa_sched_span(&all, 0, p->seq_q, &lo, &hi) && lo < P) {
            lo_all = lo < lo_all ? lo : lo_all;
            hi = hi < P - 1 ? hi : P - 1;
            hi_all = hi > hi_all ? hi : hi_all;
        }
    }
    if (hi_all >= lo_all) *needed += (wide)(hi_all - lo_all + 1) * Hk * (D + Dv) * es;
    return pbytes;
}

static fa_status decode_cost(fa_plan *pl) {
    const fa_problem *p = &pl->p;
    const wide es = (wide)fa_dtype_size(p->dtype), B = p->batch, Hq = p->heads_q, Hk = p->heads_kv;
    const wide D = p->head_dim, Dv = p->head_dim_v, Sq = p->seq_q, M = Hq / Hk * Sq;
    const int quant = fa_dtype_quantized(fa_cache_dtype(p));
    const wide row = (D + Dv) * (wide)fa_dtype_size(fa_cache_dtype(p)) + (quant ? 8 : 0); /* k and v of one (row, head) */
    wide checked = 0; /* the scales that the call's check reads */
    const int softcap = p->softcap > 0;
    wide flops = 0, useful = 0, trans = 0, bytes = 0, items = 0, needed = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        wide chunks, tiles, keys;
        decode_walk(pl, b, &chunks, &tiles, &keys);
        flops += Hk * 2 * M * keys * (D + Dv);
        trans += Hk * (M * keys * (1 + softcap) + M * tiles) + Hq * Sq * (chunks + 1 + p->has_sinks);
        bytes += Hk * (keys * row + (p->page_size ? tiles * 4 : 0));
        checked += quant ? Hk * (wide)pl->lens[b] * 8 : 0;
        items += Hk * chunks;
        /* visible pairs: the dense count of this sequence as its own Sq x Sk_b problem; the
         * inputs it needs (min_bytes): the q rows of rows that see a key, the visible keys */
        const fa_sched masks = fa_decode_sched(pl, b);
        useful += Hq * fa_sched_pairs(&masks, 0, p->seq_q) * 2 * (D + Dv);
        int64_t r0, r1, lo, hi;
        fa_sched_live_rows(&masks, &r0, &r1);
        needed += Hq * (wide)(r1 - r0) * D * es;
        if (fa_sched_span(&masks, 0, p->seq_q, &lo, &hi)) needed += Hk * (wide)(hi - lo + 1) * row;
    }
    const wide prefix = p->shared_prefix_len ? shared_prefix_cost(pl, &flops, &trans, &bytes, &useful, &needed) : 0;
    const wide q = B * Sq * Hq * D * es, o = B * Sq * Hq * Dv * es, lse = B * Hq * Sq * 4;
    const wide knew = p->has_new_kv ? B * Sq * Hk * (D + Dv) * es : 0, slopes = p->has_alibi ? Hq * 4 : 0;
    const wide sinks = p->has_sinks ? Hq * 4 : 0; /* read once, by the merge */
    const wide stored = p->has_new_kv ? B * Sq * Hk * row : 0; /* k_new, v_new as the cache holds them */
    const wide partial = items * decode_partial_bytes(p);
    if (quant) checked += knew; /* the new rows checked finite */
    bytes += q + o + lse + knew + stored + checked + 2 * partial + (p->has_alibi ? items * (Hq / Hk) * 4 : 0) + sinks;
    const wide cache_rows = p->page_size ? (wide)p->num_pages * p->page_size : B * p->seq_k;
    const wide cache = cache_rows * Hk * row, table = p->page_size ? B * p->max_pages * 4 : 0;
    const wide work = pl->be->workspace_bytes(pl, FA_FORWARD); /* the backend's own figure (backend.h) */
    const wide min = needed + knew + stored + o + lse + (items ? slopes : 0) + sinks; /* k_new, v_new read, stored */
    const wide in = q + cache + knew + table + slopes + sinks + B * 4 + prefix, out = o + lse;
    const wide sk_all = p->seq_k + p->shared_prefix_len; /* the naive score matrix: prefix keys too */
    const wide f[8] = {flops, useful, trans, bytes, min, work, in + out + work, in + out + B * Hq * Sq * sk_all * 4};
    return store_cost(&pl->fwd, f, "decode"); /* no backward: its 0s (fa_cost_compute) */
}

fa_status fa_cost_inference(fa_plan *pl) {
    if (pl->shape == FA_SHAPE_VARLEN) return varlen_cost(pl);
    if (pl->backend == FA_BACKEND_CUDA) return FA_OK; /* refused by fa_plan_create */
    return decode_cost(pl);
}
