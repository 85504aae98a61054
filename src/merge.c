/* fa_merge_states (docs/semantics.md, "Merging attention states"): the state of attention
 * over two disjoint key sets from each set's (o, lse), as FlashInfer's merge_state. A state
 * is o = sum_j p_j v_j / sum_j p_j and lse = log sum_j p_j over its keys, so the union's is
 * lse = logaddexp(lse_a, lse_b) and o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b. Each row
 * runs in double from the largest of the lse (no overflow, and -inf, an empty state, is an
 * exact zero weight) and is rounded once to f32, then to the dtype. An attention sink
 * (a logit with no value) adds e^sink to the denominator only, once: partial states never
 * include it, the final merge does. */
#include "internal.h"

#include <math.h>

/* Row r, head h: the weights of a, b and the sink relative to the largest term. */
static void merge_row(fa_dtype t, int64_t Dv, const void *oa, const void *ob, int64_t at, double la, double lb,
                      int has_sink, double sink, void *o, float *lse_out) {
    if (isnan(la) || isnan(lb)) { /* a NaN score upstream: the merged state is NaN too */
        for (int64_t x = 0; x < Dv; x++) fa_store(t, o, at + x, NAN);
        *lse_out = NAN;
        return;
    }
    double m = la > lb ? la : lb;
    if (has_sink && sink > m) m = sink;
    if (m == -INFINITY) { /* both empty and no sink: no key at all */
        for (int64_t x = 0; x < Dv; x++) fa_store(t, o, at + x, 0.0f);
        *lse_out = -INFINITY;
        return;
    }
    const double wa = exp(la - m), wb = exp(lb - m), ws = has_sink ? exp(sink - m) : 0.0, den = wa + wb + ws;
    for (int64_t x = 0; x < Dv; x++) {
        double v = 0.0; /* an empty state's o is never read: its weight is an exact 0 */
        if (wa > 0.0) v += wa * (double)fa_load(t, oa, at + x);
        if (wb > 0.0) v += wb * (double)fa_load(t, ob, at + x);
        fa_store(t, o, at + x, (float)(v / den));
    }
    *lse_out = (float)(m + log(den));
}

/* Whether the n bytes at x and the m bytes at y share one. */
static int share(const void *x, uint64_t n, const void *y, uint64_t m) {
    if (!x || !y || !n || !m) return 0;
    const uintptr_t a = (uintptr_t)x, b = (uintptr_t)y;
    return a < b ? b - a < n : a - b < m;
}

/* FA_ERR_INVALID unless each output (o, lse) either is one of its own kind's inputs
 * exactly (in place: o_a or o_b, lse_a or lse_b) or shares no byte with any other array:
 * row i is read and then written at the same index, so only identity is safe. */
static fa_status check_overlaps(const void *const *ptr, const uint64_t *bytes) {
    static const char *const names[] = {"o_a", "lse_a", "o_b", "lse_b", "sinks", "o", "lse"};
    for (int w = 5; w < 7; w++)
        for (int i = 0; i < 7; i++) {
            if (i == w || !share(ptr[w], bytes[w], ptr[i], bytes[i])) continue;
            const int own = w == 5 ? i == 0 || i == 2 : i == 1 || i == 3; /* o's inputs o_a, o_b; lse's lse_a, lse_b */
            if (own && ptr[w] == ptr[i]) continue;
            return fa_error(FA_ERR_INVALID, "fa_merge_states: %s (bytes %p..%p) overlaps %s (bytes %p..%p); o and lse "
                            "may only be o_a / o_b and lse_a / lse_b exactly (in place)", names[w], ptr[w],
                            (const void *)((const char *)ptr[w] + bytes[w] - 1), names[i], ptr[i],
                            (const void *)((const char *)ptr[i] + bytes[i] - 1));
        }
    return FA_OK;
}

fa_status fa_merge_states(fa_dtype dtype, int64_t rows, int64_t heads, int64_t head_dim_v, const void *o_a,
                          const float *lse_a, const void *o_b, const float *lse_b, const float *sinks, void *o,
                          float *lse) {
    fa_clear_error();
    if (dtype != FA_F32 && dtype != FA_F16 && dtype != FA_BF16)
        return fa_error(FA_ERR_INVALID, "fa_merge_states: dtype %d is not f32, f16 or bf16", (int)dtype);
    if (rows < 0 || heads < 1 || head_dim_v < 0)
        return fa_error(FA_ERR_INVALID, "fa_merge_states: rows (%lld) and head_dim_v (%lld) must be >= 0, heads (%lld) >= 1",
                        (long long)rows, (long long)head_dim_v, (long long)heads);
    int64_t n, nl, widest;
    if (__builtin_mul_overflow(rows, heads, &nl) || __builtin_mul_overflow(nl, head_dim_v, &n) ||
        __builtin_mul_overflow(n > nl ? n : nl, (int64_t)4, &widest)) /* the widest array's bytes too */
        return fa_error(FA_ERR_OVERFLOW, "fa_merge_states: rows x heads x head_dim_v overflows int64");
    if (!rows) return FA_OK;
    const void *need[] = {o_a, lse_a, o_b, lse_b, o, lse};
    const char *names[] = {"o_a", "lse_a", "o_b", "lse_b", "o", "lse"};
    for (int i = 0; i < 6; i++) /* head_dim_v 0: the states' lse alone, no o to read or write */
        if (!need[i] && (head_dim_v > 0 || i == 1 || i == 3 || i == 5))
            return fa_error(FA_ERR_NULL, "fa_merge_states: %s is NULL", names[i]);
    const uint64_t ob = (uint64_t)n * fa_dtype_size(dtype), lb = (uint64_t)nl * 4; /* within int64: above */
    const void *const ptr[] = {o_a, lse_a, o_b, lse_b, sinks, o, lse};
    const uint64_t bytes[] = {ob, lb, ob, lb, (uint64_t)heads * 4, ob, lb};
    fa_status st = check_overlaps(ptr, bytes);
    if (st) return st;
    if (sinks)
        for (int64_t h = 0; h < heads; h++)
            if (isnan(sinks[h]) || sinks[h] == INFINITY)
                return fa_error(FA_ERR_INVALID, "fa_merge_states: sinks[%lld] is %g; a sink must be finite or -inf (none)",
                                (long long)h, (double)sinks[h]);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t i = r * heads + h;
            merge_row(dtype, head_dim_v, o_a, o_b, i * head_dim_v, lse_a[i], lse_b[i], sinks != NULL,
                      sinks ? sinks[h] : 0.0, o, &lse[i]);
        }
    return FA_OK;
}
