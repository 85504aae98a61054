/* The machine's streaming read bandwidth, the yardstick of a decode step (bench/inference.sh,
 * bench/decode_caches.sh): THREADS OpenMP threads sum disjoint slices of an array far larger
 * than the last-level cache, four cache lines a step in the widest loads the CPU has
 * (tools/peak_loops.c, peak_read_sum). Prints one JSON line: the median of REPS passes.
 *   bandwidth [MiB (default 1024)] [threads (default 2)] [reps (default 9)] [huge]
 * huge: the array on 2 MiB pages (madvise MADV_HUGEPAGE), the yardstick for
 * `flashattn bench --decode --huge-pages`. */
#define _DEFAULT_SOURCE /* madvise */
#include "peak_loops.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    const int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 9;
    const size_t bytes = mib << 20;
    const int want_huge = argc > 4 && !strcmp(argv[4], "huge");
    if (mib < 1 || mib > ((size_t)1 << 24) || reps < 1 || reps > 64 || threads < 1 || threads > 1024 ||
        (argc > 4 && !want_huge))
        return fprintf(stderr, "bandwidth: bad arguments (MiB 1..2^24, threads 1..1024, reps 1..64, huge)\n"), 1;
    void *a = aligned_alloc((size_t)2 << 20, (bytes + ((size_t)2 << 20) - 1) / ((size_t)2 << 20) * ((size_t)2 << 20));
    if (!a) return fprintf(stderr, "bandwidth: cannot allocate %zu MiB\n", mib), 1;
    int huge = 0;
#ifdef MADV_HUGEPAGE
    if (want_huge) huge = madvise(a, bytes, MADV_HUGEPAGE) == 0;
#endif
    if (want_huge && !huge) fprintf(stderr, "bandwidth: madvise(MADV_HUGEPAGE) refused; 4 KiB pages\n");
    peak_read_touch(a, bytes, threads); /* first touch by the thread that reads it */
    double per_cpu_s;
    const double gbps = peak_read_gbps(a, bytes, threads, reps, &per_cpu_s);
    /* per cpu-second of each thread: what the threads read while they ran (a shared machine
     * deschedules them; wall time then counts the waits) */
    printf("{\"read_gbytes_per_s\": %.4g, \"read_gbytes_per_cpu_s\": %.4g, \"bytes\": %zu, \"threads\": %d, "
           "\"reps\": %d, \"huge_pages\": %d}\n",
           gbps, per_cpu_s, bytes, threads, reps, huge);
    free(a);
    return 0;
}
