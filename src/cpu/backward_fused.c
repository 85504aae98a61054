/* The CPU backward in one pass: FlashAttention-2's five products per tile pair, with dQ
 * accumulated in a fixed order, so results stay bit-identical across thread counts.
 *
 *   (0) delta_i = rowsum(dO_i * o_i), f32, for every (b, hq, i), into the workspace.
 *   (1) One work item per (b, kv head), run by one thread from start to end, with f32
 *       dK, dV accumulators for all its keys. For each query head of the GQA group
 *       (ascending): Q and dO are packed once, for all query tiles, and the head's f32 dQ
 *       buffer zeroed; then for each key tile (ascending), K and V are packed, and for each
 *       query tile that visits it (ascending): s (scores.h), p = exp(s - lse),
 *       dP = dO V^T, dS = p (dP - delta) (times sech^2 under softcap), and
 *         dV += P^T dO,   dK += dS^T Q,   dQ += dS K.
 *       dQ (scaled) is written when the head ends, dK (scaled) and dV when the item ends.
 *       dbias, where asked, is zeroed by the item and summed in the same walk.
 *
 * Every output element belongs to one item and every sum runs in the walk's fixed order,
 * whatever the thread count. The order is also the two-pass schedule's (backward.c): dK, dV
 * over (head, query tile) ascending, dQ over key tiles ascending, through the same
 * microkernel calls on the same tile shapes, so both schedules give the same bits.
 *
 * Against the two-pass schedule, it saves the recomputation of S, dP and p in the dQ pass
 * (3 of 8 products; 10 x m x n x D flops per pair instead of 14) and one exp per score,
 * and packs Q and dO once per head instead of once per tile pair, at the price of a
 * thread scratch that grows with Sq and Sk (the packed head, dQ, dK and dV: about
 * 4 (2 Sq (D + Dv) + Sq D + Sk (D + Dv)) bytes) and fewer work items (B x Hk). The plan
 * takes it when the shapes make that worthwhile
 * (fa_cpu_backward_fused_fits); FA_BWD_SCHEDULE=fused|two-pass forces either. */
#include "backward_delta.h"
#include "guard.h"
#include "isa.h"
#include "progress.h"
#include "scores.h"
#include "vexp.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define FUSED_ALIGN 64
/* Below this many (b, kv head) items, the two-pass schedule's finer items keep more
 * threads busy. A shape-only rule: the schedule never depends on the thread count. */
#define FUSED_MIN_ITEMS 8
/* Above this, a thread's scratch (which grows with Sq and Sk) costs more memory than the
 * recomputation it saves is worth; the two-pass schedule's is a few tiles. */
#define FUSED_MAX_SCRATCH ((int64_t)64 << 20)

typedef struct {
    void *qa, *ga;   /* every query tile of the head's Q, dO packed as A (S = Q K^T, dP = dO V^T) */
    void *qb, *gb;   /* ... and as B (dK += dS^T Q, dV += P^T dO); tile qt at qt x the stride */
    int64_t sa_q, sa_g, sb_q, sb_g; /* bytes from one packed query tile to the next */
    void *kt, *vt;   /* K, V tile packed as B^T (S, dP) */
    void *kb;        /* K tile packed as B (dQ += dS K) */
    float *s, *dp;   /* bq x bk: scores, then p; dP, then dS */
    float *th;       /* bq x bk: the softcap's derivative, sech^2 */
    float *tr;       /* bk x bq: P^T or dS^T */
    float *dk, *dv;  /* Sk x D, Sk x Dv: the item's accumulators */
    float *dq;       /* Sq x D: the head's dQ accumulators */
} fused_scratch;

typedef struct {
    const fa_plan *pl;
    const fa_backward_args *a;
    const float *delta; /* [B, Hq, Sq] */
    size_t esz;
    fa_score_ctx sc;
} fused_ctx;

static int64_t fused_round_up(int64_t x) { return (x + FUSED_ALIGN - 1) / FUSED_ALIGN * FUSED_ALIGN; }

/* Lays the pieces out from base (or only measures, when base is NULL); returns the bytes. */
static int64_t fused_carve(const fa_plan *pl, char *base, fused_scratch *w) {
    const fa_isa *isa = pl->isa;
    const fa_dtype t = pl->p.dtype;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, D = pl->p.head_dim, Dv = pl->p.head_dim_v;
    const int64_t Sq = pl->p.seq_q, Sk = pl->p.seq_k, nq = (Sq + bq - 1) / bq;
    w->sa_q = fused_round_up(isa->packed_bytes(bq, D, t));
    w->sa_g = fused_round_up(isa->packed_bytes(bq, Dv, t));
    w->sb_q = w->sa_q, w->sb_g = w->sa_g; /* packed_bytes covers every pack_* layout (isa.h) */
    const int64_t sizes[14] = {
        nq * w->sa_q, nq * w->sa_g, nq * w->sb_q, nq * w->sb_g,
        isa->packed_bytes(bk, D, t), isa->packed_bytes(bk, Dv, t), isa->packed_bytes(bk, D, t),
        4 * bq * bk, 4 * bq * bk, 4 * bq * bk, 4 * bq * bk, 4 * Sk * D, 4 * Sk * Dv, 4 * Sq * D,
    };
    void **slots[14] = {&w->qa, &w->ga, &w->qb, &w->gb, &w->kt, &w->vt, &w->kb,
                        (void **)&w->s, (void **)&w->dp, (void **)&w->th, (void **)&w->tr,
                        (void **)&w->dk, (void **)&w->dv, (void **)&w->dq};
    int64_t off = 0;
    for (int i = 0; i < 14; i++) {
        if (base) *slots[i] = base + off;
        off += fused_round_up(sizes[i]);
    }
    return off;
}

int64_t fa_cpu_backward_fused_scratch_bytes(const struct fa_plan *plan) {
    fused_scratch w;
    return fused_carve(plan, NULL, &w) + FUSED_ALIGN; /* slack to align each thread's start */
}

int fa_cpu_backward_fused_fits(const struct fa_plan *plan) {
    const fa_problem *p = &plan->p;
    const char *force = getenv("FA_BWD_SCHEDULE");
    /* dbias slices must each belong to one item (one (b, kv head)) for a fixed order */
    const int dbias_shared = p->bias_grad && ((p->bias_batch == 1 && p->batch > 1) ||
                                              (p->bias_heads == 1 && p->heads_kv > 1));
    if (dbias_shared) return 0;
    if (force && strcmp(force, "fused") == 0) return 1;
    if (force && strcmp(force, "two-pass") == 0) return 0;
    return p->batch * p->heads_kv >= FUSED_MIN_ITEMS &&
           fa_cpu_backward_fused_scratch_bytes(plan) <= FUSED_MAX_SCRATCH;
}

static fa_tile_src fused_src(const fused_ctx *c, const void *base, const fa_strides *st, int64_t b,
                             int64_t h, int64_t r0) {
    fa_tile_src s;
    s.base = (const char *)base + (size_t)fa_offset(st, b, h, r0, 0) * c->esz;
    s.dtype = c->pl->p.dtype;
    s.row_stride = st->s[2];
    s.col_stride = st->s[3];
    return s;
}

/* x[j] rounded to the dtype, j < n: the ISA's pass where it has one, else this loop. */
static void fused_round_row(const fa_isa *isa, fa_dtype t, float *x, int n) {
    if (t == FA_F32) return;
    if (isa->round_row) {
        isa->round_row(x, n, t);
        return;
    }
    if (t == FA_F16)
        for (int j = 0; j < n; j++) x[j] = fa_vround_f16(x[j]);
    else if (t == FA_BF16)
        for (int j = 0; j < n; j++) x[j] = fa_vround_bf16(x[j]);
}

/* The dbias slice row of (b, h, row), at key 0; NULL without dbias. */
static float *fused_dbias_row(const fused_ctx *c, int64_t b, int64_t h, int64_t row) {
    const fa_problem *p = &c->pl->p;
    if (!p->bias_grad) return NULL;
    const int64_t bb = p->bias_batch == 1 ? 0 : b, bh = p->bias_heads == 1 ? 0 : h;
    return c->a->dbias + ((bb * p->bias_heads + bh) * p->seq_q + row) * p->seq_k;
}

/* One tile pair, Q and dO packed as A (qa, ga) and K, V as B^T: p (rounded to the dtype) in w->s
 * and dS (rounded) in w->dp, as backward.c's tile does, element for element. */
static void fused_tile(const fused_ctx *c, fused_scratch *w, int64_t b, int64_t h, int64_t r0, int m,
                       int64_t c0, int n, const void *qa, const void *ga) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const int ld = (int)pl->bwd_bk, cap = p->softcap > 0.0f;
    const float bias_scale = c->sc.bias_scale;

    const int hide = fa_tile_may_hide(pl, r0, r0 + m, c0, n); /* as backward.c's tile */

    pl->isa->gemm_abt(m, n, (int)p->head_dim, qa, w->kt, w->s, ld);
    pl->isa->gemm_abt(m, n, (int)p->head_dim_v, ga, w->vt, w->dp, ld);
    for (int i = 0; i < m; i++) {
        const int64_t row = r0 + i;
        float *s = w->s + (int64_t)i * ld, *dp = w->dp + (int64_t)i * ld, *th = w->th + (int64_t)i * ld;
        if (fa_score_plain(&c->sc, row, c0, n))
            for (int j = 0; j < n; j++) s[j] *= c->sc.scale;
        else
            fa_score_row(&c->sc, b, h, row, c0, n, s, th);
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
        float *db = fused_dbias_row(c, b, h, row);
        if (db)
            for (int j = 0; j < n; j++) db[c0 + j] += bias_scale * dp[j];
        if (cap && hide) /* (a hidden key's sech^2 may be NaN: keep its dS 0) */
            for (int j = 0; j < n; j++) {
                const float t = dp[j] * th[j];
                dp[j] = dp[j] == 0.0f ? 0.0f : t;
            }
        else if (cap)
            for (int j = 0; j < n; j++) dp[j] *= th[j];
        fused_round_row(pl->isa, p->dtype, dp, n);
        fused_round_row(pl->isa, p->dtype, s, n);
    }
}

/* tr[j*m + i] = x[i*ld + j]: the ISA's pass where it has one, else in 16 x 16 blocks (row
 * by row, every store of a row would touch its own cache line of tr, m floats apart, and
 * the tile does not stay in L1). */
static void fused_transpose(const fa_isa *isa, const float *restrict x, int ld, int m, int n, float *restrict tr) {
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

/* Writes rows x cols of acc (times mul) into a [B, H, S, W] tensor at [b, h, r0, 0]. bf16
 * goes through fa_vround_bf16, whose top half is fa_f32_to_bf16's result, so that the
 * loop vectorizes; the other dtypes through fa_store. */
static void fused_store(const fused_ctx *c, void *dst, const fa_strides *st, int64_t b, int64_t h,
                        int64_t r0, int64_t rows, int cols, const float *acc, float mul) {
    const fa_dtype t = c->pl->p.dtype;
    const int64_t cs = st->s[3];
    for (int64_t i = 0; i < rows; i++) {
        const int64_t at = fa_offset(st, b, h, r0 + i, 0);
        const float *src = acc + i * cols;
        if (t == FA_BF16) {
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

/* The query tiles [*q0, *q1) that visit key tile kt: contiguous, since both ends of a
 * row's visible keys grow with the row (internal.h); two binary searches. A tile that sees
 * nothing and whose keys would start past the last one counts as [nk, nk). */
static void fused_query_tiles(const fa_plan *pl, int64_t kt, int64_t *q0, int64_t *q1) {
    const int64_t bq = pl->bwd_bq, Sq = pl->p.seq_q, nq = (Sq + bq - 1) / bq;
    for (int side = 0; side < 2; side++) {
        int64_t lo = 0, hi = nq;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2, r0 = mid * bq, r1 = r0 + bq < Sq ? r0 + bq : Sq;
            int64_t k0, k1;
            fa_key_tile_range(pl, r0, r1, pl->bwd_bk, &k0, &k1);
            if (k0 == k1 && fa_key_lo(pl, r0) > pl->p.seq_k - 1) k0 = k1 = INT64_MAX;
            if ((side == 0 ? k1 : k0) > kt) hi = mid;
            else lo = mid + 1;
        }
        *(side == 0 ? q0 : q1) = lo;
    }
}

/* (1) One (b, kv head): dK, dV of all its keys, dQ (and dbias) of its query heads. */
static void fused_item(const fused_ctx *c, fused_scratch *w, int64_t b, int64_t hk, fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim, Dv = (int)p->head_dim_v;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, Sq = p->seq_q, Sk = p->seq_k;
    const int64_t group = p->heads_q / p->heads_kv, h0 = hk * group;
    const int64_t nq = (Sq + bq - 1) / bq, nk = (Sk + bk - 1) / bk;
    const int64_t per_pair = 2 * (3 * (int64_t)D + 2 * (int64_t)Dv);
    const int64_t trans_per = p->softcap > 0.0f ? 2 : 1;

    memset(w->dk, 0, sizeof(float) * (size_t)(Sk * D));
    memset(w->dv, 0, sizeof(float) * (size_t)(Sk * Dv));
    if (p->bias_grad) /* the item's slices (one when the heads share it) */
        for (int64_t h = h0; h < h0 + group && (h == h0 || p->bias_heads != 1); h++)
            memset(fused_dbias_row(c, b, h, 0), 0, sizeof(float) * (size_t)(Sq * Sk));
    for (int64_t h = h0; h < h0 + group; h++) {
        for (int64_t qt = 0; qt < nq; qt++) {
            const int64_t r0 = qt * bq;
            const int m = (int)(Sq - r0 < bq ? Sq - r0 : bq);
            fa_tile_src qs = fused_src(c, a->q, &p->q_stride, b, h, r0);
            fa_tile_src gs = fused_src(c, a->d_o, &p->o_stride, b, h, r0);
            isa->pack_a(&qs, m, D, (char *)w->qa + qt * w->sa_q);
            isa->pack_a(&gs, m, Dv, (char *)w->ga + qt * w->sa_g);
            isa->pack_b(&qs, m, D, (char *)w->qb + qt * w->sb_q);
            isa->pack_b(&gs, m, Dv, (char *)w->gb + qt * w->sb_g);
        }
        memset(w->dq, 0, sizeof(float) * (size_t)(Sq * D));
        for (int64_t kt = 0; kt < nk; kt++) {
            const int64_t c0 = kt * bk;
            const int n = (int)(Sk - c0 < bk ? Sk - c0 : bk);
            int64_t q0 = 0, q1 = 0;
            fused_query_tiles(pl, kt, &q0, &q1);
            if (q0 == q1) continue;
            fa_tile_src ks = fused_src(c, a->k, &p->k_stride, b, hk, c0);
            fa_tile_src vs = fused_src(c, a->v, &p->v_stride, b, hk, c0);
            isa->pack_bt(&ks, n, D, w->kt);
            isa->pack_bt(&vs, n, Dv, w->vt);
            isa->pack_b(&ks, n, D, w->kb);
            int k_nonfinite = -1; /* checked once, when a pair can hide a key (guard.h) */
            for (int64_t qt = q0; qt < q1; qt++) {
                const int64_t r0 = qt * bq;
                const int m = (int)(Sq - r0 < bq ? Sq - r0 : bq);
                void *qb = (char *)w->qb + qt * w->sb_q, *gb = (char *)w->gb + qt * w->sb_g;
                fused_tile(c, w, b, h, r0, m, c0, n, (char *)w->qa + qt * w->sa_q, (char *)w->ga + qt * w->sa_g);
                /* inf or NaN in q, dO (a NaN row) or k must not cross a zero weight into keys or
                 * rows that cannot see each other: guarded products, each slot packed again */
                const int hide = fa_tile_may_hide(pl, r0, r0 + m, c0, n);
                fa_tile_src qs = fused_src(c, a->q, &p->q_stride, b, h, r0);
                fa_tile_src gs = fused_src(c, a->d_o, &p->o_stride, b, h, r0);
                if (hide && k_nonfinite < 0) k_nonfinite = fa_tile_nonfinite(&ks, n, D);
                fused_transpose(isa, w->s, (int)bk, m, n, w->tr);
                if (hide && fa_tile_nonfinite(&gs, m, Dv)) {
                    fa_gemm_pb_guarded(isa, n, m, Dv, w->tr, m, &gs, gb, w->dv + c0 * Dv, Dv);
                    isa->pack_b(&gs, m, Dv, gb);
                } else {
                    isa->gemm_pb(n, m, Dv, w->tr, m, gb, w->dv + c0 * Dv, Dv);
                }
                fused_transpose(isa, w->dp, (int)bk, m, n, w->tr);
                if (hide && fa_tile_nonfinite(&qs, m, D)) {
                    fa_gemm_pb_guarded(isa, n, m, D, w->tr, m, &qs, qb, w->dk + c0 * D, D);
                    isa->pack_b(&qs, m, D, qb);
                } else {
                    isa->gemm_pb(n, m, D, w->tr, m, qb, w->dk + c0 * D, D);
                }
                if (hide && k_nonfinite) {
                    fa_gemm_pb_guarded(isa, m, n, D, w->dp, (int)bk, &ks, w->kb, w->dq + r0 * D, D);
                    isa->pack_b(&ks, n, D, w->kb);
                } else {
                    isa->gemm_pb(m, n, D, w->dp, (int)bk, w->kb, w->dq + r0 * D, D);
                }
                cnt->flops += per_pair * m * n;
                cnt->transcendentals += trans_per * m * n;
            }
        }
        fused_store(c, a->dq, &p->q_stride, b, h, 0, Sq, D, w->dq, pl->scale);
    }
    fused_store(c, a->dk, &p->k_stride, b, hk, 0, Sk, D, w->dk, pl->scale);
    fused_store(c, a->dv, &p->v_stride, b, hk, 0, Sk, Dv, w->dv, 1.0f);
}

/* The one-pass schedule; fa_cpu_backward calls it for plans that chose it, with the
 * arguments and the workspace size already checked. */
fa_status fa_cpu_backward_fused(const struct fa_plan *plan, const fa_backward_args *a, char *ws) {
    const fa_problem *p = &plan->p;
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q;
    const int threads = plan->threads > 0 ? plan->threads : 1;
    const int64_t rows = B * Hq * Sq, scratch = fa_cpu_backward_fused_scratch_bytes(plan);
    float *delta = (float *)ws;
    char *scratch_base = ws + 4 * rows;
    fused_ctx c = {plan, a, delta, fa_dtype_size(p->dtype),
                   fa_score_ctx_make(plan, a->bias, a->alibi_slopes, a->q_segment_ids, a->kv_segment_ids)};
    int64_t flops = 0, trans = 0;
    fa_progress progress;
    fa_progress_init(&progress, a->progress, a->progress_ctx, B * Hk);

#pragma omp parallel num_threads(threads) reduction(+ : flops, trans)
    {
        fused_scratch w;
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch;
        mine += (FUSED_ALIGN - (uintptr_t)mine % FUSED_ALIGN) % FUSED_ALIGN; /* within the slack */
        fused_carve(plan, mine, &w);
        fa_counts cnt = {0, 0};

#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) delta[r] = fa_bwd_delta_row(p, a, r);
        /* the implicit barrier above publishes delta */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < B * Hk; t++) {
            fused_item(&c, &w, t / Hk, t % Hk, &cnt);
            fa_progress_step(&progress, 1);
        }
        flops += cnt.flops;
        trans += cnt.transcendentals;
    }
    if (a->counts) {
        a->counts->flops = flops;
        a->counts->transcendentals = trans;
    }
    return FA_OK;
}
