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

int fa_problem_varlen(const fa_problem *p) {
    return p->cu_seqlens_q || p->cu_seqlens_k || p->lengths_per_call == FA_LENGTHS_PACKED;
}
int fa_problem_decode(const fa_problem *p) { return p->cache_seqlens || p->lengths_per_call == FA_LENGTHS_CACHE; }

/* The inference shapes as messages name them: by the field that made them (a plan from
 * capacities has lengths_per_call and no arrays yet). */
static const char *varlen_words(const fa_problem *p) {
    return p->lengths_per_call == FA_LENGTHS_PACKED ? "packed variable-length batches (lengths_per_call FA_LENGTHS_PACKED)"
                                                    : "packed variable-length batches (cu_seqlens)";
}
static const char *decode_words(const fa_problem *p) {
    return p->lengths_per_call == FA_LENGTHS_CACHE ? "kv-cache decoding (lengths_per_call FA_LENGTHS_CACHE)"
                                                   : "kv-cache decoding (cache_seqlens)";
}

const char *fa_inference_feature(const fa_problem *p) {
    if (fa_problem_varlen(p)) return varlen_words(p);
    if (fa_problem_decode(p)) return decode_words(p);
    if (p->has_new_kv) return "new keys and values for the cache (has_new_kv)";
    if (p->page_size || p->num_pages || p->max_pages) return "a paged kv cache (page_size, num_pages, max_pages)";
    return NULL;
}

fa_status fa_supports_common(const fa_problem *p, fa_pass pass, unsigned uses) {
    const int varlen = fa_problem_varlen(p), decode = fa_problem_decode(p);
    const char *shape = fa_inference_feature(p);
    if (varlen && decode)
        return fa_error(FA_ERR_INVALID, "%s do not combine with %s", varlen_words(p), decode_words(p));
    if (!varlen && !decode && (p->has_new_kv || p->page_size || p->num_pages || p->max_pages))
        return fa_error(FA_ERR_INVALID, "%s need kv-cache decoding (cache_seqlens, or lengths_per_call "
                                        "FA_LENGTHS_CACHE)",
                        p->has_new_kv ? "new keys and values (has_new_kv)" : "pages (page_size, num_pages, max_pages)");
    if (varlen && (p->has_new_kv || p->page_size || p->num_pages || p->max_pages))
        return fa_error(FA_ERR_INVALID, "%s do not combine with %s: they belong to kv-cache decoding",
                        p->has_new_kv ? "new keys and values (has_new_kv)" : "pages (page_size, num_pages, max_pages)",
                        varlen_words(p));
    if (uses & FA_USE_SEQ_PARALLEL) {
        if (shape) return fa_error(FA_ERR_INVALID, "sequence parallel (ring, ulysses) does not combine with %s", shape);
        if (fa_problem_empty(p))
            return fa_error(FA_ERR_INVALID, "sequence parallel (ring, ulysses) does not combine with zero sizes "
                                            "(batch, heads_q, seq_q or seq_k 0): run the empty problem on one rank");
        if (p->has_bias)
            return fa_error(FA_ERR_INVALID, "an additive bias (has_bias) does not combine with sequence parallel "
                                            "(ring, ulysses): it is not supported there");
        if (p->dropout_p > 0.0f) /* a rank's block would draw its mask at its own local indices */
            return fa_error(FA_ERR_INVALID, "dropout (dropout_p > 0) does not combine with sequence parallel "
                                            "(ring, ulysses): it is not supported there");
    }
    if (decode && p->dropout_p > 0.0f)
        return fa_error(FA_ERR_INVALID, "dropout (dropout_p > 0) does not combine with %s: decoding is inference",
                        decode_words(p));
    if (p->mask && (uses & FA_USE_SEQ_PARALLEL))
        return fa_error(FA_ERR_INVALID, "a block-sparse mask (mask) does not combine with sequence parallel (ring, "
                                        "ulysses): it is not supported there");
    if (varlen || decode) {
        const char *what = varlen ? varlen_words(p) : decode_words(p);
        if (p->mask)
            return fa_error(FA_ERR_INVALID, "a block-sparse mask (mask) does not combine with %s: a mask is laid out "
                                            "for one dense [seq_q, seq_k] problem",
                            what);
        if (p->has_bias) return fa_error(FA_ERR_INVALID, "an additive bias (has_bias) does not combine with %s", what);
        if (p->has_segment_ids)
            return fa_error(FA_ERR_INVALID, "segment ids (has_segment_ids) do not combine with %s", what);
        if (p->bias_grad) return fa_error(FA_ERR_INVALID, "dbias (bias_grad) does not combine with %s", what);
    }
    if (p->shared_prefix_len && !decode)
        return fa_error(FA_ERR_INVALID, "a shared prefix (shared_prefix_len) needs kv-cache decoding (cache_seqlens or "
                                        "lengths_per_call FA_LENGTHS_CACHE)%s%s",
                        varlen ? "; it does not combine with " : "", varlen ? varlen_words(p) : "");
    if (p->shared_prefix_len && p->has_diag_offset)
        return fa_error(FA_ERR_INVALID, "a shared prefix (shared_prefix_len) does not combine with a diagonal offset "
                                        "(has_diag_offset): its masks align bottom-right over prefix and cache");
    if (p->lengths_per_call == FA_LENGTHS_PACKED && pass == FA_BACKWARD) /* decoding's: below */
        return fa_error(FA_ERR_INVALID, "lengths per call (lengths_per_call) does not combine with the backward pass: "
                                        "plan the backward with its lengths (cu_seqlens)");
    if (fa_dtype_quantized(fa_cache_dtype(p)) && !decode) /* varlen, dense: decoding's caches only */
        return fa_error(FA_ERR_INVALID, "a quantized kv cache (cache_dtype %s) does not combine with %s: it is a cache of "
                                        "kv-cache decoding (cache_seqlens)",
                        fa_dtype_name(p->cache_dtype), varlen ? varlen_words(p) :
                                                       pass == FA_BACKWARD ? "the backward pass" : "dense attention");
    if (fa_dtype_quantized(fa_cache_dtype(p)) && p->shared_prefix_len)
        return fa_error(FA_ERR_INVALID, "a quantized kv cache (cache_dtype %s) does not combine with a shared prefix "
                                        "(shared_prefix_len): the prefix is kept in the problem's dtype",
                        fa_dtype_name(p->cache_dtype));
    if (decode && pass == FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "%s does not combine with the backward pass: decoding has no backward",
                        decode_words(p));
    return FA_OK;
}
