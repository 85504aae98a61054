/* Every mask constructor (flashattn.h, "masks as data") against its per-element definition,
 * written from the header's and docs/masks.md's words: random shapes, blocks, offsets and
 * parameters; the dense array (fa_mask_to_dense), the block kinds (fa_mask_block: empty iff
 * no element is visible, full iff all are, except from_blocks, which keeps its kinds) and the
 * statistics (fa_mask_stats) must all agree with the definition. Then AND / OR with
 * broadcasting, heads stacked (fa_mask_stack_heads), and the errors. */
#include "check.h"
#include "mask_defs.h"

/* Checks m (batch and heads of s) against expect[b][h][i][j]; keep: from_blocks' kinds. */
static void check_against(const char *what, const fa_mask *m, const fa_mask_shape *s, const uint8_t *expect,
                          const int8_t *kinds_given) {
    const int64_t bq = s->block_q ? s->block_q : 128, bk = s->block_k ? s->block_k : 128;
    const int64_t nqb = (s->seq_q + bq - 1) / bq, nkb = (s->seq_k + bk - 1) / bk;
    const int64_t n = s->batch * s->heads * s->seq_q * s->seq_k;
    uint8_t *got = tu_alloc((size_t)n);
    memset(got, 7, (size_t)n);
    CHECK(fa_mask_to_dense(m, got) == FA_OK, "%s: to_dense: %s", what, fa_last_error());
    int64_t bad = 0, visible = 0, full = 0, partial = 0;
    for (int64_t x = 0; x < n; x++) {
        visible += expect[x] != 0;
        if (got[x] != (expect[x] != 0) && bad++ < 3) CHECK(0, "%s: element %lld is %d, defined %d", what, (long long)x, got[x], expect[x]);
    }
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t h = 0; h < s->heads; h++)
            for (int64_t qb = 0; qb < nqb; qb++)
                for (int64_t kb = 0; kb < nkb; kb++) {
                    int64_t on = 0, all = 0;
                    for (int64_t i = qb * bq; i < s->seq_q && i < qb * bq + bq; i++)
                        for (int64_t j = kb * bk; j < s->seq_k && j < kb * bk + bk; j++, all++)
                            on += expect[((b * s->heads + h) * s->seq_q + i) * s->seq_k + j] != 0;
                    const int want = kinds_given ? kinds_given[((b * s->heads + h) * nqb + qb) * nkb + kb]
                                                 : on == 0 ? FA_BLOCK_EMPTY : on == all ? FA_BLOCK_FULL : FA_BLOCK_PARTIAL;
                    const int k = fa_mask_block(m, b, h, qb, kb);
                    if (k != want && bad++ < 3)
                        CHECK(0, "%s: block [%lld %lld %lld %lld] is %d, want %d (%lld of %lld visible)", what, (long long)b,
                              (long long)h, (long long)qb, (long long)kb, k, want, (long long)on, (long long)all);
                    full += want == FA_BLOCK_FULL, partial += want == FA_BLOCK_PARTIAL;
                }
    CHECK(bad == 0, "%s: %lld mismatches", what, (long long)bad);
    int64_t sv = -1, sf = -1, sp = -1;
    CHECK(fa_mask_stats(m, &sv, &sf, &sp) == FA_OK && sv == visible && sf == full && sp == partial,
          "%s: stats %lld %lld %lld, want %lld %lld %lld", what, (long long)sv, (long long)sf, (long long)sp,
          (long long)visible, (long long)full, (long long)partial);
    CHECK(fa_mask_block(m, s->batch, 0, 0, 0) == -1 && fa_mask_block(m, 0, 0, nqb, 0) == -1 &&
              fa_mask_block(m, 0, 0, 0, -1) == -1,
          "%s: an index out of range must give -1", what);
    fa_mask_shape got_s;
    CHECK(fa_mask_get_shape(m, &got_s) == FA_OK && got_s.block_q == bq && got_s.block_k == bk &&
              got_s.seq_q == s->seq_q && got_s.batch == s->batch,
          "%s: get_shape", what);
    free(got);
}

static uint8_t *dense_of(const mask_def *d, const fa_mask_shape *s) {
    uint8_t *e = tu_alloc((size_t)(s->batch * s->heads * s->seq_q * s->seq_k));
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++)
                for (int64_t j = 0; j < s->seq_k; j++)
                    e[((b * s->heads + h) * s->seq_q + i) * s->seq_k + j] = (uint8_t)mask_def_attends(d, b, i, j);
    return e;
}

static int64_t pick_block(uint64_t *r) {
    static const int64_t blocks[] = {0, 1, 3, 4, 8, 16, 7, 32};
    return blocks[tu_int(r, 0, 7)];
}

typedef struct {
    const uint8_t *a;
    int64_t heads, sq, sk;
} fn_ctx;
static int fn_pred(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    const fn_ctx *c = ctx;
    return c->a[((b * c->heads + h) * c->sq + i) * c->sk + j] ? 3 : 0; /* any nonzero is attend */
}

static void constructors(uint64_t *r) {
    for (int round = 0; round < 60; round++) {
        fa_mask_shape s = {tu_int(r, 1, 2), tu_int(r, 1, 2), tu_int(r, 1, 70), tu_int(r, 1, 70), pick_block(r), pick_block(r)};
        mask_def d = {(int)(round % 5), tu_int(r, -40, 40), tu_int(r, -1, 20), tu_int(r, -1, 20), tu_int(r, 1, 20), 0, 0, 0};
        int64_t prefix[2] = {tu_int(r, 0, 80), tu_int(r, 0, 80)}, counts[2], lens[140];
        if (d.kind == 4) {
            s.seq_k = s.seq_q;
            int64_t at = 0;
            for (int64_t b = 0; b < s.batch; b++) {
                int64_t left = s.seq_q, k = 0;
                while (left > 0) {
                    const int64_t len = tu_int(r, 0, 3) == 0 ? 1 : tu_int(r, 1, left);
                    lens[at++] = len < left ? len : left, left -= lens[at - 1], k++;
                }
                counts[b] = k;
            }
            d.off = 0;
        }
        d.prefix = prefix, d.counts = counts, d.lens = lens;
        fa_mask *m = NULL;
        fa_status st;
        switch (d.kind) {
        case 0: st = fa_mask_causal(&s, d.off, &m); break;
        case 1: st = fa_mask_window(&s, d.off, d.left, d.right, &m); break;
        case 2: st = fa_mask_chunked(&s, d.off, d.chunk, &m); break;
        case 3: st = fa_mask_prefix_lm(&s, d.off, prefix, &m); break;
        default: st = fa_mask_documents(&s, counts, lens, &m); break;
        }
        char what[160];
        snprintf(what, sizeof what, "kind %d %lldx%lldx%lldx%lld blocks %lldx%lld off %lld l %lld r %lld chunk %lld",
                 d.kind, (long long)s.batch, (long long)s.heads, (long long)s.seq_q, (long long)s.seq_k,
                 (long long)s.block_q, (long long)s.block_k, (long long)d.off, (long long)d.left, (long long)d.right,
                 (long long)d.chunk);
        CHECK(st == FA_OK && m, "%s: %s", what, fa_last_error());
        if (!m) continue;
        uint8_t *e = dense_of(&d, &s);
        check_against(what, m, &s, e, NULL);

        /* the same elements from a dense array, a predicate, and back from the blocks */
        fa_mask *md = NULL, *mf = NULL, *mb = NULL;
        CHECK(fa_mask_from_dense(&s, e, &md) == FA_OK, "%s: from_dense: %s", what, fa_last_error());
        if (md) check_against("from_dense", md, &s, e, NULL);
        fn_ctx c = {e, s.heads, s.seq_q, s.seq_k};
        CHECK(fa_mask_from_fn(&s, fn_pred, &c, &mf) == FA_OK, "%s: from_fn: %s", what, fa_last_error());
        if (mf) check_against("from_fn", mf, &s, e, NULL);
        /* from_blocks with kinds drawn from the elements, some partial blocks made partial on
         * purpose even where the elements say full (kept as given) */
        const int64_t bq = s.block_q ? s.block_q : 128, bk = s.block_k ? s.block_k : 128;
        const int64_t nqb = (s.seq_q + bq - 1) / bq, nkb = (s.seq_k + bk - 1) / bk, nb = s.batch * s.heads * nqb * nkb;
        int8_t *kinds = tu_alloc((size_t)nb);
        uint8_t *bits = tu_alloc((size_t)(nb * bq * bk)), *e2 = tu_alloc((size_t)(s.batch * s.heads * s.seq_q * s.seq_k));
        int64_t np = 0, at = 0;
        for (int64_t b = 0; b < s.batch; b++)
            for (int64_t h = 0; h < s.heads; h++)
                for (int64_t qb = 0; qb < nqb; qb++)
                    for (int64_t kb = 0; kb < nkb; kb++, at++) {
                        int64_t on = 0, all = 0;
                        for (int64_t i = qb * bq; i < qb * bq + bq; i++)
                            for (int64_t j = kb * bk; j < kb * bk + bk; j++) {
                                const int in = i < s.seq_q && j < s.seq_k;
                                const int64_t x = ((b * s.heads + h) * s.seq_q + i) * s.seq_k + j;
                                const uint8_t bit = in ? e[x] : (uint8_t)(tu_next(r) & 1); /* past the end: ignored */
                                if (in) on += e[x], all++;
                                bits[np * bq * bk + (i - qb * bq) * bk + (j - kb * bk)] = bit;
                                if (in) e2[x] = e[x];
                            }
                        int k = on == 0 ? FA_BLOCK_EMPTY : on == all ? FA_BLOCK_FULL : FA_BLOCK_PARTIAL;
                        if (k == FA_BLOCK_FULL && (tu_next(r) & 1)) k = FA_BLOCK_PARTIAL;
                        kinds[at] = (int8_t)k;
                        np += k == FA_BLOCK_PARTIAL;
                    }
        CHECK(fa_mask_from_blocks(&s, kinds, bits, &mb) == FA_OK, "%s: from_blocks: %s", what, fa_last_error());
        if (mb) check_against("from_blocks", mb, &s, e2, kinds);
        free(kinds), free(bits), free(e2);
        fa_mask_destroy(md), fa_mask_destroy(mf), fa_mask_destroy(mb), fa_mask_destroy(m);
        free(e);
    }
}

/* AND and OR against the element-wise definition, broadcasting batch and heads. */
static void combinations(uint64_t *r) {
    for (int round = 0; round < 30; round++) {
        const int64_t B = 2, H = 3, sq = tu_int(r, 1, 50), sk = tu_int(r, 1, 50);
        const int64_t bq = pick_block(r), bk = pick_block(r);
        fa_mask_shape sa = {tu_int(r, 0, 1) ? B : 1, tu_int(r, 0, 1) ? H : 1, sq, sk, bq, bk};
        fa_mask_shape sb = {sa.batch == 1 ? B : tu_int(r, 0, 1) ? B : 1, sa.heads == 1 ? H : 1, sq, sk, bq, bk};
        const int64_t na = sa.batch * sa.heads * sq * sk, nb = sb.batch * sb.heads * sq * sk;
        uint8_t *a = tu_alloc((size_t)na), *b = tu_alloc((size_t)nb);
        const int density = (int)tu_int(r, 0, 4); /* 0: sparse .. 4: dense, so some blocks are empty or full */
        for (int64_t x = 0; x < na; x++) a[x] = (uint8_t)((int)(tu_next(r) % 4) < density);
        for (int64_t x = 0; x < nb; x++) b[x] = (uint8_t)((int)(tu_next(r) % 4) < 4 - density);
        fa_mask *ma = NULL, *mb = NULL, *mand = NULL, *mor = NULL;
        CHECK(fa_mask_from_dense(&sa, a, &ma) == FA_OK && fa_mask_from_dense(&sb, b, &mb) == FA_OK, "from_dense: %s",
              fa_last_error());
        CHECK(fa_mask_and(ma, mb, &mand) == FA_OK && fa_mask_or(mb, ma, &mor) == FA_OK, "and/or: %s", fa_last_error());
        fa_mask_shape so = {B, H, sq, sk, bq, bk};
        uint8_t *ea = tu_alloc((size_t)(B * H * sq * sk)), *eo = tu_alloc((size_t)(B * H * sq * sk));
        for (int64_t x = 0; x < B; x++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < sk; j++) {
                        const int u = a[(((sa.batch == 1 ? 0 : x) * sa.heads + (sa.heads == 1 ? 0 : h)) * sq + i) * sk + j];
                        const int v = b[(((sb.batch == 1 ? 0 : x) * sb.heads + (sb.heads == 1 ? 0 : h)) * sq + i) * sk + j];
                        ea[((x * H + h) * sq + i) * sk + j] = (uint8_t)(u && v);
                        eo[((x * H + h) * sq + i) * sk + j] = (uint8_t)(u || v);
                    }
        if (mand) check_against("and", mand, &so, ea, NULL);
        if (mor) check_against("or", mor, &so, eo, NULL);
        /* destroying the inputs leaves the results whole */
        fa_mask_destroy(ma), fa_mask_destroy(mb);
        fa_mask_destroy(mand), fa_mask_destroy(mor);
        free(a), free(b), free(ea), free(eo);
    }
}

/* A mask per head (fa_mask_stack_heads): head h's elements and block kinds are its own
 * mask's, batch 1 broadcast; kinds from from_blocks kept as given; the errors. */
static void stacked_heads(uint64_t *r) {
    for (int round = 0; round < 20; round++) {
        const int64_t B = 2, H = tu_int(r, 1, 4), sq = tu_int(r, 1, 40), sk = tu_int(r, 1, 40);
        const int64_t bq = pick_block(r), bk = pick_block(r);
        fa_mask *heads[4] = {0};
        fa_mask_shape sh[4];
        uint8_t *dense[4];
        int8_t *given[4] = {0};
        for (int64_t h = 0; h < H; h++) {
            sh[h] = (fa_mask_shape){tu_int(r, 0, 1) ? B : 1, 1, sq, sk, bq, bk};
            const int64_t n = sh[h].batch * sq * sk;
            dense[h] = tu_alloc((size_t)n);
            const int density = (int)tu_int(r, 0, 4);
            for (int64_t x = 0; x < n; x++) dense[h][x] = (uint8_t)((int)(tu_next(r) % 4) < density);
            if (tu_int(r, 0, 2) == 0) { /* from blocks: every block partial, its bitmap the elements */
                fa_mask_shape g;
                CHECK(fa_mask_from_dense(&sh[h], dense[h], &heads[h]) == FA_OK && fa_mask_get_shape(heads[h], &g) == FA_OK,
                      "from_dense: %s", fa_last_error());
                const int64_t nqb = (sq + g.block_q - 1) / g.block_q, nkb = (sk + g.block_k - 1) / g.block_k;
                const int64_t nblk = sh[h].batch * nqb * nkb, area = g.block_q * g.block_k;
                uint8_t *bits = tu_alloc((size_t)(nblk * area));
                given[h] = tu_alloc((size_t)nblk);
                memset(bits, 0, (size_t)(nblk * area));
                for (int64_t x = 0; x < nblk; x++) {
                    const int64_t b = x / (nqb * nkb), qb = x / nkb % nqb, kb = x % nkb;
                    given[h][x] = FA_BLOCK_PARTIAL;
                    for (int64_t i = qb * g.block_q; i < sq && i < (qb + 1) * g.block_q; i++)
                        for (int64_t j = kb * g.block_k; j < sk && j < (kb + 1) * g.block_k; j++)
                            bits[x * area + (i - qb * g.block_q) * g.block_k + (j - kb * g.block_k)] =
                                dense[h][(b * sq + i) * sk + j];
                }
                fa_mask_destroy(heads[h]);
                CHECK(fa_mask_from_blocks(&sh[h], given[h], bits, &heads[h]) == FA_OK, "from_blocks: %s", fa_last_error());
                free(bits);
            } else {
                CHECK(fa_mask_from_dense(&sh[h], dense[h], &heads[h]) == FA_OK, "from_dense: %s", fa_last_error());
            }
        }
        fa_mask *m = NULL;
        int64_t batch = 1;
        for (int64_t h = 0; h < H; h++) batch = sh[h].batch > batch ? sh[h].batch : batch;
        CHECK(fa_mask_stack_heads((const fa_mask *const *)heads, H, &m) == FA_OK, "stack_heads: %s", fa_last_error());
        fa_mask_shape so = {batch, H, sq, sk, bq, bk};
        fa_mask_shape g;
        fa_mask_get_shape(heads[0], &g);
        const int64_t nqb = (sq + g.block_q - 1) / g.block_q, nkb = (sk + g.block_k - 1) / g.block_k;
        uint8_t *e = tu_alloc((size_t)(batch * H * sq * sk));
        int8_t *kinds = tu_alloc((size_t)(batch * H * nqb * nkb));
        int any_given = 0;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t hb = sh[h].batch == 1 ? 0 : b;
                memcpy(e + (b * H + h) * sq * sk, dense[h] + hb * sq * sk, (size_t)(sq * sk));
                for (int64_t x = 0; x < nqb * nkb; x++)
                    kinds[(b * H + h) * nqb * nkb + x] = (int8_t)fa_mask_block(heads[h], hb, 0, x / nkb, x % nkb);
                any_given |= given[h] != NULL;
            }
        if (m) check_against("stack_heads", m, &so, e, any_given ? kinds : NULL);
        for (int64_t h = 0; h < H; h++) fa_mask_destroy(heads[h]), free(dense[h]), free(given[h]);
        if (m) { /* the stack holds its own copy: the heads are gone */
            uint8_t *again = tu_alloc((size_t)(batch * H * sq * sk));
            CHECK(fa_mask_to_dense(m, again) == FA_OK && !memcmp(again, e, (size_t)(batch * H * sq * sk)),
                  "stack_heads after its heads were destroyed");
            free(again);
        }
        fa_mask_destroy(m), free(e), free(kinds);
    }
    fa_mask_shape s1 = {1, 1, 8, 8, 4, 4}, s2 = {1, 1, 8, 9, 4, 4}, s3 = {1, 2, 8, 8, 4, 4}, sb2 = {2, 1, 8, 8, 4, 4},
                  sb3 = {3, 1, 8, 8, 4, 4};
    fa_mask *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL, *m = (fa_mask *)1;
    CHECK(fa_mask_causal(&s1, 0, &a) == FA_OK && fa_mask_causal(&s2, 0, &b) == FA_OK && fa_mask_causal(&s3, 0, &c) == FA_OK &&
              fa_mask_causal(&sb2, 0, &d) == FA_OK && fa_mask_causal(&sb3, 0, &e) == FA_OK,
          "causal: %s", fa_last_error());
    const fa_mask *ab[2] = {a, b}, *ac[2] = {a, c}, *an[2] = {a, NULL}, *de[2] = {d, e};
    CHECK(fa_mask_stack_heads(ab, 2, &m) == FA_ERR_INVALID && m == NULL && strstr(fa_last_error(), "masks[1]"),
          "sequences differ: %s", fa_last_error());
    CHECK(fa_mask_stack_heads(ac, 2, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "2 heads"), "a head of 2: %s",
          fa_last_error());
    CHECK(fa_mask_stack_heads(an, 2, &m) == FA_ERR_NULL && strstr(fa_last_error(), "masks[1] is NULL"), "NULL head: %s",
          fa_last_error());
    CHECK(fa_mask_stack_heads(de, 2, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "batch"), "batch 2 and 3: %s",
          fa_last_error());
    CHECK(fa_mask_stack_heads(ab, 0, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "at least 1"), "n 0: %s",
          fa_last_error());
    CHECK(fa_mask_stack_heads(NULL, 1, &m) == FA_ERR_NULL && fa_mask_stack_heads(ab, 1, NULL) == FA_ERR_NULL, "NULLs");
    fa_mask_destroy(a), fa_mask_destroy(b), fa_mask_destroy(c), fa_mask_destroy(d), fa_mask_destroy(e);
}

static void errors(void) {
    fa_mask *m = (fa_mask *)1;
    fa_mask_shape s = {1, 1, 8, 8, 0, 0};
    CHECK(fa_mask_causal(NULL, 0, &m) == FA_ERR_NULL && m == NULL, "a NULL shape");
    fa_mask_shape bad = s;
    bad.seq_q = 0;
    CHECK(fa_mask_causal(&bad, 0, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "seq_q"), "seq_q 0: %s", fa_last_error());
    bad = s, bad.block_k = -2;
    CHECK(fa_mask_causal(&bad, 0, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "block_k"), "block_k -2");
    CHECK(fa_mask_chunked(&s, 0, 0, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "chunk"), "chunk 0");
    /* the shape before the per-batch arrays: a batch of 2^41 walked prefix_len and doc_counts
     * (4 entries here) far past their ends, and seq 0 blamed doc_counts */
    const int64_t four[4] = {1, 1, 1, 1};
    bad = (fa_mask_shape){(int64_t)1 << 41, 1, 1, 1, 1, 1};
    CHECK(fa_mask_prefix_lm(&bad, 0, four, &m) == FA_ERR_OVERFLOW && strstr(fa_last_error(), "too many blocks") && !m,
          "prefix_lm, batch 2^41: %s", fa_last_error());
    CHECK(fa_mask_documents(&bad, four, four, &m) == FA_ERR_OVERFLOW && strstr(fa_last_error(), "too many blocks") && !m,
          "documents, batch 2^41: %s", fa_last_error());
    bad = s, bad.seq_q = bad.seq_k = 0;
    CHECK(fa_mask_documents(&bad, four, four, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "seq_q 0 and seq_k 0"),
          "documents, seq 0: %s", fa_last_error());
    CHECK(fa_mask_window(&s, 0, -3, 1, &m) == FA_ERR_INVALID, "window side -3");
    const int64_t counts[1] = {2}, lens[2] = {3, 4}, neg[1] = {-1};
    CHECK(fa_mask_documents(&s, counts, lens, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "sum"), "lengths 3+4 != 8: %s",
          fa_last_error());
    const int64_t over[2] = {5, 5}; /* an overshoot is the sum's, not a length's (it said "document 1 has length 5") */
    CHECK(fa_mask_documents(&s, counts, over, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "sum past seq_q = 8 (to 10"),
          "lengths 5+5 > 8: %s", fa_last_error());
    CHECK(fa_mask_prefix_lm(&s, 0, neg, &m) == FA_ERR_INVALID, "prefix -1");
    fa_mask_shape rect = {1, 1, 8, 9, 0, 0};
    const int64_t lens9[2] = {4, 5};
    CHECK(fa_mask_documents(&rect, counts, lens9, &m) == FA_ERR_INVALID && strstr(fa_last_error(), "equal"), "documents Sq != Sk");
    int8_t kinds[1] = {5};
    CHECK(fa_mask_from_blocks(&s, kinds, NULL, &m) == FA_ERR_INVALID, "kind 5");
    kinds[0] = FA_BLOCK_PARTIAL;
    CHECK(fa_mask_from_blocks(&s, kinds, NULL, &m) == FA_ERR_NULL, "partial without bitmaps");
    fa_mask *a = NULL, *b = NULL;
    fa_mask_shape other = {1, 1, 8, 8, 4, 0};
    CHECK(fa_mask_causal(&s, 0, &a) == FA_OK && fa_mask_causal(&other, 0, &b) == FA_OK, "causal");
    CHECK(fa_mask_and(a, b, &m) == FA_ERR_INVALID && m == NULL && strstr(fa_last_error(), "blocks"), "blocks differ: %s",
          fa_last_error());
    fa_mask_destroy(a), fa_mask_destroy(b), fa_mask_destroy(NULL);
    CHECK(fa_mask_block(NULL, 0, 0, 0, 0) == -1, "a NULL mask's block");
    /* lengths near INT64_MAX: the block counts' ceilings and products must not overflow
     * (they once came out negative, "out of memory for the mask's -72057594037927935 blocks") */
    const fa_mask_shape huge[] = {{1, 1, INT64_MAX, 8, 0, 0},
                                  {1, 1, 8, INT64_MAX - 5, 0, 0},
                                  {1, 1, INT64_MAX - 100, 8, 4096, 1},
                                  {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, 1, 1}};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        m = (fa_mask *)1;
        const fa_status st = i == 1 ? fa_mask_window(&huge[i], 0, 1, 1, &m) : fa_mask_causal(&huge[i], 0, &m);
        CHECK(st == FA_ERR_OVERFLOW && m == NULL && strstr(fa_last_error(), "too many blocks"),
              "huge shape %zu: status %d, %s", i, (int)st, fa_last_error());
    }
}

int main(void) {
    uint64_t r = check_seed("test_mask");
    constructors(&r);
    combinations(&r);
    stacked_heads(&r);
    errors();
    return check_finish("test_mask");
}
