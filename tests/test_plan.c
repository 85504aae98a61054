/* The plan and its cost model, without running a kernel: validation of bad problems (each
 * with its status and a message naming the argument), the seed's figures, and the tile
 * walk against a brute-force enumeration of every (query, key) element. */
#include "check.h"

#include <float.h>

static int failures;


static fa_problem small(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.seq_q = 10;
    p.seq_k = 12;
    p.head_dim = 16;
    return p;
}

/* A bad problem must fail with `want` and a message containing `word`. */
static void expect_bad(const char *what, fa_problem p, fa_options *o, fa_status want, const char *word) {
    fa_plan *pl = (fa_plan *)0x1;
    fa_status s = fa_plan_create(&p, o, &pl);
    CHECK(s == want, "%s: status %d (%s), want %d; message: %s", what, s, fa_status_string(s), want, fa_last_error());
    CHECK(pl == NULL, "%s: plan not NULL on error", what);
    CHECK(strstr(fa_last_error(), word) != NULL, "%s: message \"%s\" does not name \"%s\"", what, fa_last_error(), word);
    if (s == FA_OK) fa_plan_destroy(pl);
}

static void test_validation(void) {
    fa_problem p;
    fa_options o = {0};
    int n0 = failures;
#define BAD(field, value, status, word)                                                    \
    do {                                                                                   \
        p = small();                                                                       \
        p.field = value;                                                                   \
        expect_bad(#field " = " #value, p, NULL, status, word);                            \
    } while (0)
    /* (zero sizes are valid, empty problems: tests/test_empty.c) */
    BAD(batch, -3, FA_ERR_INVALID, "batch");
    BAD(heads_q, -1, FA_ERR_INVALID, "heads_q");
    BAD(heads_kv, -1, FA_ERR_INVALID, "heads_kv");
    BAD(heads_kv, 3, FA_ERR_INVALID, "multiple");
    BAD(seq_q, -1, FA_ERR_INVALID, "seq_q");
    BAD(seq_k, -5, FA_ERR_INVALID, "seq_k");
    BAD(head_dim, 0, FA_ERR_INVALID, "head_dim");
    BAD(head_dim_v, -2, FA_ERR_INVALID, "head_dim_v");
    BAD(dtype, (fa_dtype)7, FA_ERR_INVALID, "dtype");
    BAD(batch, INT64_MAX / 4, FA_ERR_OVERFLOW, "overflow");
    BAD(seq_q, (int64_t)1 << 40, FA_ERR_INVALID, "seq_q");
    BAD(head_dim, INT64_MAX / 2, FA_ERR_INVALID, "too large"); /* FA_MAX_HEAD_DIM */
    BAD(seq_k, (int64_t)3 << 31, FA_ERR_INVALID, "seq_k");
    BAD(softcap, -1.0f, FA_ERR_INVALID, "softcap");
    BAD(softcap, INFINITY, FA_ERR_INVALID, "softcap");
    BAD(softcap, NAN, FA_ERR_INVALID, "softcap");
    /* within [2^-126, 2^100] only: a subnormal cap's reciprocal overflows (NaN scores), a huge
     * one's quotients are subnormal, 0 under a caller's flush-to-zero (docs/semantics.md) */
    BAD(softcap, 1e-39f, FA_ERR_INVALID, "softcap must be 0 (off) or within [2^-126, 2^100]");
    BAD(softcap, 0x1p100f * 1.0000001f, FA_ERR_INVALID, "softcap must be 0 (off) or within [2^-126, 2^100]");
    BAD(softcap, 1e37f, FA_ERR_INVALID, "softcap");
    {
        const float edge[] = {FLT_MIN, 0x1p100f};
        for (int i = 0; i < 2; i++) {
            p = small();
            p.softcap = edge[i];
            fa_plan *pl = NULL;
            const fa_status s = fa_plan_create(&p, NULL, &pl);
            CHECK(s == FA_OK, "softcap = %g (the range's edge) refused: %s", (double)edge[i], fa_last_error());
            fa_plan_destroy(pl);
        }
    }
    BAD(window_left, -2, FA_ERR_INVALID, "window");
    BAD(window_right, -7, FA_ERR_INVALID, "window");
    BAD(has_new_kv, 1, FA_ERR_INVALID, "cache_seqlens");
    BAD(page_size, 16, FA_ERR_INVALID, "cache_seqlens");
    p = small(); p.has_scale = 1; p.scale = NAN;
    expect_bad("scale = NaN", p, NULL, FA_ERR_INVALID, "scale");
    p = small(); p.has_scale = 1; p.scale = -INFINITY;
    expect_bad("scale = -inf", p, NULL, FA_ERR_INVALID, "scale");
    p = small(); p.has_bias = 1; p.bias_batch = 3;
    expect_bad("bias batch 3", p, NULL, FA_ERR_INVALID, "bias batch");
    p = small(); p.has_bias = 1; p.bias_heads = 2;
    expect_bad("bias heads 2", p, NULL, FA_ERR_INVALID, "bias heads");
    p = small(); p.q_stride.s[2] = -16;
    expect_bad("negative stride", p, NULL, FA_ERR_INVALID, "q's stride of dim 2 (rows) is negative: -16");
    p = small(); p.k_stride = (fa_strides){{INT64_MAX / 2, INT64_MAX / 2, 1, 1}};
    expect_bad("stride overflow", p, NULL, FA_ERR_OVERFLOW, "k strides");
    /* element offsets that fit int64 but whose bytes do not: the kernels' offset x element
     * size wrapped and read batch 0's keys for batch 1 (f32: 2^62 x 4 = 2^64) */
    p = small(); p.k_stride = (fa_strides){{(int64_t)1 << 62, 12 * 16, 16, 1}};
    expect_bad("k bytes overflow", p, NULL, FA_ERR_OVERFLOW, "k strides");
    p = small(); p.dtype = FA_BF16; p.o_stride = (fa_strides){{(int64_t)1 << 62, 10 * 16, 16, 1}};
    expect_bad("o bytes overflow (bf16)", p, NULL, FA_ERR_OVERFLOW, "o strides");
    p = small(); p.has_bias = 1; p.bias_batch = 2; p.bias_stride = (fa_strides){{(int64_t)3 << 61, 120, 12, 1}};
    expect_bad("bias bytes overflow", p, NULL, FA_ERR_OVERFLOW, "bias strides");
    int32_t lens[2] = {3, 7};
    p = small(); p.batch = 1; p.cache_seqlens = lens; p.page_size = 16; p.num_pages = 4; p.max_pages = 1; p.seq_k = 16;
    p.k_stride = (fa_strides){{(int64_t)1 << 61, 16, 2 * 16, 1}}; /* 3 x 2^61 elements, 3 x 2^63 bytes */
    expect_bad("paged k bytes overflow", p, NULL, FA_ERR_OVERFLOW, "k strides");
    /* a paged cache of capacity 0 (max_pages 0) plans as a dense one of capacity 0 does
     * (semantics.md, "Empty problems"); pages without a pool are still refused */
    lens[0] = 0;
    p = small(); p.batch = 1; p.seq_q = 1; p.cache_seqlens = lens; p.page_size = 16; p.num_pages = 4; p.max_pages = 0;
    p.seq_k = 0;
    {
        fa_plan *zero = NULL;
        CHECK(fa_plan_create(&p, NULL, &zero) == FA_OK, "paged capacity 0 plans: %s", fa_last_error());
        fa_plan_destroy(zero);
    }
    p.max_pages = 1, p.num_pages = 0, p.seq_k = 16;
    expect_bad("paged max_pages 1 without pages", p, NULL, FA_ERR_INVALID, "num_pages >= 1");
    lens[0] = 3;
    {   /* the largest offsets whose bytes fit still plan */
        fa_plan *ok = NULL;
        p = small(); p.k_stride = (fa_strides){{(int64_t)1 << 60, 12 * 16, 16, 1}};
        CHECK(fa_plan_create(&p, NULL, &ok) == FA_OK, "k batch stride 2^60 (f32): %s", fa_last_error());
        fa_plan_destroy(ok);
    }
    /* head dims the kernels index with int: past FA_MAX_HEAD_DIM refused (2^32 + 16 planned,
     * and the forward used its low 16 columns with status FA_OK; 2^50 wrapped the backward's
     * workspace_bytes) */
    p = small(); p.head_dim = FA_MAX_HEAD_DIM + 1;
    expect_bad("head_dim FA_MAX_HEAD_DIM + 1", p, NULL, FA_ERR_INVALID, "head_dim 65537");
    p = small(); p.head_dim = ((int64_t)1 << 32) + 16;
    expect_bad("head_dim 2^32 + 16", p, NULL, FA_ERR_INVALID, "at most 65536");
    p = small(); p.head_dim_v = (int64_t)1 << 50;
    expect_bad("head_dim_v 2^50", p, NULL, FA_ERR_INVALID, "head_dim_v");
    {
        fa_plan *ok = NULL;
        p = small(); p.head_dim = p.head_dim_v = FA_MAX_HEAD_DIM;
        CHECK(fa_plan_create(&p, NULL, &ok) == FA_OK, "head dims FA_MAX_HEAD_DIM: %s", fa_last_error());
        fa_plan_destroy(ok);
    }
    p = small(); o = (fa_options){0}; o.threads = -1;
    expect_bad("threads -1", p, &o, FA_ERR_INVALID, "threads");
    p = small(); o = (fa_options){0}; o.threads = FA_MAX_THREADS + 1; /* OpenMP crashed at 65536 */
    expect_bad("threads above FA_MAX_THREADS", p, &o, FA_ERR_INVALID, "1024");
    p = small(); o = (fa_options){0}; o.threads = 65536;
    expect_bad("threads 65536", p, &o, FA_ERR_INVALID, "threads");
    p = small(); o = (fa_options){0}; o.block_q = -4;
    expect_bad("block_q -4", p, &o, FA_ERR_INVALID, "block_q");
    p = small(); o = (fa_options){0}; o.block_k = 1 << 20;
    expect_bad("block_k huge", p, &o, FA_ERR_INVALID, "block_k");
    p = small(); o = (fa_options){0}; o.backend = (fa_backend)9;
    expect_bad("backend 9", p, &o, FA_ERR_INVALID, "backend");
    p = small(); p.head_dim = 12; o = (fa_options){0}; o.backend = FA_BACKEND_CUDA;
    expect_bad("cuda D=12", p, &o, FA_ERR_UNSUPPORTED, "head dims");
    p = small(); p.has_bias = 1; p.bias_grad = 1; o = (fa_options){0}; o.backend = FA_BACKEND_CUDA;
    expect_bad("cuda bias_grad", p, &o, FA_ERR_UNSUPPORTED, "dbias");
    p = small(); p.bias_grad = 1;
    expect_bad("bias_grad without bias", p, NULL, FA_ERR_INVALID, "bias_grad");
    /* the bias's other fields without a bias were ignored silently, as bias_grad's once was not */
    p = small(); p.has_bias_scale = 1; p.bias_scale = 5.0f;
    expect_bad("bias_scale without bias", p, NULL, FA_ERR_INVALID, "bias_scale (has_bias_scale) needs a bias (has_bias)");
    p = small(); p.bias_seq_q = 1;
    expect_bad("bias_seq_q 1 without bias", p, NULL, FA_ERR_INVALID, "bias_seq_q need a bias (has_bias)");
    p = small(); p.bias_batch = 2;
    expect_bad("bias_batch 2 without bias", p, NULL, FA_ERR_INVALID, "bias_batch");
    p = small(); p.bias_heads = 4;
    expect_bad("bias_heads 4 without bias", p, NULL, FA_ERR_INVALID, "bias_heads");
    p = small(); p.bias_stride = (fa_strides){{128, 64, 8, 1}};
    expect_bad("bias_stride without bias", p, NULL, FA_ERR_INVALID, "bias_stride needs a bias (has_bias)");
    p = small(); p.has_bias = 1; p.has_bias_scale = 1; p.bias_scale = NAN;
    expect_bad("bias_scale = NaN", p, NULL, FA_ERR_INVALID, "bias_scale");
    p = small(); p.has_bias = 1; p.has_bias_scale = 1; p.bias_scale = INFINITY;
    expect_bad("bias_scale = inf", p, NULL, FA_ERR_INVALID, "bias_scale");
    fa_plan *pl = (fa_plan *)0x1;
    CHECK(fa_plan_create(NULL, NULL, &pl) == FA_ERR_NULL && pl == NULL, "NULL problem");
    CHECK(strstr(fa_last_error(), "problem"), "NULL problem message: %s", fa_last_error());
    p = small();
    CHECK(fa_plan_create(&p, NULL, NULL) == FA_ERR_NULL, "NULL out");
    CHECK(fa_plan_cost(NULL, FA_FORWARD, NULL) == FA_ERR_NULL, "cost of NULL plan");
    CHECK(fa_forward(NULL, NULL) == FA_ERR_NULL, "forward of NULL plan");
    CHECK(fa_backward(NULL, NULL) == FA_ERR_NULL, "backward of NULL plan");
    /* unset bias fields pass: fa_problem_init's, zeroed ones, and a plan's own resolved problem */
    fa_problem again;
    p = small(); p.bias_batch = 0; p.bias_heads = 0;
    CHECK(fa_plan_create(&p, NULL, &pl) == FA_OK, "zeroed bias fields without a bias: %s", fa_last_error());
    if (pl) again = *fa_plan_problem(pl), fa_plan_destroy(pl), pl = NULL;
    else again = small();
    CHECK(fa_plan_create(&again, NULL, &pl) == FA_OK, "a plan's resolved problem, again: %s", fa_last_error());
    fa_plan_destroy(pl);
    printf("%s validation: 46 bad problems rejected with status and message\n",
           failures == n0 ? "PASS" : "FAIL");
}

/* Is key j visible to row i? Written from docs/semantics.md ("Which keys a row sees"),
 * independently of the planner's schedule (src/schedule.h). */
static int visible_by_docs(const fa_problem *p, int64_t i, int64_t j) {
    const int64_t off = p->has_diag_offset ? p->diag_offset : p->seq_k - p->seq_q, at = i + off;
    if (p->causal && j > at) return 0;
    if (p->window_left != -1 && j < at - p->window_left) return 0;
    if (p->window_right != -1 && j > at + p->window_right) return 0;
    return 1;
}

/* Brute force: a (query tile, key tile) pair is computed iff any element in it is visible;
 * the model's interval walk must agree pair by pair, in the totals that follow from it. */
static void brute(const fa_plan *pl, int64_t bq, int64_t bk, int64_t *flops, int64_t *trans, int64_t *useful) {
    const fa_problem *p = fa_plan_problem(pl);
    int64_t f = 0, t = 0, u = 0;
    for (int64_t r0 = 0; r0 < p->seq_q; r0 += bq) {
        int64_t r1 = r0 + bq < p->seq_q ? r0 + bq : p->seq_q;
        for (int64_t k0 = 0; k0 < p->seq_k; k0 += bk) {
            int64_t k1 = k0 + bk < p->seq_k ? k0 + bk : p->seq_k, any = 0;
            for (int64_t i = r0; i < r1; i++)
                for (int64_t j = k0; j < k1; j++)
                    if (visible_by_docs(p, i, j)) { any = 1; u++; }
            if (any) {
                f += (r1 - r0) * (k1 - k0);
                t += (r1 - r0) * (k1 - k0) * (1 + (p->softcap > 0)) + (r1 - r0);
            }
        }
        t += r1 - r0;
    }
    int64_t h = p->batch * p->heads_q;
    *flops = f * h; /* times 2 (D + Dv) by the caller */
    *trans = t * h;
    *useful = u * h;
}

static void test_cost_walk(uint64_t *rs, uint64_t first_seed) {
    int n0 = failures, cases = 0;
    for (int it = 0; it < 1500 && failures - n0 < 5; it++, cases++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = tu_int(rs, 1, 2);
        p.heads_kv = tu_int(rs, 1, 2);
        p.heads_q = p.heads_kv * tu_int(rs, 1, 3);
        p.seq_q = tu_int(rs, 1, 80);
        p.seq_k = tu_int(rs, 1, 80);
        p.head_dim = tu_int(rs, 1, 9) * 8;
        p.head_dim_v = tu_int(rs, 1, 9) * 8;
        p.causal = tu_int(rs, 0, 1);
        if (tu_int(rs, 0, 1)) {
            p.window_left = tu_int(rs, -1, 25);
            p.window_right = tu_int(rs, -1, 25);
        }
        p.softcap = tu_int(rs, 0, 1) ? 30.0f : 0.0f;
        fa_options o = {.threads = 1, .block_q = tu_int(rs, 1, 24), .block_k = tu_int(rs, 1, 24)};
        fa_plan *pl;
        if (fa_plan_create(&p, &o, &pl)) {
            CHECK(0, "plan failed: %s", fa_last_error());
            continue;
        }
        int64_t f, t, u;
        brute(pl, o.block_q, o.block_k, &f, &t, &u);
        fa_cost c, b;
        fa_plan_cost(pl, FA_FORWARD, &c);
        fa_plan_cost(pl, FA_BACKWARD, &b);
        int64_t D = p.head_dim, Dv = p.head_dim_v;
        CHECK(c.flops == 2 * f * (D + Dv), "fwd flops %lld != %lld (seed %llu case %d)", (long long)c.flops,
              (long long)(2 * f * (D + Dv)), (unsigned long long)first_seed, it);
        CHECK(c.transcendentals == t, "fwd trans %lld != %lld", (long long)c.transcendentals, (long long)t);
        CHECK(c.flops_useful == 2 * u * (D + Dv), "useful %lld != %lld", (long long)c.flops_useful,
              (long long)(2 * u * (D + Dv)));
        CHECK(b.flops_useful == 2 * u * (3 * D + 2 * Dv), "bwd useful");
        CHECK(b.flops == 2 * f * (4 * D + 3 * Dv), "bwd flops %lld != %lld", (long long)b.flops,
              (long long)(2 * f * (4 * D + 3 * Dv)));
        CHECK(c.flops >= c.flops_useful && b.flops >= b.flops_useful, "flops below useful");
        CHECK(c.bytes_accessed >= c.min_bytes && b.bytes_accessed >= b.min_bytes,
              "bytes_accessed %lld / %lld below min %lld / %lld", (long long)c.bytes_accessed,
              (long long)b.bytes_accessed, (long long)c.min_bytes, (long long)b.min_bytes);
        /* the tensors as passed: q, k, v, o, lse (f32) */
        const int64_t io = 4 * (p.batch * p.heads_q * p.seq_q * (D + Dv + 1) + p.batch * p.heads_kv * p.seq_k * (D + Dv));
        CHECK(c.min_bytes <= io, "min %lld above the tensors' %lld", (long long)c.min_bytes, (long long)io);
        CHECK(c.peak_bytes == io + c.workspace_bytes, "peak != inputs + outputs + workspace");
        CHECK(c.naive_peak_bytes == io + p.batch * p.heads_q * p.seq_q * p.seq_k * 4, "naive peak");
        fa_plan_destroy(pl);
    }
    printf("%s cost walk: %d random shapes/masks/tiles match a brute-force element enumeration\n",
           failures == n0 ? "PASS" : "FAIL", cases);
}

static void test_seed(void) {
    int n0 = failures;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 18;
    p.heads_q = 32;
    p.seq_q = p.seq_k = 16384;
    p.head_dim = 256;
    p.dtype = FA_BF16;
    fa_plan *pl;
    CHECK(fa_plan_create(&p, NULL, &pl) == FA_OK, "seed plan: %s", fa_last_error());
    fa_cost c;
    fa_plan_cost(pl, FA_FORWARD, &c);
    CHECK(c.flops == 158329674399744LL, "seed flops %lld", (long long)c.flops);
    CHECK(c.flops_useful == c.flops, "no mask: every computed flop is useful");
    /* q, k, v, o: 4 x 18*32*16384*256*2 bytes; lse 18*32*16384*4 */
    int64_t io = 4LL * 18 * 32 * 16384 * 256 * 2 + 18LL * 32 * 16384 * 4;
    CHECK(c.min_bytes == io, "seed min_bytes %lld != %lld", (long long)c.min_bytes, (long long)io);
    CHECK(c.naive_peak_bytes == io + 18LL * 32 * 16384 * 16384 * 4, "seed naive peak %lld",
          (long long)c.naive_peak_bytes);
    CHECK(c.naive_peak_bytes > 600000000000LL, "naive above 600 GB");
    CHECK(c.peak_bytes < (24LL << 30), "flash fits 24 GiB: %lld", (long long)c.peak_bytes);
    fa_plan_destroy(pl);

    /* causal, Sq = Sk = 5, 2 x 2 tiles, D = Dv = 1: tiles (0,0) (1,0) (1,1) (2,0) (2,1) (2,2)
     * computed, with in-range sizes 2x2 2x2 2x2 1x2 1x2 1x1 = 17 elements; flops 2*17*2 = 68.
     * transcendentals: 17 exps + rows per computed tile (2+2+2+1+1+1 = 9) + 5 logs = 31. */
    fa_problem_init(&p);
    p.batch = p.heads_q = 1;
    p.seq_q = p.seq_k = 5;
    p.head_dim = 1;
    p.causal = 1;
    fa_options o = {.threads = 1, .block_q = 2, .block_k = 2};
    CHECK(fa_plan_create(&p, &o, &pl) == FA_OK, "small causal plan");
    fa_plan_cost(pl, FA_FORWARD, &c);
    CHECK(c.flops == 68 && c.transcendentals == 31, "hand count: flops %lld trans %lld", (long long)c.flops,
          (long long)c.transcendentals);
    CHECK(c.flops_useful == 2 * 15 * 2, "15 visible pairs, useful %lld", (long long)c.flops_useful);
    fa_plan_destroy(pl);
    printf("%s seed and hand-counted plans\n", failures == n0 ? "PASS" : "FAIL");
}

/* dbias in the backward's cost: the bias's bytes (f32) among the outputs (min and peak) and
 * at least once among the bytes accessed; no workspace and no flops of its own. */
static void test_dbias_cost(void) {
    static const int64_t shapes[][2] = {{1, 1}, {2, 1}, {1, 4}, {2, 4}};
    for (int i = 0; i < 4; i++) {
        fa_problem p = small();
        p.has_bias = 1, p.bias_batch = shapes[i][0], p.bias_heads = shapes[i][1];
        fa_options o = {FA_BACKEND_CPU, 2, 0, 0};
        fa_plan *a = NULL, *b = NULL;
        fa_status s1 = fa_plan_create(&p, &o, &a);
        p.bias_grad = 1;
        fa_status s2 = fa_plan_create(&p, &o, &b);
        CHECK(!s1 && !s2, "dbias plans: %s", fa_last_error());
        if (!s1 && !s2) {
            fa_cost ca, cb, fa, fb;
            fa_plan_cost(a, FA_BACKWARD, &ca), fa_plan_cost(b, FA_BACKWARD, &cb);
            fa_plan_cost(a, FA_FORWARD, &fa), fa_plan_cost(b, FA_FORWARD, &fb);
            const int64_t db = shapes[i][0] * shapes[i][1] * p.seq_q * p.seq_k * 4;
            CHECK(cb.min_bytes - ca.min_bytes == db && cb.peak_bytes - ca.peak_bytes == db,
                  "dbias [%lld, %lld]: min/peak grow by %lld/%lld, want %lld", (long long)shapes[i][0],
                  (long long)shapes[i][1], (long long)(cb.min_bytes - ca.min_bytes),
                  (long long)(cb.peak_bytes - ca.peak_bytes), (long long)db);
            CHECK(cb.bytes_accessed - ca.bytes_accessed >= db, "dbias: bytes_accessed grows by only %lld",
                  (long long)(cb.bytes_accessed - ca.bytes_accessed));
            CHECK(cb.flops == ca.flops && cb.transcendentals == ca.transcendentals &&
                      cb.workspace_bytes == ca.workspace_bytes && memcmp(&fa, &fb, sizeof fa) == 0,
                  "dbias changes flops, transcendentals, workspace or the forward's cost");
        }
        fa_plan_destroy(a), fa_plan_destroy(b);
    }
    printf("dbias cost: min/peak/bytes of the backward include it, nothing else changes\n");
}

/* min_bytes is a lower bound of bytes_accessed, forward and backward, for random dense
 * problems (masks, diagonal offsets, GQA, bias broadcast, segment ids, ALiBi, bf16),
 * packed batches with empty sequences and decode plans (pages, appends). */
static void test_min_bytes(uint64_t *rs, uint64_t first_seed) {
    int n0 = failures, cases = 0;
    for (int it = 0; it < 3000 && failures - n0 < 5; it++, cases++) {
        fa_problem p;
        fa_problem_init(&p);
        int32_t cq[6] = {0}, ck[6] = {0}, lens[5];
        const int shape = (int)tu_int(rs, 0, 2); /* dense, packed, decode */
        p.batch = tu_int(rs, 1, shape ? 5 : 2);
        p.heads_kv = tu_int(rs, 1, 2);
        p.heads_q = p.heads_kv * tu_int(rs, 1, 3);
        p.head_dim = tu_int(rs, 1, 4) * 8;
        p.head_dim_v = shape == 2 ? p.head_dim : tu_int(rs, 1, 4) * 8;
        p.dtype = tu_int(rs, 0, 1) ? FA_F32 : FA_BF16;
        p.causal = (int)tu_int(rs, 0, 1);
        if (tu_int(rs, 0, 1)) p.window_left = tu_int(rs, -1, 20), p.window_right = tu_int(rs, -1, 20);
        if (tu_int(rs, 0, 3) == 0) p.has_diag_offset = 1, p.diag_offset = tu_int(rs, -90, 90);
        p.has_alibi = tu_int(rs, 0, 3) == 0;
        tu_keep_aligned_diag(&p);
        p.seq_q = tu_int(rs, 1, 70), p.seq_k = tu_int(rs, 1, 70);
        if (shape == 0) {
            if (tu_int(rs, 0, 2) == 0) {
                p.has_bias = 1, p.bias_batch = tu_int(rs, 0, 1) ? p.batch : 1;
                p.bias_heads = tu_int(rs, 0, 1) ? p.heads_q : 1;
                p.bias_seq_q = tu_int(rs, 0, 1); /* 1: one row for every query row; 0: Sq rows */
            }
            p.has_segment_ids = tu_int(rs, 0, 3) == 0;
            if (tu_int(rs, 0, 9) == 0) *(tu_int(rs, 0, 1) ? &p.seq_q : &p.seq_k) = 0; /* an empty problem */
        } else if (shape == 1) {
            for (int64_t b = 0; b < p.batch; b++) {
                cq[b + 1] = cq[b] + (int32_t)(tu_int(rs, 0, 2) ? tu_int(rs, 0, 40) : 0);
                ck[b + 1] = ck[b] + (int32_t)(tu_int(rs, 0, 2) ? tu_int(rs, 0, 40) : 0);
            }
            if (!cq[p.batch]) cq[p.batch] = 1;
            if (!ck[p.batch]) ck[p.batch] = 1;
            p.seq_q = cq[p.batch], p.seq_k = ck[p.batch], p.cu_seqlens_q = cq, p.cu_seqlens_k = ck;
        } else {
            p.seq_q = tu_int(rs, 1, 4), p.has_new_kv = (int)tu_int(rs, 0, 1);
            if (tu_int(rs, 0, 1)) p.page_size = 16, p.max_pages = 5, p.num_pages = 30;
            p.seq_k = 80;
            for (int64_t b = 0; b < p.batch; b++)
                lens[b] = (int32_t)(tu_int(rs, 0, 2) ? tu_int(rs, 0, 80 - (p.has_new_kv ? p.seq_q : 0)) : 0);
            p.cache_seqlens = lens;
        }
        fa_options o = {.backend = FA_BACKEND_CPU, .threads = 1};
        if (tu_int(rs, 0, 1)) o.block_q = tu_int(rs, 1, 24), o.block_k = tu_int(rs, 1, 24);
        fa_plan *pl;
        if (fa_plan_create(&p, &o, &pl)) {
            CHECK(0, "min_bytes case %d (seed %llu): plan failed: %s", it, (unsigned long long)first_seed,
                  fa_last_error());
            continue;
        }
        for (int pass = 0; pass < (shape == 2 ? 1 : 2); pass++) {
            fa_cost c;
            fa_plan_cost(pl, pass ? FA_BACKWARD : FA_FORWARD, &c);
            CHECK(c.min_bytes <= c.bytes_accessed && c.min_bytes <= c.peak_bytes,
                  "min_bytes case %d (seed %llu, %s, %s): min %lld above accessed %lld or peak %lld", it,
                  (unsigned long long)first_seed, shape == 0 ? "dense" : shape == 1 ? "packed" : "decode",
                  pass ? "backward" : "forward", (long long)c.min_bytes, (long long)c.bytes_accessed,
                  (long long)c.peak_bytes);
        }
        fa_plan_destroy(pl);
    }
    printf("%s min_bytes: %d random dense, packed and decode plans, never above bytes_accessed\n",
           failures == n0 ? "PASS" : "FAIL", cases);
}

/* A packed batch's seq_q and seq_k are its totals: the size checks count its tensors as
 * [total, heads, dim] and its naive scores as [heads, total_q, total_k], with no batch factor
 * (256 sequences of 4096 tokens were refused as a [256, 32, 2^20, 2^20] score matrix). */
static void test_packed_sizes(void) {
    static int32_t cu[257];
    for (int b = 0; b <= 256; b++) cu[b] = b * 4096;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 256, p.heads_q = p.heads_kv = 32, p.seq_q = p.seq_k = 256 * 4096, p.head_dim = 128;
    p.dtype = FA_BF16, p.causal = 1, p.cu_seqlens_q = p.cu_seqlens_k = cu;
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(&p, NULL, &pl) == FA_OK, "packed 256 x 4096 tokens: %s", fa_last_error());
    if (pl) {
        fa_cost c;
        fa_plan_cost(pl, FA_FORWARD, &c);
        /* useful flops: 256 causal sequences of 4096, 4 * H * D * (visible pairs) */
        const int64_t pairs = 4096LL * 4097 / 2;
        CHECK(c.flops_useful == 256 * 4 * 32 * 128 * pairs, "packed 256 x 4096: flops_useful %lld, want %lld",
              (long long)c.flops_useful, (long long)(256 * 4 * 32 * 128 * pairs));
        fa_plan_destroy(pl);
    }
    static int32_t one[2] = {0, INT32_MAX};
    p.batch = 1, p.heads_q = p.heads_kv = 1, p.seq_q = p.seq_k = INT32_MAX, p.cu_seqlens_q = p.cu_seqlens_k = one;
    expect_bad("packed scores past int64", p, NULL, FA_ERR_OVERFLOW, "the score matrix");
}

int main(void) {
    seed = tu_seed(); /* check.h's: CHECK prints it */
    uint64_t rng = seed;
    printf("test_plan seed %llu (FA_TEST_SEED reproduces)\n", (unsigned long long)seed);
    test_validation();
    test_cost_walk(&rng, seed);
    test_seed();
    test_dbias_cost();
    test_min_bytes(&rng, seed);
    test_packed_sizes();
    printf("%s\n", failures ? "FAILED" : "all plan tests passed");
    return failures != 0;
}
