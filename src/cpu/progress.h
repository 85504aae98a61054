/* Progress of a long CPU call: the drivers count finished work items, and the caller's
 * callback hears of it at most once per percent, one thread at a time (a lock of the
 * call's own: an OpenMP critical section is one process-wide lock, which a fork taken while
 * another call's thread held it left held in the child, src/fork.c). */
#ifndef FA_CPU_PROGRESS_H
#define FA_CPU_PROGRESS_H

#include "../internal.h"

#include <sched.h>
#include <stdatomic.h>

typedef struct {
    fa_progress_fn fn;
    void *ctx;
    int64_t total;
    atomic_llong done;
    atomic_int percent; /* the last percent reported */
    atomic_flag busy;   /* held while the callback runs */
} fa_progress;

static inline void fa_progress_init(fa_progress *pr, fa_progress_fn fn, void *ctx, int64_t total) {
    pr->fn = fn;
    pr->ctx = ctx;
    pr->total = total > 0 ? total : 1;
    atomic_init(&pr->done, 0);
    atomic_init(&pr->percent, 0);
    atomic_flag_clear(&pr->busy);
}

/* n more items done. Reports are made inside one critical section and only when they move
 * the percent forward, so the callback sees strictly increasing figures, ending at total. */
static inline void fa_progress_step(fa_progress *pr, int64_t n) {
    if (!pr->fn) return;
    long long done = atomic_fetch_add(&pr->done, n) + n;
    int pct = (int)(done * 100 / pr->total);
    if (pct <= atomic_load(&pr->percent)) return; /* the common case: no lock */
    while (atomic_flag_test_and_set_explicit(&pr->busy, memory_order_acquire)) sched_yield();
    if (pct > atomic_load(&pr->percent)) {
        atomic_store(&pr->percent, pct);
        pr->fn(pr->ctx, done, pr->total);
    }
    atomic_flag_clear_explicit(&pr->busy, memory_order_release);
}

#endif
