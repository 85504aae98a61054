/* The machine's streaming read bandwidth, the yardstick of a decode step (bench/inference.sh):
 * THREADS OpenMP threads sum disjoint slices of an array far larger than the last-level cache
 * with 64-bit loads the compiler vectorizes. Prints one JSON line: the median of REPS passes.
 *   bandwidth [MiB (default 1024)] [threads (default 2)] [reps (default 9)] [huge]
 * huge: the array on 2 MiB pages (madvise MADV_HUGEPAGE), the yardstick for
 * `flashattn bench --decode --huge-pages`. */
#define _DEFAULT_SOURCE /* madvise */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    const int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 9;
    const size_t n = mib * (1u << 20) / sizeof(uint64_t);
    const int want_huge = argc > 4 && !strcmp(argv[4], "huge");
    uint64_t *a = aligned_alloc((size_t)2 << 20, n * sizeof *a); /* MiB: a whole number of 2 MiB pages when even */
    if (!a || reps < 1 || reps > 99 || threads < 1 || (argc > 4 && !want_huge))
        return fprintf(stderr, "bandwidth: bad arguments or no memory\n"), 1;
    int huge = 0;
#ifdef MADV_HUGEPAGE
    if (want_huge) huge = madvise(a, n * sizeof *a, MADV_HUGEPAGE) == 0;
#endif
    if (want_huge && !huge) fprintf(stderr, "bandwidth: madvise(MADV_HUGEPAGE) refused; 4 KiB pages\n");
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i; /* first touch by the thread that reads it */
    double t[99], cpu[99]; /* wall and all threads' cpu seconds of each pass */
    uint64_t total = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t sum = 0;
        const double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : sum)
        for (size_t i = 0; i < n; i += 8) /* eight independent sums per cache line */
            sum += a[i] + a[i + 1] + a[i + 2] + a[i + 3] + a[i + 4] + a[i + 5] + a[i + 6] + a[i + 7];
        t[r] = clock_s(CLOCK_MONOTONIC) - t0;
        cpu[r] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        total += sum;
    }
    qsort(t, (size_t)reps, sizeof t[0], by_value);
    qsort(cpu, (size_t)reps, sizeof cpu[0], by_value);
    /* per cpu-second of each thread: what the threads read while they ran (a shared machine
     * deschedules them; wall time then counts the waits) */
    printf("{\"read_gbytes_per_s\": %.4g, \"read_gbytes_per_cpu_s\": %.4g, \"bytes\": %zu, \"threads\": %d, "
           "\"reps\": %d, \"huge_pages\": %d, \"checksum\": %llu}\n",
           (double)(n * sizeof *a) / t[reps / 2] * 1e-9, (double)(n * sizeof *a) / (cpu[reps / 2] / threads) * 1e-9,
           n * sizeof *a, threads, reps, huge, (unsigned long long)(total & 0xffff));
    free(a);
    return 0;
}
