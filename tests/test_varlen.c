/* Packed variable-length batches (cu_seqlens) against the float64 reference: empty
 * sequences, length 1, Sq != Sk per sequence, every mask (causal, window, ALiBi, softcap),
 * GQA, f32 and bf16; forward and backward; counts == plan; bit-identical results for 1, 2
 * and 3 threads; bad lengths rejected naming the argument. FA_TEST_SEED reproduces a run. */
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

typedef struct {
    fa_problem p;
    int32_t cq[8], ck[8];
    void *q, *k, *v, *o, *g, *dq, *dk, *dv;
    float *lse, *slopes;
} vcase;

/* When set, (Sq_b, Sk_b) pairs of the next case. */
static const int64_t *fixed;

/* Sequence lengths: 0, 1 and random ones, Sq_b and Sk_b drawn apart. */
static void make_case(vcase *c, int64_t B, int64_t Hq, int64_t Hk, int64_t D, fa_dtype dt, int masks) {
    memset(c, 0, sizeof *c);
    fa_problem_init(&c->p);
    fa_problem *p = &c->p;
    c->cq[0] = c->ck[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t kind = tu_int(&rng, 0, 5);
        int64_t lq = kind == 0 ? 0 : kind == 1 ? 1 : tu_int(&rng, 1, 150);
        int64_t lk = kind == 2 ? 0 : kind == 3 ? 1 : tu_int(&rng, 1, 150);
        if (fixed) lq = fixed[2 * b], lk = fixed[2 * b + 1];
        c->cq[b + 1] = c->cq[b] + (int32_t)lq;
        c->ck[b + 1] = c->ck[b] + (int32_t)lk;
    }
    if (c->cq[B] == 0) c->cq[B] = c->cq[B - 1] + 3; /* the totals must be positive */
    if (c->ck[B] == 0) c->ck[B] = c->ck[B - 1] + 5;
    p->batch = B, p->heads_q = Hq, p->heads_kv = Hk, p->head_dim = D, p->head_dim_v = D, p->dtype = dt;
    p->seq_q = c->cq[B], p->seq_k = c->ck[B];
    p->cu_seqlens_q = c->cq, p->cu_seqlens_k = c->ck;
    p->causal = masks & 1;
    if (masks & 2) p->window_left = tu_int(&rng, 0, 40), p->window_right = tu_int(&rng, 0, 20);
    if (masks & 4) p->has_alibi = 1;
    if (masks & 8) p->softcap = 5.0f;
    const int64_t nq = p->seq_q * Hq * D, nk = p->seq_k * Hk * D;
    const size_t es = fa_dtype_size(dt);
    c->q = tu_alloc(nq * es), c->k = tu_alloc(nk * es), c->v = tu_alloc(nk * es), c->o = tu_alloc(nq * es);
    c->g = tu_alloc(nq * es), c->dq = tu_alloc(nq * es), c->dk = tu_alloc(nk * es), c->dv = tu_alloc(nk * es);
    c->lse = tu_alloc(sizeof(float) * (size_t)(p->seq_q * Hq));
    c->slopes = tu_alloc(sizeof(float) * (size_t)Hq);
    tu_fill(&rng, dt, c->q, nq, 2.0), tu_fill(&rng, dt, c->k, nk, 2.0), tu_fill(&rng, dt, c->v, nk, 1.0);
    tu_fill(&rng, dt, c->g, nq, 1.0);
    for (int64_t h = 0; h < Hq; h++) c->slopes[h] = (float)(0.05 * (h + 1));
}

static void free_case(vcase *c) {
    void *x[] = {c->q, c->k, c->v, c->o, c->g, c->dq, c->dk, c->dv, c->lse, c->slopes};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static fa_forward_args fwd_args(vcase *c, fa_counts *cnt) {
    fa_forward_args a = {0};
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse, a.counts = cnt;
    a.alibi_slopes = c->p.has_alibi ? c->slopes : NULL; /* (the library refuses slopes without has_alibi) */
    return a;
}

/* max |got - want| / max |want| over n packed elements; NaN anywhere fails. */
/* A packed [total, H, W] tensor against the reference under check.h's rule (printed as
 * [0, token, head, column]). */
static check_result packed_check(const char *name, fa_dtype t, const void *got, const double *ref, int64_t total,
                                 int64_t H, int64_t W, check_tol tol, int unit_scale) {
    const int64_t dims[4] = {1, total, H, W};
    return check_tensor(name, t, got, &(fa_strides){{0, 0, 0, 0}}, ref, dims, tol, NULL, unit_scale);
}

static void run_case(const char *label, vcase *c) {
    fa_problem *p = &c->p;
    const int64_t nq = p->seq_q * p->heads_q * p->head_dim, nk = p->seq_k * p->heads_kv * p->head_dim;
    const size_t es = fa_dtype_size(p->dtype);
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)(p->seq_q * p->heads_q));
    fa_counts cnt = {0};
    fa_forward_args a = fwd_args(c, &cnt);
    fa_ref_varlen_forward(p, &a, ro, rl);
    void *first_o = tu_alloc(nq * es), *first_dq = tu_alloc(nq * es), *first_dk = tu_alloc(nk * es);
    for (int threads = 1; threads <= 3; threads++) {
        fa_plan *pl = check_plan(p, threads, 0, 0);
        if (!pl) break;
        fa_cost fc, bc;
        fa_plan_cost(pl, FA_FORWARD, &fc), fa_plan_cost(pl, FA_BACKWARD, &bc);
        tu_poison(p->dtype, c->o, nq);
        for (int64_t i = 0; i < p->seq_q * p->heads_q; i++) c->lse[i] = NAN;
        fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_OK, "%s: forward: %s", label, fa_last_error());
        CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals,
              "%s: forward counts %lld/%lld, plan %lld/%lld", label, (long long)cnt.flops,
              (long long)cnt.transcendentals, (long long)fc.flops, (long long)fc.transcendentals);
        double max_lse = 0;
        for (int64_t i = 0; i < p->seq_q * p->heads_q; i++)
            if (isfinite(rl[i]) && fabs(rl[i]) > max_lse) max_lse = fabs(rl[i]);
        const int before = failures;
        const check_tol tol = check_tol_scores(p->dtype, max_lse);
        const check_result eo = packed_check("o", p->dtype, c->o, ro, p->seq_q, p->heads_q, p->head_dim, tol, 0);
        packed_check("lse", FA_F32, c->lse, rl, p->seq_q, p->heads_q, 1, CHECK_TOL_LSE, 1);
        if (failures > before)
            printf("  in %s threads %d: o err %.3g of max|ref| %.3g (bound %.3g)\n", label, threads, eo.err, eo.mag,
                   tol.atol);
        if (threads == 1) memcpy(first_o, c->o, nq * es);
        else CHECK(!memcmp(first_o, c->o, nq * es), "%s: o differs between 1 and %d threads", label, threads);
        if (threads == 2) { /* the plan's workspace bounds what the call writes, measured; same o in it */
            check_pass_workspace(label, pl, &a, NULL);
            CHECK(!memcmp(first_o, c->o, nq * es), "%s: o differs in the caller's workspace", label);
        }

        /* backward (f32: the saved o is accurate enough to compare with the reference directly) */
        if (p->dtype == FA_F32) {
            fa_backward_args g = {0};
            fa_counts bcnt = {0};
            g.q = c->q, g.k = c->k, g.v = c->v, g.o = c->o, g.d_o = c->g, g.lse = c->lse;
            g.alibi_slopes = c->p.has_alibi ? c->slopes : NULL;
            g.dq = c->dq, g.dk = c->dk, g.dv = c->dv, g.counts = &bcnt;
            tu_poison(p->dtype, c->dq, nq), tu_poison(p->dtype, c->dk, nk), tu_poison(p->dtype, c->dv, nk);
            st = fa_backward(pl, &g);
            CHECK(st == FA_OK, "%s: backward: %s", label, fa_last_error());
            CHECK(bcnt.flops == bc.flops && bcnt.transcendentals == bc.transcendentals,
                  "%s: backward counts %lld/%lld, plan %lld/%lld", label, (long long)bcnt.flops,
                  (long long)bcnt.transcendentals, (long long)bc.flops, (long long)bc.transcendentals);
            double *rq = tu_alloc(sizeof(double) * (size_t)nq), *rk = tu_alloc(sizeof(double) * (size_t)nk);
            double *rv = tu_alloc(sizeof(double) * (size_t)nk);
            fa_ref_varlen_backward(p, &g, rq, rk, rv);
            const int64_t D = p->head_dim;
            const int gbefore = failures;
            packed_check("dq", p->dtype, c->dq, rq, p->seq_q, p->heads_q, D, check_tol_grad(p->dtype), 0);
            packed_check("dk", p->dtype, c->dk, rk, p->seq_k, p->heads_kv, D, check_tol_grad(p->dtype), 0);
            packed_check("dv", p->dtype, c->dv, rv, p->seq_k, p->heads_kv, D, check_tol_grad(p->dtype), 0);
            if (failures > gbefore) printf("  in %s threads %d: gradients\n", label, threads);
            if (threads == 1) memcpy(first_dq, c->dq, nq * es), memcpy(first_dk, c->dk, nk * es);
            else CHECK(!memcmp(first_dq, c->dq, nq * es) && !memcmp(first_dk, c->dk, nk * es),
                       "%s: gradients differ between 1 and %d threads", label, threads);
            free(rq), free(rk), free(rv);
        }
        fa_plan_destroy(pl);
    }
    free(ro), free(rl), free(first_o), free(first_dq), free(first_dk);
}

static void expect_invalid(const char *label, const fa_problem *p, const char *needle) {
    fa_plan *pl = NULL;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU;
    const fa_status st = fa_plan_create(p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), needle), "%s: got %s (%s), want FA_ERR_INVALID naming %s",
          label, fa_status_string(st), fa_last_error(), needle);
    fa_plan_destroy(pl);
}

/* Plan figures against hand counts: useful flops 2 (D + Dv) Sq_b Sk_b per head without
 * masks, (Sq_b (Sq_b + 1) / 2 when Sq_b = Sk_b) causal; no naive score beyond the packed one. */
static void hand_counts(void) {
    int32_t cq[4] = {0, 7, 7, 40}, ck[4] = {0, 7, 19, 52};
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 3, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 16, p.head_dim_v = 8, p.seq_q = 40, p.seq_k = 52;
    p.cu_seqlens_q = cq, p.cu_seqlens_k = ck;
    for (int causal = 0; causal <= 1; causal++) {
        p.causal = causal;
        fa_plan *pl = check_plan(&p, 2, 0, 0);
        if (!pl) return;
        fa_cost c;
        fa_plan_cost(pl, FA_FORWARD, &c);
        /* sequences (7, 7), (0, 12), (33, 33) */
        const int64_t pairs = causal ? 7 * 8 / 2 + 33 * 34 / 2 : 7 * 7 + 33 * 33;
        CHECK(c.flops_useful == 4 * pairs * 2 * (16 + 8), "hand counts: flops_useful %lld, want %lld",
              (long long)c.flops_useful, (long long)(4 * pairs * 2 * 24));
        const int64_t in = (40 * 4 * 16 + 52 * 2 * (16 + 8)) * 4 + 2 * 4 * 4, out = 40 * 4 * 8 * 4 + 40 * 4 * 4;
        /* min_bytes: the inputs the outputs need (the empty sequence's 12 keys are read by nobody) */
        const int64_t needed = (40 * 4 * 16 + 40 * 2 * (16 + 8)) * 4;
        CHECK(c.min_bytes == needed + out, "hand counts: min_bytes %lld, want %lld", (long long)c.min_bytes,
              (long long)(needed + out));
        CHECK(c.naive_peak_bytes == in + out + 4LL * 40 * 52 * 4 && c.peak_bytes == in + out + c.workspace_bytes,
              "hand counts: peak %lld, naive %lld", (long long)c.peak_bytes, (long long)c.naive_peak_bytes);
        fa_plan_destroy(pl);
    }
}

static void bad_inputs(void) {
    vcase c;
    make_case(&c, 3, 2, 1, 16, FA_F32, 0);
    fa_problem p = c.p;
    int32_t bad[4] = {0, 5, 3, (int32_t)p.seq_q};
    p.cu_seqlens_q = bad;
    expect_invalid("decreasing cu_seqlens_q", &p, "cu_seqlens_q");
    int32_t past[4] = {0, c.ck[1], c.ck[2], (int32_t)p.seq_k + 4};
    p = c.p, p.cu_seqlens_k = past;
    expect_invalid("cu_seqlens_k past the tensor", &p, "cu_seqlens_k");
    int32_t start[4] = {1, c.cq[1] + 1, c.cq[2] + 1, c.cq[3]};
    p = c.p, p.cu_seqlens_q = start;
    expect_invalid("cu_seqlens_q not starting at 0", &p, "cu_seqlens_q");
    p = c.p, p.has_new_kv = 1;
    expect_invalid("has_new_kv with cu_seqlens", &p, "has_new_kv");
    free_case(&c);
}

int main(void) {
    rng = check_seed("test_varlen");
    const int mask_sets[] = {0, 1, 2, 3, 4, 5, 8, 9, 15};
    int n = 0;
    for (size_t m = 0; m < sizeof mask_sets / sizeof mask_sets[0]; m++)
        for (int dti = 0; dti < 2; dti++) {
            vcase c;
            const int64_t Hk = tu_int(&rng, 1, 2), Hq = Hk * tu_int(&rng, 1, 3);
            make_case(&c, tu_int(&rng, 1, 6), Hq, Hk, (tu_int(&rng, 0, 1) ? 64 : 40), dti ? FA_BF16 : FA_F32, mask_sets[m]);
            char label[160];
            snprintf(label, sizeof label, "varlen #%d B=%lld Hq=%lld Hk=%lld D=%lld %s masks=%d", n++,
                     (long long)c.p.batch, (long long)Hq, (long long)Hk, (long long)c.p.head_dim,
                     fa_dtype_name(c.p.dtype), mask_sets[m]);
            run_case(label, &c);
            free_case(&c);
        }
    /* every run: sequences (0, 3), (1, 0), (37, 1), (5, 70), (64, 64), (1, 1) under each mask set */
    static const int64_t pairs[] = {0, 3, 1, 0, 37, 1, 5, 70, 64, 64, 1, 1};
    fixed = pairs;
    for (size_t m = 0; m < sizeof mask_sets / sizeof mask_sets[0]; m++) {
        vcase c;
        make_case(&c, 6, 4, 2, 32, FA_F32, mask_sets[m]);
        char label[96];
        snprintf(label, sizeof label, "varlen fixed lengths, masks=%d", mask_sets[m]);
        run_case(label, &c);
        free_case(&c);
        n++;
    }
    fixed = NULL;
    hand_counts();
    bad_inputs();
    printf("%d cases run\n", n);
    return check_finish("test_varlen");
}
