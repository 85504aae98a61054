/* Device memory and timing helpers for the command line, the tests and the benchmark (not
 * exported from the shared library; link flashattn_static). Without CUDA every call
 * returns FA_ERR_UNSUPPORTED ("flashattn was built without CUDA"). Errors set
 * fa_last_error(). */
#ifndef FA_CUDA_MEM_H
#define FA_CUDA_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

fa_status fa_cuda_malloc(void **ptr, size_t bytes);
void fa_cuda_free(void *ptr); /* NULL is fine */
fa_status fa_cuda_memcpy_to_device(void *dst, const void *src, size_t bytes);
fa_status fa_cuda_memcpy_to_host(void *dst, const void *src, size_t bytes);
fa_status fa_cuda_memset(void *ptr, int value, size_t bytes);
fa_status fa_cuda_synchronize(void);
/* Free and total bytes of the current device. */
fa_status fa_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* The device's name, or "" without one. */
const char *fa_cuda_device_name(void);

/* n elements of dtype dt, uniform in [-amp, amp) from a counter-based hash of seed (the
 * same values for the same seed); asynchronous on the default stream. */
fa_status fa_cuda_fill_random(void *ptr, size_t n, fa_dtype dt, uint64_t seed, float amp);

/* Events for timing on a stream (NULL: the default stream). */
fa_status fa_cuda_event_create(void **ev);
void fa_cuda_event_destroy(void *ev);
fa_status fa_cuda_event_record(void *ev, void *stream);
/* Milliseconds between two recorded events (waits for the second). */
fa_status fa_cuda_event_elapsed_ms(void *start, void *end, float *ms);

/* How many times the Hopper forward kernel has been launched in this process (it runs only
 * under FA_CUDA_KERNEL=hopper on sm_90; the tests check the opt-in reached it). */
long long fa_cuda_hopper_launches(void);
/* The current device's compute capability as 10 * major + minor (90: Hopper), 0 without one. */
int fa_cuda_compute_capability(void);

#ifdef __cplusplus
}
#endif
#endif
