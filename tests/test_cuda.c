/* Uses test-only device helpers on purpose (src/cuda/cuda_mem.h).
 * The CUDA backend against the float64 reference: forward (o, lse) and backward (dq, dk,
 * dv) on the shared case list (cases.h: every head-dim class and option, D in {32, 40, 64,
 * 72, 96, 128, 160, 256}, Dv != D, causal, windows, Sq != Sk both ways, rows with no visible
 * key, softcap, broadcast bias with -inf entries, ALiBi, segment ids, GQA/MQA, BSHD and
 * non-unit-stride layouts, f16 and bf16; its f32 rows in bf16), then random ones. Each case
 * also checks that the kernels' counts equal the plan's figures, that every output element
 * was written (outputs start as NaN), and that the backward is bit-for-bit deterministic.
 * A row the CUDA plan refuses as unsupported (FA_ERR_UNSUPPORTED) is reported SKIP.
 *
 * On a compute capability 9.0 device everything runs a second time with the Hopper forward
 * opted in (FA_CUDA_KERNEL=hopper), and at least one case must have reached it.
 *
 * Without a CUDA device (or without CUDA in the build) it prints "SKIP: no CUDA device"
 * and exits 77 (skipped). FA_TEST_SEED reproduces a run; FA_TEST_CUDA_RANDOM sets the random cases. */
#include "cases.h"

#include "cuda/cuda_mem.h"
#include "ref/ref.h"

static uint64_t rng;
static int cases_run;

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

/* One gradient or output against its reference under CUDA's bounds; 0 if it fails. */
static int cuda_check(const char *name, fa_dtype dt, const void *got, const fa_strides *st, const double *ref,
                      int64_t B, int64_t H, int64_t S, int64_t W) {
    const int64_t dims[4] = {B, H, S, W};
    return check_tensor(name, dt, got, st, ref, dims, check_tol_cuda(dt), NULL, 0).faults == 0;
}

static void run_case(const fa_case *tc) {
    const fa_dtype dt = tc->dt == FA_F32 ? FA_BF16 : tc->dt; /* no f32 kernels on CUDA */
    fa_problem p = fa_case_problem(tc);
    p.dtype = dt;
    p.q_stride = layout_strides(tc->layout, tc->Hq, tc->Sq, tc->D, 1);
    p.k_stride = layout_strides(tc->layout, tc->Hk, tc->Sk, tc->D, 0);
    p.v_stride = layout_strides(tc->layout, tc->Hk, tc->Sk, tc->Dv, 0);
    p.o_stride = layout_strides(tc->layout, tc->Hq, tc->Sq, tc->Dv, 1);
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CUDA;
    fa_plan *plan = NULL;
    const fa_status ps = fa_plan_create(&p, &opt, &plan);
    if (ps == FA_ERR_UNSUPPORTED) {
        printf("SKIP %s: %s\n", tc->name, fa_last_error());
        return;
    }
    CHECK(ps == FA_OK, "%s: plan: %s", tc->name, fa_last_error());
    if (ps != FA_OK) return;
    cases_run++;
    const fa_problem *pp = fa_plan_problem(plan);
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
        fa_case_segments(tc, qseg, kseg);
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

    /* forward; the reference reads the same inputs on the host */
    fa_counts cnt = {0, 0};
    const fa_forward_args fa = {.q = Dq, .k = Dk, .v = Dv, .o = Do, .lse = Dlse, .bias = Dbias, .alibi_slopes = Dsl,
                                .q_segment_ids = Dqs, .kv_segment_ids = Dks, .counts = &cnt};
    const fa_forward_args ha = {.q = q, .k = k, .v = v, .bias = bias, .alibi_slopes = slopes, .q_segment_ids = qseg,
                                .kv_segment_ids = kseg};
    fa_cost fc, bc;
    fa_plan_cost(plan, FA_FORWARD, &fc);
    fa_plan_cost(plan, FA_BACKWARD, &bc);
    const int before = failures;
    const fa_status fs = fa_forward(plan, &fa);
    CHECK(fs == FA_OK, "%s: forward: %s", tc->name, fa_last_error());
    void *o = tu_alloc(no * es);
    float *lse = tu_alloc(nl * 4);
    if (fs == FA_OK) {
        to_host(o, Do, no * es);
        to_host(lse, Dlse, nl * 4);
        CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals,
              "%s: forward counts flops %lld trans %lld, plan says %lld and %lld", tc->name, (long long)cnt.flops,
              (long long)cnt.transcendentals, (long long)fc.flops, (long long)fc.transcendentals);
        double *ro = tu_alloc(tc->B * tc->Hq * tc->Sq * tc->Dv * 8), *rl = tu_alloc(nl * 8);
        fa_ref_forward(pp, &ha, ro, rl);
        cuda_check("o", dt, o, &pp->o_stride, ro, tc->B, tc->Hq, tc->Sq, tc->Dv);
        const int64_t ld[4] = {tc->B, tc->Hq, tc->Sq, 1};
        check_tensor("lse", FA_F32, lse, &(fa_strides){{0, 0, 0, 0}}, rl, ld, CHECK_TOL_CUDA_LSE, NULL, 1);
        free(ro);
        free(rl);
    }

    /* backward: from our own o and lse; twice, bit-for-bit equal */
    if (failures == before) {
        void *Ddq = dev_copy(poison, nq * es), *Ddk = dev_copy(poison, nk * es), *Ddv = dev_copy(poison, nv * es);
        fa_counts bcnt = {0, 0};
        fa_backward_args ba = {.q = Dq, .k = Dk, .v = Dv, .o = Do, .d_o = Ddo, .lse = Dlse, .dq = Ddq, .dk = Ddk,
                               .dv = Ddv, .bias = Dbias, .alibi_slopes = Dsl, .q_segment_ids = Dqs,
                               .kv_segment_ids = Dks, .counts = &bcnt};
        void *gq = tu_alloc(nq * es), *gk = tu_alloc(nk * es), *gv = tu_alloc(nv * es);
        void *gq2 = tu_alloc(nq * es), *gk2 = tu_alloc(nk * es), *gv2 = tu_alloc(nv * es);
        const fa_status bs = fa_backward(plan, &ba);
        CHECK(bs == FA_OK, "%s: backward: %s", tc->name, fa_last_error());
        if (bs == FA_OK) {
            to_host(gq, Ddq, nq * es);
            to_host(gk, Ddk, nk * es);
            to_host(gv, Ddv, nv * es);
            CHECK(bcnt.flops == bc.flops && bcnt.transcendentals == bc.transcendentals,
                  "%s: backward counts flops %lld trans %lld, plan says %lld and %lld", tc->name,
                  (long long)bcnt.flops, (long long)bcnt.transcendentals, (long long)bc.flops,
                  (long long)bc.transcendentals);
            /* the caller's workspace, this time, and no counts */
            void *ws = NULL;
            fa_cuda_malloc(&ws, (size_t)bc.workspace_bytes);
            ba.workspace = ws;
            ba.workspace_size = (size_t)bc.workspace_bytes;
            ba.counts = NULL;
            const int again = fa_backward(plan, &ba) == FA_OK && fa_cuda_synchronize() == FA_OK;
            CHECK(again, "%s: second backward: %s", tc->name, fa_last_error());
            if (again) {
                to_host(gq2, Ddq, nq * es);
                to_host(gk2, Ddk, nk * es);
                to_host(gv2, Ddv, nv * es);
                CHECK(!memcmp(gq, gq2, nq * es) && !memcmp(gk, gk2, nk * es) && !memcmp(gv, gv2, nv * es),
                      "%s: the backward is not deterministic", tc->name);
            }
            fa_cuda_free(ws);
            const fa_backward_args hb = {.q = q, .k = k, .v = v, .d_o = d_o, .bias = bias, .alibi_slopes = slopes,
                                         .q_segment_ids = qseg, .kv_segment_ids = kseg};
            double *rq = tu_alloc(tc->B * tc->Hq * tc->Sq * tc->D * 8);
            double *rk = tu_alloc(tc->B * tc->Hk * tc->Sk * tc->D * 8), *rv = tu_alloc(tc->B * tc->Hk * tc->Sk * tc->Dv * 8);
            fa_ref_backward(pp, &hb, rq, rk, rv);
            cuda_check("dq", dt, gq, &pp->q_stride, rq, tc->B, tc->Hq, tc->Sq, tc->D);
            cuda_check("dk", dt, gk, &pp->k_stride, rk, tc->B, tc->Hk, tc->Sk, tc->D);
            cuda_check("dv", dt, gv, &pp->v_stride, rv, tc->B, tc->Hk, tc->Sk, tc->Dv);
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
    CHECK(s == FA_ERR_UNSUPPORTED, "f32 on cuda: status %d (%s), expected FA_ERR_UNSUPPORTED", (int)s, fa_last_error());
    if (s == FA_ERR_UNSUPPORTED) printf("PASS f32 on cuda is refused: %s\n", fa_last_error());
    fa_plan_destroy(plan);
}

/* Every row of the case list, then nrand random ones; labels the lines with pass ("" or
 * "hopper "). */
static void run_cases(const char *pass, int nrand) {
    for (int i = 0; i < FA_CASE_COUNT; i++) {
        const int before = failures;
        run_case(&FA_CASES[i]);
        printf("%s %s%s\n", failures == before ? "PASS" : "FAIL", pass, FA_CASES[i].name);
    }
    /* random cases */
    static const int64_t dims[] = {8, 40, 64, 72, 128, 136, 200, 256};
    static const int64_t seqs[] = {1, 17, 64, 65, 128, 191, 256};
    char name[160];
    for (int r = 0; r < nrand; r++) {
        fa_case c = {.name = name, .B = tu_int(&rng, 1, 2), .Sq = seqs[tu_int(&rng, 0, 6)],
                     .Sk = seqs[tu_int(&rng, 0, 6)], .D = dims[tu_int(&rng, 0, 7)]};
        c.dt = tu_int(&rng, 0, 1) ? FA_BF16 : FA_F16;
        c.Dv = tu_int(&rng, 0, 2) ? c.D : dims[tu_int(&rng, 0, 7)];
        c.Hk = tu_int(&rng, 1, 2);
        c.Hq = c.Hk * tu_int(&rng, 1, 3);
        c.causal = tu_int(&rng, 0, 1);
        if (tu_int(&rng, 0, 3) == 0) c.window = 1, c.wl = tu_int(&rng, 0, 70), c.wr = tu_int(&rng, -1, 30);
        if (tu_int(&rng, 0, 3) == 0) c.softcap = 3.f;
        if (tu_int(&rng, 0, 3) == 0) c.bias = (int)tu_int(&rng, 1, 2);
        c.alibi = tu_int(&rng, 0, 3) == 0;
        c.seg = tu_int(&rng, 0, 4) == 0;
        c.layout = (int)tu_int(&rng, 0, 2);
        snprintf(name, sizeof name,
                 "random B%lld Hq%lld Hk%lld Sq%lld Sk%lld D%lld Dv%lld %s c%d w(%lld,%lld) sc%g b%d a%d s%d l%d",
                 (long long)c.B, (long long)c.Hq, (long long)c.Hk, (long long)c.Sq, (long long)c.Sk, (long long)c.D,
                 (long long)c.Dv, c.dt == FA_BF16 ? "bf16" : "f16", c.causal, (long long)(c.window ? c.wl : -1),
                 (long long)(c.window ? c.wr : -1), (double)c.softcap, c.bias, c.alibi, c.seg, c.layout);
        const int before = failures;
        run_case(&c);
        printf("%s %s%s\n", failures == before ? "PASS" : "FAIL", pass, c.name);
    }
}

int main(void) {
    if (!fa_cuda_available()) {
        printf("SKIP: no CUDA device (or flashattn built without CUDA)\n");
        return 77;
    }
    rng = check_seed("test_cuda");
    printf("test_cuda on %s\n", fa_cuda_device_name());
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
        CHECK(ran > 0, "hopper pass: FA_CUDA_KERNEL=hopper never reached the Hopper kernel");
    } else {
        printf("SKIP hopper pass: compute capability %d, not 90\n", fa_cuda_compute_capability());
    }
    printf("%d cases run\n", cases_run);
    return check_finish("test_cuda");
}
