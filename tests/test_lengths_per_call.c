/* Lengths per call (fa_problem.lengths_per_call): a 50-step decode loop with appends runs on
 * one plan made from capacities, each step compared with a fresh plan made with that step's
 * lengths (the same bits of o, lse and caches, the same cost) and with the float64
 * reference; the call's counts equal fa_plan_cost_lengths. Packed batches likewise over a
 * few calls (rows past the call's total untouched). Bad use is an error that writes
 * nothing: a per-call plan called without lengths, lengths past capacity, a plan made with
 * lengths called with others. What a plan made from capacities bounds: test_capacity_bounds.c.
 * FA_TEST_SEED reproduces a run. */
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

#define B 3
#define STEPS 50

typedef struct {
    fa_problem p; /* the per-call problem: capacities */
    int32_t lens[B], *table;
    void *q, *kn, *vn, *k, *v, *k2, *v2, *o, *o2;
    float *lse, *lse2;
    int64_t rows, nc, nq, nn;
} loop;

/* Row of the cache holding position t of sequence b. */
static int64_t cache_row(const loop *L, int64_t b, int64_t t) {
    const fa_problem *p = &L->p;
    return p->page_size ? L->table[b * p->max_pages + t / p->page_size] * p->page_size + t % p->page_size
                        : b * p->seq_k + t;
}

static void make_loop(loop *L, fa_dtype dt, int paged) {
    memset(L, 0, sizeof *L);
    fa_problem *p = &L->p;
    fa_problem_init(p);
    p->batch = B, p->heads_q = 8, p->heads_kv = 2, p->head_dim = 32, p->seq_q = 1, p->dtype = dt;
    p->has_new_kv = 1, p->causal = 1, p->lengths_per_call = FA_LENGTHS_CACHE;
    const int64_t cap = 96;
    L->lens[0] = 0, L->lens[1] = (int32_t)tu_int(&rng, 1, 20), L->lens[2] = (int32_t)tu_int(&rng, 30, cap - STEPS);
    if (paged) {
        p->page_size = 16, p->max_pages = cap / 16, p->seq_k = cap, p->num_pages = B * p->max_pages + 2;
        L->table = tu_alloc(sizeof(int32_t) * B * (size_t)p->max_pages);
        for (int64_t i = 0; i < B * p->max_pages; i++) L->table[i] = (int32_t)i;
        for (int64_t i = B * p->max_pages - 1; i > 0; i--) { /* shuffled pages */
            const int64_t j = tu_int(&rng, 0, i);
            const int32_t t = L->table[i];
            L->table[i] = L->table[j], L->table[j] = t;
        }
        L->rows = p->num_pages * p->page_size;
    } else {
        p->seq_k = cap;
        L->rows = B * cap;
    }
    const size_t es = fa_dtype_size(dt);
    L->nc = L->rows * p->heads_kv * p->head_dim, L->nq = B * p->heads_q * p->head_dim, L->nn = B * p->heads_kv * p->head_dim;
    L->k = tu_alloc(L->nc * es), L->v = tu_alloc(L->nc * es), L->k2 = tu_alloc(L->nc * es), L->v2 = tu_alloc(L->nc * es);
    L->q = tu_alloc(L->nq * es), L->o = tu_alloc(L->nq * es), L->o2 = tu_alloc(L->nq * es);
    L->kn = tu_alloc(L->nn * es), L->vn = tu_alloc(L->nn * es);
    L->lse = tu_alloc(sizeof(float) * B * 8), L->lse2 = tu_alloc(sizeof(float) * B * 8);
    tu_poison(dt, L->k, L->nc), tu_poison(dt, L->v, L->nc); /* past each length: NaN, never read */
    const int64_t W = p->heads_kv * p->head_dim;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L->lens[b]; t++) {
            tu_fill(&rng, dt, (char *)L->k + cache_row(L, b, t) * W * (int64_t)es, W, 2.0);
            tu_fill(&rng, dt, (char *)L->v + cache_row(L, b, t) * W * (int64_t)es, W, 1.0);
        }
    memcpy(L->k2, L->k, L->nc * es), memcpy(L->v2, L->v, L->nc * es);
}

static void free_loop(loop *L) {
    void *x[] = {L->table, L->q, L->kn, L->vn, L->k, L->v, L->k2, L->v2, L->o, L->o2, L->lse, L->lse2};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static fa_forward_args loop_args(loop *L, void *k, void *v, void *o, float *lse, fa_counts *cnt) {
    fa_forward_args a = {0};
    a.q = L->q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.k_new = L->kn, a.v_new = L->vn;
    a.block_table = L->table, a.counts = cnt;
    return a;
}

/* One plan for every step; each step against a fresh plan of its lengths and the reference. */
static void decode_loop(fa_dtype dt, int paged, int threads) {
    loop L;
    make_loop(&L, dt, paged);
    const fa_problem *p = &L.p;
    const size_t es = fa_dtype_size(dt);
    char label[64];
    snprintf(label, sizeof label, "decode loop %s%s threads %d", fa_dtype_name(dt), paged ? " paged" : "", threads);
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = threads;
    fa_plan *one = NULL;
    if (fa_plan_create(p, &opt, &one)) {
        CHECK(0, "%s: plan: %s", label, fa_last_error());
        free_loop(&L);
        return;
    }
    double *ro = tu_alloc(sizeof(double) * (size_t)L.nq), *rl = tu_alloc(sizeof(double) * B * 8);
    const int64_t od[4] = {B, 1, p->heads_q, p->head_dim}, ld[4] = {B, p->heads_q, 1, 1};
    const fa_strides dense = {{0, 0, 0, 0}};
    for (int step = 0; step < STEPS && !failures; step++) {
        tu_fill(&rng, dt, L.q, L.nq, 2.0), tu_fill(&rng, dt, L.kn, L.nn, 2.0), tu_fill(&rng, dt, L.vn, L.nn, 1.0);
        fa_problem fresh = *p;
        fresh.lengths_per_call = 0, fresh.cache_seqlens = L.lens;
        fa_counts cnt = {0}, cnt2 = {0};
        fa_forward_args a = loop_args(&L, L.k, L.v, L.o, L.lse, &cnt);
        fa_ref_decode(&fresh, &a, ro, rl); /* the caches before the call */
        a.cache_seqlens = L.lens;
        fa_cost want, got;
        fa_status st = fa_plan_cost_lengths(one, FA_FORWARD, L.lens, NULL, NULL, &want);
        CHECK(st == FA_OK, "%s step %d: cost of the lengths: %s", label, step, fa_last_error());
        tu_poison(dt, L.o, L.nq), tu_poison(dt, L.o2, L.nq);
        st = fa_forward(one, &a);
        CHECK(st == FA_OK, "%s step %d: forward: %s", label, step, fa_last_error());
        CHECK(cnt.flops == want.flops && cnt.transcendentals == want.transcendentals,
              "%s step %d: counts %lld/%lld, fa_plan_cost_lengths %lld/%lld", label, step, (long long)cnt.flops,
              (long long)cnt.transcendentals, (long long)want.flops, (long long)want.transcendentals);
        fa_plan *pl = NULL;
        st = fa_plan_create(&fresh, &opt, &pl);
        CHECK(st == FA_OK, "%s step %d: fresh plan: %s", label, step, fa_last_error());
        if (st) break;
        fa_plan_cost(pl, FA_FORWARD, &got);
        CHECK(!memcmp(&got, &want, sizeof got), "%s step %d: a fresh plan's cost differs from fa_plan_cost_lengths "
              "(bytes %lld vs %lld, workspace %lld vs %lld)", label, step, (long long)got.bytes_accessed,
              (long long)want.bytes_accessed, (long long)got.workspace_bytes, (long long)want.workspace_bytes);
        fa_forward_args a2 = loop_args(&L, L.k2, L.v2, L.o2, L.lse2, &cnt2);
        st = fa_forward(pl, &a2);
        CHECK(st == FA_OK, "%s step %d: fresh forward: %s", label, step, fa_last_error());
        fa_plan_destroy(pl);
        CHECK(!memcmp(L.o, L.o2, L.nq * es) && !memcmp(L.lse, L.lse2, sizeof(float) * B * 8),
              "%s step %d: o or lse differs from a fresh plan's", label, step);
        CHECK(!memcmp(L.k, L.k2, L.nc * es) && !memcmp(L.v, L.v2, L.nc * es),
              "%s step %d: the caches differ from a fresh plan's", label, step);
        check_tensor("o", dt, L.o, &dense, ro, od, check_tol_of(dt), NULL, 0);
        check_tensor("lse", FA_F32, L.lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
        for (int64_t b = 0; b < B; b++) L.lens[b] += b == 1 && step % 7 == 3 ? 0 : 1; /* the next step's */
        if (L.lens[1] < L.lens[0]) L.lens[1] = L.lens[0];
        /* a sequence that did not advance is overwritten in place next step, as a decoder's retry */
    }
    fa_plan_destroy(one);
    free(ro), free(rl);
    free_loop(&L);
}

/* A plan the library runs no backward of (fa_plan_cost in flashattn.h): all its backward
 * figures 0, at the plan and for given lengths, and 0 x 0 tiles, with no error left behind
 * (the cost model asked the backend table and dropped the refusal's message). */
static void no_backward(const fa_plan *pl, const char *what, const int32_t *lens, const int32_t *cq, const int32_t *ck) {
    if (!pl) return;
    fa_cost c, l, zero = {0};
    memset(&c, 0x5a, sizeof c), memset(&l, 0x5a, sizeof l);
    int64_t bq = -1, bk = -1;
    fa_plan_blocks(pl, FA_BACKWARD, &bq, &bk);
    CHECK(fa_plan_cost(pl, FA_BACKWARD, &c) == FA_OK && !memcmp(&c, &zero, sizeof c) && bq == 0 && bk == 0,
          "%s: the backward figures are not 0 (flops %lld, peak %lld, tiles %lld x %lld)", what, (long long)c.flops,
          (long long)c.peak_bytes, (long long)bq, (long long)bk);
    CHECK(fa_plan_cost_lengths(pl, FA_BACKWARD, lens, cq, ck, &l) == FA_OK && !memcmp(&l, &zero, sizeof l),
          "%s: the backward figures of given lengths are not 0 (flops %lld): %s", what, (long long)l.flops,
          fa_last_error());
    CHECK(!*fa_last_error(), "%s: the costs left an error: %s", what, fa_last_error());
    fa_plan_cost(pl, FA_FORWARD, &c);
    fa_plan_blocks(pl, FA_FORWARD, &bq, &bk);
    CHECK(c.flops > 0 && bq > 0 && bk > 0, "%s: the forward's figures are 0", what);
}

/* A packed batch of capacity 60 x 80 rows, several calls with other lengths. */
static void packed_calls(fa_dtype dt) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 16, p.seq_q = 60, p.seq_k = 80, p.dtype = dt;
    p.causal = 1, p.lengths_per_call = FA_LENGTHS_PACKED;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = p.seq_q * 4 * 16, nk = p.seq_k * 2 * 16;
    void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *v = tu_alloc(nk * es), *o = tu_alloc(nq * es), *o2 = tu_alloc(nq * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(4 * p.seq_q)), *lse2 = tu_alloc(sizeof(float) * (size_t)(4 * p.seq_q));
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)(4 * p.seq_q));
    tu_fill(&rng, dt, q, nq, 2.0), tu_fill(&rng, dt, k, nk, 2.0), tu_fill(&rng, dt, v, nk, 1.0);
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_plan *one = NULL;
    CHECK(fa_plan_create(&p, &opt, &one) == FA_OK, "packed: plan: %s", fa_last_error());
    for (int call = 0; call < 6 && one; call++) {
        int32_t cq[B + 1] = {0}, ck[B + 1] = {0};
        for (int b = 0; b < B; b++) {
            cq[b + 1] = cq[b] + (int32_t)tu_int(&rng, call == 1 && b == 1 ? 0 : 1, 20);
            ck[b + 1] = ck[b] + (int32_t)tu_int(&rng, 0, 26);
        }
        fa_counts cnt = {0};
        fa_forward_args a = {0};
        a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.counts = &cnt, a.cu_seqlens_q = cq, a.cu_seqlens_k = ck;
        fa_cost want, got;
        CHECK(fa_plan_cost_lengths(one, FA_FORWARD, NULL, cq, ck, &want) == FA_OK, "packed: cost: %s", fa_last_error());
        tu_poison(dt, o, nq), tu_poison(dt, o2, nq);
        CHECK(fa_forward(one, &a) == FA_OK, "packed call %d: %s", call, fa_last_error());
        CHECK(cnt.flops == want.flops && cnt.transcendentals == want.transcendentals,
              "packed call %d: counts %lld/%lld, fa_plan_cost_lengths %lld/%lld", call, (long long)cnt.flops,
              (long long)cnt.transcendentals, (long long)want.flops, (long long)want.transcendentals);
        fa_problem fresh = p;
        fresh.lengths_per_call = 0, fresh.cu_seqlens_q = cq, fresh.cu_seqlens_k = ck;
        fresh.seq_q = cq[B], fresh.seq_k = ck[B];
        fa_plan *pl = NULL;
        if (fa_plan_create(&fresh, &opt, &pl)) {
            CHECK(0, "packed call %d: fresh plan: %s", call, fa_last_error());
            continue;
        }
        fa_plan_cost(pl, FA_FORWARD, &got);
        CHECK(got.flops == want.flops && got.transcendentals == want.transcendentals &&
                  got.bytes_accessed == want.bytes_accessed && got.min_bytes == want.min_bytes &&
                  got.workspace_bytes == want.workspace_bytes,
              "packed call %d: a fresh plan's cost differs from fa_plan_cost_lengths", call);
        fa_forward_args a2 = a;
        a2.o = o2, a2.lse = lse2, a2.cu_seqlens_q = a2.cu_seqlens_k = NULL;
        CHECK(fa_forward(pl, &a2) == FA_OK, "packed call %d: fresh forward: %s", call, fa_last_error());
        fa_ref_varlen_forward(&fresh, &a2, ro, rl);
        fa_plan_destroy(pl);
        CHECK(!memcmp(o, o2, (size_t)cq[B] * 64 * es), "packed call %d: o differs from a fresh plan's", call);
        for (int64_t i = cq[B] * 64; i < nq; i++)
            if (!isnan(chk_load(dt, o, i))) {
                CHECK(0, "packed call %d: o row %lld past the call's %d rows was written", call, (long long)(i / 64), cq[B]);
                break;
            }
        for (int64_t h = 0; h < 4; h++) /* per call: [Hq, seq_q capacity]; fresh: [Hq, total] */
            CHECK(!memcmp(lse + h * p.seq_q, lse2 + h * cq[B], sizeof(float) * (size_t)cq[B]),
                  "packed call %d: lse of head %lld differs from a fresh plan's", call, (long long)h);
        const int64_t od[4] = {1, cq[B], 4, 16};
        const fa_strides dense = {{0, 0, 0, 0}};
        check_tensor("packed o", dt, o, &dense, ro, od, check_tol_of(dt), NULL, 0);
    }
    fa_backward_args ba = {0};
    CHECK(one && fa_backward(one, &ba) == FA_ERR_INVALID && strstr(fa_last_error(), "lengths per call"),
          "packed: the backward of a per-call plan: %s", fa_last_error());
    int32_t cq1[B + 1] = {0, 5, 10, 15};
    no_backward(one, "packed per-call plan", NULL, cq1, cq1);
    /* past capacity: an error, o untouched */
    int32_t cq[B + 1] = {0, 20, 40, 61}, ck[B + 1] = {0, 10, 20, 30};
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.cu_seqlens_q = cq, a.cu_seqlens_k = ck;
    tu_poison(dt, o, nq);
    CHECK(one && fa_forward(one, &a) == FA_ERR_INVALID && strstr(fa_last_error(), "fa_forward: cu_seqlens_q[3]") &&
              isnan(chk_load(dt, o, 0)),
          "packed: lengths past capacity: %s", fa_last_error());
    fa_plan_destroy(one);
    void *x[] = {q, k, v, o, o2, lse, lse2, ro, rl};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

/* Misuse: an error naming the argument, nothing written. */
static void misuse(void) {
    loop L;
    make_loop(&L, FA_BF16, 0);
    const size_t es = 2;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_plan *one = NULL, *fixed = NULL;
    fa_problem with = L.p;
    with.lengths_per_call = 0, with.cache_seqlens = L.lens;
    CHECK(fa_plan_create(&L.p, &opt, &one) == FA_OK && fa_plan_create(&with, &opt, &fixed) == FA_OK, "misuse: plans: %s",
          fa_last_error());
    if (!one || !fixed) goto done;
    fa_forward_args a = loop_args(&L, L.k, L.v, L.o, L.lse, NULL);
    tu_poison(FA_BF16, L.o, L.nq);
    CHECK(fa_forward(one, &a) == FA_ERR_NULL && strstr(fa_last_error(), "cache_seqlens is NULL"),
          "misuse: a per-call plan without lengths: %s", fa_last_error());
    int32_t over[B] = {L.lens[0], (int32_t)L.p.seq_k, L.lens[2]}; /* plus one new token: past capacity */
    a.cache_seqlens = over;
    CHECK(fa_forward(one, &a) == FA_ERR_INVALID && strstr(fa_last_error(), "fa_forward: cache_seqlens[1]"),
          "misuse: lengths past capacity (named as the call's error): %s", fa_last_error());
    int32_t other[B] = {L.lens[0] + 1, L.lens[1], L.lens[2]};
    a.cache_seqlens = other;
    CHECK(fa_forward(fixed, &a) == FA_ERR_INVALID && strstr(fa_last_error(), "cache_seqlens[0] = ") &&
              strstr(fa_last_error(), "plan was made with"),
          "misuse: a plan made with lengths called with others: %s", fa_last_error());
    CHECK(fa_plan_cost_lengths(fixed, FA_FORWARD, other, NULL, NULL, &(fa_cost){0}) == FA_ERR_INVALID,
          "misuse: the cost of other lengths of a plan made with lengths");
    CHECK(!memcmp(L.k, L.k2, L.nc * es) && !memcmp(L.v, L.v2, L.nc * es) && isnan(chk_load(FA_BF16, L.o, 0)),
          "misuse: a refused call wrote something");
    int32_t cu[B + 1] = {0, 1, 2, 3};
    a.cache_seqlens = NULL, a.cu_seqlens_q = a.cu_seqlens_k = cu;
    CHECK(fa_forward(fixed, &a) == FA_ERR_INVALID && strstr(fa_last_error(), "cu_seqlens"),
          "misuse: cu_seqlens to a decode plan: %s", fa_last_error());
    a.cu_seqlens_q = a.cu_seqlens_k = NULL, a.cache_seqlens = L.lens;
    CHECK(fa_forward(fixed, &a) == FA_OK, "misuse: a plan made with lengths called with the same: %s", fa_last_error());
    no_backward(one, "decode per-call plan", L.lens, NULL, NULL);
    fa_backward_args none = {0}; /* decoding's reason, not the packed batches' advice */
    CHECK(fa_backward(one, &none) == FA_ERR_INVALID && strstr(fa_last_error(), "decoding has no backward") &&
              !strncmp(fa_last_error(), "fa_backward: ", 13) &&
              !strstr(fa_last_error(), "cu_seqlens"),
          "misuse: the backward of a decode per-call plan: %s", fa_last_error());
    no_backward(fixed, "decode plan made with lengths", NULL, NULL, NULL);
    fa_cost c1, c2;
    fa_plan_cost(fixed, FA_FORWARD, &c1);
    CHECK(fa_plan_cost_lengths(fixed, FA_FORWARD, NULL, NULL, NULL, &c2) == FA_OK && !memcmp(&c1, &c2, sizeof c1),
          "misuse: fa_plan_cost_lengths of a plan made with lengths, none given");
    fa_plan *bad = NULL;
    fa_problem both = L.p;
    both.cache_seqlens = L.lens;
    CHECK(fa_plan_create(&both, &opt, &bad) == FA_ERR_INVALID && strstr(fa_last_error(), "must be NULL"),
          "misuse: lengths_per_call with the problem's lengths: %s", fa_last_error());
    both = L.p;
    fa_options cuda = opt;
    cuda.backend = FA_BACKEND_CUDA;
    CHECK(fa_plan_create(&both, &cuda, &bad) == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "lengths per call"),
          "misuse: lengths per call on cuda: %s", fa_last_error());
    /* the problem a capacity plan shows is one fa_plan_create takes again: no lengths (the
     * capacity's stand-ins showed, and the re-plan said they "must be NULL") */
    const fa_problem *shown = fa_plan_problem(one);
    fa_plan *again = NULL;
    CHECK(shown && !shown->cache_seqlens && shown->lengths_per_call == FA_LENGTHS_CACHE &&
              fa_plan_create(shown, &opt, &again) == FA_OK,
          "misuse: a capacity plan's fa_plan_problem planned again: %s", fa_last_error());
    if (again) {
        fa_cost c3, c4;
        fa_plan_cost(one, FA_FORWARD, &c3), fa_plan_cost(again, FA_FORWARD, &c4);
        CHECK(!memcmp(&c3, &c4, sizeof c3), "misuse: the re-planned capacity plan's costs differ");
    }
    fa_plan_destroy(again);
    both.lengths_per_call = 3;
    CHECK(fa_plan_create(&both, &opt, &bad) == FA_ERR_INVALID && strstr(fa_last_error(), "lengths_per_call"),
          "misuse: lengths_per_call 3: %s", fa_last_error());
done:
    fa_plan_destroy(one), fa_plan_destroy(fixed);
    free_loop(&L);
}

int main(void) {
    rng = check_seed("test_lengths_per_call");
    decode_loop(FA_BF16, 0, 2);
    decode_loop(FA_F32, 1, 3);
    decode_loop(FA_F16, 1, 1);
    packed_calls(FA_F32);
    packed_calls(FA_BF16);
    misuse();
    return check_finish("test_lengths_per_call");
}
