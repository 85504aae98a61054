/* Tests an internal on purpose: the allocation-failure hook (src/alloc.h).
 * Allocation failures of a kv-cache decode plan (cache_seqlens, k_new/v_new appended),
 * built with FA_ALLOC_FAILURE_INJECTION under ASan with leak detection: for n = 1, 2, ...
 * the n-th allocation of fa_plan_create + fa_forward (the library allocating its own decode
 * workspace, through fa_malloc) fails. Each such call must return FA_ERR_NO_MEMORY with a
 * message and write nothing: o still NaN, the caches untouched (the new rows are appended
 * only once the workspace exists). ASan's leak check at exit shows nothing was left
 * allocated. The loop ends at the first n past the last allocation: that run must succeed
 * and match the float64 reference. The batch holds an empty sequence and one of several
 * chunks. Seeded (FA_TEST_SEED). */
#include "alloc.h"
#include "ref/ref.h"
#include "check.h"



enum { B = 3, HQ = 8, HK = 2, D = 64, CAP = 1100, SQ = 2 };

int main(void) {
    uint64_t rng = check_seed("test_alloc_failure_decode");
    int32_t lens[B] = {0, (int32_t)tu_int(&rng, 600, CAP - SQ), (int32_t)tu_int(&rng, 1, 40)};
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = HQ, p.heads_kv = HK, p.head_dim = D, p.head_dim_v = D, p.seq_q = SQ, p.seq_k = CAP;
    p.dtype = FA_F32, p.causal = 1, p.cache_seqlens = lens, p.has_new_kv = 1;
    const int64_t nq = B * SQ * HQ * D, nc = B * CAP * HK * D, nn = B * SQ * HK * D, nl = B * HQ * SQ;
    float *q = tu_alloc(sizeof(float) * nq), *o = tu_alloc(sizeof(float) * nq), *lse = tu_alloc(sizeof(float) * nl);
    float *k = tu_alloc(sizeof(float) * nc), *v = tu_alloc(sizeof(float) * nc);
    float *k0 = tu_alloc(sizeof(float) * nc), *v0 = tu_alloc(sizeof(float) * nc);
    float *kn = tu_alloc(sizeof(float) * nn), *vn = tu_alloc(sizeof(float) * nn);
    tu_fill(&rng, FA_F32, q, nq, 2.0), tu_fill(&rng, FA_F32, k0, nc, 2.0), tu_fill(&rng, FA_F32, v0, nc, 1.0);
    tu_fill(&rng, FA_F32, kn, nn, 2.0), tu_fill(&rng, FA_F32, vn, nn, 1.0);
    double *ro = tu_alloc(sizeof(double) * nq), *rl = tu_alloc(sizeof(double) * nl);
    fa_forward_args a = {0};
    a.q = q, a.k = k0, a.v = v0, a.o = o, a.lse = lse, a.k_new = kn, a.v_new = vn;
    fa_ref_decode(&p, &a, ro, rl); /* reads the caches before appending */
    a.k = k, a.v = v;
    fa_options opt = {FA_BACKEND_CPU, 2, 0, 0};
    int64_t used = -1;
    for (int64_t n = 1; n < 10000 && used < 0; n++) {
        memcpy(k, k0, sizeof(float) * nc), memcpy(v, v0, sizeof(float) * nc);
        tu_poison(FA_F32, o, nq);
        fa_alloc_fail_at(n);
        fa_plan *pl = NULL;
        fa_status st = fa_plan_create(&p, &opt, &pl);
        int64_t count = fa_alloc_count();
        if (st == FA_OK) {
            st = fa_forward(pl, &a);
            count = fa_alloc_count();
        }
        fa_alloc_fail_at(0);
        fa_plan_destroy(pl);
        if (st == FA_OK) {
            CHECK(count < n, "allocation %lld failed but the call returned FA_OK", (long long)n);
            used = count;
            break;
        }
        CHECK(count >= n && st == FA_ERR_NO_MEMORY && fa_last_error()[0],
              "allocation %lld failing: %s (%s), want FA_ERR_NO_MEMORY with a message", (long long)n,
              fa_status_string(st), fa_last_error());
        int untouched = 1;
        for (int64_t i = 0; i < nq; i++) untouched &= isnan(o[i]);
        untouched &= !memcmp(k, k0, sizeof(float) * nc) && !memcmp(v, v0, sizeof(float) * nc);
        CHECK(untouched, "allocation %lld failing: o or the caches were written", (long long)n);
        if (failures) break;
    }
    double eo = 0, mo = 1, el = 0;
    for (int64_t i = 0; i < nq; i++) {
        const double d = fabs(o[i] - ro[i]);
        if (!(d <= eo)) eo = isnan(d) ? INFINITY : d;
        if (fabs(ro[i]) > mo) mo = fabs(ro[i]);
    }
    for (int64_t i = 0; i < nl; i++) {
        const double d = isinf(rl[i]) ? (lse[i] == rl[i] ? 0 : INFINITY) : fabs(lse[i] - rl[i]) / (1 + fabs(rl[i]));
        if (!(d <= el)) el = isnan(d) ? INFINITY : d;
    }
    CHECK(used > 0 && eo / mo <= 2e-5 && el <= 2e-5, "the complete decode (%lld allocations): o err %.3g, lse err %.3g",
          (long long)used, eo / mo, el);
    printf("%s decode: each of its %lld allocations (plan included) failed in turn: FA_ERR_NO_MEMORY, nothing "
           "written\n", failures ? "FAIL" : "PASS", (long long)used);
    void *bufs[] = {q, o, lse, k, v, k0, v0, kn, vn, ro, rl};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return check_finish("test_alloc_failure_decode");
}
