/* The CPU backend's entry in the backend table (backend.h): it runs every combination that
 * combines at all, on the ISA chosen at plan time, with that ISA's registered tiles, and
 * dispatches a pass to its driver by shape (forward.c, backward.c, varlen.c, decode.c). */
#include "../backend.h"
#include "isa.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef __int128 wide;

static int64_t narrow(wide v) { return v < 0 || v > (wide)INT64_MAX ? -1 : (int64_t)v; }

static fa_status cpu_supports(const fa_problem *p, fa_pass pass, unsigned uses) {
    return fa_supports_common(p, pass, uses);
}

/* More keys per tile (wide, fitted to the mask as any tile is) where the plan's own count
 * says they cost little: a tile of 256 keys runs each of its elements about 10% faster
 * than one of 128 on AMX (dispatch.c), so it is taken when the tiles it executes hold at
 * most 8% more elements (rows x keys as the forward computes them: the cost model's walk,
 * cost_mask.c) than the narrower ones: without a mask always, under causal alone too (on
 * AMX its diagonal pairs run in slices: no more elements at 2048 keys); at S = 16384 masks of
 * chunks of 2048, of 16 documents and of a window of 512 execute no more (their pairs
 * trimmed, schedule_mask.h), the problem's own window of 512 10.7% more. */
static void wider_keys(const fa_plan *pl, int64_t wide_bk, int64_t *bq, int64_t *bk) {
    int64_t q2 = *bq, k2 = wide_bk;
    fa_mask_fit_tile(pl->p.mask, &q2, &k2);
    if (q2 != *bq || k2 <= *bk) return;
    const fa_tile_walk now = fa_tile_walk_forward(pl, *bq, *bk), wider = fa_tile_walk_forward(pl, *bq, k2);
    if ((double)wider.rows_keys <= 1.08 * (double)now.rows_keys) *bk = k2; /* in double: the sums may pass 2^64 */
}

/* The ISA's tiles (dispatch.c says why each exists), then fewer rows per tile while there
 * are under 4 work items per thread, so threads stay busy, then edges fitted to a mask's
 * blocks (mask.h, fa_mask_fit_tile). The key tiles set the order of a row's sums, so they
 * come from the shapes alone, keeping the bits the same for every thread count: the
 * forward's wider keys are judged on the ISA's query tile, before the threads' split (only
 * the rows per tile depend on the threads); the backward's split looks at the shapes alone
 * (under 16 query tiles in all), since its query tiles order its sums too. */
static void default_blocks(const fa_plan *pl, fa_pass pass, int64_t *bq, int64_t *bk) {
    const fa_problem *p = &pl->p;
    const fa_isa_tiles *t = pl->isa->tiles;
    const int beyond_causal = p->window_left >= 0 || p->window_right >= 0 || p->mask; /* a window or a mask */
    const int masked = p->causal || beyond_causal; /* skips tiles */
    *bq = t->bq, *bk = t->bk;
    if (pass == FA_FORWARD && !masked) {
        if (p->dtype == FA_BF16) *bq = t->bf16_open_bq, *bk = t->bf16_open_bk;
        else *bq = t->open_bq;
        if (p->dtype == FA_F32 && p->seq_k >= t->long_keys) *bk = t->long_bk;
    }
    if (pass == FA_BACKWARD && !masked && p->dtype == FA_F32 && p->seq_k >= t->bwd_long_keys &&
        p->head_dim >= t->bwd_long_dim)
        *bk = t->bwd_long_bk;
    int64_t wq = *bq; /* the query tile the wider keys are judged on, fitted as any tile is */
    fa_mask_fit_tile(p->mask, &wq, bk); /* a key edge's fit does not depend on the rows' */
    /* the forward widens at any length and head dim, the backward from long_keys and D = 128 */
    if (pl->shape == FA_SHAPE_DENSE && p->dtype == FA_BF16 && t->bf16_long_bk > *bk &&
        (pass == FA_FORWARD || (p->seq_k >= t->long_keys && p->head_dim >= 128))) {
        if (pass == FA_FORWARD) {
            wider_keys(pl, t->bf16_long_bk, &wq, bk);
            if (t->bf16_wider_bk > *bk) wider_keys(pl, t->bf16_wider_bk, &wq, bk);
        } else if (!beyond_causal) *bk = t->bf16_long_bk; /* causal or no mask */
    }
    const int64_t want = pass == FA_BACKWARD ? 16 : 4 * (int64_t)pl->threads;
    while (*bq > 32 && p->batch * p->heads_q * ((p->seq_q + *bq - 1) / *bq) < want) *bq /= 2;
    fa_mask_fit_tile(p->mask, bq, bk);
}

static fa_status cpu_choose_blocks(fa_plan *pl, const fa_options *o) {
    pl->threads = o->threads ? o->threads : omp_get_max_threads();
    if (pl->threads > FA_MAX_THREADS) /* only the default can get here: OMP_NUM_THREADS */
        return fa_error(FA_ERR_INVALID, "OpenMP's default of %d threads (OMP_NUM_THREADS) is above the maximum of %d",
                        pl->threads, FA_MAX_THREADS);
    fa_status s = fa_isa_select(&pl->isa);
    if (s) return s;
    const char *sched = getenv("FA_BWD_SCHEDULE"); /* read by fa_cpu_backward_fused_fits: a typo is no default */
    if (sched && *sched && strcmp(sched, "fused") && strcmp(sched, "two-pass")) /* empty: as unset */
        return fa_error(FA_ERR_INVALID, "FA_BWD_SCHEDULE must be 'fused' or 'two-pass' (or unset), got '%.40s'", sched);
    pl->opt_bq = o->block_q, pl->opt_bk = o->block_k;
    fa_cpu_sequence_blocks(pl);
    return FA_OK;
}

void fa_cpu_sequence_blocks(fa_plan *pl) {
    int64_t bq, bk;
    pl->fwd_slice = pl->isa->gemm_abt_rows ? FA_FWD_SLICE : 0; /* before wider_keys' walks */
    default_blocks(pl, FA_FORWARD, &bq, &bk);
    pl->fwd_bq = pl->opt_bq ? pl->opt_bq : bq;
    pl->fwd_bk = pl->opt_bk ? pl->opt_bk : bk;
    if (pl->fwd_bq > FA_FWD_MAX_ROWS_SLICED) pl->fwd_slice = 0;
    default_blocks(pl, FA_BACKWARD, &bq, &bk);
    pl->bwd_bq = pl->opt_bq ? pl->opt_bq : bq;
    pl->bwd_bk = pl->opt_bk ? pl->opt_bk : bk;
    pl->bwd_fused = fa_cpu_backward_fused_fits(pl);
}

/* Partials of every work item, each item's first partial index (batch + 1 int64), and
 * threads x one thread's scratch: what fa_cpu_decode_forward carves, in that order (a
 * plan made from capacities: enough for any call's lengths, fa_decode_chunks). */
int64_t fa_decode_workspace_bytes(const fa_plan *pl) {
    const fa_problem *p = &pl->p;
    wide items = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t lo, hi;
        fa_decode_key_span(pl, b, &lo, &hi);
        if (lo <= hi) items += p->heads_kv * fa_decode_chunks(pl, b, lo, hi);
    }
    const wide partial = (wide)(p->heads_q / p->heads_kv) * p->seq_q * (p->head_dim_v + 2) * 4;
    const wide run = items * partial + ((wide)p->batch + 1) * 8 + (wide)pl->threads * fa_cpu_decode_scratch_bytes(pl) +
                     fa_cascade_workspace_bytes(pl);
    const wide check = fa_decode_check_bytes(pl); /* the appends' check, before the run, in the same bytes */
    return narrow(run > check ? run : check); /* INT64_MAX when it overflows: narrowed to -1 here */
}

/* A packed-batch plan made from capacities (lengths per call) bounds every call's workspace
 * (docs/semantics.md). A call's sequences choose their tiles from their own lengths (batch
 * invariance), and a shorter one may choose wider tiles than the capacity sequence does (a
 * window's walk in wider_keys, the rows' count in default_blocks: 426752 bytes against the
 * capacity's 394496 at 91 of 167 rows, window 53 82), so the bound is the largest scratch of
 * any tiles the rules can choose, each at the capacity's lengths: at fixed tiles every piece
 * of it grows with the lengths (forward.c, scratch_sizes). */
static int64_t capacity_forward_scratch(const fa_plan *pl) {
    fa_plan sub;
    fa_varlen_subplan(pl, 0, &sub); /* the capacity's stand-in lengths: one sequence of every row and key */
    const fa_isa_tiles *t = sub.isa->tiles;
    const int64_t widths[] = {t->bk, t->bf16_open_bk, t->long_bk, t->bf16_long_bk, t->bf16_wider_bk};
    int64_t rows = t->bq > t->open_bq ? t->bq : t->open_bq, most = 0;
    rows = rows > t->bf16_open_bq ? rows : t->bf16_open_bq;
    for (int64_t bq = pl->opt_bq ? pl->opt_bq : rows;; bq /= 2) { /* default_blocks halves the rows down to 32 */
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) { /* no mask to fit: packed batches take none */
            sub.fwd_bq = bq, sub.fwd_bk = pl->opt_bk ? pl->opt_bk : widths[i];
            if (sub.fwd_bk <= 0) continue; /* a width this table does not have */
            const int64_t s = fa_cpu_forward_scratch_bytes(&sub);
            most = s > most ? s : most;
        }
        if (pl->opt_bq || bq <= 32) break;
    }
    return most;
}

/* Dense: threads x the driver's per-thread scratch (the backward adds delta, 4 B per query
 * row); packed batches: the largest sequence's (they share it), for a capacity plan the
 * largest any call's can be; decode: its carve-up. */
static int64_t cpu_workspace_bytes(const fa_plan *pl, fa_pass pass) {
    const fa_problem *p = &pl->p;
    if (pl->shape == FA_SHAPE_DECODE) return pass == FA_FORWARD ? fa_decode_workspace_bytes(pl) : 0;
    if (pl->shape == FA_SHAPE_VARLEN) {
        int64_t most = 0;
        for (int64_t b = 0; b < p->batch; b++) {
            fa_plan sub;
            fa_varlen_subplan(pl, b, &sub);
            if (sub.p.seq_q == 0 || sub.p.seq_k == 0) continue; /* no dense call */
            const int64_t w = cpu_workspace_bytes(&sub, pass);
            if (w < 0) return -1;
            if (w > most) most = w;
        }
        if (pl->capacity && pass == FA_FORWARD && p->seq_q > 0 && p->seq_k > 0) {
            const wide w = (wide)pl->threads * capacity_forward_scratch(pl);
            if (w > most) most = narrow(w);
            if (most < 0) return -1;
        }
        return pass == FA_BACKWARD ? narrow((wide)most + fa_varlen_dsink_bytes(pl)) : most; /* varlen.c */
    }
    if (pass == FA_FORWARD) return narrow((wide)pl->threads * fa_cpu_forward_scratch_bytes(pl));
    return fa_cpu_backward_workspace_bytes(pl);
}

static fa_status cpu_forward(const fa_plan *pl, const fa_forward_args *a) {
    if (fa_problem_empty(&pl->p)) return fa_cpu_empty_forward(pl, a);
    if (pl->shape == FA_SHAPE_VARLEN) return fa_cpu_varlen_forward(pl, a);
    if (pl->shape == FA_SHAPE_DECODE) return fa_cpu_decode_forward(pl, a);
    return fa_cpu_forward(pl, a);
}

static fa_status cpu_backward(const fa_plan *pl, const fa_backward_args *a) {
    if (fa_problem_empty(&pl->p)) return fa_cpu_empty_backward(pl, a);
    if (pl->shape == FA_SHAPE_VARLEN) return fa_cpu_varlen_backward(pl, a);
    return fa_cpu_backward(pl, a); /* decode: refused by supports before this */
}

/* id, name, present (always), supports, choose_blocks, workspace_bytes, forward, backward */
const fa_backend_entry fa_backend_cpu_entry = {FA_BACKEND_CPU, "cpu", NULL, cpu_supports, NULL, cpu_choose_blocks,
                                               cpu_workspace_bytes, cpu_forward, cpu_backward};
