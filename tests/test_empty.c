/* Zero sizes in the C API (docs/semantics.md, "Empty problems"): a zero batch, heads, seq_q or
 * seq_k (dense, packed, decoding) plans, and the passes write exactly their outputs: o = 0 and
 * lse = -inf on rows without keys, zero dq, dk, dv and dbias, nothing past the views (every
 * buffer poisoned first, with padding); the counts equal the plan's figures (0 flops); tensors
 * of 0 elements may be NULL, a non-empty one may not; head_dim 0 stays bad input. */
#include "check.h"

#include <math.h>
#include <string.h>

/* A buffer of n elements of t with 8 of poisoned padding after it, or NULL when n is 0 and
 * null_if_empty. */
static void *buffer(fa_dtype t, int64_t n, int null_if_empty) {
    if (n == 0 && null_if_empty) return NULL;
    void *x = tu_alloc((size_t)(n + 8) * fa_dtype_size(t));
    tu_poison(t, x, n + 8);
    return x;
}

/* Elements [0, n) all equal want (bits of -0.0 are not 0.0: compared as floats), [n, n + 8)
 * still the poison. */
static void expect_filled(const char *what, const char *label, fa_dtype t, const void *x, int64_t n, float want) {
    if (!x) return;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !(chk_load(t, x, i) == want && !signbit(chk_load(t, x, i)) == !signbit(want));
    CHECK(bad == 0, "%s: %s: %lld of %lld elements are not %g", label, what, (long long)bad, (long long)n, (double)want);
    for (int64_t i = n; i < n + 8; i++)
        CHECK(isnan(chk_load(t, x, i)), "%s: %s: the padding after it was written (element %lld)", label, what,
              (long long)i);
}

typedef struct {
    int64_t B, Hq, Hk, Sq, Sk;
    int bias, bias_rows; /* a bias [1, Hq, Sq or 1, Sk] with dbias; bias_rows 1: bias_seq_q = 1 */
} dense_case;

static void run_dense(const dense_case *c, fa_dtype t, int nulls) {
    char label[128];
    snprintf(label, sizeof label, "%s B=%lld Hq=%lld Hk=%lld Sq=%lld Sk=%lld%s%s%s", fa_dtype_name(t), (long long)c->B,
             (long long)c->Hq, (long long)c->Hk, (long long)c->Sq, (long long)c->Sk, c->bias ? " bias+dbias" : "",
             c->bias_rows == 1 ? " (bias_seq_q 1)" : "", nulls ? " NULL empties" : "");
    fa_problem p;
    fa_problem_init(&p);
    p.dtype = t, p.batch = c->B, p.heads_q = c->Hq, p.heads_kv = c->Hk, p.seq_q = c->Sq, p.seq_k = c->Sk;
    p.head_dim = 8, p.head_dim_v = 6, p.causal = 1;
    if (c->bias) p.has_bias = 1, p.bias_heads = c->Hq ? c->Hq : 1, p.bias_grad = 1, p.bias_seq_q = c->bias_rows;
    fa_plan *pl = check_plan(&p, 2, 0, 0);
    if (!pl) return;
    const fa_problem *rp = fa_plan_problem(pl);
    const int64_t Hk = rp->heads_kv, rows = c->B * c->Hq * c->Sq, bsq = c->bias_rows == 1 ? 1 : c->Sq;
    const int64_t nq = rows * 8, no = rows * 6, nk = c->B * Hk * c->Sk * 8, nv = c->B * Hk * c->Sk * 6;
    const int64_t nb = c->bias ? rp->bias_heads * bsq * c->Sk : 0;
    const size_t es = fa_dtype_size(t);
    fa_cost fc, bc;
    fa_plan_cost(pl, FA_FORWARD, &fc);
    fa_plan_cost(pl, FA_BACKWARD, &bc);
    /* the documented figures: nothing read; o, lse (one log a row) or the zeroed gradients written */
    CHECK(fc.flops == 0 && fc.flops_useful == 0 && fc.transcendentals == rows && fc.workspace_bytes == 0 &&
              fc.bytes_accessed == no * (int64_t)es + rows * 4 && fc.min_bytes == fc.bytes_accessed,
          "%s: forward cost flops %lld trans %lld bytes %lld workspace %lld", label, (long long)fc.flops,
          (long long)fc.transcendentals, (long long)fc.bytes_accessed, (long long)fc.workspace_bytes);
    CHECK(bc.flops == 0 && bc.transcendentals == 0 && bc.workspace_bytes == 0 &&
              bc.bytes_accessed == (nq + nk + nv) * (int64_t)es + nb * 4,
          "%s: backward cost flops %lld trans %lld bytes %lld", label, (long long)bc.flops,
          (long long)bc.transcendentals, (long long)bc.bytes_accessed);

    void *q = buffer(t, nq, nulls), *k = buffer(t, nk, nulls), *v = buffer(t, nv, nulls), *o = buffer(t, no, nulls);
    float *lse = buffer(FA_F32, rows, nulls), *bias = buffer(FA_F32, nb, nulls), *dbias = buffer(FA_F32, nb, nulls);
    void *g = buffer(t, no, nulls), *dq = buffer(t, nq, nulls), *dk = buffer(t, nk, nulls), *dv = buffer(t, nv, nulls);
    fa_counts cnt = {-1, -1};
    fa_forward_args fa;
    memset(&fa, 0, sizeof fa);
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse, fa.bias = p.has_bias ? bias : NULL, fa.counts = &cnt;
    fa_status st = fa_forward(pl, &fa);
    CHECK(st == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    expect_filled("o", label, t, o, no, 0.0f);
    expect_filled("lse", label, FA_F32, lse, rows, -INFINITY);
    CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals, "%s: forward counts %lld %lld", label,
          (long long)cnt.flops, (long long)cnt.transcendentals);

    fa_backward_args ba;
    memset(&ba, 0, sizeof ba);
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = g, ba.lse = lse, ba.bias = p.has_bias ? bias : NULL;
    ba.dq = dq, ba.dk = dk, ba.dv = dv, ba.dbias = p.bias_grad ? dbias : NULL, ba.counts = &cnt;
    cnt.flops = cnt.transcendentals = -1;
    st = fa_backward(pl, &ba);
    CHECK(st == FA_OK, "%s: fa_backward: %s", label, fa_last_error());
    expect_filled("dq", label, t, dq, nq, 0.0f);
    expect_filled("dk", label, t, dk, nk, 0.0f);
    expect_filled("dv", label, t, dv, nv, 0.0f);
    expect_filled("dbias", label, FA_F32, dbias, nb, 0.0f);
    CHECK(cnt.flops == 0 && cnt.transcendentals == 0, "%s: backward counts %lld %lld", label, (long long)cnt.flops,
          (long long)cnt.transcendentals);
    if (nulls && (nk || nq)) { /* a tensor with elements must still be given */
        if (nk) fa.k = NULL;
        else fa.q = NULL;
        st = fa_forward(pl, &fa);
        CHECK(st == FA_ERR_NULL, "%s: a NULL non-empty %s: got %s", label, nk ? "k" : "q", fa_status_string(st));
    }
    void *bufs[] = {q, k, v, o, lse, bias, dbias, g, dq, dk, dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    fa_plan_destroy(pl);
}

static void test_dense(void) {
    static const dense_case cases[] = {
        {0, 2, 2, 4, 5, 1, 0}, {2, 0, 0, 4, 5, 0, 0}, {2, 0, 2, 4, 5, 0, 0}, {2, 4, 2, 0, 5, 1, 0},
        {2, 4, 2, 0, 5, 1, 1}, {2, 4, 2, 4, 0, 1, 0}, {2, 4, 2, 4, 0, 1, 1}, {0, 0, 0, 0, 0, 0, 0},
    };
    const int before = failures;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 0; t < 3; t++) run_dense(&cases[i], (fa_dtype)t, t == 1);
    printf("%s dense zero sizes (B, Hq, Hk, Sq, Sk, all): o = 0, lse = -inf, zero gradients and dbias, counts == plan, "
           "NULL allowed only for empty tensors\n", failures > before ? "FAIL" : "PASS");
}

/* Packed batches: no sequences, sequences without rows, sequences without keys. */
static void test_packed(void) {
    static const int32_t cq[][3] = {{0, 0, 0}, {0, 0, 0}, {0, 2, 3}}, ck[][3] = {{0, 0, 0}, {0, 3, 5}, {0, 0, 0}};
    static const int64_t batch[] = {0, 2, 2};
    const int before = failures;
    for (int c = 0; c < 3; c++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = batch[c], p.heads_q = 2, p.seq_q = cq[c][batch[c]], p.seq_k = ck[c][batch[c]], p.head_dim = 8;
        p.cu_seqlens_q = cq[c], p.cu_seqlens_k = ck[c];
        fa_plan *pl = check_plan(&p, 2, 0, 0);
        if (!pl) continue;
        const int64_t nq = p.seq_q * 2 * 8, nk = p.seq_k * 2 * 8;
        float *q = buffer(FA_F32, nq, 0), *o = buffer(FA_F32, nq, 0), *lse = buffer(FA_F32, p.seq_q * 2, 0);
        float *k = buffer(FA_F32, nk, 0), *dq = buffer(FA_F32, nq, 0), *dk = buffer(FA_F32, nk, 0);
        float *dv = buffer(FA_F32, nk, 0);
        fa_cost fc;
        fa_plan_cost(pl, FA_FORWARD, &fc);
        fa_counts cnt = {-1, -1};
        fa_forward_args fa = {0};
        fa.q = q, fa.k = k, fa.v = k, fa.o = o, fa.lse = lse, fa.counts = &cnt;
        CHECK(fa_forward(pl, &fa) == FA_OK, "packed case %d: fa_forward: %s", c, fa_last_error());
        expect_filled("o", "packed", FA_F32, o, nq, 0.0f);
        expect_filled("lse", "packed", FA_F32, lse, p.seq_q * 2, -INFINITY);
        CHECK(fc.flops == 0 && cnt.flops == 0 && cnt.transcendentals == fc.transcendentals,
              "packed case %d: plan flops %lld trans %lld, counted %lld %lld", c, (long long)fc.flops,
              (long long)fc.transcendentals, (long long)cnt.flops, (long long)cnt.transcendentals);
        fa_backward_args ba = {0};
        ba.q = q, ba.k = k, ba.v = k, ba.o = o, ba.d_o = o, ba.lse = lse, ba.dq = dq, ba.dk = dk, ba.dv = dv;
        CHECK(fa_backward(pl, &ba) == FA_OK, "packed case %d: fa_backward: %s", c, fa_last_error());
        expect_filled("dq", "packed", FA_F32, dq, nq, 0.0f);
        expect_filled("dk", "packed", FA_F32, dk, nk, 0.0f);
        expect_filled("dv", "packed", FA_F32, dv, nk, 0.0f);
        void *bufs[] = {q, o, lse, k, dq, dk, dv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
        fa_plan_destroy(pl);
    }
    printf("%s packed batches: none (cu_seqlens [0]), sequences without rows, without keys\n",
           failures > before ? "FAIL" : "PASS");
}

/* Decoding: no sequences; no query rows; a cache of no rows. */
static void test_decode(void) {
    static const int32_t lens[2] = {0, 0};
    static const int64_t shapes[][3] = {{0, 1, 16}, {2, 0, 16}, {2, 1, 0}}; /* B, seq_q, seq_k */
    const int before = failures;
    for (int c = 0; c < 3; c++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = shapes[c][0], p.heads_q = 4, p.heads_kv = 2, p.seq_q = shapes[c][1], p.seq_k = shapes[c][2];
        p.head_dim = 8, p.cache_seqlens = lens;
        fa_plan *pl = check_plan(&p, 2, 0, 0);
        if (!pl) continue;
        const int64_t rows = p.batch * 4 * p.seq_q, nk = p.batch * p.seq_k * 2 * 8;
        float *q = buffer(FA_F32, rows * 8, 0), *o = buffer(FA_F32, rows * 8, 0), *lse = buffer(FA_F32, rows, 0);
        float *k = buffer(FA_F32, nk, 0);
        fa_counts cnt = {-1, -1};
        fa_forward_args fa = {0};
        fa.q = q, fa.k = k, fa.v = k, fa.o = o, fa.lse = lse, fa.counts = &cnt;
        CHECK(fa_forward(pl, &fa) == FA_OK, "decode case %d: fa_forward: %s", c, fa_last_error());
        expect_filled("o", "decode", FA_F32, o, rows * 8, 0.0f);
        expect_filled("lse", "decode", FA_F32, lse, rows, -INFINITY);
        fa_cost fc;
        fa_plan_cost(pl, FA_FORWARD, &fc);
        CHECK(fc.flops == 0 && cnt.flops == 0 && cnt.transcendentals == fc.transcendentals,
              "decode case %d: counts %lld %lld, plan %lld %lld", c, (long long)cnt.flops, (long long)cnt.transcendentals,
              (long long)fc.flops, (long long)fc.transcendentals);
        free(q), free(o), free(lse), free(k);
        fa_plan_destroy(pl);
    }
    printf("%s kv-cache decoding: no sequences, no query rows, a cache of no rows\n", failures > before ? "FAIL" : "PASS");
}

/* A paged step with no query rows reads nothing, but its block table is judged as any step's:
 * an entry the lengths use that names no page is refused (an unused one is not). */
static void test_decode_pages(void) {
    static const int32_t lens[2] = {20, 5};                  /* pages used: 2 and 1 */
    static const int32_t tables[2][4] = {{0, 9, 1, -3}, {0, 3, 1, -3}}; /* [0][1] used; [1][1] not */
    const int before = failures;
    for (int c = 0; c < 2; c++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 0, p.seq_k = 32, p.head_dim = 8;
        p.cache_seqlens = lens, p.page_size = 16, p.num_pages = 4, p.max_pages = 2;
        fa_plan *pl = check_plan(&p, 2, 0, 0);
        if (!pl) continue;
        float *k = buffer(FA_F32, 4 * 16 * 2 * 8, 0), q[1], o[1], lse[1];
        fa_forward_args fa = {0};
        fa.q = q, fa.k = k, fa.v = k, fa.o = o, fa.lse = lse, fa.block_table = tables[c];
        const fa_status st = fa_forward(pl, &fa);
        if (c == 0)
            CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "block_table[0][1] = 9"),
                  "an empty step's used entry naming page 9 of 4: %s \"%s\"", fa_status_string(st), fa_last_error());
        else
            CHECK(st == FA_OK, "an empty step whose unused entry is -3: %s \"%s\"", fa_status_string(st),
                  fa_last_error());
        free(k);
        fa_plan_destroy(pl);
    }
    printf("%s kv-cache decoding, paged, no query rows: the block table judged\n", failures > before ? "FAIL" : "PASS");
}

/* Rows that see no key at all (seq_k 0) with sinks: lse = sink_h, a log and the sink's exp
 * per row in the counts and the plan alike (dense, decoding, packed); a packed plan of
 * lengths per call with no key capacity writes the call's rows only, and counts what
 * fa_plan_cost_lengths states. */
static void test_keyless_calls(void) {
    const int before = failures;
    const float sinks[2] = {0.75f, -1.25f};
    static const int32_t lens[2] = {0, 0}, cq[3] = {0, 2, 3}, ck[3] = {0, 0, 0};
    for (int c = 0; c < 4; c++) { /* dense, decode, packed, packed per call (8 rows of capacity, 3 used) */
        fa_problem p;
        fa_problem_init(&p);
        p.batch = 2, p.heads_q = 2, p.seq_q = 3, p.seq_k = 0, p.head_dim = 8, p.has_sinks = c != 3;
        if (c == 1) p.seq_q = 1, p.cache_seqlens = lens;
        if (c == 2) p.cu_seqlens_q = cq, p.cu_seqlens_k = ck;
        if (c == 3) p.seq_q = 8, p.lengths_per_call = FA_LENGTHS_PACKED;
        fa_plan *pl = check_plan(&p, 2, 0, 0);
        if (!pl) continue;
        const int64_t L = c >= 2 ? 1 : 2, cap = L * 2 * p.seq_q, used = c == 3 ? 2 * 3 : cap; /* (rows x heads) */
        float *q = buffer(FA_F32, cap * 8, 0), *o = buffer(FA_F32, cap * 8, 0), *lse = buffer(FA_F32, cap, 0);
        float *k = buffer(FA_F32, 8, 0);
        for (int64_t i = 0; i < cap * 8; i++) o[i] = NAN;
        for (int64_t i = 0; i < cap; i++) lse[i] = NAN;
        fa_counts cnt = {-1, -1};
        fa_forward_args fa = {0};
        fa.q = q, fa.k = k, fa.v = k, fa.o = o, fa.lse = lse, fa.counts = &cnt, fa.sinks = p.has_sinks ? sinks : NULL;
        if (c == 3) fa.cu_seqlens_q = cq, fa.cu_seqlens_k = ck;
        fa_cost fc;
        CHECK(fa_forward(pl, &fa) == FA_OK && fa_plan_cost_lengths(pl, FA_FORWARD, NULL, c == 3 ? cq : NULL,
                                                                   c == 3 ? ck : NULL, &fc) == FA_OK,
              "keyless case %d: %s", c, fa_last_error());
        const int64_t want = used * (1 + p.has_sinks); /* a log per row, and the sink's exp */
        /* bytes: o and lse written, and the sinks read (lse = sink) */
        const int64_t io = used * 8 * 4 + used * 4 + (p.has_sinks ? 2 * 4 : 0);
        /* (packed: each of the 2 keyless sequences reads them; min_bytes counts them once) */
        const int64_t io_all = io + (c == 2 ? 2 * 4 : 0);
        CHECK(fc.bytes_accessed == io_all && fc.min_bytes == io, "keyless case %d: bytes %lld, min %lld, want %lld, %lld",
              c, (long long)fc.bytes_accessed, (long long)fc.min_bytes, (long long)io_all, (long long)io);
        CHECK(cnt.flops == 0 && cnt.transcendentals == want && fc.transcendentals == want,
              "keyless case %d: counts %lld, plan %lld, want %lld transcendentals", c, (long long)cnt.transcendentals,
              (long long)fc.transcendentals, (long long)want);
        int64_t bad = 0;
        for (int64_t i = 0; i < cap; i++) { /* lse [L, Hq, rows]; packed: [Hq, total] */
            const int64_t h = c >= 2 ? i / p.seq_q : (i / p.seq_q) % 2, r = i % p.seq_q;
            const int past = c == 3 && r >= 3;
            const float want_lse = p.has_sinks ? sinks[h] : -INFINITY;
            bad += past ? !isnan(lse[i]) : lse[i] != want_lse;
        }
        for (int64_t i = 0; i < cap * 8; i++) bad += (c == 3 && i >= 3 * 2 * 8) ? !isnan(o[i]) : o[i] != 0.0f;
        CHECK(!bad, "keyless case %d: %lld elements of o or lse wrong (rows past a call's own left untouched)", c,
              (long long)bad);
        free(q), free(o), free(lse), free(k);
        fa_plan_destroy(pl);
    }
    printf("%s rows without keys: sinks in lse and the counts; a per-call packed plan writes the call's rows\n",
           failures > before ? "FAIL" : "PASS");
}

static void test_refused(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = 4, p.seq_k = 4, p.head_dim = 0;
    fa_plan *pl = NULL;
    fa_status st = fa_plan_create(&p, NULL, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "head_dim"), "head_dim 0: %s \"%s\"", fa_status_string(st),
          fa_last_error());
    p.head_dim = 8, p.seq_k = -1;
    st = fa_plan_create(&p, NULL, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "seq_k"), "seq_k -1: %s \"%s\"", fa_status_string(st),
          fa_last_error());
    void *x = fa_malloc(0);
    CHECK(x != NULL, "fa_malloc(0) returned NULL (read as no memory by its callers)");
    fa_free(x);
    printf("%s head_dim 0 and negative sizes refused; fa_malloc(0) is not a failure\n", failures ? "FAIL" : "PASS");
}

int main(void) {
    check_seed("test_empty");
    test_refused();
    test_keyless_calls();
    test_dense();
    test_packed();
    test_decode();
    test_decode_pages();
    return check_finish("test_empty");
}
