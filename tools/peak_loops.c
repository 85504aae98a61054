/* peak_loops.h: the arithmetic loops and their rates on N threads. */
#define _DEFAULT_SOURCE /* syscall() */
#include "peak_loops.h"
#include "measure.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---- arithmetic loops: each returns the flops it did; sink keeps the result alive ------ */

#define CHAINS 12 /* independent accumulators: enough to cover the FMA latency x ports */

double peak_fma_scalar(int64_t iters, float *sink) {
    float acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = 1.0f + 0.01f * (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * 0.999999f + 1e-6f;
    float s = 0;
    for (int j = 0; j < CHAINS; j++) s += acc[j];
    *sink = s;
    return (double)iters * CHAINS * 2;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) double peak_fma512(int64_t iters, float *sink) {
    __m512 acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + 0.01f * (float)j);
    const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], mul, add);
    for (int j = 1; j < CHAINS; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    *sink = _mm512_reduce_add_ps(acc[0]);
    return (double)iters * CHAINS * 16 * 2;
}

__attribute__((target("avx2,fma"))) double peak_fma256(int64_t iters, float *sink) {
    __m256 acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + 0.01f * (float)j);
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], mul, add);
    float lanes[8];
    for (int j = 1; j < CHAINS; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    _mm256_storeu_ps(lanes, acc[0]);
    *sink = lanes[0] + lanes[7];
    return (double)iters * CHAINS * 8 * 2;
}

/* vdpbf16ps: 16 lanes x 2 bf16 products accumulated, 4 flops a lane */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) double peak_dpbf16(int64_t iters, float *sink) {
    __m512 acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_setzero_ps();
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a83);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    for (int j = 1; j < CHAINS; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    *sink = _mm512_reduce_add_ps(acc[0]);
    return (double)iters * CHAINS * 16 * 4;
}
#endif

/* ---- AMX (Sapphire Rapids and later): tiles must be granted by the OS first ------------ */
#if defined(__linux__) && defined(__x86_64__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int peak_amx_available(void) {
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

__attribute__((target("amx-tile,amx-bf16"))) double peak_amx_bf16(int64_t iters, float *sink) {
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
#elif defined(__x86_64__)
int peak_amx_available(void) { return 0; }
double peak_amx_bf16(int64_t iters, float *sink) {
    (void)iters;
    *sink = 0;
    return 0;
}
#endif

int64_t peak_iters(peak_loop fn, double secs) {
    int64_t n = 1000;
    for (;;) {
        float sink;
        double t0 = measure_now();
        fn(n, &sink);
        double t = measure_now() - t0;
        if (t > 0.02) return (int64_t)((double)n * secs / t) + 1;
        n *= 4;
    }
}

double peak_gflops(peak_loop fn, int threads, int64_t iters, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double flops = 0, t0 = measure_now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
        {
            float s;
            flops += fn(iters, &s);
            if (s == 12345.0f) flops += 1; /* depends on s: the loop stays */
        }
        const double t = measure_now() - t0;
        if (flops / t > best) best = flops / t;
    }
    return best * 1e-9;
}

/* ---- the memory's read rate (peak_loops.h: peak_read_sum) ---------------------------- */

typedef uint64_t read_vec __attribute__((vector_size(64))); /* a cache line of words */

/* The one loop, compiled once per load width: the target attributes let GCC and Clang emit a
 * line as one 64-byte load (avx512f), two 32-byte ones (avx2), or four 16-byte ones. */
#define READ_SUM_BODY                                                                         \
    const read_vec *p = buf;                                                                  \
    read_vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                                          \
    for (size_t l = 0; l + 4 <= bytes / 64; l += 4) {                                         \
        s0 += p[l], s1 += p[l + 1], s2 += p[l + 2], s3 += p[l + 3];                           \
    }                                                                                         \
    const read_vec s = (s0 + s1) + (s2 + s3);                                                 \
    uint64_t total = 0;                                                                       \
    for (int c = 0; c < 8; c++) total += s[c];                                                \
    return total;

static uint64_t read_sum_plain(const void *buf, size_t bytes) { READ_SUM_BODY }
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read_sum_avx512(const void *buf, size_t bytes) { READ_SUM_BODY }
__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const void *buf, size_t bytes) { READ_SUM_BODY }
#endif

uint64_t peak_read_sum(const void *buf, size_t bytes) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return read_sum_avx512(buf, bytes);
    if (__builtin_cpu_supports("avx2")) return read_sum_avx2(buf, bytes);
#endif
    return read_sum_plain(buf, bytes);
}

/* Thread t's slice of bytes over threads: whole steps of 4 lines (256 bytes). */
static void read_slice(size_t bytes, int threads, int t, size_t *at, size_t *n) {
    const size_t steps = bytes / 256, per = (steps + (size_t)threads - 1) / (size_t)threads;
    const size_t s0 = per * (size_t)t < steps ? per * (size_t)t : steps, s1 = s0 + per < steps ? s0 + per : steps;
    *at = s0 * 256, *n = (s1 - s0) * 256;
}

void peak_read_touch(void *buf, size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
    {
        size_t at, n;
        read_slice(bytes, omp_get_num_threads(), omp_get_thread_num(), &at, &n);
        uint64_t *w = (uint64_t *)((char *)buf + at);
        for (size_t i = 0; i < n / 8; i++) w[i] = (at / 8 + i) * 0x9e3779b97f4a7c15ull;
    }
}

static int by_value(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double peak_read_gbps(const void *buf, size_t bytes, int threads, int reps, double *cpu_gbps) {
    double t[64], cpu[64];
    if (reps > 64) reps = 64;
    if (reps < 1) reps = 1;
    uint64_t total = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = measure_now(), c0 = measure_cpu_now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            size_t at, n;
            read_slice(bytes, omp_get_num_threads(), omp_get_thread_num(), &at, &n);
            total += peak_read_sum((const char *)buf + at, n);
        }
        t[r] = measure_now() - t0;
        cpu[r] = measure_cpu_now() - c0;
    }
    qsort(t, (size_t)reps, sizeof t[0], by_value);
    qsort(cpu, (size_t)reps, sizeof cpu[0], by_value);
    const double read = (double)(bytes / 256 * 256) + (total == 42 ? 1 : 0); /* depends on total: the sums stay */
    if (cpu_gbps) *cpu_gbps = read / (cpu[reps / 2] / threads) * 1e-9;
    return read / t[reps / 2] * 1e-9;
}
