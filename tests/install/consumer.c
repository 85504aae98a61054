/* An external program built against an installed flashattn (tests/test_install.sh): plans a
 * small problem, runs the forward, and checks the output against attention computed here in
 * double precision and the kernels' counts against the plan, and that the exported dtype
 * conversion rounds to nearest even. Exit 0 on success. */
#include <flashattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#define S 5
#define D 4

int main(void) {
    float q[S * D], k[S * D], v[S * D], o[S * D], lse[S];
    unsigned x = 12345u;
    for (int i = 0; i < S * D; i++) {
        x = x * 1103515245u + 12345u, q[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
        x = x * 1103515245u + 12345u, k[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
        x = x * 1103515245u + 12345u, v[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
        o[i] = NAN;
    }
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = p.seq_k = S, p.head_dim = D, p.causal = 1;
    fa_options opt = {.backend = FA_BACKEND_CPU};
    fa_plan *plan;
    if (fa_plan_create(&p, &opt, &plan) != FA_OK) {
        fprintf(stderr, "consumer: plan: %s\n", fa_last_error());
        return 1;
    }
    fa_cost cost;
    fa_plan_cost(plan, FA_FORWARD, &cost);
    fa_counts counted;
    fa_forward_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .counts = &counted};
    if (fa_forward(plan, &a) != FA_OK) {
        fprintf(stderr, "consumer: forward: %s\n", fa_last_error());
        return 1;
    }
    fa_plan_destroy(plan);
    double worst = 0;
    for (int i = 0; i < S; i++) {
        double s[S], m = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
            s[j] = 0;
            for (int d = 0; d < D; d++) s[j] += (double)q[i * D + d] * k[j * D + d];
            s[j] /= sqrt((double)D);
            if (s[j] > m) m = s[j];
        }
        for (int j = 0; j <= i; j++) sum += exp(s[j] - m);
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int j = 0; j <= i; j++) acc += exp(s[j] - m) / sum * v[j * D + d];
            double err = fabs(acc - o[i * D + d]);
            if (!(err <= worst)) worst = err;
        }
    }
    if (!(worst < 1e-5) || counted.flops != cost.flops) {
        fprintf(stderr, "consumer: max error %g, counted flops %lld vs plan %lld\n", worst,
                (long long)counted.flops, (long long)cost.flops);
        return 1;
    }
    const float third = 1.0f / 3.0f; /* 0x3eaaaaab: rounds up in bf16 and in f16 */
    uint16_t hb, hh;
    float back;
    fa_convert(FA_F32, &third, FA_BF16, &hb, 1);
    fa_convert(FA_F32, &third, FA_F16, &hh, 1);
    fa_convert(FA_F16, &hh, FA_F32, &back, 1);
    if (hb != 0x3eab || hh != 0x3555 || back != 0.333251953125f) {
        fprintf(stderr, "consumer: fa_convert gave bf16 %#x, f16 %#x, back %.9g\n", hb, hh, (double)back);
        return 1;
    }
    printf("consumer: ok (max error %.1e, flops %lld as planned, isa %s)\n", worst, (long long)counted.flops,
           fa_cpu_isa());
    return 0;
}
