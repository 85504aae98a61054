/* The per-rank plan of sequence-parallel attention: which rows each rank holds, the local
 * problems its kernel calls solve, and what a pass costs it (flops, bytes each way, steps,
 * peak memory), all from shapes alone, plus a paper model of the time on given hardware. */
#include "mpi_internal.h"

#include <stdlib.h>
#include <string.h>

void fa_mpi_shard_of(const fa_mpi_plan *pl, int which, int j, fa_mpi_shard *out) {
    int64_t S = which ? pl->g.seq_k : pl->g.seq_q;
    if (pl->layout == FA_MPI_ZIGZAG) {
        int64_t c = S / (2 * pl->P);
        out->n = 2;
        out->s[0] = (fa_mpi_seg){(int64_t)j * c, c, 0};
        out->s[1] = (fa_mpi_seg){(int64_t)(2 * pl->P - 1 - j) * c, c, c};
    } else {
        int64_t c = S / pl->P;
        out->n = 1;
        out->s[0] = (fa_mpi_seg){(int64_t)j * c, c, 0};
    }
}

fa_strides fa_mpi_contiguous(int64_t b, int64_t h, int64_t s, int64_t d) {
    (void)b;
    fa_strides st = {{h * s * d, s * d, d, 1}};
    return st;
}

fa_strides fa_mpi_local_stride(const fa_strides *given, int64_t b, int64_t h, int64_t s, int64_t d) {
    if (given->s[0] || given->s[1] || given->s[2] || given->s[3]) return *given;
    return fa_mpi_contiguous(b, h, s, d);
}

int64_t fa_mpi_span(const fa_strides *st, int64_t b, int64_t h, int64_t s, int64_t d) {
    return (b - 1) * st->s[0] + (h - 1) * st->s[1] + (s - 1) * st->s[2] + (d - 1) * st->s[3] + 1;
}

void fa_mpi_pair_problem(const fa_mpi_plan *pl, const fa_mpi_seg *qs, const fa_mpi_seg *ks,
                         fa_problem *out) {
    const fa_problem *g = &pl->g;
    *out = *g;
    out->seq_q = qs->len;
    out->seq_k = ks->len;
    /* each pair of blocks at its place in the global problem, where anything aligns at it */
    out->has_diag_offset = fa_sched_aligns(g->causal, g->window_left, g->window_right, g->has_alibi);
    out->diag_offset = qs->gstart - ks->gstart + pl->goff;
    out->has_sinks = 0; /* a partial state: the ring adds the sink once, after every block */
    out->q_stride = fa_mpi_local_stride(&g->q_stride, g->batch, g->heads_q, pl->lq, g->head_dim);
    out->o_stride = fa_mpi_local_stride(&g->o_stride, g->batch, g->heads_q, pl->lq, g->head_dim_v);
    /* K and V live in the ring's contiguous block buffers of lk rows */
    out->k_stride = fa_mpi_contiguous(g->batch, g->heads_kv, pl->lk, g->head_dim);
    out->v_stride = fa_mpi_contiguous(g->batch, g->heads_kv, pl->lk, g->head_dim_v);
}

void fa_mpi_heads_problem(const fa_mpi_plan *pl, fa_problem *out) {
    *out = pl->g;
    out->heads_q = pl->g.heads_q / pl->P;
    out->heads_kv = pl->g.heads_kv / pl->P;
    memset(&out->q_stride, 0, sizeof out->q_stride);
    memset(&out->k_stride, 0, sizeof out->k_stride);
    memset(&out->v_stride, 0, sizeof out->v_stride);
    memset(&out->o_stride, 0, sizeof out->o_stride);
}

int64_t fa_mpi_kv_block_bytes(const fa_mpi_plan *pl) {
    const fa_problem *g = &pl->g;
    int64_t b = g->batch * g->heads_kv * pl->lk * (g->head_dim + g->head_dim_v) *
                (int64_t)fa_dtype_size(g->dtype);
    if (g->has_segment_ids) b += g->batch * pl->lk * 4;
    return b;
}

int64_t fa_mpi_acc_block_bytes(const fa_mpi_plan *pl) {
    const fa_problem *g = &pl->g;
    return g->batch * g->heads_kv * pl->lk * (g->head_dim + g->head_dim_v) * 4;
}

/* FNV-1a over the fields every rank must agree on (never struct bytes: padding). */
static uint64_t mix(uint64_t h, int64_t x) {
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)(x >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}
static int64_t fbits(float f) {
    union { float f; uint32_t u; } v = {f};
    return v.u;
}
static uint64_t digest(const fa_mpi_plan *pl) {
    const fa_problem *g = &pl->g;
    int64_t f[] = {g->batch, g->heads_q, g->heads_kv, g->seq_q, g->seq_k, g->head_dim,
                   g->head_dim_v, g->dtype, g->has_scale, g->has_scale ? fbits(g->scale) : 0,
                   g->causal, g->window_left, g->window_right, fbits(g->softcap), g->has_alibi,
                   g->has_segment_ids, g->has_diag_offset, g->has_diag_offset ? g->diag_offset : 0,
                   pl->method, pl->layout, pl->P, g->has_sinks};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) h = mix(h, f[i]);
    return h;
}

/* Costs of one local problem: its plan's figures for the pass. */
static fa_status local_cost(const fa_mpi_plan *pl, const fa_problem *p, fa_pass pass, fa_cost *c) {
    fa_plan *lp = NULL;
    fa_status st = fa_plan_create(p, &pl->opt, &lp);
    if (st != FA_OK) return st;
    fa_plan_cost(lp, pass, c);
    fa_plan_destroy(lp);
    return FA_OK;
}

/* The kernel calls of ring step s on this rank: summed flops and transcendentals, largest
 * workspace. A pair whose tiles are all masked is not called and costs nothing. */
static fa_status ring_step(const fa_mpi_plan *pl, fa_pass pass, int s, fa_cost *sum) {
    fa_mpi_shard qsh, ksh;
    fa_mpi_shard_of(pl, 0, pl->rank, &qsh);
    fa_mpi_shard_of(pl, 1, (pl->rank - s + pl->P) % pl->P, &ksh);
    memset(sum, 0, sizeof *sum);
    for (int a = 0; a < qsh.n; a++)
        for (int b = 0; b < ksh.n; b++) {
            fa_problem p;
            fa_cost c;
            fa_mpi_pair_problem(pl, &qsh.s[a], &ksh.s[b], &p);
            fa_status st = local_cost(pl, &p, pass, &c);
            if (st != FA_OK) return st;
            if (c.flops == 0) continue;
            sum->flops += c.flops;
            sum->transcendentals += c.transcendentals;
            if (c.workspace_bytes > sum->workspace_bytes) sum->workspace_bytes = c.workspace_bytes;
        }
    return FA_OK;
}

static fa_status ring_cost(fa_mpi_plan *pl, fa_pass pass, fa_mpi_cost *out) {
    const fa_problem *g = &pl->g;
    int64_t es = (int64_t)fa_dtype_size(g->dtype), B = g->batch, Hq = g->heads_q, Hk = g->heads_kv;
    int64_t D = g->head_dim, Dv = g->head_dim_v, lq = pl->lq, lk = pl->lk;
    fa_mpi_shard qsh;
    fa_mpi_shard_of(pl, 0, pl->rank, &qsh);
    int64_t ws = 0, segq = qsh.s[0].len;
    memset(out, 0, sizeof *out);
    for (int s = 0; s < pl->P; s++) {
        fa_cost c;
        fa_status st = ring_step(pl, pass, s, &c);
        if (st != FA_OK) return st;
        out->flops += c.flops;
        out->transcendentals += c.transcendentals;
        if (c.flops > out->max_step_flops) out->max_step_flops = c.flops;
        if (c.workspace_bytes > ws) ws = c.workspace_bytes;
    }
    int64_t kv = fa_mpi_kv_block_bytes(pl), acc = fa_mpi_acc_block_bytes(pl);
    int64_t P = pl->P, seg = g->has_segment_ids ? 4 : 0;
    out->steps = P;
    int64_t in = B * Hq * lq * D * es + B * Hk * lk * (D + Dv) * es + B * (lq + lk) * seg;
    /* buffers: two K/V blocks, kv segment ids of one k run, q segment ids by run */
    int64_t buf = 2 * kv + B * lk * seg + B * lq * seg;
    if (pass == FA_FORWARD) {
        out->bytes_sent = out->bytes_received = (P - 1) * kv;
        out->max_step_bytes = P > 1 ? kv : 0;
        in += B * Hq * lq * (Dv * es + 4); /* o, lse */
        /* partial o and lse of one q run, the f32 running o and lse */
        buf += B * Hq * segq * (Dv * es + 4) + B * Hq * lq * (Dv + 1) * 4;
    } else {
        /* K/V travel P-1 hops, each block's dk/dv accumulator P hops (the last one home) */
        out->bytes_sent = out->bytes_received = P > 1 ? (P - 1) * kv + P * acc : 0;
        /* each rank's share of dsink (f64 [Hq]), gathered by every rank */
        if (g->has_sinks) out->bytes_sent += (P - 1) * Hq * 8, out->bytes_received += (P - 1) * Hq * 8;
        out->max_step_bytes = P > 1 ? kv + acc : 0;
        in += 2 * B * Hq * lq * Dv * es + B * Hq * lq * 4 + B * Hq * lq * D * es +
              B * Hk * lk * (D + Dv) * es; /* o, do, lse, dq, dk, dv */
        /* three accumulator blocks (two travelling, one home), f32 dq, the pair's dq
         * (spanning q), dk and dv (one block), lse of one q run */
        buf += (P > 1 ? 3 : 2) * acc + B * Hq * lq * D * 4 + B * Hq * lq * D * es +
               B * Hk * lk * (D + Dv) * es + B * Hq * segq * 4;
    }
    out->peak_bytes = in + buf + ws;
    return FA_OK;
}

/* Ulysses: the all-to-alls of each tensor's local rows to head shards and back. */
static fa_status ulysses_cost(fa_mpi_plan *pl, fa_pass pass, fa_mpi_cost *out) {
    const fa_problem *g = &pl->g;
    int64_t es = (int64_t)fa_dtype_size(g->dtype), B = g->batch, Hq = g->heads_q, Hk = g->heads_kv;
    int64_t D = g->head_dim, Dv = g->head_dim_v, lq = pl->lq, lk = pl->lk, P = pl->P;
    int64_t Sq = g->seq_q, Sk = g->seq_k;
    fa_problem hp;
    fa_cost c;
    fa_mpi_heads_problem(pl, &hp);
    fa_status st = local_cost(pl, &hp, pass, &c);
    if (st != FA_OK) return st;
    memset(out, 0, sizeof *out);
    out->flops = out->max_step_flops = c.flops;
    out->transcendentals = c.transcendentals;
    /* local bytes of each tensor (its all-to-all sends (P-1)/P of them) */
    int64_t q = B * Hq * lq * D * es, k = B * Hk * lk * D * es, v = B * Hk * lk * Dv * es;
    int64_t o = B * Hq * lq * Dv * es, lse = B * Hq * lq * 4;
    int64_t seg = g->has_segment_ids ? B * (lq + lk) * 4 : 0;
    int64_t moved, rounds, in, heads, big = g->has_segment_ids ? B * (Sq > Sk ? Sq : Sk) * 4 : 0;
    int64_t each[5] = {q, k, v, o, lse};
    for (int i = 0; i < 5; i++)
        if (each[i] > big) big = each[i];
    if (pass == FA_FORWARD) {
        moved = q + k + v + o + lse;
        rounds = 5;
        in = q + k + v + o + lse;
        heads = (B * Hq * Sq * (D + Dv) * es + B * Hk * Sk * (D + Dv) * es + B * Hq * Sq * 4) / P;
    } else {
        moved = 2 * (q + k + v) + 2 * o + lse; /* q k v o do lse there, dq dk dv back */
        rounds = 9;
        in = 2 * (q + k + v) + 2 * o + lse;
        heads = (2 * B * Hq * Sq * (D + Dv) * es + 2 * B * Hk * Sk * (D + Dv) * es +
                 B * Hq * Sq * 4) / P;
    }
    out->bytes_sent = out->bytes_received = moved / P * (P - 1) + seg * (P - 1);
    /* the backward's dsink of each rank's heads, gathered by every rank */
    const int gather = pass == FA_BACKWARD && g->has_sinks;
    if (gather) out->bytes_sent += (P - 1) * (Hq / P) * 4, out->bytes_received += (P - 1) * (Hq / P) * 4;
    out->max_step_bytes = out->bytes_sent;
    out->steps = rounds + (g->has_segment_ids ? 2 : 0) + gather;
    /* local tensors, head-sharded copies, send and receive buffers of the largest tensor,
     * full-length segment ids with their gather buffers */
    out->peak_bytes = in + seg + heads + 2 * big + B * (Sq + Sk) * (g->has_segment_ids ? 4 : 0) +
                      c.workspace_bytes;
    return FA_OK;
}

static int divides(int64_t d, int64_t n) { return d > 0 && n % d == 0; }

fa_status fa_mpi_plan_create(const fa_problem *global, const fa_options *opt,
                             fa_mpi_method method, fa_mpi_layout layout, int nranks, int rank,
                             fa_mpi_plan **out) {
    if (!out) return fa_error(FA_ERR_NULL, "fa_mpi_plan_create: out is NULL");
    *out = NULL;
    if (!global) return fa_error(FA_ERR_NULL, "fa_mpi_plan_create: problem is NULL");
    if (method != FA_MPI_RING && method != FA_MPI_ULYSSES)
        return fa_error(FA_ERR_INVALID, "method %d is not FA_MPI_RING or FA_MPI_ULYSSES", (int)method);
    if (layout != FA_MPI_CONTIGUOUS && layout != FA_MPI_ZIGZAG)
        return fa_error(FA_ERR_INVALID, "layout %d is not FA_MPI_CONTIGUOUS or FA_MPI_ZIGZAG", (int)layout);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fa_error(FA_ERR_INVALID, "rank %d of %d ranks is out of range", rank, nranks);
    fa_options o;
    if (opt) o = *opt;
    else memset(&o, 0, sizeof o);
    /* what combines with sequence parallel is the backend's to say (backend.h), before the
     * global problem's own check reads any inference arrays */
    const fa_backend_entry *be = fa_backend_of(o.backend == FA_BACKEND_CUDA ? FA_BACKEND_CUDA : FA_BACKEND_CPU);
    fa_status st = be->supports(global, FA_FORWARD, FA_USE_SEQ_PARALLEL);
    if (st != FA_OK) return st;
    o.backend = FA_BACKEND_CPU;
    fa_plan *check = NULL; /* the global problem must be valid on its own */
    st = fa_plan_create(global, &o, &check);
    if (st != FA_OK) return st;
    fa_problem g = *global; /* defaults resolved (Hk, Dv); strides stay the local ones given */
    g.heads_kv = fa_plan_problem(check)->heads_kv;
    g.head_dim_v = fa_plan_problem(check)->head_dim_v;
    fa_plan_destroy(check);
    global = &g;
    int64_t parts = layout == FA_MPI_ZIGZAG ? 2 * (int64_t)nranks : nranks;
    const char *lname = layout == FA_MPI_ZIGZAG ? "zigzag (2P chunks)" : "contiguous";
    if (!divides(parts, global->seq_q) || !divides(parts, global->seq_k))
        return fa_error(FA_ERR_INVALID,
                        "sequence parallel %s over %d ranks needs Sq and Sk divisible by %lld, got "
                        "Sq=%lld Sk=%lld", lname, nranks, (long long)parts,
                        (long long)global->seq_q, (long long)global->seq_k);
    /* a pair of blocks aligns at the global offset plus the blocks' distance (up to Sq or Sk):
     * that must stay a valid diag_offset on every rank, said here in the caller's terms */
    const int64_t goff = global->has_diag_offset ? global->diag_offset : global->seq_k - global->seq_q;
    const int64_t span = global->seq_q > global->seq_k ? global->seq_q : global->seq_k;
    if ((goff < 0 ? -goff : goff) > (int64_t)INT32_MAX - span)
        return fa_error(FA_ERR_INVALID,
                        "sequence parallel needs |diag_offset| + max(Sq, Sk) within 2^31 - 1 (each pair of blocks "
                        "aligns at the offset plus their distance), got diag_offset %lld with Sq=%lld Sk=%lld",
                        (long long)goff, (long long)global->seq_q, (long long)global->seq_k);
    if (method == FA_MPI_ULYSSES && !divides(nranks, global->heads_kv))
        return fa_error(FA_ERR_INVALID,
                        "ulysses needs the kv heads (%lld) divisible by the number of ranks (%d); "
                        "use the ring", (long long)global->heads_kv, nranks);
    fa_mpi_plan *pl = fa_calloc(1, sizeof *pl);
    if (!pl) return fa_error(FA_ERR_NO_MEMORY, "out of memory (mpi plan)");
    pl->g = *global;
    pl->opt = o;
    pl->method = method;
    pl->layout = layout;
    pl->P = nranks;
    pl->rank = rank;
    pl->goff = fa_sched_off(global->seq_q, global->seq_k, global->has_diag_offset, global->diag_offset);
    pl->lq = global->seq_q / nranks;
    pl->lk = global->seq_k / nranks;
    pl->digest = digest(pl);
    for (int pass = 0; pass < 2; pass++) {
        fa_mpi_cost *c = pass ? &pl->bwd : &pl->fwd;
        st = method == FA_MPI_RING ? ring_cost(pl, (fa_pass)pass, c) : ulysses_cost(pl, (fa_pass)pass, c);
        if (st != FA_OK) {
            fa_free(pl);
            return st;
        }
    }
    *out = pl;
    return FA_OK;
}

void fa_mpi_plan_destroy(fa_mpi_plan *plan) { fa_free(plan); }

/* which and layout outside their two values answer -1, as any other bad argument does */
int64_t fa_mpi_local_rows(const fa_mpi_plan *pl, int which) {
    return !pl || (which != 0 && which != 1) ? -1 : which ? pl->lk : pl->lq;
}

int64_t fa_mpi_global_row(const fa_mpi_plan *pl, int which, int64_t t) {
    if (!pl || (which != 0 && which != 1)) return -1;
    return fa_mpi_layout_row(pl->layout, pl->P, pl->rank, which ? pl->g.seq_k : pl->g.seq_q, t);
}

int64_t fa_mpi_layout_row(fa_mpi_layout layout, int nranks, int rank, int64_t S, int64_t t) {
    if (layout != FA_MPI_CONTIGUOUS && layout != FA_MPI_ZIGZAG) return -1;
    int64_t parts = layout == FA_MPI_ZIGZAG ? 2 * (int64_t)nranks : nranks;
    if (nranks < 1 || rank < 0 || rank >= nranks || S % parts != 0 || t < 0) return -1;
    int64_t c = S / parts;
    if (layout != FA_MPI_ZIGZAG) return t < c ? rank * c + t : -1;
    if (t < c) return rank * c + t;
    if (t < 2 * c) return (2 * (int64_t)nranks - 1 - rank) * c + (t - c);
    return -1;
}

fa_status fa_mpi_plan_cost(const fa_mpi_plan *plan, fa_pass pass, fa_mpi_cost *out) {
    if (!plan || !out) return fa_error(FA_ERR_NULL, "fa_mpi_plan_cost: %s is NULL", plan ? "out" : "plan");
    if (pass != FA_FORWARD && pass != FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "fa_mpi_plan_cost: pass %d is not FA_FORWARD or FA_BACKWARD", (int)pass);
    *out = pass == FA_BACKWARD ? plan->bwd : plan->fwd;
    return FA_OK;
}

fa_status fa_mpi_predict(const fa_mpi_plan *pl, fa_pass pass, double flops_per_s,
                         double bytes_per_s, fa_mpi_prediction *out) {
    if (!pl || !out) return fa_error(FA_ERR_NULL, "fa_mpi_predict: %s is NULL", pl ? "out" : "plan");
    if (pass != FA_FORWARD && pass != FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "fa_mpi_predict: pass %d is not FA_FORWARD or FA_BACKWARD", (int)pass);
    if (!(flops_per_s > 0) || !(bytes_per_s > 0))
        return fa_error(FA_ERR_INVALID, "rate %g flop/s and bandwidth %g B/s must be positive",
                        flops_per_s, bytes_per_s);
    const fa_mpi_cost *c = pass == FA_BACKWARD ? &pl->bwd : &pl->fwd;
    memset(out, 0, sizeof *out);
    out->compute_s = (double)c->flops / flops_per_s;
    out->comm_s = (double)c->bytes_sent / bytes_per_s;
    out->comm_hidden = 1;
    if (pl->method == FA_MPI_ULYSSES) { /* the all-to-alls bracket the compute */
        out->predicted_s = out->compute_s + out->comm_s;
        out->comm_hidden = c->bytes_sent == 0;
        return FA_OK;
    }
    /* ring step s overlaps the next block's K/V (s < P-1) and, in the backward, the previous
     * step's dk/dv accumulator; the backward's last accumulator hop (home) is never hidden */
    double kv = (double)fa_mpi_kv_block_bytes(pl) / bytes_per_s;
    double acc = (double)fa_mpi_acc_block_bytes(pl) / bytes_per_s;
    for (int s = 0; s < pl->P; s++) {
        fa_cost sc;
        fa_status st = ring_step(pl, pass, s, &sc);
        if (st != FA_OK) return st;
        double comp = (double)sc.flops / flops_per_s, comm = 0;
        if (s < pl->P - 1) comm += kv;
        if (pass == FA_BACKWARD && s > 0) comm += acc;
        if (comm > comp) out->comm_hidden = 0;
        out->predicted_s += comm > comp ? comm : comp;
    }
    if (pass == FA_BACKWARD && pl->P > 1) out->predicted_s += acc;
    return FA_OK;
}

int fa_mpi_comm_hides(const fa_mpi_plan *plan, fa_pass pass, double flops_per_s,
                      double bytes_per_s) {
    fa_mpi_prediction pr;
    if (fa_mpi_predict(plan, pass, flops_per_s, bytes_per_s, &pr) != FA_OK) return 0;
    return pr.comm_hidden;
}
