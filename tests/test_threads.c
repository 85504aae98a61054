/* The threaded CPU paths, small enough to run under ThreadSanitizer (tests/run_all.sh builds
 * this program with clang -fsanitize=thread and LLVM's OpenMP runtime): a few forward and
 * backward problems with 2, 3 and 4 threads and tiles small enough that every thread takes
 * many work items, a progress callback (the drivers' shared counter and its critical
 * section), a caller-supplied workspace carved per thread, and kv-cache decoding's
 * split-KV items and merge. Each result is compared with the float64 reference, and must
 * be bit-identical to the 1-thread result (no thread's share may depend on another's).
 * Seeded (FA_TEST_SEED reproduces a run). */
#include "backward_check.h"

/* The progress callback runs on one worker at a time; it checks the counts only grow. */
typedef struct {
    int64_t calls, last, total;
    int regressed;
} progress_log;

static void on_progress(void *ctx, int64_t done, int64_t total) {
    progress_log *l = ctx;
    if (done < l->last || (l->total && total != l->total)) l->regressed = 1;
    l->calls++, l->last = done, l->total = total;
}

/* fa_forward with threads, o and lse poisoned first; compares with the reference (the
 * bounds of test_forward.c) and, bitwise, with want_o when given. Returns o's copy. */
static void *forward_checked(tcase *c, const fa_plan *pl, const char *label, const void *want_o,
                             const double *ref_lse) {
    const fa_problem *p = &c->p, *rp = fa_plan_problem(pl);
    const int failures_before = failures;
    const size_t es = fa_dtype_size(p->dtype), obytes = (size_t)c->no * es;
    const int64_t rows = p->batch * p->heads_q * p->seq_q, Dv = p->head_dim_v;
    fa_cost cost;
    fa_plan_cost(pl, FA_FORWARD, &cost);
    void *ws = tu_alloc((size_t)cost.workspace_bytes);
    progress_log log = {0, 0, 0, 0};
    tu_poison(p->dtype, c->o, c->no);
    for (int64_t r = 0; r < rows; r++) c->lse[r] = NAN;
    fa_forward_args a = case_fwd_args(c);
    a.workspace = ws, a.workspace_size = (size_t)cost.workspace_bytes;
    a.progress = on_progress, a.progress_ctx = &log;
    fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    double max_lse = 0;
    for (int64_t r = 0; r < rows; r++)
        if (isfinite(ref_lse[r]) && fabs(ref_lse[r]) > max_lse) max_lse = fabs(ref_lse[r]);
    const int64_t od[4] = {p->batch, p->heads_q, p->seq_q, Dv}, ld[4] = {p->batch, p->heads_q, p->seq_q, 1};
    const check_tol tol = check_tol_scores(p->dtype, max_lse);
    const check_result ro = check_tensor(label, p->dtype, c->o, &rp->o_stride, c->o_exact, od, tol, NULL, 0);
    check_tensor(label, FA_F32, c->lse, &(fa_strides){{0, 0, 0, 0}}, ref_lse, ld, CHECK_TOL_LSE, NULL, 1);
    const double err = ro.mag > 0 ? ro.err / ro.mag : ro.err;
    CHECK(!log.regressed && log.calls > 0 && log.last == log.total, "%s: progress %lld calls, last %lld of %lld%s",
          label, (long long)log.calls, (long long)log.last, (long long)log.total, log.regressed ? ", went back" : "");
    if (want_o) CHECK(memcmp(c->o, want_o, obytes) == 0, "%s: forward o differs from the 1-thread result", label);
    printf("%s %s: forward o err %.2e (bound %.1e), %lld progress calls\n", failures > failures_before ? "FAIL" : "PASS", label, err,
           tol.atol, (long long)log.calls);
    free(ws);
    void *copy = tu_alloc(obytes);
    memcpy(copy, c->o, obytes);
    return copy;
}

/* KV-cache decoding (cpu/decode.c: split-KV work items taken by any thread, each thread's
 * scratch carved from a caller-supplied workspace, then the merge) with 1-4 threads: a
 * ragged bf16 batch, GQA 4:1, D = 128 (the fused AVX512_BF16 kernels where the CPU has
 * them), cache rows past each length NaN. o and lse against the float64 reference, and o
 * bitwise against the 1-thread result. */
static void decode_threads(uint64_t *rng) {
    enum { B = 2, HQ = 8, HK = 2, D = 128, CAP = 1200 };
    int32_t lens[B] = {(int32_t)tu_int(rng, 1030, CAP), (int32_t)tu_int(rng, 0, 600)}; /* 2 or 3 chunks, and fewer */
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = HQ, p.heads_kv = HK, p.head_dim = D, p.head_dim_v = D, p.seq_q = 1, p.seq_k = CAP;
    p.dtype = FA_BF16, p.causal = 1, p.cache_seqlens = lens;
    const int64_t nq = B * HQ * D, nc = B * CAP * HK * D, nl = B * HQ;
    void *q = tu_alloc(nq * 2), *o = tu_alloc(nq * 2), *o1 = tu_alloc(nq * 2);
    void *k = tu_alloc(nc * 2), *v = tu_alloc(nc * 2);
    float *lse = tu_alloc(sizeof(float) * nl);
    double *ro = tu_alloc(sizeof(double) * nq), *rl = tu_alloc(sizeof(double) * nl);
    tu_fill(rng, FA_BF16, q, nq, 2.0);
    tu_poison(FA_BF16, k, nc), tu_poison(FA_BF16, v, nc); /* rows past each length: never read */
    for (int64_t b = 0; b < B; b++) {
        tu_fill(rng, FA_BF16, (char *)k + b * CAP * HK * D * 2, lens[b] * HK * D, 2.0);
        tu_fill(rng, FA_BF16, (char *)v + b * CAP * HK * D * 2, lens[b] * HK * D, 1.0);
    }
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    fa_ref_decode(&p, &a, ro, rl);
    for (int threads = 1; threads <= 4; threads++) {
        fa_plan *pl = check_plan(&p, threads, 0, 0);
        if (!pl) continue;
        fa_cost cost;
        fa_plan_cost(pl, FA_FORWARD, &cost);
        a.workspace_size = (size_t)cost.workspace_bytes;
        a.workspace = tu_alloc(a.workspace_size);
        tu_poison(FA_BF16, o, nq);
        for (int64_t r = 0; r < nl; r++) lse[r] = NAN;
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_OK, "decode, %d threads: fa_forward: %s", threads, fa_last_error());
        const int before = failures;
        const int64_t od[4] = {B, HQ, 1, D}, ld[4] = {B, HQ, 1, 1};
        const fa_strides flat = {{0, 0, 0, 0}};
        const check_result r = check_tensor("decode o", FA_BF16, o, &flat, ro, od, check_tol_of(FA_BF16), NULL, 0);
        check_tensor("decode lse", FA_F32, lse, &flat, rl, ld, CHECK_TOL_LSE, NULL, 1);
        const double eo = r.mag > 0 ? r.err / r.mag : r.err;
        if (threads == 1) memcpy(o1, o, (size_t)nq * 2);
        else CHECK(!memcmp(o, o1, (size_t)nq * 2), "decode, %d threads: o differs from the 1-thread result", threads);
        printf("%s decode (lengths %d, %d), %d threads: o err %.2e (bound %.2e)\n", failures > before ? "FAIL" : "PASS",
               lens[0], lens[1], threads, eo, check_tol_of(FA_BF16).atol);
        free(a.workspace);
        fa_plan_destroy(pl);
    }
    free(q), free(o), free(k), free(v), free(o1), free(lse), free(ro), free(rl);
}

typedef struct {
    const char *name;
    fa_dtype dt;
    int64_t B, Hq, Hk, Sq, Sk, D, Dv, bq, bk;
    int mask;
} config;

int main(void) {
    (void)case_forward_kernel; /* backward_check.h's; this test checks its own forward */
    uint64_t rng = check_seed("test_threads");
    static const config cfgs[] = {
        {"f32 causal GQA", FA_F32, 2, 4, 2, 67, 67, 32, 32, 16, 16, M_CAUSAL},
        {"bf16 window+bias+alibi+softcap", FA_BF16, 1, 2, 1, 50, 90, 24, 16, 8, 16,
         M_WINDOW | M_BIAS | M_ALIBI | M_SOFTCAP},
        {"f16 segments+bias(-inf)", FA_F16, 2, 2, 2, 40, 33, 16, 16, 8, 8, M_SEG | M_BIAS | M_NEGINF},
    };
    static const int threads[] = {2, 3, 4};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const config *f = &cfgs[k];
        fa_problem p;
        fa_problem_init(&p);
        p.batch = f->B, p.heads_q = f->Hq, p.heads_kv = f->Hk, p.seq_q = f->Sq, p.seq_k = f->Sk;
        p.head_dim = f->D, p.head_dim_v = f->Dv, p.dtype = f->dt;
        tcase c;
        case_init(&c, &p, f->mask, &rng, 1);
        fa_plan *one = check_plan(&c.p, 1, f->bq, f->bk);
        if (!one) continue;
        case_forward_ref(&c, one);
        const int64_t rows = p.batch * p.heads_q * p.seq_q;
        double *ref_lse = tu_alloc(sizeof(double) * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) ref_lse[r] = c.lse[r];
        char label[160];
        snprintf(label, sizeof label, "%s, 1 thread", f->name);
        void *o1 = forward_checked(&c, one, label, NULL, ref_lse);
        run_and_compare(&c, one, label);
        const size_t es = fa_dtype_size(p.dtype);
        void *g1[3] = {tu_alloc((size_t)c.nq * es), tu_alloc((size_t)c.nk * es), tu_alloc((size_t)c.nv * es)};
        memcpy(g1[0], c.dq, (size_t)c.nq * es), memcpy(g1[1], c.dk, (size_t)c.nk * es);
        memcpy(g1[2], c.dv, (size_t)c.nv * es);
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            fa_plan *pl = check_plan(&c.p, threads[t], f->bq, f->bk);
            if (!pl) continue;
            snprintf(label, sizeof label, "%s, %d threads", f->name, threads[t]);
            free(forward_checked(&c, pl, label, o1, ref_lse));
            run_and_compare(&c, pl, label);
            CHECK(memcmp(c.dq, g1[0], (size_t)c.nq * es) == 0 && memcmp(c.dk, g1[1], (size_t)c.nk * es) == 0 &&
                      memcmp(c.dv, g1[2], (size_t)c.nv * es) == 0,
                  "%s: gradients differ from the 1-thread result", label);
            fa_plan_destroy(pl);
        }
        for (int i = 0; i < 3; i++) free(g1[i]);
        free(o1);
        free(ref_lse);
        fa_plan_destroy(one);
        case_free(&c);
    }
    decode_threads(&rng);
    return check_finish("test_threads");
}
