/* The CPU kv-cache decode driver (flash-decoding).
 *
 * Work items are (sequence b, chunk of fa_decode_chunk keys). An item walks its chunk's key
 * tiles (fa_decode_tile keys, never crossing a page); for each tile, each kv head computes
 * the seq_q rows of all Hq / Hk query heads that share it as one M-row tile, so each cache
 * byte is read once per call. Before a tile computes, its rows are read whole in address
 * order (dec_touch): a head's slice of a row is 1 / Hk of it, and reading the cache head
 * by head runs at a fraction of the memory's speed (the hardware prefetchers stream
 * ascending addresses only), while the touched tile then stays in L2 for the heads'
 * passes. A core does not fetch while it computes, so the bf16 kernels also prefetch part
 * of the next tile, a few lines per block of keys (a burst of prefetches, bounded by the
 * core's outstanding misses, measured slower than the touch), and its touch finds those
 * lines in cache. Where the ISA table says so (isa.h, touch_rest: the amx table, whose
 * steps prefetch the whole next tile, and the avx512 table, whose steps prefetch a line of
 * it per line they read: prefetch_per_line), the touch reads only the lines of a tile that
 * the previous tile's prefetches did not reach: on those cores reading the rest again cost
 * more than it saved (bench/RESULTS.md). The tile math is the ISA table's pack and product
 * kernels, or for bf16 caches with AVX512_BF16 kernels that read the rows in place
 * (decode_avx512bf16.c), the whole online-softmax step in one of them where no mask cuts
 * the tile; f16, int8 and fp8 caches (and bf16 ones on tables without that step) take
 * decode_cache*.c's kernels alike (q staged as f32,
 * codes dequantized in registers: docs/caches.md); an online softmax leaves a partial (acc,
 * max, sum) per (item, kv head, row) in the workspace, and a merge combines each row's
 * chunks in chunk order. Chunks, tiles and
 * the merge order come from shapes alone, so results are bit-identical for any thread
 * count. Only rows below a sequence's length are ever read: stale or NaN cache rows beyond
 * it are never touched.
 * Before anything is written, every argument is checked (decode_check.c: block-table
 * entries, the appends' rows, a quantized cache's scales); then k_new/v_new are copied into
 * the caches at rows cache_seqlens[b].. . */
#include "decode_kernels.h"
#include "guard.h"
#include "isa.h"
#include "counts_sum.h"
#include "progress.h"
#include "scores.h"
#include "softmax_row.h"
#include "vexp.h"
#include "../sinks.h"

#include <float.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define DEC_ALIGN 64

static int64_t dec_align(int64_t x) { return (x + DEC_ALIGN - 1) / DEC_ALIGN * DEC_ALIGN; }

static const fa_isa *dec_isa(const struct fa_plan *pl) { return pl->isa ? pl->isa : &fa_isa_scalar; }

/* Rows of one item: query heads of a kv head x new tokens; row r is head r / seq_q, token r % seq_q. */
static int64_t dec_rows(const fa_problem *p) { return p->heads_q / p->heads_kv * p->seq_q; }

/* 1 if the tiles take decode_cache.c's kernels (q staged as f32): quantized caches always,
 * f16 caches with contiguous rows where the ISA has the vector ones, and bf16 caches so
 * where the ISA has no bf16 step (the avx512 table: its f32 multiply-adds, dispatch.c). */
static int dec_conv(const struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    const fa_isa *isa = dec_isa(pl);
    if (fa_dtype_quantized(fa_cache_dtype(p))) return 1;
    const int f32_step = p->dtype == FA_F16 || (p->dtype == FA_BF16 && isa->decode && !isa->decode->step);
    return isa->decode && isa->decode->cache_qk && f32_step && p->k_stride.s[3] == 1 && p->v_stride.s[3] == 1;
}

/* Scratch pieces: q staging (Hq x seq_q rows of D, contiguous, the dtype), packed q (M x D),
 * k, v, scores M x T, the cache step's workspace (isa.h cache_ws). */
#define DEC_PIECES 6
static void dec_sizes(const struct fa_plan *pl, int64_t sz[DEC_PIECES]) {
    const fa_problem *p = &pl->p;
    const fa_isa *isa = dec_isa(pl);
    const int64_t M = dec_rows(p), T = fa_decode_tile(p);
    sz[0] = p->heads_q * p->seq_q * p->head_dim * (int64_t)(dec_conv(pl) ? 4 : fa_dtype_size(p->dtype)); /* every head's rows */
    sz[1] = isa->packed_bytes(M, p->head_dim, p->dtype);
    sz[2] = isa->packed_bytes(T, p->head_dim, p->dtype);
    sz[3] = isa->packed_bytes(T, p->head_dim_v, p->dtype);
    sz[4] = M * T * (int64_t)sizeof(float);
    sz[5] = dec_conv(pl) && isa->decode && isa->decode->cache_ws ? FA_DECODE_CACHE_WS_BYTES : 0;
}

/* The cache step's workspace in a thread's scratch (NULL if the plan's kernels keep none). */
static void *dec_ws(const struct fa_plan *pl, char *scratch) {
    int64_t sz[DEC_PIECES], off = 0;
    dec_sizes(pl, sz);
    for (int i = 0; i < DEC_PIECES - 1; i++) off += dec_align(sz[i]);
    return sz[DEC_PIECES - 1] ? scratch + off : NULL;
}

int64_t fa_cpu_decode_scratch_bytes(const struct fa_plan *pl) {
    int64_t sz[DEC_PIECES], total = DEC_ALIGN;
    dec_sizes(pl, sz);
    for (int i = 0; i < DEC_PIECES; i++) total += dec_align(sz[i]);
    return total;
}

typedef struct {
    const struct fa_plan *pl;
    const fa_problem *p;
    const fa_isa *isa;
    const fa_forward_args *a;
    size_t esz;
    int64_t M, T, group;
    int direct;             /* bf16 rows read in place by decode_avx512bf16.c, no packing */
    int rows_whole;         /* K and V rows are Hk x D contiguous elements, equal in size */
    float *partials;        /* per item: acc M x Dv, then max M, then sum M */
    const int64_t *first;   /* first[b]: index of sequence b's first item */
    float *prefix;          /* a shared prefix's partials (cascade.c), merged first; or NULL */
    fa_dtype ct;            /* the cache's element type, csz bytes */
    size_t csz;
    int conv;               /* dec_conv: f16 / int8 / fp8 tiles, q staged as f32 */
    int prefetch_x;         /* the ISA table's multiple of its steps' prefetches (isa.h), >= 1 */
    int touch_rest;         /* the touch reads only what the last tile's prefetches left (isa.h) */
    int per_line;           /* the steps prefetch a line of the next tile per line read (isa.h) */
} dec_ctx;

/* Where cache row t of sequence b, kv head hk starts (paged or not). */
static fa_tile_src dec_cache_row(const dec_ctx *cx, const void *base, const fa_strides *st, int64_t b, int64_t hk,
                                 int64_t t) {
    const fa_problem *p = cx->p;
    int64_t item = b, row = t;
    if (p->page_size) {
        item = cx->a->block_table[b * p->max_pages + t / p->page_size];
        row = t % p->page_size;
    }
    fa_tile_src src = {(const char *)base + fa_offset(st, item, hk, row, 0) * (int64_t)cx->csz, cx->ct, st->s[2],
                       st->s[3]};
    return src;
}

/* The scale of cache row t of sequence b, kv head hk ([B, seq_k, Hk] or [pages, page_size, Hk]). */
static const float *dec_scale_at(const dec_ctx *cx, const float *scales, int64_t b, int64_t hk, int64_t t) {
    const fa_problem *p = cx->p;
    if (p->page_size)
        return scales + ((int64_t)cx->a->block_table[b * p->max_pages + t / p->page_size] * p->page_size +
                         t % p->page_size) * p->heads_kv + hk;
    return scales + (b * p->seq_k + t) * p->heads_kv + hk;
}

/* Scores of one row (scores.h: the forward's and the backward's definition, over the
 * sequence's dense view sc->pl), then its online-softmax step: updates M, L and acc. */
static void dec_row(const dec_ctx *cx, const fa_score_ctx *sc, float *restrict srow, int n, int64_t h, int64_t i,
                    int64_t j0, float *M, float *L, float *restrict arow) {
    const float mt = fa_score_row_max(sc, 0, h, i, j0, n, srow);
    fa_softmax_row(cx->isa, cx->p->dtype, cx->p->head_dim_v, srow, n, mt, M, L, arow, 0.0f);
}

/* Reads, a byte a line, the lines of a tile that a prefetch state (decode_kernels.h) has
 * not reached: from pf->off to pf->len of base, then all of base2 if it is still there. A
 * fresh state is the whole tile (dec_touch); one left by the previous tile's steps, the rest
 * of it, or nothing where they covered it (isa.h, touch_rest). */
static void dec_touch_rest(const fa_decode_prefetch *pf) {
    unsigned char sink = 0;
    for (int64_t off = pf->off; off < pf->len; off += 64) sink ^= (unsigned char)pf->base[off];
    if (pf->base2)
        for (int64_t off = 0; off < pf->len2; off += 64) sink ^= (unsigned char)pf->base2[off];
    volatile unsigned char keep = sink; /* the loads must happen */
    (void)keep;
}

/* Reads cache rows [r0, r1) of sequence b, every kv head, K then V, in address order for
 * the usual layouts (whole rows one after another: the hardware prefetchers stream them),
 * so that the heads' passes over the tile find it in L2. Other layouts: prefetches, row by
 * row and head by head. Needs contiguous head dims. */
static void dec_touch(const dec_ctx *cx, int64_t b, int64_t r0, int64_t r1) {
    const fa_problem *p = cx->p;
    if (!cx->rows_whole) {
        for (int64_t r = r0; r < r1; r++)
            for (int x = 0; x < 2; x++)
                for (int64_t hk = 0; hk < p->heads_kv; hk++) {
                    const fa_tile_src row =
                        dec_cache_row(cx, x ? cx->a->v : cx->a->k, x ? &p->v_stride : &p->k_stride, b, hk, r);
                    const int64_t bytes = (x ? p->head_dim_v : p->head_dim) * (int64_t)cx->csz;
                    for (int64_t off = 0; off < bytes; off += 64)
                        __builtin_prefetch((const char *)row.base + off, 0, 2);
                }
        return;
    }
    const int64_t bytes = (r1 - r0) * p->k_stride.s[2] * (int64_t)cx->csz; /* K's and V's alike: rows_whole */
    const fa_decode_prefetch whole = {dec_cache_row(cx, cx->a->k, &p->k_stride, b, 0, r0).base,
                                      dec_cache_row(cx, cx->a->v, &p->v_stride, b, 0, r0).base, 0, bytes, bytes, 1, 0};
    dec_touch_rest(&whole);
}

/* One tile of kv head hk over an f16, int8 or fp8 cache (decode_cache.c's kernels, the
 * ISA's vector forms for contiguous rows): scores, the softmax row by row, then p V, guarded
 * where a mask edge crosses the tile (an f16 or fp8 value row may hold inf or NaN). */
static void dec_conv_tile(const dec_ctx *cx, const fa_score_ctx *sc, const struct fa_plan *one, const float *q,
                          const fa_tile_src *ks, const fa_tile_src *vs, int64_t b, int64_t hk, int64_t j0, int n,
                          float *s, float *acc, float *mx, float *sum, fa_decode_prefetch *pf, void *ws,
                          uint64_t q_tag) {
    const fa_problem *p = cx->p;
    const int quant = fa_dtype_quantized(cx->ct);
    const fa_decode_cache_tile t = {q, ks->base, vs->base, cx->ct, ks->row_stride, vs->row_stride, ks->col_stride,
                                    vs->col_stride, quant ? dec_scale_at(cx, cx->a->k_scale, b, hk, j0) : NULL,
                                    quant ? dec_scale_at(cx, cx->a->v_scale, b, hk, j0) : NULL, p->heads_kv,
                                    (int)cx->M, (int)p->head_dim, n, (int)p->head_dim_v, pf, ws, q_tag};
    const fa_decode_kernels *dk = cx->isa->decode;
    const int vec = dk && dk->cache_qk && ks->col_stride == 1 && vs->col_stride == 1;
    int plain = vec && dk->cache_step; /* every row's scores are the scaled products, every key visible */
    for (int64_t i = 0; plain && i < p->seq_q; i++) plain = fa_score_plain(sc, i, j0, n);
    if (plain) { /* the whole online-softmax step in the vector kernel */
        dk->cache_step(&t, sc->scale, p->dtype, mx, sum, acc, (int)p->head_dim_v);
        return;
    }
    if (vec) dk->cache_qk(&t, s, (int)cx->T);
    else fa_decode_cache_qk(&t, s, (int)cx->T);
    for (int64_t r = 0; r < cx->M; r++)
        dec_row(cx, sc, s + r * cx->T, n, hk * cx->group + r / p->seq_q, r % p->seq_q, j0, &mx[r], &sum[r],
                acc + r * p->head_dim_v);
    const int guarded = cx->ct != FA_INT8 && fa_tile_may_hide(one, 0, p->seq_q, j0, n); /* int8 codes are finite */
    if (vec && !guarded) dk->cache_pv(&t, s, (int)cx->T, acc, (int)p->head_dim_v);
    else fa_decode_cache_pv(&t, s, (int)cx->T, acc, (int)p->head_dim_v, guarded);
}

/* Item it's sequence *b and the keys [*k0, *k1] of its chunk that some row may see. */
static void dec_item_span(const dec_ctx *cx, int64_t it, int64_t *b, int64_t *k0, int64_t *k1) {
    /* first[b] <= it < first[b + 1] */
    int64_t bb = 0;
    for (int64_t lo = 0, hi = cx->p->batch - 1; lo <= hi;) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cx->first[mid] <= it) bb = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    int64_t lo, hi;
    fa_decode_key_span(cx->pl, bb, &lo, &hi);
    const int64_t CH = fa_decode_chunk(cx->pl, bb), c = lo / CH + it - cx->first[bb];
    *b = bb;
    *k0 = c * CH > lo ? c * CH : lo;
    *k1 = c * CH + CH - 1 < hi ? c * CH + CH - 1 : hi;
}

/* Item (b, chunk): keys [k0, k1] of the chunk that some row may see, for every kv head
 * (part: Hk partials). Tile by tile (each read first: dec_touch), head by head. The last tile
 * prefetches the first tile of the item this thread runs next (sequence nb from key nk0;
 * nb < 0: none), so that an item's first touch does not wait on memory; carry passes how
 * far those prefetches got from tile to tile and item to item (dec_touch_rest). */
static void dec_item(const dec_ctx *cx, char *scratch, int64_t b, int64_t k0, int64_t k1, int64_t nb, int64_t nk0,
                     float *part, fa_counts *cnt, fa_decode_prefetch *carry, uint64_t q_tag) {
    const fa_problem *p = cx->p;
    const fa_isa *isa = cx->isa;
    const int64_t M = cx->M, T = cx->T, D = p->head_dim, Dv = p->head_dim_v, Sq = p->seq_q, Hk = p->heads_kv;
    const int64_t sk = fa_decode_keys(cx->pl, b), part_floats = M * (Dv + 2);
    int64_t sz[DEC_PIECES];
    dec_sizes(cx->pl, sz);
    char *qs = scratch, *qp = qs + dec_align(sz[0]), *kp = qp + dec_align(sz[1]), *vp = kp + dec_align(sz[2]);
    float *s = (float *)(vp + dec_align(sz[3]));
    void *ws = dec_ws(cx->pl, scratch); /* zeroed at the call's start (fa_cpu_decode_forward) */
    const int touch = p->k_stride.s[3] == 1 && p->v_stride.s[3] == 1;

    /* the masks of sequence b: a dense view with its keys and offset */
    const fa_sched masks = fa_decode_sched(cx->pl, b);
    struct fa_plan one = *cx->pl;
    one.p.seq_k = sk;
    one.off = masks.off;
    const fa_score_ctx sc = fa_score_ctx_make(&one, NULL, cx->a->alibi_slopes, NULL, NULL);

    /* every query row of the sequence, staged contiguous (row r of head hk: hk * M + r) */
    for (int64_t hk = 0; hk < Hk; hk++) {
        float *mx = part + hk * part_floats + M * Dv, *sum = mx + M;
        for (int64_t r = 0; r < M; r++) {
            const int64_t h = hk * cx->group + r / Sq, i = r % Sq;
            const char *src = (const char *)cx->a->q + fa_offset(&p->q_stride, b, h, i, 0) * (int64_t)cx->esz;
            char *dst = qs + (hk * M + r) * D * (int64_t)(cx->conv ? 4 : cx->esz);
            if (cx->conv) /* exact: every dtype converts to f32 exactly */
                for (int64_t d = 0; d < D; d++) ((float *)dst)[d] = fa_load(p->dtype, src, d * p->q_stride.s[3]);
            else if (p->q_stride.s[3] == 1) memcpy(dst, src, (size_t)D * cx->esz); /* one call per row, not per element */
            else
                for (int64_t d = 0; d < D; d++)
                    memcpy(dst + d * (int64_t)cx->esz, src + d * p->q_stride.s[3] * (int64_t)cx->esz, cx->esz);
            mx[r] = -INFINITY;
            sum[r] = 0.0f;
        }
        memset(part + hk * part_floats, 0, sizeof(float) * (size_t)(M * Dv));
    }

    for (int64_t t = k0 / T; t <= k1 / T; t++) {
        const int64_t j0 = t * T;
        const int n = (int)(sk - j0 < T ? sk - j0 : T);
        /* carry: the prefetch state that the thread's last tile left for this one (base NULL:
         * none), which the touch completes */
        if (touch && cx->touch_rest && carry->base) dec_touch_rest(carry);
        else if (touch) dec_touch(cx, b, j0, j0 + n);
        carry->base = NULL;
        int plain = cx->direct; /* every row's scores are the scaled products, every key visible */
        for (int64_t i = 0; plain && i < Sq; i++) plain = fa_score_plain(&sc, i, j0, n);
        /* the next tile's rows, prefetched while this one computes (its touch then finds most of
         * them in cache): the arithmetic and the memory overlap */
        fa_decode_prefetch pf = {NULL, NULL, 0, 0, 0, cx->prefetch_x, cx->per_line}, *pfp = NULL;
        const int64_t pb = t < k1 / T ? b : nb, pj = t < k1 / T ? j0 + T : nk0 / T * T; /* the next tile */
        const int64_t psk = pb < 0 ? 0 : pb == b ? sk : fa_decode_keys(cx->pl, pb);
        if (touch && cx->rows_whole && pj < psk) { /* rows_whole: K and V rows alike, tiles within pages */
            const int64_t nn = psk - pj < T ? psk - pj : T;
            pf.len = pf.len2 = nn * p->k_stride.s[2] * (int64_t)cx->csz;
            pf.base = dec_cache_row(cx, cx->a->k, &p->k_stride, pb, 0, pj).base;
            pf.base2 = dec_cache_row(cx, cx->a->v, &p->v_stride, pb, 0, pj).base;
            pfp = &pf;
        }
        for (int64_t hk = 0; hk < Hk; hk++) {
            float *acc = part + hk * part_floats, *mx = acc + M * Dv, *sum = mx + M;
            const char *qh = qs + hk * M * D * (int64_t)(cx->conv ? 4 : cx->esz);
            const fa_tile_src ks = dec_cache_row(cx, cx->a->k, &p->k_stride, b, hk, j0);
            const fa_tile_src vs = dec_cache_row(cx, cx->a->v, &p->v_stride, b, hk, j0);
            if (cx->conv) {
                dec_conv_tile(cx, &sc, &one, (const float *)qh, &ks, &vs, b, hk, j0, n, s, acc, mx, sum, pfp, ws,
                              q_tag);
            } else if (plain) { /* the whole online-softmax step in the vector kernel */
                const fa_decode_step step = {(const uint16_t *)qh, ks.base, vs.base, ks.row_stride, vs.row_stride,
                                             (int)M, (int)D, n, (int)Dv, (int)Dv, sc.scale, mx, sum, acc, pfp};
                cx->isa->decode->step(&step);
            } else { /* scores, then the softmax row by row, then p V */
                if (cx->direct) {
                    cx->isa->decode->qk((const uint16_t *)qh, (int)M, (int)D, ks.base, ks.row_stride, n, s, (int)T);
                } else {
                    const fa_tile_src qsrc = {qh, p->dtype, D, 1};
                    isa->pack_a(&qsrc, (int)M, (int)D, qp); /* M x D: small beside the tile */
                    isa->pack_bt(&ks, n, (int)D, kp);
                    isa->pack_b(&vs, n, (int)Dv, vp);
                    isa->gemm_abt((int)M, n, (int)D, qp, kp, s, (int)T);
                }
                for (int64_t r = 0; r < M; r++)
                    dec_row(cx, &sc, s + r * T, n, hk * cx->group + r / Sq, r % Sq, j0, &mx[r], &sum[r], acc + r * Dv);
                /* a mask edge crosses this tile: inf or NaN in a value row some row cannot see must
                 * not reach it as 0 * NaN (guard.h; one read of the tile, edge tiles only) */
                if (fa_tile_may_hide(&one, 0, Sq, j0, n) && fa_tile_nonfinite(&vs, n, (int)Dv))
                    fa_gemm_pb_guarded(isa, (int)M, n, (int)Dv, s, (int)T, &vs, vp, acc, (int)Dv);
                else if (cx->direct) cx->isa->decode->pv(s, (int)T, (int)M, vs.base, vs.row_stride, n, (int)Dv, acc, (int)Dv);
                else isa->gemm_pb((int)M, n, (int)Dv, s, (int)T, vp, acc, (int)Dv);
            }
            cnt->flops += 2 * M * n * (D + Dv);
            cnt->transcendentals += M * n * (p->softcap > 0.0f ? 2 : 1) + M;
        }
        if (pfp) *carry = pf; /* how far the heads' steps prefetched the next tile */
    }
}

/* Row i of query head h of sequence b: the chunks' partials combined in chunk order. */
static void dec_merge(const dec_ctx *cx, int64_t b, int64_t h, int64_t i, int64_t chunks, fa_counts *cnt) {
    const fa_problem *p = cx->p;
    const int64_t M = cx->M, Dv = p->head_dim_v, hk = h / cx->group, r = (h % cx->group) * p->seq_q + i;
    const int64_t stride = M * (Dv + 2) * p->heads_kv, item0 = cx->first[b]; /* item c's head hk: + c * stride */
    const float *head = cx->partials + hk * M * (Dv + 2);
    /* a shared prefix's chunks come first (cascade.c's layout: R rows per (chunk, kv head)) */
    const int64_t pc = cx->prefix ? fa_cascade_chunks(cx->pl) : 0, R = p->batch * M, pstride = R * (Dv + 2) * p->heads_kv;
    float *pre = cx->prefix ? cx->prefix + hk * R * (Dv + 2) : NULL;
    const int64_t pr = b * M + r; /* this row among the prefix's */
    float top = -INFINITY, l = 0.0f;
    for (int64_t c = 0; c < pc; c++) top = pre[c * pstride + R * Dv + pr] > top ? pre[c * pstride + R * Dv + pr] : top;
    for (int64_t c = 0; c < chunks; c++) {
        const float m = head[(item0 + c) * stride + M * Dv + r];
        top = m > top ? m : top;
    }
    const float base = top == -INFINITY ? 0.0f : top;
    /* the sum accumulates in the first chunk's row (this row's alone) */
    float *o = pc ? pre + pr * Dv : chunks ? (float *)head + item0 * stride + r * Dv : NULL;
    for (int64_t c = 0; c < pc; c++) {
        const float *part = pre + c * pstride, w = fa_vexpf(part[R * Dv + pr] - base);
        l += part[R * Dv + R + pr] * w;
        if (c == 0)
            for (int64_t x = 0; x < Dv; x++) o[x] *= w;
        else
            for (int64_t x = 0; x < Dv; x++) o[x] += part[pr * Dv + x] * w;
    }
    for (int64_t c = 0; c < chunks; c++) {
        const float *part = head + (item0 + c) * stride;
        if (c + 4 < chunks) /* partials lie a whole item apart, past the hardware prefetchers' reach */
            for (int64_t x = 0; x < Dv; x += 16) __builtin_prefetch(part + 4 * stride + r * Dv + x, 0, 3);
        const float w = fa_vexpf(part[M * Dv + r] - base);
        l += part[M * Dv + M + r] * w;
        if (c == 0 && !pc)
            for (int64_t x = 0; x < Dv; x++) o[x] *= w;
        else
            for (int64_t x = 0; x < Dv; x++) o[x] += part[r * Dv + x] * w;
    }
    /* the sink once, after every chunk (sinks.h); alpha rescales o to the new max */
    const float alpha = p->has_sinks ? fa_sink_fold(cx->a->sinks[h], &top, &l) : 1.0f;
    const float inv = l > 0.0f ? alpha / l : 0.0f;
    const int64_t ob = fa_offset(&p->o_stride, b, h, i, 0);
    for (int64_t x = 0; x < Dv; x++) fa_store(p->dtype, cx->a->o, ob + x * p->o_stride.s[3], o ? o[x] * inv : 0.0f);
    /* -inf only for a row without visible keys (l = 0); a NaN score made l NaN: lse NaN too */
    if (cx->a->lse)
        cx->a->lse[(b * p->heads_q + h) * p->seq_q + i] = isnan(l) ? l : l > 0.0f ? top + logf(l) : -INFINITY;
    cnt->transcendentals += pc + chunks + 1 + p->has_sinks;
}

/* k_new/v_new rows into the caches at positions cache_seqlens[b] + t; a quantized cache
 * takes each row's codes and its scale (quantize.h's rule). */
static void dec_append(const dec_ctx *cx, void *cache, const fa_strides *st, const float *scales, const void *src,
                       int64_t width) {
    const fa_problem *p = cx->p;
    const int64_t Hk = p->heads_kv, Sq = p->seq_q, es = (int64_t)cx->esz;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t t = 0; t < Sq; t++)
            for (int64_t hk = 0; hk < Hk; hk++) {
                const fa_tile_src dst = dec_cache_row(cx, cache, st, b, hk, cx->pl->lens[b] + t);
                const char *from = (const char *)src + ((b * Sq + t) * Hk + hk) * width * es;
                if (fa_dtype_quantized(cx->ct)) {
                    float *sc = (float *)dec_scale_at(cx, scales, b, hk, cx->pl->lens[b] + t);
                    *sc = fa_quantize_row(cx->ct, p->dtype, from, width, (uint8_t *)dst.base, st->s[3]);
                    continue;
                }
                for (int64_t d = 0; d < width; d++)
                    memcpy((char *)dst.base + d * st->s[3] * es, from + d * es, (size_t)es);
            }
}

fa_status fa_cpu_decode_forward(const struct fa_plan *pl, const fa_forward_args *a) {
    const fa_problem *p = &pl->p;
    const int threads = fa_call_threads(pl);
    const int64_t need = fa_decode_workspace_bytes(pl), scratch = fa_cpu_decode_scratch_bytes(pl);
    char *ws = a->workspace, *owned = NULL;
    if (!ws && !(ws = owned = fa_malloc((size_t)need))) /* the allocation-failure hook sees it */
        return fa_error(FA_ERR_NO_MEMORY, "fa_forward: cannot allocate %lld bytes of decode workspace", (long long)need);
    fa_status st = fa_cpu_decode_check(pl, a, ws); /* in the workspace, before the call uses it */
    if (st) {
        fa_free(owned);
        return st;
    }

    dec_ctx cx = {pl, p, dec_isa(pl), a, fa_dtype_size(p->dtype), dec_rows(p), fa_decode_tile(p),
                  p->heads_q / p->heads_kv, 0, 0, NULL, NULL, NULL, FA_F32, 0, 0, 1, 0, 0};
    fa_counts prefix_counts = {0, 0};
    if (p->shared_prefix_len) { /* before the appends: it fails before anything is written */
        cx.prefix = (float *)(ws + need - fa_cascade_workspace_bytes(pl)); /* the workspace's last part */
        if ((st = fa_cpu_cascade_prefix(pl, a, (char *)cx.prefix, &prefix_counts))) {
            fa_free(owned);
            return st;
        }
    }
    cx.rows_whole = p->k_stride.s[3] == 1 && p->k_stride.s[1] == p->head_dim && p->k_stride.s[2] == p->heads_kv * p->head_dim &&
                    p->v_stride.s[3] == 1 && p->v_stride.s[1] == p->head_dim_v && p->v_stride.s[2] == p->heads_kv * p->head_dim_v &&
                    p->head_dim == p->head_dim_v && (!p->page_size || fa_decode_tile(p) <= p->page_size);
    cx.direct = p->dtype == FA_BF16 && fa_cache_dtype(p) == FA_BF16 && p->k_stride.s[3] == 1 &&
                p->v_stride.s[3] == 1 && cx.isa->decode != NULL && cx.isa->decode->step != NULL &&
                fa_decode_bf16_head_dim(p->head_dim); /* the kernels' head dims (decode_kernels.h) */
    cx.ct = fa_cache_dtype(p);
    cx.csz = fa_dtype_size(cx.ct);
    cx.conv = dec_conv(pl);
    cx.prefetch_x = cx.isa->decode && cx.isa->decode->prefetch_x > 1 ? cx.isa->decode->prefetch_x : 1;
    cx.touch_rest = cx.isa->decode && cx.isa->decode->touch_rest;
    cx.per_line = cx.isa->decode && cx.isa->decode->prefetch_per_line;
    if (p->has_new_kv) {
        dec_append(&cx, (void *)a->k, &p->k_stride, a->k_scale, a->k_new, p->head_dim);
        dec_append(&cx, (void *)a->v, &p->v_stride, a->v_scale, a->v_new, p->head_dim_v);
    }
    /* items of sequence b: its chunks, numbered after those of sequences < b; each holds Hk partials */
    const int64_t B = p->batch, Hk = p->heads_kv;
    int64_t items = 0, nparts = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t lo, hi;
        fa_decode_key_span(pl, b, &lo, &hi);
        nparts += lo > hi ? 0 : Hk * fa_decode_chunks(pl, b, lo, hi);
    }
    const int64_t part_floats = cx.M * (p->head_dim_v + 2);
    cx.partials = (float *)ws;
    int64_t *first = (int64_t *)(ws + nparts * part_floats * (int64_t)sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        int64_t lo, hi;
        fa_decode_key_span(pl, b, &lo, &hi);
        first[b] = items;
        items += lo > hi ? 0 : fa_decode_chunks(pl, b, lo, hi);
    }
    first[B] = items;
    cx.first = first;
    char *scratch_base = (char *)(first + B + 1);

    int64_t next_item = 0;
    fa_counts_sum sum;
    fa_counts_sum_init(&sum, prefix_counts.flops, prefix_counts.transcendentals);
    fa_progress progress; /* items (a sequence's chunk of keys) done, as the forward counts query tiles */
    fa_progress_init(&progress, a->progress, a->progress_ctx, items);
#pragma omp parallel num_threads(threads)
    {
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch;
        mine += (DEC_ALIGN - (uintptr_t)mine % DEC_ALIGN) % DEC_ALIGN;
        void *ws = dec_ws(pl, mine);
        if (ws) memset(ws, 0, FA_DECODE_CACHE_WS_BYTES); /* the cache step's entries start empty */
        fa_counts cnt = {0, 0};
        fa_decode_prefetch carry = {NULL, NULL, 0, 0, 0, 1, 0}; /* dec_item's: none yet */
        /* items claimed one ahead from a shared counter (a dynamic schedule that knows its next
         * item): each item's last tile prefetches the next one's first */
        int64_t it, nx;
#pragma omp atomic capture
        it = next_item++;
        for (; it < items; it = nx) {
#pragma omp atomic capture
            nx = next_item++;
            int64_t b, k0, k1, nb = -1, nk0 = 0, nk1;
            dec_item_span(&cx, it, &b, &k0, &k1);
            if (nx < items) dec_item_span(&cx, nx, &nb, &nk0, &nk1);
            /* the item's index names its staged q (fa_decode_cache_tile.q_tag: nonzero) */
            dec_item(&cx, mine, b, k0, k1, nb, nk0, cx.partials + it * Hk * part_floats, &cnt, &carry,
                     (uint64_t)it + 1);
            fa_progress_step(&progress, 1);
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t r = 0; r < B * p->heads_q * p->seq_q; r++) {
            const int64_t bb = r / (p->heads_q * p->seq_q), h = r / p->seq_q % p->heads_q, i = r % p->seq_q;
            dec_merge(&cx, bb, h, i, first[bb + 1] - first[bb], &cnt);
        }
        fa_counts_sum_add(&sum, &cnt);
    }
    fa_free(owned);
    const fa_counts total = fa_counts_sum_get(&sum);
    fa_counts_report(a->counts, total.flops, total.transcendentals);
    return FA_OK;
}
