/* peak: this machine's arithmetic peak, measured, for "fraction of peak" in the benchmark.
 *
 *   fma_f32    AVX-512 vfmadd231ps on 16 floats: 32 flops an instruction
 *   dpbf16     AVX512_BF16 vdpbf16ps: 32 bf16 multiply-adds an instruction, 2 flops each
 *   amx_bf16   AMX tdpbf16ps (only where cpuid and the OS grant AMX tiles)
 *
 * Each loop keeps enough independent accumulators in flight to hide latency, runs for
 * about 0.2 s, and the best of several repetitions counts. Threads run the same loop at
 * once (OpenMP), so the 2-thread figure includes any shared-clock effect.
 *
 * Output: human lines on stderr; one JSON object on stdout, e.g.
 *   {"fma_f32": {"1": 95.1, "2": 190.0}, "dpbf16": {...}, "amx_bf16": null}   (GFLOP/s) */
#define _DEFAULT_SOURCE /* syscall() */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the loops: each returns flops done, and a value the compiler cannot drop ---------- */

#define NACC 12

__attribute__((target("avx512f"))) static double fma_loop(int64_t iters, float *sink) {
    __m512 acc[NACC];
    for (int j = 0; j < NACC; j++) acc[j] = _mm512_set1_ps(1.0f + 0.01f * (float)j);
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < NACC; j++) acc[j] = _mm512_fmadd_ps(acc[j], b, c);
    }
    __m512 s = acc[0];
    for (int j = 1; j < NACC; j++) s = _mm512_add_ps(s, acc[j]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 16 * 2;
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) static double dpbf16_loop(int64_t iters,
                                                                                float *sink) {
    __m512 acc[NACC];
    for (int j = 0; j < NACC; j++) acc[j] = _mm512_setzero_ps();
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80); /* 1.0 in bf16 */
    const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3a83); /* ~0.001 */
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < NACC; j++) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    }
    __m512 s = acc[0];
    for (int j = 1; j < NACC; j++) s = _mm512_add_ps(s, acc[j]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 32 * 2;
}

/* ---- AMX (Sapphire Rapids and later): tiles must be granted by the OS first ------------ */
#if defined(__linux__) && defined(__x86_64__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_available(void) {
    if (!__builtin_cpu_supports("avx512f")) return 0;
    unsigned a, b, c, d;
    /* CPUID.(EAX=7,ECX=0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 22) & 1) || !((d >> 24) & 1)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Tile configuration: palette 1, tiles 0-3 accumulators (16 rows x 64 bytes), tiles 4-5
 * A operands (16 x 64 bytes), tiles 6-7 B operands (16 x 64 bytes). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

__attribute__((target("amx-tile,amx-bf16"))) static double amx_loop(int64_t iters, float *sink) {
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    static __thread uint16_t buf[16 * 32] __attribute__((aligned(64)));
    static __thread float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) buf[i] = 0x3a83;
    /* ldtilecfg by inline asm: GCC 12 mis-compiles the intrinsic when it is not inlined. */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm4\n\t"
                     "tileloadd (%0,%1,1), %%tmm5\n\t"
                     "tileloadd (%0,%1,1), %%tmm6\n\t"
                     "tileloadd (%0,%1,1), %%tmm7" ::"r"(buf), "r"((int64_t)64));
    for (int64_t i = 0; i < iters; i++) {
        __asm__ volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
                         "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
                         "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
                         "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
    }
    __asm__ volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(out), "r"((int64_t)64) : "memory");
    __asm__ volatile("tilerelease" ::);
    *sink = out[0];
    /* each tdpbf16ps: 16 x 16 outputs x 32 bf16 products, 2 flops each */
    return (double)iters * 4 * 16 * 16 * 32 * 2;
}
#else
static int amx_available(void) { return 0; }
static double amx_loop(int64_t iters, float *sink) { (void)iters; *sink = 0; return 0; }
#endif

typedef double (*loop_fn)(int64_t, float *);

/* GFLOP/s of fn on `threads` threads at once, best of `reps`. */
static double measure(loop_fn fn, int threads, int64_t iters, int reps) {
    double best = 0;
    float sink_total = 0;
    for (int r = 0; r < reps; r++) {
        double flops = 0;
        double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink_total)
        {
            float sink;
            flops += fn(iters, &sink);
            sink_total += sink;
        }
        double t = now() - t0;
        if (flops / t > best) best = flops / t;
    }
    if (sink_total == 12345.0f) fprintf(stderr, " ");
    return best * 1e-9;
}

/* Iterations so that one run takes about `secs` seconds on one thread. */
static int64_t calibrate(loop_fn fn, double secs) {
    int64_t n = 1000;
    for (;;) {
        float sink;
        double t0 = now();
        fn(n, &sink);
        double t = now() - t0;
        if (t > 0.02) return (int64_t)((double)n * secs / t) + 1;
        n *= 4;
    }
}

int main(int argc, char **argv) {
    int maxt = omp_get_max_threads();
    if (argc > 1) maxt = atoi(argv[1]);
    if (maxt < 1) maxt = 1;
    const int reps = 10;
    struct { const char *name; loop_fn fn; int ok; } loops[] = {
        {"fma_f32", fma_loop, __builtin_cpu_supports("avx512f")},
        {"dpbf16", dpbf16_loop, __builtin_cpu_supports("avx512bf16")},
        {"amx_bf16", amx_loop, amx_available()},
    };
    printf("{");
    for (size_t l = 0; l < sizeof loops / sizeof loops[0]; l++) {
        printf("%s\"%s\": ", l ? ", " : "", loops[l].name);
        if (!loops[l].ok) {
            fprintf(stderr, "%-9s not available on this CPU\n", loops[l].name);
            printf("null");
            continue;
        }
        int64_t iters = calibrate(loops[l].fn, 0.2);
        printf("{");
        for (int t = 1; t <= maxt; t = (t == maxt ? t + 1 : maxt)) { /* 1 and maxt threads */
            double g = measure(loops[l].fn, t, iters, reps);
            fprintf(stderr, "%-9s %d thread%s: %8.1f GFLOP/s\n", loops[l].name, t, t > 1 ? "s" : " ", g);
            printf("%s\"%d\": %.1f", t > 1 ? ", " : "", t, g);
        }
        printf("}");
    }
    printf("}\n");
    return 0;
}
