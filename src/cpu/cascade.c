/* The shared prefix's pass of a cascade decode (docs/semantics.md, "Shared prefixes").
 *
 * Every sequence attends to the same P prefix keys before its own cache, so the prefix is
 * read once per call. Work items are (chunk of prefix keys (cas_chunk), kv head): an
 * item packs the R = B x (Hq / Hk) x seq_q rows of every sequence's query heads on that
 * head once, in blocks of cas_block(pl) rows, then walks the chunk's tiles of
 * cas_tile(pl) keys (a dense attention of R rows over the prefix), each packed once and
 * met by every block (so it stays in cache across them), the next one prefetched.
 * The rows' scores and online-softmax step are the forward's (softmax_row.h), with the bf16
 * pairs where the ISA has them. Each row keeps an online-softmax partial (acc, max, sum) per
 * (chunk, kv head) in the workspace; the decode merge (decode.c) takes them as the first
 * chunks of the row, so prefix and cache combine as one softmax, in a fixed order: bits do
 * not depend on the thread count, and a sequence's do not depend on the others (its rows'
 * partials are its own; the products compute each element alone; one exception: a prefix
 * v tile holding inf or NaN, where a mask may hide some of its keys from some sequence of
 * a block, sends the whole block through the guarded product, whose sums run in another
 * order, guard.h). Masks are each
 * sequence's over prefix plus cache (prefix key j at position j, row i at P + Sk_b - seq_q
 * + i), applied element by element by the score rule (scores.h); every prefix tile is
 * computed for every row. */
#include "guard.h"
#include "counts_sum.h"
#include "isa.h"
#include "scores.h"
#include "softmax_row.h"
#include "vexp.h"

#include <omp.h>
#include <string.h>

#define CASCADE_ALIGN 64

static int64_t cas_align(int64_t x) { return (x + CASCADE_ALIGN - 1) / CASCADE_ALIGN * CASCADE_ALIGN; }

static const fa_isa *cas_isa(const struct fa_plan *pl) { return pl->isa ? pl->isa : &fa_isa_scalar; }

static int64_t cas_rows(const fa_problem *p) { return p->batch * (p->heads_q / p->heads_kv) * p->seq_q; }

/* Keys per chunk (a work item's keys, per kv head): FA_DECODE_CHUNK, doubled up to 4096
 * while the prefix still makes at least 64 items (chunks x Hk): fewer partials to write
 * and merge. From the shapes alone, so that bits do not depend on the thread count. */
static int64_t cas_chunk(const struct fa_plan *pl) {
    const int64_t P = pl->p.shared_prefix_len, Hk = pl->p.heads_kv;
    int64_t ch = FA_DECODE_CHUNK;
    while (ch < 4096 && (P + 2 * ch - 1) / (2 * ch) * Hk >= 64) ch *= 2;
    return ch;
}

/* Rows per block: the forward's open query tile for the dtype (isa.h's tiles), so that the
 * score block (rows x tile keys) is the size the kernels were tuned at. */
static int64_t cas_block(const struct fa_plan *pl) {
    const fa_isa_tiles *t = cas_isa(pl)->tiles;
    return pl->p.dtype == FA_BF16 ? t->bf16_open_bq : t->open_bq;
}

/* Keys per prefix tile: the most whose score block (block rows x keys, f32) stays within
 * 256 KiB (the forward's open bf16 tile: its L2 budget), from the ISA's long-key tile (a
 * prefix is a long key sequence) up to a chunk; more keys spread each row's per-tile work
 * (its score rule, rescale, the kernels' calls) over more of them. */
static int64_t cas_tile(const struct fa_plan *pl) {
    const int64_t ch = cas_chunk(pl), rb = cas_block(pl);
    int64_t t = cas_isa(pl)->tiles->long_bk;
    while (2 * t <= ch && rb * 2 * t * (int64_t)sizeof(float) <= 256 * 1024) t *= 2;
    return t < ch ? t : ch;
}

int64_t fa_cascade_chunks(const struct fa_plan *pl) {
    return (pl->p.shared_prefix_len + cas_chunk(pl) - 1) / cas_chunk(pl);
}

int64_t fa_cascade_tiles(const struct fa_plan *pl) {
    const int64_t P = pl->p.shared_prefix_len, CH = cas_chunk(pl), T = cas_tile(pl);
    return P / CH * ((CH + T - 1) / T) + (P % CH + T - 1) / T;
}

/* Scratch of one thread: q rows staged (one block, the dtype), every block of one kv head
 * packed, the k and v tiles packed, one block's scores. */
static void cas_sizes(const struct fa_plan *pl, int64_t sz[5]) {
    const fa_problem *p = &pl->p;
    const fa_isa *isa = cas_isa(pl);
    const int64_t R = cas_rows(p), T = cas_tile(pl), RB = cas_block(pl), blocks = (R + RB - 1) / RB;
    sz[0] = RB * p->head_dim * (int64_t)fa_dtype_size(p->dtype);
    sz[1] = blocks * cas_align(isa->packed_bytes(RB, p->head_dim, p->dtype));
    sz[2] = isa->packed_bytes(T, p->head_dim, p->dtype);
    sz[3] = isa->packed_bytes(T, p->head_dim_v, p->dtype);
    sz[4] = RB * T * (int64_t)sizeof(float);
}

static int64_t cas_scratch_bytes(const struct fa_plan *pl) {
    int64_t sz[5], total = CASCADE_ALIGN;
    cas_sizes(pl, sz);
    for (int i = 0; i < 5; i++) total += cas_align(sz[i]);
    return total;
}

int64_t fa_cascade_partial_floats(const struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    return fa_cascade_chunks(pl) * p->heads_kv * cas_rows(p) * (p->head_dim_v + 2);
}

/* In 128 bits and clamped, so that a plan too large to run reports the overflow (the cost
 * model's narrowing) instead of wrapping; the same sum as cas_scratch_bytes' carve-up. */
int64_t fa_cascade_workspace_bytes(const struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    if (!p->shared_prefix_len) return 0;
    typedef __int128 wide;
    const fa_isa *isa = cas_isa(pl);
    const int64_t T = cas_tile(pl), RB = cas_block(pl);
    const wide R = (wide)p->batch * (p->heads_q / p->heads_kv) * p->seq_q, blocks = (R + RB - 1) / RB;
    const wide scratch = CASCADE_ALIGN + cas_align(RB * p->head_dim * (int64_t)fa_dtype_size(p->dtype)) +
                         blocks * cas_align(isa->packed_bytes(RB, p->head_dim, p->dtype)) +
                         cas_align(isa->packed_bytes(T, p->head_dim, p->dtype)) +
                         cas_align(isa->packed_bytes(T, p->head_dim_v, p->dtype)) + cas_align(RB * T * 4);
    const wide partials = (wide)fa_cascade_chunks(pl) * p->heads_kv * R * (p->head_dim_v + 2) * 4;
    /* last: each sequence's view of the masks (cas_view), aligned */
    const wide views = CASCADE_ALIGN + (wide)p->batch * (wide)sizeof(struct fa_plan);
    const wide total = partials + (wide)pl->threads * scratch + views;
    return total > INT64_MAX ? INT64_MAX : (int64_t)total;
}

typedef struct {
    const struct fa_plan *pl;
    const fa_problem *p;
    const fa_isa *isa;
    const fa_forward_args *a;
    const struct fa_plan *views; /* per sequence: its masks over prefix plus cache */
    size_t esz;
    int64_t R, M, T, RB, group;
    int pairs; /* p goes to the PV product as the ISA's bf16 pairs (isa.h), as in the forward */
    float *partials;
} cas_ctx;

/* Packs rows [r0, r0 + m) of kv head hk (row r: sequence r / M, query head hk * group +
 * r % M / Sq, token r % Sq: decode.c's row order per sequence) into qp, through stage. */
static void cas_pack_q(const cas_ctx *cx, int64_t hk, int64_t r0, int64_t m, char *stage, void *qp) {
    const fa_problem *p = cx->p;
    const int64_t D = p->head_dim, Sq = p->seq_q, es = (int64_t)cx->esz;
    for (int64_t r = r0; r < r0 + m; r++) {
        const int64_t b = r / cx->M, h = hk * cx->group + r % cx->M / Sq, i = r % Sq;
        const char *src = (const char *)cx->a->q + fa_offset(&p->q_stride, b, h, i, 0) * es;
        char *dst = stage + (r - r0) * D * es;
        if (p->q_stride.s[3] == 1) memcpy(dst, src, (size_t)(D * es));
        else
            for (int64_t d = 0; d < D; d++) memcpy(dst + d * es, src + d * p->q_stride.s[3] * es, (size_t)es);
    }
    const fa_tile_src qs = {stage, p->dtype, D, 1};
    cx->isa->pack_a(&qs, (int)m, (int)D, qp);
}

/* One block of rows [r0, r0 + m) against the packed tile at keys j0 .. j0 + n - 1: the
 * scores, each row's softmax step, then acc += p V (guarded where a mask may hide a key of
 * a tile whose v holds inf or NaN; *nonfinite: -1 until that is read). Returns 1 if the
 * guarded product packed runs of v into vp (to be packed again). */
static int cas_block_step(const cas_ctx *cx, int64_t hk, int64_t r0, int m, int64_t j0, int n, const void *qp,
                          const void *kp, void *vp, const fa_tile_src *vs, float *s, int *nonfinite, float *part) {
    const fa_problem *p = cx->p;
    const fa_isa *isa = cx->isa;
    const int64_t Dv = p->head_dim_v, Sq = p->seq_q, M = cx->M, T = cx->T;
    float *mx = part + cx->R * Dv, *sum = mx + cx->R;
    isa->gemm_abt(m, n, (int)p->head_dim, qp, kp, s, (int)T);
    int hide = 0;
    for (int64_t b = r0 / M; b <= (r0 + m - 1) / M && !hide; b++) hide = fa_tile_may_hide(&cx->views[b], 0, Sq, j0, n);
    const int guarded = hide && (*nonfinite < 0 ? (*nonfinite = fa_tile_nonfinite(vs, n, (int)Dv)) : *nonfinite);
    const int pairs = cx->pairs && !guarded;
    int64_t sc_b = r0 / M;
    fa_score_ctx sc = fa_score_ctx_make(&cx->views[sc_b], NULL, cx->a->alibi_slopes, NULL, NULL);
    /* rows in groups, as the forward's (softmax_row.h): maxima, then the group's bases
     * together, then each row's exps */
    for (int64_t g0 = r0; g0 < r0 + m; g0 += FA_SOFTMAX_GROUP) {
        const int g = (int)(r0 + m - g0 < FA_SOFTMAX_GROUP ? r0 + m - g0 : FA_SOFTMAX_GROUP);
        float mt[FA_SOFTMAX_GROUP], ps[FA_SOFTMAX_GROUP], base[FA_SOFTMAX_GROUP], alpha[FA_SOFTMAX_GROUP];
        for (int64_t r = g0; r < g0 + g; r++) {
            const int64_t b = r / M, h = hk * cx->group + r % M / Sq, i = r % Sq;
            if (b != sc_b) sc = fa_score_ctx_make(&cx->views[b], NULL, cx->a->alibi_slopes, NULL, NULL), sc_b = b;
            float *srow = s + (r - r0) * T;
            if (pairs && sc.scale > 0.0f && fa_score_plain(&sc, i, j0, n)) {
                /* the max of the scaled products is the max product, scaled (scale > 0) */
                mt[r - g0] = isa->max_row(srow, n) * sc.scale, ps[r - g0] = sc.scale;
            } else {
                mt[r - g0] = fa_score_row_max(&sc, 0, h, i, j0, n, srow), ps[r - g0] = pairs ? 1.0f : 0.0f;
            }
        }
        fa_softmax_bases(isa, g, mt, mx + g0, base, alpha);
        for (int64_t r = g0; r < g0 + g; r++)
            fa_softmax_finish(isa, p->dtype, Dv, s + (r - r0) * T, n, base[r - g0], alpha[r - g0], &sum[r],
                              part + r * Dv, ps[r - g0]);
    }
    if (guarded) {
        fa_gemm_pb_guarded(isa, m, n, (int)Dv, s, (int)T, vs, vp, part + r0 * Dv, (int)Dv);
        return 1;
    }
    if (pairs) isa->gemm_pb_pairs(m, n, (int)Dv, (const uint32_t *)s, (int)T, vp, part + r0 * Dv, (int)Dv);
    else isa->gemm_pb(m, n, (int)Dv, s, (int)T, vp, part + r0 * Dv, (int)Dv);
    return 0;
}

/* Prefix chunk c, kv head hk: keys [k0, k1) for every row. */
static void cas_item(const cas_ctx *cx, char *scratch, int64_t c, int64_t hk, int64_t k0, int64_t k1,
                     fa_counts *cnt) {
    const fa_problem *p = cx->p;
    const fa_isa *isa = cx->isa;
    const int64_t R = cx->R, T = cx->T, RB = cx->RB, D = p->head_dim, Dv = p->head_dim_v;
    const int64_t Hk = p->heads_kv, es = (int64_t)cx->esz, blocks = (R + RB - 1) / RB;
    int64_t sz[5];
    cas_sizes(cx->pl, sz);
    char *stage = scratch, *qp = stage + cas_align(sz[0]), *kp = qp + cas_align(sz[1]), *vp = kp + cas_align(sz[2]);
    float *s = (float *)(vp + cas_align(sz[3]));
    const int64_t qblock = cas_align(isa->packed_bytes(RB, D, p->dtype));
    float *part = cx->partials + (c * Hk + hk) * R * (Dv + 2);
    memset(part, 0, sizeof(float) * (size_t)(R * Dv));
    for (int64_t r = 0; r < R; r++) part[R * Dv + r] = -INFINITY, part[R * Dv + R + r] = 0.0f;
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t r0 = blk * RB;
        cas_pack_q(cx, hk, r0, R - r0 < RB ? R - r0 : RB, stage, qp + blk * qblock);
    }
    for (int64_t j0 = k0; j0 < k1; j0 += T) {
        const int n = (int)(k1 - j0 < T ? k1 - j0 : T);
        const fa_tile_src ks = {(const char *)cx->a->k_prefix + (j0 * Hk + hk) * D * es, p->dtype, Hk * D, 1};
        const fa_tile_src vs = {(const char *)cx->a->v_prefix + (j0 * Hk + hk) * Dv * es, p->dtype, Hk * Dv, 1};
        isa->pack_bt(&ks, n, (int)D, kp);
        isa->pack_b(&vs, n, (int)Dv, vp);
        /* the next tile's rows of this head lie Hk rows apart, a stride the hardware
         * prefetchers do not follow: fetched into L2 while this tile computes */
        for (int64_t j = j0 + n; j < (j0 + n + T < k1 ? j0 + n + T : k1); j++) {
            const char *kr = (const char *)cx->a->k_prefix + (j * Hk + hk) * D * es;
            const char *vr = (const char *)cx->a->v_prefix + (j * Hk + hk) * Dv * es;
            for (int64_t x = 0; x < D * es; x += 64) __builtin_prefetch(kr + x, 0, 2);
            for (int64_t x = 0; x < Dv * es; x += 64) __builtin_prefetch(vr + x, 0, 2);
        }
        int nonfinite = -1, vp_repack = 0; /* the v tile read for inf or NaN only where a mask hides some key */
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t r0 = blk * RB;
            const int m = (int)(R - r0 < RB ? R - r0 : RB);
            if (vp_repack) isa->pack_b(&vs, n, (int)Dv, vp);
            vp_repack = cas_block_step(cx, hk, r0, m, j0, n, qp + blk * qblock, kp, vp, &vs, s, &nonfinite, part);
        }
        cnt->flops += 2 * R * n * (D + Dv);
        cnt->transcendentals += R * n * (p->softcap > 0.0f ? 2 : 1) + R;
    }
}

/* Sequence b's masks over prefix plus cache, as a dense view (scores.h reads them). */
static void cas_view(const struct fa_plan *pl, int64_t b, struct fa_plan *v) {
    *v = *pl;
    const int64_t sk = pl->p.shared_prefix_len + fa_decode_keys(pl, b);
    v->p.seq_k = sk;
    v->off = sk - pl->p.seq_q; /* bottom-right: diagonal offsets are refused with a prefix */
}

fa_status fa_cpu_cascade_prefix(const struct fa_plan *pl, const fa_forward_args *a, char *ws, fa_counts *cnt) {
    const fa_problem *p = &pl->p;
    /* the views lie in the workspace, after the threads' scratch (fa_cascade_workspace_bytes) */
    char *after = ws + fa_cascade_partial_floats(pl) * (int64_t)sizeof(float) +
                  (int64_t)pl->threads * cas_scratch_bytes(pl);
    struct fa_plan *views =
        (struct fa_plan *)(after + (CASCADE_ALIGN - (uintptr_t)after % CASCADE_ALIGN) % CASCADE_ALIGN);
    for (int64_t b = 0; b < p->batch; b++) cas_view(pl, b, &views[b]);
    const fa_isa *isa = cas_isa(pl);
    cas_ctx cx = {pl, p, isa, a, views, fa_dtype_size(p->dtype), cas_rows(p), p->heads_q / p->heads_kv * p->seq_q,
                  cas_tile(pl), cas_block(pl), p->heads_q / p->heads_kv,
                  p->dtype == FA_BF16 && isa->exp_pairs && isa->max_row && isa->gemm_pb_pairs, (float *)ws};
    const int64_t Hk = p->heads_kv, items = fa_cascade_chunks(pl) * Hk, P = p->shared_prefix_len;
    const int64_t scratch = cas_scratch_bytes(pl), CH = cas_chunk(pl);
    char *scratch_base = ws + fa_cascade_partial_floats(pl) * (int64_t)sizeof(float);
    fa_counts_sum sum;
    fa_counts_sum_init(&sum, 0, 0);
#pragma omp parallel num_threads(fa_call_threads(pl))
    {
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch;
        mine += (CASCADE_ALIGN - (uintptr_t)mine % CASCADE_ALIGN) % CASCADE_ALIGN;
        fa_counts c = {0, 0};
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t ch = it / Hk, k0 = ch * CH;
            cas_item(&cx, mine, ch, it % Hk, k0, k0 + CH < P ? k0 + CH : P, &c);
        }
        fa_counts_sum_add(&sum, &c);
    }
    const fa_counts total = fa_counts_sum_get(&sum);
    cnt->flops += total.flops;
    cnt->transcendentals += total.transcendentals;
    return FA_OK;
}
