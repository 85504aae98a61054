/* Attention sinks (docs/semantics.md, "Attention sinks") against the float64 reference:
 * the forward (o, lse) and the backward (dq, dk, dv, dsink) on random inputs with GQA,
 * causal masks, Sq != Sk, windows, softcap and rows that see no key (o = 0, lse = sink);
 * the reference's own dsink and gradients against finite differences of its forward;
 * packed batches (varlen) and kv-cache decoding with several split-KV chunks; counts ==
 * plan to the unit; bit-identical results for 1, 2 and 3 threads; the argument checks.
 * FA_TEST_SEED reproduces a run. */
#include "ref/ref.h"
#include "check.h"

#include <string.h>

static uint64_t rng;

/* Sink logits of Hq heads: mostly near the scores' range, one far above it (the sink then
 * dominates its rows) and one far below (it barely counts). */
static float *make_sinks(int64_t Hq) {
    float *s = tu_alloc(sizeof(float) * (size_t)Hq);
    for (int64_t h = 0; h < Hq; h++) s[h] = (float)(3.0 * tu_uniform(&rng));
    s[0] = 9.0f;
    if (Hq > 1) s[Hq - 1] = -12.0f;
    return s;
}

static void check_counts(const char *label, const fa_plan *pl, fa_pass pass, const fa_counts *c) {
    fa_cost cost;
    fa_plan_cost(pl, pass, &cost);
    CHECK(c->flops == cost.flops && c->transcendentals == cost.transcendentals,
          "%s %s: counted flops %lld trans %lld, planned %lld %lld", label, pass ? "backward" : "forward",
          (long long)c->flops, (long long)c->transcendentals, (long long)cost.flops, (long long)cost.transcendentals);
}

/* The allowance of dsink_h: 1e-4 of the sum of its terms' magnitudes |exp(sink - lse) delta|
 * (lse good to ~1e-5 relative, delta an f32 sum), since the terms' signs differ. */
static double *dsink_allowance(const fa_problem *p, const float *sinks, const double *lse, const void *o,
                               const void *g, int packed) {
    const int64_t B = packed ? 1 : p->batch, Hq = p->heads_q, Sq = p->seq_q, Dv = p->head_dim_v;
    double *allow = tu_alloc(sizeof(double) * (size_t)Hq);
    for (int64_t h = 0; h < Hq; h++) {
        allow[h] = 0.0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Sq; i++) {
                double delta = 0.0;
                for (int64_t c = 0; c < Dv; c++) {
                    const int64_t at = packed ? (i * Hq + h) * Dv + c : ((b * Hq + h) * Sq + i) * Dv + c;
                    delta += (double)chk_load(p->dtype, o, at) * chk_load(p->dtype, g, at);
                }
                allow[h] += fabs(exp((double)sinks[h] - lse[(b * Hq + h) * Sq + i]) * delta);
            }
        allow[h] *= 1e-4;
    }
    return allow;
}

/* ---- dense problems ----------------------------------------------------------------- */

typedef struct {
    int64_t B, Hq, Hk, Sq, Sk, D;
    fa_dtype dt;
    int causal;
    int64_t window; /* left window, -1: none */
    float softcap;
} dense_cfg;

typedef struct {
    void *o, *dq, *dk, *dv;
    float *lse, *dsink;
} dense_out;

static void dense_run(const fa_problem *p, int threads, const void *q, const void *k, const void *v, const void *g,
                      const float *sinks, dense_out *r, const char *label) {
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t nq = p->batch * p->heads_q * p->seq_q * p->head_dim;
    const int64_t nk = p->batch * p->heads_kv * p->seq_k * p->head_dim;
    r->o = tu_alloc(nq * es), r->dq = tu_alloc(nq * es), r->dk = tu_alloc(nk * es), r->dv = tu_alloc(nk * es);
    r->lse = tu_alloc(sizeof(float) * (size_t)(p->batch * p->heads_q * p->seq_q));
    r->dsink = tu_alloc(sizeof(float) * (size_t)p->heads_q);
    tu_poison(p->dtype, r->o, nq), tu_poison(p->dtype, r->dq, nq);
    tu_poison(p->dtype, r->dk, nk), tu_poison(p->dtype, r->dv, nk);
    tu_poison(FA_F32, r->lse, p->batch * p->heads_q * p->seq_q), tu_poison(FA_F32, r->dsink, p->heads_q);
    fa_plan *pl = check_plan(p, threads, 0, 0);
    if (!pl) return;
    fa_counts cf = {0}, cb = {0};
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = r->o, a.lse = r->lse, a.sinks = sinks, a.counts = &cf;
    fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    fa_backward_args b = {0};
    b.q = q, b.k = k, b.v = v, b.o = r->o, b.d_o = g, b.lse = r->lse, b.dq = r->dq, b.dk = r->dk, b.dv = r->dv;
    b.sinks = sinks, b.dsink = r->dsink, b.counts = &cb;
    st = fa_backward(pl, &b);
    CHECK(st == FA_OK, "%s: fa_backward: %s", label, fa_last_error());
    check_counts(label, pl, FA_FORWARD, &cf);
    check_counts(label, pl, FA_BACKWARD, &cb);
    fa_plan_destroy(pl);
}

static void dense_free(dense_out *r) {
    free(r->o), free(r->dq), free(r->dk), free(r->dv), free(r->lse), free(r->dsink);
}

static int same_bits(const void *x, const void *y, size_t n) { return memcmp(x, y, n) == 0; }

static void dense_case(const dense_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "dense %s B%lld Hq%lld Hk%lld Sq%lld Sk%lld D%lld causal %d window %lld cap %g",
             fa_dtype_name(c->dt), (long long)c->B, (long long)c->Hq, (long long)c->Hk, (long long)c->Sq,
             (long long)c->Sk, (long long)c->D, c->causal, (long long)c->window, (double)c->softcap);
    fa_problem p;
    fa_problem_init(&p);
    p.batch = c->B, p.heads_q = c->Hq, p.heads_kv = c->Hk, p.seq_q = c->Sq, p.seq_k = c->Sk;
    p.head_dim = p.head_dim_v = c->D, p.dtype = c->dt, p.causal = c->causal, p.window_left = c->window;
    p.softcap = c->softcap, p.has_sinks = 1;
    const size_t es = fa_dtype_size(c->dt);
    const int64_t nq = c->B * c->Hq * c->Sq * c->D, nk = c->B * c->Hk * c->Sk * c->D;
    void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *v = tu_alloc(nk * es), *g = tu_alloc(nq * es);
    tu_fill(&rng, c->dt, q, nq, 2.0), tu_fill(&rng, c->dt, k, nk, 2.0), tu_fill(&rng, c->dt, v, nk, 1.0);
    tu_fill(&rng, c->dt, g, nq, 1.0);
    float *sinks = make_sinks(c->Hq);

    dense_out r[3];
    for (int t = 0; t < 3; t++) dense_run(&p, t + 1, q, k, v, g, sinks, &r[t], label);

    const int64_t rows = c->B * c->Hq * c->Sq;
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)rows);
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.sinks = sinks;
    fa_ref_forward(&p, &fa, ro, rl);
    double max_lse = 0.0;
    for (int64_t i = 0; i < rows; i++) max_lse = fabs(rl[i]) > max_lse ? fabs(rl[i]) : max_lse;
    const fa_strides dense = {{0, 0, 0, 0}};
    const int64_t od[4] = {c->B, c->Hq, c->Sq, c->D}, ld[4] = {1, 1, 1, rows};
    check_tensor("o", c->dt, r[1].o, &dense, ro, od, check_tol_scores(c->dt, max_lse), NULL, 0);
    check_tensor("lse", FA_F32, r[1].lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
    int64_t empty = 0; /* rows without a visible key: o = 0 and lse = sink_h, exactly */
    for (int64_t i = 0; i < rows; i++) {
        const int64_t h = i / c->Sq % c->Hq;
        int zero = 1;
        for (int64_t d = 0; d < c->D; d++) zero &= ro[i * c->D + d] == 0.0;
        if (!zero || rl[i] != (double)sinks[h]) continue;
        empty++;
        CHECK(r[1].lse[i] == sinks[h], "%s: row %lld sees no key: lse %g, want the sink %g", label, (long long)i,
              (double)r[1].lse[i], (double)sinks[h]);
        for (int64_t d = 0; d < c->D; d++)
            CHECK(chk_load(c->dt, r[1].o, i * c->D + d) == 0.0f, "%s: row %lld sees no key: o != 0", label,
                  (long long)i);
    }
    if (c->causal && c->Sq > c->Sk) CHECK(empty > 0, "%s: expected rows without a visible key", label);

    const int64_t kd[4] = {c->B, c->Hk, c->Sk, c->D}, sd[4] = {1, 1, 1, c->Hq};
    double *rdq = tu_alloc(sizeof(double) * (size_t)nq), *rdk = tu_alloc(sizeof(double) * (size_t)nk);
    double *rdv = tu_alloc(sizeof(double) * (size_t)nk), *rds = tu_alloc(sizeof(double) * (size_t)c->Hq);
    fa_backward_args ba = {0};
    ba.q = q, ba.k = k, ba.v = v, ba.o = r[1].o, ba.d_o = g, ba.sinks = sinks;
    fa_ref_backward_sinks(&p, &ba, 1, rdq, rdk, rdv, rds);
    const check_tol gt = check_tol_grad(c->dt);
    check_tensor("dq", c->dt, r[1].dq, &dense, rdq, od, gt, NULL, 0);
    check_tensor("dk", c->dt, r[1].dk, &dense, rdk, kd, gt, NULL, 0);
    check_tensor("dv", c->dt, r[1].dv, &dense, rdv, kd, gt, NULL, 0);
    double *allow = dsink_allowance(&p, sinks, rl, r[1].o, g, 0);
    const check_tol none = {0.0, 0.0};
    check_tensor("dsink", FA_F32, r[1].dsink, &dense, rds, sd, none, allow, 0);

    for (int t = 0; t < 3; t += 2) {
        CHECK(same_bits(r[t].o, r[1].o, nq * es) && same_bits(r[t].lse, r[1].lse, sizeof(float) * (size_t)rows),
              "%s: the forward with %d threads differs from 2 threads", label, t + 1);
        CHECK(same_bits(r[t].dq, r[1].dq, nq * es) && same_bits(r[t].dk, r[1].dk, nk * es) &&
                  same_bits(r[t].dv, r[1].dv, nk * es) &&
                  same_bits(r[t].dsink, r[1].dsink, sizeof(float) * (size_t)c->Hq),
              "%s: the backward with %d threads differs from 2 threads", label, t + 1);
    }
    for (int t = 0; t < 3; t++) dense_free(&r[t]);
    free(q), free(k), free(v), free(g), free(sinks), free(ro), free(rl), free(rdq), free(rdk), free(rdv), free(rds);
    free(allow);
}

/* ---- the reference's gradients against finite differences of its forward ------------ */

/* sum(o * g) of the reference forward, f32 inputs. */
static double ref_loss(const fa_problem *p, const float *q, const float *k, const float *v, const float *g,
                       const float *sinks, double *o) {
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.sinks = sinks;
    fa_ref_forward(p, &a, o, NULL);
    double L = 0.0;
    for (int64_t i = 0; i < p->batch * p->heads_q * p->seq_q * p->head_dim_v; i++) L += o[i] * (double)g[i];
    return L;
}

/* d loss / d x[at] by central differences; x[at] restored. */
static double central(const fa_problem *p, float *x, int64_t at, const float *q, const float *k, const float *v,
                      const float *g, const float *sinks, double *o) {
    const float x0 = x[at], up = x0 + 1e-3f, down = x0 - 1e-3f;
    x[at] = up;
    const double Lu = ref_loss(p, q, k, v, g, sinks, o);
    x[at] = down;
    const double Ld = ref_loss(p, q, k, v, g, sinks, o);
    x[at] = x0;
    return (Lu - Ld) / ((double)up - (double)down);
}

static void finite_differences(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 7, p.seq_k = 5, p.head_dim = p.head_dim_v = 8;
    p.dtype = FA_F32, p.causal = 1, p.has_sinks = 1; /* Sq > Sk: the first two rows see no key */
    const int64_t nq = 2 * 4 * 7 * 8, nk = 2 * 2 * 5 * 8;
    float *q = tu_alloc(4 * nq), *k = tu_alloc(4 * nk), *v = tu_alloc(4 * nk), *g = tu_alloc(4 * nq);
    tu_fill(&rng, FA_F32, q, nq, 1.5), tu_fill(&rng, FA_F32, k, nk, 1.5), tu_fill(&rng, FA_F32, v, nk, 1.0);
    tu_fill(&rng, FA_F32, g, nq, 1.0);
    float sinks[4] = {0.3f, -1.0f, 2.0f, 0.0f};
    double *o = tu_alloc(sizeof(double) * nq), *dq = tu_alloc(sizeof(double) * nq);
    double *dk = tu_alloc(sizeof(double) * nk), *dv = tu_alloc(sizeof(double) * nk), ds[4];
    fa_backward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.d_o = g, a.sinks = sinks;
    fa_ref_backward_sinks(&p, &a, 0, dq, dk, dv, ds);
    struct {
        const char *name;
        float *x;
        const double *grad;
        int64_t n;
    } t[] = {{"sinks", sinks, ds, 4}, {"q", q, dq, nq}, {"k", k, dk, nk}, {"v", v, dv, nk}};
    for (size_t w = 0; w < sizeof t / sizeof t[0]; w++)
        for (int e = 0; e < 6; e++) {
            const int64_t at = w == 0 ? e % 4 : tu_int(&rng, 0, t[w].n - 1);
            const double fd = central(&p, t[w].x, at, q, k, v, g, sinks, o);
            CHECK(fabs(fd - t[w].grad[at]) <= 1e-5 * (1.0 + fabs(fd)),
                  "reference d%s[%lld] = %.9g, finite differences %.9g", t[w].name, (long long)at, t[w].grad[at], fd);
        }
    free(q), free(k), free(v), free(g), free(o), free(dq), free(dk), free(dv);
}

/* ---- packed batches (varlen) --------------------------------------------------------- */

static void varlen_case(fa_dtype dt) {
    static const int32_t lq[] = {3, 0, 9, 6, 1}, lk[] = {0, 4, 12, 3, 7}; /* no keys; no queries; Sq > Sk */
    const int64_t B = 5, Hq = 4, Hk = 2, D = 16;
    int32_t cq[6] = {0}, ck[6] = {0};
    for (int b = 0; b < B; b++) cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.seq_q = cq[B], p.seq_k = ck[B], p.head_dim = p.head_dim_v = D;
    p.dtype = dt, p.causal = 1, p.cu_seqlens_q = cq, p.cu_seqlens_k = ck, p.has_sinks = 1;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = p.seq_q * Hq * D, nk = p.seq_k * Hk * D;
    void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *v = tu_alloc(nk * es), *g = tu_alloc(nq * es);
    void *o = tu_alloc(nq * es), *dq = tu_alloc(nq * es), *dk = tu_alloc(nk * es), *dv = tu_alloc(nk * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(p.seq_q * Hq)), *ds = tu_alloc(sizeof(float) * (size_t)Hq);
    tu_fill(&rng, dt, q, nq, 2.0), tu_fill(&rng, dt, k, nk, 2.0), tu_fill(&rng, dt, v, nk, 1.0);
    tu_fill(&rng, dt, g, nq, 1.0);
    tu_poison(dt, o, nq), tu_poison(FA_F32, lse, p.seq_q * Hq), tu_poison(FA_F32, ds, Hq);
    float *sinks = make_sinks(Hq);
    char label[64];
    snprintf(label, sizeof label, "varlen %s", fa_dtype_name(dt));

    fa_plan *pl = check_plan(&p, 2, 0, 0);
    if (!pl) return;
    fa_counts cf = {0}, cb = {0};
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.sinks = sinks, a.counts = &cf;
    CHECK(fa_forward(pl, &a) == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    fa_backward_args b = {0};
    b.q = q, b.k = k, b.v = v, b.o = o, b.d_o = g, b.lse = lse, b.dq = dq, b.dk = dk, b.dv = dv;
    b.sinks = sinks, b.dsink = ds, b.counts = &cb;
    CHECK(fa_backward(pl, &b) == FA_OK, "%s: fa_backward: %s", label, fa_last_error());
    check_counts(label, pl, FA_FORWARD, &cf);
    check_counts(label, pl, FA_BACKWARD, &cb);
    fa_plan_destroy(pl);

    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)(p.seq_q * Hq));
    double *rdq = tu_alloc(sizeof(double) * (size_t)nq), *rdk = tu_alloc(sizeof(double) * (size_t)nk);
    double *rdv = tu_alloc(sizeof(double) * (size_t)nk), *rds = tu_alloc(sizeof(double) * (size_t)Hq);
    fa_ref_varlen_forward(&p, &a, ro, rl);
    fa_ref_varlen_backward(&p, &b, rdq, rdk, rdv);
    /* dsink from its definition over the packed rows: -sum_t exp(sink_h - lse) (do . o) */
    for (int64_t h = 0; h < Hq; h++) {
        rds[h] = 0.0;
        for (int64_t t = 0; t < p.seq_q; t++) {
            double delta = 0.0;
            for (int64_t c = 0; c < D; c++)
                delta += (double)chk_load(dt, o, (t * Hq + h) * D + c) * chk_load(dt, g, (t * Hq + h) * D + c);
            rds[h] -= exp((double)sinks[h] - rl[h * p.seq_q + t]) * delta;
        }
    }
    const fa_strides packed = {{0, 0, 0, 0}};
    const int64_t od[4] = {1, p.seq_q, Hq, D}, kd[4] = {1, p.seq_k, Hk, D}, ld[4] = {1, 1, 1, p.seq_q * Hq};
    const int64_t sd[4] = {1, 1, 1, Hq};
    check_tensor("varlen o", dt, o, &packed, ro, od, check_tol_of(dt), NULL, 0);
    check_tensor("varlen lse", FA_F32, lse, &packed, rl, ld, CHECK_TOL_LSE, NULL, 1);
    for (int64_t h = 0; h < Hq; h++) /* sequence 0 sees no key: lse = sink */
        for (int64_t i = 0; i < lq[0]; i++)
            CHECK(lse[h * p.seq_q + i] == sinks[h], "%s: lse of a row without keys is %g, want the sink %g", label,
                  (double)lse[h * p.seq_q + i], (double)sinks[h]);
    check_tensor("varlen dq", dt, dq, &packed, rdq, od, check_tol_grad(dt), NULL, 0);
    check_tensor("varlen dk", dt, dk, &packed, rdk, kd, check_tol_grad(dt), NULL, 0);
    check_tensor("varlen dv", dt, dv, &packed, rdv, kd, check_tol_grad(dt), NULL, 0);
    fa_problem one = p; /* the allowance's rows: [1, Hq, total] like the varlen lse */
    one.batch = 1;
    double *allow = dsink_allowance(&one, sinks, rl, o, g, 1);
    const check_tol none = {0.0, 0.0};
    check_tensor("varlen dsink", FA_F32, ds, &packed, rds, sd, none, allow, 0);
    free(q), free(k), free(v), free(g), free(o), free(dq), free(dk), free(dv), free(lse), free(ds), free(sinks);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv), free(rds), free(allow);
}

/* ---- kv-cache decoding: split-KV chunks merged, the sink added once ------------------- */

static void decode_case(fa_dtype dt, int threads, void *o_out, float *lse_out) {
    static const int32_t lens[3] = {0, 700, 1300}; /* no keys; two chunks; three chunks */
    const int64_t B = 3, Hq = 4, Hk = 2, D = 32, Sq = 2, cap = 1400;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.seq_q = Sq, p.seq_k = cap, p.head_dim = p.head_dim_v = D;
    p.dtype = dt, p.causal = 1, p.cache_seqlens = lens, p.has_sinks = 1;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = B * Sq * Hq * D, nc = B * cap * Hk * D;
    uint64_t same = 12345; /* the same inputs for every thread count */
    void *q = tu_alloc(nq * es), *k = tu_alloc(nc * es), *v = tu_alloc(nc * es), *o = tu_alloc(nq * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq)), *sinks = tu_alloc(sizeof(float) * (size_t)Hq);
    tu_fill(&same, dt, q, nq, 2.0), tu_fill(&same, dt, k, nc, 2.0), tu_fill(&same, dt, v, nc, 1.0);
    for (int64_t h = 0; h < Hq; h++) sinks[h] = (float)(4.0 * tu_uniform(&same));
    tu_poison(dt, o, nq), tu_poison(FA_F32, lse, B * Hq * Sq);
    char label[64];
    snprintf(label, sizeof label, "decode %s, %d threads", fa_dtype_name(dt), threads);
    fa_plan *pl = check_plan(&p, threads, 0, 0);
    if (!pl) return;
    fa_counts cf = {0};
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.sinks = sinks, a.counts = &cf;
    CHECK(fa_forward(pl, &a) == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    check_counts(label, pl, FA_FORWARD, &cf);
    fa_plan_destroy(pl);
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq));
    fa_ref_decode(&p, &a, ro, rl);
    const fa_strides dense = {{0, 0, 0, 0}};
    const int64_t od[4] = {B, Sq, Hq, D}, ld[4] = {1, 1, 1, B * Hq * Sq};
    check_tensor("decode o", dt, o, &dense, ro, od, check_tol_of(dt), NULL, 0);
    check_tensor("decode lse", FA_F32, lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
    for (int64_t h = 0; h < Hq; h++) /* sequence 0's cache is empty: lse = sink */
        CHECK(lse[h * Sq] == sinks[h], "%s: lse of a row without keys is %g, want %g", label, (double)lse[h * Sq],
              (double)sinks[h]);
    memcpy(o_out, o, nq * es), memcpy(lse_out, lse, sizeof(float) * (size_t)(B * Hq * Sq));
    free(q), free(k), free(v), free(o), free(lse), free(sinks), free(ro), free(rl);
}

static void decode_cases(fa_dtype dt) {
    const size_t n = 3 * 2 * 4 * 32 * fa_dtype_size(dt);
    char *o1 = tu_alloc(n), *o3 = tu_alloc(n);
    float l1[24], l3[24];
    decode_case(dt, 1, o1, l1);
    decode_case(dt, 3, o3, l3);
    CHECK(memcmp(o1, o3, n) == 0 && memcmp(l1, l3, sizeof l1) == 0, "decode %s: 1 and 3 threads differ",
          fa_dtype_name(dt));
    free(o1), free(o3);
}

/* ---- the argument checks --------------------------------------------------------------- */

static void bad_args(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = p.heads_kv = 2, p.seq_q = p.seq_k = 4, p.head_dim = p.head_dim_v = 8;
    p.dtype = FA_F32, p.has_sinks = 1;
    float x[64] = {0}, lse[8], dx[64], dk[64], dv[64], ds[2], sinks[2] = {0.5f, NAN};
    fa_plan *pl = check_plan(&p, 1, 0, 0);
    if (!pl) return;
    fa_forward_args a = {0};
    a.q = a.k = a.v = x, a.o = dx, a.lse = lse;
    fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_ERR_NULL && strstr(fa_last_error(), "sinks"), "no sinks: %s (%s)", fa_status_string(st),
          fa_last_error());
    a.sinks = sinks;
    st = fa_forward(pl, &a);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "sinks[1]"), "a NaN sink: %s (%s)", fa_status_string(st),
          fa_last_error());
    sinks[1] = 1.0f;
    CHECK(fa_forward(pl, &a) == FA_OK, "finite sinks: %s", fa_last_error());
    fa_backward_args b = {0};
    b.q = b.k = b.v = b.o = b.d_o = x, b.lse = lse, b.dq = dx, b.dk = dk, b.dv = dv, b.sinks = sinks; /* outputs apart */
    st = fa_backward(pl, &b);
    CHECK(st == FA_ERR_NULL && strstr(fa_last_error(), "dsink"), "no dsink: %s (%s)", fa_status_string(st),
          fa_last_error());
    b.dsink = ds;
    CHECK(fa_backward(pl, &b) == FA_OK, "with dsink: %s", fa_last_error());
    fa_plan_destroy(pl);
}

int main(void) {
    rng = check_seed("test_sinks");
    static const dense_cfg cases[] = {
        {2, 4, 2, 37, 53, 32, FA_F32, 1, -1, 0.0f},  /* GQA, causal, Sq < Sk */
        {1, 4, 1, 70, 29, 64, FA_BF16, 1, -1, 0.0f}, /* MQA, Sq > Sk: rows without keys */
        {2, 2, 2, 45, 45, 16, FA_F16, 1, 9, 0.0f},   /* a window */
        {1, 6, 3, 33, 80, 40, FA_F32, 0, -1, 4.0f},  /* no mask, softcap */
        {2, 2, 1, 300, 20, 64, FA_BF16, 1, -1, 0.0f}, /* many rows without keys, several query tiles */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) dense_case(&cases[i]);
    finite_differences();
    varlen_case(FA_F32);
    varlen_case(FA_BF16);
    decode_cases(FA_F32);
    decode_cases(FA_BF16);
    bad_args();
    return check_finish("test_sinks");
}
