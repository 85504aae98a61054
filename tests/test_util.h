/* Small helpers shared by the C tests: seeded random data, poisoning, error measures. */
#ifndef FA_TEST_UTIL_H
#define FA_TEST_UTIL_H

#include "flashattn.h"
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* splitmix64: a fresh seed per run (printed on failure), reproducible with FA_TEST_SEED. */
static inline uint64_t tu_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t tu_seed(void) {
    const char *e = getenv("FA_TEST_SEED");
    if (e && *e) return strtoull(e, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
}
/* FA_CHECK_CASES: how many random configurations a long differential run draws (make
 * check-long); 0 (unset) means the program's own fixed sweep. */
static inline int tu_check_cases(void) {
    const char *e = getenv("FA_CHECK_CASES");
    long n = e && *e ? strtol(e, NULL, 10) : 0;
    return n > 0 ? (n > 100000000 ? 100000000 : (int)n) : 0;
}
/* A failed check in a seeded test: counted in the caller's `failures` and printed with the
 * caller's `seed` (the FA_TEST_SEED that replays it), the place and the message. */
#define TU_CHECK(cond, ...)                                                                            \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            failures++;                                                                                \
            printf("FAIL (FA_TEST_SEED=%llu) %s:%d: ", (unsigned long long)seed, __FILE__, __LINE__);  \
            printf(__VA_ARGS__);                                                                       \
            printf("\n");                                                                              \
        }                                                                                              \
    } while (0)

/* uniform in [-1, 1) */
static inline double tu_uniform(uint64_t *s) {
    return (double)(tu_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}
static inline int64_t tu_int(uint64_t *s, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(tu_next(s) % (uint64_t)(hi - lo + 1));
}

/* Fills n elements of dtype t with uniform values times amp (rounded to the dtype). */
static inline void tu_fill(uint64_t *s, fa_dtype t, void *x, int64_t n, double amp) {
    for (int64_t i = 0; i < n; i++) fa_store(t, x, i, (float)(tu_uniform(s) * amp));
}
/* NaN everywhere, so elements a kernel forgets to write are caught. */
static inline void tu_poison(fa_dtype t, void *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) fa_store(t, x, i, NAN);
}
static inline void *tu_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes); exit(1); }
    return p;
}

#endif
