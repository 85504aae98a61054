/* peak: this machine's arithmetic peak, measured, for "fraction of peak" in the benchmark.
 *
 *   fma_f32    AVX-512 vfmadd231ps on 16 floats: 32 flops an instruction
 *   dpbf16     AVX512_BF16 vdpbf16ps: 32 bf16 multiply-adds an instruction, 2 flops each
 *   amx_bf16   AMX tdpbf16ps (only where cpuid and the OS grant AMX tiles)
 *
 * The loops are tools/peak_loops.c's (the ones `flashattn calibrate` measures); each runs
 * for about 0.2 s, and the best of several repetitions counts. Threads run the same loop at
 * once (OpenMP), so the 2-thread figure includes any shared-clock effect.
 *
 * Output: human lines on stderr; one JSON object on stdout, e.g.
 *   {"fma_f32": {"1": 95.1, "2": 190.0}, "dpbf16": {...}, "amx_bf16": null}   (GFLOP/s) */
#include "peak_loops.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int maxt = omp_get_max_threads();
    if (argc > 1) maxt = atoi(argv[1]);
    if (maxt < 1) maxt = 1;
    const int reps = 10;
    struct { const char *name; peak_loop fn; int ok; } loops[] = {
        {"fma_f32", peak_fma512, __builtin_cpu_supports("avx512f")},
        {"dpbf16", peak_dpbf16, __builtin_cpu_supports("avx512bf16")},
        {"amx_bf16", peak_amx_bf16, peak_amx_available()},
    };
    printf("{");
    for (size_t l = 0; l < sizeof loops / sizeof loops[0]; l++) {
        printf("%s\"%s\": ", l ? ", " : "", loops[l].name);
        if (!loops[l].ok) {
            fprintf(stderr, "%-9s not available on this CPU\n", loops[l].name);
            printf("null");
            continue;
        }
        int64_t iters = peak_iters(loops[l].fn, 0.2);
        printf("{");
        for (int t = 1; t <= maxt; t = (t == maxt ? t + 1 : maxt)) { /* 1 and maxt threads */
            double g = peak_gflops(loops[l].fn, t, iters, reps);
            fprintf(stderr, "%-9s %d thread%s: %8.1f GFLOP/s\n", loops[l].name, t, t > 1 ? "s" : " ", g);
            printf("%s\"%d\": %.1f", t > 1 ? ", " : "", t, g);
        }
        printf("}");
    }
    printf("}\n");
    return 0;
}
