/* Every heap allocation of the library and the command line goes through these, so that a
 * test-only build (CMake FA_ALLOC_FAILURE_INJECTION) can make the n-th one fail and check
 * that each caller reports FA_ERR_NO_MEMORY (the CLI: exit 1), frees what it holds and
 * leaves no partial output. In other builds they are malloc, calloc and free. */
#ifndef FA_ALLOC_H
#define FA_ALLOC_H

#include "flashattn.h" /* exports fa_malloc and fa_free (the CLI allocates through them) */

#include <stddef.h>
#include <stdint.h>

void *fa_malloc(size_t bytes);
void *fa_calloc(size_t count, size_t size);
void fa_free(void *p);

#ifdef FA_ALLOC_FAILURE_INJECTION
/* Makes the n-th allocation from now fail (1: the next one); n <= 0 turns it off. Resets
 * the count. Without a call, the environment variable FA_ALLOC_FAIL_AT=n does the same from
 * the program's start. */
void fa_alloc_fail_at(int64_t n);
/* Allocations since the last fa_alloc_fail_at (or the start), the failed one included. */
int64_t fa_alloc_count(void);
#endif

#endif
