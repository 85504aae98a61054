/* Dropout's generator and keep rule: the one definition (docs/semantics.md, "Dropout"),
 * used by the CPU forward and backward (which regenerate the same mask) and by the public
 * fa_dropout_keep_mask (dropout.c).
 *
 * Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2,
 * 3", SC 2011): a counter-based generator, so the bits of element (b, h, i, j) are a
 * function of its indices alone and not of the order anything runs in. A call's key is
 * derived once from (seed, offset): the first two words of Philox(seed; counter = (offset
 * low, offset high, 0, 0)), so that each offset selects an independent stream of a seed.
 * Element (b, h, i, j) takes byte j % 16 (little-endian, word (j % 16) / 4) of
 * Philox(key; counter = (j / 16, i, h, b)), each counter word the index mod 2^32, and is
 * kept iff that byte is below T = round(256 (1 - p)): a keep rate of exactly T / 256. One
 * Philox call gives the masks of 16 consecutive keys. */
#ifndef FA_PHILOX_H
#define FA_PHILOX_H

#include <math.h>
#include <stdint.h>

#define FA_PHILOX_M0 0xD2511F53u
#define FA_PHILOX_M1 0xCD9E8D57u
#define FA_PHILOX_W0 0x9E3779B9u /* key increments (Weyl sequence) */
#define FA_PHILOX_W1 0xBB67AE85u

/* Philox 4x32-10 of counter c under key (k0, k1), in place. */
static inline void fa_philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)FA_PHILOX_M0 * c[0], p1 = (uint64_t)FA_PHILOX_M1 * c[2];
        const uint32_t x0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, x1 = (uint32_t)p1;
        const uint32_t x2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1, x3 = (uint32_t)p0;
        c[0] = x0, c[1] = x1, c[2] = x2, c[3] = x3;
        k0 += FA_PHILOX_W0, k1 += FA_PHILOX_W1;
    }
}

/* What the drivers need to regenerate a call's mask. on = 0: no dropout (p = 0). */
typedef struct fa_dropout {
    int on;
    uint32_t k0, k1;    /* the call's key, derived from seed and offset */
    uint32_t threshold; /* keep iff byte < threshold, 0..256 */
    float scale;        /* 1 / (1 - p), in f32 */
} fa_dropout;

/* T = round(256 (1 - p)) for p in [0, 1). */
static inline uint32_t fa_dropout_threshold(float p) { return (uint32_t)floor(256.0 * (1.0 - (double)p) + 0.5); }

static inline fa_dropout fa_dropout_make(float p, uint64_t seed, uint64_t offset) {
    fa_dropout d = {p > 0.0f, 0, 0, fa_dropout_threshold(p), (float)(1.0 / (1.0 - (double)p))};
    uint32_t c[4] = {(uint32_t)offset, (uint32_t)(offset >> 32), 0, 0};
    fa_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    d.k0 = c[0], d.k1 = c[1];
    return d;
}

/* Philox of counters (blk + l, i, h, b), l < FA_PHILOX_LANES, into the bytes of out
 * (16 per lane: the masks' random bytes of keys 16 (blk + l) ..). The lanes are
 * independent, so each round vectorizes across them. */
#define FA_PHILOX_LANES 16
static inline void fa_philox_lanes(uint32_t k0, uint32_t k1, uint64_t blk, uint32_t i, uint32_t h, uint32_t b,
                                   uint8_t out[16 * FA_PHILOX_LANES]) {
    uint32_t c0[FA_PHILOX_LANES], c1[FA_PHILOX_LANES], c2[FA_PHILOX_LANES], c3[FA_PHILOX_LANES];
    for (int l = 0; l < FA_PHILOX_LANES; l++) c0[l] = (uint32_t)(blk + (uint64_t)l), c1[l] = i, c2[l] = h, c3[l] = b;
    for (int r = 0; r < 10; r++) {
        for (int l = 0; l < FA_PHILOX_LANES; l++) {
            const uint64_t p0 = (uint64_t)FA_PHILOX_M0 * c0[l], p1 = (uint64_t)FA_PHILOX_M1 * c2[l];
            const uint32_t x0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, x2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1, c3[l] = (uint32_t)p0, c0[l] = x0, c2[l] = x2;
        }
        k0 += FA_PHILOX_W0, k1 += FA_PHILOX_W1;
    }
    for (int l = 0; l < FA_PHILOX_LANES; l++) {
        const uint32_t w[4] = {c0[l], c1[l], c2[l], c3[l]};
        for (int e = 0; e < 16; e++) out[16 * l + e] = (uint8_t)(w[e >> 2] >> (8 * (e & 3)));
    }
}

/* keep[x] = 1 if element (b, h, i, j0 + x) is kept, else 0, x < n. */
static inline void fa_dropout_row(const fa_dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0, int n,
                                  uint8_t *restrict keep) {
    enum { SPAN = 16 * FA_PHILOX_LANES };
    uint8_t bytes[SPAN];
    const uint32_t t = d->threshold, k0 = d->k0, k1 = d->k1;
    int64_t j = j0;
    while (j < j0 + n) {
        const int64_t blk = j >> 4, first = j - (blk << 4); /* key 16 blk is byte 0 */
        fa_philox_lanes(k0, k1, (uint64_t)blk, (uint32_t)i, (uint32_t)h, (uint32_t)b, bytes);
        const int64_t w = j0 + n - j < SPAN - first ? j0 + n - j : SPAN - first;
        uint8_t *restrict out = keep + (j - j0);
        for (int64_t x = 0; x < w; x++) out[x] = bytes[first + x] < t;
        j += w;
    }
}

#endif /* FA_PHILOX_H */
