/* The CPU backward's entry and the frame its schedules run in (backward_run.h): the
 * arguments, the workspace, delta, the threads, progress and counts. What a schedule
 * computes, and in which order, is in its own file (backward.c, backward_fused.c). */
#include "backward_run.h"
#include "counts_sum.h"
#include "progress.h"

#include <omp.h>
#include <stdlib.h>

int64_t fa_cpu_backward_scratch_bytes(const struct fa_plan *plan) {
    return plan->bwd_fused ? fa_cpu_backward_fused_scratch_bytes(plan) : fa_cpu_backward_two_pass_scratch_bytes(plan);
}

/* The workspace: FA_BWD_ALIGN bytes of slack (a caller's buffer may start anywhere), delta
 * (4 B per query row, rounded up to FA_BWD_ALIGN), then each thread's scratch. -1 if it
 * does not fit int64. The cost model's workspace_bytes (backend_cpu.c) is this figure. */
int64_t fa_cpu_backward_workspace_bytes(const struct fa_plan *plan) {
    const fa_problem *p = &plan->p;
    /* the plan's threads, as the forward's figure takes them: a forked child runs fewer
     * (fa_call_threads) in the same bytes, and no figure of a plan depends on the process */
    const int threads = plan->threads > 0 ? plan->threads : 1;
    const __int128 rows = (__int128)p->batch * p->heads_q * p->seq_q;
    const __int128 delta = (rows * 4 + FA_BWD_ALIGN - 1) / FA_BWD_ALIGN * FA_BWD_ALIGN;
    const __int128 need = FA_BWD_ALIGN + delta + (__int128)threads * fa_cpu_backward_scratch_bytes(plan);
    return need > INT64_MAX ? -1 : (int64_t)need;
}

/* The arguments and the workspace size were checked at the entry (args.c). */
fa_status fa_cpu_backward(const struct fa_plan *plan, const fa_backward_args *a) {
    fa_status st;
    const int64_t need = fa_cpu_backward_workspace_bytes(plan);

    char *ws = a->workspace, *owned = NULL;
    if (!ws) {
        owned = fa_malloc((size_t)need);
        if (!owned)
            return fa_error(FA_ERR_NO_MEMORY, "fa_backward: cannot allocate %lld bytes of workspace",
                            (long long)need);
        ws = owned;
    }
    st = plan->bwd_fused ? fa_cpu_backward_fused(plan, a, ws) : fa_cpu_backward_two_pass(plan, a, ws);
    fa_free(owned);
    return st;
}

/* -sum over (b, i) of exp(sink_h - lse) * delta, b then i ascending, in double so that
 * B * Sq terms lose nothing to the order; f32 at the end. */
static float dsink_head(const fa_plan *pl, const fa_backward_args *a, const float *delta, int64_t h) {
    const fa_problem *p = &pl->p;
    double sum = 0.0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seq_q; i++)
            sum += (double)(expf(a->sinks[h] - a->lse[fa_lse_index(pl, b, h, i)]) *
                            delta[(b * p->heads_q + h) * p->seq_q + i]);
    return (float)(0.0 - sum); /* +0 for a zero sum, as the other paths give */
}

fa_status fa_bwd_run(const fa_plan *pl, const fa_backward_args *a, char *ws, int64_t scratch_bytes,
                     int64_t items, int64_t steps, fa_bwd_item_fn *item) {
    const fa_problem *p = &pl->p;
    const int threads = fa_call_threads(pl);
    const int64_t rows = p->batch * p->heads_q * p->seq_q;
    char *start = ws + (FA_BWD_ALIGN - (uintptr_t)ws % FA_BWD_ALIGN) % FA_BWD_ALIGN;
    float *delta = (float *)start;
    char *scratch_base = start + fa_bwd_round_up(4 * rows);
    const fa_bwd_ctx c = {pl, a, delta, fa_dtype_size(p->dtype),
                          fa_score_ctx_make(pl, a->bias, a->alibi_slopes, a->q_segment_ids, a->kv_segment_ids),
                          fa_plan_dropout(pl)};
    fa_counts_sum sum;
    fa_counts_sum_init(&sum, 0, 0);
    fa_progress progress;
    fa_progress_init(&progress, a->progress, a->progress_ctx, steps);

#pragma omp parallel num_threads(threads)
    {
        char *mine = scratch_base + (int64_t)omp_get_thread_num() * scratch_bytes;
        mine += (FA_BWD_ALIGN - (uintptr_t)mine % FA_BWD_ALIGN) % FA_BWD_ALIGN; /* within the slack */
        fa_counts cnt = {0, 0};

#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) delta[r] = fa_bwd_delta_row(p, a, r);
        /* the implicit barrier above publishes delta */
        if (p->has_sinks) {
            /* dsink_h = -sum over (b, i) of exp(sink_h - lse) delta: one head per iteration, its
             * rows in order, so the sum does not depend on the threads (docs/semantics.md) */
#pragma omp for schedule(static) nowait
            for (int64_t h = 0; h < p->heads_q; h++) a->dsink[h] = dsink_head(pl, a, delta, h);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < items; t++) fa_progress_step(&progress, item(&c, mine, t, &cnt));
        fa_counts_sum_add(&sum, &cnt);
    }
    const fa_counts total = fa_counts_sum_get(&sum);
    /* with sinks, one exp per row for dsink */
    fa_counts_report(a->counts, total.flops, total.transcendentals + (p->has_sinks ? rows : 0));
    return FA_OK;
}
