/* The one argument check of the public entries (fa_forward, fa_backward, and the MPI
 * entries): every pointer the problem needs, the caller's workspace
 * against the plan's workspace_bytes, and finite ALiBi slopes where they are in host
 * memory. One message style, "fa_forward: q is NULL"; the drivers trust what passed. */
#include "backend.h"

#include <stddef.h>

typedef struct {
    const void *ptr;
    const char *name;
    int used;
} required;

static fa_status check_required(const required *r, size_t n, const char *fn) {
    for (size_t i = 0; i < n; i++)
        if (r[i].used && !r[i].ptr) return fa_error(FA_ERR_NULL, "%s: %s is NULL", fn, r[i].name);
    return FA_OK;
}

static fa_status check_workspace(const void *ws, size_t size, int64_t need, const char *fn) {
    if (ws && size < (size_t)need)
        return fa_error(FA_ERR_INVALID, "%s: workspace_size is %zu bytes but this plan needs %lld", fn, size,
                        (long long)need);
    return FA_OK;
}

fa_status fa_check_forward_args(const fa_problem *p, const fa_forward_args *a, int64_t workspace, int host,
                                const char *fn) {
    if (!a) return fa_error(FA_ERR_NULL, "%s: args is NULL", fn);
    const int decode = p->cache_seqlens != NULL;
    const required r[] = {
        {a->q, "q", 1},
        {a->k, decode ? "k (the key cache)" : "k", 1},
        {a->v, decode ? "v (the value cache)" : "v", 1},
        {a->o, "o", 1},
        {a->bias, "bias (the problem has_bias)", p->has_bias},
        {a->alibi_slopes, "alibi_slopes (the problem has_alibi)", p->has_alibi},
        {a->q_segment_ids, "q_segment_ids (the problem has_segment_ids)", p->has_segment_ids},
        {a->kv_segment_ids, "kv_segment_ids (the problem has_segment_ids)", p->has_segment_ids},
        {a->k_new, "k_new (the problem has_new_kv)", decode && p->has_new_kv},
        {a->v_new, "v_new (the problem has_new_kv)", decode && p->has_new_kv},
        {a->block_table, "block_table (the problem has page_size)", decode && p->page_size},
        {a->k_scale, "k_scale (the problem has a quantized cache_dtype)", fa_dtype_quantized(fa_cache_dtype(p))},
        {a->v_scale, "v_scale (the problem has a quantized cache_dtype)", fa_dtype_quantized(fa_cache_dtype(p))},
    };
    fa_status s;
    if ((s = check_required(r, sizeof r / sizeof r[0], fn)) ||
        (s = check_workspace(a->workspace, a->workspace_size, workspace, fn)))
        return s;
    return host ? fa_check_slopes(p, a->alibi_slopes, fn) : FA_OK;
}

fa_status fa_check_backward_args(const fa_problem *p, const fa_backward_args *a, int64_t workspace, int host,
                                 const char *fn) {
    if (!a) return fa_error(FA_ERR_NULL, "%s: args is NULL", fn);
    fa_status s;
    const required r[] = {
        {a->q, "q", 1},
        {a->k, "k", 1},
        {a->v, "v", 1},
        {a->o, "o", 1},
        {a->d_o, "do", 1},
        {a->lse, "lse", 1},
        {a->dq, "dq", 1},
        {a->dk, "dk", 1},
        {a->dv, "dv", 1},
        {a->bias, "bias (the problem has_bias)", p->has_bias},
        {a->alibi_slopes, "alibi_slopes (the problem has_alibi)", p->has_alibi},
        {a->q_segment_ids, "q_segment_ids (the problem has_segment_ids)", p->has_segment_ids},
        {a->kv_segment_ids, "kv_segment_ids (the problem has_segment_ids)", p->has_segment_ids},
        {a->dbias, "dbias (the problem has bias_grad)", p->bias_grad},
    };
    if ((s = check_required(r, sizeof r / sizeof r[0], fn)) ||
        (s = check_workspace(a->workspace, a->workspace_size, workspace, fn)))
        return s;
    return host ? fa_check_slopes(p, a->alibi_slopes, fn) : FA_OK;
}
