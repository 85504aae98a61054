/* Internal on purpose: includes src/mpi/mpi_internal.h for fa_mpi_test_fail_kernel_rank. */
/* Sequence-parallel attention under mpirun (any P): for a set of cases (ring contiguous and
 * zigzag, Ulysses; non-causal, causal, GQA, windows, softcap, ALiBi, segment ids, Sq != Sk)
 * every rank compares its rows of o, lse, dq, dk, dv with the float64 reference and with the
 * single-process kernel (f32 bound 5e-5 of the largest reference value, as tests/
 * backward_check.h), checks that a second run gives the same bits, that the counted flops,
 * transcendentals and bytes equal the per-rank plan, and that zigzag causal work is
 * balanced within one tile. Then the failures: ranks disagreeing on the problem, a rank with
 * a NULL tensor, a rank whose allocation fails: every rank must return an error, quickly.
 * Seed: FA_TEST_SEED (rank 0's is used by all). Prints PASS/FAIL lines from rank 0. */
#include "flashattn_mpi.h"
#include "mpi_internal.h"
#include "ref/ref.h"
#include "check.h"

#include <mpi.h>

static int P, R, failures;
static double TOL;  /* of the case's dtype: as tests/backward_check.h (f32 5e-5, else 5 u) */
static fa_dtype T;  /* the case's dtype */
static int SINKS;   /* the next cases have attention sinks (and check dsink) */
static size_t ES;   /* its size */

typedef struct {
    const char *name;
    fa_mpi_method method;
    fa_mpi_layout layout;
    int64_t Hq, Hk, Sq, Sk;
    int causal, alibi, seg;
    int64_t wl, wr;
    float softcap;
    int topleft; /* causal aligned top-left (diag_offset 0) */
    fa_dtype dtype;
    int bshd; /* local tensors laid out [B, S/P, H, D] (strides in the problem) */
} tcase;

/* Every rank agrees: a failure anywhere fails the case for all. */
static int all_ok(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static void report(const char *name, const char *what, int ok, const char *detail) {
    ok = all_ok(ok);
    if (!ok) failures++;
    if (R == 0) printf("%s P=%d %s: %s%s%s\n", ok ? "PASS" : "FAIL", P, name, what, detail ? " " : "", detail ? detail : "");
    fflush(stdout);
}

/* Local rows of a global [B, H, S, D] tensor of dtype T (which: q-like or k-like). */
static void *shard(const fa_mpi_plan *pl, int which, const void *g, int64_t B, int64_t H,
                   int64_t S, int64_t D) {
    int64_t L = fa_mpi_local_rows(pl, which);
    char *x = tu_alloc(ES * (size_t)(B * H * L * D));
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t t = 0; t < L; t++)
            memcpy(x + ES * (size_t)((bh * L + t) * D),
                   (const char *)g + ES * (size_t)((bh * S + fa_mpi_global_row(pl, which, t)) * D),
                   ES * (size_t)D);
    return x;
}

/* max |local - global rows| over this rank's rows, and max |global ref| over all. */
/* [B, H, L, D] <-> [B, L, H, D] copies (elements of ES bytes); back = 1 for the inverse. */
static void *permute(void *x, int64_t B, int64_t H, int64_t L, int64_t D, int back) {
    char *y = tu_alloc(ES * (size_t)(B * H * L * D));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < L; t++) {
                int64_t bhsd = ((b * H + h) * L + t) * D, bshd = ((b * L + t) * H + h) * D;
                memcpy(y + ES * (size_t)(back ? bhsd : bshd), (char *)x + ES * (size_t)(back ? bshd : bhsd),
                       ES * (size_t)D);
            }
    free(x);
    return y;
}

static fa_strides bshd_stride(int64_t H, int64_t L, int64_t D) {
    fa_strides st = {{L * H * D, D, H * D, 1}};
    return st;
}

static double err_f(const fa_mpi_plan *pl, int which, const void *loc, const double *ref,
                    int64_t B, int64_t H, int64_t S, int64_t D, double *refmax) {
    int64_t L = fa_mpi_local_rows(pl, which);
    double e = 0, m = 0;
    for (int64_t i = 0; i < B * H * S * D; i++) m = fmax(m, fabs(ref[i]));
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t d = 0; d < D; d++) {
                double r = ref[(bh * S + fa_mpi_global_row(pl, which, t)) * D + d];
                double x = fa_load(T, loc, (bh * L + t) * D + d);
                if (!(fabs(x - r) <= e)) e = isnan(x) ? INFINITY : fabs(x - r);
            }
    *refmax = m;
    return e;
}

static int within(double e, double m) { return e <= TOL * (m > 0 ? m : 1); }

/* What a call's progress callback saw: calls, the last (done, total), and whether done
 * ever went down or past total. */
typedef struct {
    int calls, bad;
    int64_t done, total;
} seen_progress;
static void note_progress(void *ctx, int64_t done, int64_t total) {
    seen_progress *sp = ctx;
    sp->bad |= done < sp->done || done > total || total <= 0 || (sp->calls && total != sp->total);
    sp->calls++, sp->done = done, sp->total = total;
}

static void run_case(const tcase *tc, uint64_t seed) {
    const int64_t B = 2, D = 16, Dv = 8;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = tc->Hq, p.heads_kv = tc->Hk, p.seq_q = tc->Sq, p.seq_k = tc->Sk; /* Hk 0: default */
    p.head_dim = D, p.head_dim_v = Dv, p.causal = tc->causal, p.dtype = tc->dtype;
    T = tc->dtype, ES = fa_dtype_size(T);
    TOL = T == FA_F32 ? 5e-5 : T == FA_BF16 ? 5.0 * 0x1p-8 : 5.0 * 0x1p-11;
    p.window_left = tc->wl, p.window_right = tc->wr, p.softcap = tc->softcap;
    p.has_alibi = tc->alibi, p.has_segment_ids = tc->seg;
    p.has_diag_offset = tc->topleft, p.diag_offset = 0;
    p.has_sinks = SINKS;
    fa_options opt;
    memset(&opt, 0, sizeof opt);
    opt.backend = FA_BACKEND_CPU, opt.threads = 1, opt.block_q = 8, opt.block_k = 8;
    int64_t Sq = p.seq_q, Sk = p.seq_k, Hq = p.heads_q, Hk = tc->Hk ? tc->Hk : tc->Hq;
    int64_t nq = B * Hq * Sq * D, nk = B * Hk * Sk * D, nv = B * Hk * Sk * Dv, no = B * Hq * Sq * Dv;
    uint64_t s = seed;
    void *q = tu_alloc(ES * (size_t)nq), *k = tu_alloc(ES * (size_t)nk), *v = tu_alloc(ES * (size_t)nv);
    void *d_o = tu_alloc(ES * (size_t)no);
    float *slopes = tu_alloc(4 * (size_t)Hq);
    int32_t *qs = tu_alloc(4 * (size_t)(B * Sq)), *ks = tu_alloc(4 * (size_t)(B * Sk));
    tu_fill(&s, T, q, nq, 1.5), tu_fill(&s, T, k, nk, 1.5), tu_fill(&s, T, v, nv, 1);
    tu_fill(&s, T, d_o, no, 1);
    for (int64_t h = 0; h < Hq; h++) slopes[h] = (float)(0.05 + 0.1 * h / Hq);
    float *sinks = tu_alloc(4 * (size_t)Hq); /* one dominating its rows, the rest among the scores */
    for (int64_t h = 0; h < Hq; h++) sinks[h] = h == 0 ? 6.0f : (float)(2.0 * tu_uniform(&s));
    double *rds = tu_alloc(8 * (size_t)Hq);
    for (int64_t i = 0; i < B * Sq; i++) qs[i] = (int32_t)((i % Sq) / 20 + (i / Sq));
    for (int64_t i = 0; i < B * Sk; i++) ks[i] = (int32_t)((i % Sk) * Sq / Sk / 20 + (i / Sk));

    /* references: float64, and the single-process kernel */
    double *ro = tu_alloc(8 * (size_t)no), *rl = tu_alloc(8 * (size_t)(B * Hq * Sq));
    double *rq = tu_alloc(8 * (size_t)nq), *rk = tu_alloc(8 * (size_t)nk), *rv = tu_alloc(8 * (size_t)nv);
    fa_forward_args fw = {0};
    fw.q = q, fw.k = k, fw.v = v, fw.alibi_slopes = tc->alibi ? slopes : NULL;
    fw.q_segment_ids = tc->seg ? qs : NULL, fw.kv_segment_ids = tc->seg ? ks : NULL;
    fw.sinks = SINKS ? sinks : NULL;
    fa_problem rp = p; /* the reference takes every field resolved */
    rp.heads_kv = Hk;
    fa_ref_forward(&rp, &fw, ro, rl);
    fa_backward_args bw = {0};
    bw.q = q, bw.k = k, bw.v = v, bw.d_o = d_o, bw.alibi_slopes = fw.alibi_slopes;
    bw.q_segment_ids = fw.q_segment_ids, bw.kv_segment_ids = fw.kv_segment_ids, bw.sinks = fw.sinks;
    fa_ref_backward_sinks(&rp, &bw, 0, rq, rk, rv, rds);
    void *so = tu_alloc(ES * (size_t)no);
    double *so_d = tu_alloc(8 * (size_t)no);
    fa_plan *single = NULL;
    fa_options o1 = opt;
    o1.block_q = o1.block_k = 0;
    if (fa_plan_create(&p, &o1, &single) != FA_OK) { report(tc->name, "single-process plan", 0, fa_last_error()); return; }
    fw.o = so;
    fa_forward(single, &fw);
    fa_plan_destroy(single);
    for (int64_t i = 0; i < no; i++) so_d[i] = fa_load(T, so, i);

    if (tc->bshd) { /* the local tensors' strides: the same on every rank */
        int64_t lq0 = Sq / P, lk0 = Sk / P;
        p.q_stride = bshd_stride(Hq, lq0, D), p.o_stride = bshd_stride(Hq, lq0, Dv);
        p.k_stride = bshd_stride(Hk, lk0, D), p.v_stride = bshd_stride(Hk, lk0, Dv);
    }
    fa_mpi_plan *pl = NULL;
    fa_status st = fa_mpi_plan_create(&p, &opt, tc->method, tc->layout, P, R, &pl);
    if (st != FA_OK) { report(tc->name, "plan", 0, fa_last_error()); return; }
    int64_t lq = fa_mpi_local_rows(pl, 0), lk = fa_mpi_local_rows(pl, 1);
    void *lqv = shard(pl, 0, q, B, Hq, Sq, D), *lkv = shard(pl, 1, k, B, Hk, Sk, D);
    void *lvv = shard(pl, 1, v, B, Hk, Sk, Dv), *ldo = shard(pl, 0, d_o, B, Hq, Sq, Dv);
    if (tc->bshd) {
        lqv = permute(lqv, B, Hq, lq, D, 0), lkv = permute(lkv, B, Hk, lk, D, 0);
        lvv = permute(lvv, B, Hk, lk, Dv, 0), ldo = permute(ldo, B, Hq, lq, Dv, 0);
    }
    int32_t *lqs = tu_alloc(4 * (size_t)(B * lq)), *lks = tu_alloc(4 * (size_t)(B * lk));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < lq; t++) lqs[b * lq + t] = qs[b * Sq + fa_mpi_global_row(pl, 0, t)];
        for (int64_t t = 0; t < lk; t++) lks[b * lk + t] = ks[b * Sk + fa_mpi_global_row(pl, 1, t)];
    }
    void *o[2], *dq[2], *dk[2], *dv[2];
    float *lse[2], *dsink[2];
    fa_mpi_stats fs[2], bs[2];
    seen_progress fp = {0, 0, 0, 0}, bp = {0, 0, 0, 0}; /* the second run's */
    int ok = 1;
    for (int run = 0; run < 2; run++) {
        o[run] = tu_alloc(ES * (size_t)(B * Hq * lq * Dv)), lse[run] = tu_alloc(4 * (size_t)(B * Hq * lq));
        dq[run] = tu_alloc(ES * (size_t)(B * Hq * lq * D)), dk[run] = tu_alloc(ES * (size_t)(B * Hk * lk * D));
        dv[run] = tu_alloc(ES * (size_t)(B * Hk * lk * Dv)), dsink[run] = tu_alloc(4 * (size_t)Hq);
        tu_poison(FA_F32, dsink[run], Hq);
        tu_poison(T, o[run], B * Hq * lq * Dv), tu_poison(FA_F32, lse[run], B * Hq * lq);
        tu_poison(T, dq[run], B * Hq * lq * D), tu_poison(T, dk[run], B * Hk * lk * D);
        tu_poison(T, dv[run], B * Hk * lk * Dv);
        fa_mpi_forward_args ma = {lqv, lkv, lvv, o[run], lse[run], fw.alibi_slopes,
                                  tc->seg ? lqs : NULL, tc->seg ? lks : NULL, &fs[run], fw.sinks, NULL, NULL};
        if (run) ma.progress = note_progress, ma.progress_ctx = &fp;
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &ma);
        if (st != FA_OK) { ok = 0; printf("rank %d: forward: %s\n", R, fa_last_error()); break; }
        fa_mpi_backward_args mb = {lqv, lkv, lvv, o[run], ldo, lse[run], dq[run], dk[run], dv[run],
                                   fw.alibi_slopes, ma.q_segment_ids, ma.kv_segment_ids, &bs[run], fw.sinks,
                                   SINKS ? dsink[run] : NULL, NULL, NULL};
        if (run) mb.progress = note_progress, mb.progress_ctx = &bp;
        st = fa_mpi_backward(MPI_COMM_WORLD, pl, &mb);
        if (st != FA_OK) { ok = 0; printf("rank %d: backward: %s\n", R, fa_last_error()); break; }
    }
    if (!all_ok(ok)) { report(tc->name, "runs", 0, NULL); return; }
    /* progress: every rank's calls reach their total (the ring: its P steps) */
    for (int pass = 0; pass < 2; pass++) {
        const seen_progress *sp = pass ? &bp : &fp;
        char what[160];
        snprintf(what, sizeof what, "rank %d %s progress: %d calls, %lld/%lld%s", R, pass ? "backward" : "forward",
                 sp->calls, (long long)sp->done, (long long)sp->total, sp->bad ? ", out of order" : "");
        report(tc->name, pass ? "backward progress" : "forward progress",
               sp->calls > 0 && !sp->bad && sp->done == sp->total && (tc->method != FA_MPI_RING || sp->total == P),
               what);
    }
    for (int run = 0; tc->bshd && run < 2; run++) {
        o[run] = permute(o[run], B, Hq, lq, Dv, 1), dq[run] = permute(dq[run], B, Hq, lq, D, 1);
        dk[run] = permute(dk[run], B, Hk, lk, D, 1), dv[run] = permute(dv[run], B, Hk, lk, Dv, 1);
    }

    char msg[256];
    double m, eo = err_f(pl, 0, o[0], ro, B, Hq, Sq, Dv, &m), mo = m;
    double es = err_f(pl, 0, o[0], so_d, B, Hq, Sq, Dv, &m);
    double eq = err_f(pl, 0, dq[0], rq, B, Hq, Sq, D, &m), mq = m;
    double ek = err_f(pl, 1, dk[0], rk, B, Hk, Sk, D, &m), mk = m;
    double ev = err_f(pl, 1, dv[0], rv, B, Hk, Sk, Dv, &m), mv = m;
    double el = 0;
    for (int64_t bh = 0; bh < B * Hq; bh++)
        for (int64_t t = 0; t < lq; t++) {
            double r = rl[bh * Sq + fa_mpi_global_row(pl, 0, t)], x = lse[0][bh * lq + t];
            double e = (isinf(r) && x == r) ? 0 : fabs(x - r) / (1 + fabs(r));
            if (!(e <= el)) el = isnan(e) ? INFINITY : e;
        }
    /* dsink: the same on every rank, against the reference, relative to the sum of its terms'
     * magnitudes |exp(sink_h - lse_i) delta_i| (as tests/test_sinks.c): the terms' signs
     * differ, and in f16 or bf16 each carries the rounding of the o it is computed from, so a
     * dsink that cancels to near 0 is good to TOL of that sum, not of itself */
    double eds = 0;
    for (int64_t h = 0; SINKS && h < Hq; h++) {
        double terms = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Sq; i++) {
                double delta = 0;
                for (int64_t c = 0; c < Dv; c++) {
                    const int64_t at = ((b * Hq + h) * Sq + i) * Dv + c;
                    delta += ro[at] * fa_load(T, d_o, at);
                }
                terms += fabs(exp((double)sinks[h] - rl[(b * Hq + h) * Sq + i]) * delta);
            }
        const double e = fabs(dsink[0][h] - rds[h]) / (terms > 0 ? terms : 1);
        if (!(e <= eds)) eds = isnan(e) ? INFINITY : e;
    }
    double E[7] = {eo / mo, es / mo, el, eq / mq, ek / mk, ev / mv, eds};
    MPI_Allreduce(MPI_IN_PLACE, E, 7, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    snprintf(msg, sizeof msg,
             "(o %.1e, o vs 1 process %.1e, lse %.1e, dq %.1e, dk %.1e, dv %.1e, dsink %.1e; bound %.0e)", E[0],
             E[1], E[2], E[3], E[4], E[5], E[6], TOL);
    report(tc->name, "values", within(eo, mo) && within(es, mo) && el <= TOL && within(eq, mq) &&
                                   within(ek, mk) && within(ev, mv) && eds <= TOL, msg);
    if (SINKS) { /* every rank holds the whole dsink: rank 0's, bit for bit */
        float d0[64];
        memcpy(d0, dsink[0], 4 * (size_t)Hq);
        MPI_Bcast(d0, (int)Hq, MPI_FLOAT, 0, MPI_COMM_WORLD);
        report(tc->name, "dsink the same on every rank", all_ok(!memcmp(d0, dsink[0], 4 * (size_t)Hq)), NULL);
    }
    int same = !memcmp(o[0], o[1], ES * (size_t)(B * Hq * lq * Dv)) &&
               !memcmp(lse[0], lse[1], 4 * (size_t)(B * Hq * lq)) &&
               !memcmp(dq[0], dq[1], ES * (size_t)(B * Hq * lq * D)) &&
               !memcmp(dk[0], dk[1], ES * (size_t)(B * Hk * lk * D)) &&
               !memcmp(dv[0], dv[1], ES * (size_t)(B * Hk * lk * Dv)) &&
               (!SINKS || !memcmp(dsink[0], dsink[1], 4 * (size_t)Hq));
    report(tc->name, "same bits on a second run", same, NULL);

    fa_mpi_cost cf, cb;
    fa_mpi_plan_cost(pl, FA_FORWARD, &cf);
    fa_mpi_plan_cost(pl, FA_BACKWARD, &cb);
    int exact = !tc->seg; /* with segment ids the plan is an upper bound (docs/semantics.md) */
    int cnt = exact ? (fs[0].counts.flops == cf.flops && fs[0].counts.transcendentals == cf.transcendentals &&
                       bs[0].counts.flops == cb.flops && bs[0].counts.transcendentals == cb.transcendentals)
                    : (fs[0].counts.flops <= cf.flops && bs[0].counts.flops <= cb.flops);
    snprintf(msg, sizeof msg, "(rank %d: forward %lld of %lld flops, backward %lld of %lld)", R,
             (long long)fs[0].counts.flops, (long long)cf.flops, (long long)bs[0].counts.flops,
             (long long)cb.flops);
    report(tc->name, exact ? "counted flops/transcendentals == plan" : "counted flops <= plan", cnt,
           cnt ? NULL : msg);
    int bytes = fs[0].bytes_sent == cf.bytes_sent && fs[0].bytes_received == cf.bytes_received &&
                bs[0].bytes_sent == cb.bytes_sent && bs[0].bytes_received == cb.bytes_received;
    snprintf(msg, sizeof msg, "(rank %d sent %lld/%lld, plan %lld/%lld)", R, (long long)fs[0].bytes_sent,
             (long long)bs[0].bytes_sent, (long long)cf.bytes_sent, (long long)cb.bytes_sent);
    report(tc->name, "bytes sent and received == plan", bytes, bytes && R ? NULL : msg);
    if (tc->layout == FA_MPI_ZIGZAG && tc->causal && tc->method == FA_MPI_RING && tc->wl < 0 &&
        tc->Sq == tc->Sk) {
        /* zigzag balances the causal triangle (a window cuts it unevenly) */
        int64_t f[2] = {fs[0].counts.flops, bs[0].counts.flops}, lo[2], hi[2];
        MPI_Allreduce(f, lo, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(f, hi, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        /* one tile: block_q x block_k scores of every (b, h), forward and backward products */
        int64_t tile_f = B * Hq * 2 * 8 * 8 * (D + Dv), tile_b = B * Hq * 2 * 8 * 8 * (3 * D + 2 * Dv) * 2;
        snprintf(msg, sizeof msg, "(forward %lld..%lld, backward %lld..%lld flops per rank)",
                 (long long)lo[0], (long long)hi[0], (long long)lo[1], (long long)hi[1]);
        report(tc->name, "zigzag per-rank flops within one tile", hi[0] - lo[0] <= tile_f && hi[1] - lo[1] <= tile_b, msg);
    }
    for (int run = 0; run < 2; run++)
        free(o[run]), free(lse[run]), free(dq[run]), free(dk[run]), free(dv[run]), free(dsink[run]);
    free(sinks), free(rds);
    free(lqv), free(lkv), free(lvv), free(ldo), free(lqs), free(lks);
    free(q), free(k), free(v), free(d_o), free(slopes), free(qs), free(ks);
    free(ro), free(rl), free(rq), free(rk), free(rv), free(so), free(so_d);
    fa_mpi_plan_destroy(pl);
}

/* The paper model against hand-computed figures: a non-causal ring of 8 ranks does the same
 * work every step (2 B Hq L^2 (D + Dv) flops against one K/V block of B Hk L (D + Dv) es
 * bytes), so it hides exactly when bandwidth >= block / (step flops / rate). */
static void check_model(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 16, p.heads_kv = 8, p.seq_q = p.seq_k = 1024, p.head_dim = 64, p.head_dim_v = 32;
    p.dtype = FA_BF16;
    fa_options opt = {FA_BACKEND_CPU, 1, 0, 0};
    const int np = 8;
    const int64_t L = 1024 / np;
    fa_mpi_plan *pl = NULL, *ul = NULL;
    int ok = fa_mpi_plan_create(&p, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, np, 3, &pl) == FA_OK &&
             fa_mpi_plan_create(&p, &opt, FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, np, 3, &ul) == FA_OK;
    if (!ok) { report("model", "plans", 0, fa_last_error()); return; }
    double step = 2.0 * 2 * 16 * L * L * (64 + 32), block = 2.0 * 8 * L * (64 + 32) * 2, rate = 1e12;
    double edge = block / (step / rate); /* the bandwidth at which a step's transfer just hides */
    fa_mpi_cost c;
    fa_mpi_plan_cost(pl, FA_FORWARD, &c);
    ok = c.flops == (int64_t)(step * np) && c.bytes_sent == (int64_t)(block * (np - 1)) && c.steps == np;
    fa_mpi_prediction pr;
    fa_mpi_predict(pl, FA_FORWARD, rate, edge * 0.5, &pr);
    double want = (np - 1) * (block / (edge * 0.5)) + step / rate;
    ok = ok && !pr.comm_hidden && fabs(pr.predicted_s - want) <= 1e-9 * want;
    ok = ok && fa_mpi_comm_hides(pl, FA_FORWARD, rate, edge * 1.01) && !fa_mpi_comm_hides(pl, FA_FORWARD, rate, edge * 0.99);
    /* Ulysses: (P-1)/P of q, k, v there and of o, lse back; compute plus communication */
    fa_mpi_plan_cost(ul, FA_FORWARD, &c);
    int64_t moved = 2 * 16 * L * 64 * 2 + 2 * 8 * L * (64 + 32) * 2 + 2 * 16 * L * 32 * 2 + 2 * 16 * L * 4;
    ok = ok && c.bytes_sent == moved / np * (np - 1) && c.bytes_received == c.bytes_sent;
    fa_mpi_predict(ul, FA_FORWARD, rate, 1e9, &pr);
    ok = ok && !pr.comm_hidden && fabs(pr.predicted_s - ((double)c.flops / rate + (double)c.bytes_sent / 1e9)) < 1e-12;
    /* passes, which and layouts outside their enums: errors (or -1), never another's figures */
    ok = ok && fa_mpi_plan_cost(pl, (fa_pass)7, &c) == FA_ERR_INVALID && strstr(fa_last_error(), "pass 7") &&
         fa_mpi_predict(pl, (fa_pass)7, rate, 1e9, &pr) == FA_ERR_INVALID && fa_mpi_local_rows(pl, 7) == -1 &&
         fa_mpi_global_row(pl, 2, 0) == -1 && fa_mpi_layout_row((fa_mpi_layout)5, np, 3, 1024, 0) == -1 &&
         fa_mpi_local_rows(pl, 1) == L;
    char msg[200];
    snprintf(msg, sizeof msg, "(ring P=8 hides from %.3g GB/s at 1 TFLOP/s)", edge / 1e9);
    report("model", "per-rank plan and predicted time match hand-computed figures", ok, msg);
    fa_mpi_plan_destroy(pl);
    fa_mpi_plan_destroy(ul);
}

/* How the failure cases end: every rank's status, and the slowest rank's seconds. */
static void expect_all_fail(const char *what, fa_status st, double t0, const char *must_say) {
    double dt = fa_mpi_now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int ok = st != FA_OK && (!must_say || strstr(fa_last_error(), must_say));
    char msg[400];
    snprintf(msg, sizeof msg, "(%.2f s; rank %d: %s: %.200s)", dt, R, fa_status_string(st), fa_last_error());
    report("errors", what, ok && dt < 5.0, msg);
}

static void run_failures(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 4, p.heads_kv = 2, p.seq_q = p.seq_k = 48, p.head_dim = 16;
    p.causal = 1;
    fa_options opt = {FA_BACKEND_CPU, 1, 0, 0};
    int64_t n = p.heads_q * p.seq_q * p.head_dim;
    float *q = tu_alloc(4 * (size_t)n), *k = tu_alloc(4 * (size_t)n), *v = tu_alloc(4 * (size_t)n);
    float *o = tu_alloc(4 * (size_t)n), *lse = tu_alloc(4 * (size_t)n);
    uint64_t s = 7;
    tu_fill(&s, FA_F32, q, n, 1), tu_fill(&s, FA_F32, k, n, 1), tu_fill(&s, FA_F32, v, n, 1);
    tu_fill(&s, FA_F32, o, n, 1), tu_fill(&s, FA_F32, lse, n, 1);
    fa_mpi_plan *pl = NULL;
    fa_mpi_forward_args a = {q, k, v, o, lse, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    double t0;
    fa_status st;
    if (P > 1) { /* the last rank has another problem (not causal) */
        fa_problem other = p;
        other.causal = R == P - 1 ? 0 : 1;
        fa_mpi_plan_create(&other, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
        t0 = fa_mpi_now();
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail("ranks disagreeing on the problem", st, t0, "disagree");
        fa_mpi_plan_destroy(pl);
    }
    if (P > 1) { /* the last rank runs the backward while the others run the forward (it hung) */
        fa_mpi_plan_create(&p, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
        float *gq = tu_alloc(4 * (size_t)n), *gk = tu_alloc(4 * (size_t)n), *gv = tu_alloc(4 * (size_t)n);
        fa_mpi_backward_args b = {q, k, v, o, o, lse, gq, gk, gv, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        t0 = fa_mpi_now();
        st = R == P - 1 ? fa_mpi_backward(MPI_COMM_WORLD, pl, &b) : fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail("ranks in different passes", st, t0, "disagree");
        fa_mpi_plan_destroy(pl);
        free(gq), free(gk), free(gv);
        /* the last rank passes other sinks (each rank's rows would use its own, silently) */
        fa_problem ps = p;
        ps.has_sinks = 1;
        fa_mpi_plan_create(&ps, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
        float sinks[4] = {0.5f, -1.0f, 2.0f, R == P - 1 ? 0.25f : 0.0f};
        fa_mpi_forward_args as = a;
        as.sinks = sinks;
        t0 = fa_mpi_now();
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &as);
        expect_all_fail("a rank with other sinks", st, t0, "disagree");
        fa_mpi_plan_destroy(pl);
    }
    fa_mpi_plan_create(&p, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
    t0 = fa_mpi_now(); /* every rank: a null communicator is an error, not MPI's abort */
    st = fa_mpi_forward(MPI_COMM_NULL, pl, &a);
    expect_all_fail("MPI_COMM_NULL", st, t0, "MPI_COMM_NULL");
    fa_mpi_plan_destroy(pl);
    if (P > 1) { /* the last rank holds a plan made for one rank more (60 rows: P up to 5) */
        fa_problem p60 = p;
        p60.seq_q = p60.seq_k = 60;
        fa_mpi_plan_create(&p60, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, R == P - 1 ? P + 1 : P, R, &pl);
        t0 = fa_mpi_now();
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail("a rank whose plan is for another P", st, t0, R == P - 1 ? "communicator has" : NULL);
        fa_mpi_plan_destroy(pl);
    }
    if (P > 1) { /* the last rank has no plan (its plan_create failed: a zero head dim there) */
        fa_problem mine = p;
        if (R == P - 1) mine.head_dim = 0;
        pl = NULL;
        fa_mpi_plan_create(&mine, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
        t0 = fa_mpi_now();
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail("a rank with a NULL plan (forward)", st, t0, R == P - 1 ? "plan is NULL" : "failed");
        fa_mpi_backward_args nb = {q, k, v, o, o, lse, o, o, o, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        t0 = fa_mpi_now();
        st = fa_mpi_backward(MPI_COMM_WORLD, pl, &nb);
        expect_all_fail("a rank with a NULL plan (backward)", st, t0, R == P - 1 ? "plan is NULL" : "failed");
        fa_mpi_plan_destroy(pl);
    }
    fa_mpi_plan_create(&p, &opt, FA_MPI_RING, FA_MPI_ZIGZAG, P, R, &pl);
    fa_mpi_forward_args bad = a;
    if (R == P - 1) bad.q = NULL;
    t0 = fa_mpi_now();
    st = fa_mpi_forward(MPI_COMM_WORLD, pl, &bad);
    expect_all_fail("a rank with a NULL q", st, t0, R == P - 1 ? "q is NULL" : "failed");
    fa_mpi_test_fail_alloc_rank = P - 1;
    t0 = fa_mpi_now();
    st = fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
    expect_all_fail("a rank whose allocation fails (ring)", st, t0, NULL);
    fa_mpi_plan_destroy(pl);
    fa_mpi_plan_create(&p, &opt, FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, 1, 0, &pl);
    if (P <= 2) {
        fa_mpi_plan_destroy(pl);
        fa_mpi_plan_create(&p, &opt, FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, P, R, &pl);
        t0 = fa_mpi_now();
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail("a rank whose allocation fails (ulysses)", st, t0, NULL);
    }
    fa_mpi_test_fail_alloc_rank = -1;
    fa_mpi_plan_destroy(pl);
    /* a kernel failing in mid-call: the ranks keep passing messages, then all fail */
    float *g = tu_alloc(4 * (size_t)n * 3); /* dq, dk, dv */
    fa_mpi_test_fail_kernel_rank = P - 1;
    for (int m = 0; m < 2 && !(m && P > 2); m++) { /* Ulysses: Hk = 2 */
        fa_mpi_plan_create(&p, &opt, m ? FA_MPI_ULYSSES : FA_MPI_RING, FA_MPI_ZIGZAG, P, R, &pl);
        fa_mpi_backward_args b = {q, k, v, o, o, lse, g, g + n, g + 2 * n,
                                  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        t0 = fa_mpi_now();
        st = m ? fa_mpi_backward(MPI_COMM_WORLD, pl, &b) : fa_mpi_forward(MPI_COMM_WORLD, pl, &a);
        expect_all_fail(m ? "a kernel failing in mid-call (ulysses backward)" : "a kernel failing in mid-call (ring forward)",
                        st, t0, R == P - 1 ? "test hook" : "during the call");
        fa_mpi_plan_destroy(pl);
    }
    fa_mpi_test_fail_kernel_rank = -1;
    /* and the ring backward */
    fa_mpi_plan_create(&p, &opt, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, R, &pl);
    {
        fa_mpi_backward_args b = {q, k, v, o, o, lse, g, g + n, g + 2 * n,
                                  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        fa_mpi_test_fail_kernel_rank = P - 1;
        t0 = fa_mpi_now();
        st = fa_mpi_backward(MPI_COMM_WORLD, pl, &b);
        expect_all_fail("a kernel failing in mid-call (ring backward)", st, t0,
                        R == P - 1 ? "test hook" : "during the call");
        fa_mpi_test_fail_kernel_rank = -1;
    }
    free(g);
    fa_mpi_plan_destroy(pl);
    /* Ulysses with kv heads not divisible by P: a clear error from the plan, on every rank */
    if (P > 2) {
        pl = NULL;
        st = fa_mpi_plan_create(&p, &opt, FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, P, R, &pl);
        report("errors", "ulysses with Hk % P != 0 refused", st == FA_ERR_INVALID && !pl &&
               strstr(fa_last_error(), "divisible"), fa_last_error());
    }
    free(q), free(k), free(v), free(o), free(lse);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    uint64_t seed = tu_seed();
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (R == 0) printf("mpi_check: P=%d seed %llu (FA_TEST_SEED to repeat)\n", P, (unsigned long long)seed);
    const int64_t U = 12; /* kv heads divisible by 1..4 for Ulysses */
    const tcase cases[] = {
        {"ring contiguous, not causal, Sq != Sk", FA_MPI_RING, FA_MPI_CONTIGUOUS, 4, 2, 48, 72, 0, 0, 0, -1, -1, 0, 0, FA_F32, 0},
        {"ring contiguous, causal, Hk left 0", FA_MPI_RING, FA_MPI_CONTIGUOUS, 4, 0, 96, 96, 1, 0, 0, -1, -1, 0, 0, FA_F32, 0},
        {"ring zigzag, causal", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 4, 96, 96, 1, 0, 0, -1, -1, 0, 0, FA_F32, 0},
        {"ring zigzag, causal GQA, softcap, alibi", FA_MPI_RING, FA_MPI_ZIGZAG, 6, 2, 96, 96, 1, 1, 0, -1, -1, 20, 0, FA_F32, 0},
        {"ring contiguous, window (10, 5)", FA_MPI_RING, FA_MPI_CONTIGUOUS, 4, 2, 48, 48, 0, 0, 0, 10, 5, 0, 0, FA_F32, 0},
        {"ring zigzag, causal window (12, 0), segment ids", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 2, 48, 48, 1, 0, 1, 12, 0, 0, 0, FA_F32, 0},
        {"ring zigzag, causal top-left, Sq != Sk", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 2, 48, 72, 1, 0, 0, -1, -1, 0, 1, FA_F32, 0},
        {"ulysses contiguous, causal GQA, softcap", FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, 2 * U, U, 48, 48, 1, 0, 0, -1, -1, 30, 0, FA_F32, 0},
        {"ulysses zigzag, window (7, 3), alibi, segment ids", FA_MPI_ULYSSES, FA_MPI_ZIGZAG, U, U, 48, 72, 0, 1, 1, 7, 3, 0, 0, FA_F32, 0},
        {"ring zigzag, causal GQA, bf16", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 2, 48, 48, 1, 0, 0, -1, -1, 0, 0, FA_BF16, 0},
        {"ulysses contiguous, window (7, 3), f16", FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, U, U, 48, 48, 0, 0, 0, 7, 3, 0, 0, FA_F16, 0},
        {"ring zigzag, causal, BSHD strides", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 2, 48, 48, 1, 0, 0, -1, -1, 0, 0, FA_F32, 1},
        {"ulysses zigzag, causal, BSHD strides", FA_MPI_ULYSSES, FA_MPI_ZIGZAG, U, U, 48, 48, 1, 0, 0, -1, -1, 0, 0, FA_F32, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], seed + i);
    /* attention sinks: merged once across ranks (ring) or per head shard (Ulysses) */
    const tcase sink_cases[] = {
        {"sinks: ring zigzag, causal GQA, Sq != Sk", FA_MPI_RING, FA_MPI_ZIGZAG, 4, 2, 48, 72, 1, 0, 0, -1, -1, 0, 0, FA_F32, 0},
        {"sinks: ring contiguous, causal top-left, Sq > Sk, bf16", FA_MPI_RING, FA_MPI_CONTIGUOUS, 4, 2, 96, 48, 1, 0, 0, -1, -1, 0, 1, FA_BF16, 0},
        {"sinks: ulysses zigzag, causal GQA, softcap", FA_MPI_ULYSSES, FA_MPI_ZIGZAG, 2 * U, U, 48, 48, 1, 0, 0, -1, -1, 30, 0, FA_F32, 0},
    };
    SINKS = 1;
    for (size_t i = 0; i < sizeof sink_cases / sizeof sink_cases[0]; i++) run_case(&sink_cases[i], seed + 100 + i);
    SINKS = 0;
    check_model();
    run_failures();
    if (R == 0) printf("mpi_check P=%d: %d failed\n", P, failures);
    MPI_Finalize();
    return failures ? 1 : 0;
}
