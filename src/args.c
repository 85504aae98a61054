/* The one argument check of the public entries (fa_forward, fa_backward, and the MPI
 * entries): every pointer the problem needs (a tensor of 0 elements may be NULL), the caller's workspace
 * against the plan's workspace_bytes, and finite ALiBi slopes where they are in host
 * memory. One message style, "fa_forward: q is NULL"; the drivers trust what passed. */
#include "backend.h"

#include <stddef.h>

typedef struct {
    const void *ptr;
    const char *name;
    int used;
} required;

/* Whether a tensor of these dims has elements: one of 0 elements may be NULL (numpy and
 * other callers may pass any pointer, NULL included, for an empty array; nothing reads it). */
static int has(int64_t a, int64_t b, int64_t c, int64_t d) { return a && b && c && d; }

/* The element-bearing sizes of one problem's tensors (packed batches: one sequence of the
 * totals; paged caches: their pages). */
typedef struct {
    int q, kv, o, lse, bias, slopes, qseg, kvseg, new_kv, table;
} nonempty;

static nonempty tensors_of(const fa_problem *p) {
    const int packed = p->cu_seqlens_q || p->lengths_per_call == FA_LENGTHS_PACKED;
    const int64_t L = packed ? 1 : p->batch, Hq = p->heads_q, Hk = p->heads_kv;
    const int64_t cache = fa_problem_decode(p) && p->page_size ? p->num_pages * p->page_size : L * p->seq_k;
    nonempty n;
    n.q = has(L, Hq, p->seq_q, p->head_dim);
    n.kv = has(cache, Hk, p->head_dim, p->head_dim_v);
    n.o = n.lse = has(L, Hq, p->seq_q, 1);
    n.bias = has(p->bias_batch, p->bias_heads, p->bias_seq_q, p->seq_k);
    n.slopes = Hq > 0;
    n.qseg = has(p->batch, p->seq_q, 1, 1);
    n.kvseg = has(p->batch, p->seq_k, 1, 1);
    n.new_kv = has(p->batch, p->seq_q, Hk, 1);
    n.table = has(p->batch, p->max_pages, 1, 1);
    return n;
}

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

/* FA_ERR_INVALID unless every sink logit (Hq of them) is finite: an infinite sink would
 * empty every row or make it NaN (docs/semantics.md, "Attention sinks"). */
static fa_status check_sinks(const fa_problem *p, const float *sinks, const char *fn) {
    if (!p->has_sinks || !sinks) return FA_OK;
    for (int64_t h = 0; h < p->heads_q; h++)
        if (!isfinite(sinks[h]))
            return fa_error(FA_ERR_INVALID, "%s: sinks[%lld] (head %lld) is %g; sinks must be finite", fn,
                            (long long)h, (long long)h, (double)sinks[h]);
    return FA_OK;
}

fa_status fa_check_forward_args(const fa_problem *p, const fa_forward_args *a, int64_t workspace, int host,
                                const char *fn) {
    if (!a) return fa_error(FA_ERR_NULL, "%s: args is NULL", fn);
    const int decode = fa_problem_decode(p);
    const nonempty n = tensors_of(p);
    const required r[] = {
        {a->q, "q", n.q},
        {a->k, decode ? "k (the key cache)" : "k", n.kv},
        {a->v, decode ? "v (the value cache)" : "v", n.kv},
        {a->o, "o", n.o},
        {a->bias, "bias (the problem has_bias)", p->has_bias && n.bias},
        {a->alibi_slopes, "alibi_slopes (the problem has_alibi)", p->has_alibi && n.slopes},
        {a->q_segment_ids, "q_segment_ids (the problem has_segment_ids)", p->has_segment_ids && n.qseg},
        {a->kv_segment_ids, "kv_segment_ids (the problem has_segment_ids)", p->has_segment_ids && n.kvseg},
        {a->k_new, "k_new (the problem has_new_kv)", decode && p->has_new_kv && n.new_kv},
        {a->v_new, "v_new (the problem has_new_kv)", decode && p->has_new_kv && n.new_kv},
        {a->block_table, "block_table (the problem has page_size)", decode && p->page_size && n.table},
        {a->sinks, "sinks (the problem has_sinks)", p->has_sinks && n.slopes},
        {a->k_prefix, "k_prefix (the problem has shared_prefix_len)", decode && p->shared_prefix_len > 0 && n.kv},
        {a->v_prefix, "v_prefix (the problem has shared_prefix_len)", decode && p->shared_prefix_len > 0 && n.kv},
        {a->k_scale, "k_scale (the problem has a quantized cache_dtype)", fa_dtype_quantized(fa_cache_dtype(p)) && n.kv},
        {a->v_scale, "v_scale (the problem has a quantized cache_dtype)", fa_dtype_quantized(fa_cache_dtype(p)) && n.kv},
    };
    fa_status s;
    if ((s = check_required(r, sizeof r / sizeof r[0], fn)) ||
        (s = check_workspace(a->workspace, a->workspace_size, workspace, fn)))
        return s;
    /* an append writes both caches (and both scale arrays): one buffer passed as both would
     * get k's rows and then v's over them */
    if (decode && p->has_new_kv && n.kv && a->k == a->v)
        return fa_error(FA_ERR_INVALID, "%s: k and v (the caches) are the same buffer, and the appended tokens write "
                        "both", fn);
    if (decode && p->has_new_kv && n.kv && fa_dtype_quantized(fa_cache_dtype(p)) && a->k_scale == a->v_scale)
        return fa_error(FA_ERR_INVALID, "%s: k_scale and v_scale are the same buffer, and the appended tokens write "
                        "both", fn);
    if (host && (s = check_sinks(p, a->sinks, fn))) return s;
    return host ? fa_check_slopes(p, a->alibi_slopes, fn) : FA_OK;
}

fa_status fa_check_backward_args(const fa_problem *p, const fa_backward_args *a, int64_t workspace, int host,
                                 const char *fn) {
    if (!a) return fa_error(FA_ERR_NULL, "%s: args is NULL", fn);
    fa_status s;
    const nonempty n = tensors_of(p);
    const required r[] = {
        {a->q, "q", n.q},
        {a->k, "k", n.kv},
        {a->v, "v", n.kv},
        {a->o, "o", n.o},
        {a->d_o, "do", n.o},
        {a->lse, "lse", n.lse},
        {a->dq, "dq", n.q},
        {a->dk, "dk", n.kv},
        {a->dv, "dv", n.kv},
        {a->bias, "bias (the problem has_bias)", p->has_bias && n.bias},
        {a->alibi_slopes, "alibi_slopes (the problem has_alibi)", p->has_alibi && n.slopes},
        {a->q_segment_ids, "q_segment_ids (the problem has_segment_ids)", p->has_segment_ids && n.qseg},
        {a->kv_segment_ids, "kv_segment_ids (the problem has_segment_ids)", p->has_segment_ids && n.kvseg},
        {a->dbias, "dbias (the problem has bias_grad)", p->bias_grad && n.bias},
        {a->sinks, "sinks (the problem has_sinks)", p->has_sinks && n.slopes},
        {a->dsink, "dsink (the problem has_sinks)", p->has_sinks && n.slopes},
    };
    if ((s = check_required(r, sizeof r / sizeof r[0], fn)) ||
        (s = check_workspace(a->workspace, a->workspace_size, workspace, fn)))
        return s;
    if (host && (s = check_sinks(p, a->sinks, fn))) return s;
    return host ? fa_check_slopes(p, a->alibi_slopes, fn) : FA_OK;
}
