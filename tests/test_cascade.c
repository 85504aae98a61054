/* Shared prefixes (cascade decode): many sequences over one prefix cache plus their own
 * caches, against the unshared problem (the prefix copied in front of each sequence's cache,
 * run by the library) and the float64 reference of that problem; every mask (causal,
 * window, ALiBi, softcap), new tokens appended or not, f32 / bf16 / f16, paged own caches;
 * counts == plan; the plan's bytes hold the prefix once; the same bits on 1 and 3 threads;
 * with lengths per call; bad use refused naming both features. FA_TEST_SEED reproduces. */
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

#define B 5

typedef struct {
    fa_dtype dt;
    int64_t P, Sq, D, cap;
    int append, masks, paged;
} ccase;

static void run(const ccase *cc) {
    const int64_t Hq = 8, Hk = 2, D = cc->D, Sq = cc->Sq, P = cc->P, cap = cc->cap, W = Hk * D;
    const size_t es = fa_dtype_size(cc->dt);
    char label[96];
    snprintf(label, sizeof label, "cascade %s P %lld Sq %lld%s masks %d%s", fa_dtype_name(cc->dt), (long long)P,
             (long long)Sq, cc->append ? " append" : "", cc->masks, cc->paged ? " paged" : "");
    int32_t lens[B], ulens[B];
    for (int b = 0; b < B; b++) {
        lens[b] = (int32_t)(b == 0 || cap == 0 ? 0 : b == 1 ? 1 : tu_int(&rng, 0, cap - Sq));
        ulens[b] = (int32_t)(P + lens[b]);
    }
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.head_dim = D, p.seq_q = Sq, p.seq_k = cap, p.dtype = cc->dt;
    p.has_new_kv = cc->append, p.cache_seqlens = lens, p.shared_prefix_len = P;
    p.causal = cc->masks & 1;
    if (cc->masks & 2) p.window_left = tu_int(&rng, 100, 900), p.window_right = tu_int(&rng, 0, 3);
    if (cc->masks & 4) p.has_alibi = 1;
    if (cc->masks & 8) p.softcap = 4.0f;
    int32_t *table = NULL;
    if (cc->paged) {
        p.page_size = 16, p.max_pages = cap / 16, p.num_pages = B * p.max_pages;
        table = tu_alloc(sizeof(int32_t) * B * (size_t)p.max_pages);
        for (int64_t i = 0; i < B * p.max_pages; i++) table[i] = (int32_t)((i * 7) % (B * p.max_pages)); /* B*max_pages odd-free of 7 */
    }
    fa_problem u = p; /* unshared: the prefix in front of each cache */
    u.shared_prefix_len = 0, u.seq_k = P + cap, u.cache_seqlens = ulens, u.page_size = u.num_pages = u.max_pages = 0;
    const int64_t rows = B * cap, urows = B * (P + cap), nq = B * Sq * Hq * D, nn = B * Sq * W;
    char *q = tu_alloc(nq * es), *kp = tu_alloc(P * W * es), *vp = tu_alloc(P * W * es);
    char *k = tu_alloc(rows * W * es), *v = tu_alloc(rows * W * es), *uk = tu_alloc(urows * W * es), *uv = tu_alloc(urows * W * es);
    char *kn = tu_alloc(nn * es), *vn = tu_alloc(nn * es), *o = tu_alloc(nq * es), *uo = tu_alloc(nq * es), *o3 = tu_alloc(nq * es);
    float *lse = tu_alloc(sizeof(float) * B * Hq * Sq), *ulse = tu_alloc(sizeof(float) * B * Hq * Sq);
    float *lse3 = tu_alloc(sizeof(float) * B * Hq * Sq), slopes[8];
    for (int h = 0; h < 8; h++) slopes[h] = 0.01f * (float)(h + 1);
    tu_fill(&rng, cc->dt, q, nq, 2.0), tu_fill(&rng, cc->dt, kp, P * W, 2.0), tu_fill(&rng, cc->dt, vp, P * W, 1.0);
    tu_fill(&rng, cc->dt, kn, nn, 2.0), tu_fill(&rng, cc->dt, vn, nn, 1.0);
    tu_poison(cc->dt, k, rows * W), tu_poison(cc->dt, v, rows * W), tu_poison(cc->dt, uk, urows * W), tu_poison(cc->dt, uv, urows * W);
    for (int64_t b = 0; b < B; b++) {
        memcpy(uk + b * (P + cap) * W * es, kp, P * W * es), memcpy(uv + b * (P + cap) * W * es, vp, P * W * es);
        for (int64_t t = 0; t < lens[b]; t++) {
            const int64_t row = table ? table[b * p.max_pages + t / 16] * 16 + t % 16 : b * cap + t;
            char *dk = uk + (b * (P + cap) + P + t) * W * es, *dv = uv + (b * (P + cap) + P + t) * W * es;
            tu_fill(&rng, cc->dt, dk, W, 2.0), tu_fill(&rng, cc->dt, dv, W, 1.0);
            memcpy(k + row * W * es, dk, W * es), memcpy(v + row * W * es, dv, W * es);
        }
    }
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_forward_args ua = {0};
    ua.q = q, ua.k = uk, ua.v = uv, ua.o = uo, ua.lse = ulse;
    if (p.has_new_kv) ua.k_new = kn, ua.v_new = vn; /* (the library refuses a feature's tensors without it) */
    ua.alibi_slopes = p.has_alibi ? slopes : NULL;
    const int64_t od[4] = {B, Sq, Hq, D}, ld[4] = {B, Hq, Sq, 1};
    const fa_strides dense = {{0, 0, 0, 0}};
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * B * Hq * Sq);
    fa_ref_decode(&u, &ua, ro, rl);
    fa_plan *pu = NULL, *pc = NULL;
    if (fa_plan_create(&u, &opt, &pu) || fa_forward(pu, &ua)) CHECK(0, "%s: unshared: %s", label, fa_last_error());
    fa_counts cnt = {0};
    fa_forward_args a = ua;
    a.k = k, a.v = v, a.o = o, a.lse = lse, a.k_prefix = kp, a.v_prefix = vp, a.counts = &cnt, a.block_table = table;
    tu_poison(cc->dt, o, nq);
    char *k0 = tu_alloc(rows * W * es), *v0 = tu_alloc(rows * W * es);
    memcpy(k0, k, rows * W * es), memcpy(v0, v, rows * W * es);
    if (fa_plan_create(&p, &opt, &pc)) {
        CHECK(0, "%s: plan: %s", label, fa_last_error());
    } else {
        CHECK(fa_forward(pc, &a) == FA_OK, "%s: forward: %s", label, fa_last_error());
        fa_cost fc, fu;
        fa_plan_cost(pc, FA_FORWARD, &fc);
        fa_plan_cost(pu, FA_FORWARD, &fu);
        CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals, "%s: counts %lld/%lld, plan %lld/%lld",
              label, (long long)cnt.flops, (long long)cnt.transcendentals, (long long)fc.flops, (long long)fc.transcendentals);
        /* the prefix once: beyond the same batch without it, its bytes once, q again, the partials */
        int64_t chunk = 512; /* docs/semantics.md: 512 keys doubled, up to 4096, while chunks x Hk stay >= 64 */
        while (chunk < 4096 && (P + 2 * chunk - 1) / (2 * chunk) * Hk >= 64) chunk *= 2;
        const int64_t pbytes = P * W * 2 * (int64_t)es, chunks = (P + chunk - 1) / chunk;
        const int64_t extra = nq * (int64_t)es + 2 * chunks * Hk * B * (Hq / Hk) * Sq * (D + 2) * 4;
        fa_problem none = p;
        none.shared_prefix_len = 0;
        fa_plan *p0 = NULL;
        fa_cost f0 = {0};
        if (!fa_plan_create(&none, &opt, &p0)) fa_plan_cost(p0, FA_FORWARD, &f0);
        fa_plan_destroy(p0);
        /* (with caches of no capacity the problem without the prefix is an empty one, costed apart) */
        CHECK((cap == 0 || fc.bytes_accessed - f0.bytes_accessed == pbytes + extra) && fc.min_bytes <= fc.bytes_accessed &&
                  fc.flops_useful == fu.flops_useful,
              "%s: bytes %lld (without the prefix %lld, unshared %lld, prefix %lld), useful flops %lld vs %lld", label,
              (long long)fc.bytes_accessed, (long long)f0.bytes_accessed, (long long)fu.bytes_accessed,
              (long long)pbytes, (long long)fc.flops_useful, (long long)fu.flops_useful);
        check_tensor("cascade o", cc->dt, o, &dense, ro, od, check_tol_of(cc->dt), NULL, 0);
        check_tensor("cascade lse", FA_F32, lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
        check_tensor("unshared o", cc->dt, uo, &dense, ro, od, check_tol_of(cc->dt), NULL, 0);
        /* 3 threads: the same bits (the caches restored first: the call appends) */
        fa_plan *p3 = NULL;
        opt.threads = 3;
        memcpy(k, k0, rows * W * es), memcpy(v, v0, rows * W * es);
        fa_forward_args a3 = a;
        a3.o = o3, a3.lse = lse3, a3.counts = NULL;
        CHECK(!fa_plan_create(&p, &opt, &p3) && !fa_forward(p3, &a3) && !memcmp(o, o3, nq * es) &&
                  !memcmp(lse, lse3, sizeof(float) * B * Hq * Sq),
              "%s: 1 and 3 threads differ (%s)", label, fa_last_error());
        fa_plan_destroy(p3);
        /* one plan of capacities, the lengths per call: the same bits */
        fa_problem pp = p;
        pp.cache_seqlens = NULL, pp.lengths_per_call = FA_LENGTHS_CACHE;
        memcpy(k, k0, rows * W * es), memcpy(v, v0, rows * W * es);
        a3.cache_seqlens = lens;
        CHECK(!fa_plan_create(&pp, &opt, &p3) && !fa_forward(p3, &a3) && !memcmp(o, o3, nq * es),
              "%s: with lengths per call (%s)", label, fa_last_error());
        fa_plan_destroy(p3);
    }
    fa_plan_destroy(pu), fa_plan_destroy(pc);
    void *x[] = {q, kp, vp, k, v, uk, uv, kn, vn, o, uo, o3, lse, ulse, lse3, ro, rl, k0, v0, table};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static void refusals(void) {
    fa_problem p;
    fa_problem_init(&p);
    int32_t lens[1] = {3}, cu[2] = {0, 4};
    p.batch = 1, p.heads_q = 2, p.head_dim = 16, p.seq_q = 1, p.seq_k = 32, p.cache_seqlens = lens, p.shared_prefix_len = 40;
    fa_plan *pl = NULL;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU;
    CHECK(fa_plan_create(&p, &opt, &pl) == FA_OK, "refusals: plan: %s", fa_last_error());
    float q[32], o[32], c[32 * 32] = {0};
    fa_forward_args a = {0};
    a.q = q, a.k = c, a.v = c, a.o = o, a.v_prefix = c;
    CHECK(pl && fa_forward(pl, &a) == FA_ERR_NULL && strstr(fa_last_error(), "k_prefix"), "refusals: no k_prefix: %s",
          fa_last_error());
    fa_plan_destroy(pl);
    fa_problem v = p;
    v.cache_seqlens = NULL, v.cu_seqlens_q = v.cu_seqlens_k = cu, v.seq_q = v.seq_k = 4;
    CHECK(fa_plan_create(&v, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "shared_prefix_len") &&
              strstr(fa_last_error(), "cu_seqlens"),
          "refusals: with packed batches: %s", fa_last_error());
    v = p, v.has_diag_offset = 1, v.causal = 1;
    CHECK(fa_plan_create(&v, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "has_diag_offset") &&
              strstr(fa_last_error(), "shared_prefix_len"),
          "refusals: with a diagonal offset: %s", fa_last_error());
    v = p, v.shared_prefix_len = -1;
    CHECK(fa_plan_create(&v, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "shared_prefix_len"),
          "refusals: negative: %s", fa_last_error());
    v = p, v.cache_seqlens = NULL;
    CHECK(fa_plan_create(&v, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "kv-cache decoding"),
          "refusals: dense: %s", fa_last_error());
    v = p;
    opt.backend = FA_BACKEND_CUDA, v.dtype = FA_BF16;
    CHECK(fa_plan_create(&v, &opt, &pl) == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "shared prefix"),
          "refusals: cuda: %s", fa_last_error());
}

int main(void) {
    rng = check_seed("test_cascade");
    const ccase cases[] = {
        {FA_BF16, 1100, 1, 64, 160, 1, 1, 0}, {FA_BF16, 700, 3, 64, 96, 0, 1, 1}, {FA_F32, 530, 2, 32, 64, 1, 0, 0},
        {FA_F16, 300, 1, 64, 48, 1, 8, 1},    {FA_F32, 900, 4, 32, 80, 1, 3, 0},  {FA_BF16, 600, 2, 64, 64, 0, 5, 0},
        /* rows past one block of every ISA (R = 260); prefix chunks past FA_DECODE_CHUNK */
        {FA_BF16, 600, 13, 32, 64, 1, 1, 0},  {FA_BF16, 33000, 1, 32, 64, 0, 1, 0},
        /* own caches of no capacity: the prefix's keys alone (not an empty problem) */
        {FA_F32, 300, 2, 32, 0, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i]);
    refusals();
    return check_finish("test_cascade");
}
