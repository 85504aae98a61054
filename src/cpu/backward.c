/* The CPU backward: FlashAttention-2's two passes, deterministic and without atomics.
 *
 *   (0) delta_i = rowsum(dO_i * o_i), f32, for every (b, hq, i), into the workspace.
 *   (1) dK/dV: one task per (b, kv head, key tile). The task owns its dK and dV tiles (f32
 *       accumulators) and visits, for each query head of its GQA group, every query tile
 *       whose key-tile range (fa_key_tile_range) holds this key tile: it recomputes
 *       s (scores.h) and p = exp(s - lse), dP = dO V^T, dS = p (dP - delta) (times sech^2
 *       under softcap), then dV += P^T dO and dK += dS^T Q; dK is scaled and both are
 *       written once.
 *   (2) dQ: one task per (b, query head, query tile): the same tiles, dQ += dS K, written once.
 *       With dbias, one task per (bias slice, query tile) instead: it zeroes its rows of the
 *       slice and visits the (b, query head) pairs that read the slice, b then h ascending,
 *       each adding bias_scale * p (dP - delta) to them. No scratch, no extra products.
 *
 * Every output element is owned by one task and summed in a fixed order, so results are
 * bit-identical across runs and thread counts. p comes from the ISA's exp_sum, the exp the
 * forward uses; p and dS are rounded to the problem's dtype before they enter a product
 * (the microkernels' contract, isa.h). Counting follows the COUNTING RULES in internal.h. */
#include "backward_delta.h"
#include "guard.h"
#include "isa.h"
#include "progress.h"
#include "scores.h"
#include "vexp.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define BWD_ALIGN 64

/* One thread's scratch, carved from the workspace (bwd_carve). */
typedef struct {
    void *qa, *ga;   /* Q, dO tile packed as A (S = Q K^T, dP = dO V^T) */
    void *qb, *gb;   /* Q, dO tile packed as B (dK += dS^T Q, dV += P^T dO) */
    void *kt, *vt;   /* K, V tile packed as B^T (S, dP) */
    void *kb;        /* K tile packed as B (dQ += dS K) */
    float *s, *dp;   /* bq x bk: scores, then p; dP, then dS */
    float *th;       /* bq x bk: the softcap's derivative, sech^2 */
    float *tr;       /* bk x bq: P^T or dS^T */
    float *acc, *acc_v; /* dK (bk x D) or dQ (bq x D); dV (bk x Dv) */
} bwd_scratch;

typedef struct {
    const fa_plan *pl;
    const fa_backward_args *a;
    const float *delta; /* [B, Hq, Sq] */
    size_t esz;         /* bytes per element of q, k, v, ... */
    fa_score_ctx sc;    /* what turns products into scores */
} bwd_ctx;

static int64_t bwd_round_up(int64_t x) { return (x + BWD_ALIGN - 1) / BWD_ALIGN * BWD_ALIGN; }

/* Lays the pieces out from base (or only measures, when base is NULL); returns the bytes. */
static int64_t bwd_carve(const fa_plan *pl, char *base, bwd_scratch *w) {
    const fa_isa *isa = pl->isa;
    const fa_dtype t = pl->p.dtype;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, D = pl->p.head_dim, Dv = pl->p.head_dim_v;
    const int64_t acc_rows = bq > bk ? bq : bk;
    int64_t sizes[12] = {
        isa->packed_bytes(bq, D, t),  isa->packed_bytes(bq, Dv, t), isa->packed_bytes(bq, D, t),
        isa->packed_bytes(bq, Dv, t), isa->packed_bytes(bk, D, t),  isa->packed_bytes(bk, Dv, t),
        isa->packed_bytes(bk, D, t),  4 * bq * bk,                  4 * bq * bk,
        4 * bq * bk,                  4 * bq * bk,                  4 * acc_rows * D,
    };
    void **slots[12] = {&w->qa, &w->ga, &w->qb, &w->gb, &w->kt, &w->vt, &w->kb,
                        (void **)&w->s, (void **)&w->dp, (void **)&w->th, (void **)&w->tr,
                        (void **)&w->acc};
    int64_t off = 0;
    for (int i = 0; i < 12; i++) {
        if (base) *slots[i] = base + off;
        off += bwd_round_up(sizes[i]);
    }
    if (base) w->acc_v = (float *)(base + off);
    off += bwd_round_up(4 * bk * Dv);
    return off;
}

int64_t fa_cpu_backward_scratch_bytes(const struct fa_plan *plan) {
    bwd_scratch w;
    if (plan->bwd_fused) return fa_cpu_backward_fused_scratch_bytes(plan);
    return bwd_carve(plan, NULL, &w) + BWD_ALIGN; /* slack to align each thread's start */
}

/* A rows x cols block of a [B, H, S, W] tensor starting at [b, h, r0, 0]. */
static fa_tile_src bwd_src(const bwd_ctx *c, const void *base, const fa_strides *st, int64_t b,
                           int64_t h, int64_t r0) {
    fa_tile_src s;
    s.base = (const char *)base + (size_t)fa_offset(st, b, h, r0, 0) * c->esz;
    s.dtype = c->pl->p.dtype;
    s.row_stride = st->s[2];
    s.col_stride = st->s[3];
    return s;
}

/* x[j] rounded to the dtype, j < n. */
static void bwd_round_row(const fa_isa *isa, fa_dtype t, float *x, int n) {
    if (t != FA_F32 && isa->round_row) { /* the ISA's pass: the same bits */
        isa->round_row(x, n, t);
        return;
    }
    if (t == FA_F16)
        for (int j = 0; j < n; j++) x[j] = fa_vround_f16(x[j]);
    else if (t == FA_BF16)
        for (int j = 0; j < n; j++) x[j] = fa_vround_bf16(x[j]);
}

/* The tile pair (query rows [r0, r0+m) of head h, keys [c0, c0+n)), with Q and dO packed as A
 * and K and V packed as B^T in w: leaves dS = p (dP - delta) (softcap: times sech^2),
 * rounded to the dtype, in w->dp, and with want_p, p = exp(s - lse) rounded to the dtype in
 * w->s (0 where masked or where the row sees no key). s is the forward's, bit for bit
 * (scores.h). With dbias (row i at dbias + i * ld_dbias), adds bias_scale times the
 * gradient of the final score, p (dP - delta) in f32, to it. */
static void bwd_tile(const bwd_ctx *c, bwd_scratch *w, int64_t b, int64_t h, int64_t r0, int m,
                     int64_t c0, int n, int want_p, float *dbias, int64_t ld_dbias) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_backward_args *a = c->a;
    const int ld = (int)pl->bwd_bk;
    const int cap = p->softcap > 0.0f;
    const float bias_scale = c->sc.bias_scale;

    /* where no key can be hidden, p = 0 only by underflow: no guard needed (guard.h) */
    const int hide = fa_tile_may_hide(pl, r0, r0 + m, c0, n);

    pl->isa->gemm_abt(m, n, (int)p->head_dim, w->qa, w->kt, w->s, ld);
    pl->isa->gemm_abt(m, n, (int)p->head_dim_v, w->ga, w->vt, w->dp, ld);

    for (int i = 0; i < m; i++) {
        const int64_t row = r0 + i;
        float *restrict s = w->s + (int64_t)i * ld, *restrict dp = w->dp + (int64_t)i * ld;
        const float *restrict th = w->th + (int64_t)i * ld;
        if (fa_score_plain(&c->sc, row, c0, n))
            for (int j = 0; j < n; j++) s[j] *= c->sc.scale;
        else
            fa_score_row(&c->sc, b, h, row, c0, n, s, w->th + (int64_t)i * ld);
        const int64_t r = (b * p->heads_q + h) * p->seq_q + row;
        const float lse = a->lse[fa_lse_index(pl, b, h, row)], delta = c->delta[r];
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
        bwd_round_row(pl->isa, p->dtype, dp, n);
        if (want_p) bwd_round_row(pl->isa, p->dtype, s, n);
    }
}

/* tr[j*m + i] = x[i*ld + j]: the left operand of P^T dO or dS^T Q. */
static void bwd_transpose(const fa_isa *isa, const float *x, int ld, int m, int n, float *tr) {
    if (isa->transpose) { /* the ISA's pass (a row-by-row copy misses L1 on every store) */
        isa->transpose(x, ld, m, n, tr);
        return;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) tr[(int64_t)j * m + i] = x[(int64_t)i * ld + j];
}

/* Writes rows x cols of acc (times mul) into a [B, H, S, W] tensor at [b, h, r0, 0]. */
static void bwd_store(const bwd_ctx *c, void *dst, const fa_strides *st, int64_t b, int64_t h,
                      int64_t r0, int rows, int cols, const float *acc, float mul) {
    for (int i = 0; i < rows; i++)
        for (int x = 0; x < cols; x++)
            fa_store(c->pl->p.dtype, dst, fa_offset(st, b, h, r0 + i, x), mul * acc[(int64_t)i * cols + x]);
}

/* The query tiles [*q0, *q1) that visit key tile kt (fa_key_tile_range of their rows holds
 * kt). Both ends of a row's visible keys grow with the row (internal.h), so a tile's key
 * range [k0, k1) only moves right as the tile does: the visitors are contiguous, found by
 * two binary searches. A tile that sees nothing gets [0, 0) from fa_key_tile_range; for the
 * search it counts as [nk, nk) when its keys would start past the last one (a diagonal
 * offset can leave the last tiles with nothing to see), so the order stays monotone. */
static void bwd_query_tiles(const fa_plan *pl, int64_t kt, int64_t *q0, int64_t *q1) {
    const int64_t bq = pl->bwd_bq, Sq = pl->p.seq_q, nq = (Sq + bq - 1) / bq;
    for (int side = 0; side < 2; side++) {
        int64_t lo = 0, hi = nq; /* first tile with k1 > kt (side 0), with k0 > kt (side 1) */
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

/* (1) One (b, kv head, key tile): dK and dV of keys [c0, c0 + n). */
static void bwd_dkdv_task(const bwd_ctx *c, bwd_scratch *w, int64_t b, int64_t hk, int64_t kt,
                          fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim, Dv = (int)p->head_dim_v;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, group = p->heads_q / p->heads_kv;
    const int64_t c0 = kt * bk;
    const int n = (int)(p->seq_k - c0 < bk ? p->seq_k - c0 : bk);
    const int64_t per_pair = 2 * (2 * (int64_t)D + 2 * (int64_t)Dv);
    const int64_t trans_per = p->softcap > 0.0f ? 2 : 1;

    fa_tile_src ks = bwd_src(c, a->k, &p->k_stride, b, hk, c0);
    fa_tile_src vs = bwd_src(c, a->v, &p->v_stride, b, hk, c0);
    isa->pack_bt(&ks, n, D, w->kt);
    isa->pack_bt(&vs, n, Dv, w->vt);
    memset(w->acc, 0, sizeof(float) * (size_t)n * (size_t)D);
    memset(w->acc_v, 0, sizeof(float) * (size_t)n * (size_t)Dv);
    int64_t q0, q1;
    bwd_query_tiles(pl, kt, &q0, &q1);

    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t qt = q0; qt < q1; qt++) {
            const int64_t r0 = qt * bq;
            const int m = (int)(p->seq_q - r0 < bq ? p->seq_q - r0 : bq);
            fa_tile_src qs = bwd_src(c, a->q, &p->q_stride, b, h, r0);
            fa_tile_src gs = bwd_src(c, a->d_o, &p->o_stride, b, h, r0);
            isa->pack_a(&qs, m, D, w->qa);
            isa->pack_a(&gs, m, Dv, w->ga);
            /* a NaN row must not reach keys it cannot see through 0 * q or 0 * do (guard.h) */
            const int hide = fa_tile_may_hide(pl, r0, r0 + m, c0, n);
            const int q_nonfinite = hide && fa_tile_nonfinite(&qs, m, D);
            const int g_nonfinite = hide && fa_tile_nonfinite(&gs, m, Dv);
            if (!q_nonfinite) isa->pack_b(&qs, m, D, w->qb);
            if (!g_nonfinite) isa->pack_b(&gs, m, Dv, w->gb);
            bwd_tile(c, w, b, h, r0, m, c0, n, 1, NULL, 0);
            bwd_transpose(isa, w->s, (int)bk, m, n, w->tr);
            if (g_nonfinite) fa_gemm_pb_guarded(isa, n, m, Dv, w->tr, m, &gs, w->gb, w->acc_v, Dv);
            else isa->gemm_pb(n, m, Dv, w->tr, m, w->gb, w->acc_v, Dv);
            bwd_transpose(isa, w->dp, (int)bk, m, n, w->tr);
            if (q_nonfinite) fa_gemm_pb_guarded(isa, n, m, D, w->tr, m, &qs, w->qb, w->acc, D);
            else isa->gemm_pb(n, m, D, w->tr, m, w->qb, w->acc, D);
            cnt->flops += per_pair * m * n;
            cnt->transcendentals += trans_per * m * n;
        }
    bwd_store(c, a->dk, &p->k_stride, b, hk, c0, n, D, w->acc, pl->scale);
    bwd_store(c, a->dv, &p->v_stride, b, hk, c0, n, Dv, w->acc_v, 1.0f);
}

/* (2) One (b, query head, query tile): dQ of rows [r0, r0 + m); with dbias (its rows
 * [r0, r0 + m) of the bias slice of (b, h), Sk wide), adds this head's share to it. */
static void bwd_dq_task(const bwd_ctx *c, bwd_scratch *w, int64_t b, int64_t h, int64_t qt, float *dbias,
                        fa_counts *cnt) {
    const fa_plan *pl = c->pl;
    const fa_problem *p = &pl->p;
    const fa_isa *isa = pl->isa;
    const fa_backward_args *a = c->a;
    const int D = (int)p->head_dim, Dv = (int)p->head_dim_v;
    const int64_t bq = pl->bwd_bq, bk = pl->bwd_bk, hk = h / (p->heads_q / p->heads_kv);
    const int64_t r0 = qt * bq;
    const int m = (int)(p->seq_q - r0 < bq ? p->seq_q - r0 : bq);
    const int64_t per_pair = 2 * (2 * (int64_t)D + (int64_t)Dv);
    const int64_t trans_per = p->softcap > 0.0f ? 2 : 1;

    memset(w->acc, 0, sizeof(float) * (size_t)m * (size_t)D);
    int64_t k0, k1;
    fa_key_tile_range(pl, r0, r0 + m, bk, &k0, &k1);
    if (k0 < k1) {
        fa_tile_src qs = bwd_src(c, a->q, &p->q_stride, b, h, r0);
        fa_tile_src gs = bwd_src(c, a->d_o, &p->o_stride, b, h, r0);
        isa->pack_a(&qs, m, D, w->qa);
        isa->pack_a(&gs, m, Dv, w->ga);
    }
    for (int64_t kt = k0; kt < k1; kt++) {
        const int64_t c0 = kt * bk;
        const int n = (int)(p->seq_k - c0 < bk ? p->seq_k - c0 : bk);
        fa_tile_src ks = bwd_src(c, a->k, &p->k_stride, b, hk, c0);
        fa_tile_src vs = bwd_src(c, a->v, &p->v_stride, b, hk, c0);
        isa->pack_bt(&ks, n, D, w->kt);
        isa->pack_bt(&vs, n, Dv, w->vt);
        const int k_nonfinite = fa_tile_may_hide(pl, r0, r0 + m, c0, n) && fa_tile_nonfinite(&ks, n, D); /* guard.h */
        if (!k_nonfinite) isa->pack_b(&ks, n, D, w->kb);
        bwd_tile(c, w, b, h, r0, m, c0, n, 0, dbias ? dbias + c0 : NULL, p->seq_k);
        if (k_nonfinite) fa_gemm_pb_guarded(isa, m, n, D, w->dp, (int)bk, &ks, w->kb, w->acc, D);
        else isa->gemm_pb(m, n, D, w->dp, (int)bk, w->kb, w->acc, D);
        cnt->flops += per_pair * m * n;
        cnt->transcendentals += trans_per * m * n;
    }
    bwd_store(c, a->dq, &p->q_stride, b, h, r0, m, D, w->acc, pl->scale);
}

/* The arguments and the workspace size were checked at the entry (args.c). */
fa_status fa_cpu_backward(const struct fa_plan *plan, const fa_backward_args *a) {
    fa_status st;
    const fa_problem *p = &plan->p;
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q;
    const int threads = plan->threads > 0 ? plan->threads : 1;
    const int64_t rows = B * Hq * Sq;
    const int64_t scratch = fa_cpu_backward_scratch_bytes(plan);
    const int64_t need = 4 * rows + threads * scratch; /* delta, then each thread's scratch */

    char *ws = a->workspace, *owned = NULL;
    if (!ws) {
        owned = fa_malloc((size_t)need);
        if (!owned)
            return fa_error(FA_ERR_NO_MEMORY, "backward: cannot allocate %lld bytes of workspace",
                            (long long)need);
        ws = owned;
    }
    if (plan->bwd_fused) { /* the one-pass schedule (backward_fused.c) */
        st = fa_cpu_backward_fused(plan, a, ws);
        free(owned);
        return st;
    }
    float *delta = (float *)ws;
    char *scratch_base = ws + 4 * rows;
    bwd_ctx c = {plan, a, delta, fa_dtype_size(p->dtype),
                 fa_score_ctx_make(plan, a->bias, a->alibi_slopes, a->q_segment_ids, a->kv_segment_ids)};
    /* (b, h) pairs per dq task: those that share a dbias slice (1 x 1 without dbias) */
    const int64_t nb = p->bias_grad ? B / p->bias_batch : 1, nh = p->bias_grad ? Hq / p->bias_heads : 1;
    const int64_t slices_h = Hq / nh;

    const int64_t bq = plan->bwd_bq, bk = plan->bwd_bk;
    const int64_t nq = (Sq + bq - 1) / bq, nk = (p->seq_k + bk - 1) / bk;
    int64_t flops = 0, trans = 0;
    fa_progress progress;
    fa_progress_init(&progress, a->progress, a->progress_ctx, B * Hk * nk + B * Hq * nq);

#pragma omp parallel num_threads(threads) reduction(+ : flops, trans)
    {
        bwd_scratch w;
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch;
        mine += (BWD_ALIGN - (uintptr_t)mine % BWD_ALIGN) % BWD_ALIGN; /* within the slack */
        bwd_carve(plan, mine, &w);
        fa_counts cnt = {0, 0};

#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) delta[r] = fa_bwd_delta_row(p, a, r);
        /* the implicit barrier above publishes delta */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < B * Hk * nk; t++)
        {
            bwd_dkdv_task(&c, &w, t / (Hk * nk), t / nk % Hk, t % nk, &cnt);
            fa_progress_step(&progress, 1);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < B / nb * slices_h * nq; t++)
        {
            const int64_t qt = t % nq, sb = t / nq / slices_h, sh = t / nq % slices_h;
            float *db = NULL;
            if (p->bias_grad) {
                const int64_t r0 = qt * bq, m = Sq - r0 < bq ? Sq - r0 : bq;
                db = a->dbias + ((sb * p->bias_heads + sh) * Sq + r0) * p->seq_k;
                memset(db, 0, sizeof(float) * (size_t)(m * p->seq_k));
            }
            for (int64_t bi = 0; bi < nb; bi++)
                for (int64_t hi = 0; hi < nh; hi++)
                    bwd_dq_task(&c, &w, nb == 1 ? sb : bi, nh == 1 ? sh : hi, qt, db, &cnt);
            fa_progress_step(&progress, nb * nh);
        }
        flops += cnt.flops;
        trans += cnt.transcendentals;
    }
    fa_free(owned);
    if (a->counts) {
        a->counts->flops = flops;
        a->counts->transcendentals = trans;
    }
    return FA_OK;
}
