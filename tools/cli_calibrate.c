/* `flashattn calibrate`: measures this machine's rates (rates.h: peaks, read bandwidth, exp,
 * tile efficiencies) for the CPU kernel set in use and a thread count, prints them and
 * caches them, so that `plan` and `bench` can predict seconds per pass.
 *
 *   flashattn calibrate [--threads N] [--no-cache] [--json]
 *
 * --no-cache measures and prints without writing the cache. Takes a few seconds. */
#include "cli.h"
#include "rates.h"

#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_calibrate_usage(void) {
    printf("usage: flashattn calibrate [--threads N] [--no-cache] [--json]\n\n"
           "Measures this machine's rates for the CPU kernel set in use (f32 FMA and vdpbf16ps\n"
           "peaks, memory read bandwidth, exp throughput, and the tile efficiency of each pass\n"
           "and dtype on a small problem; a few seconds) and caches them in\n"
           "$XDG_CACHE_HOME/flashattn/rates.json (default ~/.cache/...), one entry per kernel set\n"
           "and thread count. `plan` and `bench` then print predicted seconds per pass:\n"
           "  max(flops / (peak x efficiency) + transcendentals / exp rate, bytes / bandwidth)\n"
           "(on amx, bf16's efficiency exceeds 1: its tiles multiply faster than vdpbf16ps)\n"
           "  --threads N  threads to measure with (default: OpenMP's default, as plans use)\n"
           "  --no-cache   measure and print only; leave the cache as it is\n"
           "  --json       one JSON object on stdout\n");
}

typedef struct {
    const cli_rates *r;
    const char *path; /* "" with --no-cache */
    int json;
} report;

/* Bytes of a valid UTF-8 sequence starting at c (1 to 4), or 0 where none starts there. */
static int utf8_length(const unsigned char *c) {
    const int n = c[0] < 0x80 ? 1
                  : (c[0] & 0xe0) == 0xc0 ? 2
                  : (c[0] & 0xf0) == 0xe0 ? 3
                  : (c[0] & 0xf8) == 0xf0 ? 4
                                          : 0;
    for (int i = 1; i < n; i++)
        if ((c[i] & 0xc0) != 0x80) return 0; /* also stops at the string's end */
    if (n == 2 && c[0] < 0xc2) return 0;     /* overlong */
    if (n == 3 && ((c[0] == 0xe0 && c[1] < 0xa0) || (c[0] == 0xed && c[1] >= 0xa0))) return 0; /* overlong, surrogate */
    if (n == 4 && ((c[0] == 0xf0 && c[1] < 0x90) || c[0] > 0xf4 || (c[0] == 0xf4 && c[1] >= 0x90))) return 0;
    return n;
}

/* A path as the characters of a JSON string: quotes, backslashes and control bytes escaped,
 * and a byte that is no part of valid UTF-8 (a JSON text is Unicode) as U+FFFD (a cache
 * directory is the user's: XDG_CACHE_HOME may hold any byte). */
static void print_json_chars(const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c;) {
        const int n = utf8_length(c);
        if (n == 0) printf("\\ufffd"), c++;
        else if (*c == '"' || *c == '\\') printf("\\%c", *c), c++;
        else if (*c < 0x20) printf("\\u%04x", *c), c++;
        else fwrite(c, 1, (size_t)n, stdout), c += n;
    }
}

/* The rates on stdout, flushed: with the cache, before it is replaced, so that a stdout that
 * cannot be written fails the command with the cache as it was (docs/cli.md). */
static int print_report(void *ctx) {
    const report *rp = ctx;
    const cli_rates *r = rp->r;
    static const char *const dt[3] = {"f32", "f16", "bf16"};
    if (rp->json) {
        printf("{\"isa\": \"%s\", \"threads\": %d, \"fma_gflops\": %.4g, \"dpbf16_gflops\": %.4g, "
               "\"read_gbps\": %.4g, \"exp_per_s\": %.4g",
               r->isa, r->threads, r->fma_gflops, r->dpbf16_gflops, r->read_gbps, r->exp_per_s);
        for (int pass = 0; pass < 2; pass++)
            for (int t = 0; t < 3; t++)
                printf(", \"eff_%s_%s\": %.4f", pass ? "backward" : "forward", dt[t], r->eff[pass][t]);
        printf(", \"cache\": \"");
        print_json_chars(rp->path);
        printf("\"}\n");
    } else {
        printf("kernel set   %s, %d thread%s\n", r->isa, r->threads, r->threads > 1 ? "s" : "");
        printf("f32 FMA      %8.1f GFLOP/s\n", r->fma_gflops);
        if (r->dpbf16_gflops > 0) printf("vdpbf16ps    %8.1f GFLOP/s\n", r->dpbf16_gflops);
        else printf("vdpbf16ps    not on this CPU\n");
        printf("read         %8.1f GB/s\n", r->read_gbps);
        printf("exp          %8.3g per second\n", r->exp_per_s);
        /* over 1 where the kernels multiply faster than the peak shown: amx's bf16 tiles run past
         * vdpbf16ps's (rates.h) */
        printf("tile efficiency (the products' rate inside a pass over the peak shown, above 1 where the\n"
               "  kernels outrun it, as amx's bf16 tiles do vdpbf16ps; B=1 H=%d S=1024 D=128)\n",
               4 * r->threads);
        for (int t = 0; t < 3; t++)
            printf("  %-4s       forward %.3f, backward %.3f (of %.1f GFLOP/s)\n", dt[t], r->eff[0][t],
                   r->eff[1][t], cli_rates_peak(r, (fa_dtype)t));
        if (*rp->path) printf("cached in    %s\n", rp->path);
        else printf("not cached (--no-cache)\n");
    }
    return cli_flush_stdout();
}

/* Its flags are parsed by cli_parse, as every subcommand's (--threads checked there). */
int cli_calibrate(const cli_args *a) {
    const int cache = !a->no_cache;
    int threads = a->threads ? a->threads : omp_get_max_threads();
    if (threads > FA_MAX_THREADS) /* OMP_NUM_THREADS above the library's limit: before any measuring */
        return cli_fail(2, "calibrate: %d threads (OMP_NUM_THREADS) is above the maximum of %d", threads,
                        FA_MAX_THREADS);
    cli_rates r;
    char err[512];
    if (cli_rates_measure(threads, !a->json, &r, err, sizeof err)) return cli_fail(1, "calibrate: %s", err);
    char path[4096] = "";
    report rp = {&r, path, a->json};
    if (!cache) return print_report(&rp);
    if (cli_rates_path(path, sizeof path)) return cli_fail(1, "calibrate: no cache directory (set XDG_CACHE_HOME or HOME)");
    const int rc = cli_rates_save(&r, print_report, &rp, err, sizeof err);
    return rc < 0 ? 1 : rc ? cli_fail(1, "calibrate: %s", err) : 0;
}
