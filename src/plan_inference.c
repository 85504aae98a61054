/* Plans of the inference shapes (docs/semantics.md, "Which keys a row sees"): packed
 * variable-length batches (cu_seqlens) and kv-cache decoding (cache_seqlens, optionally paged). Validates the
 * length arrays and the pages, fills the packed and cache layouts' default strides, and
 * copies the lengths into the plan (they are plan inputs: O(batch), read once). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int all_zero(const fa_strides *st) { return !st->s[0] && !st->s[1] && !st->s[2] && !st->s[3]; }

/* A row-major [rows, heads, width] tensor as [B, H, S, D] strides (per item: item_stride). */
static void default_layout(fa_strides *st, int64_t item_stride, int64_t heads, int64_t width) {
    if (!all_zero(st)) return;
    st->s[0] = item_stride;
    st->s[1] = width;
    st->s[2] = heads * width;
    st->s[3] = 1;
}

/* exact: the last entry must be total (the plan's packed rows); else at most total (a call
 * of a lengths-per-call plan: seq_q and seq_k are its capacities). */
static fa_status check_cu(const char *name, const int32_t *cu, int64_t batch, int64_t total, int exact) {
    if (cu[0] != 0) return fa_error(FA_ERR_INVALID, "%s[0] must be 0, got %d", name, cu[0]);
    for (int64_t b = 1; b <= batch; b++)
        if (cu[b] < cu[b - 1])
            return fa_error(FA_ERR_INVALID, "%s must be non-decreasing: %s[%lld] = %d < %s[%lld] = %d", name, name,
                            (long long)b, cu[b], name, (long long)(b - 1), cu[b - 1]);
    if (cu[batch] > total)
        return fa_error(FA_ERR_INVALID, "%s[%lld] = %d reaches past the packed tensor's %lld rows", name,
                        (long long)batch, cu[batch], (long long)total);
    if (exact && cu[batch] != total)
        return fa_error(FA_ERR_INVALID, "%s[%lld] = %d must equal the packed tensor's %lld rows", name,
                        (long long)batch, cu[batch], (long long)total);
    return FA_OK;
}

static fa_status copy_lens(fa_plan *pl, const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    pl->lens = fa_malloc(sizeof(int32_t) * (size_t)(na + nb));
    if (!pl->lens) return fa_error(FA_ERR_NO_MEMORY, "fa_plan_create: cannot copy %lld lengths", (long long)(na + nb));
    memcpy(pl->lens, a, sizeof(int32_t) * (size_t)na);
    if (nb) memcpy(pl->lens + na, b, sizeof(int32_t) * (size_t)nb);
    return FA_OK;
}

fa_status fa_check_cu_seqlens(const fa_problem *p, const int32_t *cu_q, const int32_t *cu_k, int exact) {
    fa_status s = check_cu("cu_seqlens_q", cu_q, p->batch, p->seq_q, exact);
    return s ? s : check_cu("cu_seqlens_k", cu_k, p->batch, p->seq_k, exact);
}

/* A lengths-per-call plan's stand-in lengths, its capacities: every row and key in the
 * first sequence (the largest workspace any call can have; docs/semantics.md says which of
 * its figures bound every call), or every cache full (the largest workspace and cost once
 * the chunks and tiles a shorter call may cross are counted: fa_decode_chunks). */
static fa_status capacity_lens(fa_plan *pl) {
    fa_problem *p = &pl->p;
    const int varlen = p->lengths_per_call == FA_LENGTHS_PACKED;
    const int64_t n = varlen ? 2 * (p->batch + 1) : p->batch, newk = p->has_new_kv ? p->seq_q : 0;
    if (varlen ? p->cu_seqlens_q || p->cu_seqlens_k : p->cache_seqlens != NULL)
        return fa_error(FA_ERR_INVALID, "lengths_per_call takes the lengths with each call (fa_forward_args): the "
                                        "problem's %s must be NULL",
                        varlen ? "cu_seqlens_q and cu_seqlens_k" : "cache_seqlens");
    if (!varlen && p->seq_k < newk)
        return fa_error(FA_ERR_INVALID, "seq_k (%lld, the cache capacity) is below the %lld new tokens of a call",
                        (long long)p->seq_k, (long long)newk);
    int32_t *cap = fa_malloc(sizeof(int32_t) * (size_t)n);
    if (!cap) return fa_error(FA_ERR_NO_MEMORY, "fa_plan_create: cannot allocate %lld lengths", (long long)n);
    for (int64_t b = 0; b < (varlen ? p->batch + 1 : p->batch); b++) {
        if (varlen) cap[b] = b ? (int32_t)p->seq_q : 0, cap[p->batch + 1 + b] = b ? (int32_t)p->seq_k : 0;
        else cap[b] = (int32_t)(p->seq_k - newk);
    }
    pl->lens = cap;
    pl->capacity = 1;
    if (varlen) p->cu_seqlens_q = cap, p->cu_seqlens_k = cap + p->batch + 1;
    else p->cache_seqlens = cap;
    return FA_OK;
}

static fa_status validate_varlen(fa_plan *pl) {
    fa_problem *p = &pl->p;
    if (!p->cu_seqlens_q || !p->cu_seqlens_k)
        return fa_error(FA_ERR_NULL, "cu_seqlens_q and cu_seqlens_k go together, but %s is NULL",
                        p->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q");
    fa_status s;
    /* a plan's lengths end at its packed rows; a capacity plan's stand-ins (capacity_lens) may
     * not: with no sequences (batch 0) they are {0} whatever rows the tensors may have */
    if ((s = fa_check_cu_seqlens(p, p->cu_seqlens_q, p->cu_seqlens_k, !pl->capacity)) ||
        (!pl->lens && (s = copy_lens(pl, p->cu_seqlens_q, p->batch + 1, p->cu_seqlens_k, p->batch + 1))))
        return s;
    p->cu_seqlens_q = pl->lens;
    p->cu_seqlens_k = pl->lens + p->batch + 1;
    default_layout(&p->q_stride, 0, p->heads_q, p->head_dim);
    default_layout(&p->k_stride, 0, p->heads_kv, p->head_dim);
    default_layout(&p->v_stride, 0, p->heads_kv, p->head_dim_v);
    default_layout(&p->o_stride, 0, p->heads_q, p->head_dim_v);
    p->k_stride.s[0] = p->v_stride.s[0] = p->q_stride.s[0] = p->o_stride.s[0] = 0; /* batch 1 views */
    pl->shape = FA_SHAPE_VARLEN;
    return FA_OK;
}

/* A paged cache's strides are not negative and its largest byte offset fits int64. */
static fa_status check_pages_reach(const char *name, const fa_strides *st, const int64_t dims[4], int64_t es) {
    for (int i = 0; i < 4; i++)
        if (st->s[i] < 0)
            return fa_error(FA_ERR_INVALID, "%s's stride of dim %d (%s) is negative: %lld", name, i,
                            fa_stride_dim_name(i), (long long)st->s[i]);
    return fa_check_reach(name, st, dims, es);
}

fa_status fa_check_cache_seqlens(const fa_problem *p, const int32_t *lens) {
    const int64_t newk = p->has_new_kv ? p->seq_q : 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int32_t n = lens[b];
        if (n < 0)
            return fa_error(FA_ERR_INVALID, "cache_seqlens[%lld] = %d is negative", (long long)b, n);
        if (n + newk > p->seq_k)
            return fa_error(FA_ERR_INVALID,
                            "cache_seqlens[%lld] = %d plus %lld new tokens exceeds the cache capacity %lld%s",
                            (long long)b, n, (long long)newk, (long long)p->seq_k,
                            p->page_size ? " (max_pages x page_size)" : " (S_cache_max)");
    }
    return FA_OK;
}

static fa_status validate_decode(fa_plan *pl) {
    fa_problem *p = &pl->p;
    const int64_t B = p->batch;
    if (p->shared_prefix_len < 0 || p->shared_prefix_len > INT32_MAX - p->seq_k)
        return fa_error(FA_ERR_INVALID, "shared_prefix_len must be in [0, %lld] (prefix and cache positions fit int32), "
                                        "got %lld",
                        (long long)(INT32_MAX - p->seq_k), (long long)p->shared_prefix_len);
    if (p->page_size) {
        if (p->page_size < 0 || p->page_size % 16)
            return fa_error(FA_ERR_INVALID, "page_size must be a positive multiple of 16, got %lld",
                            (long long)p->page_size);
        /* max_pages 0: a cache of capacity 0 (docs/semantics.md, "Empty problems"), as a dense one */
        if (p->num_pages < 0 || p->max_pages < 0 || (p->max_pages > 0 && p->num_pages < 1))
            return fa_error(FA_ERR_INVALID, "paged caches need max_pages >= 0 and, with max_pages >= 1, num_pages >= 1; "
                                            "got num_pages %lld and max_pages %lld",
                            (long long)p->num_pages, (long long)p->max_pages);
        int64_t cap;
        if (__builtin_mul_overflow(p->max_pages, p->page_size, &cap) || cap != p->seq_k)
            return fa_error(FA_ERR_INVALID, "seq_k (%lld) must be max_pages (%lld) x page_size (%lld) for paged caches",
                            (long long)p->seq_k, (long long)p->max_pages, (long long)p->page_size);
    } else if (p->num_pages || p->max_pages) {
        return fa_error(FA_ERR_INVALID, "num_pages and max_pages need a page_size");
    }
    fa_status s = fa_check_cache_seqlens(p, p->cache_seqlens);
    if (s || (!pl->lens && (s = copy_lens(pl, p->cache_seqlens, B, NULL, 0)))) return s;
    p->cache_seqlens = pl->lens;
    const int64_t Hq = p->heads_q, Hk = p->heads_kv, D = p->head_dim, Dv = p->head_dim_v, Sq = p->seq_q;
    const int64_t rows = p->page_size ? p->page_size : p->seq_k;
    default_layout(&p->q_stride, Sq * Hq * D, Hq, D);
    default_layout(&p->o_stride, Sq * Hq * Dv, Hq, Dv);
    default_layout(&p->k_stride, rows * Hk * D, Hk, D);
    default_layout(&p->v_stride, rows * Hk * Dv, Hk, Dv);
    if (p->page_size) {
        const int64_t kd[4] = {p->num_pages, Hk, p->page_size, D}, vd[4] = {p->num_pages, Hk, p->page_size, Dv};
        const int64_t es = (int64_t)fa_dtype_size(fa_cache_dtype(p));
        if ((s = check_pages_reach("k", &p->k_stride, kd, es)) || (s = check_pages_reach("v", &p->v_stride, vd, es)))
            return s;
    }
    pl->shape = FA_SHAPE_DECODE;
    return FA_OK;
}

fa_status fa_validate_inference(fa_plan *pl) {
    fa_problem *p = &pl->p;
    const int varlen = p->cu_seqlens_q || p->cu_seqlens_k || p->lengths_per_call == FA_LENGTHS_PACKED;
    const int decode = p->cache_seqlens || p->lengths_per_call == FA_LENGTHS_CACHE;
    /* combinations with other features, and decoding's parts without it (new rows, pages, a
     * shared prefix), were refused by the backend's supports (fa_supports_common) */
    if (!varlen && !decode) return FA_OK;
    const char *what = varlen ? "cu_seqlens" : "cache_seqlens";
    if (p->batch > INT32_MAX) return fa_error(FA_ERR_INVALID, "batch %lld is too large for %s", (long long)p->batch, what);
    fa_status s;
    if (p->lengths_per_call && (s = capacity_lens(pl))) return s;
    return varlen ? validate_varlen(pl) : validate_decode(pl);
}

void fa_varlen_subplan(const fa_plan *pl, int64_t b, fa_plan *sub) {
    *sub = *pl;
    const int32_t *cq = pl->p.cu_seqlens_q, *ck = pl->p.cu_seqlens_k;
    sub->p.batch = 1;
    sub->p.seq_q = cq[b + 1] - cq[b];
    sub->p.seq_k = ck[b + 1] - ck[b];
    sub->p.cu_seqlens_q = sub->p.cu_seqlens_k = NULL;
    sub->shape = FA_SHAPE_DENSE;
    sub->lens = NULL;
    sub->off = fa_sched_off(sub->p.seq_q, sub->p.seq_k, pl->p.has_diag_offset, pl->p.diag_offset);
    sub->lse_rows = pl->p.seq_q;
    if (pl->backend == FA_BACKEND_CPU) fa_cpu_sequence_blocks(sub); /* its own tiles: batch invariance */
    sub->batch0 = pl->batch0 + b; /* the parent's dropout_batch0 (fa_plan_create), then the sequence */
}

void fa_decode_key_span(const fa_plan *pl, int64_t b, int64_t *lo, int64_t *hi) {
    const fa_sched s = fa_decode_sched(pl, b);
    fa_sched_span(&s, 0, pl->p.seq_q, lo, hi);
}
