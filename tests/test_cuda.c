/* The CUDA backend against the float64 reference: forward (o, lse) and backward (dq, dk,
 * dv) on fixed cases that cover every head-dim class and option (D in {32, 40, 64, 72,
 * 128, 160, 256}, Dv != D, causal, windows, Sq != Sk both ways, rows with no visible key,
 * softcap, broadcast bias with -inf entries, ALiBi, segment ids, GQA/MQA, BSHD and
 * non-unit-stride layouts, f16 and bf16), then random ones. Each case also checks that
 * the kernels' counts equal the plan's figures, that every output element was written
 * (outputs start as NaN), and that the backward is bit-for-bit deterministic.
 *
 * On a compute capability 9.0 device everything runs a second time with the Hopper forward
 * opted in (FA_CUDA_KERNEL=hopper), and at least one case must have reached it.
 *
 * Without a CUDA device (or without CUDA in the build) it prints "SKIP: no CUDA device"
 * and exits 77 (skipped). FA_TEST_SEED reproduces a run; FA_TEST_CUDA_RANDOM sets the random cases. */
#include "test_util.h"

#include "cuda/cuda_mem.h"
#include "ref/ref.h"

static uint64_t seed, rng;
static int failures, cases_run;

/* max|x - ref| / max|ref|: f16 (u = 4.9e-4) and bf16 (u = 3.9e-3) round inputs exactly
 * as the reference reads them; p, dS and the outputs are rounded once more each, so the
 * forward stays within a few u and the gradients (sums of rounded dS terms) within ~5u. */
#define TOL_F16 1e-2
#define TOL_BF16 4e-2
/* lse from f32 scores and f32 row sums of unrounded p (ex2.approx: ~2 ulp) */
#define TOL_LSE 1e-4

typedef struct {
    const char *name;
    int64_t B, Hq, Hk, Sq, Sk, D, Dv;
    fa_dtype dt;
    int causal;
    int64_t wl, wr;
    float softcap;
    int bias;              /* 1: [1, Hq, Sq, Sk] with some -inf; 2: [B, 1, Sq, Sk] */
    int alibi;
    int seg;
    int layout;            /* 0 BHSD, 1 BSHD, 2 q/o with column stride 2 (no 16-byte rows) */
    float bias_scale;      /* 0: not set (1) */
} tcase;

static int64_t elems(const fa_strides *st, const int64_t dims[4]) {
    int64_t last = 0;
    for (int i = 0; i < 4; i++) last += (dims[i] - 1) * st->s[i];
    return last + 1;
}

/* Strides for a [B, H, S, W] tensor in the case's layout (zero: contiguous BHSD). */
static fa_strides layout_strides(int layout, int64_t H, int64_t S, int64_t W, int is_q_or_o) {
    fa_strides st = {{0, 0, 0, 0}};
    if (layout == 1) {
        st.s[3] = 1;
        st.s[1] = W;
        st.s[2] = H * W;
        st.s[0] = S * H * W;
    } else if (layout == 2 && is_q_or_o) {
        st.s[3] = 2;
        st.s[2] = 2 * W + 2;
        st.s[1] = S * st.s[2];
        st.s[0] = H * st.s[1];
    }
    return st;
}

typedef struct {
    double max_err, max_ref;
    int64_t nan, worst;
} cmp;

/* Compares n elements of a [B, H, S, W] tensor read through strides st (dtype dt) with a
 * contiguous double reference. */
static cmp compare(fa_dtype dt, const void *x, const fa_strides *st, const double *ref, int64_t B, int64_t H,
                   int64_t S, int64_t W) {
    cmp c = {0, 0, 0, -1};
    int64_t idx = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t w = 0; w < W; w++, idx++) {
                    double v = fa_load(dt, x, fa_offset(st, b, h, s, w)), r = ref[idx];
                    if (isnan(v)) {
                        if (!c.nan) c.worst = idx;
                        c.nan++;
                        continue;
                    }
                    double e = fabs(v - r);
                    if (e > c.max_err) {
                        c.max_err = e;
                        if (!c.nan) c.worst = idx;
                    }
                    if (fabs(r) > c.max_ref) c.max_ref = fabs(r);
                }
    return c;
}

static int check_cmp(const tcase *tc, const char *what, cmp c, double tol) {
    double rel = c.max_err / (c.max_ref > 1e-30 ? c.max_ref : 1.0);
    if (c.nan || rel > tol) {
        if (failures < 8)
            printf("FAIL %s: %s %s (%lld NaN/unwritten, max err %.3g of max |ref| %.3g = %.3g > %.1g) at flat "
                   "index %lld; seed %llu\n",
                   tc->name, what, c.nan ? "not all written" : "too far", (long long)c.nan, c.max_err, c.max_ref,
                   rel, tol, (long long)c.worst, (unsigned long long)seed);
        failures++;
        return 0;
    }
    return 1;
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    if (fa_cuda_malloc(&d, bytes) != FA_OK || fa_cuda_memcpy_to_device(d, host, bytes) != FA_OK) {
        printf("FAIL device memory: %s\n", fa_last_error());
        exit(1);
    }
    return d;
}
static void to_host(void *host, const void *dev, size_t bytes) {
    if (fa_cuda_memcpy_to_host(host, dev, bytes) != FA_OK) {
        printf("FAIL copy back: %s\n", fa_last_error());
        exit(1);
    }
}

static void run_case(const tcase *tc) {
    cases_run++;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = tc->B;
    p.heads_q = tc->Hq;
    p.heads_kv = tc->Hk;
    p.seq_q = tc->Sq;
    p.seq_k = tc->Sk;
    p.head_dim = tc->D;
    p.head_dim_v = tc->Dv;
    p.dtype = tc->dt;
    p.causal = tc->causal;
    p.window_left = tc->wl;
    p.window_right = tc->wr;
    p.softcap = tc->softcap;
    p.q_stride = layout_strides(tc->layout, tc->Hq, tc->Sq, tc->D, 1);
    p.k_stride = layout_strides(tc->layout, tc->Hk, tc->Sk, tc->D, 0);
    p.v_stride = layout_strides(tc->layout, tc->Hk, tc->Sk, tc->Dv, 0);
    p.o_stride = layout_strides(tc->layout, tc->Hq, tc->Sq, tc->Dv, 1);
    if (tc->bias) {
        p.has_bias = 1;
        p.bias_batch = tc->bias == 2 ? tc->B : 1;
        p.bias_heads = tc->bias == 1 ? tc->Hq : 1;
    }
    if (tc->bias_scale != 0.0f) p.has_bias_scale = 1, p.bias_scale = tc->bias_scale;
    p.has_alibi = tc->alibi;
    p.has_segment_ids = tc->seg;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CUDA;
    fa_plan *plan = NULL;
    if (fa_plan_create(&p, &opt, &plan) != FA_OK) {
        printf("FAIL %s: plan: %s\n", tc->name, fa_last_error());
        failures++;
        return;
    }
    const fa_problem *pp = fa_plan_problem(plan);
    const fa_dtype dt = tc->dt;
    const size_t es = fa_dtype_size(dt);
    const int64_t qd[4] = {tc->B, tc->Hq, tc->Sq, tc->D}, kd[4] = {tc->B, tc->Hk, tc->Sk, tc->D},
                  vd[4] = {tc->B, tc->Hk, tc->Sk, tc->Dv}, od[4] = {tc->B, tc->Hq, tc->Sq, tc->Dv};
    const int64_t nq = elems(&pp->q_stride, qd), nk = elems(&pp->k_stride, kd), nv = elems(&pp->v_stride, vd),
                  no = elems(&pp->o_stride, od), nl = tc->B * tc->Hq * tc->Sq;

    /* host inputs (scores of a few units: q, k in [-2, 2)) */
    void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *v = tu_alloc(nv * es), *d_o = tu_alloc(no * es);
    tu_fill(&rng, dt, q, nq, 2.0);
    tu_fill(&rng, dt, k, nk, 2.0);
    tu_fill(&rng, dt, v, nv, 1.0);
    tu_fill(&rng, dt, d_o, no, 1.0);
    float *bias = NULL, *slopes = NULL;
    int32_t *qseg = NULL, *kseg = NULL;
    int64_t nb = 0;
    if (tc->bias) {
        nb = pp->bias_batch * pp->bias_heads * tc->Sq * tc->Sk;
        bias = tu_alloc(nb * 4);
        for (int64_t i = 0; i < nb; i++) bias[i] = tu_uniform(&rng) < -0.9 ? -INFINITY : (float)tu_uniform(&rng);
    }
    if (tc->alibi) {
        slopes = tu_alloc(tc->Hq * 4);
        for (int64_t h = 0; h < tc->Hq; h++) slopes[h] = (float)(0.5 * (1 + tu_uniform(&rng)) / (h + 1));
    }
    if (tc->seg) {
        qseg = tu_alloc(tc->B * tc->Sq * 4);
        kseg = tu_alloc(tc->B * tc->Sk * 4);
        for (int64_t i = 0; i < tc->B * tc->Sq; i++) qseg[i] = (int32_t)((i % tc->Sq) * 3 / tc->Sq);
        for (int64_t i = 0; i < tc->B * tc->Sk; i++) kseg[i] = (int32_t)((i % tc->Sk) * 3 / tc->Sk);
        qseg[0] = 7; /* a row that matches no key */
    }

    /* device copies; outputs start as NaN */
    void *poison = tu_alloc((size_t)(nq > no ? nq : no) * es + nl * 4 + (nk > nv ? nk : nv) * es);
    tu_poison(dt, poison, (nq > no ? nq : no) + (nk > nv ? nk : nv));
    void *Dq = dev_copy(q, nq * es), *Dk = dev_copy(k, nk * es), *Dv = dev_copy(v, nv * es);
    void *Ddo = dev_copy(d_o, no * es), *Do = dev_copy(poison, no * es);
    float *lse_poison = tu_alloc(nl * 4);
    for (int64_t i = 0; i < nl; i++) lse_poison[i] = NAN;
    float *Dlse = dev_copy(lse_poison, nl * 4);
    float *Dbias = bias ? dev_copy(bias, nb * 4) : NULL, *Dsl = slopes ? dev_copy(slopes, tc->Hq * 4) : NULL;
    int32_t *Dqs = qseg ? dev_copy(qseg, tc->B * tc->Sq * 4) : NULL, *Dks = kseg ? dev_copy(kseg, tc->B * tc->Sk * 4) : NULL;

    /* forward */
    fa_forward_args fa = {0};
    fa.q = Dq;
    fa.k = Dk;
    fa.v = Dv;
    fa.o = Do;
    fa.lse = Dlse;
    fa.bias = Dbias;
    fa.alibi_slopes = Dsl;
    fa.q_segment_ids = Dqs;
    fa.kv_segment_ids = Dks;
    fa_counts cnt = {0, 0};
    fa.counts = &cnt;
    fa_cost fc, bc;
    fa_plan_cost(plan, FA_FORWARD, &fc);
    fa_plan_cost(plan, FA_BACKWARD, &bc);
    int ok = 1;
    if (fa_forward(plan, &fa) != FA_OK) {
        printf("FAIL %s: forward: %s\n", tc->name, fa_last_error());
        failures++;
        ok = 0;
    }
    void *o = tu_alloc(no * es);
    float *lse = tu_alloc(nl * 4);
    if (ok) {
        to_host(o, Do, no * es);
        to_host(lse, Dlse, nl * 4);
        if (cnt.flops != fc.flops || cnt.transcendentals != fc.transcendentals) {
            printf("FAIL %s: forward counts flops %lld trans %lld, plan says %lld and %lld\n", tc->name,
                   (long long)cnt.flops, (long long)cnt.transcendentals, (long long)fc.flops,
                   (long long)fc.transcendentals);
            failures++;
            ok = 0;
        }
        fa_forward_args ha = {0};
        ha.q = q;
        ha.k = k;
        ha.v = v;
        ha.bias = bias;
        ha.alibi_slopes = slopes;
        ha.q_segment_ids = qseg;
        ha.kv_segment_ids = kseg;
        double *ro = tu_alloc(tc->B * tc->Hq * tc->Sq * tc->Dv * 8), *rl = tu_alloc(nl * 8);
        fa_ref_forward(pp, &ha, ro, rl);
        ok &= check_cmp(tc, "o", compare(dt, o, &pp->o_stride, ro, tc->B, tc->Hq, tc->Sq, tc->Dv),
                        dt == FA_BF16 ? TOL_BF16 : TOL_F16);
        for (int64_t i = 0; i < nl; i++) {
            int bad = isinf(rl[i]) ? !(isinf(lse[i]) && lse[i] < 0) : !(fabs(lse[i] - rl[i]) <= TOL_LSE * (1 + fabs(rl[i])));
            if (bad) {
                if (failures < 8)
                    printf("FAIL %s: lse[%lld] = %.8g, reference %.8g; seed %llu\n", tc->name, (long long)i, lse[i],
                           rl[i], (unsigned long long)seed);
                failures++;
                ok = 0;
                break;
            }
        }
        free(ro);
        free(rl);
    }

    /* backward: from our own o and lse; twice, bit-for-bit equal */
    if (ok) {
        void *Ddq = dev_copy(poison, nq * es), *Ddk = dev_copy(poison, nk * es), *Ddv = dev_copy(poison, nv * es);
        fa_backward_args ba = {0};
        ba.q = Dq;
        ba.k = Dk;
        ba.v = Dv;
        ba.o = Do;
        ba.d_o = Ddo;
        ba.lse = Dlse;
        ba.dq = Ddq;
        ba.dk = Ddk;
        ba.dv = Ddv;
        ba.bias = Dbias;
        ba.alibi_slopes = Dsl;
        ba.q_segment_ids = Dqs;
        ba.kv_segment_ids = Dks;
        fa_counts bcnt = {0, 0};
        ba.counts = &bcnt;
        void *gq = tu_alloc(nq * es), *gk = tu_alloc(nk * es), *gv = tu_alloc(nv * es);
        void *gq2 = tu_alloc(nq * es), *gk2 = tu_alloc(nk * es), *gv2 = tu_alloc(nv * es);
        if (fa_backward(plan, &ba) != FA_OK) {
            printf("FAIL %s: backward: %s\n", tc->name, fa_last_error());
            failures++;
        } else {
            to_host(gq, Ddq, nq * es);
            to_host(gk, Ddk, nk * es);
            to_host(gv, Ddv, nv * es);
            if (bcnt.flops != bc.flops || bcnt.transcendentals != bc.transcendentals) {
                printf("FAIL %s: backward counts flops %lld trans %lld, plan says %lld and %lld\n", tc->name,
                       (long long)bcnt.flops, (long long)bcnt.transcendentals, (long long)bc.flops,
                       (long long)bc.transcendentals);
                failures++;
            }
            /* the caller's workspace, this time, and no counts */
            void *ws = NULL;
            fa_cuda_malloc(&ws, (size_t)bc.workspace_bytes);
            ba.workspace = ws;
            ba.workspace_size = (size_t)bc.workspace_bytes;
            ba.counts = NULL;
            if (fa_backward(plan, &ba) != FA_OK || fa_cuda_synchronize() != FA_OK) {
                printf("FAIL %s: second backward: %s\n", tc->name, fa_last_error());
                failures++;
            } else {
                to_host(gq2, Ddq, nq * es);
                to_host(gk2, Ddk, nk * es);
                to_host(gv2, Ddv, nv * es);
                if (memcmp(gq, gq2, nq * es) || memcmp(gk, gk2, nk * es) || memcmp(gv, gv2, nv * es)) {
                    printf("FAIL %s: the backward is not deterministic\n", tc->name);
                    failures++;
                }
            }
            fa_cuda_free(ws);
            fa_backward_args hb = {0};
            hb.q = q;
            hb.k = k;
            hb.v = v;
            hb.d_o = d_o;
            hb.bias = bias;
            hb.alibi_slopes = slopes;
            hb.q_segment_ids = qseg;
            hb.kv_segment_ids = kseg;
            double *rq = tu_alloc(tc->B * tc->Hq * tc->Sq * tc->D * 8);
            double *rk = tu_alloc(tc->B * tc->Hk * tc->Sk * tc->D * 8), *rv = tu_alloc(tc->B * tc->Hk * tc->Sk * tc->Dv * 8);
            fa_ref_backward(pp, &hb, rq, rk, rv);
            const double tol = dt == FA_BF16 ? TOL_BF16 : TOL_F16;
            check_cmp(tc, "dq", compare(dt, gq, &pp->q_stride, rq, tc->B, tc->Hq, tc->Sq, tc->D), tol);
            check_cmp(tc, "dk", compare(dt, gk, &pp->k_stride, rk, tc->B, tc->Hk, tc->Sk, tc->D), tol);
            check_cmp(tc, "dv", compare(dt, gv, &pp->v_stride, rv, tc->B, tc->Hk, tc->Sk, tc->Dv), tol);
            free(rq);
            free(rk);
            free(rv);
        }
        free(gq), free(gk), free(gv), free(gq2), free(gk2), free(gv2);
        fa_cuda_free(Ddq), fa_cuda_free(Ddk), fa_cuda_free(Ddv);
    }

    fa_cuda_free(Dq), fa_cuda_free(Dk), fa_cuda_free(Dv), fa_cuda_free(Ddo), fa_cuda_free(Do), fa_cuda_free(Dlse);
    fa_cuda_free(Dbias), fa_cuda_free(Dsl), fa_cuda_free(Dqs), fa_cuda_free(Dks);
    free(q), free(k), free(v), free(d_o), free(o), free(lse), free(lse_poison), free(poison);
    free(bias), free(slopes), free(qseg), free(kseg);
    fa_plan_destroy(plan);
}

static tcase mk(const char *name, int64_t B, int64_t Hq, int64_t Hk, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv,
                fa_dtype dt) {
    tcase c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.B = B, c.Hq = Hq, c.Hk = Hk, c.Sq = Sq, c.Sk = Sk, c.D = D, c.Dv = Dv, c.dt = dt;
    c.wl = c.wr = -1;
    return c;
}

/* A call the backend must refuse with a message, not crash on. */
static void check_refusals(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = 8, p.seq_k = 8, p.head_dim = 64, p.dtype = FA_F32;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CUDA;
    fa_plan *plan = NULL;
    if (fa_plan_create(&p, &opt, &plan) != FA_OK) return; /* refused at plan time: fine too */
    fa_forward_args a = {0};
    a.q = a.k = a.v = (void *)16;
    a.o = (void *)16;
    fa_status s = fa_forward(plan, &a);
    if (s != FA_ERR_UNSUPPORTED) {
        printf("FAIL f32 on cuda: status %d (%s), expected FA_ERR_UNSUPPORTED\n", (int)s, fa_last_error());
        failures++;
    } else {
        printf("PASS f32 on cuda is refused: %s\n", fa_last_error());
    }
    fa_plan_destroy(plan);
}

/* Every fixed case, then nrand random ones; labels the lines with pass ("" or "hopper "). */
static void run_cases(const char *pass, int nrand) {
    tcase fixed[24];
    int n = 0;
    fixed[n++] = mk("D64 bf16 plain", 2, 3, 3, 200, 200, 64, 64, FA_BF16);
    fixed[n] = mk("D128 bf16 causal", 1, 2, 2, 300, 300, 128, 128, FA_BF16), fixed[n++].causal = 1;
    fixed[n] = mk("D256 f16 causal Sk>Sq", 1, 2, 2, 130, 257, 256, 256, FA_F16), fixed[n++].causal = 1;
    fixed[n] = mk("D40 bf16 window Sq>Sk", 2, 2, 2, 257, 190, 40, 40, FA_BF16), fixed[n].wl = 17, fixed[n++].wr = 5;
    fixed[n] = mk("D72/Dv40 GQA softcap", 1, 4, 2, 150, 170, 72, 40, FA_BF16), fixed[n++].softcap = 2.5f;
    fixed[n] = mk("D64 f16 bias[1,H] alibi", 2, 2, 2, 140, 150, 64, 64, FA_F16), fixed[n].bias = 1,
    fixed[n++].alibi = 1;
    fixed[n] = mk("D128 bf16 segments causal", 2, 2, 1, 210, 210, 128, 128, FA_BF16), fixed[n].seg = 1,
    fixed[n++].causal = 1;
    fixed[n] = mk("D64 causal Sq>Sk (empty rows)", 1, 2, 2, 300, 100, 64, 64, FA_BF16), fixed[n++].causal = 1;
    fixed[n] = mk("D128 BSHD", 2, 4, 2, 129, 193, 128, 128, FA_BF16), fixed[n++].layout = 1;
    fixed[n] = mk("D256 MQA window bias[B,1]", 1, 4, 1, 100, 160, 256, 256, FA_BF16), fixed[n].wl = 40,
    fixed[n].wr = 0, fixed[n++].bias = 2;
    fixed[n++] = mk("D32 f16 tiny", 1, 1, 1, 7, 9, 32, 32, FA_F16);
    fixed[n] = mk("D160 f16 causal", 1, 2, 2, 170, 170, 160, 160, FA_F16), fixed[n++].causal = 1;
    fixed[n] = mk("D64 column stride 2", 1, 2, 2, 100, 120, 64, 64, FA_BF16), fixed[n++].layout = 2;
    fixed[n] = mk("D256/Dv128 softcap causal", 1, 2, 2, 140, 140, 256, 128, FA_BF16), fixed[n].softcap = 5.f,
    fixed[n++].causal = 1;
    fixed[n] = mk("D96 f16 everything", 2, 4, 2, 133, 145, 96, 96, FA_F16), fixed[n].causal = 1,
    fixed[n].softcap = 4.f, fixed[n].bias = 1, fixed[n].alibi = 1, fixed[n++].seg = 1;
    fixed[n++] = mk("D128 f16 long", 1, 1, 1, 1100, 1100, 128, 128, FA_F16);
    /* shapes the Hopper forward takes (D = Dv in {64, 128, 256}): many key tiles through
     * its stage ring, windows, one query row, one key */
    fixed[n] = mk("D256 bf16 window long", 1, 2, 2, 600, 700, 256, 256, FA_BF16), fixed[n].wl = 300,
    fixed[n++].wr = 50;
    fixed[n++] = mk("D128 GQA Sq=1 Sk=1000", 2, 4, 1, 1, 1000, 128, 128, FA_BF16);
    fixed[n] = mk("D64 f16 causal 513", 1, 3, 3, 513, 513, 64, 64, FA_F16), fixed[n++].causal = 1;
    fixed[n++] = mk("D128 f16 Sk=1", 1, 2, 2, 150, 1, 128, 128, FA_F16);
    fixed[n] = mk("D128 GQA softcap alibi", 1, 4, 2, 300, 260, 128, 128, FA_BF16), fixed[n].softcap = 3.f,
    fixed[n++].alibi = 1;
    fixed[n] = mk("D64 bias_scale 0.5, softcap 1 (saturated)", 1, 2, 2, 150, 170, 64, 64, FA_BF16);
    fixed[n].bias = 2, fixed[n].bias_scale = 0.5f, fixed[n++].softcap = 1.0f;
    for (int i = 0; i < n; i++) {
        int before = failures;
        run_case(&fixed[i]);
        printf("%s %s%s\n", failures == before ? "PASS" : "FAIL", pass, fixed[i].name);
    }
    /* random cases */
    static const int64_t dims[] = {8, 40, 64, 72, 128, 136, 200, 256};
    static const int64_t seqs[] = {1, 17, 64, 65, 128, 191, 256};
    char names[64][96];
    for (int r = 0; r < nrand && r < 64; r++) {
        tcase c = mk(names[r], tu_int(&rng, 1, 2), 1, 1, seqs[tu_int(&rng, 0, 6)], seqs[tu_int(&rng, 0, 6)],
                     dims[tu_int(&rng, 0, 7)], 0, tu_int(&rng, 0, 1) ? FA_BF16 : FA_F16);
        c.Dv = tu_int(&rng, 0, 2) ? c.D : dims[tu_int(&rng, 0, 7)];
        c.Hk = tu_int(&rng, 1, 2);
        c.Hq = c.Hk * tu_int(&rng, 1, 3);
        c.causal = tu_int(&rng, 0, 1);
        if (tu_int(&rng, 0, 3) == 0) c.wl = tu_int(&rng, 0, 70), c.wr = tu_int(&rng, -1, 30);
        if (tu_int(&rng, 0, 3) == 0) c.softcap = 3.f;
        if (tu_int(&rng, 0, 3) == 0) c.bias = (int)tu_int(&rng, 1, 2);
        c.alibi = tu_int(&rng, 0, 3) == 0;
        c.seg = tu_int(&rng, 0, 4) == 0;
        c.layout = (int)tu_int(&rng, 0, 2);
        snprintf(names[r], sizeof names[r],
                 "random B%lld Hq%lld Hk%lld Sq%lld Sk%lld D%lld Dv%lld %s c%d w(%lld,%lld) sc%g b%d a%d s%d l%d",
                 (long long)c.B, (long long)c.Hq, (long long)c.Hk, (long long)c.Sq, (long long)c.Sk, (long long)c.D,
                 (long long)c.Dv, c.dt == FA_BF16 ? "bf16" : "f16", c.causal, (long long)c.wl, (long long)c.wr,
                 (double)c.softcap, c.bias, c.alibi, c.seg, c.layout);
        int before = failures;
        run_case(&c);
        printf("%s %s%s\n", failures == before ? "PASS" : "FAIL", pass, c.name);
    }
}

int main(void) {
    if (!fa_cuda_available()) {
        printf("SKIP: no CUDA device (or flashattn built without CUDA)\n");
        return 77;
    }
    seed = tu_seed();
    rng = seed;
    printf("test_cuda on %s, seed %llu\n", fa_cuda_device_name(), (unsigned long long)seed);
    check_refusals();
    const char *e = getenv("FA_TEST_CUDA_RANDOM");
    const int nrand = e && *e ? atoi(e) : 12;
    /* the default kernels (mma.sync) even where the caller's environment opts in;
     * FA_TEST_CUDA_ONLY_HOPPER=1 skips this pass (a second Hopper variant's run) */
    unsetenv("FA_CUDA_KERNEL");
    const char *only = getenv("FA_TEST_CUDA_ONLY_HOPPER");
    if (!(only && !strcmp(only, "1"))) run_cases("", nrand);

    /* On sm_90 every case once more with the Hopper forward opted in (FA_CUDA_KERNEL=hopper):
     * the shapes in its scope run it, the rest must still fall back to mma.sync. */
    if (fa_cuda_compute_capability() == 90) {
        setenv("FA_CUDA_KERNEL", "hopper", 1);
        const long long before = fa_cuda_hopper_launches();
        const char *pp = getenv("FA_CUDA_HOPPER_PINGPONG"); /* the kernel reads it too */
        run_cases(pp && !strcmp(pp, "1") ? "hopper-pingpong " : "hopper ", nrand);
        const long long ran = fa_cuda_hopper_launches() - before;
        unsetenv("FA_CUDA_KERNEL");
        printf("hopper pass: %lld Hopper forward launches\n", ran);
        if (ran == 0) {
            printf("FAIL hopper pass: FA_CUDA_KERNEL=hopper never reached the Hopper kernel\n");
            failures++;
        }
    } else {
        printf("SKIP hopper pass: compute capability %d, not 90\n", fa_cuda_compute_capability());
    }
    printf("%d cases, %d failures (seed %llu)\n", cases_run, failures, (unsigned long long)seed);
    return failures ? 1 : 0;
}
