/* The block-sparse mask object: its builder, its life (reference counts), its queries, and
 * the constructors that read elements (a dense array, a predicate, given blocks, AND and
 * OR). The constructors from row intervals (causal, window, chunked, prefix-LM, documents)
 * are in mask_build.c. docs/masks.md describes the layout. */
#include "mask.h"

#include "internal.h"

#include <string.h>

_Static_assert((int)FA_BLOCK_EMPTY == (int)FA_TILE_EMPTY && (int)FA_BLOCK_PARTIAL == (int)FA_TILE_PARTIAL &&
                   (int)FA_BLOCK_FULL == (int)FA_TILE_FULL,
               "schedule_mask.h reads block kinds as tile kinds");

typedef __int128 wide;

/* ceil(n / d) for n, d >= 1: (n + d - 1) / d overflows for n near INT64_MAX */
static int64_t ceil_div(int64_t n, int64_t d) { return (n - 1) / d + 1; }

/* Checks a shape and resolves its default blocks (0: 128) (mask.h). */
fa_status fa_mask_check_shape(const fa_mask_shape *s, const char *fn, fa_mask_shape *r) {
    if (!s) return fa_error(FA_ERR_NULL, "%s: the shape is NULL", fn);
    *r = *s;
    if (r->block_q == 0) r->block_q = 128;
    if (r->block_k == 0) r->block_k = 128;
    if (r->batch < 1 || r->heads < 1)
        return fa_error(FA_ERR_INVALID, "%s: batch %lld and heads %lld must be >= 1", fn, (long long)r->batch,
                        (long long)r->heads);
    if (r->seq_q < 1 || r->seq_k < 1)
        return fa_error(FA_ERR_INVALID, "%s: seq_q %lld and seq_k %lld must be >= 1", fn, (long long)r->seq_q,
                        (long long)r->seq_k);
    /* a partial block's bitmap is block_q x block_k bytes: at most 16 MiB */
    if (r->block_q < 1 || r->block_k < 1 || r->block_q > 4096 || r->block_k > 4096)
        return fa_error(FA_ERR_INVALID, "%s: block_q %lld and block_k %lld must be in [1, 4096] (0: 128)", fn,
                        (long long)r->block_q, (long long)r->block_k);
    /* each factor is below 2^63: two of them multiply within 128 bits, the last is checked */
    wide nb = (wide)r->batch * r->heads;
    if (__builtin_mul_overflow(nb, (wide)ceil_div(r->seq_q, r->block_q) * ceil_div(r->seq_k, r->block_k), &nb) ||
        nb > ((wide)1 << 40))
        return fa_error(FA_ERR_OVERFLOW, "%s: %lld x %lld x %lld x %lld elements in blocks of %lld x %lld are too many "
                                         "blocks", fn, (long long)r->batch, (long long)r->heads, (long long)r->seq_q,
                        (long long)r->seq_k, (long long)r->block_q, (long long)r->block_k);
    return FA_OK;
}

void fa_mask_retain(const fa_mask *m) {
    if (m) __atomic_fetch_add(&((fa_mask *)m)->refs, 1, __ATOMIC_RELAXED);
}

fa_status fa_mask_check_problem(const fa_mask *m, const fa_problem *p) {
    if (!m) return FA_OK;
    const fa_mask_shape *s = &m->s;
    if (s->seq_q != p->seq_q || s->seq_k != p->seq_k)
        return fa_error(FA_ERR_INVALID, "the mask is %lld x %lld (seq_q x seq_k) but the problem is %lld x %lld",
                        (long long)s->seq_q, (long long)s->seq_k, (long long)p->seq_q, (long long)p->seq_k);
    if (s->batch != 1 && s->batch != p->batch)
        return fa_error(FA_ERR_INVALID, "the mask's batch is %lld but must be 1 or the problem's batch (%lld)",
                        (long long)s->batch, (long long)p->batch);
    if (s->heads != 1 && s->heads != p->heads_q)
        return fa_error(FA_ERR_INVALID, "the mask's heads are %lld but must be 1 or the problem's heads_q (%lld)",
                        (long long)s->heads, (long long)p->heads_q);
    return FA_OK;
}

void fa_mask_destroy(fa_mask *m) {
    if (!m || __atomic_fetch_sub(&m->refs, 1, __ATOMIC_ACQ_REL) != 1) return;
    fa_free(m->kinds);
    fa_free(m->bitmap_at);
    fa_free(m->pop);
    fa_free(m->col_lo);
    fa_free(m->col_hi);
    fa_free(m->bits);
    fa_free(m->row_stats);
    fa_free(m);
}

/* Appends one block's bitmap, and its rows' stats (3 int16 a row, block_q rows), to the
 * growing bits and row_stats buffers (doubling; *cap counts blocks). */
static int append_bits(fa_mask *m, int64_t *cap, const uint8_t *block, int64_t area, const int16_t *rows,
                       int64_t bq) {
    if (m->partial + 1 > *cap) {
        const int64_t want = *cap ? 2 * *cap : 16;
        uint8_t *b = fa_malloc((size_t)(want * area));
        int16_t *r = fa_malloc((size_t)(want * bq * 3) * sizeof(int16_t));
        if (!b || !r) {
            fa_free(b), fa_free(r);
            return 0;
        }
        if (m->partial) {
            memcpy(b, m->bits, (size_t)(m->partial * area));
            memcpy(r, m->row_stats, (size_t)(m->partial * bq * 3) * sizeof(int16_t));
        }
        fa_free(m->bits), fa_free(m->row_stats);
        m->bits = b, m->row_stats = r, *cap = want;
    }
    memcpy(m->bits + m->partial * area, block, (size_t)area);
    memcpy(m->row_stats + m->partial * bq * 3, rows, (size_t)(bq * 3) * sizeof(int16_t));
    return 1;
}

/* Row x's stats (n bytes of 0 or 1): its first and last one and their count in st[0..2]
 * (0, -1, 0 when it has none); adds the count to *pop and widens [*lo, *hi] to them. */
static void row_stats(const uint8_t *x, int64_t n, int64_t *pop, int64_t *lo, int64_t *hi, int16_t st[3]) {
    uint32_t ones = 0; /* n <= 4096 */
    for (int64_t j = 0; j < n; j++) ones += x[j];
    st[0] = 0, st[1] = -1, st[2] = (int16_t)ones;
    if (!ones) return;
    *pop += ones;
    int64_t first = 0, last = n - 1;
    while (!x[first]) first++;
    while (!x[last]) last--;
    st[0] = (int16_t)first, st[1] = (int16_t)last;
    if (first < *lo) *lo = first;
    if (last > *hi) *hi = last;
}

fa_status fa_mask_build(const fa_mask_shape *shape, const fa_mask_source *src, const char *fn, fa_mask **out) {
    fa_mask_shape s;
    fa_status st = fa_mask_check_shape(shape, fn, &s);
    if (st) return st;
    fa_mask *m = fa_calloc(1, sizeof *m);
    if (!m) return fa_error(FA_ERR_NO_MEMORY, "%s: out of memory", fn);
    m->refs = 1;
    m->s = s;
    m->nqb = ceil_div(s.seq_q, s.block_q), m->nkb = ceil_div(s.seq_k, s.block_k);
    const int64_t n = s.batch * s.heads * m->nqb * m->nkb, area = s.block_q * s.block_k;
    m->kinds = fa_malloc((size_t)n);
    m->bitmap_at = fa_malloc((size_t)n * sizeof(int64_t));
    m->pop = fa_malloc((size_t)n * sizeof(int64_t));
    m->col_lo = fa_malloc((size_t)n * sizeof(int32_t));
    m->col_hi = fa_malloc((size_t)n * sizeof(int32_t));
    uint8_t *block = fa_malloc((size_t)area);
    int16_t *rows = fa_malloc((size_t)(s.block_q * 3) * sizeof(int16_t)); /* the block's row stats */
    int64_t cap = 0, at = 0;
    if (!m->kinds || !m->bitmap_at || !m->pop || !m->col_lo || !m->col_hi || !block || !rows) goto no_memory;
    for (int64_t b = 0; b < s.batch; b++)
        for (int64_t h = 0; h < s.heads; h++)
            for (int64_t qb = 0; qb < m->nqb; qb++)
                for (int64_t kb = 0; kb < m->nkb; kb++, at++) {
                    const int64_t r0 = qb * s.block_q, c0 = kb * s.block_k;
                    const int64_t r1 = r0 + s.block_q < s.seq_q ? r0 + s.block_q : s.seq_q;
                    const int64_t c1 = c0 + s.block_k < s.seq_k ? c0 + s.block_k : s.seq_k;
                    const int64_t inside = (r1 - r0) * (c1 - c0);
                    int kind = src->block(src->ctx, b, h, r0, r1, c0, c1);
                    int64_t pop = kind == FA_BLOCK_FULL ? inside : 0;
                    int64_t lo = kind == FA_BLOCK_FULL ? 0 : c1 - c0, hi = kind == FA_BLOCK_FULL ? c1 - c0 - 1 : -1;
                    if (kind != FA_BLOCK_EMPTY && kind != FA_BLOCK_FULL) {
                        memset(block, 0, (size_t)area);
                        for (int64_t r = 0; r < s.block_q; r++) rows[3 * r] = 0, rows[3 * r + 1] = -1, rows[3 * r + 2] = 0;
                        for (int64_t i = r0; i < r1; i++) {
                            uint8_t *x = block + (i - r0) * s.block_k;
                            src->row(src->ctx, b, h, i, c0, c1, x);
                            row_stats(x, c1 - c0, &pop, &lo, &hi, rows + 3 * (i - r0));
                        }
                        if (kind != FA_BLOCK_PARTIAL || !src->keep_partial)
                            kind = pop == 0 ? FA_BLOCK_EMPTY : pop == inside ? FA_BLOCK_FULL : FA_BLOCK_PARTIAL;
                    }
                    m->kinds[at] = (int8_t)kind;
                    m->pop[at] = pop;
                    m->col_lo[at] = (int32_t)(pop ? lo : -1), m->col_hi[at] = (int32_t)(pop ? hi : -1);
                    m->bitmap_at[at] = -1;
                    m->visible += pop;
                    if (kind == FA_BLOCK_FULL) m->full++;
                    if (kind == FA_BLOCK_PARTIAL) {
                        if (!append_bits(m, &cap, block, area, rows, s.block_q)) goto no_memory;
                        m->bitmap_at[at] = m->partial * area;
                        m->partial++;
                    }
                }
    fa_free(block), fa_free(rows);
    *out = m;
    return FA_OK;
no_memory:
    fa_free(block), fa_free(rows);
    fa_mask_destroy(m);
    return fa_error(FA_ERR_NO_MEMORY, "%s: out of memory for the mask's %lld blocks", fn, (long long)n);
}

/* ---- queries ---------------------------------------------------------------------- */

fa_status fa_mask_get_shape(const fa_mask *m, fa_mask_shape *out) {
    if (!m || !out) return fa_error(FA_ERR_NULL, "fa_mask_get_shape: %s is NULL", m ? "out" : "the mask");
    *out = m->s;
    return FA_OK;
}

int fa_mask_block(const fa_mask *m, int64_t b, int64_t h, int64_t qb, int64_t kb) {
    if (!m || b < 0 || b >= m->s.batch || h < 0 || h >= m->s.heads || qb < 0 || qb >= m->nqb || kb < 0 ||
        kb >= m->nkb)
        return -1;
    return m->kinds[((b * m->s.heads + h) * m->nqb + qb) * m->nkb + kb];
}

fa_status fa_mask_to_dense(const fa_mask *m, uint8_t *attend) {
    if (!m || !attend) return fa_error(FA_ERR_NULL, "fa_mask_to_dense: %s is NULL", m ? "attend" : "the mask");
    for (int64_t b = 0; b < m->s.batch; b++)
        for (int64_t h = 0; h < m->s.heads; h++) {
            const fa_sched_mask v = fa_mask_view(m, b, h);
            uint8_t *o = attend + (b * m->s.heads + h) * m->s.seq_q * m->s.seq_k;
            for (int64_t i = 0; i < m->s.seq_q; i++)
                for (int64_t j = 0; j < m->s.seq_k; j++) o[i * m->s.seq_k + j] = (uint8_t)fa_sched_mask_visible(&v, i, j);
        }
    return FA_OK;
}

fa_status fa_mask_stats(const fa_mask *m, int64_t *visible_pairs, int64_t *full_blocks, int64_t *partial_blocks) {
    if (!m) return fa_error(FA_ERR_NULL, "fa_mask_stats: the mask is NULL");
    if (visible_pairs) *visible_pairs = m->visible;
    if (full_blocks) *full_blocks = m->full;
    if (partial_blocks) *partial_blocks = m->partial;
    return FA_OK;
}

/* ---- constructors that read elements ------------------------------------------------ */

static int unknown_block(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    (void)ctx, (void)b, (void)h, (void)r0, (void)r1, (void)c0, (void)c1;
    return -1;
}

typedef struct {
    const uint8_t *attend;
    int64_t heads, sq, sk;
} dense_ctx;

static void dense_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const dense_ctx *c = ctx;
    const uint8_t *x = c->attend + ((b * c->heads + h) * c->sq + i) * c->sk;
    for (int64_t j = c0; j < c1; j++) out[j - c0] = x[j] != 0;
}

fa_status fa_mask_from_dense(const fa_mask_shape *s, const uint8_t *attend, fa_mask **out) {
    if (!out) return fa_error(FA_ERR_NULL, "fa_mask_from_dense: out is NULL");
    *out = NULL;
    if (!s || !attend) return fa_error(FA_ERR_NULL, "fa_mask_from_dense: %s is NULL", s ? "attend" : "the shape");
    dense_ctx c = {attend, s->heads, s->seq_q, s->seq_k};
    const fa_mask_source src = {unknown_block, dense_row, &c, 0};
    return fa_mask_build(s, &src, "fa_mask_from_dense", out);
}

typedef struct {
    fa_mask_fn fn;
    void *ctx;
} fn_ctx;

static void fn_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const fn_ctx *c = ctx;
    for (int64_t j = c0; j < c1; j++) out[j - c0] = c->fn(c->ctx, b, h, i, j) != 0;
}

fa_status fa_mask_from_fn(const fa_mask_shape *s, fa_mask_fn fn, void *ctx, fa_mask **out) {
    if (!out) return fa_error(FA_ERR_NULL, "fa_mask_from_fn: out is NULL");
    *out = NULL;
    if (!s || !fn) return fa_error(FA_ERR_NULL, "fa_mask_from_fn: %s is NULL", s ? "fn" : "the shape");
    fn_ctx c = {fn, ctx};
    const fa_mask_source src = {unknown_block, fn_row, &c, 0};
    return fa_mask_build(s, &src, "fa_mask_from_fn", out);
}

/* Given blocks: the builder visits them in the order the bitmaps are listed. */
typedef struct {
    const int8_t *kinds;
    const uint8_t *bitmaps, *cur; /* cur: the bitmap of the partial block being built */
    int64_t heads, nqb, nkb, bq, bk;
    int64_t next; /* partial blocks seen */
} blocks_ctx;

static int blocks_block(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    blocks_ctx *c = ctx;
    (void)r1, (void)c1;
    const int k = c->kinds[((b * c->heads + h) * c->nqb + r0 / c->bq) * c->nkb + c0 / c->bk];
    if (k == FA_BLOCK_PARTIAL) c->cur = c->bitmaps + c->next++ * c->bq * c->bk;
    return k;
}

static void blocks_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const blocks_ctx *c = ctx;
    (void)b, (void)h;
    const uint8_t *x = c->cur + (i % c->bq) * c->bk; /* the block starts at c0, a multiple of bk */
    for (int64_t j = 0; j < c1 - c0; j++) out[j] = x[j] != 0;
}

fa_status fa_mask_from_blocks(const fa_mask_shape *s, const int8_t *kinds, const uint8_t *bitmaps, fa_mask **out) {
    static const char fn[] = "fa_mask_from_blocks";
    if (!out) return fa_error(FA_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (!kinds) return fa_error(FA_ERR_NULL, "%s: kinds is NULL", fn);
    fa_mask_shape r;
    fa_status st = fa_mask_check_shape(s, fn, &r);
    if (st) return st;
    const int64_t nqb = ceil_div(r.seq_q, r.block_q), nkb = ceil_div(r.seq_k, r.block_k);
    const int64_t n = r.batch * r.heads * nqb * nkb;
    int64_t partial = 0;
    for (int64_t i = 0; i < n; i++) {
        if (kinds[i] != FA_BLOCK_EMPTY && kinds[i] != FA_BLOCK_PARTIAL && kinds[i] != FA_BLOCK_FULL)
            return fa_error(FA_ERR_INVALID, "%s: kinds[%lld] is %d; a block is empty (0), partial (1) or full (2)", fn,
                            (long long)i, kinds[i]);
        partial += kinds[i] == FA_BLOCK_PARTIAL;
    }
    if (partial && !bitmaps)
        return fa_error(FA_ERR_NULL, "%s: bitmaps is NULL but %lld blocks are partial", fn, (long long)partial);
    blocks_ctx c = {kinds, bitmaps, NULL, r.heads, nqb, nkb, r.block_q, r.block_k, 0};
    const fa_mask_source src = {blocks_block, blocks_row, &c, 1};
    return fa_mask_build(&r, &src, fn, out);
}

/* AND and OR, block by block: decided by the kinds where they decide, by the elements
 * (through the schedule's view) where both are needed. */
typedef struct {
    const fa_mask *a, *b;
    int is_or;
} combine_ctx;

static int combine_block(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const combine_ctx *c = ctx;
    (void)r1, (void)c1;
    const fa_sched_mask va = fa_mask_view(c->a, b, h), vb = fa_mask_view(c->b, b, h);
    const int64_t qb = r0 / va.bq, kb = c0 / va.bk;
    const int ka = fa_sched_mask_block(&va, qb, kb), kb2 = fa_sched_mask_block(&vb, qb, kb);
    const int absorb = c->is_or ? FA_BLOCK_FULL : FA_BLOCK_EMPTY, unit = c->is_or ? FA_BLOCK_EMPTY : FA_BLOCK_FULL;
    if (ka == absorb || kb2 == absorb) return absorb;
    if (ka == unit && kb2 == unit) return unit;
    return -1;
}

/* Row i's bytes of keys [c0, c1), one block of v: its bitmap's row, or all 0 or all 1. */
static void view_row(const fa_sched_mask *v, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const int k = fa_sched_mask_block(v, i / v->bq, c0 / v->bk);
    if (k == FA_BLOCK_PARTIAL) memcpy(out, fa_sched_mask_row(v, i, c0 / v->bk), (size_t)(c1 - c0));
    else memset(out, k == FA_BLOCK_FULL, (size_t)(c1 - c0));
}

static void combine_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const combine_ctx *c = ctx;
    const fa_sched_mask va = fa_mask_view(c->a, b, h), vb = fa_mask_view(c->b, b, h);
    uint8_t other[4096]; /* a block row: at most 4096 keys (fa_mask_check_shape) */
    view_row(&va, i, c0, c1, out);
    view_row(&vb, i, c0, c1, other);
    const int64_t n = c1 - c0;
    if (c->is_or)
        for (int64_t j = 0; j < n; j++) out[j] |= other[j];
    else
        for (int64_t j = 0; j < n; j++) out[j] &= other[j];
}

static fa_status combine(const fa_mask *a, const fa_mask *b, int is_or, fa_mask **out) {
    const char *fn = is_or ? "fa_mask_or" : "fa_mask_and";
    if (!out) return fa_error(FA_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (!a || !b) return fa_error(FA_ERR_NULL, "%s: mask %s is NULL", fn, a ? "b" : "a");
    const fa_mask_shape *x = &a->s, *y = &b->s;
    if (x->seq_q != y->seq_q || x->seq_k != y->seq_k || x->block_q != y->block_q || x->block_k != y->block_k)
        return fa_error(FA_ERR_INVALID, "%s: masks of %lld x %lld in blocks of %lld x %lld and %lld x %lld in blocks of "
                                        "%lld x %lld do not combine (sequences and blocks must be equal)", fn,
                        (long long)x->seq_q, (long long)x->seq_k, (long long)x->block_q, (long long)x->block_k,
                        (long long)y->seq_q, (long long)y->seq_k, (long long)y->block_q, (long long)y->block_k);
    if ((x->batch != y->batch && x->batch != 1 && y->batch != 1) || (x->heads != y->heads && x->heads != 1 && y->heads != 1))
        return fa_error(FA_ERR_INVALID, "%s: batch %lld vs %lld and heads %lld vs %lld: each must be equal or 1", fn,
                        (long long)x->batch, (long long)y->batch, (long long)x->heads, (long long)y->heads);
    fa_mask_shape s = *x;
    s.batch = x->batch > y->batch ? x->batch : y->batch;
    s.heads = x->heads > y->heads ? x->heads : y->heads;
    combine_ctx c = {a, b, is_or};
    const fa_mask_source src = {combine_block, combine_row, &c, 0};
    return fa_mask_build(&s, &src, fn, out);
}

fa_status fa_mask_and(const fa_mask *a, const fa_mask *b, fa_mask **out) { return combine(a, b, 0, out); }
fa_status fa_mask_or(const fa_mask *a, const fa_mask *b, fa_mask **out) { return combine(a, b, 1, out); }

/* Heads stacked: head h's blocks and rows are masks[h]'s (its batch broadcast where 1). */
static int stack_block(void *ctx, int64_t b, int64_t h, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const fa_mask *const *m = ctx;
    (void)r1, (void)c1;
    const fa_sched_mask v = fa_mask_view(m[h], b, 0);
    return fa_sched_mask_block(&v, r0 / v.bq, c0 / v.bk);
}

static void stack_row(void *ctx, int64_t b, int64_t h, int64_t i, int64_t c0, int64_t c1, uint8_t *out) {
    const fa_mask *const *m = ctx;
    const fa_sched_mask v = fa_mask_view(m[h], b, 0);
    view_row(&v, i, c0, c1, out);
}

fa_status fa_mask_stack_heads(const fa_mask *const *masks, int64_t n, fa_mask **out) {
    const char *fn = "fa_mask_stack_heads";
    if (!out) return fa_error(FA_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (!masks) return fa_error(FA_ERR_NULL, "%s: masks is NULL", fn);
    if (n < 1) return fa_error(FA_ERR_INVALID, "%s: n must be at least 1 (a mask per query head), got %lld", fn, (long long)n);
    for (int64_t h = 0; h < n; h++)
        if (!masks[h]) return fa_error(FA_ERR_NULL, "%s: masks[%lld] is NULL", fn, (long long)h);
    fa_mask_shape s = masks[0]->s;
    for (int64_t h = 0; h < n; h++) {
        const fa_mask_shape *x = &masks[h]->s;
        if (x->heads != 1)
            return fa_error(FA_ERR_INVALID, "%s: masks[%lld] has %lld heads; each must have 1 (it is one head's)", fn,
                            (long long)h, (long long)x->heads);
        if (x->seq_q != s.seq_q || x->seq_k != s.seq_k || x->block_q != s.block_q || x->block_k != s.block_k)
            return fa_error(FA_ERR_INVALID, "%s: masks[%lld] is %lld x %lld in blocks of %lld x %lld, masks[0] %lld x "
                                            "%lld in blocks of %lld x %lld (sequences and blocks must be equal)", fn,
                            (long long)h, (long long)x->seq_q, (long long)x->seq_k, (long long)x->block_q,
                            (long long)x->block_k, (long long)s.seq_q, (long long)s.seq_k, (long long)s.block_q,
                            (long long)s.block_k);
        if (x->batch != s.batch && x->batch != 1 && s.batch != 1)
            return fa_error(FA_ERR_INVALID, "%s: masks[%lld] has batch %lld, another %lld: each must be equal or 1", fn,
                            (long long)h, (long long)x->batch, (long long)s.batch);
        s.batch = x->batch > s.batch ? x->batch : s.batch;
    }
    s.heads = n;
    const fa_mask_source src = {stack_block, stack_row, (void *)masks, 1};
    return fa_mask_build(&s, &src, fn, out);
}
