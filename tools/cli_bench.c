/* `flashattn bench`: times the forward and backward passes on random data (one warm-up call,
 * then --iters timed calls; the median is reported) and prints GFLOP/s from the plan's flops
 * (executed) and from the useful count (the plan's flops_useful: where Dv = D the forward's
 * visible pairs x 4D and the backward 2.5x that).
 * --pass forward|backward (beyond docs/cli.md's SHAPE flags) times one pass only. */
#include "cli.h"
#include "measure.h"
#include "rates.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int64_t peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}

typedef struct {
    const fa_plan *plan;
    cli_mem *mem;
    fa_forward_args *fw;
    fa_backward_args *bw;
} bench_ctx;

static fa_status call(const bench_ctx *c, fa_pass pass) {
    fa_status st = pass == FA_FORWARD ? fa_forward(c->plan, c->fw) : fa_backward(c->plan, c->bw);
    if (st == FA_OK) cli_mem_sync(c->mem);
    return st;
}

/* Median seconds of iters calls after one warm-up call; progress on stderr. */
static int time_pass(const bench_ctx *c, fa_pass pass, int iters, double *median) {
    const char *name = pass == FA_FORWARD ? "forward" : "backward";
    double *t = fa_malloc(sizeof(double) * (size_t)iters);
    if (!t) return cli_fail(1, "out of memory");
    fprintf(stderr, "bench: %s warm-up...\n", name);
    fa_status st = call(c, pass);
    for (int i = 0; st == FA_OK && i < iters; i++) {
        double t0 = measure_now();
        st = call(c, pass);
        t[i] = measure_now() - t0;
        fprintf(stderr, "bench: %s %d/%d: %.4f s\n", name, i + 1, iters, t[i]);
    }
    if (st != FA_OK) {
        fa_free(t);
        return cli_fail_status(st, name);
    }
    *median = measure_median(t, iters);
    fa_free(t);
    return 0;
}

int cli_bench(const cli_args *a) {
    if ((a->decode || a->varlen_lens) && a->pass == 2) /* they time the forward alone */
        return cli_fail(2, "bench: --pass backward does not combine with %s (its benchmark times the forward)",
                        a->decode ? "--decode" : "--varlen");
    if (a->decode || a->varlen_lens) return cli_bench_inference(a); /* cli_bench_inference.c */
    int unread = cli_bench_unread_flags(a);
    if (unread) return unread;
    fa_problem p;
    fa_options opt;
    cli_extras x = {0};
    int rc = cli_shape_from_flags(a, &p);
    if (rc) return rc;
    cli_apply_options(a, &p, &opt);
    if ((rc = cli_extras_supported(a, &p, &opt)) || (rc = cli_extras_load(a, &p, 0, &x))) return rc;
    fa_plan *plan = NULL;
    if ((rc = cli_plan_create(&p, &opt, &plan))) return rc;
    fa_cost cf, cb;
    fa_plan_cost(plan, FA_FORWARD, &cf);
    fa_plan_cost(plan, FA_BACKWARD, &cb);
    cli_mem mem;
    if ((rc = cli_mem_init(&mem, plan))) {
        fa_plan_destroy(plan);
        return rc;
    }
    if ((rc = cli_extras_load(a, &p, 1, &x))) {
        fa_plan_destroy(plan);
        return rc;
    }
    int iters = a->iters ? a->iters : 3;

    size_t es = fa_dtype_size(p.dtype);
    size_t nq = (size_t)(p.batch * p.heads_q * p.seq_q * p.head_dim);
    size_t nk = (size_t)(p.batch * p.heads_kv * p.seq_k * p.head_dim);
    size_t nv = (size_t)(p.batch * p.heads_kv * p.seq_k * p.head_dim_v);
    size_t no = (size_t)(p.batch * p.heads_q * p.seq_q * p.head_dim_v);
    size_t nl = (size_t)(p.batch * p.heads_q * p.seq_q);
    /* q k v do o lse dq dk dv, then bias slopes q_seg kv_seg */
    size_t bytes[13] = {nq * es, nk * es, nv * es, no * es, no * es, nl * 4, nq * es, nk * es,
                        nv * es, 0, 0, 0, 0};
    void *h[13] = {0}, *d[13] = {0};
    h[9] = x.bias, h[10] = x.slopes, h[11] = x.q_seg, h[12] = x.kv_seg;
    if (x.bias) bytes[9] = (size_t)(p.bias_batch * p.bias_heads * (p.bias_seq_q == 1 ? 1 : p.seq_q) * p.seq_k) * 4;
    if (x.slopes) bytes[10] = (size_t)p.heads_q * 4;
    if (x.q_seg) bytes[11] = nl / (size_t)p.heads_q * 4, bytes[12] = (size_t)(p.batch * p.seq_k) * 4;
    /* Only what the timed passes touch: a forward-only run needs no do, dq, dk or dv (on the
     * seed problem they are 4 GiB more than the plan's peak). */
    const int need_bwd = a->pass != 1;
    uint64_t seed = 0x5eed;
    for (int i = 0; i < 9; i++) {
        if (!need_bwd && (i == 3 || i >= 6)) continue;
        if (!(h[i] = fa_malloc(bytes[i] ? bytes[i] : 1))) {
            rc = cli_fail(1, "out of memory (%zu bytes for the benchmark's tensors)", bytes[i]);
            goto done;
        }
        if (i < 4) measure_fill(&seed, p.dtype, h[i], (int64_t)(bytes[i] / es));
    }
    for (int i = 0; i < 13; i++)
        if (h[i] && (rc = cli_mem_put(&mem, h[i], bytes[i], i < 4 || i > 8, &d[i]))) goto done;

    fa_forward_args fw;
    fa_backward_args bw;
    memset(&fw, 0, sizeof fw);
    memset(&bw, 0, sizeof bw);
    fw.q = bw.q = d[0], fw.k = bw.k = d[1], fw.v = bw.v = d[2], bw.d_o = d[3];
    fw.o = d[4], bw.o = d[4], fw.lse = d[5], bw.lse = d[5];
    bw.dq = d[6], bw.dk = d[7], bw.dv = d[8];
    fw.bias = bw.bias = d[9], fw.alibi_slopes = bw.alibi_slopes = d[10];
    fw.sinks = bw.sinks = x.sinks, bw.dsink = x.dsink; /* host memory: CPU only (cuda refuses sinks) */
    fw.q_segment_ids = bw.q_segment_ids = d[11], fw.kv_segment_ids = bw.kv_segment_ids = d[12];
    bench_ctx c = {plan, &mem, &fw, &bw};
    int do_fwd = a->pass != 2, do_bwd = a->pass != 1;
    double tf = 0, tb = 0;
    if (do_fwd && (rc = time_pass(&c, FA_FORWARD, iters, &tf))) goto done;
    if (!do_fwd) { /* the backward reads the forward's o and lse */
        fa_status st = call(&c, FA_FORWARD);
        if (st != FA_OK) {
            rc = cli_fail_status(st, "forward");
            goto done;
        }
    }
    if (do_bwd && (rc = time_pass(&c, FA_BACKWARD, iters, &tb))) goto done;
    /* executed flops (the plan's flops: what the kernels run) and useful ones (the plan's
     * flops_useful: 2(D + Dv) and 2(3D + 2Dv) a visible pair, so visible pairs x 4D and 2.5x
     * that where Dv = D, bench/RESULTS.md's count for every peer; under the same JSON key as
     * plan --json's, the same figure: 2.5x the forward's was another where Dv != D) */
    const double uf = (double)cf.flops_useful, ub = (double)cb.flops_useful;
    double gf = tf > 0 ? (double)cf.flops / tf * 1e-9 : 0, gb = tb > 0 ? (double)cb.flops / tb * 1e-9 : 0;
    const double guf = tf > 0 ? uf / tf * 1e-9 : 0, gub = tb > 0 ? ub / tb * 1e-9 : 0;
    int64_t rss = peak_rss_bytes();
    /* predicted seconds from the cached rates (`flashattn calibrate`), when there are some */
    cli_rates rates;
    cli_prediction pf = {0}, pb = {0};
    const int loaded =
        fa_plan_backend(plan) == FA_BACKEND_CPU ? cli_rates_load(fa_cpu_isa(), fa_plan_threads(plan), &rates) : 1;
    if (loaded < 0) { /* not "no rates": the cache could not be read */
        rc = cli_fail(1, "bench: cannot read the rates cache (`flashattn calibrate`): %s", strerror(errno));
        goto done;
    }
    int have_rates = loaded == 0;
    if (have_rates && (cli_rates_predict(&rates, plan, FA_FORWARD, &pf) ||
                       cli_rates_predict(&rates, plan, FA_BACKWARD, &pb)))
        have_rates = 0;
    if (a->json) {
        printf("{");
        /* no cached rates (calibrate): null, as plan --json writes, never a prediction of 0 s */
        char fps[32] = "null", bps[32] = "null";
        if (have_rates) snprintf(fps, sizeof fps, "%.6g", pf.seconds), snprintf(bps, sizeof bps, "%.6g", pb.seconds);
        if (do_fwd)
            printf("\"forward\": {\"seconds\": %.6g, \"gflops\": %.6g, \"flops\": %" PRId64
                   ", \"useful_gflops\": %.6g, \"flops_useful\": %.0f, \"predicted_seconds\": %s}, ", tf, gf, cf.flops,
                   guf, uf, fps);
        else
            printf("\"forward\": null, "); /* a pass not run: null, as plan --json writes */
        if (do_bwd)
            printf("\"backward\": {\"seconds\": %.6g, \"gflops\": %.6g, \"flops\": %" PRId64
                   ", \"useful_gflops\": %.6g, \"flops_useful\": %.0f, \"predicted_seconds\": %s}, ", tb, gb, cb.flops,
                   gub, ub, bps);
        else
            printf("\"backward\": null, ");
        printf("\"peak_rss_bytes\": %" PRId64 ", \"iters\": %d}\n", rss, iters);
    } else {
        char hr[32], hp[32];
        if (do_fwd)
            printf("forward   %10.4f s  %10.2f GFLOP/s executed (%" PRId64 " flops), %.2f useful, median of %d\n",
                   tf, gf, cf.flops, guf, iters);
        if (do_bwd)
            printf("backward  %10.4f s  %10.2f GFLOP/s executed (%" PRId64 " flops), %.2f useful, "
                   "median of %d\n", tb, gb, cb.flops, gub, iters);
        if (have_rates && do_fwd)
            printf("predicted forward  %8.4f s (measured/predicted %.2f)\n", pf.seconds, tf / pf.seconds);
        if (have_rates && do_bwd)
            printf("predicted backward %8.4f s (measured/predicted %.2f)\n", pb.seconds, tb / pb.seconds);
        if (!have_rates && fa_plan_backend(plan) == FA_BACKEND_CPU)
            printf("predicted          none cached: run `flashattn calibrate --threads %d`\n",
                   fa_plan_threads(plan));
        printf("peak RSS  %s (the plan's peak: forward %s, ", cli_human_bytes((double)rss, hr, sizeof hr),
               cli_human_bytes((double)cf.peak_bytes, hp, sizeof hp));
        printf("backward %s)\n", cli_human_bytes((double)cb.peak_bytes, hp, sizeof hp));
    }
done:
    for (int i = 0; i < 13; i++) cli_mem_free(&mem, h[i], d[i]);
    for (int i = 0; i < 9; i++) fa_free(h[i]);
    cli_extras_free(&x);
    fa_plan_destroy(plan);
    return rc;
}
