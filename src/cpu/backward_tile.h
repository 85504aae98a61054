/* The work both CPU backward schedules (backward.c: two passes; backward_fused.c: one pass)
 * do on one tile pair, query rows [r0, r0 + m) of head h against keys [c0, c0 + n):
 *
 *   s (scores.h, the forward's bits), p = exp(s - lse), dP = dO V^T, dS = p (dP - delta)
 *   (times sech^2 under softcap): fa_bwd_tile;
 *   dV += P^T dO and dK += dS^T Q: fa_bwd_dkdv;   dQ += dS K: fa_bwd_dq;
 *
 * with delta = rowsum(dO * o) (fa_bwd_delta_row), the packing and the stores. Which pairs
 * are computed is schedule.h's: the key tiles of a query tile (fa_key_tile_range) and the
 * query tiles of a key tile (fa_sched_query_tiles). The schedules differ only in the order
 * they walk the pairs in and where the sums live; each sum runs over the same tile shapes
 * through the same calls here, which is why both give the same bits (docs/semantics.md:
 * the backward's order of sums). p comes from the ISA's exp_sum, the exp the forward uses;
 * p and dS are rounded to the problem's dtype before they enter a product (the
 * microkernels' contract, isa.h). Everything is static inline: each schedule's file
 * compiles the loops with its own flags. */
#ifndef FA_CPU_BACKWARD_TILE_H
#define FA_CPU_BACKWARD_TILE_H

#include "../internal.h"
#include "dropout.h"
#include "guard.h"
#include "isa.h"
#include "scores.h"
#include "vexp.h"

#include <string.h>

#define FA_BWD_ALIGN 64

/* What one call's tile pairs need, resolved once. */
typedef struct {
    const fa_plan *pl;
    const fa_backward_args *a;
    const float *delta; /* [B, Hq, Sq] */
    size_t esz;         /* bytes per element of q, k, v, ... */
    fa_score_ctx sc;    /* what turns products into scores */
    fa_dropout drop;    /* dropout's keep mask, regenerated (dropout.h) */
} fa_bwd_ctx;

/* One thread's buffers for the key side and the tile pair, bq x bk at most. */
typedef struct {
    void *kt, *vt;   /* K, V tile packed as B^T (S = Q K^T, dP = dO V^T) */
    void *kb;        /* K tile packed as B (dQ += dS K) */
    float *s, *dp;   /* bq x bk, rows bk apart: scores, then p; dP, then dS */
    float *th;       /* bq x bk: the softcap's derivative, sech^2 */
    float *tr;       /* bk x bq: P^T or dS^T */
} fa_bwd_tile_buf;

static inline int64_t fa_bwd_round_up(int64_t x) { return (x + FA_BWD_ALIGN - 1) / FA_BWD_ALIGN * FA_BWD_ALIGN; }

/* Puts a piece of the given bytes at base + off (only measures, when base is NULL);
 * returns the offset of the next piece. */
static inline int64_t fa_bwd_lay(char *base, int64_t off, void *slot, int64_t bytes) {
    if (base) *(void **)slot = base + off;
    return off + fa_bwd_round_up(bytes);
}

/* Lays out t from base + off (see fa_bwd_lay); returns the next offset. */
static inline int64_t fa_bwd_lay_tile(const fa_plan *pl, char *base, int64_t off, fa_bwd_tile_buf *t) {
    const fa_isa *isa = pl->isa;
    const fa_dtype dt = pl->p.dtype;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, D = pl->p.head_dim, Dv = pl->p.head_dim_v;
    off = fa_bwd_lay(base, off, &t->kt, isa->packed_bytes(bk, D, dt));
    off = fa_bwd_lay(base, off, &t->vt, isa->packed_bytes(bk, Dv, dt));
    off = fa_bwd_lay(base, off, &t->kb, isa->packed_bytes(bk, D, dt));
    off = fa_bwd_lay(base, off, &t->s, 4 * bq * bk);
    off = fa_bwd_lay(base, off, &t->dp, 4 * bq * bk);
    off = fa_bwd_lay(base, off, &t->th, 4 * bq * bk);
    return fa_bwd_lay(base, off, &t->tr, 4 * bq * bk);
}

/* A block of a [B, H, S, W] tensor starting at [b, h, r0, 0]. */
static inline fa_tile_src fa_bwd_src(const fa_bwd_ctx *c, const void *base, const fa_strides *st, int64_t b,
                                     int64_t h, int64_t r0) {
    fa_tile_src s;
    s.base = (const char *)base + (size_t)fa_offset(st, b, h, r0, 0) * c->esz;
    s.dtype = c->pl->p.dtype;
    s.row_stride = st->s[2];
    s.col_stride = st->s[3];
    return s;
}

/* Row `row` of the dbias slice that (b, h) adds to (a broadcast bias: one slice for all b or
 * all h; with bias_seq_q 1, row 0 for every query row), at key 0; NULL without dbias. */
static inline float *fa_bwd_dbias_row(const fa_bwd_ctx *c, int64_t b, int64_t h, int64_t row) {
    const fa_problem *p = &c->pl->p;
    if (!p->bias_grad) return NULL;
    const int64_t bb = p->bias_batch == 1 ? 0 : b, bh = p->bias_heads == 1 ? 0 : h;
    const int64_t br = p->bias_seq_q == 1 ? 0 : row;
    return c->a->dbias + ((bb * p->bias_heads + bh) * p->bias_seq_q + br) * p->seq_k;
}

/* The distance between the dbias rows of consecutive query rows: 0 where one row is shared. */
static inline int64_t fa_bwd_dbias_ld(const fa_plan *pl) { return pl->p.bias_seq_q == 1 ? 0 : pl->p.seq_k; }

/* The rows in query tile r0 (bq of them, fewer in the last), the keys in key tile c0. */
static inline int fa_bwd_rows(const fa_plan *pl, int64_t r0) {
    return (int)(pl->p.seq_q - r0 < pl->bwd_bq ? pl->p.seq_q - r0 : pl->bwd_bq);
}
static inline int fa_bwd_keys(const fa_plan *pl, int64_t c0) {
    return (int)(pl->p.seq_k - c0 < pl->bwd_bk ? pl->p.seq_k - c0 : pl->bwd_bk);
}

/* K and V of keys [c0, c0 + n) of (b, kv head hk) packed as B^T into t (for S and dP);
 * returns K's source. */
static inline fa_tile_src fa_bwd_pack_keys(const fa_bwd_ctx *c, const fa_bwd_tile_buf *t, int64_t b, int64_t hk,
                                           int64_t c0, int n) {
    const fa_problem *p = &c->pl->p;
    const fa_tile_src ks = fa_bwd_src(c, c->a->k, &p->k_stride, b, hk, c0);
    const fa_tile_src vs = fa_bwd_src(c, c->a->v, &p->v_stride, b, hk, c0);
    c->pl->isa->pack_bt(&ks, n, (int)p->head_dim, t->kt);
    c->pl->isa->pack_bt(&vs, n, (int)p->head_dim_v, t->vt);
    return ks;
}

/* Q and dO of rows [r0, r0 + m) of (b, head h): their sources in qs, gs, packed as A into
 * qa, ga (for S and dP) when those are not NULL. */
static inline void fa_bwd_pack_rows(const fa_bwd_ctx *c, int64_t b, int64_t h, int64_t r0, int m, fa_tile_src *qs,
                                    fa_tile_src *gs, void *qa, void *ga) {
    const fa_problem *p = &c->pl->p;
    *qs = fa_bwd_src(c, c->a->q, &p->q_stride, b, h, r0);
    *gs = fa_bwd_src(c, c->a->d_o, &p->o_stride, b, h, r0);
    if (qa) c->pl->isa->pack_a(qs, m, (int)p->head_dim, qa);
    if (ga) c->pl->isa->pack_a(gs, m, (int)p->head_dim_v, ga);
}

/* tr[j*m + i] = x[i*ld + j]: the ISA's pass where it has one, else in 16 x 16 blocks (row
 * by row, every store of a row would touch its own cache line of tr, m floats apart, and
 * the tile does not stay in L1). */
static inline void fa_bwd_transpose(const fa_isa *isa, const float *restrict x, int ld, int m, int n,
                                    float *restrict tr) {
    enum { T = 16 };
    if (isa->transpose) {
        isa->transpose(x, ld, m, n, tr);
        return;
    }
    for (int i0 = 0; i0 < m; i0 += T)
        for (int j0 = 0; j0 < n; j0 += T) {
            const int i1 = i0 + T < m ? i0 + T : m, j1 = j0 + T < n ? j0 + T : n;
            for (int j = j0; j < j1; j++)
                for (int i = i0; i < i1; i++) tr[(int64_t)j * m + i] = x[(int64_t)i * ld + j];
        }
}

/* What dV's store multiplies by: 1 / (1 - p) under dropout, else 1. */
static inline float fa_bwd_dv_scale(const fa_bwd_ctx *c) { return c->drop.on ? c->drop.scale : 1.0f; }

/* The tile pair, with Q and dO packed as A (qa, ga) and K and V packed as B^T in w: leaves
 * dS = p (dP - delta) (softcap: times sech^2), rounded to the dtype, in w->dp, and with
 * want_p, p = exp(s - lse) rounded to the dtype in w->s (0 where masked or where the row
 * sees no key). With dbias (row i of the pair at dbias + i * ld_dbias), adds bias_scale
 * times the gradient of the final score, p (dP - delta) in f32, to it. Counts S, dP and
 * the transcendentals (internal.h, COUNTING RULES). */
static inline void fa_bwd_tile(const fa_bwd_ctx *c, const fa_bwd_tile_buf *w, int64_t b, int64_t h,
                               int64_t r0, int m, int64_t c0, int n, const void *qa, const void *ga,
                               int want_p, float *dbias, int64_t ld_dbias, fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const int ld = (int)pl->bwd_bk;
    const int cap = p->softcap > 0.0f;
    const float bias_scale = c->sc.bias_scale;
    const fa_score_ctx sc = fa_score_ctx_at(&c->sc, b, h); /* with (b, h)'s view of the mask */

    /* where no key can be hidden, p = 0 only by underflow: no guard needed (guard.h) */
    const int hide = fa_tile_may_hide(pl, r0, r0 + m, c0, n);

    pl->isa->gemm_abt(m, n, (int)p->head_dim, qa, w->kt, w->s, ld);
    pl->isa->gemm_abt(m, n, (int)p->head_dim_v, ga, w->vt, w->dp, ld);
    /* dropout: dP z / (1 - p), z the forward's keep mask (0 where dropped, even where dP is inf
     * or NaN), so that dS = p (z dP / (1 - p) - delta) below; P is zeroed where dropped after
     * the loop, before dV += P^T dO, whose 1 / (1 - p) the store applies (fa_bwd_dv_scale) */
    if (c->drop.on) fa_dropout_apply(pl->isa, &c->drop, pl->batch0 + b, h, r0, m, c0, n, w->dp, ld, c->drop.scale, 0);

    for (int i = 0; i < m; i++) {
        const int64_t row = r0 + i;
        float *restrict s = w->s + (int64_t)i * ld, *restrict dp = w->dp + (int64_t)i * ld;
        const float *restrict th = w->th + (int64_t)i * ld;
        if (fa_score_plain(&sc, row, c0, n))
            for (int j = 0; j < n; j++) s[j] *= sc.scale;
        else
            fa_score_row(&sc, b, h, row, c0, n, s, w->th + (int64_t)i * ld);
        const int64_t r = (b * p->heads_q + h) * p->seq_q + row;
        const float lse = c->a->lse[fa_lse_index(pl, b, h, row)], delta = c->delta[r];
        if (lse == -INFINITY) { /* the row sees no key */
            memset(s, 0, sizeof(float) * (size_t)n);
        } else if (lse != lse) { /* a NaN row (docs/nonfinite.md): NaN where visible, 0 where hidden */
            for (int j = 0; j < n; j++) s[j] = s[j] == -INFINITY ? 0.0f : NAN;
        } else {
            pl->isa->exp_sum(s, n, lse);
        }
        /* dS = 0 where p = 0, even where dP is inf or NaN (v at a hidden key) */
        if (hide)
            for (int j = 0; j < n; j++) {
                const float ds = s[j] * (dp[j] - delta);
                dp[j] = s[j] == 0.0f ? 0.0f : ds;
            }
        else
            for (int j = 0; j < n; j++) dp[j] = s[j] * (dp[j] - delta);
        if (dbias) {
            float *db = dbias + (int64_t)i * ld_dbias;
            for (int j = 0; j < n; j++) db[j] += bias_scale * dp[j];
        }
        if (cap && hide) /* (a hidden key's sech^2 may be NaN: keep its dS 0) */
            for (int j = 0; j < n; j++) {
                const float t = dp[j] * th[j];
                dp[j] = dp[j] == 0.0f ? 0.0f : t;
            }
        else if (cap)
            for (int j = 0; j < n; j++) dp[j] *= th[j];
        fa_round_row(pl->isa, p->dtype, dp, n);
        if (want_p) fa_round_row(pl->isa, p->dtype, s, n);
    }
    if (want_p && c->drop.on) fa_dropout_apply(pl->isa, &c->drop, pl->batch0 + b, h, r0, m, c0, n, w->s, ld, 1.0f, 0);
    cnt->flops += 2 * (p->head_dim + p->head_dim_v) * m * n;
    cnt->transcendentals += (cap ? 2 : 1) * (int64_t)m * n;
}

/* o += x B through the ISA's product, with B packed in buf; where bad (src, B's rows,
 * holds inf or NaN in a pair that can hide keys), the guarded product instead (guard.h),
 * which takes buf as scratch: with keep, buf is packed again for the caller's next use. */
static inline void fa_bwd_product(const fa_isa *isa, int m, int n, int cols, const float *x, int ldx,
                                  const fa_tile_src *src, void *buf, float *o, int ldo, int bad, int keep) {
    if (!bad) {
        isa->gemm_pb(m, n, cols, x, ldx, buf, o, ldo);
        return;
    }
    fa_gemm_pb_guarded(isa, m, n, cols, x, ldx, src, buf, o, ldo);
    if (keep) isa->pack_b(src, n, cols, buf);
}

/* After fa_bwd_tile with want_p: dV += P^T dO and dK += dS^T Q (dv, dk: n rows, Dv and D
 * wide), with Q and dO of the pair at qs, gs, packed as B in qb, gb (fa_bwd_product's
 * bad and keep: q_bad, g_bad, keep). Counts both products. */
static inline void fa_bwd_dkdv(const fa_bwd_ctx *c, const fa_bwd_tile_buf *w, int m, int n,
                               const fa_tile_src *qs, void *qb, int q_bad, const fa_tile_src *gs, void *gb,
                               int g_bad, int keep, float *dk, float *dv, fa_counts *cnt) {
    const fa_isa *isa = c->pl->isa;
    const int ld = (int)c->pl->bwd_bk, D = (int)c->pl->p.head_dim, Dv = (int)c->pl->p.head_dim_v;
    fa_bwd_transpose(isa, w->s, ld, m, n, w->tr);
    fa_bwd_product(isa, n, m, Dv, w->tr, m, gs, gb, dv, Dv, g_bad, keep);
    fa_bwd_transpose(isa, w->dp, ld, m, n, w->tr);
    fa_bwd_product(isa, n, m, D, w->tr, m, qs, qb, dk, D, q_bad, keep);
    cnt->flops += 2 * ((int64_t)D + Dv) * m * n;
}

/* After fa_bwd_tile: dQ += dS K (dq: m rows, D wide), K of the pair at ks, packed as B in
 * w->kb (fa_bwd_product's bad and keep: k_bad, keep). Counts the product. */
static inline void fa_bwd_dq(const fa_bwd_ctx *c, const fa_bwd_tile_buf *w, int m, int n,
                             const fa_tile_src *ks, int k_bad, int keep, float *dq, fa_counts *cnt) {
    const int D = (int)c->pl->p.head_dim;
    fa_bwd_product(c->pl->isa, m, n, D, w->dp, (int)c->pl->bwd_bk, ks, w->kb, dq, D, k_bad, keep);
    cnt->flops += 2 * (int64_t)D * m * n;
}

/* Writes rows x cols of acc (times mul) into a [B, H, S, W] tensor at [b, h, r0, 0]. bf16
 * goes through fa_vround_bf16, whose top half is fa_f32_to_bf16's result, so that the
 * loop vectorizes; the other dtypes through fa_store. */
static inline void fa_bwd_store(const fa_bwd_ctx *c, void *dst, const fa_strides *st, int64_t b, int64_t h,
                                int64_t r0, int64_t rows, int cols, const float *acc, float mul) {
    const fa_dtype t = c->pl->p.dtype;
    const int64_t cs = st->s[3];
    for (int64_t i = 0; i < rows; i++) {
        const int64_t at = fa_offset(st, b, h, r0 + i, 0);
        const float *src = acc + i * cols;
        if (t == FA_BF16 && cs == 1 && c->pl->isa->store_bf16) { /* the same bits, at the ISA's width */
            c->pl->isa->store_bf16((uint16_t *)dst + at, src, mul, cols);
        } else if (t == FA_BF16) {
            uint16_t *out = (uint16_t *)dst + at;
            for (int x = 0; x < cols; x++) {
                const float y = fa_vround_bf16(mul * src[x]);
                uint32_t bits;
                memcpy(&bits, &y, sizeof bits);
                out[x * cs] = (uint16_t)(bits >> 16);
            }
        } else if (t == FA_F32) {
            float *out = (float *)dst + at;
            for (int x = 0; x < cols; x++) out[x * cs] = mul * src[x];
        } else {
            for (int x = 0; x < cols; x++) fa_store(t, dst, at + x * cs, mul * src[x]);
        }
    }
}

#endif /* FA_CPU_BACKWARD_TILE_H */
