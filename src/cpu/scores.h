/* The CPU score semantics, one definition for the forward and the backward (docs/semantics.md,
 * "The score of a query row and a key"):
 *
 *   s = scale * (q . k)  ->  softcap: cap * tanh(s / cap)  ->  + bias_scale * bias
 *     ->  - slope_h * |i + off - j|  ->  -inf where causal/window, the mask or segment ids hide key j
 *
 * A bias term of -inf hides its key like a mask: the score is -inf even where the product
 * is NaN (docs/nonfinite.md: a hidden key never influences a row). *
 * The passes call it on one row of a tile of raw products at a time. Both compute the
 * same scores from the same products, bit for bit, which is what lets the backward take
 * p = exp(s - lse) with the forward's lse. The softcap's tanh is built from one exp
 * (fa_vexpf), branch-free, so that its loop vectorizes, and the backward gets its
 * derivative, sech^2, from the same exp: 4e / (1 + e)^2 with e = exp(-2|y|) has no
 * cancellation where tanh saturates (1 - tanh^2 would). */
#ifndef FA_CPU_SCORES_H
#define FA_CPU_SCORES_H

#include "../internal.h"
#include "vexp.h"

#include <string.h>

/* Everything the scores of one call need, resolved once. */
typedef struct {
    const struct fa_plan *pl;
    float scale, softcap, bias_scale;
    const float *bias;           /* when has_bias */
    const float *slopes;         /* when has_alibi */
    const int32_t *q_seg, *kv_seg; /* when has_segment_ids */
    fa_sched_mask mask;          /* one (b, h)'s view of the problem's mask, set by fa_score_ctx_at
                                    (only fa_score_plain reads it: unset, rows are never plain) */
} fa_score_ctx;

static inline fa_score_ctx fa_score_ctx_make(const struct fa_plan *pl, const float *bias, const float *slopes,
                                             const int32_t *q_seg, const int32_t *kv_seg) {
    fa_score_ctx c;
    c.pl = pl;
    c.scale = pl->scale;
    c.softcap = pl->p.softcap;
    c.bias_scale = pl->p.has_bias_scale ? pl->p.bias_scale : 1.0f;
    c.bias = bias;
    c.slopes = slopes;
    c.q_seg = q_seg;
    c.kv_seg = kv_seg;
    c.mask = fa_mask_view(NULL, 0, 0);
    return c;
}

/* c for the rows of batch item b, query head h: with the mask's view of them, so that
 * fa_score_plain can tell full blocks (skipping the per-element mask) from partial ones. */
static inline fa_score_ctx fa_score_ctx_at(const fa_score_ctx *c, int64_t b, int64_t h) {
    fa_score_ctx r = *c;
    r.mask = fa_mask_view(c->pl->p.mask, b, h);
    return r;
}

/* -inf at the keys j0 .. j0 + n - 1 that the mask hides from row i: none in a full block,
 * all in an empty one, the bitmap's zeros in a partial one. */
static inline void fa_score_apply_mask(const fa_sched_mask *v, int64_t i, int64_t j0, int n, float *restrict s) {
    for (int64_t kb = j0 / v->bk; kb * v->bk < j0 + n; kb++) {
        const int64_t a = kb * v->bk > j0 ? kb * v->bk : j0, e = (kb + 1) * v->bk < j0 + n ? (kb + 1) * v->bk : j0 + n;
        const int k = fa_sched_mask_block(v, i / v->bq, kb);
        if (k == FA_TILE_FULL) continue;
        const uint8_t *bits = fa_sched_mask_row(v, i, kb);
        for (int64_t j = a; j < e; j++)
            if (!bits || !bits[j - kb * v->bk]) s[j - j0] = -INFINITY;
    }
}

/* 1 when the scores of row i against keys [j0, j0 + n) are the scaled products and
 * nothing else: no softcap, bias, ALiBi or segment ids, and every key visible. The
 * passes then take a fast path (the forward fuses the scaling with its row max). */
static inline int fa_score_plain(const fa_score_ctx *c, int64_t i, int64_t j0, int n) {
    const fa_problem *p = &c->pl->p;
    if (c->softcap > 0.0f || p->has_bias || p->has_alibi || p->has_segment_ids) return 0;
    if (p->mask && !(c->mask.kinds && fa_sched_mask_row_full(&c->mask, i, j0, n))) return 0; /* a partial block */
    return fa_key_lo(c->pl, i) <= j0 && fa_key_hi(c->pl, i) >= j0 + n - 1;
}

/* tanh(y) from e = exp(-2|y|): sign(y) (1 - e) / (1 + e); below |y| = 1/8, where 1 - e
 * would cancel, the odd Taylor polynomial to y^7 (truncation under 2e-9 relative). Within
 * a few ulps of tanhf. It selects with bit masks, so that loops of it vectorize: GCC 12
 * does not if-convert a ?: whose arms hold float arithmetic (under -ftrapping-math). */
static inline float fa_tanh_from(float y, float e) {
    uint32_t ybits, abits, bbits, sbits;
    memcpy(&ybits, &y, sizeof ybits);
    abits = ybits & 0x7fffffffu;
    const float big = (1.0f - e) / (1.0f + e), y2 = y * y;
    const float small = y * (1.0f + y2 * (-1.0f / 3.0f + y2 * (2.0f / 15.0f + y2 * (-17.0f / 315.0f))));
    memcpy(&bbits, &big, sizeof bbits);
    memcpy(&sbits, &small, sizeof sbits);
    const uint32_t below = (uint32_t) - (int32_t)(abits < 0x3e000000u); /* |y| < 1/8: all ones */
    const uint32_t r = (sbits & below) | ((bbits | (ybits & 0x80000000u)) & ~below);
    float out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* Turns the raw products q_i . k_j of query row i (head h of batch b) with keys
 * j = j0 .. j0 + n - 1 (s, in place) into scores. With the softcap on and dcap not NULL,
 * dcap[j] receives d(capped score) / d(scaled product) = sech^2(y), y = s / cap. */
static inline void fa_score_row(const fa_score_ctx *c, int64_t b, int64_t h, int64_t i, int64_t j0, int n,
                                float *restrict s, float *restrict dcap) {
    const struct fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const float scale = c->scale, cap = c->softcap;
    for (int j = 0; j < n; j++) s[j] *= scale;
    if (cap > 0.0f) {
        const float inv_cap = 1.0f / cap;
        if (dcap)
            for (int j = 0; j < n; j++) {
                const float y = s[j] * inv_cap, e = fa_vexpf(-2.0f * fabsf(y)), d = 1.0f + e;
                s[j] = cap * fa_tanh_from(y, e);
                dcap[j] = 4.0f * e / (d * d);
            }
        else
            for (int j = 0; j < n; j++) {
                const float y = s[j] * inv_cap;
                s[j] = cap * fa_tanh_from(y, fa_vexpf(-2.0f * fabsf(y)));
            }
    }
    if (p->has_bias) {
        const fa_strides *bs = &p->bias_stride; /* broadcast dims have stride 0 (plan.c) */
        const float *br = c->bias + b * bs->s[0] + h * bs->s[1] + i * bs->s[2] + j0 * bs->s[3];
        const int64_t st = bs->s[3];
        const float w = c->bias_scale;
        /* a bias term of -inf hides the key, whatever its product (inf or NaN in k) */
        for (int j = 0; j < n; j++) {
            const float t = w * br[j * st];
            s[j] = t == -INFINITY ? t : s[j] + t;
        }
    }
    if (p->has_alibi) {
        const float slope = c->slopes[h];
        const int64_t d0 = i + pl->off - j0; /* |i + off - j| for j = j0 + jj is |d0 - jj| */
        for (int j = 0; j < n; j++) {
            const int64_t d = d0 - j;
            s[j] -= slope * (float)(d < 0 ? -d : d);
        }
    }
    /* causal and window: keys [lo, hi] (relative to j0) are visible */
    const int64_t lo = fa_key_lo(pl, i) - j0, hi = fa_key_hi(pl, i) - j0;
    for (int64_t j = 0; j < n && j < lo; j++) s[j] = -INFINITY;
    for (int64_t j = hi + 1 > 0 ? hi + 1 : 0; j < n; j++) s[j] = -INFINITY;
    if (p->mask) { /* the block-sparse mask (docs/masks.md), ANDed with the masks above */
        const fa_sched_mask v = fa_mask_view(p->mask, b, h);
        fa_score_apply_mask(&v, i, j0, n, s);
    }
    if (p->has_segment_ids) {
        const int32_t qs = c->q_seg[b * p->seq_q + i];
        const int32_t *ks = c->kv_seg + b * p->seq_k + j0;
        for (int j = 0; j < n; j++)
            if (ks[j] != qs) s[j] = -INFINITY;
    }
}

#endif /* FA_CPU_SCORES_H */
