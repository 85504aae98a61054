/* This machine's arithmetic peaks, measured: loops that keep enough independent
 * accumulators in flight to hide latency, and their GFLOP/s on N threads at once (OpenMP, so
 * a shared clock shows). `flashattn calibrate` (rates_measure.c) and bench/peak.c use them. */
#ifndef FA_TOOLS_PEAK_LOOPS_H
#define FA_TOOLS_PEAK_LOOPS_H

#include <stdint.h>

/* Runs iters iterations, returns the flops done; *sink keeps the result alive. */
typedef double (*peak_loop)(int64_t iters, float *sink);

double peak_fma_scalar(int64_t iters, float *sink); /* plain C multiply-adds */
#if defined(__x86_64__)
double peak_fma256(int64_t iters, float *sink);  /* AVX2 vfmadd on 8 floats: 16 flops */
double peak_fma512(int64_t iters, float *sink);  /* AVX-512 vfmadd on 16 floats: 32 flops */
double peak_dpbf16(int64_t iters, float *sink);  /* AVX512_BF16 vdpbf16ps: 64 flops */
double peak_amx_bf16(int64_t iters, float *sink); /* AMX tdpbf16ps: 32768 flops */
/* 1 where cpuid has AMX-BF16 and the OS grants the tiles (Linux arch_prctl). */
int peak_amx_available(void);
#endif

/* Iterations of fn that take about secs seconds on one thread. */
int64_t peak_iters(peak_loop fn, double secs);
/* GFLOP/s of fn on threads threads at once, best of reps runs of iters iterations each. */
double peak_gflops(peak_loop fn, int threads, int64_t iters, int reps);

#endif
