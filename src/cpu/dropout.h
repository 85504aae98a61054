/* Dropout in the CPU drivers: the keep mask (philox.h) applied to one row of a tile, in
 * chunks whose mask lives on the stack. The forward zeroes the dropped p (f32 or its bf16
 * pairs) after the row sum, so l and lse stay undropped, and scales o by 1 / (1 - p) when
 * it writes it; the backward regenerates the same mask for dP and P (backward_tile.h). */
#ifndef FA_CPU_DROPOUT_H
#define FA_CPU_DROPOUT_H

#include "../internal.h"
#include "../philox.h"

#include <string.h>

enum { FA_DROPOUT_CHUNK = 256 }; /* keys per generated piece of a row */

static inline fa_dropout fa_plan_dropout(const struct fa_plan *pl) {
    return fa_dropout_make(pl->p.dropout_p, pl->p.dropout_seed, pl->p.dropout_offset);
}

/* x[j] = 0 where key j0 + j of row i of (b, h) is dropped, j < n (b of the plan's batch
 * numbering: the caller adds pl->batch0). */
static inline void fa_dropout_zero_row(const fa_dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0, int n,
                                       float *restrict x) {
    uint8_t keep[FA_DROPOUT_CHUNK];
    for (int c = 0; c < n; c += FA_DROPOUT_CHUNK) {
        const int w = n - c < FA_DROPOUT_CHUNK ? n - c : FA_DROPOUT_CHUNK;
        fa_dropout_row(d, b, h, i, j0 + c, w, keep);
        for (int j = 0; j < w; j++) x[c + j] = keep[j] ? x[c + j] : 0.0f;
    }
}

/* The same for p stored as bf16 pairs (isa.h, exp_pairs: element j in the low half of word
 * j / 2 when j is even, the high half when odd). */
static inline void fa_dropout_zero_pairs(const fa_dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0, int n,
                                         uint32_t *restrict pp) {
    uint8_t keep[FA_DROPOUT_CHUNK]; /* FA_DROPOUT_CHUNK is even: a chunk starts on a word */
    for (int c = 0; c < n; c += FA_DROPOUT_CHUNK) {
        const int w = n - c < FA_DROPOUT_CHUNK ? n - c : FA_DROPOUT_CHUNK;
        fa_dropout_row(d, b, h, i, j0 + c, w, keep);
        if (w & 1) keep[w] = 0; /* an odd n's last word pairs its e with 0 */
        for (int j = 0; j < (w + 1) / 2; j++)
            pp[c / 2 + j] &= (keep[2 * j] ? 0xFFFFu : 0u) | (keep[2 * j + 1] ? 0xFFFF0000u : 0u);
    }
}

#endif /* FA_CPU_DROPOUT_H */
