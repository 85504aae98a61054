/* What the forward kernel counts while it runs (fa_forward_args.counts) must equal what
 * the plan predicts (fa_plan_cost, FA_FORWARD) to the unit: flops and transcendentals, on
 * random shapes with ragged tiles, random block sizes, every mask and their combinations,
 * softcap on and off, GQA. Also the seed problem's figures and a small causal case
 * counted by hand. The workspace is measured too (check.h, check_pass_workspace): the
 * bytes a call writes in a caller's workspace of exactly workspace_bytes. The backward's
 * counts live in test_counts_backward.c. */
#include "check.h"

static uint64_t rng;


/* Runs the forward once (zero-filled tensors: counts do not depend on values) and returns
 * its counts; the plan's figures in *cost. */
static int count_forward(const fa_problem *p, const fa_options *o, fa_counts *got, fa_cost *cost, fa_plan **keep) {
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(p, o, &plan);
    if (st != FA_OK) {
        CHECK(0, "plan: %s", fa_last_error());
        return 0;
    }
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv ? p->heads_kv : Hq;
    const int64_t Dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    void *q = calloc((size_t)(B * Hq * p->seq_q * p->head_dim), es);
    void *k = calloc((size_t)(B * Hk * p->seq_k * p->head_dim), es);
    void *v = calloc((size_t)(B * Hk * p->seq_k * Dv), es);
    void *out = calloc((size_t)(B * Hq * p->seq_q * Dv), es);
    float *bias = p->has_bias ? calloc((size_t)(p->bias_batch * p->bias_heads * p->seq_q * p->seq_k), 4) : NULL;
    float *slopes = p->has_alibi ? calloc((size_t)Hq, 4) : NULL;
    int32_t *qs = p->has_segment_ids ? calloc((size_t)(B * p->seq_q), 4) : NULL;
    int32_t *ks = p->has_segment_ids ? calloc((size_t)(B * p->seq_k), 4) : NULL;
    for (int64_t i = 0; qs && i < B * p->seq_q; i++) qs[i] = (int32_t)tu_int(&rng, 0, 2);
    for (int64_t i = 0; ks && i < B * p->seq_k; i++) ks[i] = (int32_t)tu_int(&rng, 0, 2);
    fa_forward_args a = {.q = q, .k = k, .v = v, .o = out, .bias = bias, .alibi_slopes = slopes,
                         .q_segment_ids = qs, .kv_segment_ids = ks, .counts = got};
    got->flops = got->transcendentals = -1;
    st = fa_forward(plan, &a);
    CHECK(st == FA_OK, "forward: %s", fa_last_error());
    fa_plan_cost(plan, FA_FORWARD, cost);
    /* the workspace, measured: workspace_bytes bounds what the call writes; with one thread
     * (every slice in use) it is what the call writes, up to its pieces' alignment */
    const int64_t written = st == FA_OK ? check_pass_workspace("forward", plan, &a, NULL) : -1;
    if (written >= 0 && o->threads == 1)
        CHECK(written > cost->workspace_bytes - 1024, "one thread: workspace_bytes %lld but only %lld bytes written",
              (long long)cost->workspace_bytes, (long long)written);
    free(q), free(k), free(v), free(out), free(bias), free(slopes), free(qs), free(ks);
    if (keep && st == FA_OK) *keep = plan;
    else fa_plan_destroy(plan);
    return st == FA_OK;
}

static void test_random(int n) {
    const int before = failures;
    int exact_cases = 0, bound_cases = 0;
    for (int t = 0; t < n; t++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = tu_int(&rng, 1, 2);
        p.heads_kv = tu_int(&rng, 1, 2);
        p.heads_q = p.heads_kv * tu_int(&rng, 1, 3);
        p.seq_q = tu_int(&rng, 1, 150);
        p.seq_k = tu_int(&rng, 0, 3) ? tu_int(&rng, 1, 150) : p.seq_q;
        p.head_dim = tu_int(&rng, 1, 24);
        p.head_dim_v = tu_int(&rng, 0, 1) ? p.head_dim : tu_int(&rng, 1, 24);
        p.dtype = (fa_dtype)tu_int(&rng, 0, 2);
        p.causal = (int)tu_int(&rng, 0, 1);
        if (tu_int(&rng, 0, 1)) {
            p.window_left = tu_int(&rng, -1, 40);
            p.window_right = tu_int(&rng, -1, 40);
        }
        p.softcap = tu_int(&rng, 0, 1) ? 7.5f : 0.0f;
        if (tu_int(&rng, 0, 3) == 0) p.has_diag_offset = 1, p.diag_offset = tu_int(&rng, -p.seq_q - 2, p.seq_k + 2);
        p.has_bias = (int)tu_int(&rng, 0, 3) == 0;
        if (p.has_bias) {
            p.bias_batch = tu_int(&rng, 0, 1) ? p.batch : 1;
            p.bias_heads = tu_int(&rng, 0, 1) ? p.heads_q : 1;
        }
        p.has_alibi = (int)tu_int(&rng, 0, 3) == 0;
        tu_keep_aligned_diag(&p);
        p.has_segment_ids = (int)tu_int(&rng, 0, 4) == 0;
        fa_options o = {FA_BACKEND_CPU, (int)tu_int(&rng, 1, 3), 0, 0};
        if (tu_int(&rng, 0, 4)) {
            o.block_q = tu_int(&rng, 1, 70);
            o.block_k = tu_int(&rng, 1, 70);
        }
        fa_counts got;
        fa_cost cost;
        fa_plan *plan = NULL;
        if (!count_forward(&p, &o, &got, &cost, &plan)) continue;
        const int exact = fa_plan_exact(plan);
        int64_t bq, bk;
        fa_plan_blocks(plan, FA_FORWARD, &bq, &bk);
        if (exact) {
            exact_cases++;
            CHECK(got.flops == cost.flops && got.transcendentals == cost.transcendentals,
                   "case %d: counted flops %lld trans %lld, plan says %lld and %lld (Sq=%lld Sk=%lld D=%lld Dv=%lld "
                   "blocks %lldx%lld causal=%d window=(%lld,%lld) softcap=%g)",
                   t, (long long)got.flops, (long long)got.transcendentals, (long long)cost.flops,
                   (long long)cost.transcendentals, (long long)p.seq_q, (long long)p.seq_k, (long long)p.head_dim,
                   (long long)p.head_dim_v, (long long)bq, (long long)bk, p.causal, (long long)p.window_left,
                   (long long)p.window_right, (double)p.softcap);
        } else {
            /* segment ids: the plan is an upper bound; this kernel skips nothing for them */
            bound_cases++;
            CHECK(got.flops <= cost.flops && got.transcendentals <= cost.transcendentals,
                   "case %d (segment ids): counted %lld/%lld above the plan's bound %lld/%lld", t, (long long)got.flops,
                   (long long)got.transcendentals, (long long)cost.flops, (long long)cost.transcendentals);
        }
        fa_plan_destroy(plan);
    }
    printf("random     %d cases (%d exact, %d with segment ids as bound): %s\n", n, exact_cases, bound_cases,
           failures == before ? "counts match the plan" : "FAIL");
}

/* The seed problem: B=18, Hq=32, S=16384, D=256, bf16, no mask. Every tile is computed:
 *   flops = 2 x B x H x S x S x (D + Dv) = 2 x 18 x 32 x 16384^2 x 512 = 158329674399744
 *   trans = B x H x (S x S + S x ceil(S / bk) + S)   (exps, one rescale per row per key
 *           tile, one log per row) */
static void test_seed_problem(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 18, p.heads_q = 32, p.seq_q = p.seq_k = 16384, p.head_dim = 256, p.dtype = FA_BF16;
    fa_options o = {FA_BACKEND_CPU, 0, 0, 0};
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(&p, &o, &plan);
    CHECK(st == FA_OK, "seed plan: %s", fa_last_error());
    if (st) return;
    fa_cost c;
    fa_plan_cost(plan, FA_FORWARD, &c);
    int64_t bq, bk;
    fa_plan_blocks(plan, FA_FORWARD, &bq, &bk);
    const int64_t bh = 18 * 32, S = 16384;
    const int64_t trans = bh * (S * S + S * ((S + bk - 1) / bk) + S);
    CHECK(c.flops == 158329674399744LL, "seed forward flops %lld, want 158329674399744", (long long)c.flops);
    CHECK(c.flops_useful == c.flops, "seed useful flops %lld != flops", (long long)c.flops_useful);
    CHECK(c.transcendentals == trans, "seed transcendentals %lld, want %lld", (long long)c.transcendentals,
           (long long)trans);
    printf("seed       B18 H32 S16384 D256 bf16: flops %lld, transcendentals %lld (blocks %lldx%lld)\n",
           (long long)c.flops, (long long)c.transcendentals, (long long)bq, (long long)bk);
    fa_plan_destroy(plan);
}

/* By hand: Sq = Sk = 5, causal, 2 x 2 tiles, D = 3, Dv = 4. Row i sees keys 0..i.
 *   query tile rows 0-1: keys <= 1  -> key tile 0             m x n = 2x2
 *   query tile rows 2-3: keys <= 3  -> key tiles 0, 1         2x2, 2x2
 *   query tile row  4:   keys <= 4  -> key tiles 0, 1, 2      1x2, 1x2, 1x1
 * sum m*n = 4 + 8 + 5 = 17; sum of m over the 6 tile pairs = 2 + 4 + 3 = 9; 5 rows.
 *   flops = 2 x 17 x (3 + 4) = 238
 *   trans = 17 exps + 9 rescales + 5 logs = 31; with softcap + 17 tanh = 48
 *   useful = 2 x 15 visible pairs x 7 = 210 */
static void test_by_hand(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = p.seq_k = 5, p.head_dim = 3, p.head_dim_v = 4, p.causal = 1;
    fa_options o = {FA_BACKEND_CPU, 2, 2, 2};
    for (int cap = 0; cap < 2; cap++) {
        p.softcap = cap ? 3.0f : 0.0f;
        fa_counts got;
        fa_cost c;
        if (!count_forward(&p, &o, &got, &c, NULL)) return;
        const int64_t want_trans = cap ? 48 : 31;
        CHECK(got.flops == 238 && got.transcendentals == want_trans, "hand case (softcap %d): counted %lld/%lld, want 238/%lld",
               cap, (long long)got.flops, (long long)got.transcendentals, (long long)want_trans);
        CHECK(c.flops == 238 && c.transcendentals == want_trans && c.flops_useful == 210,
               "hand case (softcap %d): plan %lld/%lld useful %lld, want 238/%lld/210", cap, (long long)c.flops,
               (long long)c.transcendentals, (long long)c.flops_useful, (long long)want_trans);
    }
    printf("by hand    Sq=Sk=5 causal 2x2 tiles: flops 238, transcendentals 31 (48 with softcap): %s\n",
           failures ? "FAIL" : "ok");
}

int main(void) {
    rng = check_seed("test_counts");
    test_by_hand();
    test_seed_problem();
    test_random(300);
    return check_finish("test_counts");
}
