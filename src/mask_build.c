/* The constructors whose rows each see one interval of keys (causal, window, chunked causal,
 * prefix-LM, documents): row i of batch item b sees keys [lo(b, i), hi(b, i)], both ends
 * non-decreasing in i. Then a block's kind needs no element: rows [r0, r1) see all of keys
 * [c0, c1) iff lo(r1 - 1) <= c0 and hi(r0) >= c1 - 1, and some of them iff the first row
 * whose hi reaches c0 (a binary search: hi grows) has lo <= c1 - 1 (its lo is the smallest
 * of the rows that reach). Only partial blocks are written out, a row's interval a memset,
 * so a mask takes time linear in its blocks plus its partial blocks' bytes. The ends are clamped to
 * [-1, Sk] as schedule.h's are (saturating sums: exact for every int64 offset). */
#include "mask.h"

#include "internal.h"

#include <string.h>

typedef enum { IV_SCHED, IV_CHUNKED, IV_PREFIX, IV_DOCUMENTS } iv_kind;

typedef struct {
    iv_kind kind;
    fa_sched s;               /* the row positions (off = diag_offset); causal and window for IV_SCHED */
    int64_t chunk;            /* IV_CHUNKED */
    const int64_t *prefix;    /* IV_PREFIX: [batch] */
    const int64_t *doc_first; /* IV_DOCUMENTS: each batch item's first document in doc_end */
    const int64_t *doc_end;   /* IV_DOCUMENTS: end row (exclusive) of each document, per batch item rising */
    const int64_t *doc_count;
} iv_ctx;

static int64_t clamp_key(int64_t x, int64_t sk) { return x < -1 ? -1 : x > sk ? sk : x; }

/* The interval of row i (0 <= i < Sq) of batch item b; lo > hi: none. */
static void row_interval(const iv_ctx *c, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t sk = c->s.seq_k;
    *lo = 0, *hi = -1;
    const int64_t d = c->s.off >= 0 ? fa_sched_add_sat(i, c->s.off) : i + c->s.off; /* i >= 0: no overflow */
    switch (c->kind) {
    case IV_SCHED: *lo = fa_sched_lo(&c->s, i), *hi = fa_sched_hi(&c->s, i); return;
    case IV_CHUNKED: {
        if (d < 0) {
            *lo = 0, *hi = -1;
            return;
        }
        /* past Sk - 1 + chunk the chunk starts past the last key: any such d says the same */
        const int64_t dc = d > fa_sched_add_sat(sk, c->chunk) ? fa_sched_add_sat(sk, c->chunk) : d;
        *lo = clamp_key(dc / c->chunk * c->chunk, sk), *hi = clamp_key(dc, sk);
        return;
    }
    case IV_PREFIX: {
        const int64_t p = c->prefix[b] - 1;
        *lo = -1, *hi = clamp_key(p > d ? p : d, sk);
        return;
    }
    case IV_DOCUMENTS: {
        const int64_t *end = c->doc_end + c->doc_first[b];
        int64_t a = 0, z = c->doc_count[b] - 1; /* the first document whose end passes i */
        while (a < z) {
            const int64_t mid = a + (z - a) / 2;
            if (end[mid] > i) z = mid;
            else a = mid + 1;
        }
        *lo = a ? end[a - 1] : 0, *hi = end[a] - 1;
        return;
    }
    }
}

static int iv_block(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const iv_ctx *c = ctx;
    (void)h;
    int64_t lo, hi, lo_last, hi_last;
    row_interval(c, b, r0, &lo, &hi);
    row_interval(c, b, r1 - 1, &lo_last, &hi_last);
    if (lo_last <= c0 && hi >= c1 - 1) return FA_BLOCK_FULL;
    if (hi_last < c0) return FA_BLOCK_EMPTY;
    int64_t a = r0, z = r1 - 1; /* the first row whose hi reaches c0 (row r1 - 1's does) */
    while (a < z) {
        const int64_t mid = a + (z - a) / 2;
        row_interval(c, b, mid, &lo, &hi);
        if (hi >= c0) z = mid;
        else a = mid + 1;
    }
    row_interval(c, b, a, &lo, &hi);
    return lo <= c1 - 1 && lo <= hi ? FA_BLOCK_PARTIAL : FA_BLOCK_EMPTY;
}

static void iv_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    int64_t lo, hi;
    (void)h;
    row_interval(ctx, b, i, &lo, &hi);
    lo = lo > c0 ? lo : c0, hi = hi < c1 - 1 ? hi : c1 - 1;
    memset(out, 0, (size_t)(c1 - c0));
    if (lo <= hi) memset(out + (lo - c0), 1, (size_t)(hi - lo + 1));
}

static fa_status build(const fa_mask_shape *s, iv_ctx *c, const char *fn, fa_mask **out) {
    c->s.seq_q = s->seq_q, c->s.seq_k = s->seq_k;
    const fa_mask_source src = {iv_block, iv_row, c, 0};
    return fa_mask_build(s, &src, fn, out);
}

static fa_status start(const fa_mask_shape *s, fa_mask **out, const char *fn) {
    if (!out) return fa_error(FA_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    /* the shape first: the constructors then read batch entries of their arrays (prefix
     * lengths, document counts), which a bad batch would send past their ends */
    fa_mask_shape resolved;
    return fa_mask_check_shape(s, fn, &resolved);
}

static iv_ctx sched_ctx(int64_t off, int causal, int64_t left, int64_t right) {
    iv_ctx c = {IV_SCHED, {0, 0, off, causal, left, right}, 0, 0, 0, 0, 0};
    return c;
}

fa_status fa_mask_causal(const fa_mask_shape *s, int64_t diag_offset, fa_mask **out) {
    fa_status st = start(s, out, "fa_mask_causal");
    if (st) return st;
    iv_ctx c = sched_ctx(diag_offset, 1, -1, -1);
    return build(s, &c, "fa_mask_causal", out);
}

fa_status fa_mask_window(const fa_mask_shape *s, int64_t diag_offset, int64_t left, int64_t right, fa_mask **out) {
    fa_status st = start(s, out, "fa_mask_window");
    if (st) return st;
    if (left < -1 || right < -1)
        return fa_error(FA_ERR_INVALID, "fa_mask_window: left %lld and right %lld must be >= 0 (-1: unbounded)",
                        (long long)left, (long long)right);
    iv_ctx c = sched_ctx(diag_offset, 0, left, right);
    return build(s, &c, "fa_mask_window", out);
}

fa_status fa_mask_chunked(const fa_mask_shape *s, int64_t diag_offset, int64_t chunk, fa_mask **out) {
    fa_status st = start(s, out, "fa_mask_chunked");
    if (st) return st;
    if (chunk < 1) return fa_error(FA_ERR_INVALID, "fa_mask_chunked: chunk %lld must be >= 1", (long long)chunk);
    iv_ctx c = sched_ctx(diag_offset, 1, -1, -1);
    c.kind = IV_CHUNKED, c.chunk = chunk;
    return build(s, &c, "fa_mask_chunked", out);
}

fa_status fa_mask_prefix_lm(const fa_mask_shape *s, int64_t diag_offset, const int64_t *prefix_len, fa_mask **out) {
    fa_status st = start(s, out, "fa_mask_prefix_lm");
    if (st) return st;
    if (!prefix_len) return fa_error(FA_ERR_NULL, "fa_mask_prefix_lm: prefix_len is NULL");
    for (int64_t b = 0; b < s->batch; b++)
        if (prefix_len[b] < 0)
            return fa_error(FA_ERR_INVALID, "fa_mask_prefix_lm: prefix_len[%lld] is %lld; lengths must be >= 0",
                            (long long)b, (long long)prefix_len[b]);
    iv_ctx c = sched_ctx(diag_offset, 1, -1, -1);
    c.kind = IV_PREFIX, c.prefix = prefix_len;
    return build(s, &c, "fa_mask_prefix_lm", out);
}

fa_status fa_mask_documents(const fa_mask_shape *s, const int64_t *doc_counts, const int64_t *doc_lengths,
                            fa_mask **out) {
    static const char fn[] = "fa_mask_documents";
    fa_status st = start(s, out, fn);
    if (st) return st;
    if (!doc_counts || !doc_lengths) return fa_error(FA_ERR_NULL, "%s: %s is NULL", fn, doc_counts ? "doc_lengths" : "doc_counts");
    if (s->seq_q != s->seq_k)
        return fa_error(FA_ERR_INVALID, "%s: seq_q %lld and seq_k %lld must be equal (documents pack both)", fn,
                        (long long)s->seq_q, (long long)s->seq_k);
    int64_t total = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        if (doc_counts[b] < 1 || doc_counts[b] > s->seq_q)
            return fa_error(FA_ERR_INVALID, "%s: doc_counts[%lld] is %lld; it must be in [1, seq_q = %lld]", fn,
                            (long long)b, (long long)doc_counts[b], (long long)s->seq_q);
        total += doc_counts[b];
    }
    int64_t *first = fa_malloc((size_t)(s->batch + total) * sizeof(int64_t));
    if (!first) return fa_error(FA_ERR_NO_MEMORY, "%s: out of memory", fn);
    int64_t *end = first + s->batch, at = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        first[b] = at;
        int64_t sum = 0;
        for (int64_t d = 0; d < doc_counts[b]; d++, at++) {
            const int64_t len = doc_lengths[at];
            if (len < 1) {
                fa_free(first);
                return fa_error(FA_ERR_INVALID, "%s: batch item %lld's document %lld has length %lld; lengths must "
                                                "be >= 1 and sum to seq_q = %lld", fn, (long long)b, (long long)d,
                                (long long)len, (long long)s->seq_q);
            }
            if (len > s->seq_q - sum) { /* an overshoot is the sum's fault, not this length's */
                fa_free(first);
                return fa_error(FA_ERR_INVALID, "%s: batch item %lld's document lengths sum past seq_q = %lld (to "
                                                "%lld at document %lld)", fn, (long long)b, (long long)s->seq_q,
                                (long long)(sum + len), (long long)d);
            }
            sum += len;
            end[at] = sum;
        }
        if (sum != s->seq_q) {
            fa_free(first);
            return fa_error(FA_ERR_INVALID, "%s: batch item %lld's document lengths sum to %lld, not seq_q = %lld", fn,
                            (long long)b, (long long)sum, (long long)s->seq_q);
        }
    }
    iv_ctx c = sched_ctx(0, 0, -1, -1);
    c.kind = IV_DOCUMENTS, c.doc_first = first, c.doc_end = end, c.doc_count = doc_counts;
    st = build(s, &c, fn, out);
    fa_free(first);
    return st;
}
