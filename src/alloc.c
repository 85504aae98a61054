/* fa_malloc, fa_calloc, fa_free (alloc.h), with the test-only failure injection. */
#include "alloc.h"

#include <stdlib.h>

#ifdef FA_ALLOC_FAILURE_INJECTION
#include <stdatomic.h>

static atomic_llong calls;
static atomic_llong fail_at = -1; /* -1: not set yet (read FA_ALLOC_FAIL_AT); 0: off */

void fa_alloc_fail_at(int64_t n) {
    atomic_store(&calls, 0);
    atomic_store(&fail_at, n > 0 ? n : 0);
}

int64_t fa_alloc_count(void) { return atomic_load(&calls); }

/* Counts this allocation; 1 if it is the one to fail. */
static int injected_failure(void) {
    long long at = atomic_load(&fail_at);
    if (at < 0) {
        const char *e = getenv("FA_ALLOC_FAIL_AT");
        long long want = e && *e ? strtoll(e, NULL, 10) : 0;
        long long unset = -1;
        atomic_compare_exchange_strong(&fail_at, &unset, want > 0 ? want : 0);
        at = atomic_load(&fail_at);
    }
    return atomic_fetch_add(&calls, 1) + 1 == at;
}
#else
static int injected_failure(void) { return 0; }
#endif

/* malloc(0) may return NULL, which every caller reads as no memory: ask for 1 byte instead. */
void *fa_malloc(size_t bytes) { return injected_failure() ? NULL : malloc(bytes ? bytes : 1); }

void *fa_calloc(size_t count, size_t size) {
    return injected_failure() ? NULL : count && size ? calloc(count, size) : calloc(1, 1);
}

void fa_free(void *p) { free(p); }
