/* The frame the two CPU backward schedules run in (backward_run.c): fa_cpu_backward checks
 * the arguments, takes the workspace ([B, Hq, Sq] floats of delta, then each thread's
 * scratch) and hands it to the plan's schedule (backward.c: two passes; backward_fused.c:
 * one pass), which states its work items and runs them through fa_bwd_run. */
#ifndef FA_CPU_BACKWARD_RUN_H
#define FA_CPU_BACKWARD_RUN_H

#include "backward_tile.h"

/* Work item t of a schedule, on one thread's scratch (FA_BWD_ALIGN-aligned, within the
 * scratch_bytes fa_bwd_run was given); adds what it computed to cnt and returns its progress steps. */
typedef int64_t fa_bwd_item_fn(const fa_bwd_ctx *c, char *scratch, int64_t t, fa_counts *cnt);

/* Fills delta, then runs items 0 .. items - 1, each by one thread in any order (every output
 * element must belong to one item, so the results do not depend on the threads), reports
 * progress out of steps and the counts. ws: the checked workspace. */
fa_status fa_bwd_run(const fa_plan *pl, const fa_backward_args *a, char *ws, int64_t scratch_bytes,
                     int64_t items, int64_t steps, fa_bwd_item_fn *item);

/* The two-pass schedule (backward.c): its per-thread scratch and the pass itself, as the
 * one-pass schedule's in internal.h. */
int64_t fa_cpu_backward_two_pass_scratch_bytes(const fa_plan *plan);
fa_status fa_cpu_backward_two_pass(const fa_plan *plan, const fa_backward_args *a, char *workspace);

#endif /* FA_CPU_BACKWARD_RUN_H */
