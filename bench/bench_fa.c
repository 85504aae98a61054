/* bench_fa: times flashattn's CPU forward and backward through the library API, on random
 * data, and reports the microkernel set used (FA_ISA forces one), so every ISA can be
 * measured on its own.
 *
 *   bench_fa --batch B --heads H --seq S --head-dim D [--dtype f32|f16|bf16] [--causal]
 *            [--threads N] [--block-q BQ --block-k BK] [--reps N] [--backward]
 *            [--no-forward] [--run-heads N] [--json]
 *
 * --reps 0: time the first forward alone (no warm-up run), for problems that take minutes.
 *
 * --run-heads N: allocate and fill the full [B, H, S, D] tensors (so peak RSS is the real
 * need of the full problem) but run only the first N (b, h) heads, through strided views
 * of the same tensors; the full time is then estimated as time x B H / N. For problems
 * too long to run whole on this machine (the seed problem).
 *
 * GFLOP/s: "gflops" divides the plan's flops (what the kernel executes, at tile
 * granularity); "gflops_useful" divides flops_useful (forward) or 2.5 x flops_useful
 * (backward, the FlashAttention-2 convention), the count bench/peers.py and
 * bench/naive_openblas.c use for every peer. */
#include "flashattn.h"
#include "measure.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* Fills n elements of dtype t with uniform values in [-1, 1), blocks of 4096 in parallel
 * (the tensors of the long problems are gigabytes). */
static void fill(void *dst, size_t n, fa_dtype t, uint64_t seed) {
    enum { BLK = 4096 };
    const size_t es = fa_dtype_size(t);
    const uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < (n + BLK - 1) / BLK; blk++) {
        float x[BLK];
        uint64_t s = st ^ (blk * 0xbf58476d1ce4e5b9ull);
        const size_t i0 = blk * BLK, m = n - i0 < BLK ? n - i0 : BLK;
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
        }
        fa_convert(FA_F32, x, t, (char *)dst + i0 * es, m);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: bench_fa --batch B --heads H --seq S --head-dim D [--dtype f32|f16|bf16] "
                    "[--causal] [--threads N] [--block-q BQ --block-k BK] [--reps N] [--backward] "
                    "[--no-forward] [--run-heads N] [--json]\n");
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_fa: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

#define CHECK(call)                                                                      \
    do {                                                                                 \
        fa_status st_ = (call);                                                          \
        if (st_ != FA_OK) {                                                              \
            fprintf(stderr, "bench_fa: %s: %s (%s)\n", #call, fa_status_string(st_),     \
                    fa_last_error());                                                    \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

typedef struct {
    double best, median, worst, cpu; /* cpu: least process CPU seconds of a rep / threads */
} times;

/* reps timed calls of one pass into t[0..reps) (progress on stderr), summed up in *out. */
static fa_status time_reps(const fa_plan *plan, fa_pass pass, const fa_forward_args *fa,
                           const fa_backward_args *ba, int reps, double *t, times *out) {
    const char *name = pass == FA_FORWARD ? "forward" : "backward";
    double cbest = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = measure_now(), c0 = measure_cpu_now();
        fa_status st = pass == FA_FORWARD ? fa_forward(plan, fa) : fa_backward(plan, ba);
        if (st != FA_OK) return st;
        t[r] = measure_now() - t0;
        const double c = measure_cpu_now() - c0;
        if (c < cbest) cbest = c;
        fprintf(stderr, "  %s rep %d: %.4f s (cpu %.4f s)\n", name, r, t[r], c);
    }
    measure_median(t, reps); /* sorts t */
    *out = (times){t[0], t[reps / 2], t[reps - 1], cbest / fa_plan_threads(plan)};
    return FA_OK;
}

int main(int argc, char **argv) {
    int64_t B = 1, H = 8, S = 4096, D = 128, bq = 0, bk = 0, run_heads = 0, threads = 0, reps = 3;
    fa_dtype dt = FA_F32;
    int causal = 0, backward = 0, no_forward = 0, json = 0;
    const measure_opt opts[] = {
        {"--batch", &B, NULL},        {"--heads", &H, NULL},       {"--seq", &S, NULL},
        {"--head-dim", &D, NULL},     {"--threads", &threads, NULL}, {"--block-q", &bq, NULL},
        {"--block-k", &bk, NULL},     {"--reps", &reps, NULL},     {"--run-heads", &run_heads, NULL},
        {"--causal", NULL, &causal},  {"--backward", NULL, &backward}, {"--no-forward", NULL, &no_forward},
        {"--json", NULL, &json},      {NULL, NULL, NULL}};
    if (measure_parse("bench_fa", argc, argv, opts, &dt)) {
        usage();
        return 2;
    }
    const int forward = !no_forward;
    if (B < 1 || H < 1 || S < 1 || D < 1 || reps < 0 || run_heads < 0 || run_heads > B * H ||
        (reps == 0 && backward)) {
        usage();
        return 2;
    }

    /* The full problem: its plan gives the figures (peak bytes, naive peak bytes). */
    fa_problem full;
    fa_problem_init(&full);
    full.batch = B; full.heads_q = H; full.heads_kv = H; full.seq_q = S; full.seq_k = S;
    full.head_dim = D; full.head_dim_v = D; full.dtype = dt; full.causal = causal;
    fa_options opt = {FA_BACKEND_CPU, (int)threads, bq, bk};
    fa_plan *full_plan = NULL;
    CHECK(fa_plan_create(&full, &opt, &full_plan));
    fa_cost fc_full, bc_full;
    CHECK(fa_plan_cost(full_plan, FA_FORWARD, &fc_full));
    CHECK(fa_plan_cost(full_plan, FA_BACKWARD, &bc_full));

    /* What actually runs: all heads, or the first run_heads as a [1, run_heads] view. */
    fa_problem p = full;
    int64_t nrun = B * H;
    if (run_heads) {
        nrun = run_heads;
        p.batch = 1;
        p.heads_q = p.heads_kv = run_heads;
        int64_t st[4] = {H * S * D, S * D, D, 1}; /* head index h' = b * H + h, contiguous */
        memcpy(p.q_stride.s, st, sizeof st);
        p.k_stride = p.v_stride = p.o_stride = p.q_stride;
    }
    fa_plan *plan = NULL;
    CHECK(fa_plan_create(&p, &opt, &plan));
    fa_cost fc, bc;
    CHECK(fa_plan_cost(plan, FA_FORWARD, &fc));
    CHECK(fa_plan_cost(plan, FA_BACKWARD, &bc));
    int64_t fbq, fbk, bbq, bbk;
    fa_plan_blocks(plan, FA_FORWARD, &fbq, &fbk);
    fa_plan_blocks(plan, FA_BACKWARD, &bbq, &bbk);

    size_t esz = fa_dtype_size(dt), n = (size_t)(B * H * S * D);
    void *q = xmalloc(n * esz), *k = xmalloc(n * esz), *v = xmalloc(n * esz), *o = xmalloc(n * esz);
    float *lse = xmalloc((size_t)(B * H * S) * sizeof(float));
    fill(q, n, dt, 1);
    fill(k, n, dt, 2);
    fill(v, n, dt, 3);
    memset(o, 0, n * esz);
    void *d_o = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    if (backward) {
        d_o = xmalloc(n * esz); dq = xmalloc(n * esz); dk = xmalloc(n * esz); dv = xmalloc(n * esz);
        fill(d_o, n, dt, 4);
        memset(dq, 0, n * esz); memset(dk, 0, n * esz); memset(dv, 0, n * esz);
    }
    void *fws = xmalloc((size_t)fc.workspace_bytes);
    void *bws = backward ? xmalloc((size_t)bc.workspace_bytes) : NULL;

    fa_forward_args fa;
    memset(&fa, 0, sizeof fa);
    fa.q = q; fa.k = k; fa.v = v; fa.o = o; fa.lse = lse;
    fa.workspace = fws; fa.workspace_size = (size_t)fc.workspace_bytes;
    fa_backward_args ba;
    memset(&ba, 0, sizeof ba);
    ba.q = q; ba.k = k; ba.v = v; ba.o = o; ba.d_o = d_o; ba.lse = lse;
    ba.dq = dq; ba.dk = dk; ba.dv = dv;
    ba.workspace = bws; ba.workspace_size = backward ? (size_t)bc.workspace_bytes : 0;

    double *t = xmalloc((size_t)(reps + 1) * sizeof(double));
    times ft = {0, 0, 0, 0}, bt = {0, 0, 0, 0};
    const char *dname = fa_dtype_name(dt);
    fprintf(stderr, "bench_fa: isa %s, %s, B=%lld H=%lld S=%lld D=%lld%s, blocks fwd %lldx%lld bwd %lldx%lld, "
                    "threads %d%s\n", fa_cpu_isa(), dname, (long long)B, (long long)H, (long long)S,
            (long long)D, causal ? " causal" : "", (long long)fbq, (long long)fbk, (long long)bbq,
            (long long)bbk, fa_plan_threads(plan), run_heads ? " (a subset of heads)" : "");
    /* The forward always runs once: the backward needs its o and lse. */
    double t0 = measure_now(), c0 = measure_cpu_now();
    CHECK(fa_forward(plan, &fa));
    double first = measure_now() - t0, first_cpu = measure_cpu_now() - c0;
    fprintf(stderr, "  forward (first run): %.4f s (cpu %.4f s)\n", first, first_cpu);
    if (forward && reps == 0) { /* --reps 0: the first run is the measurement (long problems) */
        ft = (times){first, first, first, first_cpu / fa_plan_threads(plan)};
    } else if (forward) {
        int r_eff = first * (double)reps > 600 ? 1 : (int)reps; /* never spend more than ~10 min */
        CHECK(time_reps(plan, FA_FORWARD, &fa, &ba, r_eff, t, &ft));
    }
    if (backward) {
        CHECK(fa_backward(plan, &ba)); /* warm-up */
        CHECK(time_reps(plan, FA_BACKWARD, &fa, &ba, (int)reps, t, &bt));
    }
    /* A checksum so a broken kernel shows (NaN) and the work cannot be skipped. */
    double check = 0;
    for (size_t i = 0; i < (size_t)(nrun * S); i += 61) check += lse[i];

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_gb = (double)ru.ru_maxrss / (1024.0 * 1024.0);
    double scale_up = (double)(B * H) / (double)nrun; /* 1 unless --run-heads */

    printf("{\"isa\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"seq\": %lld, "
           "\"head_dim\": %lld, \"causal\": %s, \"threads\": %d, \"run_heads\": %lld, "
           "\"blocks\": {\"forward\": [%lld, %lld], \"backward\": [%lld, %lld]}",
           fa_cpu_isa(), dname, (long long)B, (long long)H, (long long)S, (long long)D,
           causal ? "true" : "false", fa_plan_threads(plan), (long long)nrun, (long long)fbq,
           (long long)fbk, (long long)bbq, (long long)bbk);
    if (forward)
        printf(", \"forward\": {\"seconds\": %.6f, \"median_seconds\": %.6f, \"max_seconds\": %.6f, "
               "\"gflops\": %.2f, \"gflops_useful\": %.2f, \"flops\": %lld, \"flops_useful\": %lld, "
               "\"estimated_full_seconds\": %.6g, \"cpu_seconds_per_thread\": %.6f}",
               ft.best, ft.median, ft.worst, (double)fc.flops / ft.best * 1e-9,
               (double)fc.flops_useful / ft.best * 1e-9, (long long)fc.flops,
               (long long)fc.flops_useful, ft.best * scale_up, ft.cpu);
    if (backward)
        printf(", \"backward\": {\"seconds\": %.6f, \"median_seconds\": %.6f, \"max_seconds\": %.6f, "
               "\"gflops\": %.2f, \"gflops_useful\": %.2f, \"flops\": %lld, \"flops_useful\": %lld, "
               "\"cpu_seconds_per_thread\": %.6f}",
               bt.best, bt.median, bt.worst, (double)bc.flops / bt.best * 1e-9,
               2.5 * (double)fc.flops_useful / bt.best * 1e-9, (long long)bc.flops,
               (long long)(fc.flops_useful * 5 / 2), bt.cpu);
    printf(", \"peak_rss_gb\": %.3f, \"plan_peak_bytes\": %lld, \"plan_naive_peak_bytes\": %lld, "
           "\"checksum\": %.6g}\n",
           rss_gb, (long long)fc_full.peak_bytes, (long long)fc_full.naive_peak_bytes, check);
    if (!json) {
        if (forward)
            fprintf(stderr, "forward : %.4f s, %.1f GFLOP/s (%.1f useful); by cpu time %.1f GFLOP/s\n", ft.best,
                    (double)fc.flops / ft.best * 1e-9, (double)fc.flops_useful / ft.best * 1e-9,
                    (double)fc.flops / ft.cpu * 1e-9);
        if (backward)
            fprintf(stderr, "backward: %.4f s, %.1f GFLOP/s; by cpu time %.1f GFLOP/s\n", bt.best,
                    (double)bc.flops / bt.best * 1e-9, (double)bc.flops / bt.cpu * 1e-9);
    }
    (void)bc_full;
    fa_plan_destroy(plan);
    fa_plan_destroy(full_plan);
    free(t); free(q); free(k); free(v); free(o); free(lse); free(fws); free(bws);
    free(d_o); free(dq); free(dk); free(dv);
    return isfinite(check) ? 0 : 1;
}
