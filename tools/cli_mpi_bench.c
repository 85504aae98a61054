/* `flashattn bench --seq-parallel ring|ulysses [--zigzag] SHAPE OPTIONS` under mpirun: each
 * rank times fa_mpi_forward / fa_mpi_backward on random rows of its own (one warm-up call,
 * then --iters calls started together after a barrier) and rank 0 prints, per rank, the
 * median wall time split into local kernel compute, waiting on communication, and merging
 * (packing, unpacking, combining partial results), with the communication share. */
#include "cli.h"

#ifdef FA_HAVE_MPI
#include "flashattn_mpi.h"

#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void fill(uint64_t *state, fa_dtype t, void *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float f = (float)((double)(z >> 11) * 0x1p-52 - 1.0);
        fa_convert(FA_F32, &f, t, (char *)x + (size_t)i * fa_dtype_size(t), 1);
    }
}

/* per rank and pass: median wall, and the compute / comm-wait / merge seconds of that call */
enum { WALL, COMPUTE, WAIT, MERGE, NFIG };

static int time_pass(const fa_mpi_plan *pl, int backward, int iters, void *fw, void *bw,
                     double fig[NFIG]) {
    double *t = calloc((size_t)iters + 1, sizeof(double)), *f = calloc((size_t)(iters + 1) * NFIG, sizeof(double));
    fa_status st = FA_OK;
    for (int i = 0; t && f && st == FA_OK && i <= iters; i++) { /* call 0: warm-up */
        fa_mpi_stats s;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (backward) ((fa_mpi_backward_args *)bw)->stats = &s, st = fa_mpi_backward(MPI_COMM_WORLD, pl, bw);
        else ((fa_mpi_forward_args *)fw)->stats = &s, st = fa_mpi_forward(MPI_COMM_WORLD, pl, fw);
        t[i] = MPI_Wtime() - t0;
        f[i * NFIG + WALL] = t[i], f[i * NFIG + COMPUTE] = s.compute_s;
        f[i * NFIG + WAIT] = s.comm_wait_s, f[i * NFIG + MERGE] = s.merge_s;
    }
    int rc = 0;
    if (!t || !f) rc = cli_fail(1, "out of memory");
    else if (st != FA_OK) rc = cli_fail_status(st, backward ? "backward" : "forward");
    else {
        double med[64];
        int n = iters < 64 ? iters : 64;
        memcpy(med, t + 1, sizeof(double) * (size_t)n);
        qsort(med, (size_t)n, sizeof(double), cmp_double);
        double m = med[n / 2];
        for (int i = 1; i <= iters; i++)
            if (t[i] == m) memcpy(fig, f + i * NFIG, sizeof(double) * NFIG);
    }
    free(t), free(f);
    return rc;
}

static int bench_body(const cli_args *a, int P, int R) {
    fa_problem p;
    fa_options opt;
    /* the flags this benchmark does not take, judged on every rank, then agreed before any
     * exchange (a rank that returned alone would leave its peers waiting); the mask flags'
     * mask goes to the plan, whose refusal names it and sequence parallel */
    int rc = cli_shape_from_flags(a, &p);
    if (!rc) {
        cli_apply_options(a, &p, &opt);
        if (a->bias || a->alibi || a->q_segments || a->sinks)
            rc = cli_fail(2, "bench --seq-parallel: option files (--bias, --alibi, segments, --sinks) are not taken");
        else if (a->varlen_lens)
            rc = cli_fail(2, "bench: --varlen (a packed batch) does not combine with --seq-parallel (ring, ulysses)");
        else if (!a->decode) /* --decode: the plan refuses it below, naming both */
            rc = cli_bench_unread_flags(a);
    }
    if (!rc) rc = cli_mask_apply(a, &p);
    int refused = rc != 0;
    MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc) return rc;
    if (refused) return cli_fail(2, "invalid problem: another rank refused its flags (its message is on its stderr)");
    static const int32_t cache_mark[1] = {0}; /* never read: the plan refuses decoding first */
    if (a->decode) p.cache_seqlens = cache_mark; /* so that the backend table answers (exit 2) */
    fa_mpi_layout lay = a->zigzag ? FA_MPI_ZIGZAG : FA_MPI_CONTIGUOUS;
    fa_mpi_method m = a->seq_parallel == CLI_SP_ULYSSES ? FA_MPI_ULYSSES : FA_MPI_RING;
    fa_mpi_plan *pl = NULL;
    fa_status st = fa_mpi_plan_create(&p, &opt, m, lay, P, R, &pl);
    int failed = st != FA_OK; /* every rank learns of a plan that failed on some (they would wait for it) */
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (st != FA_OK) return cli_fail_status(st, "invalid problem");
    if (failed) {
        fa_mpi_plan_destroy(pl);
        return cli_fail(2, "invalid problem: another rank's plan failed (its message is on its stderr)");
    }
    fa_plan *whole = NULL; /* for the useful flops of the whole problem */
    if (fa_plan_create(&p, &opt, &whole) != FA_OK) whole = NULL;
    fa_cost wf = {0}, wb = {0};
    if (whole) fa_plan_cost(whole, FA_FORWARD, &wf), fa_plan_cost(whole, FA_BACKWARD, &wb);
    fa_plan_destroy(whole);
    int64_t lq = p.seq_q / P, lk = p.seq_k / P, B = p.batch;
    int64_t n[9] = {B * p.heads_q * lq * p.head_dim, B * p.heads_kv * lk * p.head_dim,
                    B * p.heads_kv * lk * p.head_dim_v, B * p.heads_q * lq * p.head_dim_v,
                    B * p.heads_q * lq * p.head_dim_v, B * p.heads_q * lq,
                    B * p.heads_q * lq * p.head_dim, B * p.heads_kv * lk * p.head_dim,
                    B * p.heads_kv * lk * p.head_dim_v}; /* q k v do o lse dq dk dv */
    void *x[9] = {0};
    size_t es = fa_dtype_size(p.dtype);
    uint64_t seed = 0x5eed + (uint64_t)R * 0x1000;
    for (int i = 0; i < 9; i++) {
        x[i] = malloc((size_t)n[i] * (i == 5 ? 4 : es) + 1);
        if (!x[i]) rc = cli_fail(1, "out of memory");
        else if (i < 4) fill(&seed, p.dtype, x[i], n[i]);
    }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double fig[2][NFIG] = {{0}}, *all = R == 0 ? calloc((size_t)P * 2 * NFIG, sizeof(double)) : NULL;
    int iters = a->iters ? a->iters : 3, passes[2] = {a->pass != 2, a->pass != 1};
    fa_mpi_forward_args fw = {x[0], x[1], x[2], x[4], x[5], NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    fa_mpi_backward_args bw = {x[0], x[1], x[2], x[4], x[3], x[5], x[6], x[7], x[8],
                               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (!rc && !passes[0]) { /* the backward reads the forward's o and lse */
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &fw);
        if (st != FA_OK) rc = cli_fail_status(st, "forward");
    }
    for (int b = 0; b < 2 && !rc; b++)
        if (passes[b]) {
            if (R == 0) fprintf(stderr, "bench: %s, %d ranks, %d timed calls...\n", b ? "backward" : "forward", P, iters);
            rc = time_pass(pl, b, iters, &fw, &bw, fig[b]);
        }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!rc) MPI_Gather(fig, 2 * NFIG, MPI_DOUBLE, all, 2 * NFIG, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    fa_mpi_cost c[2];
    fa_mpi_plan_cost(pl, FA_FORWARD, &c[0]);
    fa_mpi_plan_cost(pl, FA_BACKWARD, &c[1]);
    int64_t fl[2] = {c[0].flops, c[1].flops};
    MPI_Allreduce(MPI_IN_PLACE, fl, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (!rc && R == 0) {
        const char *names[2] = {"forward", "backward"};
        const fa_cost *useful[2] = {&wf, &wb};
        if (!a->json)
            printf("%d ranks, %s%s; useful flops of the whole problem: forward %" PRId64 ", backward %" PRId64 "\n",
                   P, m == FA_MPI_RING ? "ring" : "ulysses", a->zigzag ? " zigzag" : "", wf.flops_useful,
                   wb.flops_useful); /* the plan's: 2 (3D + 2Dv) per pair, 2.5x the forward's only where D = Dv */
        else
            printf("{\"ranks\": %d, \"method\": \"%s\", \"zigzag\": %s", P, m == FA_MPI_RING ? "ring" : "ulysses",
                   a->zigzag ? "true" : "false");
        for (int b = 0; b < 2; b++) {
            if (!passes[b]) continue;
            double wmax = 0;
            for (int r = 0; r < P; r++) wmax = all[(r * 2 + b) * NFIG + WALL] > wmax ? all[(r * 2 + b) * NFIG + WALL] : wmax;
            double gf = wmax > 0 ? (double)fl[b] / wmax * 1e-9 : 0;
            if (!a->json) {
                printf("%-8s  %.4f s (slowest rank)  %.2f GFLOP/s executed (%" PRId64 " flops, all ranks)\n", names[b],
                       wmax, gf, fl[b]);
                printf("  rank      wall s   compute s  comm-wait s   merge s  comm share\n");
            } else {
                printf(", \"%s\": {\"seconds\": %.6g, \"gflops\": %.6g, \"flops\": %" PRId64
                       ", \"flops_useful\": %" PRId64 ", \"per_rank\": [", names[b], wmax, gf, fl[b],
                       useful[b]->flops_useful);
            }
            for (int r = 0; r < P; r++) {
                const double *f = all + (r * 2 + b) * NFIG;
                double share = f[WALL] > 0 ? f[WAIT] / f[WALL] : 0;
                if (!a->json)
                    printf("  %4d  %10.4f  %10.4f  %11.4f  %8.4f  %9.1f%%\n", r, f[WALL], f[COMPUTE], f[WAIT],
                           f[MERGE], 100 * share);
                else
                    printf("%s{\"rank\": %d, \"seconds\": %.6g, \"compute_s\": %.6g, \"comm_wait_s\": %.6g, "
                           "\"merge_s\": %.6g}", r ? ", " : "", r, f[WALL], f[COMPUTE], f[WAIT], f[MERGE]);
            }
            if (a->json) printf("]}");
        }
        if (a->json) printf("}\n");
    }
    free(all);
    for (int i = 0; i < 9; i++) free(x[i]);
    fa_mpi_plan_destroy(pl);
    return rc;
}

int cli_mpi_bench(const cli_args *a) { return cli_mpi_with(a, bench_body); }

#else

int cli_mpi_bench(const cli_args *a) { return cli_mpi_run(a); }

#endif
