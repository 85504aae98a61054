/* Tests internals on purpose besides the public API: the ISA tables (cpu/isa.h) and vexp.h.
 * The CPU forward against the float64 reference, on a random sample of the grid: shapes
 * (Sq, Sk in {1, 7, 37, 128, 129, 300}, D, Dv in {8, 40, 64, 80, 128, 256}), dtypes,
 * GQA/MQA, every mask alone and together, rows with no visible key, strided layouts,
 * large scores, odd block sizes and thread counts. One line per group; the first few
 * failures print the seed (FA_TEST_SEED reproduces the run), the case and the worst
 * element. The forward's other contracts are in test_forward_contracts.c. */
#include "cases.h"

#include "cpu/isa.h"
#include "cpu/vexp.h"
#include "ref/ref.h"

static uint64_t rng;
static int draw_only; /* FA_CHECK_ONLY replays one case: the others draw their data, run nothing */
#define MAX_REPORTED 3

static const int64_t SEQS[] = {1, 7, 37, 128, 129, 300};
static const int64_t DIMS[] = {8, 40, 64, 80, 128, 256};
#define PICK(arr) (arr[tu_int(&rng, 0, (int64_t)(sizeof arr / sizeof arr[0]) - 1)])

/* The bounds are check.h's table (o: by dtype, f32's grown with the score magnitude where
 * the scores are not exact; lse: f32-accurate for every dtype, -inf exact on rows that see
 * no key). Integer q, k give exact scores of any magnitude: the plain bound. */

typedef struct {
    int64_t B, Hq, Hk, Sq, Sk, D, Dv;
    fa_dtype dt;
    int causal;
    int64_t wl, wr;
    float softcap;
    int has_scale;
    float scale;
    int bias;              /* additive bias on */
    int64_t bias_b, bias_h; /* its batch and head dims (1 = broadcast) */
    int bias_pad;          /* explicit, padded bias strides */
    double bias_ninf;      /* fraction of -inf entries */
    int bias_dead_rows;    /* some rows all -inf */
    int alibi;             /* 1 random slopes, 2 powers of two (exact) */
    int seg;               /* 0 off, 1 packed runs, 2 random ids, 3 some q rows match nothing, 4 cases.h's */
    int layout;            /* 0 BHSD, 1 BSHD, 2 padded view, 3 k/v stored [B, H, D, S], 4 q/o column stride 2 */
    int64_t bq, bk;        /* 0: default */
    int threads;
    double amp;            /* q and k amplitude */
    int integer;           /* q, k small integers: exact scores of any magnitude */
    int no_lse;
    int user_ws;           /* pass a workspace of exactly the plan's size */
    int has_diag;          /* masks aligned at off = diag instead of Sk - Sq */
    int64_t diag;
    int has_bias_scale;    /* s += bias_scale * bias */
    float bias_scale;
} tcase;

static tcase base_case(void) {
    tcase c;
    memset(&c, 0, sizeof c);
    c.B = 1;
    c.Hq = c.Hk = 1;
    c.Sq = c.Sk = 37;
    c.D = c.Dv = 64;
    c.dt = FA_F32;
    c.wl = c.wr = -1;
    c.bias_b = c.bias_h = 1;
    c.threads = 2;
    c.amp = 1.5;
    return c;
}

static void describe(const tcase *c, char *buf, size_t n) {
    snprintf(buf, n,
             "B=%lld Hq=%lld Hk=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld %s causal=%d window=(%lld,%lld) softcap=%g "
             "scale=%s%g bias=%d[%lldx%lld pad=%d ninf=%g dead=%d] alibi=%d seg=%d layout=%d blocks=%lldx%lld "
             "threads=%d amp=%g int=%d lse=%s ws=%s bias_scale=%g",
             (long long)c->B, (long long)c->Hq, (long long)c->Hk, (long long)c->Sq, (long long)c->Sk,
             (long long)c->D, (long long)c->Dv, fa_dtype_name(c->dt), c->causal, (long long)c->wl, (long long)c->wr,
             (double)c->softcap, c->has_scale ? "" : "default~", c->has_scale ? (double)c->scale : 0.0, c->bias,
             (long long)c->bias_b, (long long)c->bias_h, c->bias_pad, c->bias_ninf, c->bias_dead_rows, c->alibi,
             c->seg, c->layout, (long long)c->bq, (long long)c->bk, c->threads, c->amp, c->integer,
             c->no_lse ? "NULL" : "yes", c->user_ws ? "caller" : "library",
             c->has_bias_scale ? (double)c->bias_scale : 1.0);
}

/* Strides of a [B, H, S, W] tensor in layout `layout` (kv: a k or v tensor); returns the
 * number of elements its buffer needs. */
static int64_t layout_strides(int layout, int kv, const int64_t d[4], fa_strides *st) {
    const int64_t B = d[0], H = d[1], S = d[2], W = d[3];
    memset(st, 0, sizeof *st);
    if (layout == 3 && !kv) layout = 1;
    if (layout == 4 && kv) layout = 0;
    switch (layout) {
    case 1: /* BSHD */
        st->s[3] = 1, st->s[1] = W, st->s[2] = H * W, st->s[0] = S * H * W;
        break;
    case 2: /* a view into a padded buffer */
        st->s[3] = 1, st->s[2] = W + 3, st->s[1] = S * (W + 3) + 5, st->s[0] = H * st->s[1] + 7;
        break;
    case 3: /* BHDS: keys run fastest */
        st->s[2] = 1, st->s[3] = S, st->s[1] = S * W, st->s[0] = H * S * W;
        break;
    case 4: /* q and o with column stride 2: no aligned rows */
        st->s[3] = 2, st->s[2] = 2 * W + 2, st->s[1] = S * st->s[2], st->s[0] = H * st->s[1];
        break;
    default: /* all zeros: contiguous BHSD */
        return B * H * S * W;
    }
    return (B - 1) * st->s[0] + (H - 1) * st->s[1] + (S - 1) * st->s[2] + (W - 1) * st->s[3] + 1;
}

static fa_strides resolved(const fa_strides *st, const int64_t d[4]) {
    fa_strides r = *st;
    if (!r.s[0] && !r.s[1] && !r.s[2] && !r.s[3]) r.s[3] = 1, r.s[2] = d[3], r.s[1] = d[2] * d[3], r.s[0] = d[1] * d[2] * d[3];
    return r;
}

/* Fills q or k: uniform times amp, or integers in [-16, 16] (exact in every dtype). */
static void fill_qk(const tcase *c, void *x, int64_t n) {
    if (!c->integer) {
        tu_fill(&rng, c->dt, x, n, c->amp);
        return;
    }
    for (int64_t i = 0; i < n; i++) chk_store(c->dt, x, i, (float)tu_int(&rng, -16, 16));
}

typedef struct {
    int n;
    double worst;      /* max of err / bound: below 1 passes */
    double worst_lse;
} group_stats;

/* Runs one case; returns 1 on success. */
static int run_case(const char *group, int idx, const tcase *c, group_stats *gs) {
    const fa_dtype dt = c->dt;
    const size_t es = fa_dtype_size(dt);
    fa_problem p;
    fa_problem_init(&p);
    p.batch = c->B, p.heads_q = c->Hq, p.heads_kv = c->Hk, p.seq_q = c->Sq, p.seq_k = c->Sk;
    p.head_dim = c->D, p.head_dim_v = c->Dv, p.dtype = dt;
    p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr, p.softcap = c->softcap;
    p.has_scale = c->has_scale, p.scale = c->scale;
    p.has_alibi = c->alibi != 0, p.has_bias = c->bias, p.has_segment_ids = c->seg != 0;
    p.bias_batch = c->bias_b, p.bias_heads = c->bias_h;
    p.has_diag_offset = c->has_diag, p.diag_offset = c->diag;
    tu_keep_aligned_diag(&p);
    p.has_bias_scale = c->has_bias_scale, p.bias_scale = c->bias_scale;

    const int64_t qd[4] = {c->B, c->Hq, c->Sq, c->D}, kd[4] = {c->B, c->Hk, c->Sk, c->D};
    const int64_t vd[4] = {c->B, c->Hk, c->Sk, c->Dv}, od[4] = {c->B, c->Hq, c->Sq, c->Dv};
    const int64_t nq = layout_strides(c->layout, 0, qd, &p.q_stride);
    const int64_t nk = layout_strides(c->layout, 1, kd, &p.k_stride);
    const int64_t nv = layout_strides(c->layout, 1, vd, &p.v_stride);
    const int64_t no = layout_strides(c->layout, 0, od, &p.o_stride);
    int64_t nb = c->bias_b * c->bias_h * c->Sq * c->Sk;
    if (c->bias && c->bias_pad) {
        /* rows padded by 2; broadcast dims get stride 0 */
        p.bias_stride.s[3] = 1, p.bias_stride.s[2] = c->Sk + 2;
        p.bias_stride.s[1] = c->bias_h > 1 ? c->Sq * (c->Sk + 2) : 0;
        p.bias_stride.s[0] = c->bias_b > 1 ? c->bias_h * c->Sq * (c->Sk + 2) : 0;
        nb = c->bias_b * c->bias_h * c->Sq * (c->Sk + 2);
    }

    void *q = tu_alloc((size_t)nq * es), *k = tu_alloc((size_t)nk * es), *v = tu_alloc((size_t)nv * es);
    void *o = tu_alloc((size_t)no * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(c->B * c->Hq * c->Sq));
    float *bias = c->bias ? tu_alloc(sizeof(float) * (size_t)nb) : NULL;
    float *slopes = c->alibi ? tu_alloc(sizeof(float) * (size_t)c->Hq) : NULL;
    int32_t *qseg = c->seg ? tu_alloc(sizeof(int32_t) * (size_t)(c->B * c->Sq)) : NULL;
    int32_t *kseg = c->seg ? tu_alloc(sizeof(int32_t) * (size_t)(c->B * c->Sk)) : NULL;
    fill_qk(c, q, nq);
    fill_qk(c, k, nk);
    tu_fill(&rng, dt, v, nv, 1.0);
    if (bias) {
        for (int64_t i = 0; i < nb; i++) {
            bias[i] = (float)(2.0 * tu_uniform(&rng));
            if (c->bias_ninf > 0 && (tu_uniform(&rng) + 1) / 2 < c->bias_ninf) bias[i] = -INFINITY;
        }
        if (c->bias_dead_rows) {
            fa_strides bs = resolved(&p.bias_stride, (int64_t[4]){c->bias_b, c->bias_h, c->Sq, c->Sk});
            for (int64_t b = 0; b < c->bias_b; b++)
                for (int64_t h = 0; h < c->bias_h; h++)
                    for (int64_t i = 0; i < c->Sq; i++)
                        if (tu_int(&rng, 0, 3) == 0)
                            for (int64_t j = 0; j < c->Sk; j++) bias[chk_offset(&bs, b, h, i, j)] = -INFINITY;
        }
    }
    for (int64_t h = 0; slopes && h < c->Hq; h++)
        slopes[h] = c->alibi == 2 ? ldexpf(1.0f, -(int)tu_int(&rng, 1, 8)) : (float)(0.02 + 0.5 * (tu_uniform(&rng) + 1) / 2);
    if (c->seg == 4) fa_case_segments(&(fa_case){.B = c->B, .Sq = c->Sq, .Sk = c->Sk}, qseg, kseg);
    else if (c->seg) {
        const int64_t nseg = tu_int(&rng, 1, 4);
        for (int64_t b = 0; b < c->B; b++) {
            for (int64_t i = 0; i < c->Sq; i++)
                qseg[b * c->Sq + i] = c->seg == 1   ? (int32_t)(i * nseg / c->Sq)
                                      : c->seg == 2 ? (int32_t)tu_int(&rng, 0, 2)
                                                    : (int32_t)(tu_int(&rng, 0, 2) == 0 ? 9 : tu_int(&rng, 0, 1));
            for (int64_t j = 0; j < c->Sk; j++)
                kseg[b * c->Sk + j] = c->seg == 1 ? (int32_t)(j * nseg / c->Sk) : (int32_t)tu_int(&rng, 0, c->seg == 2 ? 2 : 1);
        }
    }
    tu_poison(dt, o, no);
    for (int64_t i = 0; i < c->B * c->Hq * c->Sq; i++) lse[i] = NAN;
    if (draw_only) {
        free(q), free(k), free(v), free(o), free(lse), free(bias), free(slopes), free(qseg), free(kseg);
        return 1;
    }

    char desc[600];
    describe(c, desc, sizeof desc);
    int ok = 1;
    fa_options opt = {FA_BACKEND_CPU, c->threads, c->bq, c->bk};
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(&p, &opt, &plan);
    void *ws = NULL;
    if (st == FA_OK) {
        fa_forward_args a;
        memset(&a, 0, sizeof a);
        a.q = q, a.k = k, a.v = v, a.o = o, a.lse = c->no_lse ? NULL : lse;
        a.bias = bias, a.alibi_slopes = slopes, a.q_segment_ids = qseg, a.kv_segment_ids = kseg;
        if (c->user_ws) {
            fa_cost cost;
            fa_plan_cost(plan, FA_FORWARD, &cost);
            a.workspace_size = (size_t)cost.workspace_bytes;
            ws = a.workspace = tu_alloc(a.workspace_size);
        }
        st = fa_forward(plan, &a);
    }
    if (st != FA_OK) {
        failures++;
        if (failures <= MAX_REPORTED)
            printf("FAIL %s #%d (seed %llu): status %s: %s\n  case: %s\n", group, idx, (unsigned long long)seed,
                   fa_status_string(st), fa_last_error(), desc);
        ok = 0;
    }

    double *ro = tu_alloc(sizeof(double) * (size_t)(c->B * c->Hq * c->Sq * c->Dv));
    double *rl = tu_alloc(sizeof(double) * (size_t)(c->B * c->Hq * c->Sq));
    if (ok) {
        fa_ref_forward(&p, &(fa_forward_args){.q = q, .k = k, .v = v, .bias = bias, .alibi_slopes = slopes,
                                               .q_segment_ids = qseg, .kv_segment_ids = kseg},
                       ro, rl);
        double max_lse = 0;
        for (int64_t r = 0; r < c->B * c->Hq * c->Sq; r++)
            if (isfinite(rl[r]) && fabs(rl[r]) > max_lse) max_lse = fabs(rl[r]);
        const int before = failures;
        const check_tol tol = c->integer ? check_tol_of(dt) : check_tol_scores(dt, max_lse);
        const check_result ro_ = check_tensor("o", dt, o, &p.o_stride, ro, od, tol, NULL, 0);
        check_outside("o", dt, o, no, &p.o_stride, od);
        if (!c->no_lse) {
            const int64_t ld[4] = {c->B, c->Hq, c->Sq, 1};
            const check_result rl_ = check_tensor("lse", FA_F32, lse, &(fa_strides){{0, 0, 0, 0}}, rl, ld, CHECK_TOL_LSE,
                                                  NULL, 1);
            if (rl_.ratio > gs->worst_lse || isnan(rl_.ratio)) gs->worst_lse = rl_.ratio;
        }
        if (ro_.ratio > gs->worst || isnan(ro_.ratio)) gs->worst = ro_.ratio;
        if (failures > before) {
            ok = 0;
            failures = before + 1; /* one failed case, however many of its checks failed */
            printf("  in %s #%d (FA_TEST_SEED=%llu): o err %.3g of max|ref| %.3g (bound %.3g)\n  case: %s\n", group,
                   idx, (unsigned long long)seed, ro_.err, ro_.mag, tol.atol, desc);
        }
    }
    gs->n++;
    fa_plan_destroy(plan);
    free(ws), free(q), free(k), free(v), free(o), free(lse), free(bias), free(slopes), free(qseg), free(kseg);
    free(ro), free(rl);
    return ok;
}

/* ---- the sample of the grid ------------------------------------------------------- */

/* Random shape from the grid, with B * Hq and the work per case kept small enough that the
 * whole file runs in seconds. */
static void random_shape(tcase *c) {
    c->Sq = PICK(SEQS);
    c->Sk = PICK(SEQS);
    c->D = PICK(DIMS);
    c->Dv = tu_int(&rng, 0, 2) ? c->D : PICK(DIMS);
    const int64_t work = c->Sq * c->Sk * (c->D + c->Dv);
    const int64_t heads = work > 4000000 ? 1 : work > 500000 ? 2 : 4;
    c->B = tu_int(&rng, 1, heads > 1 ? 2 : 1);
    c->Hq = tu_int(&rng, 1, heads);
    c->Hk = tu_int(&rng, 0, 1) ? c->Hq : 1;
}

static void random_window(tcase *c) {
    static const int64_t W[] = {-1, 0, 1, 3, 17, 64};
    do {
        c->wl = PICK(W);
        c->wr = PICK(W);
    } while (c->wl < 0 && c->wr < 0);
}

typedef void (*case_maker)(tcase *c, int i);

static void mk_shapes(tcase *c, int i) {
    random_shape(c);
    if (i == 0) c->Sq = 1, c->Sk = 300;  /* decoding-like */
    if (i == 1) c->Sq = 300, c->Sk = 1;  /* one key */
    if (i == 2) c->Sq = c->Sk = 129, c->D = 256, c->Dv = 8;
}
static void mk_f16(tcase *c, int i) {
    (void)i;
    random_shape(c);
    c->dt = FA_F16;
    c->causal = tu_int(&rng, 0, 1);
}
static void mk_bf16(tcase *c, int i) {
    mk_f16(c, i);
    c->dt = FA_BF16;
}
static void mk_causal(tcase *c, int i) {
    random_shape(c);
    c->causal = 1;
    if (i == 0) c->Sq = 300, c->Sk = 37; /* Sq > Sk: the first rows see nothing */
    if (i == 1) c->Sq = 37, c->Sk = 300;
    if (i == 2) c->Sq = 129, c->Sk = 7;
}
static void mk_window(tcase *c, int i) {
    random_shape(c);
    random_window(c);
    if (i == 0) c->wl = 0, c->wr = 0; /* the diagonal only */
    if (i == 1) c->wl = 0, c->wr = 0, c->Sq = 128, c->Sk = 37; /* 0-width, most rows see nothing */
    if (i == 2) c->wl = 17, c->wr = 3;
    if (i == 3) c->wl = -1, c->wr = 0, c->Sq = 37, c->Sk = 129; /* = causal */
    if (i >= 4) c->causal = tu_int(&rng, 0, 1);
}
static void mk_softcap(tcase *c, int i) {
    random_shape(c);
    c->softcap = i % 2 ? 5.0f : 30.0f;
    c->amp = 4.0; /* scores beyond the cap */
    c->causal = i % 3 == 2;
    if (i >= 6) c->dt = (fa_dtype)tu_int(&rng, 0, 2);
}
static void mk_bias(tcase *c, int i) {
    random_shape(c);
    c->bias = 1;
    c->B = tu_int(&rng, 1, 2);
    c->bias_b = tu_int(&rng, 0, 1) ? c->B : 1;
    c->bias_h = tu_int(&rng, 0, 1) ? c->Hq : 1;
    c->bias_pad = tu_int(&rng, 0, 1);
    if (i % 3 == 1) c->bias_ninf = 0.3;
    if (i % 3 == 2) c->bias_dead_rows = 1;
    if (i == 3) c->bias_ninf = 1.0; /* every key hidden */
    if (i >= 12) c->dt = (fa_dtype)tu_int(&rng, 0, 2), c->causal = tu_int(&rng, 0, 1);
}
/* s += bias_scale * bias: the Pallas kernel's bias-before-scaling (bias_scale = scale),
 * negative, zero and large scales; -inf entries only under positive scales. */
static void mk_bias_scale(tcase *c, int i) {
    static const float W[] = {0.125f, -1.0f, 0.0f, 3.0f, 0.5f, -0.25f};
    mk_bias(c, i);
    c->has_bias_scale = 1;
    c->bias_scale = i % 6 == 0 ? (float)(1.0 / sqrt((double)c->D)) : W[i % 6];
    if (c->bias_scale <= 0.0f) c->bias_ninf = 0.0, c->bias_dead_rows = 0;
    if (i % 4 == 3) c->alibi = 1, c->softcap = 5.0f;
}
static void mk_alibi(tcase *c, int i) {
    random_shape(c);
    c->alibi = 1;
    c->causal = i % 2;
    if (i >= 6) c->dt = (fa_dtype)tu_int(&rng, 0, 2);
}
static void mk_segments(tcase *c, int i) {
    random_shape(c);
    c->seg = 1 + i % 3;
    c->causal = i / 3 % 2;
    if (i >= 6) c->dt = (fa_dtype)tu_int(&rng, 0, 2);
}
static void mk_gqa(tcase *c, int i) {
    random_shape(c);
    c->B = 1;
    if (i % 2) c->Hq = 8, c->Hk = 2; /* GQA 4:1 */
    else c->Hq = 4, c->Hk = 1;       /* MQA */
    if (c->Sq * c->Sk * (c->D + c->Dv) > 4000000) c->Sq = 37;
    c->causal = i / 2 % 2;
    c->dt = i % 4 == 3 ? FA_BF16 : i % 5 == 4 ? FA_F16 : FA_F32;
}
static void mk_strides(tcase *c, int i) {
    random_shape(c);
    c->layout = 1 + i % 3;
    c->dt = i % 9 == 8 ? FA_BF16 : i % 6 >= 3 ? FA_F16 : FA_F32;
    c->causal = i % 2;
}
static void mk_large(tcase *c, int i) {
    random_shape(c);
    c->D = i % 2 ? 256 : 128;
    c->integer = 1;
    c->has_scale = 1;
    c->scale = 2.0f; /* |scores| up to ~1e4, still exact: integer products, power-of-two scale */
    c->causal = i % 4 >= 2;
    c->alibi = i % 4 == 3 ? 2 : 0; /* power-of-two slopes keep the scores exact */
    c->dt = i % 3 == 1 ? FA_BF16 : i % 3 == 2 ? FA_F16 : FA_F32;
    if (c->Sq * c->Sk * (c->D + c->Dv) > 4000000) c->Sq = 37;
}
static void mk_blocks(tcase *c, int i) {
    static const int64_t BL[][2] = {{16, 48}, {7, 5}, {1, 1}, {33, 129}, {512, 512}, {4096, 3}, {3, 4096}, {65, 31}};
    random_shape(c);
    c->bq = BL[i % 8][0];
    c->bk = BL[i % 8][1];
    if (i % 8 == 2) c->Sq = 37, c->Sk = 7; /* 1x1 tiles: keep it small */
    c->causal = tu_int(&rng, 0, 1);
    if (tu_int(&rng, 0, 1)) random_window(c);
}
static void mk_threads(tcase *c, int i) {
    random_shape(c);
    c->threads = (int)tu_int(&rng, 1, 5);
    c->user_ws = 1;
    c->no_lse = i % 3 == 1;
    c->causal = i % 2;
}
/* Masks aligned elsewhere than bottom-right: top-left (0) and arbitrary offsets, as a
 * block of a larger problem has (with causal, windows and ALiBi, which all use it). */
static void mk_diag(tcase *c, int i) {
    random_shape(c);
    c->has_diag = 1;
    c->diag = i % 3 == 0 ? 0 : tu_int(&rng, -c->Sq - 3, c->Sk + 3);
    c->causal = i % 2 == 0;
    if (i % 4 >= 2) random_window(c);
    if (i % 5 == 1) c->alibi = 1;
    if (i % 3 == 2) c->bq = tu_int(&rng, 1, 40), c->bk = tu_int(&rng, 1, 40);
}
/* The shared case list (cases.h), the row's own tensors drawn from this program's stream. */
static void mk_listed(tcase *c, int i) {
    const fa_case *f = &FA_CASES[i];
    c->B = f->B, c->Hq = f->Hq, c->Hk = f->Hk, c->Sq = f->Sq, c->Sk = f->Sk, c->D = f->D, c->Dv = f->Dv, c->dt = f->dt;
    c->causal = f->causal, c->softcap = f->softcap;
    if (f->window) c->wl = f->wl, c->wr = f->wr;
    c->has_diag = f->has_diag, c->diag = f->diag;
    c->has_scale = f->scale != 0.0f, c->scale = f->scale;
    if (f->bias) {
        c->bias = 1;
        c->bias_b = f->bias == 2 ? f->B : 1;
        c->bias_h = f->bias == 1 ? f->Hq : 1;
        c->bias_ninf = f->bias == 1 ? 0.05 : 0.0;
    }
    c->has_bias_scale = f->bias_scale != 0.0f, c->bias_scale = f->bias_scale;
    c->alibi = f->alibi;
    c->seg = f->seg ? 4 : 0;
    c->layout = f->layout == 2 ? 4 : f->layout;
}
/* Everything at once. */
static void mk_combined(tcase *c, int i) {
    random_shape(c);
    c->dt = (fa_dtype)tu_int(&rng, 0, 2);
    c->causal = tu_int(&rng, 0, 1);
    if (tu_int(&rng, 0, 1)) random_window(c);
    if (tu_int(&rng, 0, 1)) c->softcap = 10.0f, c->amp = 3.0;
    c->bias = 1;
    c->bias_b = tu_int(&rng, 0, 1) ? c->B : 1;
    c->bias_h = tu_int(&rng, 0, 1) ? c->Hq : 1;
    c->bias_pad = tu_int(&rng, 0, 1);
    c->bias_ninf = 0.1;
    c->alibi = 1;
    c->seg = (int)tu_int(&rng, 1, 3);
    c->layout = (int)tu_int(&rng, 0, 3);
    if (tu_int(&rng, 0, 1)) c->bq = tu_int(&rng, 1, 80), c->bk = tu_int(&rng, 1, 80);
    c->threads = (int)tu_int(&rng, 1, 3);
    c->has_scale = i % 2, c->scale = 0.1f;
}

/* The long run's case (make check-long, FA_CHECK_CASES): every option on or off
 * independently, so any combination can come up; half the shapes of any size up to the
 * grid's largest (odd sizes), GQA ratios other than 1 and Hq. */
static void mk_random(tcase *c, int i) {
    (void)i;
    random_shape(c);
    if (tu_int(&rng, 0, 1)) {
        c->Sq = tu_int(&rng, 1, 300), c->Sk = tu_int(&rng, 1, 300);
        c->D = tu_int(&rng, 1, 256), c->Dv = tu_int(&rng, 1, 256);
        const int64_t work = c->Sq * c->Sk * (c->D + c->Dv);
        c->Hk = tu_int(&rng, 1, work > 4000000 ? 1 : 2);
        c->Hq = c->Hk * tu_int(&rng, 1, work > 500000 ? 2 : 4);
        c->B = tu_int(&rng, 1, 2);
    }
    c->dt = (fa_dtype)tu_int(&rng, 0, 2);
    c->causal = tu_int(&rng, 0, 1);
    if (tu_int(&rng, 0, 2) == 0) random_window(c);
    if (tu_int(&rng, 0, 2) == 0) c->softcap = (float)(1.0 + 29.0 * (tu_uniform(&rng) + 1) / 2), c->amp = 3.0;
    if (tu_int(&rng, 0, 2) == 0)
        c->has_scale = 1, c->scale = (float)((0.3 + 2.2 * (tu_uniform(&rng) + 1) / 2) / sqrt((double)c->D) * (tu_int(&rng, 0, 3) ? 1 : -1));
    if (tu_int(&rng, 0, 4) < 2) {
        c->bias = 1;
        c->bias_b = tu_int(&rng, 0, 1) ? c->B : 1;
        c->bias_h = tu_int(&rng, 0, 1) ? c->Hq : 1;
        c->bias_pad = tu_int(&rng, 0, 1);
        c->bias_ninf = (double)tu_int(&rng, 0, 3) / 10;
        c->bias_dead_rows = tu_int(&rng, 0, 3) == 0;
    }
    if (tu_int(&rng, 0, 2) == 0) c->alibi = (int)tu_int(&rng, 1, 2);
    if (tu_int(&rng, 0, 3) == 0) c->seg = (int)tu_int(&rng, 1, 3);
    c->layout = (int)tu_int(&rng, 0, 3);
    if (tu_int(&rng, 0, 2) == 0) c->bq = tu_int(&rng, 1, 80), c->bk = tu_int(&rng, 1, 80);
    c->threads = (int)tu_int(&rng, 1, 4);
    if (tu_int(&rng, 0, 4) == 0) c->has_diag = 1, c->diag = tu_int(&rng, -c->Sq - 3, c->Sk + 3);
    c->no_lse = tu_int(&rng, 0, 9) == 0;
    c->user_ws = tu_int(&rng, 0, 4) == 0;
}

static void run_group(const char *name, case_maker mk, int count) {
    group_stats gs = {0, 0, 0};
    int pass = 0;
    const char *one = getenv("FA_CHECK_ONLY"); /* the long run: replay case #n alone */
    const int only = tu_check_cases() && one && *one ? atoi(one) : -1;
    for (int i = 0; i < count && failures < MAX_REPORTED; i++) { /* stop after the first few failures */
        tcase c = base_case();
        mk(&c, i);
        draw_only = only >= 0 && i != only;
        const int ok = run_case(name, i, &c, &gs);
        if (!draw_only) pass += ok;
    }
    draw_only = 0;
    if (gs.n == 0) {
        printf("%-10s skipped after earlier failures\n", name);
        return;
    }
    printf("%-10s %3d/%-3d passed  worst o err %.3f of its bound, worst lse err %.3f of its bound\n", name, pass,
           gs.n, gs.worst, gs.worst_lse);
    fflush(stdout);
}

int main(void) {
    rng = check_seed("test_forward");
    const int count = tu_check_cases(); /* FA_CHECK_CASES: the long run, random cases only */
    if (count) {
        run_group("random", mk_random, count);
        return check_finish("test_forward");
    }
    run_group("case list", mk_listed, FA_CASE_COUNT);
    run_group("shapes", mk_shapes, 30);
    run_group("f16", mk_f16, 18);
    run_group("bf16", mk_bf16, 18);
    run_group("causal", mk_causal, 20);
    run_group("window", mk_window, 18);
    run_group("softcap", mk_softcap, 12);
    run_group("bias", mk_bias, 24);
    run_group("bias scale", mk_bias_scale, 18);
    run_group("alibi", mk_alibi, 12);
    run_group("segments", mk_segments, 15);
    run_group("gqa/mqa", mk_gqa, 8);
    run_group("strides", mk_strides, 12);
    run_group("large", mk_large, 8);
    run_group("blocks", mk_blocks, 16);
    run_group("threads", mk_threads, 10);
    run_group("diag", mk_diag, 18);
    run_group("combined", mk_combined, 30);
    return check_finish("test_forward");
}
