/* Tests internals on purpose besides the public API: the ISA tables (cpu/isa.h) and vexp.h.
 * The forward's small contracts, apart from its accuracy grid (test_forward.c): the
 * vectorized exp against libm, p rounded to the dtype before P V (docs/semantics.md), argument
 * errors (NULL pointers, workspace_size), the FA_ISA switch and progress callbacks. */
#include "check.h"

#include "cpu/isa.h"
#include "cpu/vexp.h"

/* ---- the vectorized exp ----------------------------------------------------------- */

static void test_vexp(void) {
    double worst = 0;
    float at = 0;
    for (int i = 0; i <= 200000; i++) {
        const float x = -87.0f + 87.5f * (float)i / 200000.0f;
        const double want = exp((double)x), got = fa_vexpf(x);
        const double e = fabs(got - want) / want;
        if (e > worst) worst = e, at = x;
    }
    int ok = worst < 2e-7;
    ok &= fa_vexpf(-INFINITY) == 0.0f && fa_vexpf(-1e4f) == 0.0f && fa_vexpf(-88.5f) == 0.0f;
    ok &= fa_vexpf(0.0f) == 1.0f && isnan(fa_vexpf(NAN)) && fa_vexpf(1e4f) == INFINITY;
    printf("vexp       max rel err %.2e at x=%g on [-87, 0.5]; -inf, -1e4 -> 0, NaN -> NaN: %s\n", worst, (double)at,
           ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

/* ---- p is rounded to the dtype before P V (docs/semantics.md) ----------------------
 * One query, two keys with scores 0 and -d, values +1 and -1: o = (p0 - p1) / l with
 * p0 = 1 and p1 = exp(-d). d is chosen so that exp(-d) rounds to 1 in the dtype (f16:
 * d = 2^-13, above the midpoint 1 - 2^-12; bf16: d = 2^-10, above 1 - 2^-9), so a
 * kernel that rounds p gets o = 0 exactly, one that does not gets tanh(d/2) != 0. */
static void test_p_rounding(void) {
    const fa_dtype dts[3] = {FA_F32, FA_F16, FA_BF16};
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        const fa_dtype dt = dts[t];
        const float d = dt == FA_F16 ? 0x1p-13f : 0x1p-10f;
        fa_problem p;
        fa_problem_init(&p);
        p.batch = p.heads_q = 1, p.seq_q = 1, p.seq_k = 2, p.head_dim = 1, p.dtype = dt;
        p.has_scale = 1, p.scale = 1.0f;
        uint16_t q[1], k[2], v[2], o[1];
        float qf[1] = {1}, kf[2] = {0, -d}, vf[2] = {1, -1}, of[1] = {NAN};
        void *qq = qf, *kk = kf, *vv = vf, *oo = of;
        if (dt != FA_F32) {
            chk_store(dt, q, 0, 1), chk_store(dt, k, 0, 0), chk_store(dt, k, 1, -d);
            chk_store(dt, v, 0, 1), chk_store(dt, v, 1, -1), chk_store(dt, o, 0, NAN);
            qq = q, kk = k, vv = v, oo = o;
        }
        fa_options opt = {FA_BACKEND_CPU, 1, 0, 0};
        fa_plan *plan = NULL;
        fa_status st = fa_plan_create(&p, &opt, &plan);
        if (!st) st = fa_forward(plan, &(fa_forward_args){.q = qq, .k = kk, .v = vv, .o = oo});
        fa_plan_destroy(plan);
        const double got = st ? NAN : chk_load(dt, oo, 0), want = dt == FA_F32 ? tanh(d / 2.0) : 0.0;
        const int good = dt == FA_F32 ? fabs(got - want) <= 1e-3 * want : got == 0.0;
        if (!good) {
            ok = 0;
            printf("FAIL p rounding, %s: o = %.9g, want %.9g (status %d)\n", fa_dtype_name(dt), got, want, st);
        }
    }
    /* fa_vround_f16 (the driver's fast rounding) == fa_round_to(FA_F16) around every f16
     * value (exact, midpoints, neighbours) and on a spread of all f32 bit patterns */
    long checked = 0, wrong = 0;
    float first_bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const float f = fa_f16_to_f32((uint16_t)h);
        const float nx = fa_f16_to_f32((uint16_t)(h + 1));
        uint32_t fb;
        memcpy(&fb, &f, 4);
        float cand[6] = {f, (f + nx) / 2, nextafterf(f, INFINITY), nextafterf(f, -INFINITY),
                         nextafterf((f + nx) / 2, INFINITY), nextafterf((f + nx) / 2, -INFINITY)};
        for (int c = 0; c < 6; c++) {
            const float x = cand[c], want = fa_round_to(FA_F16, x), got = fa_vround_f16(x);
            checked++;
            if (!(got == want || (isnan(got) && isnan(want))) || signbit(got) != signbit(want)) {
                if (!wrong) first_bad = x;
                wrong++;
            }
        }
    }
    for (uint64_t b = 0; b < 0x100000000ull; b += 4099) {
        const uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, 4);
        const float want = fa_round_to(FA_F16, x), got = fa_vround_f16(x);
        checked++;
        if (!(got == want || (isnan(got) && isnan(want))) || signbit(got) != signbit(want)) {
            if (!wrong) first_bad = x;
            wrong++;
        }
    }
    if (wrong) {
        ok = 0;
        printf("FAIL fa_vround_f16 differs from fa_round_to on %ld of %ld values (first %a)\n", wrong, checked,
               (double)first_bad);
    }
    printf("rounding   p rounded to f16/bf16 before P V; fa_vround_f16 exact on %ld values: %s\n", checked,
           ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

/* ---- errors and the ISA switch ---------------------------------------------------- */


static void test_errors(void) {
    const int before = failures;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = 9, p.seq_k = 11, p.head_dim = 8;
    p.has_bias = 1, p.has_alibi = 1, p.has_segment_ids = 1;
    fa_options opt = {FA_BACKEND_CPU, 2, 4, 4};
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(&p, &opt, &plan);
    CHECK(st == FA_OK, "plan: %s", fa_last_error());
    if (st != FA_OK) return;
    float q[2 * 9 * 8] = {0}, k[2 * 11 * 8] = {0}, v[2 * 11 * 8] = {0}, o[2 * 9 * 8], bias[9 * 11] = {0}, sl[2] = {0};
    int32_t qs[9] = {0}, ks[11] = {0};
    fa_forward_args good = {.q = q, .k = k, .v = v, .o = o, .bias = bias, .alibi_slopes = sl, .q_segment_ids = qs,
                            .kv_segment_ids = ks};
    struct {
        const char *name;
        fa_forward_args a;
    } bad[6];
    for (int i = 0; i < 6; i++) bad[i].a = good;
    bad[0].name = "q", bad[0].a.q = NULL;
    bad[1].name = "o", bad[1].a.o = NULL;
    bad[2].name = "bias", bad[2].a.bias = NULL;
    bad[3].name = "alibi_slopes", bad[3].a.alibi_slopes = NULL;
    bad[4].name = "kv_segment_ids", bad[4].a.kv_segment_ids = NULL;
    bad[5].name = "v", bad[5].a.v = NULL;
    for (int i = 0; i < 6; i++) {
        st = fa_forward(plan, &bad[i].a);
        CHECK(st == FA_ERR_NULL && strstr(fa_last_error(), bad[i].name), "NULL %s: status %d, message \"%s\"",
               bad[i].name, st, fa_last_error());
    }
    /* the caller's workspace: exactly workspace_bytes, misaligned by a byte (the driver
     * aligns within its slack), is enough and nothing past it is written; a byte less is
     * refused naming workspace_size */
    check_pass_workspace("forward, caller's workspace", plan, &good, NULL);
    fa_plan_destroy(plan);

    /* the ISA switch */
    const char *saved = getenv("FA_ISA");
    char keep[64] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    const fa_isa *isa = NULL;
    setenv("FA_ISA", "no-such-isa", 1);
    st = fa_isa_select(&isa);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "no-such-isa"), "FA_ISA unknown: %d \"%s\"", st,
           fa_last_error());
    CHECK(strcmp(fa_cpu_isa(), "none") == 0, "fa_cpu_isa with a bad FA_ISA: %s", fa_cpu_isa());
    st = fa_plan_create(&p, &opt, &plan);
    CHECK(st == FA_ERR_INVALID && plan == NULL, "plan with a bad FA_ISA: %d", st);
    setenv("FA_ISA", "scalar", 1);
    st = fa_isa_select(&isa);
    CHECK(st == FA_OK && isa == &fa_isa_scalar, "FA_ISA=scalar: %d", st);
    CHECK(strcmp(fa_cpu_isa(), "scalar") == 0, "fa_cpu_isa: %s", fa_cpu_isa());
    unsetenv("FA_ISA");
    st = fa_isa_select(&isa);
    CHECK(st == FA_OK && isa->available(), "best ISA: %d", st);
    const char *best = isa->name;
    /* where avx512bf16 runs and amx does not, the auto choice passes it over on Intel's cores,
     * whose vdpbf16ps is slower than f32 multiply-adds, and takes it elsewhere (dispatch.c) */
    setenv("FA_ISA", "avx512bf16", 1);
    const fa_isa *bf16_isa = NULL;
    if (fa_isa_select(&bf16_isa) == FA_OK && strcmp(best, "amx") != 0) {
        const int intel = __builtin_cpu_is("intel");
        CHECK(strcmp(best, intel ? "avx512" : "avx512bf16") == 0, "auto ISA on %s: %s", intel ? "Intel" : "non-Intel",
              best);
    }
    unsetenv("FA_ISA");
    if (keep[0]) setenv("FA_ISA", keep, 1);
    printf("errors     NULL pointers, workspace_size, FA_ISA: %s (best ISA here: %s, in use: %s)\n",
           failures == before ? "ok" : "FAIL", best, fa_cpu_isa());
}

/* A feature's tensor passed to a plan without the feature was ignored: a bias without
 * has_bias, sinks without has_sinks, dbias without bias_grad ran as if they were not there
 * (a forgotten flag gave a silently different answer). Each is refused naming the tensor
 * and the flag, before anything is written. */
static void test_unused_tensors(void) {
    const int before = failures;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = 9, p.seq_k = 11, p.head_dim = 8;
    fa_plan *plan = NULL;
    fa_options opt = {FA_BACKEND_CPU, 1, 0, 0};
    CHECK(fa_plan_create(&p, &opt, &plan) == FA_OK, "plan: %s", fa_last_error());
    if (!plan) return;
    float q[2 * 9 * 8], k[2 * 11 * 8], v[2 * 11 * 8], o[2 * 9 * 8], lse[2 * 9], g[2 * 9 * 8], d[3][2 * 11 * 8];
    float any[9 * 11 * 8] = {0};
    int32_t ids[11] = {0};
    for (int i = 0; i < 2 * 11 * 8; i++) k[i] = v[i] = 0.01f * (float)(i % 17), q[i % (2 * 9 * 8)] = 0.02f * (float)(i % 5);
    for (int i = 0; i < 2 * 9 * 8; i++) g[i] = 0.5f;
    const struct {
        const char *name, *flag;
    } fwd[] = {{"bias", "has_bias"}, {"alibi_slopes", "has_alibi"}, {"q_segment_ids", "has_segment_ids"},
               {"kv_segment_ids", "has_segment_ids"}, {"k_new", "has_new_kv"}, {"v_new", "has_new_kv"},
               {"block_table", "page_size"}, {"sinks", "has_sinks"}, {"k_prefix", "shared_prefix_len"},
               {"v_prefix", "shared_prefix_len"}, {"k_scale", "cache_dtype"}, {"v_scale", "cache_dtype"}};
    for (size_t t = 0; t < sizeof fwd / sizeof fwd[0]; t++) {
        fa_forward_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
        switch (t) {
        case 0: a.bias = any; break;
        case 1: a.alibi_slopes = any; break;
        case 2: a.q_segment_ids = ids; break;
        case 3: a.kv_segment_ids = ids; break;
        case 4: a.k_new = any; break;
        case 5: a.v_new = any; break;
        case 6: a.block_table = ids; break;
        case 7: a.sinks = any; break;
        case 8: a.k_prefix = any; break;
        case 9: a.v_prefix = any; break;
        case 10: a.k_scale = any; break;
        default: a.v_scale = any; break;
        }
        tu_poison(FA_F32, o, 2 * 9 * 8);
        const fa_status st = fa_forward(plan, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), fwd[t].name) && strstr(fa_last_error(), fwd[t].flag),
              "forward with %s and no %s: status %d, \"%s\"", fwd[t].name, fwd[t].flag, st, fa_last_error());
        CHECK(isnan(o[0]) && isnan(o[2 * 9 * 8 - 1]), "forward with %s and no %s wrote o", fwd[t].name, fwd[t].flag);
    }
    fa_forward_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    CHECK(fa_forward(plan, &a) == FA_OK, "forward: %s", fa_last_error());
    const char *bwd[][2] = {{"bias", "has_bias"}, {"dbias", "bias_grad"}, {"sinks", "has_sinks"},
                            {"dsink", "has_sinks"}, {"alibi_slopes", "has_alibi"}};
    for (size_t t = 0; t < sizeof bwd / sizeof bwd[0]; t++) {
        fa_backward_args b = {.q = q, .k = k, .v = v, .o = o, .d_o = g, .lse = lse, .dq = d[0], .dk = d[1], .dv = d[2]};
        if (t == 0) b.bias = any;
        if (t == 1) b.dbias = any;
        if (t == 2) b.sinks = any;
        if (t == 3) b.dsink = any;
        if (t == 4) b.alibi_slopes = any;
        tu_poison(FA_F32, d[0], 2 * 9 * 8);
        const fa_status st = fa_backward(plan, &b);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), bwd[t][0]) && strstr(fa_last_error(), bwd[t][1]),
              "backward with %s and no %s: status %d, \"%s\"", bwd[t][0], bwd[t][1], st, fa_last_error());
        CHECK(isnan(d[0][0]), "backward with %s and no %s wrote dq", bwd[t][0], bwd[t][1]);
    }
    fa_plan_destroy(plan);
    printf("unused     a feature's tensors without the feature refused: %s\n", failures == before ? "ok" : "FAIL");
}

/* ---- outputs that share memory with inputs ------------------------------------------
 * o over k or v gave wrong values that depend on the tiles (o over q happened to work):
 * an output whose bytes meet an input's is refused naming both, before anything is
 * written; an output right after an input in one buffer is fine, and so is nothing else
 * (docs/semantics.md, "Tensors and heads"). */

static void test_overlaps(uint64_t *rng) {
    const int before = failures;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = 40, p.seq_k = 40, p.head_dim = 16, p.has_bias = 1;
    fa_options opt = {FA_BACKEND_CPU, 2, 0, 0};
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(&p, &opt, &plan);
    CHECK(st == FA_OK, "overlaps: plan: %s", fa_last_error());
    if (st != FA_OK) return;
    const int64_t n = 2 * 40 * 16, nb = 40 * 40, nl = 2 * 40; /* q, k, v and o; bias; lse */
    /* q then o then lse in one buffer, adjacent; k, v, bias apart (with room for an lse
     * put over its last element, so that a call that is not refused stays in bounds) */
    float *qol = tu_alloc(sizeof(float) * (size_t)(2 * n + nl)), *k = tu_alloc(sizeof(float) * (size_t)n);
    float *v = tu_alloc(sizeof(float) * (size_t)n), *bias = tu_alloc(sizeof(float) * (size_t)(nb + nl));
    float *q = qol, *o = qol + n, *lse = qol + 2 * n, *saved = tu_alloc(sizeof(float) * (size_t)n);
    tu_fill(rng, FA_F32, q, n, 1.0), tu_fill(rng, FA_F32, k, n, 1.0), tu_fill(rng, FA_F32, v, n, 1.0);
    tu_fill(rng, FA_F32, bias, nb, 1.0);
    const fa_forward_args good = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .bias = bias};
    CHECK(fa_forward(plan, &good) == FA_OK, "o and lse right after q in one buffer: %s", fa_last_error());
    struct {
        const char *out, *in;
        float *at, *over; /* the input the output is put over, and where */
    } bad[] = {{"o", "k", k, k}, {"o", "v", v, v}, {"o", "q", q, q + 16}, {"lse", "bias", bias, bias + nb - 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fa_forward_args a = good;
        if (bad[i].out[0] == 'o') a.o = bad[i].over;
        else a.lse = bad[i].over;
        const int64_t keep = bad[i].at == bias ? nb : n;
        memcpy(saved, bad[i].at, sizeof(float) * (size_t)(keep < n ? keep : n));
        st = fa_forward(plan, &a);
        char want_out[16], want_in[24];
        snprintf(want_out, sizeof want_out, "%s (bytes", bad[i].out);
        snprintf(want_in, sizeof want_in, "overlaps %s (bytes", bad[i].in);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), want_out) && strstr(fa_last_error(), want_in),
              "%s over %s: status %d, message \"%s\"", bad[i].out, bad[i].in, st, fa_last_error());
        CHECK(!memcmp(saved, bad[i].at, sizeof(float) * (size_t)(keep < n ? keep : n)),
              "%s over %s: the refused call wrote", bad[i].out, bad[i].in);
    }
    /* the caller's workspace and the counts are written too: over k (an input) or o (an
     * output) they are refused, k left as it was (a workspace over k once ran and overwrote it) */
    fa_cost cost;
    fa_plan_cost(plan, FA_FORWARD, &cost);
    float *big = tu_alloc((size_t)cost.workspace_bytes + sizeof(float) * (size_t)n);
    memcpy(big, k, sizeof(float) * (size_t)n);
    for (int i = 0; i < 3; i++) {
        fa_forward_args a = good;
        a.k = big; /* k at the start of a buffer big enough for the workspace too */
        if (i == 0) a.workspace = big, a.workspace_size = (size_t)cost.workspace_bytes;
        if (i == 1) a.workspace = (char *)o - 64, a.workspace_size = (size_t)cost.workspace_bytes;
        if (i == 2) a.counts = (fa_counts *)(void *)(big + 4);
        memcpy(saved, big, sizeof(float) * (size_t)n);
        st = fa_forward(plan, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), i == 2 ? "counts" : "workspace") &&
                  !memcmp(saved, big, sizeof(float) * (size_t)n),
              "workspace case %d: status %d \"%s\", or k changed", i, st, fa_last_error());
    }
    free(big);
    fa_plan_destroy(plan);
    /* an o stride of 0 over its rows writes every row to one address */
    p.o_stride = (fa_strides){{2 * 40 * 16, 40 * 16, 0, 1}};
    st = fa_plan_create(&p, &opt, &plan);
    CHECK(st == FA_OK, "overlaps: plan with o rows of stride 0: %s", fa_last_error());
    if (st == FA_OK) {
        st = fa_forward(plan, &good);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "o stride 2 is 0"), "o rows of stride 0: %d \"%s\"", st,
              fa_last_error());
        fa_plan_destroy(plan);
    }
    /* rows 8 elements apart but 16 wide: each row writes over half of the next */
    p.o_stride = (fa_strides){{2 * 40 * 16, 40 * 8, 8, 1}};
    st = fa_plan_create(&p, &opt, &plan);
    CHECK(st == FA_OK, "overlaps: plan with o rows overlapping: %s", fa_last_error());
    if (st == FA_OK) {
        st = fa_forward(plan, &good);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "o's strides") &&
                  strstr(fa_last_error(), "its own address"),
              "o rows overlapping: %d \"%s\"", st, fa_last_error());
        fa_plan_destroy(plan);
    }
    /* a size-1 bias dim's stride is ignored (flashattn.h), a negative one too: the same o */
    fa_problem pb;
    fa_problem_init(&pb);
    pb.batch = 1, pb.heads_q = 2, pb.seq_q = 40, pb.seq_k = 40, pb.head_dim = 16, pb.has_bias = 1;
    pb.bias_heads = 2, pb.bias_stride = (fa_strides){{-7, 40 * 40, 40, 1}};
    st = fa_plan_create(&pb, &opt, &plan);
    CHECK(st == FA_OK, "a negative stride over the bias's size-1 batch dim: %s", fa_last_error());
    fa_plan_destroy(plan);
    free(qol), free(k), free(v), free(bias), free(saved);
    printf("overlaps   o or lse over q, k, v, bias refused, nothing written; adjacent ones run: %s\n",
           failures == before ? "ok" : "FAIL");
}

/* ---- progress callbacks (forward and backward) ------------------------------------ */

typedef struct {
    int calls, monotone;
    int64_t last, total;
} progress_seen;

static void on_progress(void *ctx, int64_t done, int64_t total) {
    progress_seen *ps = ctx;
    /* reports come one thread at a time, each moving the percent forward */
    if (done <= ps->last || done > total) ps->monotone = 0;
    ps->calls++;
    ps->last = done;
    ps->total = total;
}

static void test_progress(uint64_t seed) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 3, p.seq_q = 200, p.seq_k = 150, p.head_dim = 16;
    fa_options o = {.threads = 2, .block_q = 16, .block_k = 16};
    fa_plan *plan;
    int ok = fa_plan_create(&p, &o, &plan) == FA_OK;
    size_t n = 2 * 3 * 200 * 16, nk = 2 * 3 * 150 * 16;
    float *q = tu_alloc(n * 4), *k = tu_alloc(nk * 4), *v = tu_alloc(nk * 4), *out = tu_alloc(n * 4);
    float *lse = tu_alloc(2 * 3 * 200 * 4), *dq = tu_alloc(n * 4), *dk = tu_alloc(nk * 4), *dv = tu_alloc(nk * 4);
    uint64_t s = seed;
    tu_fill(&s, FA_F32, q, (int64_t)n, 1.0);
    tu_fill(&s, FA_F32, k, (int64_t)nk, 1.0);
    tu_fill(&s, FA_F32, v, (int64_t)nk, 1.0);
    progress_seen f = {0, 1, 0, 0}, b = {0, 1, 0, 0};
    fa_forward_args fw = {.q = q, .k = k, .v = v, .o = out, .lse = lse, .progress = on_progress, .progress_ctx = &f};
    ok = ok && fa_forward(plan, &fw) == FA_OK;
    /* 2 x 3 heads x 13 query tiles = 78 items; backward 2 x 3 x 10 key tiles + 78 */
    ok = ok && f.monotone && f.calls >= 2 && f.last == 78 && f.total == 78;
    fa_backward_args bw = {.q = q, .k = k, .v = v, .o = out, .d_o = out, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                           .progress = on_progress, .progress_ctx = &b};
    ok = ok && fa_backward(plan, &bw) == FA_OK;
    ok = ok && b.monotone && b.calls >= 2 && b.last == 138 && b.total == 138;
    printf("progress   forward %d reports, last %lld/%lld; backward %d reports, last %lld/%lld: %s\n", f.calls,
           (long long)f.last, (long long)f.total, b.calls, (long long)b.last, (long long)b.total, ok ? "ok" : "FAIL");
    if (!ok) failures++;
    fa_plan_destroy(plan);
    free(q), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* A cuda plan made where no device is: its figures are there, a run says "no CUDA device"
 * (once, from the backend's supports) rather than cudart's first failing call naming an
 * argument. Skipped where the build has no CUDA or a device is present. */
static void test_cuda_plan_without_device(void) {
    if (fa_cuda_available()) return;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = p.seq_k = 64, p.head_dim = 64, p.dtype = FA_F16, p.has_alibi = 1;
    fa_options opt = {FA_BACKEND_CUDA, 0, 0, 0};
    fa_plan *pl = NULL;
    if (fa_plan_create(&p, &opt, &pl) != FA_OK) { /* a build without CUDA refuses the backend itself */
        printf("cuda plan without a device: skipped (%s)\n", fa_last_error());
        return;
    }
    fa_cost c;
    CHECK(fa_plan_cost(pl, FA_FORWARD, &c) == FA_OK && c.flops > 0, "cuda plan without a device: cost %s",
          fa_last_error());
    uint16_t *x = calloc(2 * 2 * 64 * 64, sizeof *x); /* q = k = v, then o */
    const float slopes[2] = {0.5f, 0.25f};
    fa_forward_args a = {.q = x, .k = x, .v = x, .o = x + 2 * 64 * 64, .alibi_slopes = slopes};
    const fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_ERR_BACKEND && strstr(fa_last_error(), "no CUDA device"), "cuda run without a device: %s (%s)",
          fa_status_string(st), fa_last_error());
    free(x);
    fa_plan_destroy(pl);
    printf("cuda plan without a device: figures, and a run refused (%s)\n", fa_last_error());
}

int main(void) {
    check_seed("test_forward_contracts"); /* the data of the progress test */
    test_cuda_plan_without_device();
    test_vexp();
    test_p_rounding();
    test_errors();
    test_unused_tensors();
    uint64_t rng = seed ^ 0x6f7665726c617073ull; /* "overlaps" */
    test_overlaps(&rng);
    test_progress(seed);
    return check_finish("test_forward_contracts");
}
