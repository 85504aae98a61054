/* KV-cache decoding against the float64 reference: ragged cache_seqlens including 0,
 * Sq_new 1..16, GQA 8:1 and MQA, appended k_new/v_new (the cache afterwards equals the
 * expected cache, untouched elsewhere), paged caches with shuffled pages and pages shared
 * read-only between sequences, every mask; cache rows past each length hold NaN (results
 * must not depend on them); counts == plan; bit-identical for 1, 2 and 3 threads; bad
 * input (capacity, block table) rejected naming the argument, with nothing written. */
#include "ref/ref.h"
#include "check.h"

static int failures;
static uint64_t seed, rng;

#define MAXB 6

typedef struct {
    fa_problem p;
    int32_t lens[MAXB], *table;
    void *q, *k, *v, *kn, *vn, *o, *k0, *v0; /* k0, v0: the caches before the call */
    int64_t rows;                             /* cache rows: B x S_cache_max or num_pages x page_size */
    float *lse, *slopes;
} dcase;

/* Random caches (NaN past each sequence's length), lengths (0 among them), pages. */
static const int32_t *fixed_lens; /* when set, the lengths of the next case (each below the capacity) */
static int64_t fixed_page;        /* when set, the page size of the next paged case */

static void make_case(dcase *c, int64_t B, int64_t Hq, int64_t Hk, int64_t D, int64_t Sq, fa_dtype dt, int paged,
                      int append, int masks) {
    memset(c, 0, sizeof *c);
    fa_problem_init(&c->p);
    fa_problem *p = &c->p;
    p->batch = B, p->heads_q = Hq, p->heads_kv = Hk, p->head_dim = D, p->head_dim_v = D, p->dtype = dt, p->seq_q = Sq;
    p->has_new_kv = append;
    const int64_t cap = fixed_lens ? 2880 : 48 * (int64_t)tu_int(&rng, 1, 60); /* up to 2880 keys: several chunks */
    for (int64_t b = 0; b < B; b++) {
        const int64_t kind = tu_int(&rng, 0, 4);
        int64_t n = kind == 0 ? 0 : kind == 1 ? tu_int(&rng, 1, 5) : tu_int(&rng, 0, cap - Sq);
        c->lens[b] = (int32_t)(fixed_lens ? fixed_lens[b] : n);
    }
    if (paged) {
        const int64_t ps = fixed_page ? fixed_page : 16 * tu_int(&rng, 1, 8);
        p->page_size = ps, p->max_pages = (cap + ps - 1) / ps, p->seq_k = p->max_pages * ps;
        p->num_pages = B * p->max_pages + 3;
        c->table = tu_alloc(sizeof(int32_t) * (size_t)(B * p->max_pages));
        int64_t *perm = tu_alloc(sizeof(int64_t) * (size_t)p->num_pages);
        for (int64_t i = 0; i < p->num_pages; i++) perm[i] = i;
        for (int64_t i = p->num_pages - 1; i > 0; i--) { /* shuffled page order */
            const int64_t j = tu_int(&rng, 0, i), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int64_t i = 0; i < B * p->max_pages; i++) c->table[i] = (int32_t)perm[i];
        /* without appending, sequence 1 shares sequence 0's first pages (read-only) */
        if (!append && B > 1)
            for (int64_t j = 0; j < p->max_pages / 2; j++) c->table[p->max_pages + j] = c->table[j];
        for (int64_t i = B * p->max_pages - 1; i >= 0; i--) /* unused entries hold garbage */
            if (i % p->max_pages >= (c->lens[i / p->max_pages] + (append ? Sq : 0) + ps - 1) / ps) c->table[i] = -7;
        free(perm);
        c->rows = p->num_pages * ps;
    } else {
        p->seq_k = cap;
        c->rows = B * cap;
    }
    p->cache_seqlens = c->lens;
    p->causal = masks & 1;
    if (masks & 2) p->window_left = tu_int(&rng, 0, 300), p->window_right = tu_int(&rng, 0, 4);
    if (masks & 4) p->has_alibi = 1;
    if (masks & 8) p->softcap = 5.0f;
    const size_t es = fa_dtype_size(dt);
    const int64_t nc = c->rows * Hk * D, nq = B * Sq * Hq * D, nn = B * Sq * Hk * D;
    c->q = tu_alloc(nq * es), c->o = tu_alloc(nq * es), c->kn = tu_alloc(nn * es), c->vn = tu_alloc(nn * es);
    c->k = tu_alloc(nc * es), c->v = tu_alloc(nc * es), c->k0 = tu_alloc(nc * es), c->v0 = tu_alloc(nc * es);
    tu_fill(&rng, dt, c->q, nq, 2.0), tu_fill(&rng, dt, c->kn, nn, 2.0), tu_fill(&rng, dt, c->vn, nn, 1.0);
    tu_poison(dt, c->k, nc), tu_poison(dt, c->v, nc); /* rows nobody owns stay NaN */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->lens[b]; t++) {
            const int64_t row = paged ? c->table[b * p->max_pages + t / p->page_size] * p->page_size + t % p->page_size
                                      : b * cap + t;
            tu_fill(&rng, dt, (char *)c->k + row * Hk * D * es, Hk * D, 2.0);
            tu_fill(&rng, dt, (char *)c->v + row * Hk * D * es, Hk * D, 1.0);
        }
    memcpy(c->k0, c->k, nc * es), memcpy(c->v0, c->v, nc * es);
    c->lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
    c->slopes = tu_alloc(sizeof(float) * (size_t)Hq);
    for (int64_t h = 0; h < Hq; h++) c->slopes[h] = (float)(0.02 * (h + 1));
}

static void free_case(dcase *c) {
    void *x[] = {c->q, c->k, c->v, c->kn, c->vn, c->o, c->k0, c->v0, c->lse, c->slopes, c->table};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static fa_forward_args args_of(dcase *c, fa_counts *cnt) {
    fa_forward_args a = {0};
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse, a.counts = cnt;
    /* a feature's tensors only where the problem has it (the library refuses the others) */
    a.alibi_slopes = c->p.has_alibi ? c->slopes : NULL;
    if (c->p.has_new_kv) a.k_new = c->kn, a.v_new = c->vn;
    a.block_table = c->p.page_size ? c->table : NULL;
    return a;
}

/* The caches after appending: the originals with row lens[b] + t set from the new rows. */
static int cache_as_expected(dcase *c, const void *cache, const void *before, const void *fresh) {
    const fa_problem *p = &c->p;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t W = p->heads_kv * p->head_dim;
    char *want = tu_alloc(c->rows * W * es);
    memcpy(want, before, c->rows * W * es);
    if (p->has_new_kv)
        for (int64_t b = 0; b < p->batch; b++)
            for (int64_t t = 0; t < p->seq_q; t++) {
                const int64_t pos = c->lens[b] + t;
                const int64_t row = p->page_size ? c->table[b * p->max_pages + pos / p->page_size] * p->page_size +
                                                       pos % p->page_size
                                                 : b * p->seq_k + pos;
                memcpy(want + row * W * es, (const char *)fresh + (b * p->seq_q + t) * W * es, W * es);
            }
    const int same = !memcmp(want, cache, c->rows * W * es); /* NaN payloads compare by bits */
    free(want);
    return same;
}

static void run_case(const char *label, dcase *c) {
    fa_problem *p = &c->p;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t no = p->batch * p->seq_q * p->heads_q * p->head_dim, nl = p->batch * p->heads_q * p->seq_q;
    const int64_t nc = c->rows * p->heads_kv * p->head_dim;
    double *ro = tu_alloc(sizeof(double) * (size_t)no), *rl = tu_alloc(sizeof(double) * (size_t)nl);
    fa_counts cnt = {0};
    fa_forward_args a = args_of(c, &cnt);
    fa_ref_decode(p, &a, ro, rl);
    void *first = tu_alloc(no * es);
    for (int threads = 1; threads <= 3; threads++) {
        memcpy(c->k, c->k0, nc * es), memcpy(c->v, c->v0, nc * es);
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CPU, opt.threads = threads;
        fa_plan *pl = NULL;
        fa_status st = fa_plan_create(p, &opt, &pl);
        CHECK(st == FA_OK, "%s: plan: %s", label, fa_last_error());
        if (st) break;
        fa_cost fc;
        fa_plan_cost(pl, FA_FORWARD, &fc);
        tu_poison(p->dtype, c->o, no);
        for (int64_t i = 0; i < nl; i++) c->lse[i] = NAN;
        st = fa_forward(pl, &a);
        CHECK(st == FA_OK, "%s: forward: %s", label, fa_last_error());
        CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals,
              "%s: counts %lld/%lld, plan %lld/%lld", label, (long long)cnt.flops, (long long)cnt.transcendentals,
              (long long)fc.flops, (long long)fc.transcendentals);
        double eo = 0, mo = 0, el = 0;
        for (int64_t i = 0; i < no; i++) {
            const double g = chk_load(p->dtype, c->o, i);
            if (!(fabs(g - ro[i]) <= eo)) eo = isnan(g) ? INFINITY : fabs(g - ro[i]);
            if (fabs(ro[i]) > mo) mo = fabs(ro[i]);
        }
        eo /= mo > 0 ? mo : 1;
        for (int64_t i = 0; i < nl; i++) {
            if (isinf(rl[i]) || isinf(c->lse[i]) || isnan(c->lse[i])) {
                if (rl[i] != c->lse[i]) el = INFINITY;
                continue;
            }
            const double e = fabs(c->lse[i] - rl[i]) / (1 + fabs(rl[i]));
            if (e > el) el = e;
        }
        const double tol = p->dtype == FA_F32 ? 2e-5 : 2e-2;
        CHECK(eo <= tol && el <= 1e-5, "%s threads %d: o err %.3g (bound %.3g), lse err %.3g", label, threads, eo, tol,
              el);
        CHECK(cache_as_expected(c, c->k, c->k0, c->kn) && cache_as_expected(c, c->v, c->v0, c->vn),
              "%s: the caches after the call are not the expected ones", label);
        if (threads == 1) memcpy(first, c->o, no * es);
        else CHECK(!memcmp(first, c->o, no * es), "%s: o differs between 1 and %d threads", label, threads);
        if (threads == 2 && !p->has_new_kv) { /* the plan's workspace is what the call needs: exactly */
            fa_forward_args w = a;
            w.workspace_size = (size_t)fc.workspace_bytes;
            w.workspace = tu_alloc(w.workspace_size);
            memset(w.workspace, 0xff, w.workspace_size); /* NaN-filled scratch */
            st = fa_forward(pl, &w);
            CHECK(st == FA_OK && !memcmp(first, c->o, no * es), "%s: run in the plan's workspace: %s", label,
                  fa_status_string(st));
            w.workspace_size--;
            st = fa_forward(pl, &w);
            CHECK(st == FA_ERR_INVALID, "%s: a workspace one byte short gave %s", label, fa_status_string(st));
            free(w.workspace);
        }
        fa_plan_destroy(pl);
    }
    free(ro), free(rl), free(first);
}

/* Plan figures against hand counts: without masks every row sees Sk_b = lens[b] + Sq_new
 * keys; the cache bytes read are those keys' K and V rows once per kv head. */
static void hand_counts(void) {
    int32_t lens[3] = {100, 0, 513};
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 3, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 16, p.seq_q = 2, p.seq_k = 1024, p.dtype = FA_BF16;
    p.cache_seqlens = lens, p.has_new_kv = 1;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_plan *pl = NULL;
    if (fa_plan_create(&p, &opt, &pl)) {
        CHECK(0, "hand counts: plan: %s", fa_last_error());
        return;
    }
    fa_cost c;
    fa_plan_cost(pl, FA_FORWARD, &c);
    const int64_t keys = 102 + 2 + 515; /* Sk_b */
    CHECK(c.flops_useful == 8 * 2 * keys * 2 * 32, "hand counts: flops_useful %lld, want %lld",
          (long long)c.flops_useful, (long long)(8 * 2 * keys * 64));
    CHECK(c.flops == c.flops_useful, "hand counts: no masks, every tile full of useful keys: flops %lld",
          (long long)c.flops);
    const int64_t q = 3 * 2 * 8 * 16 * 2, o = q, lse = 3 * 8 * 2 * 4, fresh = 3 * 2 * 2 * 32 * 2;
    CHECK(c.min_bytes == q + keys * 2 * 32 * 2 + 2 * fresh + o + lse, "hand counts: min_bytes %lld, want %lld",
          (long long)c.min_bytes, (long long)(q + keys * 2 * 32 * 2 + 2 * fresh + o + lse));
    CHECK(fa_plan_exact(pl), "hand counts: decode plans are exact");
    fa_plan_destroy(pl);
}

/* Bad input: the plan refuses capacities, the call refuses block tables; nothing written. */
static void bad_inputs(void) {
    dcase c;
    make_case(&c, 3, 4, 2, 16, 2, FA_F32, 1, 1, 1);
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU;
    fa_plan *pl = NULL;
    fa_problem p = c.p;
    int32_t lens[MAXB];
    memcpy(lens, c.lens, sizeof lens);
    lens[1] = (int32_t)(p.seq_k - 1); /* plus 2 new tokens: one past the capacity */
    p.cache_seqlens = lens;
    fa_status st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "cache_seqlens[1]"), "overfull cache: %s (%s)",
          fa_status_string(st), fa_last_error());
    lens[1] = -1;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "cache_seqlens[1]"), "negative length: %s", fa_last_error());
    p = c.p, p.page_size = 24;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "page_size"), "page 24: %s", fa_last_error());

    st = fa_plan_create(&c.p, &opt, &pl);
    CHECK(st == FA_OK, "plan: %s", fa_last_error());
    const size_t es = fa_dtype_size(c.p.dtype);
    const int64_t nc = c.rows * c.p.heads_kv * c.p.head_dim, no = c.p.batch * c.p.seq_q * c.p.heads_q * c.p.head_dim;
    fa_forward_args a = args_of(&c, NULL);
    const int32_t saved = c.table[c.p.max_pages * 2 + (c.lens[2] + 1) / c.p.page_size];
    c.table[c.p.max_pages * 2 + (c.lens[2] + 1) / c.p.page_size] = (int32_t)c.p.num_pages; /* last used page of b=2 */
    tu_poison(c.p.dtype, c.o, no);
    st = fa_forward(pl, &a);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "block_table[2]"), "bad block table: %s (%s)",
          fa_status_string(st), fa_last_error());
    CHECK(!memcmp(c.k, c.k0, nc * es) && !memcmp(c.v, c.v0, nc * es), "a refused call changed the caches");
    int untouched = 1;
    for (int64_t i = 0; i < no; i++) untouched &= isnan(chk_load(c.p.dtype, c.o, i));
    CHECK(untouched, "a refused call wrote o");
    c.table[c.p.max_pages * 2 + (c.lens[2] + 1) / c.p.page_size] = saved;
    a.k_new = NULL;
    st = fa_forward(pl, &a);
    CHECK(st == FA_ERR_NULL && strstr(fa_last_error(), "k_new"), "missing k_new: %s", fa_last_error());
    fa_plan_destroy(pl);
    free_case(&c);
}

/* A paged append that would write one cache slot twice, from two sequences or from one
 * through two block-table entries naming the same page: refused, naming both entries, with
 * nothing written. Pages of 16; 20 new tokens after 5, 30 and 7 cached ones. */
static void overlapping_appends(void) {
    static const int32_t lens[3] = {5, 30, 7};
    dcase c;
    fixed_lens = lens, fixed_page = 16;
    make_case(&c, 3, 4, 2, 16, 20, FA_F32, 1, 1, 0);
    fixed_lens = NULL, fixed_page = 0;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU;
    fa_plan *pl = NULL;
    if (fa_plan_create(&c.p, &opt, &pl)) {
        CHECK(0, "overlapping appends: plan: %s", fa_last_error());
        free_case(&c);
        return;
    }
    const int64_t mp = c.p.max_pages, nc = c.rows * c.p.heads_kv * c.p.head_dim;
    const int64_t no = c.p.batch * c.p.seq_q * c.p.heads_q * c.p.head_dim;
    const size_t es = fa_dtype_size(c.p.dtype);
    /* sequence 0 writes rows 5..15 of its page 0, sequence 1 rows 0..15 of its page 2;
     * sequence 1's pages 2 and 3 (rows 0..15, then 0..1) */
    const struct { int64_t to, from; const char *a, *b; } alias[] = {
        {1 * mp + 2, 0 * mp + 0, "block_table[0][0]", "block_table[1][2]"},
        {1 * mp + 3, 1 * mp + 2, "block_table[1][2]", "block_table[1][3]"}};
    for (int x = 0; x < 2; x++) {
        const int32_t saved = c.table[alias[x].to];
        c.table[alias[x].to] = c.table[alias[x].from];
        fa_forward_args a = args_of(&c, NULL);
        tu_poison(c.p.dtype, c.o, no);
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), alias[x].a) && strstr(fa_last_error(), alias[x].b),
              "overlapping appends %d: %s (%s)", x, fa_status_string(st), fa_last_error());
        CHECK(!memcmp(c.k, c.k0, nc * es) && !memcmp(c.v, c.v0, nc * es), "overlapping appends %d changed the caches", x);
        int untouched = 1;
        for (int64_t i = 0; i < no; i++) untouched &= isnan(chk_load(c.p.dtype, c.o, i));
        CHECK(untouched, "overlapping appends %d wrote o", x);
        c.table[alias[x].to] = saved;
    }
    /* sequence 0 writes rows 5..15 of its page 0: given sequence 1's page 0, whose rows it
     * reads as cached positions 0..15, the append would overwrite them */
    {
        const int32_t saved = c.table[0];
        c.table[0] = c.table[1 * mp + 0];
        fa_forward_args a = args_of(&c, NULL);
        tu_poison(c.p.dtype, c.o, no);
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "block_table[0][0]") &&
                  strstr(fa_last_error(), "block_table[1][0]") && strstr(fa_last_error(), "reads"),
              "an append into rows another sequence reads: %s (%s)", fa_status_string(st), fa_last_error());
        CHECK(!memcmp(c.k, c.k0, nc * es) && !memcmp(c.v, c.v0, nc * es), "an append into read rows changed the caches");
        c.table[0] = saved;
    }
    /* one buffer as both caches: each append would write k's rows, then v's over them */
    {
        fa_forward_args a = args_of(&c, NULL);
        a.v = a.k;
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "same buffer"), "k and v one buffer with appends: %s (%s)",
              fa_status_string(st), fa_last_error());
        CHECK(!memcmp(c.k, c.k0, nc * es), "k and v one buffer: the cache changed");
    }
    /* v one element into k: their elements meet (k's element 1 is v's 0), pointers differ */
    {
        fa_forward_args a = args_of(&c, NULL);
        a.v = (const char *)c.k + es;
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "share memory") && strstr(fa_last_error(), "v (the value"),
              "v one element into k with appends: %s (%s)", fa_status_string(st), fa_last_error());
        CHECK(!memcmp(c.k, c.k0, nc * es), "v one element into k: the cache changed");
    }
    /* the caches are written in place, but nothing else may share their memory: o over the
     * key cache, or new keys read from inside the value cache the append writes */
    for (int x = 0; x < 2; x++) {
        fa_forward_args a = args_of(&c, NULL);
        if (x == 0) a.o = c.k;
        else a.k_new = (const char *)c.v + 16 * es;
        const char *want = x == 0 ? "o (bytes" : "v (the value cache) (bytes";
        const char *also = x == 0 ? "overlaps k (the key cache)" : "overlaps k_new";
        const fa_status st = fa_forward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), want) && strstr(fa_last_error(), also),
              "%s: %s (%s)", x == 0 ? "o over the key cache" : "k_new inside the value cache", fa_status_string(st),
              fa_last_error());
        CHECK(!memcmp(c.k, c.k0, nc * es) && !memcmp(c.v, c.v0, nc * es), "overlap %d: the refused call changed the caches",
              x);
    }
    fa_forward_args a = args_of(&c, NULL); /* the table as made: every slot written once */
    CHECK(fa_forward(pl, &a) == FA_OK, "distinct appends: %s", fa_last_error());
    fa_plan_destroy(pl);
    free_case(&c);
    /* pages that sequences only read may be shared (a common prefix's): sequences of 20, 30
     * and 18 cached tokens share their full page 0, and append 2 tokens each elsewhere */
    static const int32_t shared[3] = {20, 30, 18};
    fixed_lens = shared, fixed_page = 16;
    make_case(&c, 3, 4, 2, 16, 2, FA_F32, 1, 1, 0);
    fixed_lens = NULL, fixed_page = 0;
    c.table[c.p.max_pages] = c.table[2 * c.p.max_pages] = c.table[0];
    if (fa_plan_create(&c.p, &opt, &pl) == FA_OK) {
        fa_forward_args b = args_of(&c, NULL);
        CHECK(fa_forward(pl, &b) == FA_OK, "a read-only page shared by three sequences: %s", fa_last_error());
        fa_plan_destroy(pl);
    } else {
        CHECK(0, "shared page: plan: %s", fa_last_error());
    }
    free_case(&c);
}

/* Windows of INT64_MAX on either side show every key, as unbounded ones do: the same o,
 * lse and figures, bit for bit (the key span once overflowed there and lost every key). */
static void huge_windows(void) {
    dcase c;
    make_case(&c, 3, 4, 2, 16, 3, FA_F32, (int)tu_int(&rng, 0, 1), 0, 1);
    const int64_t no = c.p.batch * c.p.seq_q * c.p.heads_q * c.p.head_dim, nl = c.p.batch * c.p.heads_q * c.p.seq_q;
    const size_t es = fa_dtype_size(c.p.dtype);
    void *o0 = tu_alloc(no * es);
    float *l0 = tu_alloc(sizeof(float) * (size_t)nl);
    fa_cost cost0 = {0};
    for (int x = 0; x < 3; x++) {
        fa_problem p = c.p;
        p.window_left = x == 1 ? INT64_MAX : -1, p.window_right = x == 2 ? INT64_MAX : -1;
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CPU;
        fa_plan *pl = NULL;
        if (fa_plan_create(&p, &opt, &pl)) {
            CHECK(0, "huge windows %d: plan: %s", x, fa_last_error());
            break;
        }
        fa_cost cost;
        fa_plan_cost(pl, FA_FORWARD, &cost);
        fa_forward_args a = args_of(&c, NULL);
        tu_poison(c.p.dtype, c.o, no);
        CHECK(fa_forward(pl, &a) == FA_OK, "huge windows %d: %s", x, fa_last_error());
        if (x == 0) memcpy(o0, c.o, no * es), memcpy(l0, c.lse, sizeof(float) * (size_t)nl), cost0 = cost;
        else
            CHECK(!memcmp(o0, c.o, no * es) && !memcmp(l0, c.lse, sizeof(float) * (size_t)nl) &&
                      cost.flops == cost0.flops && cost.flops_useful == cost0.flops_useful,
                  "window (%lld, %lld) differs from an unbounded one: flops %lld, want %lld", (long long)p.window_left,
                  (long long)p.window_right, (long long)cost.flops, (long long)cost0.flops);
        fa_plan_destroy(pl);
    }
    free(o0), free(l0);
    free_case(&c);
}

int main(void) {
    seed = tu_seed();
    rng = seed;
    printf("test_decode: seed %llu (FA_TEST_SEED=%llu reproduces), isa %s\n", (unsigned long long)seed,
           (unsigned long long)seed, fa_cpu_isa());
    static const int64_t heads[][2] = {{8, 1}, {8, 8}, {16, 2}, {4, 1}, {6, 3}}; /* GQA 8:1, MHA, MQA ... */
    static const int64_t sqs[] = {1, 1, 2, 5, 16};
    int n = 0;
    for (int paged = 0; paged <= 1; paged++)
        for (int append = 0; append <= 1; append++)
            for (int masks = 0; masks < 16; masks += 1 + (int)tu_int(&rng, 0, 2)) {
                dcase c;
                const int64_t *hh = heads[tu_int(&rng, 0, 4)], Sq = sqs[tu_int(&rng, 0, 4)];
                const int64_t pick = tu_int(&rng, 0, 2);
                const fa_dtype dt = pick == 2 ? FA_F16 : pick ? FA_BF16 : FA_F32; /* f16: decode_cache*.c */
                const int m = append ? masks | 1 : masks; /* appended tokens are causal in practice; both tried */
                make_case(&c, tu_int(&rng, 1, MAXB), hh[0], hh[1], tu_int(&rng, 0, 1) ? 64 : 32, Sq, dt, paged, append,
                          n % 3 == 0 ? masks : m);
                char label[200];
                snprintf(label, sizeof label, "decode #%d B=%lld Hq=%lld Hk=%lld D=%lld Sq=%lld cap=%lld %s%s%s masks=%d",
                         n++, (long long)c.p.batch, (long long)hh[0], (long long)hh[1], (long long)c.p.head_dim,
                         (long long)Sq, (long long)c.p.seq_k, fa_dtype_name(dt), paged ? " paged" : "",
                         append ? " append" : "", c.p.causal | (c.p.window_left >= 0) << 1 | c.p.has_alibi << 2 |
                                                      (c.p.softcap > 0) << 3);
                run_case(label, &c);
                free_case(&c);
            }
    /* cases every run covers: lengths 0, 1 and several chunks; Sq_new 3; GQA 8:1; MQA;
     * paged and appending; and a batch whose only sequence sees nothing */
    static const int32_t lens_a[] = {0, 1, 700, 2000}, lens_b[] = {0};
    fixed_lens = lens_a;
    for (int paged = 0; paged <= 1; paged++) {
        dcase c;
        make_case(&c, 4, 16, 2, 64, 3, FA_BF16, paged, 1, 1);
        run_case(paged ? "fixed: lengths 0, 1, 700, 2000, 3 new, GQA 8:1, paged, bf16"
                       : "fixed: lengths 0, 1, 700, 2000, 3 new, GQA 8:1, bf16", &c);
        free_case(&c);
        make_case(&c, 4, 8, 1, 32, 1, FA_F32, paged, 0, 4);
        run_case(paged ? "fixed: MQA, ALiBi, paged, f32" : "fixed: MQA, ALiBi, f32", &c);
        free_case(&c);
    }
    /* the fused bf16 tile kernels: D = 128 with GQA 4:1 (the benchmark's shape, smaller),
     * and D = 72 (a last half 16-dim slice in the scores, a last 8-column block in p V)
     * with 6 rows per kv head (a partial block of 4), lengths that leave partial blocks of
     * 4 keys and odd pairs */
    static const int32_t lens_c[] = {1001, 77};
    fixed_lens = lens_c;
    for (int paged = 0; paged <= 1; paged++) {
        dcase c;
        make_case(&c, 2, 32, 8, 128, 1, FA_BF16, paged, 0, 1);
        run_case(paged ? "fixed: D=128, GQA 4:1, lengths 1001, 77, paged, bf16"
                       : "fixed: D=128, GQA 4:1, lengths 1001, 77, bf16", &c);
        free_case(&c);
        make_case(&c, 2, 32, 8, 128, 1, FA_F16, paged, 1, 1);
        run_case(paged ? "fixed: D=128, GQA 4:1, lengths 1001, 77, 1 new, paged, f16"
                       : "fixed: D=128, GQA 4:1, lengths 1001, 77, 1 new, f16", &c);
        free_case(&c);
        make_case(&c, 2, 6, 1, 72, 1, FA_BF16, paged, 1, 0);
        run_case(paged ? "fixed: D=72, 6 rows per kv head, 1 new, paged, bf16"
                       : "fixed: D=72, 6 rows per kv head, 1 new, bf16", &c);
        free_case(&c);
        /* head dims the fused bf16 kernels do not take (not a multiple of 8, past 256): they
         * once read them as multiples of 8 (wrong scores) or overran their q slices (a crash) */
        make_case(&c, 2, 4, 2, 12, 1, FA_BF16, paged, 1, 0);
        run_case(paged ? "fixed: D=12, 1 new, paged, bf16" : "fixed: D=12, 1 new, bf16", &c);
        free_case(&c);
        make_case(&c, 1, 2, 1, 264, 2, FA_BF16, paged, 0, 1);
        run_case(paged ? "fixed: D=264, Sq 2, paged, bf16" : "fixed: D=264, Sq 2, bf16", &c);
        free_case(&c);
    }
    fixed_lens = lens_b;
    {
        dcase c;
        make_case(&c, 1, 4, 2, 32, 2, FA_F32, 0, 0, 1);
        run_case("fixed: one empty sequence, nothing new (o = 0, lse = -inf)", &c);
        free_case(&c);
    }
    fixed_lens = NULL;
    n += 15;
    hand_counts();
    bad_inputs();
    overlapping_appends();
    huge_windows();
    {
        fa_problem p; /* the cuda backend says it has no decode kernels */
        int32_t lens[1] = {5};
        fa_problem_init(&p);
        p.batch = 1, p.heads_q = 8, p.heads_kv = 8, p.head_dim = 64, p.seq_q = 1, p.seq_k = 64, p.dtype = FA_BF16;
        p.cache_seqlens = lens;
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CUDA;
        fa_plan *pl = NULL;
        const fa_status st = fa_plan_create(&p, &opt, &pl);
        CHECK(st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "cuda"), "cuda decode plan: %s (%s)",
              fa_status_string(st), fa_last_error());
        fa_plan_destroy(pl);
    }
    if (failures) {
        printf("test_decode: %d FAILED (FA_TEST_SEED=%llu)\n", failures, (unsigned long long)seed);
        return 1;
    }
    printf("test_decode: all %d cases passed\n", n);
    return 0;
}
