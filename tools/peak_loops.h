/* This machine's arithmetic peaks, measured: loops that keep enough independent
 * accumulators in flight to hide latency, and their GFLOP/s on N threads at once (OpenMP, so
 * a shared clock shows). `flashattn calibrate` (rates_measure.c) and bench/peak.c use them. */
#ifndef FA_TOOLS_PEAK_LOOPS_H
#define FA_TOOLS_PEAK_LOOPS_H

#include <stddef.h>
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

/* The sum of the 64-bit words in bytes of buf (a multiple of 256; buf 64-byte aligned), read
 * four cache lines a step into four independent sums, in the widest loads the CPU has
 * (AVX-512, AVX2, else 16 bytes): the memory's read rate. The load width matters where the
 * hardware prefetchers do not run far ahead (a virtual machine's host, measured): on the AMX
 * Xeon a 1 GiB read ran at 36 GB/s in 64-byte loads, 19 in 16-byte ones, which hold 4x
 * fewer lines in flight in the same out-of-order window (bench/RESULTS.md, 2026-12-07). */
uint64_t peak_read_sum(const void *buf, size_t bytes);
/* The median read GB/s of reps passes of threads threads over n bytes of buf (each thread
 * its own slice; buf 64-byte aligned, first touched by the thread that reads it: see
 * peak_read_touch); *cpu_gbps (if not NULL) per cpu-second of each thread, the read while it ran. */
double peak_read_gbps(const void *buf, size_t bytes, int threads, int reps, double *cpu_gbps);
/* Writes every word of buf (bytes a multiple of 256), each thread the slice peak_read_gbps
 * gives it: so that on a multi-socket machine a thread reads its own node's memory. */
void peak_read_touch(void *buf, size_t bytes, int threads);

/* Iterations of fn that take about secs seconds on one thread. */
int64_t peak_iters(peak_loop fn, double secs);
/* GFLOP/s of fn on threads threads at once, best of reps runs of iters iterations each. */
double peak_gflops(peak_loop fn, int threads, int64_t iters, int reps);

#endif
