/* The backward's own counts against the plan: for random shapes, masks, block sizes,
 * softcap, GQA and dbias (broadcast too), the flops and transcendentals fa_backward counts while it runs equal
 * fa_plan_cost(FA_BACKWARD) to the unit (with segment ids the plan is an upper bound), and
 * workspace_bytes bounds the workspace the call writes, measured in a caller's buffer.
 * A fresh seed every run, printed; FA_TEST_SEED=<seed> reproduces a run. */
#include "check.h"

int main(void) {
    uint64_t rng = check_seed("test_counts_backward");
    static const int64_t heads[][2] = {{1, 1}, {2, 1}, {3, 3}, {4, 1}, {8, 2}};
    static const fa_dtype types[] = {FA_F32, FA_F16, FA_BF16};
    const int cases = 150;
    for (int n = 0; n < cases; n++) {
        fa_problem p;
        fa_problem_init(&p);
        p.dtype = types[tu_int(&rng, 0, 2)];
        const int hc = (int)tu_int(&rng, 0, 4);
        p.batch = tu_int(&rng, 1, 2);
        p.heads_q = heads[hc][0], p.heads_kv = heads[hc][1];
        p.seq_q = tu_int(&rng, 1, 160), p.seq_k = tu_int(&rng, 1, 160);
        p.head_dim = tu_int(&rng, 1, 48), p.head_dim_v = tu_int(&rng, 1, 48);
        p.causal = (int)tu_int(&rng, 0, 1);
        if (tu_int(&rng, 0, 2) == 0) {
            p.window_left = tu_int(&rng, -1, 50);
            p.window_right = tu_int(&rng, -1, 50);
        }
        if (tu_int(&rng, 0, 2) == 0) p.softcap = 5.0f;
        p.has_alibi = tu_int(&rng, 0, 3) == 0;
        p.has_bias = tu_int(&rng, 0, 3) == 0;
        p.has_segment_ids = tu_int(&rng, 0, 4) == 0;
        if (p.has_bias) {
            p.bias_grad = (int)tu_int(&rng, 0, 1);
            p.bias_batch = tu_int(&rng, 0, 1) ? p.batch : 1;
            p.bias_heads = tu_int(&rng, 0, 1) ? p.heads_q : 1;
            p.has_bias_scale = 1, p.bias_scale = 0.5f;
        }

        fa_options o = {0};
        o.backend = FA_BACKEND_CPU;
        o.threads = (int)tu_int(&rng, 1, 3);
        o.block_q = tu_int(&rng, 0, 3) == 0 ? 0 : tu_int(&rng, 1, 70);
        o.block_k = tu_int(&rng, 0, 3) == 0 ? 0 : tu_int(&rng, 1, 70);
        fa_plan *pl = NULL;
        fa_status st = fa_plan_create(&p, &o, &pl);
        CHECK(st == FA_OK, "case %d: fa_plan_create: %s", n, fa_last_error());
        if (st != FA_OK) continue;
        const fa_problem *rp = fa_plan_problem(pl);
        const size_t es = fa_dtype_size(p.dtype);
        const int64_t nq = p.batch * p.heads_q * p.seq_q, nk = p.batch * rp->heads_kv * p.seq_k;
        void *q = tu_alloc((size_t)(nq * p.head_dim) * es), *dq = tu_alloc((size_t)(nq * p.head_dim) * es);
        void *k = tu_alloc((size_t)(nk * p.head_dim) * es), *dk = tu_alloc((size_t)(nk * p.head_dim) * es);
        void *v = tu_alloc((size_t)(nk * rp->head_dim_v) * es), *dv = tu_alloc((size_t)(nk * rp->head_dim_v) * es);
        void *out = tu_alloc((size_t)(nq * rp->head_dim_v) * es), *g = tu_alloc((size_t)(nq * rp->head_dim_v) * es);
        float *lse = tu_alloc(sizeof(float) * (size_t)nq), *bias = NULL, *slopes = NULL, *dbias = NULL;
        int32_t *qs = NULL, *ks = NULL;
        tu_fill(&rng, p.dtype, q, nq * p.head_dim, 1.0);
        tu_fill(&rng, p.dtype, k, nk * p.head_dim, 1.0);
        tu_fill(&rng, p.dtype, v, nk * rp->head_dim_v, 1.0);
        tu_fill(&rng, p.dtype, out, nq * rp->head_dim_v, 0.5);
        tu_fill(&rng, p.dtype, g, nq * rp->head_dim_v, 1.0);
        for (int64_t i = 0; i < nq; i++) lse[i] = (float)(2.0 + tu_uniform(&rng));
        if (p.has_bias) {
            const int64_t nb = p.bias_batch * p.bias_heads * p.seq_q * p.seq_k;
            bias = tu_alloc(sizeof(float) * (size_t)nb);
            for (int64_t i = 0; i < nb; i++) bias[i] = (float)tu_uniform(&rng);
            if (p.bias_grad) dbias = tu_alloc(sizeof(float) * (size_t)nb);
        }
        if (p.has_alibi) {
            slopes = tu_alloc(sizeof(float) * (size_t)p.heads_q);
            for (int64_t h = 0; h < p.heads_q; h++) slopes[h] = 0.1f;
        }
        if (p.has_segment_ids) {
            qs = tu_alloc(sizeof(int32_t) * (size_t)(p.batch * p.seq_q));
            ks = tu_alloc(sizeof(int32_t) * (size_t)(p.batch * p.seq_k));
            for (int64_t i = 0; i < p.batch * p.seq_q; i++) qs[i] = (int32_t)tu_int(&rng, 0, 1);
            for (int64_t i = 0; i < p.batch * p.seq_k; i++) ks[i] = (int32_t)tu_int(&rng, 0, 1);
        }
        fa_counts counts = {-1, -1};
        fa_backward_args a;
        memset(&a, 0, sizeof a);
        a.q = q, a.k = k, a.v = v, a.o = out, a.d_o = g, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
        a.bias = bias, a.alibi_slopes = slopes, a.q_segment_ids = qs, a.kv_segment_ids = ks;
        a.dbias = dbias;
        a.counts = &counts;
        st = fa_backward(pl, &a);
        /* the workspace, measured: workspace_bytes bounds what the call writes (check.h) */
        if (st == FA_OK) check_pass_workspace("backward", pl, NULL, &a);
        fa_cost cost;
        fa_plan_cost(pl, FA_BACKWARD, &cost);
        int64_t bq, bk;
        fa_plan_blocks(pl, FA_BACKWARD, &bq, &bk);
        const int exact = fa_plan_exact(pl);
        int ok = st == FA_OK;
        if (exact) ok = ok && counts.flops == cost.flops && counts.transcendentals == cost.transcendentals;
        else ok = ok && counts.flops <= cost.flops && counts.transcendentals <= cost.transcendentals;
        CHECK(ok, "case %d: %s B=%lld H=%lld/%lld S=%lld/%lld D=%lld/%lld tile %lldx%lld causal=%d "
                   "window=(%lld,%lld) softcap=%g alibi=%d bias=%d dbias=%d seg=%d threads=%d: status %s (%s); "
                   "counted flops %lld trans %lld, plan flops %lld trans %lld",
                   n, fa_dtype_name(p.dtype), (long long)p.batch, (long long)p.heads_q, (long long)rp->heads_kv,
                   (long long)p.seq_q, (long long)p.seq_k, (long long)p.head_dim, (long long)rp->head_dim_v,
                   (long long)bq, (long long)bk, p.causal, (long long)p.window_left, (long long)p.window_right,
                   (double)p.softcap, p.has_alibi, p.has_bias, p.bias_grad, p.has_segment_ids, o.threads, fa_status_string(st),
                   fa_last_error(), (long long)counts.flops, (long long)counts.transcendentals,
                   (long long)cost.flops, (long long)cost.transcendentals);
        void *ptrs[] = {q, dq, k, dk, v, dv, out, g, lse, bias, slopes, qs, ks, dbias};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
        fa_plan_destroy(pl);
    }
    if (!failures) printf("all %d cases counted exactly what the plan predicts\n", cases);
    return check_finish("test_counts_backward");
}
