/* Calls in a process forked from one that used flashattn run on one thread.
 *
 * GCC's OpenMP runtime (libgomp) keeps a pool of worker threads; fork copies only the
 * calling thread, and the child's first parallel region with more than one thread then waits
 * for workers that do not exist (a hang, seen from Python's os.fork and multiprocessing's
 * default start method on Linux). A team of one thread never touches the pool, so the child
 * runs every call serially: same results (no figure of a plan depends on the threads that
 * run it, docs/semantics.md), one core. A process started anew (exec, multiprocessing's
 * "spawn") gets its threads back. The handler is registered when the library is loaded,
 * before anything of it can have started the pool (a plan's call, or fa_cpu_exp_rate: a
 * handler registered with the first plan missed a parent that had only measured the exp
 * rate, and a child that made its first plan after the fork). Nor may a call take one of
 * libgomp's process-wide locks (a reduction of two variables, a critical section): a fork
 * while another thread of the parent held one left it held in the child, whose first call
 * hung there; the drivers sum counts with atomics (cpu/counts_sum.h) and report progress
 * under a lock of the call's own (cpu/progress.h); tests/test_fork_locks.sh checks. */
#include "internal.h"

#include <pthread.h>

static volatile int forked_child;
static pthread_once_t registered = PTHREAD_ONCE_INIT;

static void in_child(void) { forked_child = 1; }
static void register_handler(void) { pthread_atfork(NULL, NULL, in_child); }

void fa_fork_guard(void) { pthread_once(&registered, register_handler); }
__attribute__((constructor)) static void register_at_load(void) { fa_fork_guard(); }

int fa_threads_after_fork(int threads) { return forked_child ? 1 : threads; }

int fa_call_threads(const struct fa_plan *pl) { return fa_threads_after_fork(pl->threads > 0 ? pl->threads : 1); }
