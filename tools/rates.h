/* This machine's measured rates and the time model built on them (`flashattn calibrate`,
 * and the "predicted" figures of `plan` and `bench`).
 *
 * The model, per pass, from the plan's own counts (fa_cost) and the measured rates:
 *
 *   compute = flops / (peak * efficiency) + transcendentals / exp_rate
 *   memory  = bytes_accessed / read_bandwidth
 *   seconds = max(compute, memory)
 *
 * peak is the arithmetic peak of the instruction the kernels multiply with, on the plan's
 * thread count: vdpbf16ps for bf16 where the kernel set has it (avx512bf16, amx), else the
 * f32 FMA (f16 and, on other sets, bf16 are multiplied in f32). The amx set multiplies bf16
 * in the tile unit, faster than vdpbf16ps: its bf16 efficiency then exceeds 1, as the
 * model needs (the peak stays vdpbf16ps's: the tile unit's is not measured). exp_rate is the kernel
 * set's own exp (fa_isa.exp_sum) on L1-resident rows, all threads at once. efficiency is
 * the tile efficiency: the fraction of the peak the library's products reach inside a real
 * pass (packing, masking, softmax bookkeeping, edge tiles, threading all included),
 * measured by timing that pass on a small calibration problem and solving the model
 * above for it. One efficiency per (pass, dtype); everything else is shape-independent.
 *
 * Rates depend on the kernel set and the thread count, so the cache keeps one entry per
 * (isa, threads): keys "<isa>/t<threads>/<name>" in a flat JSON object at
 * $XDG_CACHE_HOME/flashattn/rates.json (or ~/.cache/flashattn/rates.json). */
#ifndef FA_TOOLS_RATES_H
#define FA_TOOLS_RATES_H

#include "flashattn.h"

#include <stddef.h>

typedef struct {
    char isa[32];
    int threads;
    double fma_gflops;    /* f32 FMA peak, GFLOP/s (all threads) */
    double dpbf16_gflops; /* vdpbf16ps peak, GFLOP/s; 0 where the CPU lacks it */
    double read_gbps;     /* memory read bandwidth, GB/s (1e9 bytes) */
    double exp_per_s;     /* exps per second through the kernel set's exp */
    double eff[2][3];     /* tile efficiency [pass][dtype]; 0: not measured */
} cli_rates;

/* The predicted seconds of one pass and the terms it came from. */
typedef struct {
    double seconds, compute, exps, memory, peak_gflops, efficiency;
} cli_prediction;

/* The cache file's path into buf; 0 on success, 1 when neither XDG_CACHE_HOME nor HOME is
 * set (or the path does not fit). */
int cli_rates_path(char *buf, size_t len);

/* Looks up the entry for (isa, threads) in the cache. 0 found, 1 no file or no entry, -1
 * the cache could not be read (errno says why: out of memory, an I/O error). */
int cli_rates_load(const char *isa, int threads, cli_rates *r);

/* Writes r into the cache (other entries kept), creating the directory. The new file is
 * written whole to a temporary beside the cache (tools/npy.h's outputs: never a fixed name,
 * removed on any failure and by SIGINT, SIGTERM, SIGHUP, SIGPIPE), then before_commit (if
 * not NULL) runs and, where it returns 0, the temporary is renamed onto the cache. 0 on
 * success; 1 with why in err; -1 when before_commit failed (the cache untouched). */
int cli_rates_save(const cli_rates *r, int (*before_commit)(void *ctx), void *ctx, char *err, size_t errlen);

/* Measures every rate on `threads` threads with the kernel set fa_cpu_isa() names (a few
 * seconds); progress lines on stderr when verbose. 0 on success; 1 with why in err. */
int cli_rates_measure(int threads, int verbose, cli_rates *r, char *err, size_t errlen);

/* The model above for one pass of a CPU plan. 0 on success; 1 when r has no efficiency
 * for that (pass, dtype) or the plan is not a CPU plan. */
int cli_rates_predict(const cli_rates *r, const fa_plan *plan, fa_pass pass, cli_prediction *out);

/* The peak the model uses for dtype t (GFLOP/s). */
double cli_rates_peak(const cli_rates *r, fa_dtype t);

#endif
