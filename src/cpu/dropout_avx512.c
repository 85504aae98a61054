/* Dropout's tile pass at AVX-512 width (isa.h, dropout_tile; the portable pass in dropout.h
 * gives the same bits). Philox 4x32-10 (philox.h) runs on 32 counters at once, two
 * independent groups of 16 lanes (one zmm per counter word) so that the rounds' products
 * overlap; a lane is one (row, 16-key block) of the tile, so rows of a few blocks still
 * fill the vectors. Each lane's 16 random bytes are put in key order by a 4 x 4 word
 * transpose and compared with the threshold into 16 keep bits; a row's bits, in lane
 * order, are its keys' bits from the first key's block on, which then zero (and scale)
 * the row with masked moves. */
#include "isa.h"

#include <immintrin.h>
#include <string.h>

/* hi and lo halves of m * a, lane by lane (32 x 32 -> 64 bit products of even and odd lanes). */
static inline __m512i mul_hi_lo(__m512i a, __m512i m, __m512i *lo) {
    const __m512i even = _mm512_mul_epu32(a, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    return _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* Lane l of (c0, c1, c2, c3) holds the 16 bytes of its block: the 4 zmm of those bytes in lane order. */
static inline void to_key_order(__m512i c0, __m512i c1, __m512i c2, __m512i c3, __m512i v[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
    const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i a = _mm512_shuffle_i32x4(u0, u1, 0x44), b = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i c = _mm512_shuffle_i32x4(u0, u1, 0xEE), d = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    v[0] = _mm512_shuffle_i32x4(a, b, 0x88), v[1] = _mm512_shuffle_i32x4(a, b, 0xDD);
    v[2] = _mm512_shuffle_i32x4(c, d, 0x88), v[3] = _mm512_shuffle_i32x4(c, d, 0xDD);
}

/* The keep bits of 32 lanes, counters (blk, row, h, b) (lanes 0-15 from blk0, row0; 16-31
 * from blk1, row1), 16 bits a lane in lane order. */
static void lanes_bits(const fa_dropout *d, __m512i blk0, __m512i row0, __m512i blk1, __m512i row1, uint32_t h,
                       uint32_t b, uint64_t out[8]) {
    __m512i a0 = blk0, a1 = row0, b0 = blk1, b1 = row1, a2 = _mm512_set1_epi32((int)h), b2 = a2;
    __m512i a3 = _mm512_set1_epi32((int)b), b3 = a3;
    const __m512i m0 = _mm512_set1_epi64(FA_PHILOX_M0), m1 = _mm512_set1_epi64(FA_PHILOX_M1);
    uint32_t k0 = d->k0, k1 = d->k1;
    for (int r = 0; r < 10; r++) {
        const __m512i key0 = _mm512_set1_epi32((int)k0), key1 = _mm512_set1_epi32((int)k1);
        __m512i la0, la1, lb0, lb1;
        const __m512i ha0 = mul_hi_lo(a0, m0, &la0), ha1 = mul_hi_lo(a2, m1, &la1);
        const __m512i hb0 = mul_hi_lo(b0, m0, &lb0), hb1 = mul_hi_lo(b2, m1, &lb1);
        a0 = _mm512_ternarylogic_epi32(ha1, a1, key0, 0x96), a2 = _mm512_ternarylogic_epi32(ha0, a3, key1, 0x96);
        b0 = _mm512_ternarylogic_epi32(hb1, b1, key0, 0x96), b2 = _mm512_ternarylogic_epi32(hb0, b3, key1, 0x96);
        a1 = la1, a3 = la0, b1 = lb1, b3 = lb0;
        k0 += FA_PHILOX_W0, k1 += FA_PHILOX_W1;
    }
    if (d->threshold >= 256) {
        for (int q = 0; q < 8; q++) out[q] = ~(uint64_t)0;
        return;
    }
    __m512i v[8];
    to_key_order(a0, a1, a2, a3, v), to_key_order(b0, b1, b2, b3, v + 4);
    const __m512i t = _mm512_set1_epi8((char)d->threshold);
    for (int q = 0; q < 8; q++) out[q] = _mm512_cmplt_epu8_mask(v[q], t);
}

/* 64 bits of the bit string s from bit `at` on (s readable 9 bytes past at / 8). */
static inline uint64_t bits_from(const uint8_t *s, int at) {
    uint64_t lo;
    memcpy(&lo, s + (at >> 3), sizeof lo);
    const int sh = at & 7;
    return sh ? (lo >> sh) | ((uint64_t)s[(at >> 3) + 8] << (64 - sh)) : lo;
}

enum { LANE_CAP = 2048 }; /* lanes (16-key blocks) per pass: rows of more blocks go one at a time */

void fa_dropout_tile_avx512(const fa_dropout *d, int64_t b, int64_t h, int64_t i0, int m, int64_t j0, int n,
                            void *x, int ldx, float scale, int pairs) {
    const int ne = pairs ? (n + 1) & ~1 : n; /* pairs: the 16-bit elements of (n + 1) / 2 words */
    const int first = (int)(j0 & 15), nb = (first + ne + 15) >> 4;
    const int64_t blk0 = j0 >> 4;
    if (nb > LANE_CAP) { /* keys beyond 32768 in one tile: each row in pieces */
        for (int r = 0; r < m; r++)
            for (int c = 0; c < ne; c += 16 * LANE_CAP - 16) {
                const int w = ne - c < 16 * LANE_CAP - 16 ? ne - c : 16 * LANE_CAP - 16;
                char *row = (char *)x + (int64_t)r * ldx * 4 + (int64_t)c * (pairs ? 2 : 4);
                fa_dropout_tile_avx512(d, b, h, i0 + r, 1, j0 + c, w, row, ldx, scale, pairs);
            }
        return;
    }
    const __m512 sc = _mm512_set1_ps(scale);
    uint64_t bits[LANE_CAP / 4 + 16]; /* 16 bits a lane, and room for the last group and bits_from */
    const int rows_per_pass = LANE_CAP / nb;
    for (int r0 = 0; r0 < m; r0 += rows_per_pass) {
        const int rr = m - r0 < rows_per_pass ? m - r0 : rows_per_pass, lanes = rr * nb;
        /* lane l of the pass is block l % nb of row l / nb: 16 lanes at a time, stepped by 16
         * lanes (16 / nb rows and 16 % nb blocks, carrying a block overflow into the row) */
        uint32_t bl[16], rl[16];
        for (int l = 0; l < 16; l++) bl[l] = (uint32_t)(l % nb), rl[l] = (uint32_t)(l / nb);
        __m512i blk = _mm512_loadu_si512(bl), row = _mm512_loadu_si512(rl);
        const __m512i nbv = _mm512_set1_epi32(nb), step_b = _mm512_set1_epi32(16 % nb),
                      step_r = _mm512_set1_epi32(16 / nb), one = _mm512_set1_epi32(1);
        const __m512i base_b = _mm512_set1_epi32((int)(uint32_t)blk0), base_r = _mm512_set1_epi32((int)(uint32_t)(i0 + r0));
        for (int g = 0; g < lanes; g += 32) {
            __m512i lanes_b[2], lanes_r[2];
            for (int half = 0; half < 2; half++) {
                lanes_b[half] = _mm512_add_epi32(blk, base_b), lanes_r[half] = _mm512_add_epi32(row, base_r);
                blk = _mm512_add_epi32(blk, step_b), row = _mm512_add_epi32(row, step_r);
                const __mmask16 over = _mm512_cmpge_epi32_mask(blk, nbv);
                blk = _mm512_mask_sub_epi32(blk, over, blk, nbv), row = _mm512_mask_add_epi32(row, over, row, one);
            }
            lanes_bits(d, lanes_b[0], lanes_r[0], lanes_b[1], lanes_r[1], (uint32_t)h, (uint32_t)b, bits + g / 4);
        }
        for (int r = 0; r < rr; r++) {
            const uint8_t *rb = (const uint8_t *)bits + (int64_t)r * nb * 2; /* 2 bytes a lane */
            if (!pairs && first == 0 && ne == 16 * nb) { /* whole blocks: a lane's bits are 16 keys' */
                float *f = (float *)x + (int64_t)(r0 + r) * ldx;
                for (int e = 0; e < ne; e += 16) {
                    uint16_t k;
                    memcpy(&k, rb + e / 8, sizeof k);
                    _mm512_storeu_ps(f + e, _mm512_maskz_mul_ps(k, _mm512_loadu_ps(f + e), sc));
                }
                continue;
            }
            if (pairs) {
                uint16_t *p = (uint16_t *)((float *)x + (int64_t)(r0 + r) * ldx);
                for (int e = 0; e < ne; e += 32) {
                    const __mmask32 in = ne - e >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (ne - e)) - 1);
                    const __mmask32 keep = (__mmask32)bits_from(rb, first + e) & in;
                    _mm512_mask_storeu_epi16(p + e, in, _mm512_maskz_loadu_epi16(keep, p + e));
                }
            } else {
                float *f = (float *)x + (int64_t)(r0 + r) * ldx;
                for (int e = 0; e < ne; e += 16) {
                    const __mmask16 in = ne - e >= 16 ? 0xFFFF : (__mmask16)((1u << (ne - e)) - 1);
                    const __mmask16 keep = (__mmask16)bits_from(rb, first + e) & in;
                    _mm512_mask_storeu_ps(f + e, in, _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(keep, f + e), sc));
                }
            }
        }
    }
}
