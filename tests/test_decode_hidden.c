/* Garbage at hidden keys of a kv-cache decode (docs/nonfinite.md): cache rows below a
 * sequence's length that a mask hides from a query row (before a sliding window's start,
 * or new tokens after a row under causal) may hold NaN or inf, in k or in v. The rows that
 * cannot see them must match the float64 reference as if the keys were clean; the rows
 * that see them follow the NaN rule (the reference says which). The garbage sits in the
 * same key tiles as visible keys (next to the window's edge), where a product over the
 * whole tile would form 0 * NaN. bf16 at D = 128 takes the fused AVX512_BF16 kernels
 * where the CPU has them; f16 the cache kernels (decode_cache*.c); f32 and D = 64 the ISA
 * table's kernels. */
#include "ref/ref.h"
#include "check.h"

static int failures;
static uint64_t seed, rng;

enum { G_NAN_V, G_INF_V, G_NAN_K, G_INF_K };
static const char *kinds[] = {"NaN in v", "+-inf in v", "NaN in k", "+-inf in k"};

/* One case: B sequences of the given lengths, Hq = 8 over Hk = 2, garbage at the keys
 * lens[b] + bad[g] of each sequence b (those >= lens[b] are new tokens when appending). */
static void run(const char *mask, fa_dtype dt, int64_t D, int kind, int64_t Sq, int append, int64_t window,
                const int32_t *lens, int64_t B, const int64_t *bad, int nbad) {
    fa_problem p;
    fa_problem_init(&p);
    const int64_t Hq = 8, Hk = 2, cap = 512;
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.head_dim = D, p.head_dim_v = D, p.dtype = dt;
    p.seq_q = Sq, p.seq_k = cap, p.cache_seqlens = lens, p.has_new_kv = append;
    p.causal = 1;
    if (window >= 0) p.window_left = window;
    const size_t es = fa_dtype_size(dt);
    const int64_t nc = B * cap * Hk * D, nq = B * Sq * Hq * D, nn = B * Sq * Hk * D;
    void *q = tu_alloc(nq * es), *k = tu_alloc(nc * es), *v = tu_alloc(nc * es), *o = tu_alloc(nq * es);
    void *kn = tu_alloc(nn * es), *vn = tu_alloc(nn * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
    tu_fill(&rng, dt, q, nq, 2.0), tu_fill(&rng, dt, k, nc, 2.0), tu_fill(&rng, dt, v, nc, 1.0);
    tu_fill(&rng, dt, kn, nn, 2.0), tu_fill(&rng, dt, vn, nn, 1.0);
    for (int64_t b = 0; b < B; b++) /* rows past each length (and past the new tokens): NaN */
        for (int64_t t = lens[b] + (append ? Sq : 0); t < cap; t++)
            for (int64_t x = 0; x < Hk * D; x++) chk_store(dt, k, (b * cap + t) * Hk * D + x, NAN),
                                                   chk_store(dt, v, (b * cap + t) * Hk * D + x, NAN);
    for (int64_t b = 0; b < B; b++)
        for (int g = 0; g < nbad; g++) {
            const int64_t t = lens[b] + bad[g];
            if (t < 0 || t >= lens[b] + (append ? Sq : 0)) continue;
            const int in_v = kind == G_NAN_V || kind == G_INF_V;
            void *dst = t < lens[b] ? (in_v ? v : k) : (in_v ? vn : kn);
            const int64_t row = t < lens[b] ? b * cap + t : b * Sq + (t - lens[b]);
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t d = 0; d < D; d += 3) {
                    const float val = kind == G_NAN_V || kind == G_NAN_K ? NAN : d == 3 ? -INFINITY : INFINITY;
                    chk_store(dt, dst, (row * Hk + h) * D + d, val);
                }
        }
    if (kind == G_INF_K) /* q > 0 in dims 0 and 3: inf - inf, a NaN score where the key is seen */
        for (int64_t r = 0; r < B * Sq * Hq; r++) chk_store(dt, q, r * D, 0.5f), chk_store(dt, q, r * D + 3, 0.5f);

    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq));
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    if (p.has_new_kv) a.k_new = kn, a.v_new = vn; /* (the library refuses them without it) */
    fa_ref_decode(&p, &a, ro, rl); /* reads k_new/v_new for the new rows, as the call will */
    tu_poison(dt, o, nq);
    for (int64_t i = 0; i < B * Hq * Sq; i++) lse[i] = NAN;
    fa_plan *pl = NULL;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_status st = fa_plan_create(&p, &opt, &pl);
    if (!st) st = fa_forward(pl, &a);
    char label[160];
    snprintf(label, sizeof label, "%s, %s, %s D=%lld Sq=%lld%s", kinds[kind], mask, fa_dtype_name(dt),
             (long long)D, (long long)Sq, append ? " appending" : "");
    if (st) {
        printf("FAIL (FA_TEST_SEED=%llu) %s: %s (%s)\n", (unsigned long long)seed, label, fa_status_string(st),
               fa_last_error());
        failures++;
    } else {
        const double tol = dt == FA_F32 ? 2e-5 : 2e-2;
        int64_t bad_rows = 0, nan_rows = 0; /* nan_rows: rows that see the garbage (o or lse not finite) */
        for (int64_t r = 0; r < B * Sq * Hq; r++) { /* row r of o: (b, i, h) */
            const int64_t b = r / (Sq * Hq), i = r / Hq % Sq, h = r % Hq;
            const double want_l = rl[(b * Hq + h) * Sq + i];
            const float got_l = lse[(b * Hq + h) * Sq + i];
            int expect_nan = isnan(want_l), ok = isnan(got_l) == expect_nan;
            if (!expect_nan && ok) ok = fabs(got_l - want_l) <= 1e-5 * (1 + fabs(want_l)) || got_l == want_l;
            for (int64_t c = 0; c < D; c++) { /* a non-finite expectation is met exactly (NaN: any NaN) */
                const double w = ro[r * D + c], g = chk_load(dt, o, r * D + c);
                expect_nan |= !isfinite(w);
                if (isnan(w)) ok &= isnan(g) != 0;
                else if (isinf(w)) ok &= g == w;
                else ok &= fabs(g - w) <= tol * (1 + fabs(w));
            }
            nan_rows += expect_nan;
            if (!ok && bad_rows++ < 2)
                printf("FAIL (FA_TEST_SEED=%llu) %s: sequence %lld row %lld head %lld: lse %g (want %g), o[0] %g (want %g)\n",
                       (unsigned long long)seed, label, (long long)b, (long long)i, (long long)h, (double)got_l, want_l,
                       (double)chk_load(dt, o, r * D), ro[r * D]);
        }
        failures += bad_rows > 0;
        /* the case must have rows on both sides of the garbage, or it tests nothing */
        if (nan_rows == B * Sq * Hq || (nan_rows == 0 && !strstr(mask, "window"))) {
            printf("FAIL %s: %lld of %lld rows see the garbage: the case does not separate them\n", label,
                   (long long)nan_rows, (long long)(B * Sq * Hq));
            failures++;
        }
    }
    fa_plan_destroy(pl);
    void *x[] = {q, k, v, o, kn, vn, lse, ro, rl};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

int main(void) {
    seed = tu_seed();
    rng = seed;
    printf("test_decode_hidden: seed %llu (FA_TEST_SEED=%llu reproduces), isa %s\n", (unsigned long long)seed,
           (unsigned long long)seed, fa_cpu_isa());
    static const fa_dtype types[] = {FA_BF16, FA_F32, FA_F16}; /* f16: decode_cache*.c */
    static const int64_t dims[] = {128, 64};
    /* a window of 37 keys before the one new row (position len - 1): keys up to len - 39 are
     * hidden from it; the garbage sits just outside the window (in the tile of its first
     * keys) and far before it */
    static const int32_t wl[2] = {300, 131};
    for (int t = 0; t < 3; t++)
        for (int dd = 0; dd < 2; dd++)
            for (int kind = 0; kind < 4; kind++) {
                const int64_t bad[] = {-39, -40, -100};
                run("window 37", types[t], dims[dd], kind, 1, 0, 37, wl, 2, bad, 3);
            }
    /* causal with 4 new tokens: the new token at position len + 2 is hidden from the first
     * two new rows and seen by the last two */
    static const int32_t cl[2] = {200, 77};
    for (int t = 0; t < 3; t++)
        for (int dd = 0; dd < 2; dd++)
            for (int kind = 0; kind < 4; kind++) {
                const int64_t bad[] = {2};
                run("causal, new token hidden from earlier rows", types[t], dims[dd], kind, 4, 1, -1, cl, 2, bad, 1);
            }
    if (failures) printf("test_decode_hidden: %d FAILED (seed %llu)\n", failures, (unsigned long long)seed);
    else printf("test_decode_hidden: all passed\n");
    return failures ? 1 : 0;
}
