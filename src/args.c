/* The one argument check of the public entries (fa_forward, fa_backward, and the MPI
 * entries): every pointer the problem needs (a tensor of 0 elements may be NULL), no pointer
 * for a feature the problem does not have (it would be ignored: a forgotten flag), the
 * caller's workspace against the plan's workspace_bytes, and finite ALiBi slopes where they
 * are in host memory. One message style, "fa_forward: q is NULL"; the drivers trust what
 * passed. */
#include "backend.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const void *ptr;
    const char *name;
    const char *flag; /* the problem's field that enables it (NULL: always on) */
    int on;           /* the problem has the feature */
    int used;         /* ... and the tensor has elements: the pointer is required */
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
    for (size_t i = 0; i < n; i++) {
        if (r[i].on && r[i].used && !r[i].ptr)
            return r[i].flag ? fa_error(FA_ERR_NULL, "%s: %s is NULL (the problem has %s)", fn, r[i].name, r[i].flag)
                             : fa_error(FA_ERR_NULL, "%s: %s is NULL", fn, r[i].name);
        if (!r[i].on && r[i].ptr)
            return fa_error(FA_ERR_INVALID, "%s: %s is given, but the problem does not have %s: it would be ignored",
                            fn, r[i].name, r[i].flag);
    }
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
    const int quant = fa_dtype_quantized(fa_cache_dtype(p)), prefix = decode && p->shared_prefix_len > 0;
    const required r[] = {
        {a->q, "q", NULL, 1, n.q},
        {a->k, decode ? "k (the key cache)" : "k", NULL, 1, n.kv},
        {a->v, decode ? "v (the value cache)" : "v", NULL, 1, n.kv},
        {a->o, "o", NULL, 1, n.o},
        {a->bias, "bias", "has_bias", p->has_bias, n.bias},
        {a->alibi_slopes, "alibi_slopes", "has_alibi", p->has_alibi, n.slopes},
        {a->q_segment_ids, "q_segment_ids", "has_segment_ids", p->has_segment_ids, n.qseg},
        {a->kv_segment_ids, "kv_segment_ids", "has_segment_ids", p->has_segment_ids, n.kvseg},
        {a->k_new, "k_new", "has_new_kv", decode && p->has_new_kv, n.new_kv},
        {a->v_new, "v_new", "has_new_kv", decode && p->has_new_kv, n.new_kv},
        {a->block_table, "block_table", "page_size", decode && p->page_size, n.table},
        {a->sinks, "sinks", "has_sinks", p->has_sinks, n.slopes},
        {a->k_prefix, "k_prefix", "shared_prefix_len", prefix, n.kv},
        {a->v_prefix, "v_prefix", "shared_prefix_len", prefix, n.kv},
        {a->k_scale, "k_scale", "a quantized cache_dtype", quant, n.kv},
        {a->v_scale, "v_scale", "a quantized cache_dtype", quant, n.kv},
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
        {a->q, "q", NULL, 1, n.q},
        {a->k, "k", NULL, 1, n.kv},
        {a->v, "v", NULL, 1, n.kv},
        {a->o, "o", NULL, 1, n.o},
        {a->d_o, "do", NULL, 1, n.o},
        {a->lse, "lse", NULL, 1, n.lse},
        {a->dq, "dq", NULL, 1, n.q},
        {a->dk, "dk", NULL, 1, n.kv},
        {a->dv, "dv", NULL, 1, n.kv},
        {a->bias, "bias", "has_bias", p->has_bias, n.bias},
        {a->alibi_slopes, "alibi_slopes", "has_alibi", p->has_alibi, n.slopes},
        {a->q_segment_ids, "q_segment_ids", "has_segment_ids", p->has_segment_ids, n.qseg},
        {a->kv_segment_ids, "kv_segment_ids", "has_segment_ids", p->has_segment_ids, n.kvseg},
        {a->dbias, "dbias", "bias_grad", p->bias_grad, n.bias},
        {a->sinks, "sinks", "has_sinks", p->has_sinks, n.slopes},
        {a->dsink, "dsink", "has_sinks", p->has_sinks, n.slopes},
    };
    if ((s = check_required(r, sizeof r / sizeof r[0], fn)) ||
        (s = check_workspace(a->workspace, a->workspace_size, workspace, fn)))
        return s;
    if (host && (s = check_sinks(p, a->sinks, fn))) return s;
    return host ? fa_check_slopes(p, a->alibi_slopes, fn) : FA_OK;
}

/* ---- outputs that share memory with inputs ---------------------------------------------
 * The kernels read inputs tile by tile while they write outputs: an output over an input
 * (o over k or v, dv over do) gives wrong values that depend on the tiles, so such calls are
 * refused. Each tensor is compared as the byte range from its lowest to its highest element
 * (its strides and shape as the plan resolved them), which is exact for the usual layouts
 * and refuses a few interleavings of an output with an input whose elements would not meet.
 * Outputs against each other are compared by their elements (share_elements) where their
 * strides allow it, else by their first byte only: dq, dk and dv interleaved in one packed
 * dqkv buffer are disjoint and legitimate, and ranges would refuse them. A decode append's
 * caches (and scales) are read and written, in place by design: against everything else
 * their ranges are compared; against each other their elements, so that k and v of one
 * combined [B, S, 2, Hk, D] cache pass while any element both would write is refused, and
 * so is one whose elements cannot be shown apart. Each output's own elements must have
 * their own addresses (check_output_layout). */

enum { RD = 1, WR = 2 };

typedef struct {
    uintptr_t lo, hi; /* the first and last byte; lo > hi: none (no pointer or no elements) */
    const char *name;
    int use;          /* RD, WR or both */
    int64_t d[4], s[4], es; /* dims, strides (elements) and element bytes */
} extent;

/* A [d0, d1, d2, d3] tensor of es-byte elements with strides st (elements, >= 0). The plan
 * bounded every strided tensor's bytes; the arithmetic saturates all the same. */
static extent strided(const void *ptr, const char *name, int use, const int64_t d[4], const fa_strides *st,
                      int64_t es) {
    extent e = {1, 0, name, use, {d[0], d[1], d[2], d[3]}, {st->s[0], st->s[1], st->s[2], st->s[3]}, es};
    if (!ptr || d[0] <= 0 || d[1] <= 0 || d[2] <= 0 || d[3] <= 0) return e;
    uint64_t last = 0, t;
    int wrap = 0;
    for (int i = 0; i < 4; i++) {
        wrap |= __builtin_mul_overflow((uint64_t)(d[i] - 1), (uint64_t)st->s[i], &t);
        wrap |= __builtin_add_overflow(last, t, &last);
    }
    wrap |= __builtin_add_overflow(last, 1, &last);
    wrap |= __builtin_mul_overflow(last, (uint64_t)es, &last);
    e.lo = (uintptr_t)ptr;
    if (wrap || __builtin_add_overflow(e.lo, (uintptr_t)last - 1, &e.hi)) e.hi = UINTPTR_MAX;
    return e;
}

/* a x b x c contiguous elements of es bytes (a count past int64 saturates: the range then
 * reaches the end of memory). */
static extent flat(const void *ptr, const char *name, int use, int64_t a, int64_t b, int64_t c, int64_t es) {
    int64_t n;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n)) n = INT64_MAX;
    const int64_t d[4] = {1, 1, 1, n};
    const fa_strides st = {{0, 0, 0, 1}};
    return strided(ptr, name, use, d, &st, es);
}

/* The caller's workspace: written by the call, so it may not lie over a tensor either. */
static extent scratch(const void *ws, size_t size) {
    return flat(ws, "workspace", WR, 1, 1, size > (size_t)INT64_MAX ? INT64_MAX : (int64_t)size, 1);
}

static int meet(const extent *a, const extent *b) { return a->lo <= b->hi && b->lo <= a->hi; }

/* The dims of a and b (the same strides and element bytes) for comparing their elements:
 * byte strides S ascending and the bounds [lo, hi] of a's index minus b's, dims of one
 * element in both left out. Returns their count, or -1 where they do not nest (a stride not
 * above the reach of the smaller ones, a zero stride included): nothing is proven then.
 * Nested, the dims give every element its own address (the largest nonzero difference
 * outweighs the rest), as in any dense layout or slice of one. */
static int nested_differences(const extent *a, const extent *b, int64_t S[4], int64_t lo[4], int64_t hi[4]) {
    int64_t reach = 0;
    int k = 0;
    for (int i = 0; i < 4; i++) {
        if (a->d[i] == 1 && b->d[i] == 1) continue;
        if (a->s[i] <= 0 || a->s[i] > INT64_MAX / 4 / a->es) return -1;
        S[k] = a->s[i] * a->es, lo[k] = 1 - b->d[i], hi[k] = a->d[i] - 1;
        for (int j = k++; j > 0 && S[j - 1] > S[j]; j--) { /* insertion sort, all three together */
            int64_t x = S[j];
            S[j] = S[j - 1], S[j - 1] = x;
            x = lo[j], lo[j] = lo[j - 1], lo[j - 1] = x;
            x = hi[j], hi[j] = hi[j - 1], hi[j - 1] = x;
        }
    }
    for (int j = 0; j < k; j++) {
        if (reach + a->es > S[j]) return -1;
        const int64_t c = -lo[j] > hi[j] ? -lo[j] : hi[j];
        if (c > (INT64_MAX / 2 - reach) / S[j]) return -1;
        reach += c * S[j];
    }
    return k;
}

/* Whether index differences c_k in [lo_k, hi_k] over the first k dims (nested byte strides
 * S, ascending) bring sum c_k S_k within es bytes of t. Nested, only the two multiples of
 * the top stride around t can leave a remainder the dims below reach: at most 2^k paths. */
static int differences_reach(int64_t t, const int64_t *S, const int64_t *lo, const int64_t *hi, int k, int64_t es) {
    if (k == 0) return t > -es && t < es;
    const int64_t top = S[k - 1], c0 = t / top - (t % top < 0); /* floor */
    for (int64_t c = c0; c <= c0 + 1; c++)
        if (c >= lo[k - 1] && c <= hi[k - 1] && differences_reach(t - c * top, S, lo, hi, k - 1, es)) return 1;
    return 0;
}

/* Whether two tensors whose ranges meet have an element in common: 1 or 0, exact where
 * they have the same strides and element size and their dims nest (k and v of one combined
 * cache, dq, dk and dv of one packed buffer); -1 where that is not known. */
static int share_elements(const extent *a, const extent *b) {
    int64_t S[4], lo[4], hi[4];
    if (a->es != b->es || memcmp(a->s, b->s, sizeof a->s)) return -1;
    const int k = nested_differences(a, b, S, lo, hi);
    if (k < 0) return -1;
    const uintptr_t t = b->lo - a->lo; /* b's first byte from a's, two's complement */
    return differences_reach((int64_t)t, S, lo, hi, k, a->es);
}

/* Whether an element of a tensor (nested byte strides S ascending, counts d, es-byte
 * elements; offsets from its first byte) has a byte in [lo, hi]. The elements of top index c
 * span [c T, c T + R] (T its stride, R the reach below it, less than T: nested): only the
 * first and the last c whose span meets the interval can miss it, any c between lies in it. */
static int element_in(const int64_t *S, const int64_t *d, int k, int64_t lo, int64_t hi, int64_t es) {
    if (k == 0) return lo <= es - 1 && hi >= 0;
    int64_t R = es - 1;
    for (int j = 0; j < k - 1; j++) R += (d[j] - 1) * S[j];
    const int64_t T = S[k - 1];
    int64_t c0 = lo - R <= 0 ? 0 : (lo - R + T - 1) / T, c1 = hi < 0 ? -1 : hi / T; /* ceil, floor */
    c1 = c1 < d[k - 1] - 1 ? c1 : d[k - 1] - 1;
    if (c0 > c1) return 0;
    if (c1 - c0 >= 2) return 1;
    return element_in(S, d, k - 1, lo - c0 * T, hi - c0 * T, es) || element_in(S, d, k - 1, lo - c1 * T, hi - c1 * T, es);
}

/* Whether a is dense (its elements fill every byte of its range) and b has an element in that
 * range: then they share memory, whatever b's strides. 0 where a has gaps or b's dims do not
 * nest (check_output_layout refused such outputs already). */
static int dense_holds(const extent *a, const extent *b) {
    int64_t n = a->es, S[4], lo[4], hi[4], d[4];
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(n, a->d[i], &n)) return 0;
    if ((uint64_t)n != (uint64_t)(a->hi - a->lo) + 1) return 0;
    const int k = nested_differences(b, b, S, lo, hi);
    if (k < 0) return 0;
    for (int j = 0; j < k; j++) d[j] = hi[j] + 1;
    return element_in(S, d, k, (int64_t)(a->lo - b->lo), (int64_t)(a->hi - b->lo), b->es);
}

/* FA_ERR_INVALID unless every element of an output (or of a cache an append writes) has its
 * own address: a stride of 0 over a dimension of more than one element writes them all to
 * one, and strides that do not nest (nested_differences) are not shown apart. */
static fa_status check_output_layout(const char *name, const int64_t d[4], const fa_strides *st, int64_t es,
                                     const char *fn) {
    static const char *const dims[4] = {"batch items", "heads", "rows", "columns"};
    if (!(d[0] && d[1] && d[2] && d[3])) return FA_OK;
    for (int i = 0; i < 4; i++)
        if (d[i] > 1 && st->s[i] == 0)
            return fa_error(FA_ERR_INVALID, "%s: %s stride %d is 0 over %lld %s: an output's elements may not share "
                            "an address", fn, name, i, (long long)d[i], dims[i]);
    const extent e = strided((const void *)(uintptr_t)64, name, WR, d, st, es);
    int64_t S[4], lo[4], hi[4];
    if (nested_differences(&e, &e, S, lo, hi) < 0)
        return fa_error(FA_ERR_INVALID, "%s: %s's strides {%lld, %lld, %lld, %lld} over dims {%lld, %lld, %lld, %lld} "
                        "do not give each element its own address (each stride must exceed the reach of the smaller "
                        "ones, as in a dense layout or a slice of one)", fn, name, (long long)st->s[0],
                        (long long)st->s[1], (long long)st->s[2], (long long)st->s[3], (long long)d[0],
                        (long long)d[1], (long long)d[2], (long long)d[3]);
    return FA_OK;
}

/* FA_ERR_INVALID naming the first pair of n extents that may not share memory (above). */
static fa_status check_overlaps(const extent *e, int n, const char *fn) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const extent *a = &e[i], *b = &e[j];
            if (a->lo > a->hi || b->lo > b->hi || !((a->use | b->use) & WR)) continue;
            if (a->use == WR && b->use == WR) {
                if (a->lo == b->lo)
                    return fa_error(FA_ERR_INVALID, "%s: outputs %s and %s are the same buffer (both start at %p)", fn,
                                    a->name, b->name, (void *)a->lo);
                /* interleaved is fine, a shared element is not: exact where the strides are the same, or
                 * where one of the two is dense; other pairs are compared by their first byte alone */
                const int shared = meet(a, b) ? share_elements(a, b) : 0;
                if (shared == 1 || (shared < 0 && (dense_holds(a, b) || dense_holds(b, a))))
                    return fa_error(FA_ERR_INVALID, "%s: outputs %s (bytes %p..%p) and %s (bytes %p..%p) share "
                                    "elements", fn, a->name, (void *)a->lo, (void *)a->hi, b->name, (void *)b->lo,
                                    (void *)b->hi);
                continue;
            }
            if (!meet(a, b)) continue;
            if (a->use == (RD | WR) && b->use == (RD | WR)) {
                if (share_elements(a, b) == 0) continue;
                return fa_error(FA_ERR_INVALID, "%s: %s (bytes %p..%p) and %s (bytes %p..%p) share memory, and the "
                                "appended tokens write both: pass separate buffers", fn, a->name, (void *)a->lo,
                                (void *)a->hi, b->name, (void *)b->lo, (void *)b->hi);
            }
            if (!(a->use & WR) || ((a->use & RD) && b->use == WR)) { /* name the one only written first */
                const extent *x = a;
                a = b, b = x;
            }
            return fa_error(FA_ERR_INVALID, "%s: %s (bytes %p..%p) overlaps %s (bytes %p..%p): an output may not share "
                            "memory with an input", fn, a->name, (void *)a->lo, (void *)a->hi, b->name, (void *)b->lo,
                            (void *)b->hi);
        }
    return FA_OK;
}

fa_status fa_check_forward_overlaps(const fa_problem *p, const fa_forward_args *a, const char *fn) {
    const int decode = fa_problem_decode(p), append = decode && p->has_new_kv;
    const int quant = fa_dtype_quantized(fa_cache_dtype(p));
    const int64_t L = fa_problem_varlen(p) ? 1 : p->batch, B = p->batch, Hq = p->heads_q, Hk = p->heads_kv;
    const int64_t Sq = p->seq_q, Sk = p->seq_k, D = p->head_dim, Dv = p->head_dim_v, P = p->shared_prefix_len;
    const int64_t es = (int64_t)fa_dtype_size(p->dtype), ces = (int64_t)fa_dtype_size(fa_cache_dtype(p));
    const int paged = decode && p->page_size;
    const int64_t n0 = paged ? p->num_pages : L, rows = paged ? p->page_size : Sk;
    const int64_t qd[4] = {L, Hq, Sq, D}, od[4] = {L, Hq, Sq, Dv}, kd[4] = {n0, Hk, rows, D}, vd[4] = {n0, Hk, rows, Dv};
    const int64_t bd[4] = {p->bias_batch, p->bias_heads, p->bias_seq_q, Sk};
    const int cache = append ? RD | WR : RD, scales = quant && decode ? cache : 0;
    fa_status s;
    if ((s = check_output_layout("o", od, &p->o_stride, es, fn)) ||
        (append && ((s = check_output_layout("k (the key cache)", kd, &p->k_stride, ces, fn)) ||
                    (s = check_output_layout("v (the value cache)", vd, &p->v_stride, ces, fn)))))
        return s;
    const extent e[] = {
        strided(a->o, "o", WR, od, &p->o_stride, es),
        flat(a->lse, "lse", WR, L, Hq, Sq, 4),
        strided(a->q, "q", RD, qd, &p->q_stride, es),
        strided(a->k, decode ? "k (the key cache)" : "k", cache, kd, &p->k_stride, ces),
        strided(a->v, decode ? "v (the value cache)" : "v", cache, vd, &p->v_stride, ces),
        strided(p->has_bias ? a->bias : NULL, "bias", RD, bd, &p->bias_stride, 4),
        flat(p->has_alibi ? a->alibi_slopes : NULL, "alibi_slopes", RD, 1, 1, Hq, 4),
        flat(p->has_segment_ids ? a->q_segment_ids : NULL, "q_segment_ids", RD, 1, B, Sq, 4),
        flat(p->has_segment_ids ? a->kv_segment_ids : NULL, "kv_segment_ids", RD, 1, B, Sk, 4),
        flat(p->has_sinks ? a->sinks : NULL, "sinks", RD, 1, 1, Hq, 4),
        flat(append ? a->k_new : NULL, "k_new", RD, B * Sq, Hk, D, es),
        flat(append ? a->v_new : NULL, "v_new", RD, B * Sq, Hk, Dv, es),
        flat(paged ? a->block_table : NULL, "block_table", RD, 1, B, p->max_pages, 4),
        flat(decode && P > 0 ? a->k_prefix : NULL, "k_prefix", RD, P, Hk, D, es),
        flat(decode && P > 0 ? a->v_prefix : NULL, "v_prefix", RD, P, Hk, Dv, es),
        flat(scales ? a->k_scale : NULL, "k_scale", scales, n0, rows, Hk, 4),
        flat(scales ? a->v_scale : NULL, "v_scale", scales, n0, rows, Hk, 4),
        flat(a->cache_seqlens, "cache_seqlens", RD, 1, 1, B, 4),
        flat(a->cu_seqlens_q, "cu_seqlens_q", RD, 1, 1, B + 1, 4),
        flat(a->cu_seqlens_k, "cu_seqlens_k", RD, 1, 1, B + 1, 4),
        scratch(a->workspace, a->workspace_size), /* written too: over a tensor it would change it */
        flat(a->counts, "counts", WR, 1, 1, (int64_t)sizeof *a->counts, 1),
    };
    return check_overlaps(e, (int)(sizeof e / sizeof e[0]), fn);
}

fa_status fa_check_backward_overlaps(const fa_problem *p, const fa_backward_args *a, const char *fn) {
    const int64_t L = fa_problem_varlen(p) ? 1 : p->batch, B = p->batch, Hq = p->heads_q, Hk = p->heads_kv;
    const int64_t Sq = p->seq_q, Sk = p->seq_k, D = p->head_dim, Dv = p->head_dim_v;
    const int64_t es = (int64_t)fa_dtype_size(p->dtype);
    const int64_t qd[4] = {L, Hq, Sq, D}, od[4] = {L, Hq, Sq, Dv}, kd[4] = {L, Hk, Sk, D}, vd[4] = {L, Hk, Sk, Dv};
    const int64_t bd[4] = {p->bias_batch, p->bias_heads, p->bias_seq_q, Sk};
    fa_status s;
    if ((s = check_output_layout("dq", qd, &p->q_stride, es, fn)) ||
        (s = check_output_layout("dk", kd, &p->k_stride, es, fn)) ||
        (s = check_output_layout("dv", vd, &p->v_stride, es, fn)))
        return s;
    const extent e[] = {
        strided(a->dq, "dq", WR, qd, &p->q_stride, es),
        strided(a->dk, "dk", WR, kd, &p->k_stride, es),
        strided(a->dv, "dv", WR, vd, &p->v_stride, es),
        flat(p->bias_grad ? a->dbias : NULL, "dbias", WR, p->bias_batch * p->bias_heads, p->bias_seq_q, Sk, 4),
        flat(p->has_sinks ? a->dsink : NULL, "dsink", WR, 1, 1, Hq, 4),
        strided(a->q, "q", RD, qd, &p->q_stride, es),
        strided(a->k, "k", RD, kd, &p->k_stride, es),
        strided(a->v, "v", RD, vd, &p->v_stride, es),
        strided(a->o, "o", RD, od, &p->o_stride, es),
        strided(a->d_o, "do", RD, od, &p->o_stride, es),
        flat(a->lse, "lse", RD, L, Hq, Sq, 4),
        strided(p->has_bias ? a->bias : NULL, "bias", RD, bd, &p->bias_stride, 4),
        flat(p->has_alibi ? a->alibi_slopes : NULL, "alibi_slopes", RD, 1, 1, Hq, 4),
        flat(p->has_segment_ids ? a->q_segment_ids : NULL, "q_segment_ids", RD, 1, B, Sq, 4),
        flat(p->has_segment_ids ? a->kv_segment_ids : NULL, "kv_segment_ids", RD, 1, B, Sk, 4),
        flat(p->has_sinks ? a->sinks : NULL, "sinks", RD, 1, 1, Hq, 4),
        scratch(a->workspace, a->workspace_size),
        flat(a->counts, "counts", WR, 1, 1, (int64_t)sizeof *a->counts, 1),
    };
    return check_overlaps(e, (int)(sizeof e / sizeof e[0]), fn);
}
