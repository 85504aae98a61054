/* The device helpers the tests use beyond the public ones (flashattn.h: fa_cuda_malloc,
 * copies, events, fill_random): not exported from the shared library; link flashattn_static.
 * Without CUDA every call returns FA_ERR_UNSUPPORTED or "" / 0. Errors set fa_last_error(). */
#ifndef FA_CUDA_MEM_H
#define FA_CUDA_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device's name, or "" without one. */
const char *fa_cuda_device_name(void);
fa_status fa_cuda_memset(void *ptr, int value, size_t bytes);

/* How many times the Hopper forward kernel has been launched in this process (it runs only
 * under FA_CUDA_KERNEL=hopper on sm_90; the tests check the opt-in reached it). */
long long fa_cuda_hopper_launches(void);
/* The current device's compute capability as 10 * major + minor (90: Hopper), 0 without one. */
int fa_cuda_compute_capability(void);

#ifdef __cplusplus
}
#endif
#endif
