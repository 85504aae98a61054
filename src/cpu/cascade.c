/* The shared prefix's pass of a cascade decode (docs/semantics.md, "Shared prefixes").
 *
 * Every sequence attends to the same P prefix keys before its own cache, so the prefix is
 * read once per call: work items are chunks of FA_DECODE_CHUNK prefix keys; an item walks
 * its chunk's tiles (fa_decode_tile keys), and for each tile and kv head computes the
 * R = B x (Hq / Hk) x seq_q rows of every sequence's query heads on that head, in blocks of
 * CASCADE_ROWS rows against the tile packed once (so the tile stays in cache across the
 * blocks). Each row keeps an online-softmax partial (acc, max, sum) per (chunk, kv head) in
 * the workspace; the decode merge (decode.c) takes them as the first chunks of the row, so
 * prefix and cache combine as one softmax, in a fixed order: bits do not depend on the
 * thread count, and a sequence's do not depend on the others (its rows' partials are its
 * own). Masks are each sequence's over prefix plus cache (prefix key j at position j, row i
 * at P + Sk_b - seq_q + i), applied element by element by the score rule (scores.h); every
 * prefix tile is computed for every row. */
#include "guard.h"
#include "isa.h"
#include "scores.h"
#include "vexp.h"

#include <omp.h>
#include <string.h>

#define CASCADE_ROWS 128 /* rows per block: the score block (rows x tile keys) stays in L1/L2 */
#define CASCADE_ALIGN 64

static int64_t cas_align(int64_t x) { return (x + CASCADE_ALIGN - 1) / CASCADE_ALIGN * CASCADE_ALIGN; }

static const fa_isa *cas_isa(const struct fa_plan *pl) { return pl->isa ? pl->isa : &fa_isa_scalar; }

static int64_t cas_rows(const fa_problem *p) { return p->batch * (p->heads_q / p->heads_kv) * p->seq_q; }

int64_t fa_cascade_chunks(const struct fa_plan *pl) {
    return (pl->p.shared_prefix_len + FA_DECODE_CHUNK - 1) / FA_DECODE_CHUNK;
}

/* Scratch of one thread: q rows staged (one block, the dtype), every block of every kv head
 * packed, the k and v tiles packed, one block's scores. */
static void cas_sizes(const struct fa_plan *pl, int64_t sz[5]) {
    const fa_problem *p = &pl->p;
    const fa_isa *isa = cas_isa(pl);
    const int64_t R = cas_rows(p), T = fa_decode_tile(p), blocks = (R + CASCADE_ROWS - 1) / CASCADE_ROWS;
    sz[0] = CASCADE_ROWS * p->head_dim * (int64_t)fa_dtype_size(p->dtype);
    sz[1] = p->heads_kv * blocks * cas_align(isa->packed_bytes(CASCADE_ROWS, p->head_dim, p->dtype));
    sz[2] = isa->packed_bytes(T, p->head_dim, p->dtype);
    sz[3] = isa->packed_bytes(T, p->head_dim_v, p->dtype);
    sz[4] = CASCADE_ROWS * T * (int64_t)sizeof(float);
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
    const wide R = (wide)p->batch * (p->heads_q / p->heads_kv) * p->seq_q, blocks = (R + CASCADE_ROWS - 1) / CASCADE_ROWS;
    const int64_t T = fa_decode_tile(p);
    const wide scratch = CASCADE_ALIGN + cas_align(CASCADE_ROWS * p->head_dim * (int64_t)fa_dtype_size(p->dtype)) +
                         (wide)p->heads_kv * blocks * cas_align(isa->packed_bytes(CASCADE_ROWS, p->head_dim, p->dtype)) +
                         cas_align(isa->packed_bytes(T, p->head_dim, p->dtype)) +
                         cas_align(isa->packed_bytes(T, p->head_dim_v, p->dtype)) + cas_align(CASCADE_ROWS * T * 4);
    const wide partials = (wide)fa_cascade_chunks(pl) * p->heads_kv * R * (p->head_dim_v + 2) * 4;
    const wide total = partials + (wide)pl->threads * scratch;
    return total > INT64_MAX ? INT64_MAX : (int64_t)total;
}

typedef struct {
    const struct fa_plan *pl;
    const fa_problem *p;
    const fa_isa *isa;
    const fa_forward_args *a;
    const struct fa_plan *views; /* per sequence: its masks over prefix plus cache */
    size_t esz;
    int64_t R, M, T, group;
    float *partials;
} cas_ctx;

/* One row's scores against the tile (raw products in s), then its online-softmax step. */
static void cas_row(const cas_ctx *cx, const fa_score_ctx *sc, float *restrict s, int n, int64_t h, int64_t i,
                    int64_t j0, float *m, float *l, float *restrict acc) {
    const fa_problem *p = cx->p;
    if (fa_score_plain(sc, i, j0, n))
        for (int j = 0; j < n; j++) s[j] *= sc->scale;
    else
        fa_score_row(sc, 0, h, i, j0, n, s, NULL);
    float mt = -INFINITY;
    for (int j = 0; j < n; j++) mt = s[j] > mt ? s[j] : mt;
    const float m_new = *m > mt ? *m : mt, base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = fa_vexpf(*m - base);
    const float rowsum = cx->isa->exp_sum(s, n, base);
    if (p->dtype == FA_BF16)
        for (int j = 0; j < n; j++) s[j] = fa_vround_bf16(s[j]);
    else if (p->dtype == FA_F16)
        for (int j = 0; j < n; j++) s[j] = fa_vround_f16(s[j]);
    *l = *l * alpha + rowsum;
    *m = m_new;
    if (alpha != 1.0f)
        for (int64_t c = 0; c < p->head_dim_v; c++) acc[c] *= alpha;
}

/* Prefix chunk c: keys [k0, k1) for every row and kv head. */
static void cas_item(const cas_ctx *cx, char *scratch, int64_t c, int64_t k0, int64_t k1, fa_counts *cnt) {
    const fa_problem *p = cx->p;
    const fa_isa *isa = cx->isa;
    const int64_t R = cx->R, M = cx->M, T = cx->T, D = p->head_dim, Dv = p->head_dim_v, Sq = p->seq_q;
    const int64_t Hk = p->heads_kv, es = (int64_t)cx->esz, blocks = (R + CASCADE_ROWS - 1) / CASCADE_ROWS;
    int64_t sz[5];
    cas_sizes(cx->pl, sz);
    char *stage = scratch, *qp = stage + cas_align(sz[0]), *kp = qp + cas_align(sz[1]), *vp = kp + cas_align(sz[2]);
    float *s = (float *)(vp + cas_align(sz[3]));
    const int64_t qblock = cas_align(isa->packed_bytes(CASCADE_ROWS, D, p->dtype));
    /* every row of every kv head, packed once per item: row r of head hk is sequence r / M,
     * query head hk * group + r % M / Sq, token r % Sq (decode.c's row order per sequence) */
    for (int64_t hk = 0; hk < Hk; hk++) {
        float *part = cx->partials + (c * Hk + hk) * R * (Dv + 2);
        memset(part, 0, sizeof(float) * (size_t)(R * Dv));
        for (int64_t r = 0; r < R; r++) part[R * Dv + r] = -INFINITY, part[R * Dv + R + r] = 0.0f;
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t r0 = blk * CASCADE_ROWS, m = R - r0 < CASCADE_ROWS ? R - r0 : CASCADE_ROWS;
            for (int64_t r = r0; r < r0 + m; r++) {
                const int64_t b = r / M, h = hk * cx->group + r % M / Sq, i = r % Sq;
                const char *src = (const char *)cx->a->q + fa_offset(&p->q_stride, b, h, i, 0) * es;
                for (int64_t d = 0; d < D; d++)
                    memcpy(stage + ((r - r0) * D + d) * es, src + d * p->q_stride.s[3] * es, (size_t)es);
            }
            const fa_tile_src qs = {stage, p->dtype, D, 1};
            isa->pack_a(&qs, (int)m, (int)D, qp + (hk * blocks + blk) * qblock);
        }
    }
    for (int64_t j0 = k0; j0 < k1; j0 += T) {
        const int n = (int)(k1 - j0 < T ? k1 - j0 : T);
        for (int64_t hk = 0; hk < Hk; hk++) {
            float *part = cx->partials + (c * Hk + hk) * R * (Dv + 2), *mx = part + R * Dv, *sum = mx + R;
            const fa_tile_src ks = {(const char *)cx->a->k_prefix + (j0 * Hk + hk) * D * es, p->dtype, Hk * D, 1};
            const fa_tile_src vs = {(const char *)cx->a->v_prefix + (j0 * Hk + hk) * Dv * es, p->dtype, Hk * Dv, 1};
            isa->pack_bt(&ks, n, (int)D, kp);
            isa->pack_b(&vs, n, (int)Dv, vp);
            int nonfinite = -1; /* the v tile read for inf or NaN only where a mask hides some key */
            for (int64_t blk = 0; blk < blocks; blk++) {
                const int64_t r0 = blk * CASCADE_ROWS, m = R - r0 < CASCADE_ROWS ? R - r0 : CASCADE_ROWS;
                isa->gemm_abt((int)m, n, (int)D, qp + (hk * blocks + blk) * qblock, kp, s, (int)T);
                int hide = 0;
                for (int64_t r = r0; r < r0 + m; r++) {
                    const int64_t b = r / M, h = hk * cx->group + r % M / Sq, i = r % Sq;
                    const fa_score_ctx sc = fa_score_ctx_make(&cx->views[b], NULL, cx->a->alibi_slopes, NULL, NULL);
                    cas_row(cx, &sc, s + (r - r0) * T, n, h, i, j0, &mx[r], &sum[r], part + r * Dv);
                    if (!hide && (r == r0 || r % M == 0)) hide = fa_tile_may_hide(&cx->views[b], 0, Sq, j0, n);
                }
                if (hide && nonfinite < 0) nonfinite = fa_tile_nonfinite(&vs, n, (int)Dv);
                if (hide && nonfinite)
                    fa_gemm_pb_guarded(isa, (int)m, n, (int)Dv, s, (int)T, &vs, vp, part + r0 * Dv, (int)Dv);
                else
                    isa->gemm_pb((int)m, n, (int)Dv, s, (int)T, vp, part + r0 * Dv, (int)Dv);
            }
            cnt->flops += 2 * R * n * (D + Dv);
            cnt->transcendentals += R * n * (p->softcap > 0.0f ? 2 : 1) + R;
        }
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
    struct fa_plan *views = fa_malloc(sizeof *views * (size_t)p->batch);
    if (!views) return fa_error(FA_ERR_NO_MEMORY, "fa_forward: cannot allocate the shared prefix's %lld sequence views",
                                (long long)p->batch);
    for (int64_t b = 0; b < p->batch; b++) cas_view(pl, b, &views[b]);
    cas_ctx cx = {pl, p, cas_isa(pl), a, views, fa_dtype_size(p->dtype), cas_rows(p),
                  p->heads_q / p->heads_kv * p->seq_q, fa_decode_tile(p), p->heads_q / p->heads_kv, (float *)ws};
    const int64_t items = fa_cascade_chunks(pl), P = p->shared_prefix_len, scratch = cas_scratch_bytes(pl);
    char *scratch_base = ws + fa_cascade_partial_floats(pl) * (int64_t)sizeof(float);
    int64_t flops = 0, trans = 0;
#pragma omp parallel num_threads(fa_call_threads(pl)) reduction(+ : flops, trans)
    {
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch;
        mine += (CASCADE_ALIGN - (uintptr_t)mine % CASCADE_ALIGN) % CASCADE_ALIGN;
        fa_counts c = {0, 0};
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t k0 = it * FA_DECODE_CHUNK, k1 = k0 + FA_DECODE_CHUNK < P ? k0 + FA_DECODE_CHUNK : P;
            cas_item(&cx, mine, it, k0, k1, &c);
        }
        flops += c.flops;
        trans += c.transcendentals;
    }
    fa_free(views);
    cnt->flops += flops;
    cnt->transcendentals += trans;
    return FA_OK;
}
