/* The CUDA backend when flashattn is built without nvcc: every entry answers that it is
 * not there, so the rest of the library (and plans for backend cuda) still work. */
#include "../internal.h"
#include "cuda_mem.h"

#define FA_NO_CUDA "flashattn was built without CUDA"

int fa_cuda_available(void) { return 0; }

fa_status fa_cuda_forward(const struct fa_plan *plan, const fa_forward_args *a) {
    (void)plan;
    (void)a;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_backward(const struct fa_plan *plan, const fa_backward_args *a) {
    (void)plan;
    (void)a;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}

fa_status fa_cuda_malloc(void **ptr, size_t bytes) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
void fa_cuda_free(void *ptr) { (void)ptr; }
fa_status fa_cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_memset(void *ptr, int value, size_t bytes) {
    (void)ptr, (void)value, (void)bytes;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_synchronize(void) { return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA); }
fa_status fa_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
const char *fa_cuda_device_name(void) { return ""; }
fa_status fa_cuda_fill_random(void *ptr, size_t n, fa_dtype dt, uint64_t seed, float amp) {
    (void)ptr, (void)n, (void)dt, (void)seed, (void)amp;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_event_create(void **ev) {
    if (ev) *ev = NULL;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
void fa_cuda_event_destroy(void *ev) { (void)ev; }
fa_status fa_cuda_event_record(void *ev, void *stream) {
    (void)ev, (void)stream;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
fa_status fa_cuda_event_elapsed_ms(void *start, void *end, float *ms) {
    (void)start, (void)end;
    if (ms) *ms = 0;
    return fa_error(FA_ERR_UNSUPPORTED, FA_NO_CUDA);
}
long long fa_cuda_hopper_launches(void) { return 0; }
int fa_cuda_compute_capability(void) { return 0; }
