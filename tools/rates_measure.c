/* Measuring the rates of rates.h: arithmetic peaks (f32 FMA, vdpbf16ps: peak_loops.c),
 * memory read bandwidth, the kernel set's exp (fa_cpu_exp_rate), and the tile efficiency of
 * each (pass, dtype) from a real pass of the library on a small problem. Every figure is the
 * best of a few short repetitions on all threads at once: a busy machine can only lower a rate. */
#include "measure.h"
#include "peak_loops.h"
#include "rates.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GFLOP/s of fn on all threads at once, best of 4 runs of about 0.1 s each. */
static double loop_rate(peak_loop fn, int threads) {
    return peak_gflops(fn, threads, peak_iters(fn, 0.1), 4);
}

/* ---- memory read bandwidth: every thread sums its share of a buffer far over cache ---- */

/* 1 GiB: over the last-level cache of the servers measured (300 MiB on the AMX Xeon, where
 * the 256 MiB read before was partly the cache's), the best of 4 passes (peak_loops.h). */
static double read_bandwidth(int threads) {
    const size_t bytes = (size_t)1 << 30;
    void *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    peak_read_touch(buf, bytes, threads);
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        const double r = peak_read_gbps(buf, bytes, threads, 1, NULL);
        best = r > best ? r : best;
    }
    free(buf);
    return best;
}

/* ---- tile efficiency: a real pass on a small problem ---------------------------------- */

/* Best seconds of each pass of the calibration problem (B=1, H=4 x threads, S=1024,
 * D=128, dtype t), after one warm-up call each. */
static int time_passes(int threads, fa_dtype t, fa_plan **plan_out, double secs[2]) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1;
    p.heads_q = p.heads_kv = 4 * threads;
    p.seq_q = p.seq_k = 1024;
    p.head_dim = p.head_dim_v = 128;
    p.dtype = t;
    fa_options o;
    memset(&o, 0, sizeof o);
    o.backend = FA_BACKEND_CPU;
    o.threads = threads;
    if (fa_plan_create(&p, &o, plan_out) != FA_OK) return 1;
    const size_t n = (size_t)(p.heads_q * p.seq_q * p.head_dim), es = fa_dtype_size(t);
    char *mem = malloc(n * es * 8 + (size_t)(p.heads_q * p.seq_q) * 4);
    if (!mem) return 1;
    void *q = mem, *k = mem + n * es, *v = mem + 2 * n * es, *o_ = mem + 3 * n * es;
    void *d_o = mem + 4 * n * es, *dq = mem + 5 * n * es, *dk = mem + 6 * n * es;
    void *dv = mem + 7 * n * es;
    float *lse = (float *)(mem + 8 * n * es);
    uint64_t seed = 0xca11b;
    measure_fill(&seed, t, q, (int64_t)n);
    measure_fill(&seed, t, k, (int64_t)n);
    measure_fill(&seed, t, v, (int64_t)n);
    measure_fill(&seed, t, d_o, (int64_t)n);
    fa_forward_args fw;
    fa_backward_args bw;
    memset(&fw, 0, sizeof fw);
    memset(&bw, 0, sizeof bw);
    fw.q = bw.q = q, fw.k = bw.k = k, fw.v = bw.v = v, fw.o = o_, bw.o = o_, fw.lse = lse, bw.lse = lse;
    bw.d_o = d_o, bw.dq = dq, bw.dk = dk, bw.dv = dv;
    int bad = 0;
    for (int pass = 0; pass < 2 && !bad; pass++) {
        secs[pass] = 1e30;
        for (int rep = 0; rep < 4 && !bad; rep++) { /* rep 0 is the warm-up */
            double t0 = measure_now();
            bad = (pass ? fa_backward(*plan_out, &bw) : fa_forward(*plan_out, &fw)) != FA_OK;
            const double dt = measure_now() - t0;
            if (rep > 0 && dt < secs[pass]) secs[pass] = dt;
        }
    }
    free(mem);
    return bad;
}

int cli_rates_measure(int threads, int verbose, cli_rates *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    snprintf(r->isa, sizeof r->isa, "%s", fa_cpu_isa());
    r->threads = threads;
    peak_loop fma = peak_fma_scalar;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) fma = peak_fma512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) fma = peak_fma256;
    if (__builtin_cpu_supports("avx512bf16")) r->dpbf16_gflops = loop_rate(peak_dpbf16, threads);
#endif
    r->fma_gflops = loop_rate(fma, threads);
    r->read_gbps = read_bandwidth(threads);
    r->exp_per_s = fa_cpu_exp_rate(threads); /* the kernels' own exp, measured by the library */
    if (verbose)
        fprintf(stderr, "calibrate: fma %.1f GFLOP/s, vdpbf16ps %.1f GFLOP/s, read %.1f GB/s, exp %.3g/s\n",
                r->fma_gflops, r->dpbf16_gflops, r->read_gbps, r->exp_per_s);
    if (!(r->fma_gflops > 0) || !(r->read_gbps > 0) || !(r->exp_per_s > 0)) {
        snprintf(err, errlen, "a rate measured zero (fma %g, read %g, exp %g)", r->fma_gflops,
                 r->read_gbps, r->exp_per_s);
        return 1;
    }
    const fa_dtype types[3] = {FA_F32, FA_F16, FA_BF16};
    for (int i = 0; i < 3; i++) {
        fa_plan *plan = NULL;
        double secs[2];
        if (time_passes(threads, types[i], &plan, secs)) {
            snprintf(err, errlen, "calibration pass (%s) failed: %s", fa_dtype_name(types[i]),
                     fa_last_error());
            fa_plan_destroy(plan);
            return 1;
        }
        for (int pass = 0; pass < 2; pass++) {
            fa_cost c;
            fa_plan_cost(plan, (fa_pass)pass, &c);
            /* solve compute = flops / (peak eff) + trans / exp_rate for eff */
            const double exps = (double)c.transcendentals / r->exp_per_s;
            double busy = secs[pass] - exps;
            if (busy < 0.5 * secs[pass]) busy = 0.5 * secs[pass]; /* exps never dominate */
            r->eff[pass][types[i]] = (double)c.flops / (cli_rates_peak(r, types[i]) * 1e9 * busy);
            if (verbose)
                fprintf(stderr, "calibrate: %s %s %.4f s, efficiency %.3f\n", fa_dtype_name(types[i]),
                        pass ? "backward" : "forward", secs[pass], r->eff[pass][types[i]]);
        }
        fa_plan_destroy(plan);
    }
    return 0;
}
