/* bench_masks: the speed targets of block-sparse masks (docs/masks.md; issue "masks as
 * data"), B = 1, H heads, D = 128, bf16 by default, through the public API only:
 *
 *   dense causal            the reference rate
 *   documents               --docs N documents packed into S, causal within each document;
 *                           cut points from bench/masks.sh (numpy default_rng(0)), or evenly
 *                           spaced without --cuts
 *   chunked                 chunked causal, --chunk C (default 2048)
 *   dense-array chunked     the same mask from a dense boolean array (it hides whole tiles):
 *                           must run no slower than the constructor's
 *
 * For each: the plan's time (fa_plan_create, median), the forward (and with --backward the
 * backward) time (medians of --reps rounds that time each case once, after a warm-up round), the rate of executed flops (plan flops / s) and of useful flops
 * (flops_useful / s), and the ratios the targets name: executed rate vs dense causal's,
 * useful / executed, useful rate vs dense causal's.
 *
 *   bench_masks [--seq S] [--heads H] [--head-dim D] [--dtype bf16] [--threads N]
 *               [--reps R] [--docs N] [--chunk C] [--backward] [--cuts c1,c2,...] */
#include "flashattn.h"
#include "measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    fa_mask *mask; /* NULL: dense causal */
    int causal;
} bench_case;

#define MAX_REPS 32
#define N_CASES 4

/* One timed call: wall seconds, and in *cpu its CPU seconds (all threads). */
static double time_once(const fa_plan *pl, const fa_forward_args *fa, const fa_backward_args *ba, double *cpu) {
    const double t0 = measure_now(), c0 = measure_cpu_now();
    if (ba ? fa_backward(pl, ba) : fa_forward(pl, fa)) {
        fprintf(stderr, "bench_masks: %s\n", fa_last_error());
        exit(1);
    }
    *cpu = measure_cpu_now() - c0;
    return measure_now() - t0;
}

int main(int argc, char **argv) {
    int64_t S = 16384, H = 8, D = 128, threads = 0, reps = 3, docs = 16, chunk = 2048;
    int backward = 0;
    const char *cuts = NULL;
    for (int i = 1; i < argc; i++) /* --cuts takes a list: pull it out before measure_parse */
        if (strcmp(argv[i], "--cuts") == 0 && i + 1 < argc) {
            cuts = argv[i + 1];
            memmove(argv + i, argv + i + 2, (size_t)(argc - i - 2) * sizeof *argv);
            argc -= 2;
            break;
        }
    fa_dtype dt = FA_BF16;
    const measure_opt opts[] = {{"--seq", &S, NULL},     {"--heads", &H, NULL},  {"--head-dim", &D, NULL},
                                {"--threads", &threads, NULL}, {"--reps", &reps, NULL}, {"--docs", &docs, NULL},
                                {"--chunk", &chunk, NULL}, {"--backward", NULL, &backward}, {NULL, NULL, NULL}};
    if (measure_parse("bench_masks", argc, argv, opts, &dt)) return 2;

    /* document lengths from the cut points (as many as given: --cuts sets the documents) */
    int64_t n_cuts = 1;
    for (const char *c = cuts; c && *c; c++) n_cuts += *c == ',';
    if (docs < 1) return fprintf(stderr, "bench_masks: --docs %lld must be >= 1\n", (long long)docs), 2;
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)((cuts ? n_cuts : docs) + 1)), n_docs = 0, prev = 0;
    if (!lens) return fprintf(stderr, "bench_masks: out of memory\n"), 1;
    if (cuts) {
        for (const char *c = cuts; *c;) {
            char *end;
            const int64_t x = strtoll(c, &end, 10);
            if (end == c || (*end && *end != ',') || x <= prev || x >= S) /* a cut dropped would change the mask */
                return fprintf(stderr, "bench_masks: --cuts: '%s' is not an increasing list of cut points in (0, %lld)"
                                       " (--seq)\n", cuts, (long long)S), free(lens), 2;
            lens[n_docs++] = x - prev, prev = x;
            c = *end ? end + 1 : end;
        }
    } else {
        for (int64_t d = 1; d < docs; d++) lens[n_docs++] = S * d / docs - prev, prev = S * d / docs;
    }
    lens[n_docs++] = S - prev;

    fa_mask_shape ms = {1, 1, S, S, 0, 0};
    fa_mask *mdoc = NULL, *mchunk = NULL, *mdense = NULL;
    if (fa_mask_documents(&ms, &n_docs, lens, &mdoc) || fa_mask_chunked(&ms, 0, chunk, &mchunk)) {
        fprintf(stderr, "bench_masks: %s\n", fa_last_error());
        return 1;
    }
    uint8_t *att = malloc((size_t)(S * S));
    fa_mask_to_dense(mchunk, att);
    double t0 = measure_now();
    if (fa_mask_from_dense(&ms, att, &mdense)) return fprintf(stderr, "bench_masks: %s\n", fa_last_error()), 1;
    const double dense_build = measure_now() - t0;
    free(att);

    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = H, p.seq_q = p.seq_k = S, p.head_dim = D, p.dtype = dt, p.causal = 1;
    const int64_t n = H * S * D;
    const size_t es = fa_dtype_size(dt);
    void *q = malloc((size_t)n * es), *k = malloc((size_t)n * es), *v = malloc((size_t)n * es), *o = malloc((size_t)n * es);
    void *g = malloc((size_t)n * es), *dq = malloc((size_t)n * es), *dk = malloc((size_t)n * es), *dv = malloc((size_t)n * es);
    float *lse = malloc(sizeof(float) * (size_t)(H * S));
    uint64_t st = 1;
    measure_fill(&st, dt, q, n), measure_fill(&st, dt, k, n), measure_fill(&st, dt, v, n), measure_fill(&st, dt, g, n);

    bench_case cases[] = {{"dense causal", NULL, 1},
                          {"documents (causal within)", mdoc, 1},
                          {"chunked causal", mchunk, 0},
                          {"chunked, from a dense array", mdense, 0}};
    _Static_assert(sizeof cases / sizeof cases[0] == N_CASES, "N_CASES names every case");
    printf("bench_masks: B=1 H=%lld S=%lld D=%lld %s, isa %s, %d documents, chunk %lld, reps %lld "
           "(dense array built in %.1f ms)\n",
           (long long)H, (long long)S, (long long)D, fa_dtype_name(dt), fa_cpu_isa(), (int)n_docs, (long long)chunk,
           (long long)reps, dense_build * 1e3);
    printf("%-28s %9s %9s %11s %11s %11s %9s %11s %11s\n", "case", "plan us", "fwd s", "exec GF/s", "useful GF/s",
           "exec GF/cpu-s",
           backward ? "bwd s" : "", backward ? "exec GF/s" : "", backward ? "useful GF/s" : "");
    /* every case planned first, then timed in rounds that visit each case once (a warm-up
     * round first): a host whose speed drifts moves every case alike, not the last ones */
    if (reps > MAX_REPS) reps = MAX_REPS;
    if (reps < 1) reps = 1;
    fa_plan *plans[N_CASES];
    double plan_us[N_CASES], tf[N_CASES][MAX_REPS], cf_s[N_CASES][MAX_REPS], tb[N_CASES][MAX_REPS];
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
    fa_backward_args ba = {0};
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = g, ba.lse = lse, ba.dq = dq, ba.dk = dk, ba.dv = dv;
    for (int c = 0; c < N_CASES; c++) {
        p.mask = cases[c].mask, p.causal = cases[c].causal;
        fa_options opt = {FA_BACKEND_CPU, (int)threads, 0, 0};
        double pt[5];
        for (int r = 0; r < 5; r++) {
            t0 = measure_now();
            if (fa_plan_create(&p, &opt, &plans[c])) return fprintf(stderr, "bench_masks: %s\n", fa_last_error()), 1;
            pt[r] = measure_now() - t0;
            if (r < 4) fa_plan_destroy(plans[c]);
        }
        plan_us[c] = measure_median(pt, 5) * 1e6;
    }
    for (int r = 0; r <= reps; r++)
        for (int c = 0; c < N_CASES; c++) {
            double cpu;
            const double t = time_once(plans[c], &fa, NULL, &cpu);
            if (r) tf[c][r - 1] = t, cf_s[c][r - 1] = cpu;
            if (backward) { /* the backward of the forward just run (its o and lse) */
                const double u = time_once(plans[c], NULL, &ba, &cpu);
                if (r) tb[c][r - 1] = u;
            }
        }
    double ref_exec = 0, ref_useful = 0, ref_cpu = 0;
    for (int c = 0; c < N_CASES; c++) {
        fa_cost cf, cb;
        fa_plan_cost(plans[c], FA_FORWARD, &cf), fa_plan_cost(plans[c], FA_BACKWARD, &cb);
        const double f_s = measure_median(tf[c], (int)reps), cpu_f = measure_median(cf_s[c], (int)reps);
        const double b_s = backward ? measure_median(tb[c], (int)reps) : 0;
        const double exec = cf.flops / f_s * 1e-9, useful = cf.flops_useful / f_s * 1e-9;
        const double exec_cpu = cf.flops / cpu_f * 1e-9;
        if (c == 0) ref_exec = exec, ref_useful = useful, ref_cpu = exec_cpu;
        printf("%-28s %9.0f %9.3f %11.1f %11.1f %11.1f", cases[c].name, plan_us[c], f_s, exec, useful, exec_cpu);
        if (backward) printf(" %9.3f %11.1f %11.1f", b_s, cb.flops / b_s * 1e-9, cb.flops_useful / b_s * 1e-9);
        printf("   exec/causal %.2f (per cpu-s %.2f)  useful/exec %.2f  useful/causal-useful %.2f\n", exec / ref_exec,
               exec_cpu / ref_cpu, (double)cf.flops_useful / (double)cf.flops, useful / ref_useful);
        fa_plan_destroy(plans[c]);
    }
    fa_mask_destroy(mdoc), fa_mask_destroy(mchunk), fa_mask_destroy(mdense);
    free(q), free(k), free(v), free(o), free(g), free(dq), free(dk), free(dv), free(lse), free(lens);
    return 0;
}
