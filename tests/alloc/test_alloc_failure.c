/* Tests an internal on purpose: the allocation-failure hook (src/alloc.h).
 * Allocation failures in the library (built with FA_ALLOC_FAILURE_INJECTION, under ASan with
 * leak detection): for n = 1, 2, ... the n-th allocation of fa_plan_create + fa_forward (the
 * library allocating its own workspace), then of fa_plan_create + fa_backward, fails. Each
 * such call must return FA_ERR_NO_MEMORY with a message (never FA_OK with an allocation
 * lost, never a crash); ASan's leak check at exit shows that nothing was left allocated.
 * The loop ends at the first n past the last allocation: that run must succeed and match
 * the float64 reference. Seeded (FA_TEST_SEED). */
#include "alloc.h"
#include "backward_check.h"
#include "alloc_expect.h"

/* Fails allocation n = 1, 2, ... of plan + pass until a run allocates fewer than n times;
 * returns the number of allocations that run made. */
static int64_t every_failure(tcase *c, fa_pass pass) {
    const char *name = pass == FA_FORWARD ? "forward" : "backward";
    fa_options opt = {FA_BACKEND_CPU, 2, 16, 16};
    for (int64_t n = 1;; n++) {
        fa_alloc_fail_at(n);
        fa_plan *pl = NULL;
        fa_status st = fa_plan_create(&c->p, &opt, &pl);
        if (expect_no_memory("fa_plan_create", n, st, fa_alloc_count())) continue;
        if (st != FA_OK) break;
        if (pass == FA_FORWARD) {
            tu_poison(c->p.dtype, c->o, c->no);
            fa_forward_args a = case_fwd_args(c);
            st = fa_forward(pl, &a);
        } else {
            fa_backward_args a = case_bwd_args(c);
            st = fa_backward(pl, &a);
        }
        const int64_t used = fa_alloc_count();
        fa_alloc_fail_at(0);
        const int failed = expect_no_memory(name, n, st, used);
        if (!failed && st == FA_OK && used < n) { /* nothing failed: the complete run */
            if (pass == FA_BACKWARD) run_and_compare(c, pl, "backward after every allocation failure");
            fa_plan_destroy(pl);
            printf("%s %s: each of its %lld allocations (plan included) failed in turn: FA_ERR_NO_MEMORY\n",
                   failures ? "FAIL" : "PASS", name, (long long)used);
            return used;
        }
        fa_plan_destroy(pl);
        if (!failed) break; /* reported by expect_no_memory */
    }
    fa_alloc_fail_at(0);
    return -1;
}

int main(void) {
    (void)case_forward_kernel;
    uint64_t rng = check_seed("test_alloc_failure");
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 37, p.seq_k = 45, p.head_dim = 24, p.head_dim_v = 16;
    tcase c;
    case_init(&c, &p, M_CAUSAL | M_BIAS | M_ALIBI | M_SEG, &rng, 1);
    fa_plan *ref_plan = check_plan(&c.p, 1, 0, 0);
    if (!ref_plan) return 1;
    case_forward_ref(&c, ref_plan); /* o_exact, and o/lse saved for the backward */
    fa_plan_destroy(ref_plan);

    const int64_t fwd = every_failure(&c, FA_FORWARD);
    /* the last (complete) forward against the reference */
    double maxerr = 0, maxref = 0;
    const int64_t rows = p.batch * p.heads_q * p.seq_q;
    fa_plan *pl = check_plan(&c.p, 1, 0, 0);
    for (int64_t r = 0; pl && r < rows; r++)
        for (int64_t x = 0; x < p.head_dim_v; x++) {
            const int64_t b = r / (p.heads_q * p.seq_q), h = r / p.seq_q % p.heads_q, i = r % p.seq_q;
            const double got = chk_load(p.dtype, c.o, chk_offset(&fa_plan_problem(pl)->o_stride, b, h, i, x));
            const double want = c.o_exact[r * p.head_dim_v + x];
            if (!(fabs(got - want) <= maxerr)) maxerr = isnan(got) ? INFINITY : fabs(got - want);
            if (fabs(want) > maxref) maxref = fabs(want);
        }
    fa_plan_destroy(pl);
    CHECK(fwd > 0 && maxerr <= 1e-5 * (maxref > 0 ? maxref : 1), "the complete forward: err %.3g of max|ref| %.3g",
          maxerr, maxref);
    const int64_t bwd = every_failure(&c, FA_BACKWARD);
    CHECK(bwd > 0, "the backward never completed");
    case_free(&c);
    return check_finish("test_alloc_failure");
}
