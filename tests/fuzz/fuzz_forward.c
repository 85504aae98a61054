/* Differential fuzzing of fa_forward against the float64 reference (src/ref): the input
 * bytes choose a small problem (shapes, dtype, GQA, every mask, softcap, scale, bias with
 * -inf entries and broadcast, ALiBi, segment ids, diagonal offset, strided layouts, block
 * sizes, threads) and seed the data. The bounds are test_forward.c's: max|o - ref| /
 * max|ref| within 1e-5 (f32, times max(1, max|lse| / 8) for non-integer scores), 5e-3
 * (f16), 2e-2 (bf16) (exact scores: the plain f32 bound); lse within 1e-5 (1 + |lse|), -inf exactly where a row sees no key;
 * no NaN; nothing written outside o's view; kernel counts equal to the plan's. */
#include "fuzz_bytes.h"
#include "ref/ref.h"
#include "check.h"

#define TOL_F32 1e-5
#define TOL_F16 5e-3
#define TOL_BF16 2e-2
#define TOL_LSE 1e-5

typedef struct {
    int64_t B, Hq, Hk, Sq, Sk, D, Dv;
    fa_dtype dt;
    int causal, has_scale, has_diag, bias, bias_dead, alibi, seg, layout, threads, integer, no_lse, user_ws;
    int64_t wl, wr, diag, bias_b, bias_h, bq, bk;
    float softcap, scale;
    double amp, bias_ninf;
    uint64_t seed;
} fcase;

static int64_t take_window(fuzz_bytes *b) { return take_bit(b) ? -1 : take_range(b, 0, 50); }
static int64_t take_block(fuzz_bytes *b) { return take_bit(b) ? 0 : take_range(b, 1, 72); }

static fcase decode(fuzz_bytes *b) {
    static const float SOFTCAPS[] = {0, 0, 5, 30}, SCALES[] = {0.1f, 0.25f, 1.0f};
    static const double AMPS[] = {0.5, 1.5, 4.0};
    fcase c;
    memset(&c, 0, sizeof c);
    c.dt = (fa_dtype)take_range(b, 0, 2);
    c.B = take_range(b, 1, 2), c.Hk = take_range(b, 1, 2), c.Hq = c.Hk * take_range(b, 1, 3);
    c.Sq = take_range(b, 1, 48), c.Sk = take_range(b, 1, 48);
    c.D = take_range(b, 1, 40), c.Dv = take_range(b, 1, 40);
    c.causal = take_bit(b);
    c.wl = take_window(b), c.wr = take_window(b);
    if ((c.has_diag = take_bit(b))) c.diag = take_range(b, -50, 50);
    c.softcap = SOFTCAPS[take_range(b, 0, 3)];
    if ((c.has_scale = take_bit(b))) c.scale = SCALES[take_range(b, 0, 2)];
    c.amp = AMPS[take_range(b, 0, 2)];
    c.integer = take_range(b, 0, 7) == 0;
    if ((c.bias = take_bit(b))) {
        c.bias_b = take_bit(b) ? c.B : 1, c.bias_h = take_bit(b) ? c.Hq : 1;
        c.bias_ninf = take_bit(b) ? 0.3 : 0.0;
        c.bias_dead = take_bit(b);
    } else {
        c.bias_b = c.bias_h = 1;
    }
    c.alibi = (int)take_range(b, 0, 2);
    c.seg = (int)take_range(b, 0, 3);
    c.layout = (int)take_range(b, 0, 2);
    c.bq = take_block(b), c.bk = take_block(b);
    c.threads = (int)take_range(b, 1, 2);
    c.no_lse = take_range(b, 0, 7) == 0;
    c.user_ws = take_bit(b);
    c.seed = take_u64(b, 8);
    return c;
}

/* Strides of a [B, H, S, W] tensor: 0 contiguous, 1 BSHD, 2 a view into a padded buffer.
 * Returns the elements its buffer needs. */
static int64_t layout_strides(int layout, const int64_t d[4], fa_strides *st) {
    const int64_t B = d[0], H = d[1], S = d[2], W = d[3];
    memset(st, 0, sizeof *st);
    if (layout == 1) st->s[3] = 1, st->s[1] = W, st->s[2] = H * W, st->s[0] = S * H * W;
    else if (layout == 2) st->s[3] = 1, st->s[2] = W + 3, st->s[1] = S * (W + 3) + 5, st->s[0] = H * st->s[1] + 7;
    else return B * H * S * W;
    return (B - 1) * st->s[0] + (H - 1) * st->s[1] + (S - 1) * st->s[2] + (W - 1) * st->s[3] + 1;
}

static void fail(const fcase *c, const char *what, double got, double bound) {
    fprintf(stderr,
            "forward differs from the reference: %s %.6g (bound %.6g)\n  B=%lld Hq=%lld Hk=%lld Sq=%lld Sk=%lld "
            "D=%lld Dv=%lld %s causal=%d window=(%lld,%lld) diag=%d:%lld softcap=%g scale=%d:%g amp=%g int=%d "
            "bias=%d[%lldx%lld ninf=%g dead=%d] alibi=%d seg=%d layout=%d blocks=%lldx%lld threads=%d seed=%llu\n",
            what, got, bound, (long long)c->B, (long long)c->Hq, (long long)c->Hk, (long long)c->Sq,
            (long long)c->Sk, (long long)c->D, (long long)c->Dv, fa_dtype_name(c->dt), c->causal, (long long)c->wl,
            (long long)c->wr, c->has_diag, (long long)c->diag, (double)c->softcap, c->has_scale, (double)c->scale,
            c->amp, c->integer, c->bias, (long long)c->bias_b, (long long)c->bias_h, c->bias_ninf, c->bias_dead,
            c->alibi, c->seg, c->layout, (long long)c->bq, (long long)c->bk, c->threads,
            (unsigned long long)c->seed);
    abort();
}

static void fill_qk(const fcase *c, uint64_t *rng, void *x, int64_t n) {
    if (!c->integer) tu_fill(rng, c->dt, x, n, c->amp);
    else
        for (int64_t i = 0; i < n; i++) chk_store(c->dt, x, i, (float)tu_int(rng, -16, 16));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_bytes in = {data, size};
    const fcase c = decode(&in);
    uint64_t rng = c.seed;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = c.B, p.heads_q = c.Hq, p.heads_kv = c.Hk, p.seq_q = c.Sq, p.seq_k = c.Sk;
    p.head_dim = c.D, p.head_dim_v = c.Dv, p.dtype = c.dt;
    p.causal = c.causal, p.window_left = c.wl, p.window_right = c.wr, p.softcap = c.softcap;
    p.has_scale = c.has_scale, p.scale = c.scale;
    p.has_diag_offset = c.has_diag, p.diag_offset = c.diag;
    p.has_alibi = c.alibi != 0, p.has_bias = c.bias, p.has_segment_ids = c.seg != 0;
    tu_keep_aligned_diag(&p);
    p.bias_batch = c.bias_b, p.bias_heads = c.bias_h;
    const int64_t qd[4] = {c.B, c.Hq, c.Sq, c.D}, kd[4] = {c.B, c.Hk, c.Sk, c.D};
    const int64_t vd[4] = {c.B, c.Hk, c.Sk, c.Dv}, od[4] = {c.B, c.Hq, c.Sq, c.Dv};
    const int64_t nq = layout_strides(c.layout, qd, &p.q_stride), nk = layout_strides(c.layout, kd, &p.k_stride);
    const int64_t nv = layout_strides(c.layout, vd, &p.v_stride), no = layout_strides(c.layout, od, &p.o_stride);
    const int64_t rows = c.B * c.Hq * c.Sq, nb = c.bias ? c.bias_b * c.bias_h * c.Sq * c.Sk : 0;
    const size_t es = fa_dtype_size(c.dt);

    void *q = tu_alloc((size_t)nq * es), *k = tu_alloc((size_t)nk * es), *v = tu_alloc((size_t)nv * es);
    void *o = tu_alloc((size_t)no * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)rows);
    float *bias = c.bias ? tu_alloc(sizeof(float) * (size_t)nb) : NULL;
    float *slopes = c.alibi ? tu_alloc(sizeof(float) * (size_t)c.Hq) : NULL;
    int32_t *qseg = c.seg ? tu_alloc(sizeof(int32_t) * (size_t)(c.B * c.Sq)) : NULL;
    int32_t *kseg = c.seg ? tu_alloc(sizeof(int32_t) * (size_t)(c.B * c.Sk)) : NULL;
    fill_qk(&c, &rng, q, nq);
    fill_qk(&c, &rng, k, nk);
    tu_fill(&rng, c.dt, v, nv, 1.0);
    for (int64_t i = 0; i < nb; i++) {
        bias[i] = (float)(2.0 * tu_uniform(&rng));
        if ((tu_uniform(&rng) + 1) / 2 < c.bias_ninf) bias[i] = -INFINITY;
    }
    if (c.bias_dead) /* some whole rows hidden */
        for (int64_t r = 0; r < c.bias_b * c.bias_h * c.Sq; r++)
            if (tu_int(&rng, 0, 3) == 0)
                for (int64_t j = 0; j < c.Sk; j++) bias[r * c.Sk + j] = -INFINITY;
    for (int64_t h = 0; slopes && h < c.Hq; h++)
        slopes[h] = c.alibi == 2 ? ldexpf(1.0f, -(int)tu_int(&rng, 1, 8)) : (float)(0.02 + 0.25 * (tu_uniform(&rng) + 1));
    for (int64_t bb = 0; c.seg && bb < c.B; bb++) {
        const int64_t nseg = tu_int(&rng, 1, 4);
        for (int64_t i = 0; i < c.Sq; i++)
            qseg[bb * c.Sq + i] = c.seg == 1   ? (int32_t)(i * nseg / c.Sq)
                                  : c.seg == 2 ? (int32_t)tu_int(&rng, 0, 2)
                                               : (int32_t)(tu_int(&rng, 0, 2) == 0 ? 9 : tu_int(&rng, 0, 1));
        for (int64_t j = 0; j < c.Sk; j++)
            kseg[bb * c.Sk + j] = c.seg == 1 ? (int32_t)(j * nseg / c.Sk) : (int32_t)tu_int(&rng, 0, c.seg == 2 ? 2 : 1);
    }
    tu_poison(c.dt, o, no);
    for (int64_t i = 0; i < rows; i++) lse[i] = NAN;

    fa_options opt = {FA_BACKEND_CPU, c.threads, c.bq, c.bk};
    fa_plan *plan = NULL;
    fa_status st = fa_plan_create(&p, &opt, &plan);
    if (st != FA_OK) {
        fprintf(stderr, "plan: %s\n", fa_last_error());
        fail(&c, "fa_plan_create status", st, 0);
    }
    fa_cost cost;
    fa_plan_cost(plan, FA_FORWARD, &cost);
    fa_counts counts = {0, 0};
    fa_forward_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = c.no_lse ? NULL : lse;
    a.bias = bias, a.alibi_slopes = slopes, a.q_segment_ids = qseg, a.kv_segment_ids = kseg;
    a.counts = &counts;
    if (c.user_ws) a.workspace_size = (size_t)cost.workspace_bytes, a.workspace = tu_alloc(a.workspace_size);
    st = fa_forward(plan, &a);
    if (st != FA_OK) {
        fprintf(stderr, "forward: %s\n", fa_last_error());
        fail(&c, "fa_forward status", st, 0);
    }
    if (fa_plan_exact(plan) && (counts.flops != cost.flops || counts.transcendentals != cost.transcendentals))
        fail(&c, "counted flops (plan's in bound)", (double)counts.flops, (double)cost.flops);

    double *ro = tu_alloc(sizeof(double) * (size_t)(rows * c.Dv)), *rl = tu_alloc(sizeof(double) * (size_t)rows);
    fa_forward_args ra = a;
    ra.counts = NULL;
    fa_ref_forward(&p, &ra, ro, rl);
    const fa_problem *pp = fa_plan_problem(plan); /* strides resolved */
    char *touched = calloc((size_t)no, 1);
    double maxref = 0, maxerr = 0, lse_err = 0, max_lse = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t bb = r / (c.Hq * c.Sq), h = r / c.Sq % c.Hq, i = r % c.Sq;
        for (int64_t x = 0; x < c.Dv; x++) {
            const int64_t off = chk_offset(&pp->o_stride, bb, h, i, x);
            touched[off] = 1;
            const double got = chk_load(c.dt, o, off), want = ro[r * c.Dv + x];
            if (isnan(got)) fail(&c, "NaN in o at flat row", (double)r, 0);
            if (fabs(want) > maxref) maxref = fabs(want);
            if (fabs(got - want) > maxerr) maxerr = fabs(got - want);
        }
        if (isfinite(rl[r]) && fabs(rl[r]) > max_lse) max_lse = fabs(rl[r]);
        if (c.no_lse) continue;
        if (isinf(rl[r]) || isinf(lse[r])) {
            if ((double)lse[r] != rl[r]) fail(&c, "lse of a row with no visible key, row", (double)r, 0);
            continue;
        }
        const double e = fabs(lse[r] - rl[r]) / (1 + fabs(rl[r]));
        if (!(e <= lse_err)) lse_err = e;
    }
    for (int64_t i = 0; i < no; i++)
        if (!touched[i] && !isnan(chk_load(c.dt, o, i))) fail(&c, "o written outside its view at", (double)i, 0);
    /* integer q, k give exact f32 scores only with a power-of-two scale and nothing inexact
     * added (no bias, no softcap, ALiBi slopes powers of two), as in test_forward.c */
    const int exact = c.integer && c.has_scale && c.scale != 0.1f && !c.bias && c.softcap == 0 && c.alibi != 1;
    const double tol = c.dt == FA_F16 ? TOL_F16 : c.dt == FA_BF16 ? TOL_BF16
                                                                  : TOL_F32 * (exact || max_lse < 8 ? 1 : max_lse / 8);
    const double ratio = maxerr / (maxref > 0 ? maxref : 1);
    if (!(ratio <= tol)) fail(&c, "max|o - ref| / max|ref|", ratio, tol);
    if (!(lse_err <= TOL_LSE)) fail(&c, "lse relative error", lse_err, TOL_LSE);

    free(touched), free(ro), free(rl), free(a.workspace);
    fa_plan_destroy(plan);
    free(q), free(k), free(v), free(o), free(lse), free(bias), free(slopes), free(qseg), free(kseg);
    return 0;
}
