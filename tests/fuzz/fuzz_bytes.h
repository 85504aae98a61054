/* A cursor over a fuzzer's input: each take_* consumes a few bytes and maps them onto a
 * range, so every input decodes to something valid-shaped (libFuzzer's mutations then
 * explore the values instead of being rejected by a parser of our own). Past the end,
 * every take returns the low end of its range. */
#ifndef FA_FUZZ_BYTES_H
#define FA_FUZZ_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

static inline uint64_t take_u64(fuzz_bytes *b, int nbytes) {
    uint64_t v = 0;
    for (int i = 0; i < nbytes && b->n; i++, b->p++, b->n--) v |= (uint64_t)*b->p << (8 * i);
    return v;
}
/* [lo, hi], hi - lo < 2^32 */
static inline int64_t take_range(fuzz_bytes *b, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(take_u64(b, span <= 256 ? 1 : span <= 65536 ? 2 : 4) % span);
}
static inline int take_bit(fuzz_bytes *b) { return (int)(take_u64(b, 1) & 1); }
/* Raw bytes of a struct or value: the whole bit pattern is the fuzzer's to choose. */
static inline void take_raw(fuzz_bytes *b, void *out, size_t size) {
    memset(out, 0, size);
    size_t k = size < b->n ? size : b->n;
    memcpy(out, b->p, k);
    b->p += k, b->n -= k;
}

/* A broken invariant of a harness (FUZZ_HARNESS names it): one line on stderr, then abort, so
 * libFuzzer keeps the input (tests/fuzz/run.sh greps the logs for "invariant"). */
#define FUZZ_CHECK(cond, ...)                                                                     \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s invariant broken: %s: ", FUZZ_HARNESS, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

#endif
