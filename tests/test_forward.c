/* The CPU forward against the float64 reference, on a random sample of the grid: shapes
 * (Sq, Sk in {1, 7, 37, 128, 129, 300}, D, Dv in {8, 40, 64, 80, 128, 256}), dtypes,
 * GQA/MQA, every mask alone and together, rows with no visible key, strided layouts,
 * large scores, odd block sizes and thread counts. One line per group; the first few
 * failures print the seed (FA_TEST_SEED reproduces the run), the case and the worst
 * element. The forward's other contracts are in test_forward_contracts.c. */
#include "test_util.h"

#include "cpu/isa.h"
#include "cpu/vexp.h"
#include "ref/ref.h"

static uint64_t seed, rng;
static int failures;
#define MAX_REPORTED 3

static const int64_t SEQS[] = {1, 7, 37, 128, 129, 300};
static const int64_t DIMS[] = {8, 40, 64, 80, 128, 256};
#define PICK(arr) (arr[tu_int(&rng, 0, (int64_t)(sizeof arr / sizeof arr[0]) - 1)])

/* Error bounds on max|o - ref| / max|ref| (u = unit roundoff of the dtype):
 * f32:  u = 6e-8; exps (vexp ~1e-7) and f32 sums over <= 300 keys stay near 1e-6. An f32
 *       score s carries an absolute error of a few u |s|, which is a relative error of p:
 *       the bound grows with the scores that matter, |s| ~ |lse| (alibi over 300 keys and
 *       softcap 30 reach |s| ~ 150): TOL_F32 x max(1, max|lse| / 8). Exact scores (integer
 *       q, k) keep the plain bound. */
#define TOL_F32 1e-5
/* f16:  u = 4.9e-4; p rounded to f16 before P V (<= u relative per term) plus o rounded
 *       on store (u/2): about 1e-3 at worst, bound with 5x margin. */
#define TOL_F16 5e-3
/* bf16: u = 3.9e-3; the same two roundings: about 8e-3 at worst, bound 2.5x above. */
#define TOL_BF16 2e-2
/* lse comes from f32 scores (products of f16/bf16 inputs are exact in f32) and the f32 row
 * sum of unrounded p, so it is f32-accurate for every dtype: |err| <= 1e-5 (1 + |lse|).
 * Rows with no visible key must give -inf exactly. */
#define TOL_LSE 1e-5

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
    int seg;               /* 0 off, 1 packed runs, 2 random ids, 3 some q rows match nothing */
    int layout;            /* 0 BHSD, 1 BSHD, 2 padded view, 3 k/v stored [B, H, D, S] */
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

static double tol_for(fa_dtype t) { return t == FA_F32 ? TOL_F32 : t == FA_F16 ? TOL_F16 : TOL_BF16; }
/* The case's bound: f32's grows with the score magnitude (see TOL_F32). */
static double case_tol(const tcase *c, double max_lse) {
    if (c->dt != FA_F32 || c->integer) return tol_for(c->dt);
    return TOL_F32 * (max_lse / 8 > 1 ? max_lse / 8 : 1);
}

/* Fills q or k: uniform times amp, or integers in [-16, 16] (exact in every dtype). */
static void fill_qk(const tcase *c, void *x, int64_t n) {
    if (!c->integer) {
        tu_fill(&rng, c->dt, x, n, c->amp);
        return;
    }
    for (int64_t i = 0; i < n; i++) fa_store(c->dt, x, i, (float)tu_int(&rng, -16, 16));
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
                            for (int64_t j = 0; j < c->Sk; j++) bias[fa_offset(&bs, b, h, i, j)] = -INFINITY;
        }
    }
    for (int64_t h = 0; slopes && h < c->Hq; h++)
        slopes[h] = c->alibi == 2 ? ldexpf(1.0f, -(int)tu_int(&rng, 1, 8)) : (float)(0.02 + 0.5 * (tu_uniform(&rng) + 1) / 2);
    if (c->seg) {
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
        const fa_strides os = resolved(&p.o_stride, od);
        char *touched = calloc((size_t)no, 1);
        double maxref = 0, maxerr = 0, lse_err = 0;
        int64_t worst = 0, worst_l = -1, bad_nan = -1, bad_inf = -1;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Sq; i++) {
                    const int64_t row = (b * c->Hq + h) * c->Sq + i;
                    for (int64_t x = 0; x < c->Dv; x++) {
                        const int64_t off = fa_offset(&os, b, h, i, x);
                        touched[off] = 1;
                        const double got = fa_load(dt, o, off), want = ro[row * c->Dv + x];
                        if (isnan(got) && bad_nan < 0) bad_nan = row * c->Dv + x;
                        if (fabs(want) > maxref) maxref = fabs(want);
                        if (fabs(got - want) > maxerr || isnan(got)) maxerr = fabs(got - want), worst = row * c->Dv + x;
                    }
                    if (c->no_lse) continue;
                    const double gl = lse[row], wl = rl[row];
                    if (isinf(wl) || isinf(gl)) {
                        if (gl != wl && bad_inf < 0) bad_inf = row;
                        continue;
                    }
                    const double e = fabs(gl - wl) / (1 + fabs(wl));
                    if (!(e <= lse_err)) lse_err = e, worst_l = row;
                }
        int64_t outside = -1; /* an element of o's buffer outside the view that was written */
        for (int64_t i = 0; i < no && outside < 0; i++)
            if (!touched[i] && !isnan(fa_load(dt, o, i))) outside = i;
        free(touched);
        const double ratio = maxerr / (maxref > 0 ? maxref : 1);
        double max_lse = 0;
        for (int64_t r = 0; r < c->B * c->Hq * c->Sq; r++)
            if (isfinite(rl[r]) && fabs(rl[r]) > max_lse) max_lse = fabs(rl[r]);
        const double tol = case_tol(c, max_lse);
        const int bad = bad_nan >= 0 || bad_inf >= 0 || !(ratio <= tol) || !(lse_err <= TOL_LSE) || outside >= 0;
        if (ratio / tol > gs->worst || isnan(ratio)) gs->worst = ratio / tol;
        if (lse_err > gs->worst_lse || isnan(lse_err)) gs->worst_lse = lse_err;
        if (bad) {
            ok = 0;
            failures++;
            if (failures <= MAX_REPORTED) {
                const int64_t wr = worst / c->Dv, wx = worst % c->Dv;
                printf("FAIL %s #%d (FA_TEST_SEED=%llu): err %.3g (bound %.3g), lse err %.3g (bound %.3g)\n  case: %s\n",
                       group, idx, (unsigned long long)seed, ratio, tol, lse_err, TOL_LSE, desc);
                printf("  worst o at b=%lld h=%lld i=%lld c=%lld: got %.9g want %.9g (max|ref| %.4g)\n",
                       (long long)(wr / (c->Hq * c->Sq)), (long long)(wr / c->Sq % c->Hq), (long long)(wr % c->Sq),
                       (long long)wx, fa_load(dt, o, fa_offset(&os, wr / (c->Hq * c->Sq), wr / c->Sq % c->Hq, wr % c->Sq, wx)),
                       ro[worst], maxref);
                if (worst_l >= 0)
                    printf("  worst lse at row %lld: got %.9g want %.9g\n", (long long)worst_l, (double)lse[worst_l],
                           rl[worst_l]);
                if (bad_nan >= 0) printf("  NaN in o at flat index %lld\n", (long long)bad_nan);
                if (bad_inf >= 0)
                    printf("  lse row %lld: got %g want %g (-inf must match exactly)\n", (long long)bad_inf,
                           (double)lse[bad_inf], rl[bad_inf]);
                if (outside >= 0) printf("  o's buffer written outside the view at element %lld\n", (long long)outside);
            }
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

static void run_group(const char *name, case_maker mk, int count) {
    group_stats gs = {0, 0, 0};
    int pass = 0;
    for (int i = 0; i < count && failures < MAX_REPORTED; i++) { /* stop after the first few failures */
        tcase c = base_case();
        mk(&c, i);
        pass += run_case(name, i, &c, &gs);
    }
    if (gs.n == 0) {
        printf("%-10s skipped after earlier failures\n", name);
        return;
    }
    printf("%-10s %3d/%-3d passed  worst o err %.3f of its bound, worst lse err %.2e (bound %.0e)\n", name,
           pass, gs.n, gs.worst, gs.worst_lse, TOL_LSE);
    fflush(stdout);
}

int main(void) {
    seed = tu_seed();
    rng = seed;
    printf("test_forward: seed %llu (FA_TEST_SEED=%llu reproduces), isa %s\n", (unsigned long long)seed,
           (unsigned long long)seed, fa_cpu_isa());
    run_group("shapes", mk_shapes, 40);
    run_group("f16", mk_f16, 25);
    run_group("bf16", mk_bf16, 25);
    run_group("causal", mk_causal, 20);
    run_group("window", mk_window, 25);
    run_group("softcap", mk_softcap, 12);
    run_group("bias", mk_bias, 24);
    run_group("bias scale", mk_bias_scale, 18);
    run_group("alibi", mk_alibi, 12);
    run_group("segments", mk_segments, 15);
    run_group("gqa/mqa", mk_gqa, 12);
    run_group("strides", mk_strides, 18);
    run_group("large", mk_large, 8);
    run_group("blocks", mk_blocks, 24);
    run_group("threads", mk_threads, 10);
    run_group("diag", mk_diag, 18);
    run_group("combined", mk_combined, 40);
    if (failures) {
        printf("test_forward: %d FAILED (FA_TEST_SEED=%llu)\n", failures, (unsigned long long)seed);
        return 1;
    }
    printf("test_forward: all passed\n");
    return 0;
}
