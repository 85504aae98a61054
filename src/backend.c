/* The backend table and the combinations no backend runs (backend.h). */
#include "backend.h"

#include <stddef.h>

const fa_backend_entry *fa_backend_of(fa_backend b) {
    if (b == FA_BACKEND_CPU) return &fa_backend_cpu_entry;
    if (b == FA_BACKEND_CUDA) return &fa_backend_cuda_entry;
    return NULL;
}

/* The GPU first where this build has its kernels (its present() then looks for a device);
 * the CPU last, as it runs every combination that combines at all. */
static const fa_backend_entry *const order[] = {
#ifdef FA_HAVE_CUDA
    &fa_backend_cuda_entry,
#endif
    &fa_backend_cpu_entry,
};

const fa_backend_entry *const *fa_backend_order(int *n) {
    *n = (int)(sizeof order / sizeof order[0]);
    return order;
}

const char *fa_inference_feature(const fa_problem *p) {
    if (p->cu_seqlens_q || p->cu_seqlens_k) return "packed variable-length batches (cu_seqlens)";
    if (p->cache_seqlens) return "kv-cache decoding (cache_seqlens)";
    if (p->has_new_kv) return "new keys and values for the cache (has_new_kv)";
    if (p->page_size || p->num_pages || p->max_pages) return "a paged kv cache (page_size, num_pages, max_pages)";
    return NULL;
}

fa_status fa_supports_common(const fa_problem *p, fa_pass pass, unsigned uses) {
    const int varlen = p->cu_seqlens_q || p->cu_seqlens_k, decode = p->cache_seqlens != NULL;
    const char *shape = fa_inference_feature(p);
    if (varlen && decode)
        return fa_error(FA_ERR_INVALID, "packed variable-length batches (cu_seqlens) do not combine with kv-cache "
                                        "decoding (cache_seqlens)");
    if (varlen && (p->has_new_kv || p->page_size || p->num_pages || p->max_pages))
        return fa_error(FA_ERR_INVALID, "%s do not combine with packed variable-length batches (cu_seqlens): they "
                                        "belong to kv-cache decoding",
                        p->has_new_kv ? "new keys and values (has_new_kv)" : "pages (page_size, num_pages, max_pages)");
    if (uses & FA_USE_SEQ_PARALLEL) {
        if (shape) return fa_error(FA_ERR_INVALID, "sequence parallel (ring, ulysses) does not combine with %s", shape);
        if (p->has_bias)
            return fa_error(FA_ERR_INVALID, "an additive bias (has_bias) does not combine with sequence parallel "
                                            "(ring, ulysses): it is not supported there");
    }
    if (varlen || decode) {
        const char *what = varlen ? "packed variable-length batches (cu_seqlens)" : "kv-cache decoding (cache_seqlens)";
        if (p->has_bias) return fa_error(FA_ERR_INVALID, "an additive bias (has_bias) does not combine with %s", what);
        if (p->has_segment_ids)
            return fa_error(FA_ERR_INVALID, "segment ids (has_segment_ids) do not combine with %s", what);
        if (p->bias_grad) return fa_error(FA_ERR_INVALID, "dbias (bias_grad) does not combine with %s", what);
    }
    if (fa_dtype_quantized(fa_cache_dtype(p)) && !decode) /* varlen, dense: decoding's caches only */
        return fa_error(FA_ERR_INVALID, "a quantized kv cache (cache_dtype %s) does not combine with %s: it is a cache of "
                                        "kv-cache decoding (cache_seqlens)",
                        fa_dtype_name(p->cache_dtype), varlen ? "packed variable-length batches (cu_seqlens)" :
                                                       pass == FA_BACKWARD ? "the backward pass" : "dense attention");
    if (decode && pass == FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "kv-cache decoding (cache_seqlens) does not combine with the backward pass: "
                                        "decoding has no backward");
    return FA_OK;
}
