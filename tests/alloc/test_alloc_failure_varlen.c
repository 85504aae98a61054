/* Tests an internal on purpose: the allocation-failure hook (src/alloc.h).
 * Allocation failures of a packed variable-length plan (cu_seqlens), built with
 * FA_ALLOC_FAILURE_INJECTION under ASan with leak detection: for n = 1, 2, ... the n-th
 * allocation of fa_plan_create + fa_forward (the library allocating its own workspace), then
 * of fa_plan_create + fa_backward, fails. Each such call must return FA_ERR_NO_MEMORY with a
 * message; ASan's leak check at exit shows nothing was left allocated. The loop ends at the
 * first n past the last allocation: that run must succeed and match the float64 reference
 * (outputs poisoned with NaN first). The batch holds an empty query side, an empty key side
 * and Sq != Sk, so every branch of the varlen driver runs. Seeded (FA_TEST_SEED). */
#include "alloc.h"
#include "ref/ref.h"
#include "check.h"


#include "alloc_expect.h"

/* Sequences (Sq_b, Sk_b): (9, 14), (0, 6), (11, 0), (23, 23), (1, 30). */
static int32_t cu_q[6] = {0, 9, 9, 20, 43, 44}, cu_k[6] = {0, 14, 20, 20, 43, 73};

typedef struct {
    fa_problem p;
    float *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv, *slopes;
    int64_t nq, nk, nv, no, nl;
} vcase;

static fa_status run_pass(vcase *c, fa_plan *pl, fa_pass pass) {
    if (pass == FA_FORWARD) {
        tu_poison(FA_F32, c->o, c->no), tu_poison(FA_F32, c->lse, c->nl);
        fa_forward_args a = {0};
        a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse, a.alibi_slopes = c->slopes;
        return fa_forward(pl, &a);
    }
    tu_poison(FA_F32, c->dq, c->nq), tu_poison(FA_F32, c->dk, c->nk), tu_poison(FA_F32, c->dv, c->nv);
    fa_backward_args a = {0};
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse, a.d_o = c->d_o, a.alibi_slopes = c->slopes;
    a.dq = c->dq, a.dk = c->dk, a.dv = c->dv;
    return fa_backward(pl, &a);
}

/* max |got - want| / max(1, max |want|); NaN anywhere fails. */
static double err(const float *got, const double *want, int64_t n) {
    double e = 0, m = 1;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(want[i]) && got[i] == want[i]) continue; /* lse of a row without keys */
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > m) m = fabs(want[i]);
    }
    return e / m;
}

/* Fails allocation n = 1, 2, ... of plan + pass until a run allocates fewer than n times;
 * returns the number of allocations that complete run made (-1: it never completed). */
static int64_t every_failure(vcase *c, fa_pass pass) {
    const char *name = pass == FA_FORWARD ? "varlen forward" : "varlen backward";
    fa_options opt = {FA_BACKEND_CPU, 2, 16, 16};
    for (int64_t n = 1; n < 10000; n++) {
        fa_alloc_fail_at(n);
        fa_plan *pl = NULL;
        fa_status st = fa_plan_create(&c->p, &opt, &pl);
        if (expect_no_memory("fa_plan_create (varlen)", n, st, fa_alloc_count())) continue;
        if (st != FA_OK) break;
        st = run_pass(c, pl, pass);
        const int64_t used = fa_alloc_count();
        fa_alloc_fail_at(0);
        fa_plan_destroy(pl);
        const int failed = expect_no_memory(name, n, st, used);
        if (!failed && st == FA_OK && used < n) {
            printf("%s %s: each of its %lld allocations (plan included) failed in turn: FA_ERR_NO_MEMORY\n",
                   failures ? "FAIL" : "PASS", name, (long long)used);
            return used;
        }
        if (!failed) break; /* reported by expect_no_memory */
    }
    fa_alloc_fail_at(0);
    return -1;
}

int main(void) {
    uint64_t rng = check_seed("test_alloc_failure_varlen");
    vcase c;
    memset(&c, 0, sizeof c);
    fa_problem *p = &c.p;
    fa_problem_init(p);
    p->batch = 5, p->heads_q = 4, p->heads_kv = 2, p->head_dim = 16, p->head_dim_v = 8;
    p->seq_q = cu_q[5], p->seq_k = cu_k[5], p->cu_seqlens_q = cu_q, p->cu_seqlens_k = cu_k;
    p->causal = 1, p->has_alibi = 1, p->window_left = 17;
    c.nq = p->seq_q * p->heads_q * p->head_dim, c.nk = p->seq_k * p->heads_kv * p->head_dim;
    c.nv = p->seq_k * p->heads_kv * p->head_dim_v, c.no = p->seq_q * p->heads_q * p->head_dim_v;
    c.nl = p->seq_q * p->heads_q;
    float **bufs[] = {&c.q, &c.k, &c.v, &c.o, &c.lse, &c.d_o, &c.dq, &c.dk, &c.dv, &c.slopes};
    const int64_t sizes[] = {c.nq, c.nk, c.nv, c.no, c.nl, c.no, c.nq, c.nk, c.nv, p->heads_q};
    for (int i = 0; i < 10; i++) *bufs[i] = tu_alloc(sizeof(float) * (size_t)sizes[i]);
    tu_fill(&rng, FA_F32, c.q, c.nq, 2.0), tu_fill(&rng, FA_F32, c.k, c.nk, 2.0);
    tu_fill(&rng, FA_F32, c.v, c.nv, 1.0), tu_fill(&rng, FA_F32, c.d_o, c.no, 1.0);
    for (int64_t h = 0; h < p->heads_q; h++) c.slopes[h] = (float)(0.1 * (h + 1) * tu_uniform(&rng));

    double *ro = tu_alloc(sizeof(double) * (size_t)c.no), *rl = tu_alloc(sizeof(double) * (size_t)c.nl);
    double *rq = tu_alloc(sizeof(double) * (size_t)c.nq), *rk = tu_alloc(sizeof(double) * (size_t)c.nk);
    double *rv = tu_alloc(sizeof(double) * (size_t)c.nv);
    fa_forward_args fa = {0};
    fa.q = c.q, fa.k = c.k, fa.v = c.v, fa.alibi_slopes = c.slopes;
    fa_ref_varlen_forward(p, &fa, ro, rl);
    fa_backward_args ba = {0};
    ba.q = c.q, ba.k = c.k, ba.v = c.v, ba.d_o = c.d_o, ba.alibi_slopes = c.slopes;
    fa_ref_varlen_backward(p, &ba, rq, rk, rv);

    const int64_t fwd = every_failure(&c, FA_FORWARD); /* leaves the complete run's o and lse */
    const double eo = err(c.o, ro, c.no), el = err(c.lse, rl, c.nl);
    CHECK(fwd > 0 && eo <= 2e-5 && el <= 2e-5, "the complete forward: o err %.3g, lse err %.3g (bound 2e-5)", eo, el);
    const int64_t bwd = every_failure(&c, FA_BACKWARD);
    const double eq = err(c.dq, rq, c.nq), ek = err(c.dk, rk, c.nk), ev = err(c.dv, rv, c.nv);
    CHECK(bwd > 0 && eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4,
          "the complete backward: dq %.3g dk %.3g dv %.3g (bound 1e-4)", eq, ek, ev);
    for (int i = 0; i < 10; i++) free(*bufs[i]);
    free(ro), free(rl), free(rq), free(rk), free(rv);
    return check_finish("test_alloc_failure_varlen");
}
