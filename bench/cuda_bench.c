/* Times the CUDA forward and forward+backward with CUDA events: warm-up, then the median
 * of --iters timed calls, on random device data (never zeros). One JSON line on stdout:
 *
 *   {"impl": "flashattn", "B": .., "H": .., "S": .., "D": .., "causal": 0|1, "dtype": "bf16",
 *    "fwd_ms": m, "fwd_tflops": t, "fwdbwd_ms": m, "fwdbwd_tflops": t,
 *    "flops_fwd": N, "flops_bwd": N, "peak_bytes_plan": N, "peak_bytes_measured": N}
 *
 * TFLOP/s use the plan's flops (non-causal forward: exactly 4 B H S^2 D); fwdbwd divides
 * the plan's forward + backward flops by the time of one forward plus one backward.
 * peak_bytes_measured: device memory in use at the forward's peak (cudaMemGetInfo, inputs,
 * outputs and the workspace allocated here), against the plan's peak_bytes.
 *
 *   cuda_bench --batch 2 --heads 16 --seq 4096 --head-dim 128 [--causal] [--dtype bf16|f16]
 *              [--iters 20] [--warmup 3] [--no-backward] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "measure.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void die(const char *what) {
    fprintf(stderr, "cuda_bench: %s: %s\n", what, fa_last_error());
    exit(1);
}

/* Median milliseconds of iters runs of one pass (0 forward, 1 forward then backward). */
static float time_pass(const fa_plan *plan, const fa_forward_args *fa, const fa_backward_args *ba, int which,
                       int warmup, int iters) {
    for (int i = 0; i < warmup; i++) {
        if (fa_forward(plan, fa)) die("forward");
        if (which && fa_backward(plan, ba)) die("backward");
    }
    if (fa_cuda_synchronize()) die("synchronize");
    void **ev = calloc((size_t)iters * 2, sizeof *ev);
    float *ms = calloc((size_t)iters, sizeof *ms);
    for (int i = 0; i < 2 * iters; i++)
        if (fa_cuda_event_create(&ev[i])) die("event");
    for (int i = 0; i < iters; i++) {
        fa_cuda_event_record(ev[2 * i], NULL);
        if (fa_forward(plan, fa)) die("forward");
        if (which && fa_backward(plan, ba)) die("backward");
        fa_cuda_event_record(ev[2 * i + 1], NULL);
    }
    for (int i = 0; i < iters; i++)
        if (fa_cuda_event_elapsed_ms(ev[2 * i], ev[2 * i + 1], &ms[i])) die("elapsed");
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    float med = ms[iters / 2];
    for (int i = 0; i < 2 * iters; i++) fa_cuda_event_destroy(ev[i]);
    free(ev);
    free(ms);
    return med;
}

int main(int argc, char **argv) {
    int64_t B = 2, H = 16, S = 4096, D = 128, iters = 20, warmup = 3;
    int causal = 0, no_backward = 0;
    fa_dtype dt = FA_BF16;
    const measure_opt opts[] = {
        {"--batch", &B, NULL},      {"--heads", &H, NULL},      {"--seq", &S, NULL},
        {"--head-dim", &D, NULL},   {"--iters", &iters, NULL},  {"--warmup", &warmup, NULL},
        {"--causal", NULL, &causal}, {"--no-backward", NULL, &no_backward}, {NULL, NULL, NULL}};
    if (measure_parse("cuda_bench", argc, argv, opts, &dt)) return 2;
    const int backward = !no_backward;
    if (iters < 1) iters = 1;
    if (!fa_cuda_available()) {
        fprintf(stderr, "cuda_bench: no CUDA device\n");
        return 1;
    }
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = H, p.seq_q = S, p.seq_k = S, p.head_dim = D, p.dtype = dt, p.causal = causal;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CUDA;
    fa_plan *plan;
    if (fa_plan_create(&p, &opt, &plan)) die("plan");
    fa_cost fc, bc;
    fa_plan_cost(plan, FA_FORWARD, &fc);
    fa_plan_cost(plan, FA_BACKWARD, &bc);

    size_t free0 = 0, total = 0, free1 = 0;
    fa_cuda_synchronize();
    fa_cuda_mem_info(&free0, &total);
    const size_t n = (size_t)(B * H * S * D), es = fa_dtype_size(dt), nl = (size_t)(B * H * S);
    void *q, *k, *v, *o, *lse, *fws;
    if (fa_cuda_malloc(&q, n * es) || fa_cuda_malloc(&k, n * es) || fa_cuda_malloc(&v, n * es) ||
        fa_cuda_malloc(&o, n * es) || fa_cuda_malloc(&lse, nl * 4) || fa_cuda_malloc(&fws, (size_t)fc.workspace_bytes))
        die("device memory");
    if (fa_cuda_fill_random(q, n, dt, 1, 2.f) || fa_cuda_fill_random(k, n, dt, 2, 2.f) ||
        fa_cuda_fill_random(v, n, dt, 3, 1.f))
        die("fill");
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse, fa.workspace = fws;
    fa.workspace_size = (size_t)fc.workspace_bytes;
    if (fa_forward(plan, &fa) || fa_cuda_synchronize()) die("forward");
    fa_cuda_mem_info(&free1, &total);
    const long long peak_measured = (long long)free0 - (long long)free1;

    float fwd_ms = time_pass(plan, &fa, NULL, 0, (int)warmup, (int)iters), fb_ms = 0;
    if (backward) {
        void *d_o, *dq, *dk, *dv, *bws;
        if (fa_cuda_malloc(&d_o, n * es) || fa_cuda_malloc(&dq, n * es) || fa_cuda_malloc(&dk, n * es) ||
            fa_cuda_malloc(&dv, n * es) || fa_cuda_malloc(&bws, (size_t)bc.workspace_bytes))
            die("device memory (backward)");
        if (fa_cuda_fill_random(d_o, n, dt, 4, 1.f)) die("fill");
        fa_backward_args ba = {0};
        ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = d_o, ba.lse = lse, ba.dq = dq, ba.dk = dk, ba.dv = dv;
        ba.workspace = bws, ba.workspace_size = (size_t)bc.workspace_bytes;
        fb_ms = time_pass(plan, &fa, &ba, 1, (int)warmup, (int)iters);
        fa_cuda_free(d_o), fa_cuda_free(dq), fa_cuda_free(dk), fa_cuda_free(dv), fa_cuda_free(bws);
    }
    /* TFLOP/s of useful flops, the same count for every implementation (bench/RESULTS.md):
     * the forward's visible pairs x 4D (the plan's flops_useful: 4 B H S^2 D, causal the
     * pairs on or below the diagonal), the backward 2.5x that; the executed counts (the
     * plan's flops, diagonal tiles whole, a two-pass backward of 14 B H S^2 D) beside them */
    const double ff = (double)fc.flops_useful, fb = 2.5 * ff;
    printf("{\"impl\": \"flashattn\", \"B\": %lld, \"H\": %lld, \"S\": %lld, \"D\": %lld, \"causal\": %d, "
           "\"dtype\": \"%s\", \"fwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"fwdbwd_ms\": %.4f, \"fwdbwd_tflops\": %.1f, "
           "\"flops_fwd\": %.0f, \"flops_bwd\": %.0f, \"exec_flops_fwd\": %lld, \"exec_flops_bwd\": %lld, "
           "\"peak_bytes_plan\": %lld, \"peak_bytes_measured\": %lld}\n",
           (long long)B, (long long)H, (long long)S, (long long)D, causal, fa_dtype_name(dt), fwd_ms,
           ff / (fwd_ms * 1e-3) / 1e12, fb_ms, backward ? (ff + fb) / (fb_ms * 1e-3) / 1e12 : 0.0, ff, fb,
           (long long)fc.flops, (long long)bc.flops, (long long)fc.peak_bytes, peak_measured);
    fa_cuda_free(q), fa_cuda_free(k), fa_cuda_free(v), fa_cuda_free(o), fa_cuda_free(lse), fa_cuda_free(fws);
    fa_plan_destroy(plan);
    return 0;
}
