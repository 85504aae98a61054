/* The CPU forward driver (FlashAttention-2 schedule).
 *
 * Work items are (batch, query head, run of up to FWD_RUN consecutive query tiles), spread
 * over plan->threads OpenMP threads. A thread packs q of each tile of its run once, then
 * walks the key tiles any of them visits: it packs k and v once (again only for a tile
 * that computes other keys of it) and, for each tile of the run whose key tiles
 * (schedule.h) hold the key tile (the cost model counts exactly that schedule; under a
 * mask, each pair's keys from the first to the last one a row may see: schedule_mask.h,
 * fa_sched_mask_key_span, and per slice of 32 rows, fa_sched_mask_slice_keys, where the ISA
 * takes ragged pairs),
 * S = Q K^T, then row by row turns S into scores (scores.h: scale, softcap, bias, ALiBi,
 * masks) and folds them into an online softmax (row max m, row sum l, f32
 * accumulator O), then O += P V; at the end it writes o = O / l and lse = m + log(l)
 * (with sinks, l and m include the head's sink first: sinks.h).
 * Sharing each packed k, v tile among the run's query tiles divides the packing (10% of
 * the bf16 forward with one tile per item) by the run length; every row still sees its
 * key tiles in the same order, so the results do not depend on the runs. The tile math (packing,
 * the two products, the exps) lives in the ISA table (isa.h); this file owns tiling,
 * threading and the softmax bookkeeping. bf16 problems on an ISA with the bf16-pair passes
 * (isa.h: max_row, exp_pairs, gemm_pb_pairs) take the row max from the raw products and
 * write p once, as the pairs the PV product reads: the same bits as scaling, exp_sum,
 * round_row and gemm_pb, in two passes over S instead of four. Memory: threads x one tile's scratch,
 * never Sq x Sk. */
#include "dropout.h"
#include "guard.h"
#include "isa.h"
#include "counts_sum.h"
#include "progress.h"
#include "scores.h"
#include "../sinks.h"
#include "softmax_row.h"
#include "vexp.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define SCRATCH_ALIGN 64

static int64_t align_up(int64_t x) { return (x + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN; }

static const fa_isa *plan_isa(const struct fa_plan *pl) { return pl->isa ? pl->isa : &fa_isa_scalar; }

/* The tile edges the driver really uses: the plan's, clipped to the sequence lengths. */
static void tile_edges(const struct fa_plan *pl, int64_t *bq, int64_t *bk) {
    *bq = pl->fwd_bq < pl->p.seq_q ? pl->fwd_bq : pl->p.seq_q;
    *bk = pl->fwd_bk < pl->p.seq_k ? pl->fwd_bk : pl->p.seq_k;
    if (*bq < 1) *bq = 1;
    if (*bk < 1) *bk = 1;
}

#define FWD_RUN 16 /* most query tiles an item covers (see run_length) */
#define FWD_MAX_SLICES (FA_FWD_MAX_ROWS_SLICED / FA_FWD_SLICE) /* slices of a pair (internal.h) */
#define FWD_RUN_BYTES_DEFAULT (1 << 20)

/* What a run's q tiles and accumulators may take: each key tile's pass touches all of them,
 * so they should stay in L2: the ISA's figure (isa.h, fwd_run_bytes: 2 MiB for AMX, every
 * AMX core's L2), else a Zen 4 core's 1 MiB. Registered with the kernels rather than asked
 * of the machine, so that a plan's workspace follows from its ISA as its tiles do. */
static int64_t run_bytes(const struct fa_plan *pl) {
    const fa_isa_tiles *t = plan_isa(pl)->tiles;
    return t && t->fwd_run_bytes > 0 ? t->fwd_run_bytes : FWD_RUN_BYTES_DEFAULT;
}

/* Query tiles per item: FWD_RUN while the run fits run_bytes and that leaves at least
 * 4 items per thread, fewer where it would not (the results are the same for any run
 * length). Measured (bench/RESULTS.md): on Zen 4, 8 tiles against 4, dense causal bf16
 * D = 128 about 6% faster, at D = 256 (1.5 MiB a run of 8) no faster; on the AMX Xeon (2 MiB
 * of L2), 16 tiles (1.5 MiB at bf16 D = 128) against 8: 16 documents and chunked causal 2-4%
 * faster (short rows share each packed k, v tile among more query tiles), f32 5%. */
static int64_t run_length(const struct fa_plan *pl, int64_t bq) {
    const fa_problem *p = &pl->p;
    const int64_t nq = (p->seq_q + bq - 1) / bq, heads = p->batch * p->heads_q;
    const int64_t tile_bytes = plan_isa(pl)->packed_bytes(bq, p->head_dim, p->dtype) +
                               bq * p->head_dim_v * (int64_t)sizeof(float);
    const int64_t budget = run_bytes(pl);
    int64_t r = FWD_RUN;
    while (r > 1 && r * tile_bytes > budget) r /= 2;
    while (r > 1 && heads * ((nq + r - 1) / r) < 4 * (int64_t)(pl->threads > 0 ? pl->threads : 1)) r /= 2;
    return r < nq ? r : nq;
}

/* One thread's scratch: the run's q tiles, accumulators, row maxima and sums (run x the
 * per-tile piece, pitch apart), and one k, v and S tile. */
typedef struct {
    char *qp;           /* packed q tiles (ISA layout), qp_pitch apart */
    void *kp, *vp;      /* packed k, v tiles */
    float *s;           /* bq x bk scores, then probabilities */
    float *acc;         /* bq x Dv output accumulators, acc_pitch floats apart */
    float *m, *l;       /* bq row maxima and row sums, ml_pitch floats apart */
    int64_t qp_pitch, acc_pitch, ml_pitch, run;
} fwd_scratch;

/* Byte sizes of the pieces, in carving order. */
static void scratch_sizes(const struct fa_plan *pl, int64_t sz[7]) {
    const fa_isa *isa = plan_isa(pl);
    const fa_problem *p = &pl->p;
    int64_t bq, bk;
    tile_edges(pl, &bq, &bk);
    const int64_t run = run_length(pl, bq);
    sz[0] = run * align_up(isa->packed_bytes(bq, p->head_dim, p->dtype));
    sz[1] = isa->packed_bytes(bk, p->head_dim, p->dtype);
    sz[2] = isa->packed_bytes(bk, p->head_dim_v, p->dtype);
    sz[3] = bq * bk * (int64_t)sizeof(float);
    sz[4] = run * align_up(bq * p->head_dim_v * (int64_t)sizeof(float));
    sz[5] = run * align_up(bq * (int64_t)sizeof(float));
    sz[6] = run * align_up(bq * (int64_t)sizeof(float));
}

int64_t fa_cpu_forward_scratch_bytes(const struct fa_plan *pl) {
    int64_t sz[7], total = SCRATCH_ALIGN; /* slack to align the start of a thread's slice */
    scratch_sizes(pl, sz);
    for (int i = 0; i < 7; i++) total += align_up(sz[i]);
    return total;
}

static fwd_scratch carve_scratch(const struct fa_plan *pl, char *slice) {
    int64_t sz[7];
    scratch_sizes(pl, sz);
    char *c = slice + (SCRATCH_ALIGN - (uintptr_t)slice % SCRATCH_ALIGN) % SCRATCH_ALIGN;
    void *piece[7];
    for (int i = 0; i < 7; i++) {
        piece[i] = c;
        c += align_up(sz[i]);
    }
    int64_t bq, bk;
    tile_edges(pl, &bq, &bk);
    const int64_t run = run_length(pl, bq);
    fwd_scratch sc = {piece[0], piece[1], piece[2], piece[3], piece[4], piece[5], piece[6],
                      sz[0] / run, sz[4] / run / 4, sz[5] / run / 4, run};
    return sc;
}

/* Everything a work item needs, resolved once per call. */
typedef struct {
    const struct fa_plan *pl;
    const fa_problem *p;
    const fa_isa *isa;
    const fa_forward_args *a;
    int64_t bq, bk, group; /* tile edges; query heads per kv head */
    int64_t slice;         /* the plan's fwd_slice: rows per slice of a pair (0: whole pairs) */
    size_t esz;            /* bytes per q/k/v/o element */
    fa_score_ctx sc;       /* what turns products into scores */
    fa_sched sched;        /* which keys each row sees (schedule.h) */
    int pairs;             /* p goes to the PV product as the ISA's bf16 pairs (isa.h) */
    int hide_only;         /* no softcap, bias, ALiBi or segment ids: scores are scaled or hidden */
    fa_dropout drop;       /* dropout's keep mask (dropout.h) */
} fwd_ctx;

static fa_tile_src tile_src(const fwd_ctx *cx, const void *base, const fa_strides *st, int64_t b, int64_t h,
                            int64_t row) {
    fa_tile_src src;
    src.base = (const char *)base + fa_offset(st, b, h, row, 0) * (int64_t)cx->esz;
    src.dtype = cx->p->dtype;
    src.row_stride = st->s[2];
    src.col_stride = st->s[3];
    return src;
}

/* fa_scale_max over the keys that vis shows (its nonzero bytes); -inf written at the others.
 * Branch-free, so that it vectorizes: the select is one pass with the scaling and the max. */
static float scale_max_shown(float *restrict x, const uint8_t *restrict vis, int n, float scale) {
    float part[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 8 <= n; j += 8)
#pragma GCC unroll 1 /* as in fa_row_max (softmax_row.h) */
        for (int c = 0; c < 8; c++) {
            const float s = vis[j + c] ? x[j + c] * scale : -INFINITY;
            x[j + c] = s;
            part[c] = s > part[c] ? s : part[c];
        }
    float mx = -INFINITY;
    for (; j < n; j++) {
        x[j] = vis[j] ? x[j] * scale : -INFINITY;
        mx = x[j] > mx ? x[j] : mx;
    }
    for (int c = 0; c < 8; c++) mx = part[c] > mx ? part[c] : mx;
    return mx;
}

/* fa_score_row_max for a row whose only terms besides the scale hide keys (causal, window and the
 * mask: cx->hide_only): the scaled product where the row sees the key, -inf elsewhere, and
 * the max, in one pass over the row. fa_score_row's scores (scale, then -inf where hidden)
 * and fa_row_max's maximum (a max does not depend on the order it is taken in), so the same
 * results as the general path at a fraction of its passes and per-element branches. */
static float hidden_scale_max(const fwd_ctx *cx, int64_t i, int64_t j0, int n, float *restrict srow) {
    const fa_isa *isa = cx->isa;
    const fa_sched_mask *v = &cx->sc.mask; /* this (b, h)'s view (fa_score_ctx_at) */
    const float scale = cx->sc.scale;
    int64_t lo = fa_sched_lo(&cx->sched, i) - j0, hi = fa_sched_hi(&cx->sched, i) + 1 - j0; /* keys [lo, hi) */
    lo = lo < 0 ? 0 : lo > n ? n : lo;
    hi = hi < lo ? lo : hi > n ? n : hi;
    fa_hide_row(isa, srow, NULL, lo);
    fa_hide_row(isa, srow + hi, NULL, n - hi);
    if (!v->kinds) return lo < hi ? fa_scale_max(srow + lo, (int)(hi - lo), scale) : -INFINITY;
    float mx = -INFINITY;
    for (int64_t a = lo, e; a < hi; a = e) {
        const int64_t kb = (j0 + a) / v->bk;
        e = (kb + 1) * v->bk - j0 < hi ? (kb + 1) * v->bk - j0 : hi;
        const int kind = fa_sched_mask_block(v, i / v->bq, kb);
        float m = -INFINITY;
        if (kind == FA_TILE_FULL) m = fa_scale_max(srow + a, (int)(e - a), scale);
        else if (kind == FA_TILE_EMPTY) fa_hide_row(isa, srow + a, NULL, e - a);
        else m = scale_max_shown(srow + a, fa_sched_mask_row(v, i, kb) + (j0 + a - kb * v->bk), (int)(e - a), scale);
        mx = m > mx ? m : mx;
    }
    return mx;
}

/* hidden_scale_max's walk for the bf16 pairs (isa.h): -inf written where the row cannot see
 * the key, the raw products left where it can (full blocks untouched), so that the ISA's
 * max_row and exp_pairs then scale them at their own width. The same scores and max as
 * hidden_scale_max (scale > 0: rounding x * scale keeps the order of x), so the same bits. */
static void hide_keys(const fwd_ctx *cx, int64_t i, int64_t j0, int n, float *restrict srow) {
    const fa_isa *isa = cx->isa;
    const fa_sched_mask *v = &cx->sc.mask;
    int64_t lo = fa_sched_lo(&cx->sched, i) - j0, hi = fa_sched_hi(&cx->sched, i) + 1 - j0; /* keys [lo, hi) */
    lo = lo < 0 ? 0 : lo > n ? n : lo;
    hi = hi < lo ? lo : hi > n ? n : hi;
    fa_hide_row(isa, srow, NULL, lo);
    fa_hide_row(isa, srow + hi, NULL, n - hi);
    if (!v->kinds) return;
    for (int64_t a = lo, e; a < hi; a = e) {
        const int64_t kb = (j0 + a) / v->bk;
        e = (kb + 1) * v->bk - j0 < hi ? (kb + 1) * v->bk - j0 : hi;
        const int kind = fa_sched_mask_block(v, i / v->bq, kb);
        if (kind == FA_TILE_EMPTY) fa_hide_row(isa, srow + a, NULL, e - a);
        else if (kind != FA_TILE_FULL) fa_hide_row(isa, srow + a, fa_sched_mask_row(v, i, kb) + (j0 + a - kb * v->bk), (int)(e - a));
    }
}

/* What a packed k or v buffer holds: keys [j0 + at, j0 + at + keys) of the key tile at j0
 * (keys 0: nothing yet, or overwritten). */
typedef struct {
    int at, keys;
} packed_keys;

/* Makes buf hold keys [j0 + first, j0 + first + nt) of the n-key tile at j0 for a product:
 * kept where it holds them already (a longer prefix will do where the ISA's products take
 * prefixes: prefix), else packed, whole (n keys) where the keys start at the tile's and
 * prefixes will do, so that later tiles of the run reuse it. */
static void pack_keys(void (*pack)(const fa_tile_src *, int, int, void *), int prefix, const fwd_ctx *cx,
                      const void *base, const fa_strides *st, int64_t b, int64_t hk, int64_t j0, int n, int first,
                      int nt, int cols, void *buf, packed_keys *held) {
    if (held->keys && held->at == first && (prefix ? held->keys >= nt : held->keys == nt)) return;
    const int whole = prefix && first == 0;
    const fa_tile_src src = tile_src(cx, base, st, b, hk, j0 + first);
    pack(&src, whole ? n : nt, cols, buf);
    held->at = first, held->keys = whole ? n : nt;
}

/* Writes one row of o: acc row times inv, in the output dtype (bf16 through the
 * branch-free rounding: the same bits as fa_store). */
static void store_row(const fa_isa *isa, fa_dtype t, void *o, int64_t ob, int64_t os, const float *arow, float inv,
                      int64_t dv) {
    if (t == FA_BF16 && os == 1 && isa->store_bf16) {
        isa->store_bf16((uint16_t *)o + ob, arow, inv, (int)dv);
    } else if (t == FA_BF16 && os == 1) { /* contiguous: the same loop, which then vectorizes */
        uint16_t *restrict dst = (uint16_t *)o + ob;
        for (int64_t c = 0; c < dv; c++) {
            const float y = fa_vround_bf16(arow[c] * inv);
            uint32_t u;
            memcpy(&u, &y, sizeof u);
            dst[c] = (uint16_t)(u >> 16);
        }
    } else if (t == FA_BF16) {
        uint16_t *dst = (uint16_t *)o + ob;
        for (int64_t c = 0; c < dv; c++) {
            const float y = fa_vround_bf16(arow[c] * inv);
            uint32_t u;
            memcpy(&u, &y, sizeof u);
            dst[c * os] = (uint16_t)(u >> 16);
        }
    } else {
        for (int64_t c = 0; c < dv; c++) fa_store(t, o, ob + c * os, arow[c] * inv);
    }
}

/* One work item: the query tiles [qt0, qt1) of (b, h). */
static void forward_item(const fwd_ctx *call, const fwd_scratch *sc, int64_t b, int64_t h, int64_t qt0, int64_t qt1,
                         fa_counts *cnt) {
    fwd_ctx item = *call; /* the scores with this (b, h)'s view of the mask (scores.h) */
    item.sc = fa_score_ctx_at(&call->sc, b, h);
    const fwd_ctx *cx = &item;
    const struct fa_plan *pl = cx->pl;
    const fa_problem *p = cx->p;
    const fa_isa *isa = cx->isa;
    const fa_forward_args *a = cx->a;
    const int64_t D = p->head_dim, Dv = p->head_dim_v, hk = h / cx->group;
    const int lds = (int)cx->bk, sl = (int)cx->slice; /* rows per slice of a pair (0: whole pairs) */
    int64_t k0[FWD_RUN], k1[FWD_RUN], lo = INT64_MAX, hi = 0;

    for (int64_t t = 0; t < qt1 - qt0; t++) {
        const int64_t r0 = (qt0 + t) * cx->bq;
        const int m = (int)(p->seq_q - r0 < cx->bq ? p->seq_q - r0 : cx->bq);
        float *M = sc->m + t * sc->ml_pitch, *L = sc->l + t * sc->ml_pitch;
        for (int r = 0; r < m; r++) {
            M[r] = -INFINITY;
            L[r] = 0.0f;
        }
        memset(sc->acc + t * sc->acc_pitch, 0, (size_t)m * (size_t)Dv * sizeof(float));
        fa_sched_key_tiles(&cx->sched, r0, r0 + m, cx->bk, &k0[t], &k1[t]);
        fa_sched_mask_narrow_key_tiles(&cx->sc.mask, r0, r0 + m, cx->bk, &k0[t], &k1[t]); /* only empty pairs cut */
        if (k0[t] < k1[t]) {
            fa_tile_src qs = tile_src(cx, a->q, &p->q_stride, b, h, r0);
            isa->pack_a(&qs, m, (int)D, sc->qp + t * sc->qp_pitch);
            lo = k0[t] < lo ? k0[t] : lo;
            hi = k1[t] > hi ? k1[t] : hi;
        }
    }
    for (int64_t kt = lo; kt < hi; kt++) {
        const int64_t j0 = kt * cx->bk;
        const int n = (int)(p->seq_k - j0 < cx->bk ? p->seq_k - j0 : cx->bk);
        /* the run's tiles that compute this key tile: in their key tiles, and not emptied by
         * the mask (schedule_mask.h) */
        int run_tile[FWD_RUN], kind[FWD_RUN], first[FWD_RUN], keys[FWD_RUN], any = 0;
        for (int64_t t = 0; t < qt1 - qt0; t++) {
            const int64_t r0 = (qt0 + t) * cx->bq, r1 = r0 + cx->bq < p->seq_q ? r0 + cx->bq : p->seq_q;
            /* fa_plan_tile_kind, with this call's schedule and this (b, h)'s mask view at hand */
            kind[t] = kt >= k0[t] && kt < k1[t] ? fa_sched_mask_tile_kind(&cx->sched, &cx->sc.mask, r0, r1, j0, j0 + n)
                                                : FA_TILE_EMPTY;
            run_tile[t] = kt >= k0[t] && kt < k1[t] && (!p->mask || kind[t] != FA_TILE_EMPTY);
            /* under a mask, the keys from the first to the last one a row may see (schedule_mask.h) */
            int64_t f = j0;
            keys[t] = run_tile[t] ? (int)fa_sched_mask_key_span(&cx->sched, &cx->sc.mask, r0, r1, j0, j0 + n, &f) : n;
            first[t] = (int)(f - j0);
            any |= run_tile[t];
        }
        if (!any) continue;
        const fa_tile_src vs = tile_src(cx, a->v, &p->v_stride, b, hk, j0);
        /* k and v packed when a tile first needs them, again only where a tile of the run
         * computes other keys (pack_keys) */
        packed_keys kp_held = {0, 0}, vp_held = {0, 0};
        /* inf or NaN in v must not reach rows that cannot see its key (guard.h): checked once
         * per key tile, and only if a query tile here can hide a key (-1: not yet) */
        int v_nonfinite = -1;
        for (int64_t t = 0; t < qt1 - qt0; t++) {
            if (!run_tile[t]) continue;
            const int64_t r0 = (qt0 + t) * cx->bq, jf = j0 + first[t]; /* the tile's keys: [jf, jf + nt) */
            const int m = (int)(p->seq_q - r0 < cx->bq ? p->seq_q - r0 : cx->bq), nt = keys[t];
            float *acc = sc->acc + t * sc->acc_pitch, *M = sc->m + t * sc->ml_pitch, *L = sc->l + t * sc->ml_pitch;
            const int guarded = fa_pair_may_hide(pl, kind[t], r0, r0 + m, jf, nt) &&
                                (v_nonfinite < 0 ? (v_nonfinite = fa_tile_nonfinite(&vs, n, (int)Dv)) : v_nonfinite);
            const int pairs = cx->pairs && !guarded;
            /* a full tile's rows are all plain (fa_score_plain): no per-row test then; a
             * partial one's rows go to hidden_scale_max directly when the scores only hide */
            const int tile_plain = cx->hide_only && kind[t] == FA_TILE_FULL;
            pack_keys(isa->pack_bt, isa->bt_prefix, cx, a->k, &p->k_stride, b, hk, j0, n, first[t], nt, (int)D, sc->kp,
                      &kp_held);
            /* the pair's rows in slices (the plan's fwd_slice; one slice of every row and key
             * without), each over the keys its rows may see (fa_sched_mask_slice_keys; 0: none),
             * the products in one ragged call (isa.h, gemm_abt_rows) */
            int ns[FWD_MAX_SLICES], slices = 1, whole = 1;
            ns[0] = nt;
            if (cx->slice && kind[t] != FA_TILE_FULL) {
                slices = (m + sl - 1) / sl;
                for (int i = 0; i < slices; i++) {
                    const int64_t a0 = r0 + (int64_t)i * sl, a1 = a0 + sl < r0 + m ? a0 + sl : r0 + m;
                    ns[i] = (int)fa_sched_mask_slice_keys(&cx->sched, &cx->sc.mask, a0, a1, jf, nt);
                    whole &= ns[i] == nt;
                }
            }
            if (whole) slices = 1, ns[0] = nt;
            const int sl_m = slices == 1 ? m : sl; /* the rows of each slice */
            if (slices == 1 && ns[0]) isa->gemm_abt(m, ns[0], (int)D, sc->qp + t * sc->qp_pitch, sc->kp, sc->s, lds);
            else if (slices > 1) isa->gemm_abt_rows(m, ns, (int)D, sc->qp + t * sc->qp_pitch, sc->kp, sc->s, lds);
            /* raw: p straight from the raw products as the ISA's pairs (the max of the scaled
             * products is the max product, scaled: scale > 0) */
            const int raw = pairs && cx->sc.scale > 0.0f && cx->hide_only;
            const float pair_scale = raw ? cx->sc.scale : pairs ? 1.0f : 0.0f;
            const fa_tile_src vf = tile_src(cx, a->v, &p->v_stride, b, hk, jf);
            int ran = 0; /* some slice computed keys */
            for (int i = 0; i < slices; i++) {
                const int a0 = i * sl_m, ms = m - a0 < sl_m ? m - a0 : sl_m, nsl = ns[i];
                if (!nsl) continue; /* no row of the slice sees a key of the pair */
                ran = 1;
                float *s0 = sc->s + (int64_t)a0 * lds, *acc0 = acc + (int64_t)a0 * Dv;
                for (int g0 = a0; g0 < a0 + ms; g0 += FA_SOFTMAX_GROUP) {
                    const int g = a0 + ms - g0 < FA_SOFTMAX_GROUP ? a0 + ms - g0 : FA_SOFTMAX_GROUP;
                    float mt[FA_SOFTMAX_GROUP], base[FA_SOFTMAX_GROUP], alpha[FA_SOFTMAX_GROUP];
                    for (int r = g0; r < g0 + g; r++) {
                        float *srow = sc->s + (int64_t)r * lds;
                        if (raw) {
                            if (!tile_plain && !fa_score_plain(&cx->sc, r0 + r, jf, nsl))
                                hide_keys(cx, r0 + r, jf, nsl, srow);
                            mt[r - g0] = isa->max_row(srow, nsl) * cx->sc.scale;
                        } else {
                            mt[r - g0] = tile_plain     ? fa_scale_max(srow, nsl, cx->sc.scale)
                                         : cx->hide_only ? hidden_scale_max(cx, r0 + r, jf, nsl, srow)
                                                         : fa_score_row_max(&cx->sc, b, h, r0 + r, jf, nsl, srow);
                        }
                    }
                    fa_softmax_bases(isa, g, mt, M + g0, base, alpha);
                    for (int r = g0; r < g0 + g; r++)
                        fa_softmax_finish(isa, p->dtype, Dv, sc->s + (int64_t)r * lds, nsl, base[r - g0], alpha[r - g0],
                                          &L[r], acc + r * Dv, pair_scale);
                }
                /* dropout: the dropped p zeroed after their sums went into l (lse stays
                 * undropped); o gets its 1 / (1 - p) when it is written */
                if (cx->drop.on)
                    fa_dropout_apply(isa, &cx->drop, pl->batch0 + b, h, r0 + a0, ms, jf, nsl, s0, lds, 1.0f, pairs);
                /* O += P V a slice at a time, except for the bf16 pairs: all slices at once below
                 * (v packed after the exps, which read S while it is in cache) */
                if (guarded) {
                    fa_gemm_pb_guarded(isa, ms, nsl, (int)Dv, s0, lds, &vf, sc->vp, acc0, (int)Dv);
                } else if (!pairs) {
                    pack_keys(isa->pack_b, isa->b_prefix, cx, a->v, &p->v_stride, b, hk, j0, n, first[t], nt, (int)Dv,
                              sc->vp, &vp_held);
                    isa->gemm_pb(ms, nsl, (int)Dv, s0, lds, sc->vp, acc0, (int)Dv);
                }
                const int64_t mn = (int64_t)ms * nsl;
                cnt->flops += 2 * mn * (D + Dv);
                cnt->transcendentals += mn + ms + (cx->sc.softcap > 0.0f ? mn : 0);
            }
            if (guarded) {
                vp_held.keys = 0; /* the guarded product packed runs of v into vp */
            } else if (pairs && ran) {
                pack_keys(isa->pack_b, isa->b_prefix, cx, a->v, &p->v_stride, b, hk, j0, n, first[t], nt, (int)Dv,
                          sc->vp, &vp_held);
                const uint32_t *pp = (const uint32_t *)sc->s;
                if (slices > 1) isa->gemm_pb_pairs_rows(m, ns, (int)Dv, pp, lds, sc->vp, acc, (int)Dv);
                else isa->gemm_pb_pairs(m, ns[0], (int)Dv, pp, lds, sc->vp, acc, (int)Dv);
            }
        }
    }

    /* o = acc / l and lse = m + log(l). A row that saw no key has l = 0: o = 0, lse = -inf.
     * NaN or +inf among its visible scores makes l NaN: o = NaN, lse = NaN (docs/nonfinite.md). */
    for (int64_t t = 0; t < qt1 - qt0; t++) {
        const int64_t r0 = (qt0 + t) * cx->bq;
        const int m = (int)(p->seq_q - r0 < cx->bq ? p->seq_q - r0 : cx->bq);
        const float *acc = sc->acc + t * sc->acc_pitch, *M = sc->m + t * sc->ml_pitch, *L = sc->l + t * sc->ml_pitch;
        for (int r = 0; r < m; r++) {
            const int64_t i = r0 + r;
            float l = L[r], mx = M[r];
            /* sinks.h: once per row, after every key; alpha rescales acc to the new max */
            const float alpha = p->has_sinks ? fa_sink_fold(a->sinks[h], &mx, &l) : 1.0f;
            const float lse = mx + logf(l);
            const float inv = (l > 0.0f ? alpha / l : l == 0.0f ? 0.0f : NAN) * (cx->drop.on ? cx->drop.scale : 1.0f);
            const int64_t ob = fa_offset(&p->o_stride, b, h, i, 0);
            store_row(isa, p->dtype, a->o, ob, p->o_stride.s[3], acc + r * Dv, inv, Dv);
            if (a->lse) a->lse[fa_lse_index(pl, b, h, i)] = l > 0.0f ? lse : l == 0.0f ? -INFINITY : NAN;
        }
        cnt->transcendentals += m * (p->has_sinks ? 2 : 1);
    }
}

/* The arguments and the workspace size were checked at the entry (args.c). */
fa_status fa_cpu_forward(const struct fa_plan *pl, const fa_forward_args *a) {
    const fa_problem *p = &pl->p;

    const int threads = fa_call_threads(pl);
    const int64_t per_thread = fa_cpu_forward_scratch_bytes(pl);
    const int64_t need = per_thread * threads;
    char *ws = a->workspace;
    void *owned = NULL;
    if (!ws) {
        owned = fa_malloc((size_t)need);
        if (!owned)
            return fa_error(FA_ERR_NO_MEMORY, "fa_forward: cannot allocate %lld bytes of workspace (%d threads x %lld)",
                            (long long)need, threads, (long long)per_thread);
        ws = owned;
    }

    fwd_ctx cx;
    cx.pl = pl;
    cx.p = p;
    cx.isa = plan_isa(pl);
    cx.a = a;
    tile_edges(pl, &cx.bq, &cx.bk);
    cx.group = p->heads_q / p->heads_kv;
    cx.slice = pl->fwd_slice;
    cx.esz = fa_dtype_size(p->dtype);
    cx.sc = fa_score_ctx_make(pl, a->bias, a->alibi_slopes, a->q_segment_ids, a->kv_segment_ids);
    cx.sched = fa_plan_sched(pl);
    cx.pairs = p->dtype == FA_BF16 && cx.isa->exp_pairs && cx.isa->max_row && cx.isa->gemm_pb_pairs;
    cx.drop = fa_plan_dropout(pl);
    cx.hide_only = !(p->softcap > 0.0f) && !p->has_bias && !p->has_alibi && !p->has_segment_ids;

    const int64_t qtiles = (p->seq_q + cx.bq - 1) / cx.bq, run = run_length(pl, cx.bq);
    const int64_t runs = (qtiles + run - 1) / run, items = p->batch * p->heads_q * runs;
    fa_counts_sum sum;
    fa_counts_sum_init(&sum, 0, 0);
    fa_progress progress;
    fa_progress_init(&progress, a->progress, a->progress_ctx, p->batch * p->heads_q * qtiles); /* query tiles */
#pragma omp parallel num_threads(threads)
    {
        const fwd_scratch sc = carve_scratch(pl, ws + (int64_t)omp_get_thread_num() * per_thread);
        fa_counts cnt = {0, 0};
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            /* last query tiles first: under causal masks they carry the most keys */
            const int64_t qr = runs - 1 - it % runs, bh = it / runs;
            const int64_t qt1 = (qr + 1) * run < qtiles ? (qr + 1) * run : qtiles;
            forward_item(&cx, &sc, bh / p->heads_q, bh % p->heads_q, qr * run, qt1, &cnt);
            fa_progress_step(&progress, qt1 - qr * run);
        }
        fa_counts_sum_add(&sum, &cnt);
    }
    fa_free(owned);
    const fa_counts total = fa_counts_sum_get(&sum);
    fa_counts_report(a->counts, total.flops, total.transcendentals);
    return FA_OK;
}
