/* Ring attention (pass K/V). At step s rank r holds the K/V block of rank (r - s) mod P:
 * it posts the receive of the next block from its left and the send of the current one to
 * its right, runs the local kernel on (its q rows, the block) while they travel, then waits.
 * Forward: partial (o, lse) merged exactly into f32 running values, in step order (the same
 * bits every run for a given P). Backward: with the global o and lse, each (q rows, block)
 * call gives that pair's exact share of dq, dk, dv; dq adds up locally, and each block's f32
 * dk/dv accumulator travels the ring behind its K/V and arrives home after P hops.
 * Attention sinks: the pair calls exclude them (partial states); the forward adds each
 * head's sink to the merged rows once, at the end; the backward's pair calls need nothing
 * (the global lse includes the sink), and dsink is each rank's sum over its rows, gathered
 * and added in rank order, so every rank has the same bits. */
#include "mpi_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_KV = 1, TAG_ACC = 2 };

/* What both passes set up: sizes, shards, neighbours and the K/V block buffers. */
typedef struct {
    const fa_mpi_plan *pl;
    const fa_problem *g;
    size_t es;
    int64_t B, Hq, Hk, D, Dv, lq, lk;
    int P, r, left, right;
    fa_mpi_shard qsh;
    int64_t kvb, off_v, off_seg; /* block bytes; where v and the kv segment ids start */
    fa_strides qst, ost;         /* the caller's local q and o strides */
    char *kv[2];
    int32_t *qseg, *kseg;        /* q segment ids per q run; kv ids of one k run */
} ring;

static int ring_init(ring *R, const fa_mpi_plan *pl) {
    const fa_problem *g = &pl->g;
    memset(R, 0, sizeof *R);
    R->pl = pl, R->g = g, R->es = fa_dtype_size(g->dtype);
    R->B = g->batch, R->Hq = g->heads_q, R->Hk = g->heads_kv, R->D = g->head_dim;
    R->Dv = g->head_dim_v, R->lq = pl->lq, R->lk = pl->lk;
    R->P = pl->P, R->r = pl->rank;
    R->left = (R->r - 1 + R->P) % R->P, R->right = (R->r + 1) % R->P;
    fa_mpi_shard_of(pl, 0, R->r, &R->qsh);
    R->kvb = fa_mpi_kv_block_bytes(pl);
    R->off_v = R->B * R->Hk * R->lk * R->D * (int64_t)R->es;
    R->off_seg = R->off_v + R->B * R->Hk * R->lk * R->Dv * (int64_t)R->es;
    R->qst = fa_mpi_local_stride(&g->q_stride, R->B, R->Hq, R->lq, R->D);
    R->ost = fa_mpi_local_stride(&g->o_stride, R->B, R->Hq, R->lq, R->Dv);
    R->kv[0] = fa_mpi_alloc(pl, R->kvb);
    R->kv[1] = fa_mpi_alloc(pl, R->kvb);
    int seg = g->has_segment_ids;
    R->qseg = seg ? fa_mpi_alloc(pl, R->B * R->lq * 4) : NULL;
    R->kseg = seg ? fa_mpi_alloc(pl, R->B * R->lk * 4) : NULL;
    return R->kv[0] && R->kv[1] && (!seg || (R->qseg && R->kseg));
}

static void ring_free(ring *R) {
    fa_free(R->kv[0]), fa_free(R->kv[1]), fa_free(R->qseg), fa_free(R->kseg);
}

/* This rank's own block into kv[0]: k, v and kv segment ids, contiguous; and the q
 * segment ids of each q run as contiguous [B, len]. */
static void pack_own(ring *R, const void *k, const void *v, const int32_t *qseg,
                     const int32_t *kvseg) {
    fa_strides kst = fa_mpi_local_stride(&R->g->k_stride, R->B, R->Hk, R->lk, R->D);
    fa_strides vst = fa_mpi_local_stride(&R->g->v_stride, R->B, R->Hk, R->lk, R->Dv);
    fa_mpi_gather_rows(R->kv[0], k, &kst, R->B, R->Hk, 0, R->lk, R->D, R->es);
    fa_mpi_gather_rows(R->kv[0] + R->off_v, v, &vst, R->B, R->Hk, 0, R->lk, R->Dv, R->es);
    if (!R->g->has_segment_ids) return;
    memcpy(R->kv[0] + R->off_seg, kvseg, (size_t)(R->B * R->lk) * 4);
    for (int a = 0; a < R->qsh.n; a++) {
        const fa_mpi_seg *s = &R->qsh.s[a];
        for (int64_t b = 0; b < R->B; b++)
            memcpy(R->qseg + a * R->B * s->len + b * s->len, qseg + b * R->lq + s->lstart,
                   (size_t)s->len * 4);
    }
}

/* Both passes: every rank agrees on the local status (out of memory unless the pass has
 * all its buffers, `have`), then this rank's own block is packed into kv[0]. */
static fa_status ring_begin(ring *R, fa_mpi_call *c, MPI_Comm comm, fa_pass pass, fa_status local, int have,
                            const void *k, const void *v, const int32_t *qseg, const int32_t *kvseg) {
    if (local == FA_OK && !have)
        local = fa_error(FA_ERR_NO_MEMORY, "rank %d: out of memory (ring buffers)", R->pl->rank);
    fa_status st = fa_mpi_begin(c, comm, R->pl, pass, local);
    if (st != FA_OK) return st;
    const double t0 = fa_mpi_now();
    pack_own(R, k, v, qseg, kvseg);
    c->stats.merge_s += fa_mpi_now() - t0;
    return FA_OK;
}

/* The kv segment ids of k run ks of block buf, as contiguous [B, len]. */
static const int32_t *kv_ids(ring *R, const char *buf, const fa_mpi_seg *ks) {
    if (!R->g->has_segment_ids) return NULL;
    const int32_t *all = (const int32_t *)(buf + R->off_seg);
    for (int64_t b = 0; b < R->B; b++)
        memcpy(R->kseg + b * ks->len, all + b * R->lk + ks->lstart, (size_t)ks->len * 4);
    return R->kseg;
}

/* The plan of pair (q run qs, k run ks), or NULL when all its tiles are masked (not called;
 * the per-rank plan counts it the same way). */
static fa_plan *pair_plan(fa_mpi_call *c, const fa_mpi_seg *qs, const fa_mpi_seg *ks,
                          int forward, int64_t segq) {
    fa_problem p;
    fa_mpi_pair_problem(c->pl, qs, ks, &p);
    if (forward) p.o_stride = fa_mpi_contiguous(p.batch, p.heads_q, segq, p.head_dim_v);
    fa_plan *lp = NULL;
    double t0 = fa_mpi_now();
    fa_status st = fa_plan_create(&p, &c->pl->opt, &lp);
    c->stats.merge_s += fa_mpi_now() - t0; /* bookkeeping, with the merge */
    if (st != FA_OK) {
        fa_mpi_fail(c, st, "local plan: %s", fa_last_error());
        return NULL;
    }
    fa_cost cost;
    fa_plan_cost(lp, forward ? FA_FORWARD : FA_BACKWARD, &cost);
    if (cost.flops == 0) {
        fa_plan_destroy(lp);
        return NULL;
    }
    return lp;
}

/* Step s of either pass: posts the next block's receive from the left and this block's
 * send to the right (all but the last step), gives the k rows the block holds, and returns
 * the block. */
static char *ring_step(ring *R, fa_mpi_call *c, int s, fa_mpi_xfer *x, fa_mpi_shard *ksh) {
    char *cur = R->kv[s % 2];
    if (s < R->P - 1) {
        fa_mpi_irecv(c, x, R->kv[(s + 1) % 2], R->kvb, R->left, TAG_KV);
        fa_mpi_isend(c, x, cur, R->kvb, R->right, TAG_KV);
    }
    fa_mpi_shard_of(R->pl, 1, (R->r - s + R->P) % R->P, ksh);
    return cur;
}

/* Step s's (q run, k run) pairs with work, one at a time (q runs outer, in order): the
 * pair's runs and, in the block, its k and v rows and segment ids (NULL without). */
typedef struct {
    int i; /* the next pair */
    const fa_mpi_seg *qs, *ks;
    const void *k, *v;
    const int32_t *qids, *kvids;
} ring_pair;

/* The next pair's plan (the caller runs and frees it), or NULL when none is left or the
 * call has failed; pairs whose tiles are all masked are skipped (pair_plan). */
static fa_plan *next_pair(ring *R, fa_mpi_call *c, const fa_mpi_shard *ksh, const char *cur, int forward, int64_t segq,
                          ring_pair *pp) {
    while (c->st == FA_OK && pp->i < R->qsh.n * ksh->n) {
        const int qa = pp->i / ksh->n, kb = pp->i % ksh->n;
        pp->i++;
        pp->qs = &R->qsh.s[qa], pp->ks = &ksh->s[kb];
        fa_plan *lp = pair_plan(c, pp->qs, pp->ks, forward, segq);
        if (!lp) continue;
        pp->k = cur + (size_t)(pp->ks->lstart * R->D) * R->es;
        pp->v = cur + R->off_v + (size_t)(pp->ks->lstart * R->Dv) * R->es;
        pp->qids = R->g->has_segment_ids ? R->qseg + qa * R->B * segq : NULL;
        pp->kvids = kv_ids(R, cur, pp->ks);
        return lp;
    }
    return NULL;
}

/* One pair's local pass at step s on plan lp (then freed): its time into compute_s, its
 * counts into the call's; 0 when it failed (recorded, with the step). */
static int run_pair(ring *R, fa_mpi_call *c, fa_plan *lp, int backward, void *args, const fa_counts *n, int s) {
    const double t0 = fa_mpi_now();
    fa_status st = backward ? fa_backward(lp, args) : fa_forward(lp, args);
    if (R->r == fa_mpi_test_fail_kernel_rank && s == (R->P > 1))
        st = fa_error(FA_ERR_BACKEND, "test hook: the kernel fails");
    c->stats.compute_s += fa_mpi_now() - t0;
    fa_plan_destroy(lp);
    if (st != FA_OK) {
        /* fa_mpi_fail formats the message before it sets the new one */
        fa_mpi_fail(c, st, "local %s at ring step %d: %s", backward ? "backward" : "forward", s, fa_last_error());
        return 0;
    }
    c->stats.counts.flops += n->flops;
    c->stats.counts.transcendentals += n->transcendentals;
    return 1;
}

/* The sink of each head joins every merged row once (a merge step: not counted, as the
 * merges are not): lse' = log(exp(lse) + exp(sink)), o' = o exp(lse - lse'). A row without
 * keys (lse = -inf, o = 0) gets lse = sink. */
static void add_sinks(const ring *R, const float *sinks, float *acc_o, float *acc_lse) {
    for (int64_t b = 0; b < R->B; b++)
        for (int64_t h = 0; h < R->Hq; h++)
            for (int64_t t = 0; t < R->lq; t++) {
                const int64_t row = (b * R->Hq + h) * R->lq + t;
                const float la = acc_lse[row], sk = sinks[h];
                if (la == -INFINITY) {
                    acc_lse[row] = sk;
                    continue;
                }
                const float m = la > sk ? la : sk, lse = m + logf(expf(la - m) + expf(sk - m));
                const float w = expf(la - lse);
                for (int64_t d = 0; d < R->Dv; d++) acc_o[row * R->Dv + d] *= w;
                acc_lse[row] = lse;
            }
}

/* This rank's share of dsink, -sum over its rows of exp(sink_h - lse) (do . o), per head
 * in f64 (b, then local rows, ascending): share[h]. */
static void dsink_share(const ring *R, const fa_mpi_backward_args *a, double *share) {
    for (int64_t h = 0; h < R->Hq; h++) {
        double sum = 0.0;
        for (int64_t b = 0; b < R->B; b++)
            for (int64_t t = 0; t < R->lq; t++) {
                float delta = 0.0f;
                for (int64_t d = 0; d < R->Dv; d++) {
                    const int64_t at = fa_offset(&R->ost, b, h, t, d);
                    delta += fa_load(R->g->dtype, a->d_o, at) * fa_load(R->g->dtype, a->o, at);
                }
                sum += (double)(expf(a->sinks[h] - a->lse[(b * R->Hq + h) * R->lq + t]) * delta);
            }
        share[h] = -sum;
    }
}

/* dsink: every rank's share (dsink_share), gathered into shares [P, Hq] on every rank (the
 * collective joined even after a local failure) and added in rank order. */
static void gather_dsink(ring *R, fa_mpi_call *c, const fa_mpi_backward_args *a, double *shares) {
    const double t0 = fa_mpi_now();
    dsink_share(R, a, shares + R->r * R->Hq);
    c->stats.merge_s += fa_mpi_now() - t0;
    const double t1 = fa_mpi_now();
    const int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, shares, (int)R->Hq, MPI_DOUBLE, c->comm);
    c->stats.comm_wait_s += fa_mpi_now() - t1;
    if (!fa_mpi_ok(c, rc, "MPI_Allgather")) return;
    c->stats.bytes_sent += (R->P - 1) * R->Hq * 8;
    c->stats.bytes_received += (R->P - 1) * R->Hq * 8;
    if (c->st != FA_OK) return;
    for (int64_t h = 0; h < R->Hq; h++) {
        double sum = 0.0;
        for (int j = 0; j < R->P; j++) sum += shares[j * R->Hq + h];
        a->dsink[h] = (float)sum;
    }
}

fa_status fa_mpi_ring_forward(MPI_Comm comm, const fa_mpi_plan *pl, const fa_mpi_forward_args *a,
                              fa_status local) {
    ring R;
    int ok = ring_init(&R, pl);
    int64_t segq = R.qsh.s[0].len, rows = R.B * R.Hq * R.lq;
    void *part_o = fa_mpi_alloc(pl, R.B * R.Hq * segq * R.Dv * (int64_t)R.es);
    float *part_lse = fa_mpi_alloc(pl, R.B * R.Hq * segq * 4);
    float *acc_o = fa_mpi_alloc(pl, rows * R.Dv * 4), *acc_lse = fa_mpi_alloc(pl, rows * 4);
    fa_mpi_call c;
    fa_status st = ring_begin(&R, &c, comm, FA_FORWARD, local, ok && part_o && part_lse && acc_o && acc_lse, a->k, a->v,
                              a->q_segment_ids, a->kv_segment_ids);
    if (st != FA_OK) goto out;
    for (int64_t i = 0; i < rows; i++) acc_lse[i] = -INFINITY;
    memset(acc_o, 0, (size_t)(rows * R.Dv) * 4);
    for (int s = 0; s < R.P; s++) {
        fa_mpi_xfer x = {0};
        fa_mpi_shard ksh;
        char *cur = ring_step(&R, &c, s, &x, &ksh);
        ring_pair pp = {0};
        fa_plan *lp;
        while ((lp = next_pair(&R, &c, &ksh, cur, 1, segq, &pp))) {
            const fa_mpi_seg *qs = pp.qs;
            fa_counts n = {0, 0};
            fa_forward_args fw;
            memset(&fw, 0, sizeof fw);
            fw.q = (const char *)a->q + (size_t)(qs->lstart * R.qst.s[2]) * R.es;
            fw.k = pp.k, fw.v = pp.v, fw.q_segment_ids = pp.qids, fw.kv_segment_ids = pp.kvids;
            fw.o = part_o, fw.lse = part_lse, fw.alibi_slopes = a->alibi_slopes;
            fw.counts = &n;
            if (!run_pair(&R, &c, lp, 0, &fw, &n, s)) break;
            double t2 = fa_mpi_now();
            for (int64_t bh = 0; bh < R.B * R.Hq; bh++)
                fa_mpi_merge_rows(segq, R.Dv, acc_o + (bh * R.lq + qs->lstart) * R.Dv,
                                  acc_lse + bh * R.lq + qs->lstart, R.g->dtype,
                                  (const char *)part_o + (size_t)(bh * segq * R.Dv) * R.es,
                                  R.Dv, part_lse + bh * segq);
            c.stats.merge_s += fa_mpi_now() - t2;
        }
        fa_mpi_wait(&c, &x);
        if (a->progress && c.st == FA_OK) a->progress(a->progress_ctx, s + 1, R.P);
    }
    if (c.st == FA_OK && R.g->has_sinks) {
        const double t2 = fa_mpi_now();
        add_sinks(&R, a->sinks, acc_o, acc_lse);
        c.stats.merge_s += fa_mpi_now() - t2;
    }
    if (c.st == FA_OK) {
        fa_mpi_store_f32(R.g->dtype, a->o, &R.ost, acc_o, R.B, R.Hq, R.lq, R.Dv);
        if (a->lse) memcpy(a->lse, acc_lse, (size_t)rows * 4);
    }
    st = fa_mpi_end(&c, a->stats);
out:
    ring_free(&R);
    fa_free(part_o), fa_free(part_lse), fa_free(acc_o), fa_free(acc_lse);
    return st;
}

/* acc (f32 [B,Hk,lk,D] then [B,Hk,lk,Dv]) += the pair's dk, dv (dtype, rows of ks). */
static void add_dkv(const ring *R, float *acc, const char *dkv, const fa_mpi_seg *ks) {
    const char *dv = dkv + R->off_v;
    float *accv = acc + R->B * R->Hk * R->lk * R->D;
    for (int64_t bh = 0; bh < R->B * R->Hk; bh++)
        for (int64_t t = ks->lstart; t < ks->lstart + ks->len; t++) {
            int64_t row = bh * R->lk + t;
            for (int64_t d = 0; d < R->D; d++)
                acc[row * R->D + d] += fa_load(R->g->dtype, dkv, row * R->D + d);
            for (int64_t d = 0; d < R->Dv; d++)
                accv[row * R->Dv + d] += fa_load(R->g->dtype, dv, row * R->Dv + d);
        }
}

fa_status fa_mpi_ring_backward(MPI_Comm comm, const fa_mpi_plan *pl,
                               const fa_mpi_backward_args *a, fa_status local) {
    ring R;
    int ok = ring_init(&R, pl);
    int64_t segq = R.qsh.s[0].len, accb = fa_mpi_acc_block_bytes(pl);
    int64_t qspan = fa_mpi_span(&R.qst, R.B, R.Hq, R.lq, R.D);
    float *acc[2] = {fa_mpi_alloc(pl, accb), fa_mpi_alloc(pl, accb)};
    float *home = R.P > 1 ? fa_mpi_alloc(pl, accb) : acc[0];
    float *dq_acc = fa_mpi_alloc(pl, R.B * R.Hq * R.lq * R.D * 4);
    char *dq_p = fa_mpi_alloc(pl, qspan * (int64_t)R.es), *dkv_p = fa_mpi_alloc(pl, R.off_seg);
    float *lse_c = fa_mpi_alloc(pl, R.B * R.Hq * segq * 4);
    double *shares = R.g->has_sinks ? fa_mpi_alloc(pl, R.P * R.Hq * 8) : NULL;
    fa_mpi_call c;
    fa_status st = ring_begin(&R, &c, comm, FA_BACKWARD, local,
                              ok && acc[0] && acc[1] && home && dq_acc && dq_p && dkv_p && lse_c &&
                                  (shares || !R.g->has_sinks),
                              a->k, a->v,
                              a->q_segment_ids, a->kv_segment_ids);
    if (st != FA_OK) goto out;
    memset(acc[0], 0, (size_t)accb);
    memset(dq_acc, 0, (size_t)(R.B * R.Hq * R.lq * R.D) * 4);
    fa_mpi_xfer acc_in = {0}, acc_out = {0}; /* this step's accumulator; the last one sent */
    for (int s = 0; s < R.P; s++) {
        float *mine = acc[s % 2];
        fa_mpi_xfer x = {0};
        fa_mpi_shard ksh;
        char *cur = ring_step(&R, &c, s, &x, &ksh);
        ring_pair pp = {0};
        fa_plan *lp;
        while ((lp = next_pair(&R, &c, &ksh, cur, 0, segq, &pp))) {
            const fa_mpi_seg *qs = pp.qs, *ks = pp.ks;
            double t1 = fa_mpi_now();
            for (int64_t bh = 0; bh < R.B * R.Hq; bh++)
                memcpy(lse_c + bh * segq, a->lse + bh * R.lq + qs->lstart, (size_t)segq * 4);
            size_t qoff = (size_t)(qs->lstart * R.qst.s[2]) * R.es;
            size_t ooff = (size_t)(qs->lstart * R.ost.s[2]) * R.es;
            fa_counts n = {0, 0};
            fa_backward_args bw;
            memset(&bw, 0, sizeof bw);
            bw.q = (const char *)a->q + qoff, bw.dq = dq_p + qoff;
            bw.k = pp.k, bw.v = pp.v, bw.q_segment_ids = pp.qids, bw.kv_segment_ids = pp.kvids;
            bw.dk = dkv_p + (size_t)(ks->lstart * R.D) * R.es;
            bw.dv = dkv_p + R.off_v + (size_t)(ks->lstart * R.Dv) * R.es;
            bw.o = (const char *)a->o + ooff, bw.d_o = (const char *)a->d_o + ooff;
            bw.lse = lse_c, bw.alibi_slopes = a->alibi_slopes;
            bw.counts = &n;
            c.stats.merge_s += fa_mpi_now() - t1;
            if (!run_pair(&R, &c, lp, 1, &bw, &n, s)) break;
            double t3 = fa_mpi_now();
            for (int64_t b = 0; b < R.B; b++)
                for (int64_t h = 0; h < R.Hq; h++)
                    for (int64_t t = qs->lstart; t < qs->lstart + qs->len; t++) {
                        float *dst = dq_acc + ((b * R.Hq + h) * R.lq + t) * R.D;
                        for (int64_t d = 0; d < R.D; d++)
                            dst[d] += fa_load(R.g->dtype, dq_p, fa_offset(&R.qst, b, h, t, d));
                    }
            double t4 = fa_mpi_now();
            fa_mpi_wait(&c, &acc_in); /* the block's accumulator, from the left */
            double t5 = fa_mpi_now();
            add_dkv(&R, mine, dkv_p, ks);
            c.stats.merge_s += (t4 - t3) + (fa_mpi_now() - t5);
        }
        fa_mpi_wait(&c, &acc_in);
        fa_mpi_wait(&c, &acc_out); /* its buffer is the next receive's */
        if (R.P > 1) {
            fa_mpi_irecv(&c, &acc_in, s < R.P - 1 ? acc[(s + 1) % 2] : home, accb, R.left, TAG_ACC);
            fa_mpi_isend(&c, &acc_out, mine, accb, R.right, TAG_ACC);
        }
        fa_mpi_wait(&c, &x);
        if (a->progress && c.st == FA_OK) a->progress(a->progress_ctx, s + 1, R.P);
    }
    fa_mpi_wait(&c, &acc_in);
    fa_mpi_wait(&c, &acc_out);
    if (R.g->has_sinks) gather_dsink(&R, &c, a, shares);
    if (c.st == FA_OK) {
        fa_strides kst = fa_mpi_local_stride(&R.g->k_stride, R.B, R.Hk, R.lk, R.D);
        fa_strides vst = fa_mpi_local_stride(&R.g->v_stride, R.B, R.Hk, R.lk, R.Dv);
        fa_mpi_store_f32(R.g->dtype, a->dq, &R.qst, dq_acc, R.B, R.Hq, R.lq, R.D);
        fa_mpi_store_f32(R.g->dtype, a->dk, &kst, home, R.B, R.Hk, R.lk, R.D);
        fa_mpi_store_f32(R.g->dtype, a->dv, &vst, home + R.B * R.Hk * R.lk * R.D, R.B, R.Hk,
                         R.lk, R.Dv);
    }
    st = fa_mpi_end(&c, a->stats);
out:
    ring_free(&R);
    fa_free(acc[0]), fa_free(acc[1]), fa_free(dq_acc), fa_free(dq_p), fa_free(dkv_p), fa_free(lse_c), fa_free(shares);
    if (home != acc[0]) fa_free(home);
    return st;
}
