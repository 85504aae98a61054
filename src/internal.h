/* Internal declarations shared by the plan, the cost model and the backends. */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "alloc.h" /* fa_malloc, fa_calloc, fa_free: every allocation goes through them */
#include "dtype.h" /* f32 <-> bf16 / f16, fa_load, fa_store */
#include "quantize.h" /* the cache element types int8 and fp8 */
#include "flashattn.h"
#include "mask.h"     /* block-sparse masks: the object and its schedule view (schedule_mask.h) */
#include "schedule.h" /* which keys a row sees, the tile schedule */

#include <float.h>
#include <math.h>
#include <stdint.h>

#define FA_FWD_SLICE 32              /* rows per slice of a forward pair (fwd_slice) */
#define FA_FWD_MAX_ROWS_SLICED 2048 /* the most rows per forward tile that run in slices */

/* The plan: a validated problem with every default resolved. */
struct fa_plan {
    fa_problem p;           /* strides filled in (never all-zero), scale resolved */
    fa_backend backend;     /* CPU or CUDA, never AUTO */
    const struct fa_backend_entry *be; /* its entry in the backend table (backend.h) */
    int threads;            /* CPU threads the kernels use */
    int64_t fwd_bq, fwd_bk; /* forward tile: query rows x keys */
    int64_t fwd_slice;      /* forward: a pair's rows run in slices of FA_FWD_SLICE, each over the keys
                             * its rows may see (schedule_mask.h, fa_sched_mask_slice_keys), where the ISA has
                             * the ragged products (cpu/isa.h, gemm_abt_rows) and fwd_bq is at most
                             * FA_FWD_MAX_ROWS_SLICED; 0: whole pairs */
    int64_t bwd_bq, bwd_bk; /* backward tile */
    int bwd_fused;          /* CPU backward: one pass (backward_fused.c), else two passes */
    int bwd_none;           /* no backend runs this plan's backward (decoding, lengths per call:
                             * fa_supports_common): its backward figures and blocks are 0 (cost.c) */
    float scale;
    int64_t off;            /* Sk - Sq: masks align bottom-right */
    fa_cost fwd, bwd;       /* computed once, at plan time */
    const struct fa_isa *isa; /* CPU microkernels chosen at plan time (src/cpu/isa.h) */
    int64_t lse_rows;       /* lse elements between heads; 0: seq_q (a varlen sequence: the packed total) */
    int shape;              /* FA_SHAPE_DENSE, _VARLEN or _DECODE */
    int32_t *lens;          /* the plan's copies: cu_seqlens_q, cu_seqlens_k (varlen) or cache_seqlens */
    int capacity;           /* made from capacities (lengths_per_call; not a call's view): figures that bound every call */
    int64_t opt_bq, opt_bk; /* the options' block sizes (0: the library's): a packed sequence's own tiles */
    int64_t batch0;         /* dropout's b of batch 0: fa_problem.dropout_batch0 (+ a packed sequence's index in its parent) */
    fa_problem shown;       /* what fa_plan_problem gives: p, with a capacity plan's stand-in lengths NULL */
    /* p.mask, when set, is the plan's own reference (fa_mask_retain; released by fa_plan_destroy) */
};

/* ---- inference shapes (plan_inference.c, cost_inference.c, cpu/varlen.c, cpu/decode.c) */
enum { FA_SHAPE_DENSE = 0, FA_SHAPE_VARLEN = 1, FA_SHAPE_DECODE = 2 };

/* Validates cu_seqlens / cache_seqlens / pages, fills the packed or cache layouts' default
 * strides and copies the length arrays into pl->lens. Called before the strides resolve. */
fa_status fa_validate_inference(struct fa_plan *pl);
/* FA_ERR_OVERFLOW unless the last element of a [B, H, S, D] tensor (dims) with strides st
 * (elements, none negative) and es-byte elements ends within int64 bytes, since the kernels
 * address base + offset x es; a tensor of no elements passes (plan.c). */
fa_status fa_check_reach(const char *name, const fa_strides *st, const int64_t dims[4], int64_t es);
/* The length checks of plans and calls (plan_inference.c): cache_seqlens against the
 * capacity, cu_seqlens as prefix sums ending at (exact) or within the packed rows. */
fa_status fa_check_cache_seqlens(const fa_problem *p, const int32_t *lens);
fa_status fa_check_cu_seqlens(const fa_problem *p, const int32_t *cu_q, const int32_t *cu_k, int exact);
/* The plan a call runs (lengths.c): for a lengths-per-call plan, *view = pl with the call's
 * lengths (checked; its cost recomputed for them) and *use = view; for a plan made with
 * lengths, given lengths must equal its own, and *use = pl. fn names the entry. */
fa_status fa_call_plan(const struct fa_plan *pl, const int32_t *cache_seqlens, const int32_t *cu_q,
                       const int32_t *cu_k, const char *fn, struct fa_plan *view, const struct fa_plan **use);
/* The dense plan of packed sequence b: batch 1, its own lengths and mask offset, the
 * parent's strides, tiles and lse layout (pointers are offset by the caller). */
void fa_varlen_subplan(const struct fa_plan *pl, int64_t b, struct fa_plan *sub);
fa_status fa_cost_inference(struct fa_plan *pl);
/* A packed sequence's tiles and backward schedule, chosen by the CPU's rules from its own
 * lengths (never the batch's totals or its other sequences: batch invariance, docs/semantics.md),
 * except block sizes the options fixed (cpu/backend_cpu.c). */
void fa_cpu_sequence_blocks(struct fa_plan *sub);

/* Decoding splits each sequence's keys into chunks (one work item per (sequence, kv head,
 * chunk), merged in chunk order) and chunks into tiles, both from the sequence's own length
 * and the shapes, so results do not depend on the thread count or the rest of the batch:
 * chunks of FA_DECODE_CHUNK keys, or of FA_DECODE_SHORT_CHUNK for a sequence of at most
 * FA_DECODE_CHUNK keys, which would otherwise be one work item, so one thread's (B = 1 on 2
 * threads: 512 keys 128 -> 70 us, 256 keys 62 -> 39 us). Not beyond: at 1024 keys short
 * chunks were 12% slower than two chunks of 512 (more items restage q and merge), and at
 * 32K tokens 12% slower throughout. */
#define FA_DECODE_CHUNK 512
#define FA_DECODE_SHORT_CHUNK 128
/* Keys per tile: the largest of 128, 64, 32, 16 whose K and V rows (every kv head) fit in
 * FA_DECODE_TILE_BYTES, so that a tile read whole, and the next one being prefetched,
 * stay in L2 (1 MiB on Zen 4) for its heads' passes, and that divides the page (tiles
 * never cross a page). Larger tiles spread each kernel call's fixed work (rescale, the
 * accumulators' loads and stores) over more keys; at Hk = 8, D = 128 bf16 (4 KiB a key),
 * 64 keys measured 1-2% faster than 128, and 64 was 128's speed without the prefetch. */
#define FA_DECODE_TILE_BYTES (256 * 1024)
static inline int64_t fa_decode_tile(const fa_problem *p) {
    const int64_t key_bytes = p->heads_kv * (p->head_dim + p->head_dim_v) * (int64_t)fa_dtype_size(fa_cache_dtype(p));
    int64_t t = 128;
    /* key_bytes > budget / t, not t * key_bytes > budget: that product can pass int64 */
    while (t > 16 && (key_bytes > FA_DECODE_TILE_BYTES / t || (p->page_size > 0 && p->page_size % t))) t /= 2;
    return t;
}
/* Sequence b's keys (cache plus new). */
static inline int64_t fa_decode_keys(const struct fa_plan *pl, int64_t b) {
    return (int64_t)pl->lens[b] + (pl->p.has_new_kv ? pl->p.seq_q : 0);
}
/* Sequence b's masks: its seq_q rows against its keys, at its own offset. */
static inline fa_sched fa_decode_sched(const struct fa_plan *pl, int64_t b) {
    const fa_problem *p = &pl->p;
    return fa_sched_make(p->seq_q, fa_decode_keys(pl, b), p->has_diag_offset, p->diag_offset, p->causal,
                         p->window_left, p->window_right);
}
/* Keys [*lo, *hi] that some query row of sequence b may see (empty when lo > hi). */
void fa_decode_key_span(const struct fa_plan *pl, int64_t b, int64_t *lo, int64_t *hi);
/* How many blocks of `unit` keys (chunks, tiles) keys [lo, hi] cross. A plan made from
 * capacities (pl->capacity) bounds every call: its full caches have the longest spans, but
 * where a window cuts one (lo > 0), a shorter call's span of as many keys can straddle one
 * more block boundary (600 keys over a capacity of 1536 cross 2 chunks of 512 there and 3
 * at 1025 keys), so it counts the most blocks any span of that length can cross. */
static inline int64_t fa_decode_blocks(const struct fa_plan *pl, int64_t lo, int64_t hi, int64_t unit) {
    const int64_t here = hi / unit - lo / unit + 1, worst = (hi - lo + unit - 1) / unit + 1;
    return pl->capacity && lo > 0 && worst > here ? worst : here;
}
/* Keys per chunk of sequence b (FA_DECODE_CHUNK above). */
static inline int64_t fa_decode_chunk(const struct fa_plan *pl, int64_t b) {
    return fa_decode_keys(pl, b) <= FA_DECODE_CHUNK ? FA_DECODE_SHORT_CHUNK : FA_DECODE_CHUNK;
}
/* The chunks of sequence b whose keys [lo, hi] some row sees; a plan made from capacities
 * bounds every call: fa_decode_blocks, and where its full cache takes whole chunks, a
 * shorter call's short ones (at most FA_DECODE_CHUNK / FA_DECODE_SHORT_CHUNK of them). */
static inline int64_t fa_decode_chunks(const struct fa_plan *pl, int64_t b, int64_t lo, int64_t hi) {
    const int64_t ch = fa_decode_chunk(pl, b), n = fa_decode_blocks(pl, lo, hi, ch);
    const int64_t most_short = FA_DECODE_CHUNK / FA_DECODE_SHORT_CHUNK;
    return pl->capacity && ch == FA_DECODE_CHUNK && n < most_short ? most_short : n;
}
/* The decode call's workspace (cpu/backend_cpu.c; -1 if it overflows int64) and one CPU
 * thread's share of it. */
int64_t fa_decode_workspace_bytes(const struct fa_plan *pl);
int64_t fa_cpu_decode_scratch_bytes(const struct fa_plan *pl);
fa_status fa_cpu_varlen_forward(const struct fa_plan *pl, const fa_forward_args *a);
fa_status fa_cpu_varlen_backward(const struct fa_plan *pl, const fa_backward_args *a);
fa_status fa_cpu_decode_forward(const struct fa_plan *pl, const fa_forward_args *a);
/* The decode call's checks of its arguments' contents, before anything is written
 * (cpu/decode_check.c). */
/* scratch: fa_decode_check_bytes of the call's workspace (the check runs before the call
 * uses it, so the figure counts the larger of the two). */
fa_status fa_cpu_decode_check(const struct fa_plan *pl, const fa_forward_args *a, void *scratch);
/* Its first part alone: every block-table entry the sequences' lengths use names a page (the
 * empty decode calls' check too, cpu/empty.c, which read and write nothing else). */
fa_status fa_cpu_decode_check_pages(const struct fa_plan *pl, const fa_forward_args *a);
int64_t fa_decode_check_bytes(const struct fa_plan *pl);
/* A shared prefix (cpu/cascade.c): its chunks (of a size from the shapes) and tiles; its partials, per
 * (chunk, kv head) R = B x (Hq / Hk) x seq_q rows of Dv accumulators, then R maxima, then
 * R sums (row b x M + r: sequence b's decode row r); its workspace (partials, then threads x
 * scratch: the decode workspace's last part); and the pass, which fills the partials and
 * adds its counts to cnt. */
int64_t fa_cascade_chunks(const struct fa_plan *pl);
int64_t fa_cascade_tiles(const struct fa_plan *pl); /* per kv head: each chunk starts its own tiles */
int64_t fa_cascade_partial_floats(const struct fa_plan *pl);
int64_t fa_cascade_workspace_bytes(const struct fa_plan *pl);
/* A packed backward's bytes for one sequence's dsink, after the dense workspace (varlen.c). */
int64_t fa_varlen_dsink_bytes(const struct fa_plan *pl);
fa_status fa_cpu_cascade_prefix(const struct fa_plan *pl, const fa_forward_args *a, char *ws, fa_counts *cnt);

/* Hands a pass's totals to the caller's fa_counts (NULL: not asked for). */
static inline void fa_counts_report(fa_counts *c, int64_t flops, int64_t transcendentals) {
    if (c) c->flops = flops, c->transcendentals = transcendentals;
}

/* A problem with nothing to compute: a zero batch, query heads, seq_q or seq_k (packed:
 * totals; decode: seq_k is the cache's capacity, and a shared prefix's keys are keys too).
 * Its plan is valid; cpu/empty.c writes its outputs (o = 0 and lse = -inf on rows without
 * keys, zero gradients) and cost.c its figures. */
static inline int fa_problem_empty(const fa_problem *p) {
    return p->batch == 0 || p->heads_q == 0 || p->seq_q == 0 || (p->seq_k == 0 && p->shared_prefix_len == 0);
}
fa_status fa_cpu_empty_forward(const struct fa_plan *pl, const fa_forward_args *a);
fa_status fa_cpu_empty_backward(const struct fa_plan *pl, const fa_backward_args *a);
/* The sum over rows [r0, r1) of (b, h) of delta = do . o, for rows that see no key: their
 * share of dsink_h is minus this (the sink's probability is 1 there), 0 for finite do, NaN
 * when do holds NaN or inf, as in rows whose keys are all hidden (empty.c). */
double fa_keyless_delta_sum(const struct fa_plan *pl, const fa_backward_args *a, int64_t b, int64_t h, int64_t r0,
                            int64_t r1);

/* The threads a call runs on: the plan's, or 1 in a process forked after this library was
 * used (fork.c: libgomp's workers do not survive fork); fa_threads_after_fork does the same
 * for a thread count of a call without a plan. fa_fork_guard registers the fork handler
 * (once: when the library loads, and again harmlessly from fa_plan_create). */
int fa_call_threads(const struct fa_plan *pl);
int fa_threads_after_fork(int threads);
void fa_fork_guard(void);

/* Sets this thread's error message (printf-style) and returns status. */
fa_status fa_error(fa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fa_clear_error(void);
/* s unchanged, the message prefixed with the entry that refused ("fa_backward: ..."); FA_OK
 * passes through. For refusals written without the entry's name (the backend table's). */
fa_status fa_error_in(fa_status s, const char *fn);

/* The cost model (cost.c): fills plan->fwd and plan->bwd. FA_ERR_OVERFLOW if a figure
 * does not fit int64. */
fa_status fa_cost_compute(struct fa_plan *plan);
/* The figures alone, plan->bwd_none decided: a packed sequence's sub-plan (cost_inference.c),
 * which inherits it from its parent. */
fa_status fa_cost_figures(struct fa_plan *plan);
/* What one (batch, head) computes under tiles of bq x bk, summed over its query tiles
 * (cost_walk.c, in closed form; tests/test_cost_walk.c checks it against the tile walk). */
typedef struct {
    __int128 rows_keys;  /* sum over computed tile pairs of m * n */
    __int128 rows_tiles; /* sum over computed tile pairs of m (one rescale per row per tile) */
    __int128 keys;       /* sum over computed tile pairs of n */
    __int128 pairs;      /* computed tile pairs */
    __int128 qtiles;     /* query tiles */
} fa_tile_walk;
fa_tile_walk fa_tile_walk_sums(const struct fa_plan *pl, int64_t bq, int64_t bk);
/* What the forward's slices of `slice` rows (fwd_slice) take from those sums without a mask:
 * elements (rows_keys) and rows of slices with no keys (rows_tiles), per (b, h) (cost_walk.c;
 * tests/test_cost_walk.c checks it against every tile). */
void fa_tile_walk_slice_cut(const struct fa_plan *pl, int64_t bq, int64_t bk, int64_t slice, __int128 *keys,
                            __int128 *rows);
/* The same sums over every (batch, query head), the problem's mask applied (cost_mask.c:
 * without a mask, B * Hq times fa_tile_walk_sums); the visible pairs over every (b, h); and,
 * with a mask, the k/v rows (over every (b, kv head)) and the query rows an ideal kernel
 * reads: those of the mask blocks that hold a pair causal and window may show. */
fa_tile_walk fa_tile_walk_all(const struct fa_plan *pl, int64_t bq, int64_t bk);
/* fa_tile_walk_all as the forward computes: under a mask, rows_keys counts each pair's keys
 * from the first to the last one a row may see (schedule_mask.h, fa_sched_mask_key_span). */
fa_tile_walk fa_tile_walk_forward(const struct fa_plan *pl, int64_t bq, int64_t bk);
__int128 fa_visible_pairs_all(const struct fa_plan *pl);
void fa_mask_needed_rows(const struct fa_plan *pl, __int128 *q_rows, __int128 *kv_rows);

/* Per-thread scratch the CPU drivers carve their workspace from (bytes). The cost model
 * reports threads x these (plus the backward's O(B*Hq*Sq) row terms), and the drivers
 * allocate exactly that. */
int64_t fa_cpu_forward_scratch_bytes(const struct fa_plan *plan);
int64_t fa_cpu_backward_scratch_bytes(const struct fa_plan *plan);
/* The backward's whole workspace (cpu/backward_run.c): slack, delta, threads x scratch. */
int64_t fa_cpu_backward_workspace_bytes(const struct fa_plan *plan);
/* The one-pass backward (backward_fused.c): whether the shapes suit it (set in
 * plan->bwd_fused at plan time), its per-thread scratch, and the pass itself (called by
 * fa_cpu_backward with the arguments and the workspace checked). */
int fa_cpu_backward_fused_fits(const struct fa_plan *plan);
int64_t fa_cpu_backward_fused_scratch_bytes(const struct fa_plan *plan);
fa_status fa_cpu_backward_fused(const struct fa_plan *plan, const fa_backward_args *a, char *workspace);
/* Workspace of the CUDA kernels (bytes, cuda_plan.c); plain C so plans need no device. */
int64_t fa_cuda_workspace_bytes(const struct fa_plan *plan, fa_pass pass);

/* Backends. */
fa_status fa_cpu_forward(const struct fa_plan *plan, const fa_forward_args *a);
fa_status fa_cpu_backward(const struct fa_plan *plan, const fa_backward_args *a);
fa_status fa_cuda_forward(const struct fa_plan *plan, const fa_forward_args *a);
fa_status fa_cuda_backward(const struct fa_plan *plan, const fa_backward_args *a);

/* ---- the tile schedule (schedule.h) ------------------------------------------------
 * A plan's masks as schedule.h takes them, and the plan-side names of its functions
 * (one line each: the drivers' own tile loops read better with the plan in hand). Key
 * tiles outside a query tile's visible interval are skipped; every key tile that overlaps
 * it is computed (and masked element by element where needed). Segment ids and bias
 * never skip tiles. */
static inline fa_sched fa_plan_sched(const struct fa_plan *pl) {
    fa_sched s = {pl->p.seq_q, pl->p.seq_k, pl->off, pl->p.causal, pl->p.window_left, pl->p.window_right};
    return s;
}
/* Lowest and highest key row i may see, clamped to [-1, Sk] (fa_sched_lo, fa_sched_hi). */
static inline int64_t fa_key_lo(const struct fa_plan *pl, int64_t i) {
    const fa_sched s = fa_plan_sched(pl);
    return fa_sched_lo(&s, i);
}
static inline int64_t fa_key_hi(const struct fa_plan *pl, int64_t i) {
    const fa_sched s = fa_plan_sched(pl);
    return fa_sched_hi(&s, i);
}
/* Key tiles [*kt0, *kt1) visited by query rows [r0, r1) with key tiles of bk keys. */
static inline void fa_key_tile_range(const struct fa_plan *pl, int64_t r0, int64_t r1, int64_t bk, int64_t *kt0,
                                     int64_t *kt1) {
    const fa_sched s = fa_plan_sched(pl);
    fa_sched_key_tiles(&s, r0, r1, bk, kt0, kt1);
}

/* The kind of the tile pair rows [r0, r1) x keys [c0, c1) of (batch b, query head h):
 * causal and window (schedule.h) ANDed with the problem's mask (schedule_mask.h). The
 * drivers skip an empty pair; the cost model counts the others. */
static inline int fa_plan_tile_kind(const struct fa_plan *pl, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0,
                                    int64_t c1) {
    const fa_sched s = fa_plan_sched(pl);
    const fa_sched_mask v = fa_mask_view(pl->p.mask, b, h);
    return fa_sched_mask_tile_kind(&s, &v, r0, r1, c0, c1);
}

/* FA_ERR_INVALID unless every ALiBi slope (Hq of them, in host memory) is finite and its
 * product with every distance |i + off - j| is: a non-finite slope, or a product that
 * overflows to inf, would turn whole rows into NaN or hide keys as a mask does, without the
 * mask's guard of the values behind them (docs/nonfinite.md). The distances are bounded by
 * seq_q + seq_k + |diag_offset| (at most 3 x 2^31 + 2^31: exact in a double). */
static inline fa_status fa_check_slopes(const fa_problem *p, const float *slopes, const char *fn) {
    if (!p->has_alibi || !slopes) return FA_OK;
    const double far = (double)p->seq_q + (double)p->seq_k + (p->has_diag_offset ? fabs((double)p->diag_offset) : 0.0);
    for (int64_t h = 0; h < p->heads_q; h++) {
        if (!isfinite(slopes[h]))
            return fa_error(FA_ERR_INVALID, "%s: alibi_slopes[%lld] (head %lld) is %g; slopes must be finite", fn,
                            (long long)h, (long long)h, (double)slopes[h]);
        if (fabs((double)slopes[h]) * far > (double)FLT_MAX)
            return fa_error(FA_ERR_INVALID,
                            "%s: alibi_slopes[%lld] (head %lld) is %g: times a distance up to %.0f (seq_q + seq_k + "
                            "|diag_offset|) it overflows float32",
                            fn, (long long)h, (long long)h, (double)slopes[h], far);
    }
    return FA_OK;
}

/* ---- what the kernels count (and the cost model predicts, to the unit) --------------
 * m = in-range query rows of a tile (< Sq), n = in-range keys (< Sk); padding never counts.
 * Forward, for every computed (query tile, key tile) pair of every (b, hq):
 *   flops += 2*m*n*(D + Dv)                 S = Q K^T and O += P V
 *   trans += m*n                            exp of every score (masked ones included)
 *          + m                              one online-softmax rescale exp per row
 *          + (softcap > 0 ? m*n : 0)        tanh of every score
 * and once for every query row (those with no computed tile too): trans += 1 (the log of
 * lse), + 1 with sinks (the sink's exp, src/sinks.h). Backward, two passes over the same
 * tile pairs with its own block sizes:
 *   dk/dv pass: flops += 2*m*n*(2*D + 2*Dv)  S, dP = dO V^T, dV += P^T dO, dK += dS^T Q
 *   dq pass:    flops += 2*m*n*(2*D + Dv)    S, dP, dQ += dS K
 *   each pass:  trans += m*n (+ m*n tanh with softcap)    p = exp(s - lse)
 * or, where the plan chose the one-pass schedule (plan->bwd_fused), one pass:
 *   flops += 2*m*n*(3*D + 2*Dv)             S, dP, dV, dK, dQ += dS K
 *   trans += m*n (+ m*n tanh with softcap)
 * D_i = rowsum(dO o) is not a matrix product and counts nothing. With sinks the backward
 * adds, once for every query row, trans += 1 (the exp of dsink's term, backward_run.c). */

/* Index of lse[b, h, i]: [B, Hq, Sq] contiguous, or a packed sequence's rows of [Hq, total_q]. */
static inline int64_t fa_lse_index(const struct fa_plan *pl, int64_t b, int64_t h, int64_t i) {
    return (b * pl->p.heads_q + h) * (pl->lse_rows ? pl->lse_rows : pl->p.seq_q) + i;
}

/* What dimension i of an fa_strides is, for messages: [B, H, S, D] (a paged cache's first is
 * its pages). */
static inline const char *fa_stride_dim_name(int i) {
    static const char *const names[4] = {"batch or page", "heads", "rows", "head dim"};
    return i >= 0 && i < 4 ? names[i] : "?";
}

/* Element offset of [b, h, s, d] in a tensor with strides st. */
static inline int64_t fa_offset(const fa_strides *st, int64_t b, int64_t h, int64_t s, int64_t d) {
    return b * st->s[0] + h * st->s[1] + s * st->s[2] + d * st->s[3];
}

/* The backward's delta of row r of the flattened [B, Hq, Sq] rows: rowsum(dO * o), in f32
 * (a packed batch: B = 1, Sq its rows). The backward's tiles use it (cpu/backward_tile.h),
 * and so does dsink over rows without keys (cpu/empty.c). */
static inline float fa_bwd_delta_row(const fa_problem *p, const fa_backward_args *a, int64_t r) {
    const int64_t Hq = p->heads_q, Sq = p->seq_q;
    const int64_t b = r / (Hq * Sq), h = r / Sq % Hq, i = r % Sq;
    float sum = 0.0f;
    for (int64_t x = 0; x < p->head_dim_v; x++)
        sum += fa_load(p->dtype, a->d_o, fa_offset(&p->o_stride, b, h, i, x)) *
               fa_load(p->dtype, a->o, fa_offset(&p->o_stride, b, h, i, x));
    return sum;
}

#endif /* FA_INTERNAL_H */
