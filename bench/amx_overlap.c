/* Does the AMX tile unit multiply while the vector ports work? A probe of the machine, not
 * of the library: steps of 4 tile products (tdpbf16ps, 16 x 16 x 32, on tiles from L1)
 * alone, a vector job alone (a row of n floats read, 4 multiply-adds, written back: the
 * shape of the softmax's exps), and the two interleaved, a job after each step. Where the
 * interleaved step takes the longer of the two, not their sum, the tile unit runs apart
 * from the vector ports, and a kernel that issues the next rows' exps between its P V
 * products would hide one behind the other (bench/RESULTS.md, 2026-12-03). One thread.
 *
 * Usage: amx_overlap [steps]   (default 2,000,000; prints a table, ns per step)
 * Exits 77 where the CPU or the OS offers no AMX. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) tile_config;

static const tile_config config = {.palette = 1,
                                   .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                   .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

#define TILE_LOAD(t, base, stride)                                                                     \
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #t "|tileloadd\t%%tmm" #t ", [%0+%1*1]}"             \
                     : : "r"((const void *)(base)), "r"((long)(stride)) : "memory")

static uint16_t a_tiles[2][16 * 32 * 8] __attribute__((aligned(64)));
static uint32_t b_tiles[2][16 * 16 * 8] __attribute__((aligned(64)));
static float rows[32 * 1024] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* The vector job: one row of n floats, in place. Not inlined, as a kernel's job would be a call. */
static __attribute__((noinline, target("avx512f"))) void job(float *x, int n) {
    const __m512 a = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (int j = 0; j < n; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        v = _mm512_fmadd_ps(v, a, c);
        v = _mm512_fmadd_ps(v, a, c);
        v = _mm512_fmadd_ps(v, v, c);
        v = _mm512_fmadd_ps(v, a, c);
        _mm512_storeu_ps(x + j, v);
    }
}

/* ns per step: tiles (4 products a step) and / or a job of n floats after each step. */
static __attribute__((target("avx512f,amx-tile,amx-bf16"))) double run(int tiles, int n, long steps) {
    __asm__ volatile("ldtilecfg %0" : : "m"(config));
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const double t0 = now();
    for (long s = 0; s < steps; s++) {
        const int x = (int)(s & 7);
        if (tiles) {
            TILE_LOAD(4, a_tiles[0] + 32 * x, 512);
            TILE_LOAD(6, b_tiles[0] + 256 * x, 64);
            TILE_LOAD(7, b_tiles[1] + 256 * x, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            TILE_LOAD(5, a_tiles[1] + 32 * x, 512);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        if (n) job(rows + 1024 * (s & 31), n);
    }
    const double t1 = now();
    __asm__ volatile("tilerelease" ::);
    return (t1 - t0) / (double)steps * 1e9;
}

int main(int argc, char **argv) {
    const long steps = argc > 1 ? atol(argv[1]) : 2000000;
    if (steps <= 0) {
        fprintf(stderr, "usage: amx_overlap [steps > 0]\n");
        return 2;
    }
    if (!amx_usable()) {
        printf("skipped: this CPU or OS offers no AMX-BF16\n");
        return 77;
    }
    for (int i = 0; i < 32 * 1024; i++) rows[i] = (float)i * 1e-5f;
    printf("| job (floats) | tiles alone | job alone | interleaved | sum of the two | hidden |\n");
    printf("| --- | --- | --- | --- | --- | --- |\n");
    static const int sizes[] = {64, 128, 256, 512, 1024};
    for (int k = 0; k < 5; k++) {
        const int n = sizes[k];
        const double t = run(1, 0, steps), v = run(0, n, steps), both = run(1, n, steps);
        const double shorter = t < v ? t : v;
        printf("| %d | %.1f ns | %.1f ns | %.1f ns | %.1f ns | %.0f%% of the shorter |\n", n, t, v, both, t + v,
               100.0 * (t + v - both) / shorter);
    }
    return 0;
}
