/* Score semantics at the edges (docs/nonfinite.md), forward and backward, against the
 * float64 reference, under whatever FA_ISA selects:
 *   (a) windows anywhere in [-1, INT64_MAX]: no overflow, the same keys (and the same exact
 *       cost) as an unbounded side once the window passes every distance;
 *   (b) non-finite inputs: NaN or +inf in a visible score gives that row o = NaN and
 *       lse = NaN; -inf scores hide keys; a row with no visible key keeps o = 0,
 *       lse = -inf; non-finite ALiBi slopes are refused (FA_ERR_INVALID naming the head);
 *   (c) inf or NaN in k or v at a key a row cannot see (causal, window, bias -inf, segment
 *       ids) never reaches that row, under several tilings.
 * Each under both backward schedules (FA_BWD_SCHEDULE=two-pass, fused).
 * A fresh seed every run, printed; FA_TEST_SEED=<seed> reproduces a run. */
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

/* A contiguous problem with its tensors (dtype elements; bias, slopes f32). */
typedef struct {
    fa_problem p;
    void *q, *k, *v, *g;
    float *bias, *slopes;
    int32_t *qs, *ks;
    int64_t nq, nk, nv, no, nb;
} scase;

static void sc_init(scase *c, fa_dtype t, int64_t Hq, int64_t Hk, int64_t Sq, int64_t Sk, int64_t D) {
    memset(c, 0, sizeof *c);
    fa_problem_init(&c->p);
    fa_problem *p = &c->p;
    p->dtype = t, p->batch = 1, p->heads_q = Hq, p->heads_kv = Hk, p->seq_q = Sq, p->seq_k = Sk;
    p->head_dim = p->head_dim_v = D;
    c->nq = c->no = Hq * Sq * D, c->nk = c->nv = Hk * Sk * D, c->nb = Sq * Sk;
    const size_t es = fa_dtype_size(t);
    c->q = tu_alloc((size_t)c->nq * es), c->k = tu_alloc((size_t)c->nk * es);
    c->v = tu_alloc((size_t)c->nv * es), c->g = tu_alloc((size_t)c->no * es);
    tu_fill(&rng, t, c->q, c->nq, 1.5), tu_fill(&rng, t, c->k, c->nk, 1.5);
    tu_fill(&rng, t, c->v, c->nv, 1.0), tu_fill(&rng, t, c->g, c->no, 1.0);
}
static void sc_bias(scase *c) { /* [1, 1, Sq, Sk] */
    c->p.has_bias = 1;
    c->bias = tu_alloc(sizeof(float) * (size_t)c->nb);
    for (int64_t i = 0; i < c->nb; i++) c->bias[i] = (float)tu_uniform(&rng);
}
static void sc_free(scase *c) {
    void *ptrs[] = {c->q, c->k, c->v, c->g, c->bias, c->slopes, c->qs, c->ks};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
}
static fa_plan *sc_plan(const scase *c, int64_t bq, int64_t bk) {
    fa_options o = {FA_BACKEND_CPU, 2, bq, bk};
    fa_plan *pl = NULL;
    if (fa_plan_create(&c->p, &o, &pl) != FA_OK) {
        printf("FAIL plan: %s\n", fa_last_error());
        failures++;
    }
    return pl;
}

/* max |x| over the finite elements */
static double finite_max(const void *x, int64_t n, fa_dtype t) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)chk_load(t, x, i));
        if (isfinite(e) && e > m) m = e;
    }
    return m;
}

/* Forward, then backward, of a case under tiles bq x bk, against the reference. want_nan:
 * how many rows the reference must give lse = NaN (-1: any). */
static void check(const char *label, const scase *c, int64_t bq, int64_t bk, int want_nan) {
    fa_plan *pl = sc_plan(c, bq, bk);
    if (!pl) return;
    const fa_problem *p = &c->p;
    const fa_dtype t = p->dtype;
    const size_t es = fa_dtype_size(t);
    const int64_t rows = p->heads_q * p->seq_q;
    void *o = tu_alloc((size_t)c->no * es), *dq = tu_alloc((size_t)c->nq * es);
    void *dk = tu_alloc((size_t)c->nk * es), *dv = tu_alloc((size_t)c->nv * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < c->no; i++) chk_store(t, o, i, 777.0f); /* unwritten: caught */
    for (int64_t i = 0; i < rows; i++) lse[i] = 777.0f;
    tu_poison(t, dq, c->nq), tu_poison(t, dk, c->nk), tu_poison(t, dv, c->nv);
    fa_forward_args fa = {.q = c->q, .k = c->k, .v = c->v, .o = o, .lse = lse, .bias = c->bias,
                          .alibi_slopes = c->slopes, .q_segment_ids = c->qs, .kv_segment_ids = c->ks};
    fa_status st = fa_forward(pl, &fa);
    fa_backward_args ba = {.q = c->q, .k = c->k, .v = c->v, .o = o, .d_o = c->g, .lse = lse, .dq = dq, .dk = dk,
                           .dv = dv, .bias = c->bias, .alibi_slopes = c->slopes, .q_segment_ids = c->qs,
                           .kv_segment_ids = c->ks};
    if (st == FA_OK) st = fa_backward(pl, &ba);
    double *ro = tu_alloc(sizeof(double) * (size_t)c->no), *rl = tu_alloc(sizeof(double) * (size_t)rows);
    double *rq = tu_alloc(sizeof(double) * (size_t)c->nq), *rk = tu_alloc(sizeof(double) * (size_t)c->nk);
    double *rv = tu_alloc(sizeof(double) * (size_t)c->nv);
    fa_ref_forward(p, &fa, ro, rl);
    fa_ref_backward(p, &ba, rq, rk, rv);
    int nan_rows = 0, bad = st != FA_OK;
    char why[200] = "";
    if (st != FA_OK) snprintf(why, sizeof why, "status %s: %s", fa_status_string(st), fa_last_error());
    for (int64_t r = 0; r < rows && !bad; r++) {
        nan_rows += isnan(rl[r]);
        const int ok = isnan(rl[r]) ? isnan(lse[r]) : rl[r] == -INFINITY ? lse[r] == -INFINITY
                                                     : fabs(lse[r] - rl[r]) <= 1e-5 * (1.0 + fabs(rl[r]));
        if (!ok) bad = 1, snprintf(why, sizeof why, "lse row %lld: %g, reference %g", (long long)r, (double)lse[r], rl[r]);
    }
    if (!bad && want_nan >= 0 && nan_rows != want_nan)
        bad = 1, snprintf(why, sizeof why, "the reference has %d NaN rows, the case wants %d", nan_rows, want_nan);
    /* bounds: check.h's for the dtype (o and gradients alike, NaN where the reference has
     * NaN); the backward's f32 noise floor 8 u_f32 scale 2 |do|_2 |v|_2 |k or q| per summed
     * row (backward_check.h), with |do|_2 |v|_2 <= D max|do| max|v|, and at most Sq rows
     * summed */
    const double floor = 8.0 * 0x1p-24 * 2.0 * (double)fa_plan_scale(pl) * (double)p->head_dim *
                         finite_max(c->g, c->no, t) * finite_max(c->v, c->nv, t) *
                         fmax(finite_max(c->q, c->nq, t), finite_max(c->k, c->nk, t)) * (double)p->seq_q;
    const char *names[4] = {"o", "dq", "dk", "dv"};
    const void *gots[4] = {o, dq, dk, dv};
    const double *refs[4] = {ro, rq, rk, rv};
    const int64_t ns[4] = {c->no, c->nq, c->nk, c->nv};
    double errs[4] = {0, 0, 0, 0};
    const int before = failures;
    for (int x = 0; x < 4 && !bad; x++) {
        const int64_t dims[4] = {1, 1, 1, ns[x]};
        double *allow = check_allow_const(ns[x], x ? floor : 0.0);
        const check_result r =
            check_tensor(names[x], t, gots[x], &(fa_strides){{0, 0, 0, 0}}, refs[x], dims, check_tol_of(t), allow, 0);
        free(allow);
        errs[x] = r.mag > 0.0 ? r.err / r.mag : 0.0;
        if (r.faults) bad = 1, snprintf(why, sizeof why, "%s: %lld elements outside the bound", names[x], (long long)r.faults);
    }
    failures = before; /* counted once below */
    if (bad) printf("FAIL %s (%s, tiles %lldx%lld): %s\n", label, fa_dtype_name(t), (long long)bq, (long long)bk, why);
    else
        printf("PASS %s (%s, tiles %lldx%lld): %d NaN rows; o %.1e dq %.1e dk %.1e dv %.1e\n", label, fa_dtype_name(t),
               (long long)bq, (long long)bk, nan_rows, errs[0], errs[1], errs[2], errs[3]);
    failures += bad;
    free(o), free(dq), free(dk), free(dv), free(lse), free(ro), free(rl), free(rq), free(rk), free(rv);
    fa_plan_destroy(pl);
}

/* ---- (a) windows up to INT64_MAX ----------------------------------------------------- */

static void test_huge_windows(void) {
    static const int64_t sides[][2] = {{-1, INT64_MAX}, {INT64_MAX, -1}, {INT64_MAX, INT64_MAX}, {0, INT64_MAX},
                                       {INT64_MAX - 4, 3}, {2, INT64_MAX - 1}, {INT64_MAX, 0}, {(int64_t)1 << 34, 1}};
    for (size_t w = 0; w < sizeof sides / sizeof sides[0]; w++)
        for (int v = 0; v < 3; v++) {
            scase c;
            sc_init(&c, FA_F32, 2, 1, 23, 37, 8);
            c.p.window_left = sides[w][0], c.p.window_right = sides[w][1];
            c.p.causal = v == 1;
            if (v == 2) c.p.has_diag_offset = 1, c.p.diag_offset = -7;
            tu_keep_aligned_diag(&c.p);
            char label[128];
            snprintf(label, sizeof label, "window (%lld, %lld)%s", (long long)sides[w][0], (long long)sides[w][1],
                     v == 1 ? " causal" : v == 2 ? " diag -7" : "");
            check(label, &c, 8, 16, 0);
            /* the same cost as the window with each side past 2^33 made unbounded */
            scase e = c;
            if (e.p.window_left > ((int64_t)1 << 33)) e.p.window_left = -1;
            if (e.p.window_right > ((int64_t)1 << 33)) e.p.window_right = -1;
            tu_keep_aligned_diag(&e.p); /* (unbounded both sides: nothing left to place) */
            fa_plan *a = sc_plan(&c, 8, 16), *b = sc_plan(&e, 8, 16);
            if (a && b) {
                fa_cost ca[2], cb[2];
                fa_counts n[2] = {{0, 0}, {0, 0}};
                fa_plan_cost(a, FA_FORWARD, &ca[0]), fa_plan_cost(a, FA_BACKWARD, &ca[1]);
                fa_plan_cost(b, FA_FORWARD, &cb[0]), fa_plan_cost(b, FA_BACKWARD, &cb[1]);
                void *o = tu_alloc(sizeof(float) * (size_t)c.no), *d[3];
                float *lse = tu_alloc(sizeof(float) * (size_t)(2 * 23));
                d[0] = tu_alloc(sizeof(float) * (size_t)c.nq), d[1] = tu_alloc(sizeof(float) * (size_t)c.nk);
                d[2] = tu_alloc(sizeof(float) * (size_t)c.nv);
                fa_forward(a, &(fa_forward_args){.q = c.q, .k = c.k, .v = c.v, .o = o, .lse = lse, .counts = &n[0]});
                fa_backward(a, &(fa_backward_args){.q = c.q, .k = c.k, .v = c.v, .o = o, .d_o = c.g, .lse = lse,
                                                   .dq = d[0], .dk = d[1], .dv = d[2], .counts = &n[1]});
                int ok = 1;
                for (int x = 0; x < 2; x++)
                    ok &= memcmp(&ca[x], &cb[x], sizeof ca[x]) == 0 && n[x].flops == ca[x].flops &&
                          n[x].transcendentals == ca[x].transcendentals;
                if (!ok) {
                    printf("FAIL %s: cost differs from the unbounded window's, or the counts from the plan "
                           "(forward flops %lld vs %lld, counted %lld)\n",
                           label, (long long)ca[0].flops, (long long)cb[0].flops, (long long)n[0].flops);
                    failures++;
                }
                free(o), free(lse), free(d[0]), free(d[1]), free(d[2]);
            }
            fa_plan_destroy(a), fa_plan_destroy(b);
            sc_free(&c);
        }
}

/* ---- (b) non-finite inputs ---------------------------------------------------------- */

static void put(const scase *c, void *x, int64_t at, float val) { chk_store(c->p.dtype, x, at, val); }

static void test_nonfinite(void) {
    static const fa_dtype types[] = {FA_F32, FA_BF16};
    for (int tt = 0; tt < 2; tt++) {
        const fa_dtype t = types[tt];
        const int64_t Sq = 9, Sk = 13, D = 8; /* Hq = 2 on Hk = 1 */
        scase c;
        for (int causal = 0; causal < 2; causal++) {
            sc_init(&c, t, 2, 1, Sq, Sk, D), c.p.causal = causal;
            put(&c, c.q, (1 * Sq + 3) * D + 2, NAN); /* head 1, row 3 */
            check(causal ? "NaN in q (one row), causal" : "NaN in q (one row)", &c, 4, 8, 1);
            sc_free(&c);
        }
        sc_init(&c, t, 2, 1, Sq, Sk, D);
        put(&c, c.k, 5 * D, NAN); /* key 5: every row sees it */
        check("NaN in k at a visible key", &c, 4, 8, (int)(2 * Sq));
        sc_free(&c);
        sc_init(&c, t, 2, 1, Sq, Sk, D), c.p.causal = 1; /* bottom-right: key 12 only for row 8 */
        put(&c, c.k, 12 * D + 1, INFINITY);
        put(&c, c.q, 8 * D + 1, 1.0f), put(&c, c.q, (Sq + 8) * D + 1, 1.0f); /* +inf, not -inf (see (c)) */
        check("+inf in k, visible to the last row only (causal)", &c, 4, 8, -1);
        sc_free(&c);
        for (int w = 0; w < 3; w++) { /* +inf, NaN bias entries; -inf ones hide keys */
            sc_init(&c, t, 2, 1, Sq, Sk, D), sc_bias(&c);
            c.bias[4 * Sk + 6] = w == 0 ? INFINITY : w == 1 ? NAN : -INFINITY;
            if (w == 2) /* a whole row of -inf, and NaN in k there: still a row with no key */
                for (int64_t j = 0; j < Sk; j++) c.bias[2 * Sk + j] = -INFINITY;
            if (w == 2) put(&c, c.k, 6 * D, NAN), c.bias[(int64_t)0 * Sk + 6] = -INFINITY;
            const char *l[3] = {"+inf bias entry", "NaN bias entry", "-inf bias hides NaN k"};
            check(l[w], &c, 4, 8, w == 2 ? (int)(2 * (Sq - 3)) : 2); /* w == 2: rows 0, 2, 4 hide key 6 */
            sc_free(&c);
        }
        /* f32 overflow of q.k: +inf makes the row NaN, -inf hides the key */
        if (t == FA_F32) {
            sc_init(&c, t, 2, 1, Sq, Sk, D);
            /* row 6 meets key 7 at 4e19 * 1e19 = +4e38: +inf, a NaN row; row 2 meets key 8 at
             * -4e38: -inf, the key hidden. One large term per product, so the other rows'
             * large but finite scores carry no cancellation. */
            put(&c, c.q, 6 * D, 4e19f), put(&c, c.k, 7 * D, 1e19f);
            put(&c, c.q, 2 * D + D - 1, 4e19f), put(&c, c.k, 8 * D + D - 1, -1e19f);
            check("f32 overflow of q.k (4e19 x 1e19)", &c, 4, 8, 1);
            sc_free(&c);
        }
    }
    /* f32 inputs of 1e5 cast to f16: inf in q */
    scase c;
    sc_init(&c, FA_F16, 2, 1, 9, 13, 8);
    put(&c, c.q, 1 * 8 + 3, 1e5f);
    for (int64_t j = 0; j < 13; j++) /* k[j][3] > 0: scores +inf, not -inf (see (c)) */
        put(&c, c.k, j * 8 + 3, 0.1f + fabsf(chk_load(FA_F16, c.k, j * 8 + 3)));
    check("f16 q = 1e5 (inf)", &c, 4, 8, -1);
    sc_free(&c);

    /* ALiBi slopes must be finite, and so their products with the distances (up to
     * Sq + Sk = 22 here: 3e37 x 22 overflows float32): refused, naming the head, forward and
     * backward */
    static const float badv[] = {INFINITY, NAN, -INFINITY, 3e37f, -3e37f};
    for (int i = 0; i < 5; i++) {
        sc_init(&c, FA_F32, 2, 1, 9, 13, 8);
        c.p.has_alibi = 1;
        c.slopes = tu_alloc(2 * sizeof(float));
        c.slopes[0] = 0.25f, c.slopes[1] = badv[i];
        fa_plan *pl = sc_plan(&c, 0, 0);
        if (pl) {
            void *o = tu_alloc(sizeof(float) * (size_t)c.no), *d = tu_alloc(sizeof(float) * (size_t)c.nq * 3);
            float *lse = tu_alloc(sizeof(float) * 18);
            for (int x = 0; x < 18; x++) lse[x] = 1.0f;
            fa_status s1 = fa_forward(pl, &(fa_forward_args){.q = c.q, .k = c.k, .v = c.v, .o = o, .lse = lse,
                                                             .alibi_slopes = c.slopes});
            const int ok1 = s1 == FA_ERR_INVALID && strstr(fa_last_error(), "alibi_slopes[1]");
            fa_status s2 = fa_backward(pl, &(fa_backward_args){.q = c.q, .k = c.k, .v = c.v, .o = o, .d_o = c.g,
                                                               .lse = lse, .dq = d, .dk = d, .dv = d,
                                                               .alibi_slopes = c.slopes});
            const int ok2 = s2 == FA_ERR_INVALID && strstr(fa_last_error(), "alibi_slopes[1]");
            printf("%s ALiBi slope %g refused: forward %s, backward %s (%s)\n", ok1 && ok2 ? "PASS" : "FAIL",
                   (double)badv[i], fa_status_string(s1), fa_status_string(s2), fa_last_error());
            failures += !(ok1 && ok2);
            free(o), free(d), free(lse);
        }
        fa_plan_destroy(pl);
        sc_free(&c);
    }
}

/* ---- (c) garbage at hidden keys ---------------------------------------------------------
 * The garbage keys are hidden from some rows and visible to others; the rows that see them
 * turn NaN (or inf), the others must match the reference exactly as if the keys were
 * clean. inf in k is +inf and -inf in two dims with q > 0 there, so that a row that sees
 * the key gets a NaN score: a score of exactly -inf made by the product at a key every mask
 * shows is docs/nonfinite.md's stated exception, not tested here. */

enum { G_NAN_V, G_INF_V, G_NAN_K, G_INF_K };

static void test_hidden_garbage(void) {
    static const char *masks[] = {"causal", "window (2, 1)", "bias -inf", "segment ids",
                                  "a chunked mask (chunk 10, blocks 8 x 8)"};
    static const char *kinds[] = {"NaN in v", "inf in v", "NaN in k", "+-inf in k"};
    static const int64_t tiles[][2] = {{0, 0}, {7, 5}, {16, 48}, {1, 40}};
    static const fa_dtype types[] = {FA_F32, FA_BF16};
    const int64_t Sq = 24, Sk = 40, D = 8, garbage[] = {3, 30, 39};
    for (int mk = 0; mk < 5; mk++)
        for (int kind = 0; kind < 4; kind++) {
            const fa_dtype t = types[(mk + kind) % 2];
            scase c;
            sc_init(&c, t, 2, 1, Sq, Sk, D);
            if (mk == 0) c.p.causal = 1;
            if (mk == 1) c.p.window_left = 2, c.p.window_right = 1;
            if (mk == 2) { /* the garbage keys hidden from even rows */
                sc_bias(&c);
                for (int64_t i = 0; i < Sq; i += 2)
                    for (int g = 0; g < 3; g++) c.bias[i * Sk + garbage[g]] = -INFINITY;
            }
            if (mk == 3) { /* keys in runs of segments 0, 1, 2; queries 0..2 at random */
                c.p.has_segment_ids = 1;
                c.qs = tu_alloc(sizeof(int32_t) * (size_t)Sq), c.ks = tu_alloc(sizeof(int32_t) * (size_t)Sk);
                for (int64_t i = 0; i < Sq; i++) c.qs[i] = (int32_t)tu_int(&rng, 0, 2);
                for (int64_t j = 0; j < Sk; j++) c.ks[j] = (int32_t)(3 * j / Sk);
            }
            /* a block-sparse mask: keys 30 and 39 visible to rows 14..23 only (at position
             * d = i + 16, in d's chunk), key 3 to none; its full pairs take no guard
             * (guard.h, fa_pair_may_hide), its partial ones do */
            unsigned char *attend = NULL;
            if (mk == 4) {
                const fa_mask_shape ms = {1, 1, Sq, Sk, 8, 8};
                fa_mask *m = NULL;
                if (fa_mask_chunked(&ms, Sk - Sq, 10, &m) != FA_OK) {
                    printf("FAIL fa_mask_chunked: %s\n", fa_last_error());
                    failures++;
                    sc_free(&c);
                    continue;
                }
                c.p.mask = m; /* the plans take their references; released after the checks */
                attend = tu_alloc((size_t)(2 * Sq * Sk));
                for (int64_t h = 0; h < 2; h++)
                    for (int64_t i = 0; i < Sq; i++)
                        for (int64_t j = 0; j < Sk; j++) /* the definition, not the library's */
                            attend[(h * Sq + i) * Sk + j] = j <= i + Sk - Sq && j / 10 == (i + Sk - Sq) / 10;
                fa_ref_attend(attend);
            }
            for (int g = 0; g < 3; g++)
                for (int64_t d = 0; d < D; d += 3) {
                    const float val = kind == G_NAN_V || kind == G_NAN_K ? NAN : d == 3 ? -INFINITY : INFINITY;
                    put(&c, kind <= G_INF_V ? c.v : c.k, garbage[g] * D + d, val);
                }
            if (kind == G_INF_K) /* q > 0 in dims 0 and 3: inf - inf, a NaN score */
                for (int64_t r = 0; r < 2 * Sq; r++) put(&c, c.q, r * D, 0.5f), put(&c, c.q, r * D + 3, 0.5f);
            char label[96];
            snprintf(label, sizeof label, "%s at keys 3, 30, 39, %s", kinds[kind], masks[mk]);
            for (int x = 0; x < 4; x++) check(label, &c, tiles[x][0], tiles[x][1], -1);
            if (mk == 4) {
                fa_ref_attend(NULL);
                fa_mask_destroy((fa_mask *)c.p.mask);
                free(attend);
            }
            sc_free(&c);
        }
}

int main(void) {
    rng = check_seed("test_semantics");
    /* both backward schedules (two passes; one pass, backward_fused.c) */
    static const char *schedules[2] = {"two-pass", "fused"};
    for (int k = 0; k < 2; k++) {
        setenv("FA_BWD_SCHEDULE", schedules[k], 1);
        printf("-- backward schedule: %s\n", schedules[k]);
        test_huge_windows();
        test_nonfinite();
        test_hidden_garbage();
    }
    unsetenv("FA_BWD_SCHEDULE");
    return check_finish("test_semantics");
}
