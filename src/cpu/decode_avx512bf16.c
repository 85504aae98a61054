/* Decode tile kernels for bf16 caches with AVX512_BF16: the cache is read straight from its
 * rows (no packing), so a decode step streams each cache byte once at close to memory
 * speed. Compiled with -mavx512bf16; decode.c calls these only when the plan's ISA table
 * is avx512bf16 or amx (both imply the instructions).
 *
 * The unit of work is a block of 4 query rows x 4 keys: its 16 scores come out as one
 * vector (lane 4 r + j: row r, key j), so the softmax of a tile (fa_decode_step_bf16) runs
 * on at most 32 such vectors, with no row-major score matrix and no scalar pass, and p,
 * rounded to bf16 by vcvtneps2bf16, is already laid out as the (p_j, p_j+1) pairs that the
 * p V product broadcasts. Accumulators are named values or fully unrolled arrays: GCC kept
 * a rolled array of them in memory, and those stores bounded the kernel (3.5x slower).
 * Per key and kv head (4 query rows, D = 128) the step issues 32 vdpbf16ps, 16 for the
 * scores and 16 for p V; measured on Zen 4 (128-key tiles, data in L2) it takes about
 * 44 cycles: scores 20, p V 18, the softmax and the call's fixed work the rest.
 *
 * A decode step is bound by memory, and a core does not fetch while it computes, so the
 * step also issues the caller's prefetches of the next tile (fa_decode_prefetch), a few per
 * block of keys: spread through the arithmetic they overlap it; issued in a burst, most
 * would be dropped (a core holds a few dozen misses at once). */
#include "decode_group.h"
#include "decode_kernels.h"

#include "isa_avx512.h"
#include "vexp.h"

#include <immintrin.h>
#include <string.h>

/* Query rows in pairs of 16-dim slices (head_dim is a multiple of 8, at most 256; a last
 * half slice is zero-padded): Q[2 c + h] holds rows 2h and 2h + 1, 128-bit lane g the
 * 8 dims 16 c + 8 (g % 2) .. of row 2h + g / 2, as bf16 pairs. A key row's 16-dim slice
 * broadcast to both 256-bit halves serves both row pairs: two vdpbf16ps per broadcast
 * (a shuffle on Zen 4), which keeps them at one a cycle, and a score needs 4 partial sums
 * reduced, not 16. Measured per key (4 rows, D = 128): 20 cycles; a 128-bit broadcast per
 * vdpbf16ps 23.5; whole-row dot products reduced 16 lanes at a time 25.5. */
#define QK_MAX_SLICES (FA_DECODE_BF16_MAX_D / 16)
static inline __m256i slice16(const uint16_t *x, int c, int d) {
    return _mm256_maskz_loadu_epi16(d - 16 * c >= 16 ? 0xffff : 0xff, x + 16 * c);
}
static void q_slices(const uint16_t *q0, const uint16_t *q1, const uint16_t *q2, const uint16_t *q3, int d,
                     __m512i *Q) {
    for (int c = 0; 16 * c < d; c++) {
        Q[2 * c] = _mm512_inserti64x4(_mm512_castsi256_si512(slice16(q0, c, d)), slice16(q1, c, d), 1);
        Q[2 * c + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(slice16(q2, c, d)), slice16(q3, c, d), 1);
    }
}

/* Lane 4 g + j: the sum of lanes 4 g .. 4 g + 3 of a_j, within each 128-bit lane. */
static inline __m512 pair_sum(__m512 a, __m512 b) { /* per lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
static inline __m512 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512d x = _mm512_castps_pd(pair_sum(a0, a1)), y = _mm512_castps_pd(pair_sum(a2, a3));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

#define KEY_SLICE(k) (__m512bh) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((k) + 16 * c)))
#define KEY_HALF(k) (__m512bh) _mm512_broadcast_i64x4(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)((k) + 16 * c))))
/* Scores of the four rows against 4 keys (k + j * kstride; j >= nj repeat key 0, their
 * lanes ignored): lane 4 r + j. Eight accumulators cover the vdpbf16ps latency; a_j holds
 * rows 0-1 of key j, b_j rows 2-3, each row over two 128-bit lanes (even and odd 8-dim
 * halves of the slices), added at the end. */
static inline __m512 qk_keys4(const __m512i *Q, int d, const uint16_t *k, int64_t kstride, int nj) {
    const uint16_t *k0 = k, *k1 = nj > 1 ? k + kstride : k, *k2 = nj > 2 ? k + 2 * kstride : k;
    const uint16_t *k3 = nj > 3 ? k + 3 * kstride : k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
#define QK_STEP(LOAD)                                                                                                  \
    do {                                                                                                               \
        const __m512bh ya = (__m512bh)Q[2 * c], yb = (__m512bh)Q[2 * c + 1];                                           \
        __m512bh x = LOAD(k0);                                                                                         \
        a0 = _mm512_dpbf16_ps(a0, ya, x), b0 = _mm512_dpbf16_ps(b0, yb, x);                                            \
        x = LOAD(k1);                                                                                                  \
        a1 = _mm512_dpbf16_ps(a1, ya, x), b1 = _mm512_dpbf16_ps(b1, yb, x);                                            \
        x = LOAD(k2);                                                                                                  \
        a2 = _mm512_dpbf16_ps(a2, ya, x), b2 = _mm512_dpbf16_ps(b2, yb, x);                                            \
        x = LOAD(k3);                                                                                                  \
        a3 = _mm512_dpbf16_ps(a3, ya, x), b3 = _mm512_dpbf16_ps(b3, yb, x);                                            \
    } while (0)
    int c = 0;
    for (; 16 * c + 16 <= d; c++) QK_STEP(KEY_SLICE);
    if (16 * c < d) QK_STEP(KEY_HALF); /* 8 dims left: the upper ones zero in Q */
    /* lane 4 g + j of A: rows 0-1 (g / 2), dims half g % 2; of B: rows 2-3 */
    const __m512 A = sum4(a0, a1, a2, a3), B = sum4(b0, b1, b2, b3);
    return _mm512_add_ps(_mm512_shuffle_f32x4(A, B, 0x88), _mm512_shuffle_f32x4(A, B, 0xdd));
}

/* Prefetches per block of 4 keys in the scores, and per key pair and 64 columns in p V:
 * with D = 128 about one line per 15 cycles, 1536 of a 64-key tile's 4096 lines (Hk = 8)
 * while its 8 heads compute. Measured on Zen 4 (bench/inference.sh's shape, 2 threads,
 * medians of 4 rounds, caches on 2 MiB pages): none 30.3 GB/s, these 34.0-34.5, 2 and 2
 * 34.7, 5 and 2 34.9, 6 and 3 30.9, 8 and 4 29.1. More than a core's few dozen misses in
 * flight are dropped, or wait inside the arithmetic and crowd the tile's own loads. The
 * ISA table scales them (isa.h prefetch_x): the amx table's cores read faster with 8 and 4. */
#define PF_QK 4
#define PF_PV 2

/* Scores of rows r0..r0+3 (mr of them present) against the key blocks of a tile: S[b]
 * lane 4 r + j = q_{r0+r} . k_{4b+j}. */
static int qk_rows4(const uint16_t *q, int r0, int mr, int d, const uint16_t *k, int64_t kstride, int n, __m512 *S,
                    fa_decode_prefetch *pf) {
    const uint16_t *q0 = q + (int64_t)r0 * d, *q1 = mr > 1 ? q0 + d : q0, *q2 = mr > 2 ? q0 + 2 * d : q0;
    const uint16_t *q3 = mr > 3 ? q0 + 3 * d : q0;
    __m512i Q[2 * QK_MAX_SLICES];
    q_slices(q0, q1, q2, q3, d, Q);
    const int nb = (n + 3) / 4;
    for (int b = 0; b < nb; b++) {
        S[b] = qk_keys4(Q, d, k + 4 * b * kstride, kstride, n - 4 * b < 4 ? n - 4 * b : 4);
        fa_decode_prefetch_scaled(pf, PF_QK);
    }
    return nb;
}

/* s[r * lds + j] = dot(q[r], k[j]) for r < m, j < n: q is m x d contiguous bf16, key j
 * starts at k + j * kstride (d contiguous bf16). */
void fa_decode_qk_bf16(const uint16_t *q, int m, int d, const uint16_t *k, int64_t kstride, int n, float *s,
                       int lds) {
    for (int r0 = 0; r0 < m; r0 += 4) {
        const int mr = m - r0 < 4 ? m - r0 : 4;
        __m512 S[FA_DECODE_MAX_TILE / 4];
        const int nb = qk_rows4(q, r0, mr, d, k, kstride, n, S, NULL);
        for (int b = 0; b < nb; b++) {
            float out[16];
            _mm512_storeu_ps(out, S[b]);
            for (int r = 0; r < mr; r++)
                for (int j = 0; j < 4 && 4 * b + j < n; j++) s[(int64_t)(r0 + r) * lds + 4 * b + j] = out[4 * r + j];
        }
    }
}

/* o[r * ldo + c] = alpha[r] o[r * ldo + c] + sum_j p_r,j v[j][c] for r < mr, c < cols
 * (alpha NULL: 1): value j starts at v + j * vstride. P holds p as bf16 pairs, word
 * (j / 4) * 8 + 2 r + (j / 2) % 2 = (p_r,j, p_r,j+1) for even j; missing keys are 0. Keys
 * go in pairs through vdpbf16ps: rows j and j+1 interleaved by unpacklo/hi_epi16 against
 * the broadcast pair, which leaves the columns of each 32 in a lane-interleaved order (lo:
 * 0-3, 8-11, 16-19, 24-27; hi: 4-7, 12-15, ...); the accumulators are loaded into that
 * order and stored back out of it. Blocks of 64 columns (16 accumulators). Value rows at
 * or past n are never read. */
/* One pair of keys (value rows a, b as two 32-column halves each) into the 4 x 64
 * accumulators of pv_rows4: the rows interleaved by unpacklo/hi_epi16, each row's broadcast
 * probability pair pw[2 r] through vdpbf16ps. */
static inline __attribute__((always_inline)) void pv_pair(__m512 acc[4][4], const uint32_t *pw, __m512i a0,
                                                          __m512i b0, __m512i a1, __m512i b1) {
    const __m512bh x[4] = {(__m512bh)_mm512_unpacklo_epi16(a0, b0), (__m512bh)_mm512_unpackhi_epi16(a0, b0),
                           (__m512bh)_mm512_unpacklo_epi16(a1, b1), (__m512bh)_mm512_unpackhi_epi16(a1, b1)};
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[2 * r]);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], w, x[q]);
    }
}

static void pv_rows4(const uint32_t *P, int mr, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                     int ldo, const float *alpha, fa_decode_prefetch *pf) {
    static const uint16_t zero_row[64];
    const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i to_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i back0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i back1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const int np = (n + 1) / 2;
    for (int c0 = 0; c0 < cols; c0 += 64) {
        __m512 acc[4][4]; /* [row][lo 0-31, hi 0-31, lo 32-63, hi 32-63]: fully unrolled, in registers */
        __mmask32 mk[2];
        for (int h = 0; h < 2; h++) mk[h] = fa_mask32(cols - c0 - 32 * h);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __mmask16 live = r < mr ? 0xffff : 0;
            const float *orow = o + (int64_t)(r < mr ? r : 0) * ldo + c0;
            const __m512 scale = _mm512_set1_ps(alpha && r < mr ? alpha[r] : 1.0f);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512 a = _mm512_maskz_loadu_ps(live & (__mmask16)mk[h], orow + 32 * h);
                const __m512 b = _mm512_maskz_loadu_ps(live & (__mmask16)(mk[h] >> 16), orow + 32 * h + 16);
                acc[r][2 * h] = _mm512_mul_ps(scale, _mm512_permutex2var_ps(a, to_lo, b));
                acc[r][2 * h + 1] = _mm512_mul_ps(scale, _mm512_permutex2var_ps(a, to_hi, b));
            }
        }
        int jp = 0;
        if (cols - c0 >= 64) /* whole pairs of whole 64-column blocks: plain loads, no masks to move */
            for (; 2 * jp + 1 < n; jp++) {
                const uint16_t *va = v + 2 * jp * vstride + c0, *vb = va + vstride;
                pv_pair(acc, P + (jp / 2) * 8 + (jp & 1), _mm512_loadu_si512(va), _mm512_loadu_si512(vb),
                        _mm512_loadu_si512(va + 32), _mm512_loadu_si512(vb + 32));
                fa_decode_prefetch_scaled(pf, PF_PV);
            }
        for (; jp < np; jp++) { /* the rest: a last lone key, or a last block under 64 columns */
            const uint16_t *va = v + 2 * jp * vstride + c0;
            const uint16_t *vb = 2 * jp + 1 < n ? va + vstride : zero_row;
            const __mmask32 bm = 2 * jp + 1 < n ? ~0u : 0u;
            pv_pair(acc, P + (jp / 2) * 8 + (jp & 1), _mm512_maskz_loadu_epi16(mk[0], va),
                    _mm512_maskz_loadu_epi16(mk[0] & bm, vb), _mm512_maskz_loadu_epi16(mk[1], va + 32),
                    _mm512_maskz_loadu_epi16(mk[1] & bm, vb + (bm ? 32 : 0)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __mmask16 live = r < mr ? 0xffff : 0;
            float *orow = o + (int64_t)(r < mr ? r : 0) * ldo + c0;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                _mm512_mask_storeu_ps(orow + 32 * h, live & (__mmask16)mk[h],
                                      _mm512_permutex2var_ps(acc[r][2 * h], back0, acc[r][2 * h + 1]));
                _mm512_mask_storeu_ps(orow + 32 * h + 16, live & (__mmask16)(mk[h] >> 16),
                                      _mm512_permutex2var_ps(acc[r][2 * h], back1, acc[r][2 * h + 1]));
            }
        }
    }
}

/* p holds values already rounded to bf16 (docs/semantics.md, "Rounding"), so their bf16
 * bits are exact. */
void fa_decode_pv_bf16(const float *p, int ldp, int m, const uint16_t *v, int64_t vstride, int n, int cols, float *o,
                       int ldo) {
    for (int r0 = 0; r0 < m; r0 += 4) {
        const int mr = m - r0 < 4 ? m - r0 : 4;
        uint32_t P[FA_DECODE_MAX_TILE * 2]; /* blocks of 4 keys x 8 words */
        memset(P, 0, sizeof P);
        for (int r = 0; r < mr; r++) {
            const float *pr = p + (int64_t)(r0 + r) * ldp;
            for (int j = 0; j < n; j += 2) {
                uint32_t lo, hi = 0;
                memcpy(&lo, &pr[j], 4);
                if (j + 1 < n) memcpy(&hi, &pr[j + 1], 4);
                P[(j / 4) * 8 + 2 * r + (j / 2) % 2] = (lo >> 16) | (hi & 0xffff0000u);
            }
        }
        pv_rows4(P, mr, v, vstride, n, cols, o + (int64_t)r0 * ldo, ldo, NULL, NULL);
    }
}

/* The online-softmax step of dec_row (decode.c) for 4 rows at once: scaled scores, the
 * row max (a NaN never wins), base = the new max (0 while it is -inf, never -inf + inf),
 * alpha = exp(old max - base) for the rescale, p = exp(score - base) summed unrounded
 * and rounded to bf16 into P, keys at or past n giving p = 0. */
void fa_decode_step_bf16(const fa_decode_step *t) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(t->scale);
    static const __mmask16 keys_live[4] = {0xffff, 0x1111, 0x3333, 0x7777}; /* by n % 4 */
    for (int r0 = 0; r0 < t->m; r0 += 4) {
        const int mr = t->m - r0 < 4 ? t->m - r0 : 4;
        __m512 S[FA_DECODE_MAX_TILE / 4];
        const int nb = qk_rows4(t->q, r0, mr, t->d, t->k, t->kstride, t->n, S, t->pf);
        __m512 top = neg_inf;
        for (int b = 0; b < nb; b++) {
            S[b] = _mm512_mul_ps(S[b], scale);
            if (b == nb - 1) S[b] = _mm512_mask_blend_ps(keys_live[t->n % 4], neg_inf, S[b]);
            top = _mm512_max_ps(S[b], top); /* the second operand when either is NaN */
        }
        float alpha[4];
        const __m512 vbase = fa_group_bases(top, t->mx + r0, mr, alpha);
        __m512 total = _mm512_setzero_ps();
        uint32_t P[FA_DECODE_MAX_TILE * 2];
        for (int b = 0; b < nb; b++) {
            const __m512 e = fa_avx512_exp_nonpos(_mm512_sub_ps(S[b], vbase)); /* <= 0 or NaN */
            total = _mm512_add_ps(total, e);
            _mm256_storeu_si256((__m256i *)(P + 8 * b), (__m256i)_mm512_cvtneps_pbh(e));
        }
        fa_group_sums(total, alpha, mr, t->sum + r0);
        pv_rows4(P, mr, t->v, t->vstride, t->n, t->dv, t->acc + (int64_t)r0 * t->ldacc, t->ldacc, alpha, t->pf);
    }
}
