/* A parallel region's counts (flops, transcendentals), summed by its threads with integer
 * atomics. Not OpenMP's reduction clause: GCC combines two reduction variables under
 * libgomp's one process-wide lock (GOMP_atomic_start), and a fork taken while any thread
 * of the parent held it (another call finishing its region) left the child's copy held for
 * good: the child's first call hung (1 fork in ~300 under load; src/fork.c). Integer sums do
 * not depend on their order, so the totals are the same bits. */
#ifndef FA_CPU_COUNTS_SUM_H
#define FA_CPU_COUNTS_SUM_H

#include "../internal.h"

#include <stdatomic.h>

typedef struct {
    atomic_llong flops, trans;
} fa_counts_sum;

static inline void fa_counts_sum_init(fa_counts_sum *s, int64_t flops, int64_t trans) {
    atomic_init(&s->flops, flops);
    atomic_init(&s->trans, trans);
}

/* One thread's counts, added at the end of its share of the region. */
static inline void fa_counts_sum_add(fa_counts_sum *s, const fa_counts *c) {
    atomic_fetch_add_explicit(&s->flops, c->flops, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->trans, c->transcendentals, memory_order_relaxed);
}

/* The totals, after the region (its end is a barrier). */
static inline fa_counts fa_counts_sum_get(fa_counts_sum *s) {
    fa_counts c = {atomic_load(&s->flops), atomic_load(&s->trans)};
    return c;
}

#endif
