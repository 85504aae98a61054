/* The masks' per-element definitions (docs/masks.md, flashattn.h "masks as data"), written
 * from the docs for the tests: never the library's mask code. */
#ifndef FA_TEST_MASK_DEFS_H
#define FA_TEST_MASK_DEFS_H

#include <stdint.h>

typedef struct {
    int kind; /* 0 causal, 1 window, 2 chunked, 3 prefix, 4 documents */
    int64_t off, left, right, chunk;
    const int64_t *prefix, *counts, *lens;
} mask_def;

/* The definitions, per element. */
static inline int mask_def_attends(const mask_def *d, int64_t b, int64_t i, int64_t j) {
    const int64_t pos = i + d->off;
    switch (d->kind) {
    case 0: return j <= pos;
    case 1: return (d->left < 0 || pos - d->left <= j) && (d->right < 0 || j <= pos + d->right);
    case 2: {
        if (j > pos) return 0;
        /* floor division (pos may be negative only where j > pos already failed) */
        return j / d->chunk == pos / d->chunk;
    }
    case 3: return j < d->prefix[b] || j <= pos;
    default: {
        int64_t at = 0;
        for (int64_t x = 0; x < b; x++) at += d->counts[x];
        int64_t start = 0, di = -1, dj = -1;
        for (int64_t k = 0; k < d->counts[b]; k++) {
            const int64_t end = start + d->lens[at + k];
            if (i >= start && i < end) di = k;
            if (j >= start && j < end) dj = k;
            start = end;
        }
        return di == dj;
    }
    }
}

#endif
