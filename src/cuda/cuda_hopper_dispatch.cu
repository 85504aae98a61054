/* Host side of the Hopper forward: whether to use it, whether it covers a problem, and its
 * TMA tensor maps (cuTensorMapEncodeTiled looked up through the runtime's driver entry
 * point, so the library links no libcuda and still loads where no driver is installed). */
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

extern "C" {
#include "cuda_mem.h"
}
#include "cuda_hopper.h"

static std::atomic<long long> hopper_launches{0};

void fa_cuda_hopper_note_launch(void) { hopper_launches++; }
extern "C" long long fa_cuda_hopper_launches(void) { return hopper_launches.load(); }

bool fa_cuda_hopper_selected(void) {
    const char *k = getenv("FA_CUDA_KERNEL");
    if (!k || strcmp(k, "hopper") != 0) return false;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
        cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
}

int fa_cuda_hopper_pingpong(void) {
    const char *e = getenv("FA_CUDA_HOPPER_PINGPONG");
    return e && strcmp(e, "1") == 0;
}

bool fa_cuda_hopper_fwd_eligible(const fa_cuda_params *p, int hd) {
    if (hd != 64 && hd != 128 && hd != 256) return false;
    if (p->D != hd || p->Dv != hd) return false;
    /* TMA: unit column stride, 16-byte aligned base and strides; o: 4-byte pair stores */
    return p->vec_q && p->vec_k && p->vec_v && p->vec_o;
}

static PFN_cuTensorMapEncodeTiled_v12000 lookup_encode(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

cudaError_t fa_cuda_tmap_bhsd(CUtensorMap *map, const void *ptr, bool bf16, int W, int S, int H, int B,
                              const int64_t st[4], int box_w, int box_s) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = lookup_encode();
    if (!encode) return cudaErrorNotSupported;
    const cuuint64_t dims[4] = {(cuuint64_t)W, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)st[2] * 2, (cuuint64_t)st[1] * 2, (cuuint64_t)st[0] * 2};
    const cuuint32_t box[4] = {(cuuint32_t)box_w, (cuuint32_t)box_s, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                        const_cast<void *>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
