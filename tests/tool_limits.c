/* Tests an internal on purpose: it swaps the plan's CPU microkernel table (src/cpu/isa.h,
 * struct fa_plan), which no public call can do; that is why it lives in tests/, not bench/.
 *
 * tool_limits: what bounds the CPU forward, measured by taking parts of the work away.
 *
 * Runs the forward of one shape with the plan's microkernel table, then with copies of the
 * table in which some entries do nothing (measurement only: the library is untouched):
 *   full        everything
 *   no-exp      exp_sum returns at once (the softmax's exps skipped)
 *   no-gemm     gemm_abt and gemm_pb return at once (both matrix products skipped)
 *   no-pack     pack_a, pack_bt and pack_b return at once
 *   driver      all of the above skipped: what is left is the driver (scale, masks, row
 *               max, rounding p, rescaling the accumulator, writing o) and threading
 * The results are numerically meaningless except for `full`; only the times matter.
 *
 *   tool_limits --batch B --heads H --seq S --head-dim D [--dtype f32|f16|bf16] [--causal]
 *          [--threads N] [--block-q BQ --block-k BK] [--reps N] */
#include "cpu/isa.h"
#include "internal.h"
#include "measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static float no_exp(float *x, int n, float mx) {
    (void)x;
    (void)mx;
    return (float)n;
}
static void no_abt(int m, int n, int k, const void *a, const void *bt, float *s, int lds) {
    (void)m; (void)n; (void)k; (void)a; (void)bt; (void)s; (void)lds;
}
static void no_pb(int m, int n, int cols, const float *p, int ldp, const void *b, float *o, int ldo) {
    (void)m; (void)n; (void)cols; (void)p; (void)ldp; (void)b; (void)o; (void)ldo;
}
static void no_pack(const fa_tile_src *src, int rows, int cols, void *dst) {
    (void)src; (void)rows; (void)cols; (void)dst;
}

int main(int argc, char **argv) {
    int64_t B = 1, H = 8, S = 4096, D = 128, bq = 0, bk = 0, reps = 3, threads = 0;
    fa_dtype dt = FA_F32;
    int causal = 0;
    const measure_opt opts[] = {
        {"--batch", &B, NULL},      {"--heads", &H, NULL},       {"--seq", &S, NULL},
        {"--head-dim", &D, NULL},   {"--block-q", &bq, NULL},    {"--block-k", &bk, NULL},
        {"--reps", &reps, NULL},    {"--threads", &threads, NULL}, {"--causal", NULL, &causal},
        {NULL, NULL, NULL}};
    if (measure_parse("tool_limits", argc, argv, opts, &dt)) return 2;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B; p.heads_q = p.heads_kv = H; p.seq_q = p.seq_k = S; p.head_dim = p.head_dim_v = D;
    p.dtype = dt; p.causal = causal;
    fa_options opt = {FA_BACKEND_CPU, (int)threads, bq, bk};
    fa_plan *plan;
    if (fa_plan_create(&p, &opt, &plan) != FA_OK) {
        fprintf(stderr, "tool_limits: %s\n", fa_last_error());
        return 2;
    }
    fa_cost c;
    fa_plan_cost(plan, FA_FORWARD, &c);
    size_t n = (size_t)(B * H * S * D), esz = fa_dtype_size(dt);
    char *q = calloc(n, esz), *k = calloc(n, esz), *v = calloc(n, esz), *o = calloc(n, esz);
    if (!q || !k || !v || !o) return 1;
    for (size_t i = 0; i < n; i++) { /* small values of any dtype: 0x3c00 is 1.0 in f16, ~1 in bf16 */
        if (dt == FA_F32) ((float *)q)[i] = ((float *)k)[i] = ((float *)v)[i] = (float)(i % 7) * 0.1f;
        else ((uint16_t *)q)[i] = ((uint16_t *)k)[i] = ((uint16_t *)v)[i] = 0x3c00;
    }
    fa_forward_args a;
    memset(&a, 0, sizeof a);
    a.q = q; a.k = k; a.v = v; a.o = o;

    const fa_isa *real = plan->isa;
    fa_isa t_noexp = *real, t_nogemm = *real, t_nopack = *real, t_driver = *real;
    t_noexp.exp_sum = no_exp;
    t_nogemm.gemm_abt = no_abt; t_nogemm.gemm_pb = no_pb;
    t_nopack.pack_a = t_nopack.pack_bt = t_nopack.pack_b = no_pack;
    t_driver.exp_sum = no_exp; t_driver.gemm_abt = no_abt; t_driver.gemm_pb = no_pb;
    t_driver.pack_a = t_driver.pack_bt = t_driver.pack_b = no_pack;
    struct { const char *name; const fa_isa *t; } var[] = {
        {"full", real}, {"no-exp", &t_noexp}, {"no-gemm", &t_nogemm}, {"no-pack", &t_nopack}, {"driver", &t_driver}};
    double full = 0;
    printf("limits: isa %s, %s B=%lld H=%lld S=%lld D=%lld%s, blocks %lldx%lld, %d threads\n", real->name,
           fa_dtype_name(dt), (long long)B, (long long)H, (long long)S, (long long)D, causal ? " causal" : "",
           (long long)plan->fwd_bq, (long long)plan->fwd_bk, plan->threads);
    for (size_t x = 0; x < sizeof var / sizeof var[0]; x++) {
        plan->isa = var[x].t;
        fa_forward(plan, &a); /* warm-up */
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = measure_now();
            fa_forward(plan, &a);
            double t = measure_now() - t0;
            if (t < best) best = t;
        }
        if (x == 0) full = best;
        printf("  %-8s %8.4f s  %5.1f%% of full  (%.1f GFLOP/s if it did all the flops)\n", var[x].name, best,
               100 * best / full, (double)c.flops / best * 1e-9);
    }
    plan->isa = real;
    fa_plan_destroy(plan);
    free(q); free(k); free(v); free(o);
    return 0;
}
