/* How fast can a decode-shaped loop read memory? A probe of the machine, not of the library:
 * THREADS OpenMP threads each read their slice of an array far larger than the last-level
 * cache (2 MiB pages), in three ways, and print GB/s for each (the best of REPS passes):
 *   load       one 1-byte load a 64-byte line, in address order (the demand misses alone)
 *   prefetch   one prefetcht2 a line, in address order, no loads (the decode steps' way of
 *              asking for the next tile)
 *   tiles W    the decode driver's pattern: the slice in tiles of TILE KiB; each line of the
 *              current tile is read with a 64-byte load and W dependent multiply-adds, and
 *              the matching line of the next tile is prefetched (prefetcht2) beside it, so the
 *              next tile arrives while the current one is used (W = 0, 1, 2, 4)
 * If "tiles" reads near "prefetch", the memory can feed a step that prefetches its next tile
 * while it computes, and a decode step that reads slower loses its time elsewhere
 * (bench/RESULTS.md, 2026-12-07, sixteenth session).
 *   prefetch_probe [MiB (default 1024)] [threads (default 2)] [tile KiB (default 512)] [reps (default 5)] */
#define _DEFAULT_SOURCE /* madvise */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One thread's pass over [b, b + bytes): mode 0 load, 1 prefetch, 2 tiles of `tile` bytes
 * with `work` multiply-adds a line. Returns something of what it read, so nothing is dropped. */
static __attribute__((target("avx512f"))) float pass(const char *b, size_t bytes, int mode, size_t tile, int work) {
    unsigned sink = 0;
    if (mode == 0)
        for (size_t off = 0; off < bytes; off += 64) sink ^= (unsigned char)b[off];
    if (mode == 1)
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(b + off, 0, 1);
    __m512 acc = _mm512_setzero_ps();
    if (mode == 2) {
        const __m512 y = _mm512_set1_ps(1.0001f);
        const size_t tiles = bytes / tile;
        for (size_t off = 0; off < tile; off += 64) __builtin_prefetch(b + off, 0, 1); /* the first tile */
        for (size_t t = 0; t < tiles; t++) {
            const char *cur = b + t * tile, *next = t + 1 < tiles ? cur + tile : NULL;
            for (size_t off = 0; off < tile; off += 64) {
                acc = _mm512_add_ps(acc, _mm512_load_ps((const float *)(cur + off)));
                for (int w = 0; w < work; w++) acc = _mm512_fmadd_ps(acc, y, y);
                if (next) __builtin_prefetch(next + off, 0, 1);
            }
        }
    }
    return (float)sink + _mm512_reduce_add_ps(acc);
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const size_t tile = (argc > 3 ? (size_t)atol(argv[3]) : 512) << 10;
    const int reps = argc > 4 ? atoi(argv[4]) : 5;
    const size_t bytes = mib << 20;
    if (mib < 64 || mib > ((size_t)1 << 20) || threads < 1 || threads > 1024 || tile < 4096 || tile > bytes / 8 ||
        reps < 1 || reps > 64)
        return fprintf(stderr, "prefetch_probe: bad arguments (MiB 64..2^20, threads 1..1024, tile KiB 4..MiB*128, "
                               "reps 1..64)\n"), 1;
    const size_t huge = (size_t)2 << 20, alloc = (bytes + huge - 1) / huge * huge;
    char *a = aligned_alloc(huge, alloc);
    if (!a) return fprintf(stderr, "prefetch_probe: cannot allocate %zu MiB\n", mib), 1;
#ifdef MADV_HUGEPAGE
    madvise(a, alloc, MADV_HUGEPAGE);
#endif
    memset(a, 1, bytes);
    static const struct { const char *name; int mode, work; } ways[] = {
        {"load", 0, 0}, {"prefetch", 1, 0}, {"tiles W=0", 2, 0}, {"tiles W=1", 2, 1}, {"tiles W=2", 2, 2},
        {"tiles W=4", 2, 4}};
    printf("prefetch_probe: %zu MiB, %d threads, tiles of %zu KiB, best of %d passes\n", mib, threads, tile >> 10, reps);
    const size_t per = bytes / (size_t)threads / tile * tile; /* each thread's slice: whole tiles */
    float keep = 0;
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : keep)
            keep += pass(a + per * (size_t)omp_get_thread_num(), per, ways[w].mode, tile, ways[w].work);
            const double t = now() - t0;
            if (t < best) best = t;
        }
        printf("  %-10s %7.2f GB/s\n", ways[w].name, (double)(per * (size_t)threads) / best / 1e9);
    }
    if (keep == 12345.0f) printf("\n"); /* what was read is used */
    free(a);
    return 0;
}
