/* The check of a quantized cache's scales on caches large enough that the call spreads it
 * over its threads (decode.c, dec_quant_scales_bad: from 65536 scales a call): one bad
 * scale (NaN, +inf, -inf, negative, the least negative subnormal) of k or v, in the first,
 * a middle or the last row a call reads of either sequence, dense and paged with shuffled
 * pages, one thread and two, is an error naming the array, sequence, row and kv head, with
 * nothing written (caches, o and lse as they were); -0 and +0 are scales like any other,
 * and a scale past a sequence's length is never read. The decoding itself is checked against
 * float64 in test_decode_quant.c. */
#include "check.h"

enum { B = 2, HQ = 16, HK = 8, D = 32, PAGE = 256 };

typedef struct {
    fa_problem p;
    int32_t lens[B], *table;
    int64_t rows; /* cache rows (pages x page size, or B x capacity) */
    uint8_t *k, *v, *k0, *v0;
    float *ks, *vs, *ks0, *vs0, *lse;
    uint16_t *q, *o, *kn, *vn; /* bf16 */
} scase;

static uint64_t rng;

static int64_t row_of(const scase *c, int64_t b, int64_t t) {
    const fa_problem *p = &c->p;
    return p->page_size ? (int64_t)c->table[b * p->max_pages + t / p->page_size] * p->page_size + t % p->page_size
                        : b * p->seq_k + t;
}

/* Two sequences of 9000 and 7000 cached tokens (capacity 9216, 8 kv heads: 128000 scales
 * of k a call reads), fp8 codes and scales from fa_quantize_rows, one new token each. */
static void make(scase *c, int paged) {
    memset(c, 0, sizeof *c);
    fa_problem *p = &c->p;
    fa_problem_init(p);
    p->batch = B, p->heads_q = HQ, p->heads_kv = HK, p->head_dim = p->head_dim_v = D, p->seq_q = 1;
    p->dtype = FA_BF16, p->has_cache_dtype = 1, p->cache_dtype = FA_FP8_E4M3, p->has_new_kv = 1;
    c->lens[0] = 9000, c->lens[1] = 7000;
    p->seq_k = 9216;
    p->cache_seqlens = c->lens;
    c->rows = B * p->seq_k;
    if (paged) {
        p->page_size = PAGE, p->max_pages = p->seq_k / PAGE, p->num_pages = B * p->max_pages;
        c->table = tu_alloc(sizeof(int32_t) * (size_t)p->num_pages);
        for (int64_t i = 0; i < p->num_pages; i++) c->table[i] = (int32_t)i;
        for (int64_t i = p->num_pages - 1; i > 0; i--) { /* shuffled pages */
            const int64_t j = tu_int(&rng, 0, i);
            const int32_t t = c->table[i];
            c->table[i] = c->table[j], c->table[j] = t;
        }
    }
    const int64_t n = c->rows * HK * D, ns = c->rows * HK;
    float *x = tu_alloc(sizeof(float) * (size_t)n);
    c->k = tu_alloc(n), c->v = tu_alloc(n), c->k0 = tu_alloc(n), c->v0 = tu_alloc(n);
    c->ks = tu_alloc(4 * ns), c->vs = tu_alloc(4 * ns), c->ks0 = tu_alloc(4 * ns), c->vs0 = tu_alloc(4 * ns);
    for (int y = 0; y < 2; y++) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)tu_uniform(&rng);
        CHECK(fa_quantize_rows(FA_FP8_E4M3, FA_F32, x, ns, D, y ? c->v : c->k, y ? c->vs : c->ks) == FA_OK,
              "quantize: %s", fa_last_error());
    }
    for (int64_t b = 0; b < B; b++) /* rows past the lengths hold NaN scales: never read */
        for (int64_t t = c->lens[b]; t < p->seq_k; t++)
            for (int64_t h = 0; h < HK; h++) c->ks[row_of(c, b, t) * HK + h] = c->vs[row_of(c, b, t) * HK + h] = NAN;
    free(x);
    memcpy(c->k0, c->k, n), memcpy(c->v0, c->v, n), memcpy(c->ks0, c->ks, 4 * ns), memcpy(c->vs0, c->vs, 4 * ns);
    const int64_t nq = B * HQ * D, nn = B * HK * D;
    c->q = tu_alloc(2 * nq), c->o = tu_alloc(2 * nq), c->kn = tu_alloc(2 * nn), c->vn = tu_alloc(2 * nn);
    c->lse = tu_alloc(sizeof(float) * B * HQ);
    tu_fill(&rng, FA_BF16, c->q, nq, 2.0), tu_fill(&rng, FA_BF16, c->kn, nn, 1.0), tu_fill(&rng, FA_BF16, c->vn, nn, 1.0);
}

static void release(scase *c) {
    void *x[] = {c->table, c->k, c->v, c->k0, c->v0, c->ks, c->vs, c->ks0, c->vs0, c->lse, c->q, c->o, c->kn, c->vn};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static fa_plan *plan(const fa_problem *p, int threads) {
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = threads;
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(p, &opt, &pl) == FA_OK, "plan: %s", fa_last_error());
    return pl;
}

/* One call with scale (which: 0 k, 1 v) of sequence b, cache row t, kv head h set to bad;
 * expect an error naming it and nothing written, or (accepted) a call that runs. */
static void one(scase *c, fa_plan *pl, const char *label, int which, int64_t b, int64_t t, int64_t h, float bad,
                int accepted) {
    const int64_t n = c->rows * HK * D, ns = c->rows * HK, at = row_of(c, b, t) * HK + h;
    memcpy(c->k, c->k0, n), memcpy(c->v, c->v0, n), memcpy(c->ks, c->ks0, 4 * ns), memcpy(c->vs, c->vs0, 4 * ns);
    float *s = which ? c->vs : c->ks;
    s[at] = bad;
    tu_poison(FA_BF16, c->o, B * HQ * D);
    for (int i = 0; i < B * HQ; i++) c->lse[i] = 12345.0f;
    fa_forward_args a = {0};
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse, a.k_new = c->kn, a.v_new = c->vn;
    a.k_scale = c->ks, a.v_scale = c->vs, a.block_table = c->table;
    const fa_status st = fa_forward(pl, &a);
    if (accepted) {
        CHECK(st == FA_OK, "%s: scale %g refused: %s", label, (double)bad, fa_last_error());
        return;
    }
    char want[96];
    snprintf(want, sizeof want, "%s[%lld] (sequence %lld, cache row %lld, kv head %lld)", which ? "v_scale" : "k_scale",
             (long long)at, (long long)b, (long long)t, (long long)h);
    int same = !memcmp(c->k, c->k0, n) && !memcmp(c->v, c->v0, n);
    for (int64_t i = 0; i < ns; i++)
        if (i != at || which) same &= !memcmp(&c->ks[i], &c->ks0[i], 4);
    for (int64_t i = 0; i < ns; i++)
        if (i != at || !which) same &= !memcmp(&c->vs[i], &c->vs0[i], 4);
    for (int64_t i = 0; i < B * HQ * D; i++) same &= isnan(chk_load(FA_BF16, c->o, i)) != 0;
    for (int i = 0; i < B * HQ; i++) same &= c->lse[i] == 12345.0f;
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), want) && same,
          "%s: scale %g of %s: %s (%s), nothing written %d", label, (double)bad, want, fa_status_string(st),
          fa_last_error(), same);
}

int main(void) {
    rng = check_seed("test_decode_scales");
    const float bad[] = {NAN, INFINITY, -INFINITY, -0.25f, -1e-45f};
    int n = 0;
    for (int paged = 0; paged <= 1; paged++) {
        scase c;
        make(&c, paged);
        for (int threads = 1; threads <= 2; threads++) {
            fa_plan *pl = plan(&c.p, threads);
            if (!pl) continue;
            for (int which = 0; which < 2; which++)
                for (int64_t b = 0; b < B; b++) {
                    const int64_t rows[4] = {0, tu_int(&rng, 1, c.lens[b] - 2), c.lens[b] / 2 + 37, c.lens[b] - 1};
                    for (int r = 0; r < 4; r++) {
                        char label[128];
                        snprintf(label, sizeof label, "%s, %d thread%s", paged ? "paged" : "dense", threads,
                                 threads > 1 ? "s" : "");
                        one(&c, pl, label, which, b, rows[r], tu_int(&rng, 0, HK - 1), bad[n++ % 5], 0);
                    }
                }
            /* zeros of either sign are scales; the row past a length is never read */
            one(&c, pl, "-0", 0, 1, c.lens[1] / 3, 1, -0.0f, 1);
            one(&c, pl, "+0", 1, 0, c.lens[0] - 1, 3, 0.0f, 1);
            one(&c, pl, "past the length", 0, 0, c.lens[0] + 1, 0, NAN, 1);
            fa_plan_destroy(pl);
        }
        release(&c);
    }
    if (!check_finish("test_decode_scales")) printf("test_decode_scales: %d bad scales refused\n", n);
    return failures ? 1 : 0;
}
