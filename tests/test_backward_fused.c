/* Tests an internal on purpose (the plan's schedule choice, struct fa_plan).
 * The one-pass backward (src/cpu/backward_fused.c) against the two-pass one, on random
 * problems (dtypes, masks, block-sparse masks, softcap, bias with dbias, ALiBi, segment ids,
 * GQA, odd tiles):
 *   - the plan picks the schedule from the shapes: fused for >= 8 (batch, kv head) items,
 *     two passes below, whatever the thread count; FA_BWD_SCHEDULE forces either;
 *   - dq, dk, dv (and dbias) of the two schedules are bit-identical (same sums in the same
 *     order), and the fused ones are bit-identical across 1, 2 and 3 threads;
 *   - the fused backward's counts equal its plan's cost to the unit, and it runs in a
 *     caller's workspace of exactly the plan's workspace_bytes.
 * Correctness against the float64 reference: test_backward runs again with
 * FA_BWD_SCHEDULE=fused (ctest test_backward_one_pass). A fresh seed every run, printed;
 * FA_TEST_SEED=<seed> reproduces a run. */
#include "check.h"
#include "internal.h" /* tests an internal on purpose (first comment) */


static fa_plan *plan_with(const fa_problem *p, const char *schedule, int threads, int64_t bq, int64_t bk) {
    if (schedule) setenv("FA_BWD_SCHEDULE", schedule, 1);
    else unsetenv("FA_BWD_SCHEDULE");
    fa_options o = {0};
    o.backend = FA_BACKEND_CPU;
    o.threads = threads;
    o.block_q = bq, o.block_k = bk;
    fa_plan *pl = NULL;
    if (fa_plan_create(p, &o, &pl) != FA_OK) printf("fa_plan_create: %s\n", fa_last_error());
    unsetenv("FA_BWD_SCHEDULE");
    return pl;
}

/* The schedule follows the shapes, never the thread count. */
static void test_choice(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 8, p.heads_kv = 4, p.seq_q = p.seq_k = 64, p.head_dim = 32;
    for (int t = 1; t <= 4; t++) {
        fa_plan *pl = plan_with(&p, NULL, t, 0, 0);
        CHECK(pl && pl->bwd_fused == 1, "B=2 Hk=4 (8 items), %d threads: not fused", t);
        fa_plan_destroy(pl);
    }
    p.heads_kv = 2;
    for (int t = 1; t <= 4; t++) {
        fa_plan *pl = plan_with(&p, NULL, t, 0, 0);
        CHECK(pl && pl->bwd_fused == 0, "B=2 Hk=2 (4 items), %d threads: fused", t);
        fa_plan_destroy(pl);
    }
    fa_plan *two = plan_with(&p, "two-pass", 2, 32, 32), *one = plan_with(&p, "fused", 2, 32, 32);
    fa_cost c2, c1;
    fa_plan_cost(two, FA_BACKWARD, &c2);
    fa_plan_cost(one, FA_BACKWARD, &c1);
    /* 5 products of D = Dv = 32 against 8: 10 x 32 against 14 x 32 per element */
    CHECK(c1.flops * 14 == c2.flops * 10, "flops: fused %lld, two-pass %lld (want 10:14)", (long long)c1.flops,
          (long long)c2.flops);
    CHECK(c1.transcendentals * 2 == c2.transcendentals, "exps: fused %lld, two-pass %lld (want 1:2)",
          (long long)c1.transcendentals, (long long)c2.transcendentals);
    fa_plan_destroy(two);
    fa_plan_destroy(one);
    printf("%s schedule chosen from the shapes; fused cost 10:14 flops, 1:2 exps\n", failures ? "FAIL" : "PASS");
}

typedef struct {
    void *dq, *dk, *dv;
    float *dbias;
    fa_counts counts;
} grads;

/* A block-sparse mask (docs/masks.md) for p: chunked, documents (Sq == Sk) or a random
 * bitmap, at blocks of 1..24, shared by the batch and heads or not. Its pairs skip, run
 * unmasked or partial tiles; the fused walk zeroes and writes each query tile's dQ and each
 * key tile's dK, dV around exactly the pairs it runs, which the two-pass schedule does not. */
static fa_mask *random_mask(uint64_t *rng, const fa_problem *p) {
    fa_mask_shape s = {tu_int(rng, 0, 1) ? p->batch : 1, tu_int(rng, 0, 1) ? p->heads_q : 1, p->seq_q, p->seq_k,
                       tu_int(rng, 1, 24), tu_int(rng, 1, 24)};
    fa_mask *m = NULL;
    const int kind = (int)tu_int(rng, 0, 2);
    if (kind == 0) {
        CHECK(fa_mask_chunked(&s, p->seq_k - p->seq_q, tu_int(rng, 1, 40), &m) == FA_OK, "chunked: %s", fa_last_error());
    } else if (kind == 1 && p->seq_q == p->seq_k) {
        int64_t counts[2], lens[2 * 4], at = 0;
        for (int64_t b = 0; b < s.batch; b++) { /* up to 4 documents, the last one takes the rest */
            int64_t left = p->seq_q, c = 0;
            while (c < 3 && left > 1 && tu_int(rng, 0, 1)) {
                const int64_t len = tu_int(rng, 1, left - 1);
                lens[at++] = len, left -= len, c++;
            }
            lens[at++] = left, counts[b] = c + 1;
        }
        CHECK(fa_mask_documents(&s, counts, lens, &m) == FA_OK, "documents: %s", fa_last_error());
    } else {
        const int64_t n = s.batch * s.heads * s.seq_q * s.seq_k;
        uint8_t *att = tu_alloc((size_t)n);
        for (int64_t i = 0; i < n; i++) att[i] = tu_int(rng, 0, 3) != 0;
        for (int64_t i = 0; i < s.seq_q; i++) /* a few rows see no key, some key blocks none */
            if (tu_int(rng, 0, 5) == 0) memset(att + i * s.seq_k, 0, (size_t)s.seq_k);
        CHECK(fa_mask_from_dense(&s, att, &m) == FA_OK, "from_dense: %s", fa_last_error());
        free(att);
    }
    return m;
}

static void random_case(uint64_t *rng, int n) {
    static const int64_t heads[][2] = {{8, 8}, {8, 4}, {4, 1}, {3, 3}, {16, 8}};
    static const fa_dtype types[] = {FA_F32, FA_F16, FA_BF16};
    fa_problem p;
    fa_problem_init(&p);
    p.dtype = types[tu_int(rng, 0, 2)];
    const int hc = (int)tu_int(rng, 0, 4);
    p.batch = tu_int(rng, 1, 2);
    p.heads_q = heads[hc][0], p.heads_kv = heads[hc][1];
    p.seq_q = tu_int(rng, 1, 90), p.seq_k = tu_int(rng, 1, 90);
    p.head_dim = tu_int(rng, 1, 40), p.head_dim_v = tu_int(rng, 1, 40);
    p.causal = (int)tu_int(rng, 0, 1);
    if (tu_int(rng, 0, 2) == 0) p.window_left = tu_int(rng, -1, 30), p.window_right = tu_int(rng, -1, 30);
    if (tu_int(rng, 0, 2) == 0) p.softcap = 5.0f;
    p.has_alibi = tu_int(rng, 0, 3) == 0;
    p.has_bias = tu_int(rng, 0, 1) == 0;
    p.has_segment_ids = tu_int(rng, 0, 4) == 0;
    if (p.has_bias) {
        p.bias_batch = tu_int(rng, 0, 1) ? p.batch : 1;
        p.bias_heads = tu_int(rng, 0, 1) ? p.heads_q : 1;
        p.bias_grad = tu_int(rng, 0, 1);
        p.has_bias_scale = 1, p.bias_scale = 0.75f;
        if (tu_int(rng, 0, 2) == 0) p.bias_seq_q = 1; /* one row for every query row */
    }
    const int64_t bq = tu_int(rng, 0, 2) == 0 ? 0 : tu_int(rng, 1, 40);
    const int64_t bk = tu_int(rng, 0, 2) == 0 ? 0 : tu_int(rng, 1, 40);
    fa_mask *mask = tu_int(rng, 0, 1) ? random_mask(rng, &p) : NULL;
    p.mask = mask;
    fa_plan *two = plan_with(&p, "two-pass", 2, bq, bk);
    fa_mask_destroy(mask); /* the plans hold their references */
    if (!two) {
        failures++;
        return;
    }
    const fa_problem *rp = fa_plan_problem(two);
    const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = rp->head_dim_v;
    const int64_t nq = B * Hq * p.seq_q, nk = B * Hk * p.seq_k;
    const int64_t nb = p.bias_batch * p.bias_heads * (p.has_bias ? rp->bias_seq_q : p.seq_q) * p.seq_k;
    const size_t es = fa_dtype_size(p.dtype);
    void *q = tu_alloc((size_t)(nq * D) * es), *k = tu_alloc((size_t)(nk * D) * es);
    void *v = tu_alloc((size_t)(nk * Dv) * es), *o = tu_alloc((size_t)(nq * Dv) * es);
    void *g = tu_alloc((size_t)(nq * Dv) * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)nq), *bias = NULL, *slopes = NULL;
    int32_t *qs = NULL, *ks = NULL;
    tu_fill(rng, p.dtype, q, nq * D, 1.0);
    tu_fill(rng, p.dtype, k, nk * D, 1.0);
    tu_fill(rng, p.dtype, v, nk * Dv, 1.0);
    tu_fill(rng, p.dtype, g, nq * Dv, 1.0);
    if (p.has_bias) {
        bias = tu_alloc(sizeof(float) * (size_t)nb);
        for (int64_t i = 0; i < nb; i++) bias[i] = (float)tu_uniform(rng);
    }
    if (p.has_alibi) {
        slopes = tu_alloc(sizeof(float) * (size_t)Hq);
        for (int64_t h = 0; h < Hq; h++) slopes[h] = (float)(0.05 * (h + 1));
    }
    if (p.has_segment_ids) {
        qs = tu_alloc(sizeof(int32_t) * (size_t)(B * p.seq_q));
        ks = tu_alloc(sizeof(int32_t) * (size_t)(B * p.seq_k));
        for (int64_t i = 0; i < B * p.seq_q; i++) qs[i] = (int32_t)tu_int(rng, 0, 1);
        for (int64_t i = 0; i < B * p.seq_k; i++) ks[i] = (int32_t)tu_int(rng, 0, 1);
    }
    fa_forward_args fw;
    memset(&fw, 0, sizeof fw);
    fw.q = q, fw.k = k, fw.v = v, fw.o = o, fw.lse = lse, fw.bias = bias, fw.alibi_slopes = slopes;
    fw.q_segment_ids = qs, fw.kv_segment_ids = ks;
    CHECK(fa_forward(two, &fw) == FA_OK, "case %d: forward: %s", n, fa_last_error());

    /* run 0: two passes; runs 1-3: fused on 2, 1, 3 threads */
    static const int threads[4] = {2, 2, 1, 3};
    grads r[4];
    for (int run = 0; run < 4; run++) {
        fa_plan *pl = run == 0 ? two : plan_with(&p, "fused", threads[run], bq, bk);
        grads *x = &r[run];
        x->dq = tu_alloc((size_t)(nq * D) * es), x->dk = tu_alloc((size_t)(nk * D) * es);
        x->dv = tu_alloc((size_t)(nk * Dv) * es), x->dbias = p.bias_grad ? tu_alloc(sizeof(float) * (size_t)nb) : NULL;
        tu_poison(p.dtype, x->dq, nq * D);
        tu_poison(p.dtype, x->dk, nk * D);
        tu_poison(p.dtype, x->dv, nk * Dv);
        if (x->dbias) tu_poison(FA_F32, x->dbias, nb);
        if (!pl) {
            failures++;
            continue;
        }
        const int shared = p.bias_grad && ((p.bias_batch == 1 && B > 1) || (p.bias_heads == 1 && Hk > 1));
        if (run > 0) CHECK(pl->bwd_fused == !shared, "case %d: FA_BWD_SCHEDULE=fused gave bwd_fused %d", n, pl->bwd_fused);
        fa_cost c;
        fa_plan_cost(pl, FA_BACKWARD, &c);
        void *ws = tu_alloc((size_t)c.workspace_bytes); /* exactly the plan's figure */
        fa_backward_args a;
        memset(&a, 0, sizeof a);
        a.q = q, a.k = k, a.v = v, a.o = o, a.d_o = g, a.lse = lse, a.dq = x->dq, a.dk = x->dk, a.dv = x->dv;
        a.dbias = x->dbias, a.bias = bias, a.alibi_slopes = slopes, a.q_segment_ids = qs, a.kv_segment_ids = ks;
        a.workspace = ws, a.workspace_size = (size_t)c.workspace_bytes, a.counts = &x->counts;
        fa_status st = fa_backward(pl, &a);
        CHECK(st == FA_OK, "case %d run %d: backward: %s", n, run, fa_last_error());
        CHECK(x->counts.flops == c.flops && x->counts.transcendentals == c.transcendentals,
              "case %d run %d (fused %d): counted %lld flops %lld exps, plan %lld %lld", n, run, pl->bwd_fused,
              (long long)x->counts.flops, (long long)x->counts.transcendentals, (long long)c.flops,
              (long long)c.transcendentals);
        free(ws);
        if (pl != two) fa_plan_destroy(pl);
    }
    for (int run = 1; run < 4; run++) {
        const char *what = run == 1 ? "two-pass and fused" : "fused on 2 threads and on 1 or 3";
        const grads *x = &r[run], *y = &r[run == 1 ? 0 : 1];
        CHECK(memcmp(x->dq, y->dq, (size_t)(nq * D) * es) == 0, "case %d: dq differs between %s", n, what);
        CHECK(memcmp(x->dk, y->dk, (size_t)(nk * D) * es) == 0, "case %d: dk differs between %s", n, what);
        CHECK(memcmp(x->dv, y->dv, (size_t)(nk * Dv) * es) == 0, "case %d: dv differs between %s", n, what);
        if (p.bias_grad)
            CHECK(memcmp(x->dbias, y->dbias, sizeof(float) * (size_t)nb) == 0, "case %d: dbias differs between %s", n,
                  what);
    }
    for (int run = 0; run < 4; run++) {
        free(r[run].dq), free(r[run].dk), free(r[run].dv), free(r[run].dbias);
    }
    fa_plan_destroy(two);
    free(q), free(k), free(v), free(o), free(g), free(lse), free(bias), free(slopes), free(qs), free(ks);
}

int main(void) {
    uint64_t rng = check_seed("test_backward_fused");
    test_choice();
    const int before = failures, cases = 60;
    for (int n = 0; n < cases; n++) random_case(&rng, n);
    printf("%s %d random problems: fused == two-pass bit for bit, across 1-3 threads, counts == plan\n",
           failures > before ? "FAIL" : "PASS", cases);
    return check_finish("test_backward_fused");
}
