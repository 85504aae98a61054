/* The allocation-failure tests' one check of a call (test_alloc_failure*.c): its status,
 * given whether the injected failure fired (the allocation count reached n). Returns 1 when
 * the call failed as it should. CHECK is check.h's. */

#ifndef FA_TEST_ALLOC_EXPECT_H
#define FA_TEST_ALLOC_EXPECT_H

#include "check.h"

#include <stdint.h>

static int expect_no_memory(const char *what, int64_t n, fa_status st, int64_t count) {
    const int fired = count >= n;
    if (st == FA_OK) {
        CHECK(!fired, "%s: allocation %lld failed but the call returned FA_OK", what, (long long)n);
        return 0;
    }
    CHECK(fired && st == FA_ERR_NO_MEMORY && fa_last_error()[0],
          "%s with allocation %lld failing: %s (%s), want FA_ERR_NO_MEMORY with a message", what, (long long)n,
          fa_status_string(st), fa_last_error());
    return 1;
}

#endif
