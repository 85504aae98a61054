/* The CPU driver of packed variable-length batches (cu_seqlens).
 *
 * Sequence b of the packed tensors is a strided view (rows [cu[b], cu[b+1])), so it runs
 * as its own dense problem (fa_varlen_subplan: batch 1, its own lengths and mask offset)
 * through the dense drivers, one sequence after another, all threads on each, sharing one
 * workspace. No tile straddles two sequences and the cost is exactly the sum of the
 * sequences' costs (cost_inference.c). Empty sequences write what they must: a sequence
 * without keys gives o = 0 and lse = -inf (and dq = 0); one without queries gets dk = dv = 0. */
#include "isa.h"

#include <stdlib.h>
#include <string.h>

static const void *row_ptr(const void *base, const fa_strides *st, int64_t row, size_t esz) {
    return base ? (const char *)base + st->s[2] * row * (int64_t)esz : NULL;
}

/* Zeroes rows [r0, r1) of every head of a packed tensor. */
static void zero_rows(void *base, const fa_strides *st, fa_dtype t, int64_t heads, int64_t width, int64_t r0,
                      int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t d = 0; d < width; d++) fa_store(t, base, fa_offset(st, 0, h, r, d), 0.0f);
}

/* The caller's workspace (its size checked at the entry, args.c), or one allocated. */
static fa_status take_workspace(void *given, int64_t need, const char *who, char **ws, void **owned) {
    *owned = NULL;
    if (given) {
        *ws = given;
        return FA_OK;
    }
    if (!(*ws = *owned = fa_malloc((size_t)(need > 0 ? need : 1))))
        return fa_error(FA_ERR_NO_MEMORY, "%s: cannot allocate %lld bytes of workspace", who, (long long)need);
    return FA_OK;
}

/* Progress of the whole call, in score tiles: sequence b weighs Hq x its query tiles x its
 * key tiles (the forward's tile edges; at least 1, so that an empty sequence is a step too),
 * and its own driver's reports, in that driver's units, move through its share from a running
 * offset. So a single long sequence reports as it goes, not only at its end; the caller hears
 * of each percent at most once, in increasing order, ending at total. The drivers call
 * seq_progress_step one thread at a time (progress.h), each_sequence between sequences. */
typedef struct {
    fa_progress_fn fn;
    void *ctx;
    int64_t total, offset, weight; /* weight: the running sequence's share */
    int percent;                   /* the last percent reported */
} seq_progress;

static void seq_progress_report(seq_progress *sp, int64_t done) {
    const int pct = (int)((__int128)done * 100 / sp->total);
    if (pct <= sp->percent) return;
    sp->percent = pct;
    sp->fn(sp->ctx, done, sp->total);
}

static void seq_progress_step(void *ctx, int64_t done, int64_t total) {
    seq_progress *sp = ctx;
    if (total > 0 && done <= total) seq_progress_report(sp, sp->offset + (int64_t)((__int128)sp->weight * done / total));
}

/* Sequence b's weight (sub its plan): its score tiles, as the forward cuts them (forward.c). */
static __int128 seq_weight(const struct fa_plan *sub) {
    const int64_t sq = sub->p.seq_q, sk = sub->p.seq_k;
    if (sq == 0 || sk == 0) return 1;
    const int64_t bq = sub->fwd_bq < 1 ? 1 : sub->fwd_bq < sq ? sub->fwd_bq : sq;
    const int64_t bk = sub->fwd_bk < 1 ? 1 : sub->fwd_bk < sk ? sub->fwd_bk : sk;
    return (__int128)sub->p.heads_q * ((sq + bq - 1) / bq) * ((sk + bk - 1) / bk);
}

/* The fields both passes' arguments share, set for sequence b's view: q, k, v from its
 * first rows, the shared workspace, its own counts, its progress (sp; NULL: none). */
#define SEQUENCE_VIEW(sa, a, pl, b, es, ws, size, c, sp)                                                \
    do {                                                                                               \
        (sa).q = row_ptr((a)->q, &(pl)->p.q_stride, (pl)->p.cu_seqlens_q[b], es);                      \
        (sa).k = row_ptr((a)->k, &(pl)->p.k_stride, (pl)->p.cu_seqlens_k[b], es);                      \
        (sa).v = row_ptr((a)->v, &(pl)->p.v_stride, (pl)->p.cu_seqlens_k[b], es);                      \
        (sa).workspace = ws;                                                                           \
        (sa).workspace_size = (size_t)(size);                                                          \
        (sa).counts = c;                                                                               \
        (sa).progress = (sp) ? seq_progress_step : NULL;                                               \
        (sa).progress_ctx = (sp);                                                                      \
    } while (0)

/* One sequence of a pass: runs sequence b as the dense plan sub (or writes what an empty
 * sequence must), with the shared workspace ws, and leaves its counts in c. */
typedef fa_status (*seq_pass)(const struct fa_plan *pl, const struct fa_plan *sub, int64_t b, const void *args,
                              char *ws, fa_counts *c, seq_progress *sp);

/* Every sequence in order through pass: the workspace (the caller's or one allocated here)
 * shared, counts summed, progress reported through each sequence (seq_progress). */
static fa_status each_sequence(const struct fa_plan *pl, const void *args, void *given, int64_t need,
                               const char *who, fa_progress_fn progress, void *progress_ctx, fa_counts *counts,
                               seq_pass pass) {
    char *ws;
    void *owned;
    fa_status s = take_workspace(given, need, who, &ws, &owned);
    if (s) return s;
    fa_counts total = {0, 0};
    seq_progress sp = {progress, progress_ctx, 0, 0, 0, 0};
    int by_sequence = 0; /* weights whose sum overflows int64 (not a real problem): 1 each */
    if (progress) {
        __int128 sum = 0;
        for (int64_t b = 0; b < pl->p.batch; b++) {
            fa_plan sub;
            fa_varlen_subplan(pl, b, &sub);
            sum += seq_weight(&sub);
        }
        by_sequence = sum > INT64_MAX;
        sp.total = by_sequence ? pl->p.batch : (int64_t)sum;
    }
    for (int64_t b = 0; b < pl->p.batch && !s; b++) {
        fa_plan sub;
        fa_varlen_subplan(pl, b, &sub);
        fa_counts c = {0, 0};
        if (progress) sp.weight = by_sequence ? 1 : (int64_t)seq_weight(&sub);
        s = pass(pl, &sub, b, args, ws, &c, progress ? &sp : NULL);
        total.flops += c.flops;
        total.transcendentals += c.transcendentals;
        if (progress) { /* the sequence's whole share, whether or not its driver reported (empty ones do not) */
            sp.offset += sp.weight;
            if (!s) seq_progress_report(&sp, sp.offset);
        }
    }
    fa_free(owned);
    if (!s && counts) *counts = total;
    return s;
}

static fa_status forward_sequence(const struct fa_plan *pl, const struct fa_plan *sub, int64_t b, const void *args,
                                  char *ws, fa_counts *c, seq_progress *sp) {
    const fa_problem *p = &pl->p;
    const fa_forward_args *a = args;
    const size_t es = fa_dtype_size(p->dtype);
    const int32_t *cq = p->cu_seqlens_q;
    const int64_t sq = sub->p.seq_q;
    if (sq == 0) return FA_OK;
    if (sub->p.seq_k == 0) {
        zero_rows(a->o, &p->o_stride, p->dtype, p->heads_q, p->head_dim_v, cq[b], cq[b + 1]);
        if (a->lse) /* with sinks, the sink alone: lse = sink_h (sinks.h) */
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t i = 0; i < sq; i++)
                    a->lse[h * p->seq_q + cq[b] + i] = p->has_sinks ? a->sinks[h] : -INFINITY;
        /* the log of each row's lse (and the sink's exp), as the dense driver counts */
        c->transcendentals = p->heads_q * sq * (p->has_sinks ? 2 : 1);
        return FA_OK;
    }
    fa_forward_args sa = *a;
    SEQUENCE_VIEW(sa, a, pl, b, es, ws, pl->fwd.workspace_bytes, c, sp);
    sa.o = (void *)row_ptr(a->o, &p->o_stride, cq[b], es);
    sa.lse = a->lse ? a->lse + cq[b] : NULL;
    return fa_cpu_forward(sub, &sa);
}

fa_status fa_cpu_varlen_forward(const struct fa_plan *pl, const fa_forward_args *a) {
    return each_sequence(pl, a, a->workspace, pl->fwd.workspace_bytes, "fa_forward", a->progress,
                         a->progress_ctx, a->counts, forward_sequence);
}

/* The backward's arguments. */
typedef struct {
    const fa_backward_args *a;
} varlen_backward_args;

/* With sinks, one sequence's dsink [Hq], before it joins the caller's: the backward
 * workspace's last bytes (fa_varlen_dsink_bytes, counted in the plan's workspace_bytes),
 * after the sequences' shared dense workspace. */
int64_t fa_varlen_dsink_bytes(const struct fa_plan *pl) {
    return pl->p.has_sinks ? 64 + pl->p.heads_q * (int64_t)sizeof(float) : 0;
}
static float *dsink_of_sequence(const struct fa_plan *pl, char *ws, int64_t *dense_bytes) {
    *dense_bytes = pl->bwd.workspace_bytes - fa_varlen_dsink_bytes(pl);
    char *at = ws + *dense_bytes;
    return (float *)(at + (64 - (uintptr_t)at % 64) % 64);
}

static fa_status backward_sequence(const struct fa_plan *pl, const struct fa_plan *sub, int64_t b, const void *args,
                                   char *ws, fa_counts *c, seq_progress *sp) {
    const fa_problem *p = &pl->p;
    const varlen_backward_args *va = args;
    const fa_backward_args *a = va->a;
    const size_t es = fa_dtype_size(p->dtype);
    const int32_t *cq = p->cu_seqlens_q, *ck = p->cu_seqlens_k;
    if (sub->p.seq_q == 0) {
        zero_rows(a->dk, &p->k_stride, p->dtype, p->heads_kv, p->head_dim, ck[b], ck[b + 1]);
        zero_rows(a->dv, &p->v_stride, p->dtype, p->heads_kv, p->head_dim_v, ck[b], ck[b + 1]);
        return FA_OK;
    }
    if (sub->p.seq_k == 0) {
        zero_rows(a->dq, &p->q_stride, p->dtype, p->heads_q, p->head_dim, cq[b], cq[b + 1]);
        for (int64_t h = 0; p->has_sinks && h < p->heads_q; h++) /* 0, or NaN from do (empty.c) */
            a->dsink[h] -= (float)fa_keyless_delta_sum(pl, a, 0, h, cq[b], cq[b + 1]);
        return FA_OK;
    }
    fa_backward_args sa = *a;
    int64_t dense_bytes;
    float *dsink_seq = dsink_of_sequence(pl, ws, &dense_bytes);
    SEQUENCE_VIEW(sa, a, pl, b, es, ws, dense_bytes, c, sp);
    sa.o = row_ptr(a->o, &p->o_stride, cq[b], es);
    sa.d_o = row_ptr(a->d_o, &p->o_stride, cq[b], es);
    sa.lse = a->lse + cq[b];
    sa.dq = (void *)row_ptr(a->dq, &p->q_stride, cq[b], es);
    sa.dk = (void *)row_ptr(a->dk, &p->k_stride, ck[b], es);
    sa.dv = (void *)row_ptr(a->dv, &p->v_stride, ck[b], es);
    sa.dsink = p->has_sinks ? dsink_seq : NULL;
    fa_status s = fa_cpu_backward(sub, &sa);
    if (!s && p->has_sinks) /* sequence by sequence, in order: the same sum for any threads */
        for (int64_t h = 0; h < p->heads_q; h++) a->dsink[h] += dsink_seq[h];
    return s;
}

fa_status fa_cpu_varlen_backward(const struct fa_plan *pl, const fa_backward_args *a) {
    varlen_backward_args va = {a};
    if (pl->p.has_sinks) /* a sequence without queries adds nothing to dsink, one without keys 0 (or NaN) */
        for (int64_t h = 0; h < pl->p.heads_q; h++) a->dsink[h] = 0.0f;
    return each_sequence(pl, &va, a->workspace, pl->bwd.workspace_bytes, "backward", a->progress, a->progress_ctx,
                         a->counts, backward_sequence);
}
