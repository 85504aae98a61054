/* Batch invariance: one sequence's output bits (o and lse) do not depend on the other
 * sequences in its batch, on its place there, on the batch size or on the thread count,
 * for kv-cache decoding (new tokens appended or not, dense and paged caches, plain, int8
 * and fp8 caches) and packed
 * batches (the others' lengths moving the packed totals across the tile rules'
 * thresholds). The sequence runs alone on one thread first; every other arrangement must
 * give the same bits. FA_TEST_SEED reproduces a run. */
#include "check.h"

static uint64_t rng;

#define MAXB 5

/* Decode: sequence X (cache length nx) at place `at` of a batch of B whose other lengths
 * are others[]; o and lse of X's rows into ox, lx. */
/* ct: the cache's dtype (dt: a plain cache; int8 or fp8: codes, with X's scales in ksx, vsx). */
static void decode_one(fa_dtype dt, fa_dtype ct, int append, int64_t page, int64_t B, int64_t at, const int32_t *others,
                       int threads, const void *qx, const void *kx, const void *vx, const float *ksx, const float *vsx,
                       const void *knx, const void *vnx, int32_t nx, void *ox, float *lx) {
    const int64_t Hq = 8, Hk = 2, D = 64, Sq = 2, cap = 1600;
    const size_t es = fa_dtype_size(dt), cs = fa_dtype_size(ct);
    const int quant = ct != dt;
    const int64_t W = Hk * D, qn = Sq * Hq * D;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.head_dim = D, p.seq_q = Sq, p.dtype = dt, p.causal = 1;
    p.has_new_kv = append, p.seq_k = cap, p.has_cache_dtype = quant, p.cache_dtype = ct;
    int32_t lens[MAXB], *table = NULL;
    for (int64_t b = 0, j = 0; b < B; b++) lens[b] = b == at ? nx : others[j++];
    p.cache_seqlens = lens;
    const int64_t rows = B * cap;
    if (page) {
        p.page_size = page, p.max_pages = cap / page, p.num_pages = B * p.max_pages;
        table = tu_alloc(sizeof(int32_t) * (size_t)(B * p.max_pages));
        for (int64_t i = 0; i < B * p.max_pages; i++) table[i] = (int32_t)(B * p.max_pages - 1 - i); /* reversed */
    }
    char *q = tu_alloc(B * qn * es), *k = tu_alloc(rows * W * cs), *v = tu_alloc(rows * W * cs);
    char *kn = tu_alloc(B * Sq * W * es), *vn = tu_alloc(B * Sq * W * es), *o = tu_alloc(B * qn * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
    float *ks = quant ? tu_alloc(sizeof(float) * (size_t)(rows * Hk)) : NULL, *vs = quant ? tu_alloc(sizeof(float) * (size_t)(rows * Hk)) : NULL;
    tu_fill(&rng, dt, q, B * qn, 2.0);
    if (quant) { /* codes (never fp8's NaN ones) and positive scales */
        for (int64_t i = 0; i < rows * W; i++) k[i] = (char)(tu_int(&rng, 0, 255) & 0xf7), v[i] = (char)(tu_int(&rng, 0, 255) & 0xf7);
        for (int64_t i = 0; i < rows * Hk; i++) ks[i] = (float)(0.006 + 0.005 * tu_uniform(&rng)), vs[i] = (float)(0.006 + 0.005 * tu_uniform(&rng));
    } else {
        tu_fill(&rng, dt, k, rows * W, 2.0), tu_fill(&rng, dt, v, rows * W, 1.0);
    }
    tu_fill(&rng, dt, kn, B * Sq * W, 2.0), tu_fill(&rng, dt, vn, B * Sq * W, 1.0);
    memcpy(q + at * qn * es, qx, qn * es);
    memcpy(kn + at * Sq * W * es, knx, Sq * W * es), memcpy(vn + at * Sq * W * es, vnx, Sq * W * es);
    for (int64_t t = 0; t < nx; t++) { /* X's cache rows, wherever its pages put them */
        const int64_t row = page ? table[at * p.max_pages + t / page] * page + t % page : at * cap + t;
        memcpy(k + row * W * cs, (const char *)kx + t * W * cs, W * cs);
        memcpy(v + row * W * cs, (const char *)vx + t * W * cs, W * cs);
        if (quant) memcpy(ks + row * Hk, ksx + t * Hk, sizeof(float) * (size_t)Hk), memcpy(vs + row * Hk, vsx + t * Hk, sizeof(float) * (size_t)Hk);
    }
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = threads;
    fa_plan *pl = NULL;
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.block_table = table;
    if (p.has_new_kv) a.k_new = kn, a.v_new = vn; /* (the library refuses them without it) */
    if (quant) a.k_scale = ks, a.v_scale = vs;
    if (fa_plan_create(&p, &opt, &pl) || fa_forward(pl, &a)) CHECK(0, "decode batch %lld: %s", (long long)B, fa_last_error());
    fa_plan_destroy(pl);
    memcpy(ox, o + at * qn * es, qn * es);
    memcpy(lx, lse + at * Hq * Sq, sizeof(float) * (size_t)(Hq * Sq));
    void *x[] = {q, k, v, kn, vn, o, lse, table, ks, vs};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static void decode_invariance(fa_dtype dt, fa_dtype ct, int append, int64_t page) {
    const int64_t Hq = 8, Hk = 2, D = 64, Sq = 2, W = Hk * D, qn = Sq * Hq * D;
    const size_t es = fa_dtype_size(dt), cs = fa_dtype_size(ct);
    const int32_t nx = 1100; /* three chunks */
    void *qx = tu_alloc(qn * es), *kx = tu_alloc(nx * W * cs), *vx = tu_alloc(nx * W * cs);
    void *knx = tu_alloc(Sq * W * es), *vnx = tu_alloc(Sq * W * es), *o1 = tu_alloc(qn * es), *o2 = tu_alloc(qn * es);
    float *ksx = tu_alloc(sizeof(float) * (size_t)(nx * Hk)), *vsx = tu_alloc(sizeof(float) * (size_t)(nx * Hk));
    float l1[16], l2[16];
    tu_fill(&rng, dt, qx, qn, 2.0);
    if (ct != dt) {
        for (int64_t i = 0; i < nx * W; i++)
            ((char *)kx)[i] = (char)(tu_int(&rng, 0, 255) & 0xf7), ((char *)vx)[i] = (char)(tu_int(&rng, 0, 255) & 0xf7);
        for (int64_t i = 0; i < nx * Hk; i++) ksx[i] = (float)(0.006 + 0.005 * tu_uniform(&rng)), vsx[i] = (float)(0.006 + 0.005 * tu_uniform(&rng));
    } else {
        tu_fill(&rng, dt, kx, nx * W, 2.0), tu_fill(&rng, dt, vx, nx * W, 1.0);
    }
    tu_fill(&rng, dt, knx, Sq * W, 2.0), tu_fill(&rng, dt, vnx, Sq * W, 1.0);
    decode_one(dt, ct, append, page, 1, 0, NULL, 1, qx, kx, vx, ksx, vsx, knx, vnx, nx, o1, l1);
    const int32_t others[4] = {0, 1500, 7, 600};
    const struct { int64_t B, at; int threads; } ways[] = {{1, 0, 3}, {2, 1, 2}, {4, 0, 1}, {5, 2, 3}, {5, 4, 2}};
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        decode_one(dt, ct, append, page, ways[w].B, ways[w].at, others, ways[w].threads, qx, kx, vx, ksx, vsx, knx, vnx, nx,
                   o2, l2);
        CHECK(!memcmp(o1, o2, qn * es) && !memcmp(l1, l2, sizeof l1),
              "decode %s%s%s%s%s: the sequence's bits differ at place %lld of a batch of %lld on %d threads from alone",
              fa_dtype_name(dt), ct != dt ? ", cache " : "", ct != dt ? fa_dtype_name(ct) : "", append ? " append" : "",
              page ? " paged" : "", (long long)ways[w].at, (long long)ways[w].B, ways[w].threads);
    }
    void *x[] = {qx, kx, vx, knx, vnx, o1, o2, ksx, vsx};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

/* Packed: sequence X (sq x sk rows) at place `at` among others (pairs of lengths). */
static void packed_one(fa_dtype dt, int causal, int64_t B, int64_t at, const int32_t (*others)[2], int threads,
                       const void *qx, const void *kx, const void *vx, int32_t sq, int32_t sk, void *ox, float *lx) {
    const int64_t Hq = 4, Hk = 2, D = 32;
    const size_t es = fa_dtype_size(dt);
    int32_t cq[MAXB + 1] = {0}, ck[MAXB + 1] = {0};
    for (int64_t b = 0, j = 0; b < B; b++) {
        const int32_t lq = b == at ? sq : others[j][0], lk = b == at ? sk : others[j][1];
        if (b != at) j++;
        cq[b + 1] = cq[b] + lq, ck[b + 1] = ck[b] + lk;
    }
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.head_dim = D, p.dtype = dt, p.causal = causal;
    p.seq_q = cq[B], p.seq_k = ck[B], p.cu_seqlens_q = cq, p.cu_seqlens_k = ck;
    char *q = tu_alloc(p.seq_q * Hq * D * es), *k = tu_alloc(p.seq_k * Hk * D * es), *v = tu_alloc(p.seq_k * Hk * D * es);
    char *o = tu_alloc(p.seq_q * Hq * D * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(p.seq_q * Hq));
    tu_fill(&rng, dt, q, p.seq_q * Hq * D, 2.0), tu_fill(&rng, dt, k, p.seq_k * Hk * D, 2.0);
    tu_fill(&rng, dt, v, p.seq_k * Hk * D, 1.0);
    memcpy(q + cq[at] * Hq * D * es, qx, sq * Hq * D * es);
    memcpy(k + ck[at] * Hk * D * es, kx, sk * Hk * D * es), memcpy(v + ck[at] * Hk * D * es, vx, sk * Hk * D * es);
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = threads;
    fa_plan *pl = NULL;
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    if (fa_plan_create(&p, &opt, &pl) || fa_forward(pl, &a)) CHECK(0, "packed batch %lld: %s", (long long)B, fa_last_error());
    fa_plan_destroy(pl);
    memcpy(ox, o + cq[at] * Hq * D * es, sq * Hq * D * es);
    for (int64_t h = 0; h < Hq; h++) memcpy(lx + h * sq, lse + h * p.seq_q + cq[at], sizeof(float) * (size_t)sq);
    void *x[] = {q, k, v, o, lse};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static void packed_invariance(fa_dtype dt, int causal) {
    const int64_t Hq = 4, Hk = 2, D = 32;
    const int32_t sq = 70, sk = 700;
    const size_t es = fa_dtype_size(dt);
    void *qx = tu_alloc(sq * Hq * D * es), *kx = tu_alloc(sk * Hk * D * es), *vx = tu_alloc(sk * Hk * D * es);
    void *o1 = tu_alloc(sq * Hq * D * es), *o2 = tu_alloc(sq * Hq * D * es);
    float *l1 = tu_alloc(sizeof(float) * sq * Hq), *l2 = tu_alloc(sizeof(float) * sq * Hq);
    tu_fill(&rng, dt, qx, sq * Hq * D, 2.0), tu_fill(&rng, dt, kx, sk * Hk * D, 2.0), tu_fill(&rng, dt, vx, sk * Hk * D, 1.0);
    packed_one(dt, causal, 1, 0, NULL, 1, qx, kx, vx, sq, sk, o1, l1);
    /* the others push the packed totals past 2048 keys and many query tiles */
    const int32_t others[4][2] = {{300, 2000}, {1, 0}, {0, 40}, {500, 900}};
    const struct { int64_t B, at; int threads; } ways[] = {{1, 0, 3}, {2, 1, 2}, {3, 0, 1}, {5, 2, 3}, {5, 4, 2}};
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        packed_one(dt, causal, ways[w].B, ways[w].at, others, ways[w].threads, qx, kx, vx, sq, sk, o2, l2);
        CHECK(!memcmp(o1, o2, sq * Hq * D * es) && !memcmp(l1, l2, sizeof(float) * sq * Hq),
              "packed %s%s: the sequence's bits differ at place %lld of a batch of %lld on %d threads from alone",
              fa_dtype_name(dt), causal ? " causal" : "", (long long)ways[w].at, (long long)ways[w].B,
              ways[w].threads);
    }
    void *x[] = {qx, kx, vx, o1, o2, l1, l2};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

int main(void) {
    rng = check_seed("test_batch_invariance");
    decode_invariance(FA_BF16, FA_BF16, 1, 0);
    decode_invariance(FA_F32, FA_F32, 0, 32);
    decode_invariance(FA_F16, FA_F16, 1, 64);
    decode_invariance(FA_BF16, FA_FP8_E4M3, 1, 0); /* AVX512_FP16 CPUs: the f16-arithmetic step */
    decode_invariance(FA_BF16, FA_INT8, 0, 32);    /* amx: the tile unit's step */
    decode_invariance(FA_F16, FA_FP8_E4M3, 1, 64);
    packed_invariance(FA_F32, 0);
    packed_invariance(FA_BF16, 0);
    packed_invariance(FA_F32, 1);
    return check_finish("test_batch_invariance");
}
