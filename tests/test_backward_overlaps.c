/* The backward's outputs against its inputs and each other (docs/semantics.md, tensors that
 * share memory): dq over q, dv over do, two outputs as one buffer, outputs sharing elements
 * are refused naming both, nothing written; dq, dk and dv interleaved in one packed buffer
 * run as in three; a dense output (dsink, dbias, a contiguous dk) is compared with another
 * of other strides element by element. A fresh seed every run, printed (FA_TEST_SEED). */
#include "check.h"

/* Outputs over inputs (dq over q, dv over do) and two outputs as one buffer are refused,
 * naming both, with nothing written (dv over do gave wrong gradients); dq, dk and dv
 * interleaved in one packed [B, S, 3, H, D] buffer, as q, k and v are in theirs, have
 * disjoint elements and run, bit for bit as in three buffers. */
static void test_overlaps(uint64_t *rng) {
    const int before = failures;
    const int64_t B = 2, H = 2, S = 37, D = 16, HD = H * D, row = 3 * HD, n = B * S * row;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = H, p.seq_q = S, p.seq_k = S, p.head_dim = D, p.causal = 1;
    p.q_stride = p.k_stride = p.v_stride = (fa_strides){{S * row, D, row, 1}};
    fa_plan *pl = check_plan(&p, 2, 0, 0);
    if (!pl) return;
    const size_t bytes = sizeof(float) * (size_t)n;
    float *qkv = tu_alloc(bytes), *o = tu_alloc(bytes), *d_o = tu_alloc(bytes), *saved = tu_alloc(bytes);
    float *lse = tu_alloc(sizeof(float) * (size_t)(B * H * S)), *dqkv = tu_alloc(bytes);
    float *apart[3] = {tu_alloc(bytes), tu_alloc(bytes), tu_alloc(bytes)};
    tu_fill(rng, FA_F32, qkv, n, 1.0), tu_fill(rng, FA_F32, d_o, n, 1.0); /* (o and do are [B, H, S, D]: n / 3) */
    const fa_forward_args f = {.q = qkv, .k = qkv + HD, .v = qkv + 2 * HD, .o = o, .lse = lse};
    CHECK(fa_forward(pl, &f) == FA_OK, "overlaps: forward: %s", fa_last_error());
    for (int t = 0; t < 3; t++) tu_poison(FA_F32, apart[t], n);
    const fa_backward_args g = {.q = f.q, .k = f.k, .v = f.v, .o = o, .d_o = d_o, .lse = lse,
                                .dq = apart[0], .dk = apart[1] + HD, .dv = apart[2] + 2 * HD};
    CHECK(fa_backward(pl, &g) == FA_OK, "overlaps: dq, dk, dv apart: %s", fa_last_error());
    fa_backward_args a = g;
    a.dq = dqkv, a.dk = dqkv + HD, a.dv = dqkv + 2 * HD;
    tu_poison(FA_F32, dqkv, n);
    CHECK(fa_backward(pl, &a) == FA_OK, "overlaps: dq, dk, dv in one packed buffer: %s", fa_last_error());
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += memcmp(&dqkv[i], &apart[i % row / HD][i], sizeof(float)) != 0;
    CHECK(differ == 0, "overlaps: %lld elements of packed dq, dk, dv differ from three buffers' (or NaN both)",
          (long long)differ);
    struct {
        const char *want[2];
        float *input; /* what a refused call must leave alone */
    } bad[] = {{{"dq (bytes", "overlaps q (bytes"}, qkv}, {{"dv (bytes", "overlaps do (bytes"}, d_o},
               {{"outputs dq and dk", "same buffer"}, NULL},
               {{"outputs dk (bytes", "share elements"}, NULL}}; /* one element apart */
    for (int i = 0; i < 4; i++) {
        a = g;
        if (i == 0) a.dq = qkv;
        if (i == 1) a.dv = d_o;
        if (i == 2) a.dk = (char *)a.dq;
        if (i == 3) a.dv = (float *)a.dk + 1;
        if (bad[i].input) memcpy(saved, bad[i].input, bytes);
        const fa_status st = fa_backward(pl, &a);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), bad[i].want[0]) && strstr(fa_last_error(), bad[i].want[1]),
              "overlap case %d: got %s \"%s\", want FA_ERR_INVALID naming %s and %s", i, fa_status_string(st),
              fa_last_error(), bad[i].want[0], bad[i].want[1]);
        CHECK(!bad[i].input || !memcmp(saved, bad[i].input, bytes), "overlap case %d: the refused call wrote its input", i);
    }
    printf("%s overlaps: dq over q, dv over do, dq = dk, dv one element into dk refused, nothing written; packed dq, "
           "dk, dv bit-identical\n",
           failures > before ? "FAIL" : "PASS");
    fa_plan_destroy(pl);
    free(qkv), free(o), free(d_o), free(lse), free(dqkv), free(saved);
    for (int t = 0; t < 3; t++) free(apart[t]);
}

/* Outputs of different strides whose elements meet, where one of them is dense (dsink, dbias,
 * a dense dk): refused naming both, nothing written (they were let through when their strides
 * differed: dsink inside dk came out wrong, dv over half of dk overwrote it). */
static void test_overlaps_dense(uint64_t *rng) {
    const int before = failures;
    const int64_t H = 2, S = 16, D = 8, n = H * S * D;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = H, p.seq_q = p.seq_k = S, p.head_dim = D, p.has_sinks = 1, p.causal = 1;
    p.v_stride = (fa_strides){{H * S * 2 * D, S * 2 * D, 2 * D, 1}}; /* v (and dv): rows 2D apart; k dense */
    p.has_bias = 1, p.bias_batch = 1, p.bias_heads = H, p.bias_grad = 1;
    fa_plan *pl = check_plan(&p, 2, 0, 0);
    if (!pl) return;
    float *q = tu_alloc(sizeof(float) * n), *k = tu_alloc(sizeof(float) * n), *v = tu_alloc(sizeof(float) * 2 * n);
    float *o = tu_alloc(sizeof(float) * n), *d_o = tu_alloc(sizeof(float) * n), *lse = tu_alloc(sizeof(float) * H * S);
    float *bias = tu_alloc(sizeof(float) * H * S * S), *big = tu_alloc(sizeof(float) * 4 * n);
    float *dq = tu_alloc(sizeof(float) * n), *dbias = tu_alloc(sizeof(float) * H * S * S), sinks[2] = {0.5f, -1.0f};
    float dsink[2];
    tu_fill(rng, FA_F32, q, n, 1.0), tu_fill(rng, FA_F32, k, n, 1.0), tu_fill(rng, FA_F32, v, 2 * n, 1.0);
    tu_fill(rng, FA_F32, d_o, n, 1.0), tu_fill(rng, FA_F32, bias, H * S * S, 1.0);
    const fa_forward_args f = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .bias = bias, .sinks = sinks};
    CHECK(fa_forward(pl, &f) == FA_OK, "dense overlaps: forward: %s", fa_last_error());
    /* dk dense at big; dv (rows 2D apart) from big + 3 n or inside dk; dsink or dbias inside dk */
    const fa_backward_args g = {.q = q, .k = k, .v = v, .o = o, .d_o = d_o, .lse = lse, .bias = bias,
                                .sinks = sinks, .dq = dq, .dk = big, .dv = big + n, .dbias = dbias, .dsink = dsink};
    CHECK(fa_backward(pl, &g) == FA_OK, "dense overlaps: apart: %s", fa_last_error());
    for (int i = 0; i < 3; i++) {
        fa_backward_args a = g;
        if (i == 0) a.dsink = big + 4;         /* two floats inside dk */
        if (i == 1) a.dv = big + n / 2 - 2 * D; /* its first rows over dk's second half */
        if (i == 2) a.dbias = big + 8;          /* dbias over dk and past it (into dv's gaps) */
        tu_poison(FA_F32, big, 4 * n);
        const fa_status st = fa_backward(pl, &a);
        int64_t written = 0;
        for (int64_t x = 0; x < 4 * n; x++) written += !isnan(big[x]);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "share elements") && !written,
              "dense overlap case %d: got %s \"%s\" (%lld elements written), want FA_ERR_INVALID: share elements", i,
              fa_status_string(st), fa_last_error(), (long long)written);
    }
    printf("%s overlaps of a dense output (dsink, dbias, dk) with another of other strides refused, nothing written\n",
           failures > before ? "FAIL" : "PASS");
    fa_plan_destroy(pl);
    void *x[] = {q, k, v, o, d_o, lse, bias, big, dq, dbias};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

int main(void) {
    uint64_t rng = check_seed("test_backward_overlaps");
    test_overlaps(&rng);
    test_overlaps_dense(&rng);
    return check_finish("test_backward_overlaps");
}
