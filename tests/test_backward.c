/* The backward pass: (a) the float64 reference (dq, dk, dv and dbias) against central
 * differences of the float64 forward; (b) randomized fa_backward cases against the reference, every mask alone and
 * combined, GQA and MQA, strided views, f32/f16/bf16; (c) rows that see no key; (d)
 * bit-identical results across runs and thread counts; (e) bad arguments (overlapping
 * buffers: test_backward_overlaps.c); (f) non-default
 * scales with softcap, ALiBi and bias together, every tensor (dq, dk, dv too) a strided view.
 * A fresh seed every run, printed; FA_TEST_SEED=<seed> reproduces a run. FA_CHECK_CASES=N
 * runs N random cases of (b) instead (make check-long), FA_CHECK_ONLY=n replays case #n. */
#include "backward_check.h"

/* ---- (a) the reference against central differences ------------------------------------ */

/* L = sum(o * do) with o from the float64 reference forward. */
static double loss(const tcase *c) {
    const fa_problem *p = &c->p;
    const int64_t rows = p->batch * p->heads_q * p->seq_q, Dv = p->head_dim_v;
    double *o = tu_alloc(sizeof(double) * (size_t)(rows * Dv)), *lse = tu_alloc(sizeof(double) * (size_t)rows);
    fa_forward_args a = case_fwd_args(c);
    fa_ref_forward(p, &a, o, lse);
    double L = 0.0;
    for (int64_t i = 0; i < rows * Dv; i++) L += o[i] * (double)((const float *)c->g)[i];
    free(o);
    free(lse);
    return L;
}

/* Central differences of L in every element of x (f32, contiguous, values on a 2^-12 grid so
 * x +- h is exact with h = 2^-20); max|fd - ref| / max|ref|. */
static double fd_error(tcase *c, float *x, int64_t n, const double *ref) {
    const double h = 0x1p-20;
    double err = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float keep = x[i];
        x[i] = (float)(keep + h);
        const double up = loss(c);
        x[i] = (float)(keep - h);
        const double down = loss(c);
        x[i] = keep;
        const double fd = (up - down) / (2.0 * h);
        if (fabs(fd - ref[i]) > err) err = fabs(fd - ref[i]);
        if (fabs(ref[i]) > mag) mag = fabs(ref[i]);
    }
    return mag > 0.0 ? err / mag : err;
}

static void test_reference_gradients(uint64_t *rng) {
    static const struct { int mask; const char *name; } cfg[] = {
        {0, "plain"}, {M_SOFTCAP, "softcap"}, {M_BIAS, "bias"}, {M_ALIBI, "alibi"}, {M_CAUSAL, "causal"},
        {M_WINDOW, "window"}, {M_SEG, "segments"}, {M_CAUSAL | M_WINDOW | M_BIAS | M_ALIBI | M_SOFTCAP, "all"},
        {M_SCALE, "scale"}, {M_SCALE | M_SOFTCAP | M_ALIBI | M_BIAS, "scale+softcap+alibi+bias"},
        {M_BIAS | M_BCAST, "bias broadcast"}, {M_BIAS | M_BROW, "bias row broadcast"},
        {M_BIAS | M_BCAST | M_BROW | M_CAUSAL, "bias [1, 1, 1, Sk] causal"},
    };
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = 1, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 5, p.seq_k = 7, p.head_dim = 4, p.head_dim_v = 3;
        tcase c;
        case_init(&c, &p, cfg[k].mask, rng, 0);
        if (cfg[k].mask & M_WINDOW) c.p.window_left = 3, c.p.window_right = 1; /* several keys per row */
        if (c.bias) c.p.has_bias_scale = 1, c.p.bias_scale = 0.75f;
        float *bufs[] = {c.q, c.k, c.v, c.g, c.bias};
        int64_t ns[] = {c.nq, c.nk, c.nv, c.no, c.bias ? c.nbias : 0};
        for (int t = 0; t < 5; t++)
            for (int64_t i = 0; i < ns[t]; i++) bufs[t][i] = roundf(bufs[t][i] * 4096.0f) / 4096.0f;
        fa_backward_args a = case_bwd_args(&c);
        double *rq = tu_alloc(sizeof(double) * (size_t)c.nq), *rk = tu_alloc(sizeof(double) * (size_t)c.nk);
        double *rv = tu_alloc(sizeof(double) * (size_t)c.nv);
        double *rb = c.bias ? tu_alloc(sizeof(double) * (size_t)c.nbias) : NULL;
        fa_ref_backward_dbias(&c.p, &a, rq, rk, rv, rb);
        double eq = fd_error(&c, c.q, c.nq, rq), ek = fd_error(&c, c.k, c.nk, rk), ev = fd_error(&c, c.v, c.nv, rv);
        double eb = rb ? fd_error(&c, c.bias, c.nbias, rb) : 0.0;
        /* truncation h^2 f''' ~ 1e-12, cancellation eps_64 |L| / h ~ 1e-10: 1e-6 is loose */
        const int ok = eq <= 1e-6 && ek <= 1e-6 && ev <= 1e-6 && eb <= 1e-6;
        printf("%s reference vs central differences, %s: dq %.1e dk %.1e dv %.1e", ok ? "PASS" : "FAIL",
               cfg[k].name, eq, ek, ev);
        if (rb) printf(" dbias %.1e (bias [%lld, %lld, %s, Sk], bias_scale 0.75)", eb, (long long)c.p.bias_batch,
                       (long long)c.p.bias_heads, c.p.bias_seq_q == 1 ? "1" : "Sq");
        printf("\n");
        failures += !ok;
        free(rb);
        free(rq);
        free(rk);
        free(rv);
        case_free(&c);
    }
}

/* ---- (b) randomized cases ---------------------------------------------------------------- */

/* A random set of options for the long run: each feature on or off independently (-inf
 * entries and broadcasting only with a bias). */
static int random_mask(uint64_t *rng) {
    int m = (int)tu_int(rng, 0, 511);
    if (!(m & M_BIAS)) m &= ~(M_NEGINF | M_BCAST);
    return m;
}

/* count cases; 0: the fixed sweep (every listed mask in every dtype, once: the saved
 * forward from the reference or, alternately, the kernel). A count (the
 * long run, FA_CHECK_CASES) draws every option at random, and half the shapes from any
 * size up to the grid's largest (odd sizes included), not only the grid. */
static void test_random(uint64_t *rng, int count, int only) {
    static const int masks[] = {
        0, M_CAUSAL, M_WINDOW, M_SEG, M_BIAS, M_ALIBI, M_SOFTCAP, M_CAUSAL | M_WINDOW,
        M_CAUSAL | M_SEG | M_ALIBI, M_WINDOW | M_BIAS | M_SOFTCAP,
        M_CAUSAL | M_BIAS | M_NEGINF | M_SOFTCAP | M_ALIBI,
        M_CAUSAL | M_WINDOW | M_SEG | M_BIAS | M_ALIBI | M_SOFTCAP,
        M_SCALE, M_SCALE | M_SOFTCAP | M_ALIBI | M_BIAS, M_SCALE | M_CAUSAL | M_WINDOW | M_SEG,
    };
    static const int64_t seqs[] = {1, 7, 37, 128, 129, 300}, dims[] = {8, 40, 64, 80, 128, 256};
    static const int64_t heads[][2] = {{1, 1}, {2, 2}, {4, 1}, {8, 2}}; /* MQA, GQA 4:1 */
    static const int64_t blocks[] = {0, 0, 16, 32, 33, 128};
    static const fa_dtype types[] = {FA_F32, FA_F16, FA_BF16};
    const int nmask = (int)(sizeof masks / sizeof masks[0]);
    const int total = count ? count : 3 * nmask;
    int passed = 0;
    for (int n = 0; n < total; n++) {
        fa_problem p;
        fa_problem_init(&p);
        p.dtype = count ? types[tu_int(rng, 0, 2)] : types[n % 3];
        const int mask = count ? random_mask(rng) : masks[n / 3 % nmask];
        const int odd = count && tu_int(rng, 0, 1);
        /* a few million multiply-adds of the reference per case keep the run short */
        do {
            const int hc = (int)tu_int(rng, 0, 3);
            p.heads_q = heads[hc][0], p.heads_kv = heads[hc][1];
            p.batch = tu_int(rng, 1, 2);
            p.seq_q = seqs[tu_int(rng, 0, 5)], p.seq_k = seqs[tu_int(rng, 0, 5)];
            p.head_dim = dims[tu_int(rng, 0, 5)], p.head_dim_v = dims[tu_int(rng, 0, 5)];
            if (odd) {
                p.seq_q = tu_int(rng, 1, 300), p.seq_k = tu_int(rng, 1, 300);
                p.head_dim = tu_int(rng, 1, 256), p.head_dim_v = tu_int(rng, 1, 256);
            }
        } while (p.batch * p.heads_q * p.seq_q * p.seq_k * (p.head_dim + p.head_dim_v) > 25000000);
        tcase c;
        case_init(&c, &p, mask, rng, 1);
        const int64_t bq0 = blocks[tu_int(rng, 0, 5)], bk0 = blocks[tu_int(rng, 0, 5)];
        const int kernel_draw = (int)tu_int(rng, 0, 1);
        if (only >= 0 && n != only) { /* replaying one case: draw the others, run nothing */
            case_free(&c);
            continue;
        }
        fa_plan *pl = check_plan(&c.p, 2, bq0, bk0);
        if (pl) {
            int64_t bq, bk;
            fa_plan_blocks(pl, FA_BACKWARD, &bq, &bk);
            /* the saved o and lse: the reference forward's or the kernel's, alternating */
            const int kernel_fwd = count ? kernel_draw : (n + n / 3) % 2;
            if (kernel_fwd ? !case_forward_kernel(&c, pl) : (case_forward_ref(&c, pl), 0)) {
                fa_plan_destroy(pl);
                case_free(&c);
                continue;
            }
            char label[256];
            snprintf(label, sizeof label,
                     "#%d %-4s %s B=%lld H=%lld/%lld S=%lld/%lld D=%lld/%lld tile %lldx%lld%s%s%s%s%s%s (win %lld,%lld)",
                     n, fa_dtype_name(p.dtype), kernel_fwd ? "fwd=kernel" : "fwd=ref", (long long)p.batch, (long long)p.heads_q, (long long)p.heads_kv,
                     (long long)p.seq_q, (long long)p.seq_k, (long long)p.head_dim, (long long)p.head_dim_v,
                     (long long)bq, (long long)bk, mask & M_CAUSAL ? " causal" : "", mask & M_WINDOW ? " window" : "",
                     mask & M_SEG ? " seg" : "", mask & M_BIAS ? (mask & M_NEGINF ? " bias(-inf)" : " bias") : "",
                     mask & M_ALIBI ? " alibi" : "", mask & M_SOFTCAP ? " softcap" : "",
                     (long long)c.p.window_left, (long long)c.p.window_right);
            if (mask & M_SCALE) {
                const size_t len = strlen(label);
                snprintf(label + len, sizeof label - len, " scale %.4g", (double)c.p.scale);
            }
            if (mask & M_SOFTCAP) {
                const size_t len = strlen(label);
                snprintf(label + len, sizeof label - len, " cap %.4g", (double)c.p.softcap);
            }
            if (c.p.has_diag_offset) {
                const size_t len = strlen(label);
                snprintf(label + len, sizeof label - len, " diag %lld", (long long)c.p.diag_offset);
            }
            passed += !run_and_compare(&c, pl, label);
            fa_plan_destroy(pl);
        }
        case_free(&c);
    }
    if (only >= 0) printf("%s random case #%d (FA_CHECK_ONLY) of %d\n", passed ? "PASS" : "FAIL", only, total);
    else printf("%s random cases: %d of %d passed\n", passed == total ? "PASS" : "FAIL", passed, total);
}

/* ---- (f) non-default scales with softcap, ALiBi and bias together, every tensor a strided
 * view (dq, dk, dv written through the same views as q, k, v) ------------------------------- */

static void test_scale_views(uint64_t *rng) {
    static const fa_dtype types[] = {FA_F32, FA_F16, FA_BF16};
    static const int masks[] = {M_SCALE, M_SCALE | M_SOFTCAP | M_ALIBI | M_BIAS,
                                M_SCALE | M_SOFTCAP | M_ALIBI | M_BIAS | M_CAUSAL | M_WINDOW};
    for (int n = 0; n < 9; n++) {
        fa_problem p;
        fa_problem_init(&p);
        p.dtype = types[n % 3];
        p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 45, p.seq_k = 70, p.head_dim = 40, p.head_dim_v = 24;
        tcase c;
        case_init(&c, &p, masks[n / 3], rng, 2);
        if (n == 0) c.p.scale = 1.0f; /* the Pallas default */
        fa_plan *pl = check_plan(&c.p, 2, 16, 32);
        if (pl) {
            if (n % 2 ? case_forward_kernel(&c, pl) : (case_forward_ref(&c, pl), 1)) {
                char label[160];
                snprintf(label, sizeof label, "%-4s scale %.4g%s%s, strided views of q k v o do dq dk dv",
                         fa_dtype_name(p.dtype), (double)c.p.scale, n >= 3 ? " softcap alibi bias" : "",
                         n >= 6 ? " causal window" : "");
                run_and_compare(&c, pl, label);
            }
            fa_plan_destroy(pl);
        }
        case_free(&c);
    }
}

/* ---- (c) rows that see no key --------------------------------------------------------------- */

static void test_dead_rows(uint64_t *rng) {
    static const fa_dtype types[] = {FA_F32, FA_BF16};
    for (int t = 0; t < 2; t++) {
        /* causal with Sq > Sk: the first Sq - Sk rows see nothing; segment id 3 (no key has
         * it) and a bias row of -inf kill more */
        fa_problem p;
        fa_problem_init(&p);
        p.dtype = types[t];
        p.batch = 2, p.heads_q = 2, p.heads_kv = 1, p.seq_q = 50, p.seq_k = 20, p.head_dim = 16, p.head_dim_v = 24;
        tcase c;
        case_init(&c, &p, M_CAUSAL | M_SEG | M_BIAS | M_NEGINF, rng, 1);
        fa_plan *pl = check_plan(&c.p, 2, 16, 8);
        if (!pl) { case_free(&c); continue; }
        case_forward_ref(&c, pl);
        char label[64];
        snprintf(label, sizeof label, "%s rows with no visible key", fa_dtype_name(p.dtype));
        run_and_compare(&c, pl, label);
        const fa_problem *rp = fa_plan_problem(pl);
        int64_t dead = 0, nonzero = 0;
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t h = 0; h < p.heads_q; h++)
                for (int64_t i = 0; i < p.seq_q; i++) {
                    if (c.lse[(b * p.heads_q + h) * p.seq_q + i] != -INFINITY) continue;
                    dead++;
                    for (int64_t d = 0; d < p.head_dim; d++) {
                        float g = chk_load(p.dtype, c.dq, chk_offset(&rp->q_stride, b, h, i, d));
                        if (g != 0.0f) nonzero++; /* NaN included */
                    }
                }
        CHECK(dead >= p.batch * p.heads_q * (p.seq_q - p.seq_k), "only %lld dead rows", (long long)dead);
        CHECK(nonzero == 0, "%s: %lld dq elements of dead rows are not 0", fa_dtype_name(p.dtype), (long long)nonzero);
        fa_plan_destroy(pl);
        case_free(&c);
    }
}

/* ---- (c2) a saturated softcap ----------------------------------------------------------
 * softcap 1, scale 1, and q, k in [0.9, 1.1] over 8 dims: every score sits near 8, where
 * sech^2 ~ 5e-7 and 1 - tanh^2 in f32 keeps no correct digit. dq and dk are that small
 * too, so they are held to the f32 bound relative to themselves (no noise floor: dS does
 * not cancel here, p being nearly uniform); the f32 1 - tanh^2 missed it by far. */
static void test_softcap_saturated(uint64_t *rng) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seq_q = 40, p.seq_k = 70, p.head_dim = 8;
    tcase c;
    case_init(&c, &p, M_SOFTCAP, rng, 0);
    c.p.softcap = 1.0f, c.p.has_scale = 1, c.p.scale = 1.0f;
    for (int64_t i = 0; i < c.nq; i++) ((float *)c.q)[i] = (float)(0.9 + 0.2 * rnd01(rng));
    for (int64_t i = 0; i < c.nk; i++) ((float *)c.k)[i] = (float)(0.9 + 0.2 * rnd01(rng));
    fa_plan *pl = check_plan(&c.p, 2, 16, 32);
    if (!pl) { case_free(&c); return; }
    case_forward_kernel(&c, pl);
    tu_poison(FA_F32, c.dq, c.nq), tu_poison(FA_F32, c.dk, c.nk), tu_poison(FA_F32, c.dv, c.nv);
    fa_backward_args a = case_bwd_args(&c);
    const fa_status st = fa_backward(pl, &a);
    double *rq = tu_alloc(sizeof(double) * (size_t)c.nq), *rk = tu_alloc(sizeof(double) * (size_t)c.nk);
    double *rv = tu_alloc(sizeof(double) * (size_t)c.nv);
    fa_ref_backward(&c.p, &a, rq, rk, rv); /* (the f32 saved o's share is ~1e-7 of dq: no correction) */
    const int before = failures;
    CHECK(st == FA_OK, "softcap saturated: fa_backward: %s", fa_last_error());
    const fa_problem *rp = fa_plan_problem(pl);
    const check_result eq = grad_check("dq", FA_F32, c.dq, c.nq, &rp->q_stride, rq, NULL, 1, 2, 40, 8);
    const check_result ek = grad_check("dk", FA_F32, c.dk, c.nk, &rp->k_stride, rk, NULL, 1, 1, 70, 8);
    const check_result ev = grad_check("dv", FA_F32, c.dv, c.nv, &rp->v_stride, rv, NULL, 1, 1, 70, 8);
    printf("%s f32 softcap 1, scale 1, scores ~8 (tanh saturated): dq %.2e dk %.2e dv %.2e of max|dq| %.1e (bound %.0e)\n",
           failures > before ? "FAIL" : "PASS", eq.err / eq.mag, ek.err / ek.mag, ev.err / ev.mag, eq.mag,
           check_tol_of(FA_F32).atol);
    free(rq), free(rk), free(rv);
    fa_plan_destroy(pl);
    case_free(&c);
}

/* ---- (d) determinism ------------------------------------------------------------------------ */

static void test_determinism(uint64_t *rng) {
    fa_problem p;
    fa_problem_init(&p);
    p.dtype = FA_BF16;
    p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 129, p.seq_k = 150, p.head_dim = 64, p.head_dim_v = 40;
    tcase c;
    case_init(&c, &p, M_CAUSAL | M_BIAS | M_BCAST | M_SOFTCAP | M_ALIBI, rng, 1);
    const int before = failures;
    const size_t es = fa_dtype_size(p.dtype);
    unsigned char *first[4] = {NULL, NULL, NULL, NULL};
    static const int threads[] = {2, 2, 1, 3};
    for (int r = 0; r < 4; r++) {
        fa_plan *pl = check_plan(&c.p, threads[r], 32, 48);
        if (!pl) break;
        if (r == 0) case_forward_ref(&c, pl);
        tu_poison(p.dtype, c.dq, c.nq);
        tu_poison(p.dtype, c.dk, c.nk);
        tu_poison(p.dtype, c.dv, c.nv);
        tu_poison(FA_F32, c.dbias, c.nbias);
        fa_backward_args a = case_bwd_args(&c);
        fa_status st = fa_backward(pl, &a);
        CHECK(st == FA_OK, "fa_backward: %s", fa_last_error());
        void *outs[4] = {c.dq, c.dk, c.dv, c.dbias};
        size_t bytes[4] = {(size_t)c.nq * es, (size_t)c.nk * es, (size_t)c.nv * es, (size_t)c.nbias * 4};
        static const char *names[4] = {"dq", "dk", "dv", "dbias"};
        for (int g = 0; g < 4; g++) {
            if (r == 0) {
                first[g] = tu_alloc(bytes[g]);
                memcpy(first[g], outs[g], bytes[g]);
            } else {
                CHECK(memcmp(first[g], outs[g], bytes[g]) == 0, "%s differs between run 1 (2 threads) and run %d (%d threads)",
                      names[g], r + 1, threads[r]);
            }
        }
        fa_plan_destroy(pl);
    }
    printf("%s bit-identical dq/dk/dv/dbias (bias [1, 1, Sq, Sk], GQA) across runs and 1, 2, 3 threads\n",
           failures > before ? "FAIL" : "PASS");
    for (int g = 0; g < 4; g++) free(first[g]);
    case_free(&c);
}

/* ---- (d2) a bias row shared by every query row (bias_seq_q 1) ---------------------------- */

/* o against the reference's o_exact (case_forward_ref), within the dtype's bound. */
static void forward_check(tcase *c, const fa_plan *pl) {
    const fa_problem *p = &c->p;
    fa_forward_args a = case_fwd_args(c);
    tu_poison(p->dtype, c->o, c->no);
    const fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "fa_forward: %s", fa_last_error());
    const int64_t dims[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim_v};
    check_tensor("o", p->dtype, c->o, &fa_plan_problem(pl)->o_stride, c->o_exact, dims, check_tol_of(p->dtype), NULL, 0);
}

/* Forward and backward (dbias summed over the query rows) against the reference, for
 * bias [B, Hq, 1, Sk], [1, Hq, 1, Sk] and [1, 1, 1, Sk], several query tiles, both
 * schedules; then bit-identical gradients across 1, 2 and 3 threads. */
static void test_bias_row(uint64_t *rng) {
    static const struct { int64_t bb, bh, sq; int mask; fa_dtype t; } cfg[] = {
        {2, 4, 100, M_CAUSAL, FA_F32}, {1, 4, 100, 0, FA_BF16}, {1, 1, 100, M_CAUSAL | M_SOFTCAP, FA_F16},
        {2, 1, 100, M_ALIBI, FA_F32}, {1, 1, 20, 0, FA_F32}, /* (the last: one query tile) */
    };
    const int before = failures;
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        fa_problem p;
        fa_problem_init(&p);
        p.dtype = cfg[k].t;
        p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = cfg[k].sq, p.seq_k = 70, p.head_dim = 32, p.head_dim_v = 24;
        p.bias_batch = cfg[k].bb, p.bias_heads = cfg[k].bh;
        tcase c;
        case_init(&c, &p, M_ASIS | M_BIAS | M_BROW | cfg[k].mask, rng, 1);
        unsigned char *first[4] = {NULL, NULL, NULL, NULL};
        static const int threads[] = {2, 1, 3};
        for (int r = 0; r < 3; r++) {
            fa_plan *pl = check_plan(&c.p, threads[r], 32, 32);
            if (!pl) break;
            if (r == 0) {
                case_forward_ref(&c, pl);
                forward_check(&c, pl);
                case_forward_ref(&c, pl);
                char label[96];
                snprintf(label, sizeof label, "bias [%lld, %lld, 1, Sk] %s", (long long)cfg[k].bb, (long long)cfg[k].bh,
                         fa_dtype_name(p.dtype));
                run_and_compare(&c, pl, label);
            } else {
                tu_poison(FA_F32, c.dbias, c.nbias);
                tu_poison(p.dtype, c.dq, c.nq);
                fa_backward_args a = case_bwd_args(&c);
                CHECK(fa_backward(pl, &a) == FA_OK, "fa_backward: %s", fa_last_error());
            }
            int64_t past = 0;
            for (int64_t x = c.nbias; x < c.nbias + 64; x++) past += !isnan(c.dbias[x]);
            CHECK(past == 0, "bias row: %lld floats past dbias's end were written", (long long)past);
            const size_t es = fa_dtype_size(p.dtype);
            void *outs[4] = {c.dq, c.dk, c.dv, c.dbias};
            const size_t bytes[4] = {(size_t)c.nq * es, (size_t)c.nk * es, (size_t)c.nv * es, (size_t)c.nbias * 4};
            for (int g = 0; g < 4; g++) {
                if (r == 0) first[g] = memcpy(tu_alloc(bytes[g]), outs[g], bytes[g]);
                else CHECK(memcmp(first[g], outs[g], bytes[g]) == 0, "bias row: output %d differs on %d threads", g, threads[r]);
            }
            fa_plan_destroy(pl);
        }
        for (int g = 0; g < 4; g++) free(first[g]);
        case_free(&c);
    }
    fa_problem bad;
    fa_problem_init(&bad);
    bad.batch = 1, bad.heads_q = 1, bad.seq_q = 4, bad.seq_k = 4, bad.head_dim = 8, bad.has_bias = 1, bad.bias_seq_q = 2;
    fa_plan *none = NULL;
    const fa_status st = fa_plan_create(&bad, NULL, &none);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "bias seq_q"), "bias_seq_q 2 of seq_q 4: got %s \"%s\"",
          fa_status_string(st), fa_last_error());
    printf("%s bias broadcast over the query rows (bias_seq_q 1): o, dq, dk, dv, dbias vs the reference; "
           "bit-identical on 1, 2, 3 threads\n", failures > before ? "FAIL" : "PASS");
}

/* ---- (e) bad arguments; the caller's workspace ---------------------------------------------- */

static void test_bad_args(uint64_t *rng) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = 33, p.seq_k = 40, p.head_dim = 16;
    tcase c;
    case_init(&c, &p, M_CAUSAL, rng, 0);
    const int before = failures;
    fa_plan *pl = check_plan(&c.p, 2, 0, 0);
    if (!pl) { case_free(&c); return; }
    case_forward_ref(&c, pl);
    fa_backward_args a;
    struct { const char *name; fa_status want; } cases[] = {
        {"do", FA_ERR_NULL}, {"lse", FA_ERR_NULL}, {"dq", FA_ERR_NULL}, {"workspace_size", FA_ERR_INVALID}};
    fa_cost cost;
    fa_plan_cost(pl, FA_BACKWARD, &cost);
    void *ws = tu_alloc((size_t)cost.workspace_bytes);
    for (int i = 0; i < 4; i++) {
        a = case_bwd_args(&c);
        if (i == 0) a.d_o = NULL;
        if (i == 1) a.lse = NULL;
        if (i == 2) a.dq = NULL;
        if (i == 3) a.workspace = ws, a.workspace_size = (size_t)cost.workspace_bytes - 1;
        fa_status st = fa_backward(pl, &a);
        CHECK(st == cases[i].want && strstr(fa_last_error(), cases[i].name),
              "bad %s: got %s \"%s\", want %s naming it", cases[i].name, fa_status_string(st), fa_last_error(),
              fa_status_string(cases[i].want));
    }
    /* exactly workspace_bytes is enough, and gives the same bits as the library's own */
    const size_t bytes = (size_t)c.nq * 4;
    a = case_bwd_args(&c);
    CHECK(fa_backward(pl, &a) == FA_OK, "%s", fa_last_error());
    float *own = tu_alloc(bytes);
    memcpy(own, c.dq, bytes);
    tu_poison(FA_F32, c.dq, c.nq);
    a.workspace = ws, a.workspace_size = (size_t)cost.workspace_bytes;
    CHECK(fa_backward(pl, &a) == FA_OK, "workspace of exactly workspace_bytes: %s", fa_last_error());
    CHECK(memcmp(own, c.dq, bytes) == 0, "dq differs with the caller's workspace");
    /* a plan with bias_grad needs dbias */
    tcase cb;
    case_init(&cb, &p, M_BIAS, rng, 0);
    fa_plan *pb = check_plan(&cb.p, 2, 0, 0);
    if (pb) {
        case_forward_ref(&cb, pb);
        fa_backward_args ab = case_bwd_args(&cb);
        ab.dbias = NULL;
        const fa_status st = fa_backward(pb, &ab);
        CHECK(st == FA_ERR_NULL && strstr(fa_last_error(), "dbias"), "NULL dbias: got %s \"%s\"", fa_status_string(st),
              fa_last_error());
        fa_plan_destroy(pb);
    }
    case_free(&cb);
    printf("%s bad arguments rejected (NULL do, lse, dq, dbias; workspace_size too small)\n",
           failures > before ? "FAIL" : "PASS");
    free(own);
    free(ws);
    fa_plan_destroy(pl);
    case_free(&c);
}

/* ---- (g) the shared case list (cases.h) -------------------------------------------------- */

static void test_case_list(uint64_t *rng) {
    int passed = 0;
    for (int n = 0; n < FA_CASE_COUNT; n++) {
        const fa_case *f = &FA_CASES[n];
        const fa_problem p = fa_case_problem(f);
        const int mask = M_ASIS | (f->alibi ? M_ALIBI : 0) | (f->seg ? M_SEG : 0) | (f->bias ? M_BIAS : 0) |
                         (f->bias == 1 ? M_NEGINF : 0);
        tcase c;
        case_init(&c, &p, mask, rng, f->layout ? 2 : 0);
        fa_plan *pl = check_plan(&c.p, 2, 0, 0);
        if (pl) {
            /* the saved forward outputs from the reference for half the rows, the kernel for the rest */
            if (n % 2 ? case_forward_kernel(&c, pl) : (case_forward_ref(&c, pl), 1)) {
                char label[96];
                snprintf(label, sizeof label, "case list #%d %s", n, f->name);
                passed += !run_and_compare(&c, pl, label);
            }
            fa_plan_destroy(pl);
        }
        case_free(&c);
    }
    printf("%s case list: %d of %d passed\n", passed == FA_CASE_COUNT ? "PASS" : "FAIL", passed, FA_CASE_COUNT);
}

int main(void) {
    uint64_t rng = check_seed("test_backward");
    const int count = tu_check_cases(); /* FA_CHECK_CASES: the long run's count; 0 the fixed sweep */
    if (count) { /* the long run: random cases only, one line each for failures */
        bc_quiet = 1;
        const char *one = getenv("FA_CHECK_ONLY"); /* replays case #n of the run alone */
        test_random(&rng, count, one && *one ? atoi(one) : -1);
        return check_finish("test_backward");
    }
    test_reference_gradients(&rng);
    test_case_list(&rng);
    test_random(&rng, 0, -1);
    test_scale_views(&rng);
    test_dead_rows(&rng);
    test_softcap_saturated(&rng);
    test_determinism(&rng);
    test_bias_row(&rng);
    test_bad_args(&rng);
    return check_finish("test_backward");
}
