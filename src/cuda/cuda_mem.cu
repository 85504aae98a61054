/* The device-memory, timing and random-fill helpers of cuda_mem.h, for the command line,
 * the tests and the benchmark. */
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "../internal.h"
#include "cuda_mem.h"
}
#include "cuda_common.cuh"

static fa_status cuda_fail(cudaError_t e, const char *what) {
    cudaGetLastError();
    return fa_error(FA_ERR_BACKEND, "CUDA error in %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

extern "C" fa_status fa_cuda_malloc(void **ptr, size_t bytes) {
    if (!ptr) return fa_error(FA_ERR_NULL, "fa_cuda_malloc: ptr is NULL");
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return fa_error(FA_ERR_NO_MEMORY, "cannot allocate %zu bytes of device memory", bytes);
    }
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaMalloc");
}
extern "C" void fa_cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}
extern "C" fa_status fa_cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaMemcpy (to device)");
}
extern "C" fa_status fa_cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaMemcpy (to host)");
}
extern "C" fa_status fa_cuda_memset(void *ptr, int value, size_t bytes) {
    cudaError_t e = cudaMemset(ptr, value, bytes);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaMemset");
}
extern "C" fa_status fa_cuda_synchronize(void) {
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaDeviceSynchronize");
}
extern "C" fa_status fa_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes)
        return fa_error(FA_ERR_NULL, "fa_cuda_mem_info: %s is NULL", !free_bytes ? "free_bytes" : "total_bytes");
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaMemGetInfo");
}
extern "C" const char *fa_cuda_device_name(void) {
    static char name[256];
    cudaDeviceProp prop;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        return "";
    }
    memcpy(name, prop.name, sizeof name < sizeof prop.name ? sizeof name : sizeof prop.name);
    name[sizeof name - 1] = '\0';
    return name;
}
extern "C" int fa_cuda_compute_capability(void) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
        cudaGetLastError();
        return 0;
    }
    return 10 * major + minor;
}
extern "C" fa_status fa_cuda_event_create(void **ev) {
    if (!ev) return fa_error(FA_ERR_NULL, "fa_cuda_event_create: ev is NULL");
    cudaEvent_t e0;
    cudaError_t e = cudaEventCreate(&e0);
    *ev = e == cudaSuccess ? (void *)e0 : NULL;
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaEventCreate");
}
extern "C" void fa_cuda_event_destroy(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" fa_status fa_cuda_event_record(void *ev, void *stream) {
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaEventRecord");
}
extern "C" fa_status fa_cuda_event_elapsed_ms(void *start, void *end, float *ms) {
    if (!start || !end || !ms)
        return fa_error(FA_ERR_NULL, "fa_cuda_event_elapsed_ms: %s is NULL", !start ? "start" : !end ? "end" : "ms");
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)end);
    if (e == cudaSuccess) e = cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "cudaEventElapsedTime");
}

/* splitmix64 of (seed, index) -> uniform in [-amp, amp), rounded to the dtype */
template <int DT> __global__ void fill_kernel(void *ptr, size_t n, uint64_t seed, float amp) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float x = ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp;
        if (DT == FA_F32) ((float *)ptr)[i] = x;
        else if (DT == FA_BF16) ((uint16_t *)ptr)[i] = from_f32<true>(x);
        else ((uint16_t *)ptr)[i] = from_f32<false>(x);
    }
}

extern "C" fa_status fa_cuda_fill_random(void *ptr, size_t n, fa_dtype dt, uint64_t seed, float amp) {
    if (dt != FA_F32 && dt != FA_F16 && dt != FA_BF16) /* the kernels write 4 or 2 bytes an element */
        return fa_error(FA_ERR_INVALID, "fa_cuda_fill_random: dtype %d is not f32, f16 or bf16", (int)dt);
    if (!ptr && n) return fa_error(FA_ERR_NULL, "fa_cuda_fill_random: ptr is NULL");
    const unsigned blocks = (unsigned)(n / 256 + 1 < 65536 ? n / 256 + 1 : 65536);
    if (dt == FA_F32) fill_kernel<FA_F32><<<blocks, 256>>>(ptr, n, seed, amp);
    else if (dt == FA_BF16) fill_kernel<FA_BF16><<<blocks, 256>>>(ptr, n, seed, amp);
    else fill_kernel<FA_F16><<<blocks, 256>>>(ptr, n, seed, amp);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FA_OK : cuda_fail(e, "the random fill kernel");
}
