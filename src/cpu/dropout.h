/* Dropout in the CPU drivers: the keep mask (philox.h) applied to one row of a tile. The
 * forward zeroes the dropped p (f32, or its bf16 pairs) after the row sum, so that l and
 * lse stay undropped, and scales o by 1 / (1 - p) when it writes it; the backward
 * regenerates the same mask for dP (times 1 / (1 - p)) and P (backward_tile.h). The ISA's
 * dropout_row where it has one (isa.h), else the portable pass below: the same bits. */
#ifndef FA_CPU_DROPOUT_H
#define FA_CPU_DROPOUT_H

#include "isa.h"

#include <string.h>

enum { FA_DROPOUT_CHUNK = 256 }; /* keys per generated piece of a row (even: pairs start on a word) */

static inline fa_dropout fa_plan_dropout(const struct fa_plan *pl) {
    return fa_dropout_make(pl->p.dropout_p, pl->p.dropout_seed, pl->p.dropout_offset);
}

/* Rows i0 .. i0 + m - 1 of (b, h) (b of the plan's batch numbering: the caller adds
 * pl->batch0), keys j0 .. j0 + n - 1, row r at x + r * ldx floats: x[j] = kept ? x[j] * scale
 * : 0 for f32 rows, or with pairs the 16-bit elements of a row's (n + 1) / 2 words (isa.h,
 * exp_pairs) zeroed where dropped. */
static inline void fa_dropout_apply(const fa_isa *isa, const fa_dropout *d, int64_t b, int64_t h, int64_t i0, int m,
                                    int64_t j0, int n, void *x, int ldx, float scale, int pairs) {
    if (isa->dropout_tile) {
        isa->dropout_tile(d, b, h, i0, m, j0, n, x, ldx, scale, pairs);
        return;
    }
    uint8_t keep[FA_DROPOUT_CHUNK + 1];
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c += FA_DROPOUT_CHUNK) {
            const int w = n - c < FA_DROPOUT_CHUNK ? n - c : FA_DROPOUT_CHUNK;
            fa_dropout_row(d, b, h, i0 + r, j0 + c, w, keep);
            if (pairs) {
                uint32_t *pp = (uint32_t *)((float *)x + (int64_t)r * ldx) + c / 2;
                keep[w] = 0; /* an odd n's last word pairs its e with 0 */
                for (int j = 0; j < (w + 1) / 2; j++)
                    pp[j] &= (keep[2 * j] ? 0xFFFFu : 0u) | (keep[2 * j + 1] ? 0xFFFF0000u : 0u);
            } else {
                float *f = (float *)x + (int64_t)r * ldx + c;
                for (int j = 0; j < w; j++) f[j] = keep[j] ? f[j] * scale : 0.0f;
            }
        }
}

#endif /* FA_CPU_DROPOUT_H */
