/* Dropout (docs/semantics.md, "Dropout"): the generator against Random123's known answers;
 * fa_dropout_keep_mask against the keep rule written out here from the docs; the keep
 * rate within 4 sigma of the documented T / 256; the mask the kernels apply read back
 * from their outputs (o and dv as the mask itself, for dense and packed batches, any
 * thread count and tile); forward and gradients against the float64 reference with the
 * regenerated mask, every dtype, with causal, softcap and GQA; bit-identical results for 1,
 * 2 and 3 threads; p = 0 identical to no dropout; counts == plan; what refuses it (decode,
 * sequence parallel, CUDA).
 * FA_TEST_SEED reproduces a run; FA_ISA picks the kernels. */
#include "backend.h"
#include "philox.h"
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

/* ---- the rule as docs/semantics.md states it, written independently --------------- */

static void doc_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u; /* the key bumped before rounds 2..10 */
        const uint64_t a = (uint64_t)0xD2511F53u * c0, b = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(b >> 32) ^ c1 ^ k0, n2 = (uint32_t)(a >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)b, c3 = (uint32_t)a, c0 = n0, c2 = n2;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static int doc_keep(float p, uint64_t sd, uint64_t off, int64_t b, int64_t h, int64_t i, int64_t j) {
    const uint32_t kc[4] = {(uint32_t)off, (uint32_t)(off >> 32), 0, 0}, seedkey[2] = {(uint32_t)sd, (uint32_t)(sd >> 32)};
    uint32_t key4[4], w[4];
    doc_philox(kc, seedkey, key4);
    const uint32_t ctr[4] = {(uint32_t)(j / 16), (uint32_t)i, (uint32_t)h, (uint32_t)b}, key[2] = {key4[0], key4[1]};
    doc_philox(ctr, key, w);
    const int e = (int)(j % 16);
    const uint32_t byte = (w[e / 4] >> (8 * (e % 4))) & 0xFF;
    const long t = lround(256.0 * (1.0 - (double)p)); /* (ties: 256 (1 - p) is never x.5 for these p) */
    return (long)byte < t;
}

static void test_generator(void) {
    /* Random123 kat_vectors, the three philox4x32 10 lines: counter, key, result */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t c[4] = {kat[v][0], kat[v][1], kat[v][2], kat[v][3]}, d[4];
        fa_philox4x32_10(c, kat[v][4], kat[v][5]);
        doc_philox(kat[v], kat[v] + 4, d);
        for (int w = 0; w < 4; w++) {
            CHECK(c[w] == kat[v][6 + w], "philox kat %d word %d: got %08x want %08x", v, w, c[w], kat[v][6 + w]);
            CHECK(d[w] == kat[v][6 + w], "the test's own philox, kat %d word %d", v, w);
        }
    }
    /* the public mask against the documented rule, unaligned starts, large indices */
    static const float ps[] = {0.0f, 0.1f, 0.37f, 0.9f, 0.999f};
    uint8_t m[3 * 77];
    for (int t = 0; t < 5; t++) {
        const uint64_t sd = tu_next(&rng), off = tu_int(&rng, 0, 3) ? tu_next(&rng) : 0;
        const int64_t b = tu_int(&rng, 0, 5), h = tu_int(&rng, 0, 70000), i0 = tu_int(&rng, 0, 1 << 30),
                      j0 = tu_int(&rng, 0, 1 << 30);
        CHECK(fa_dropout_keep_mask(ps[t], sd, off, b, h, i0, 3, j0, 77, m) == FA_OK, "%s", fa_last_error());
        int64_t bad = 0;
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 77; c++) bad += m[r * 77 + c] != doc_keep(ps[t], sd, off, b, h, i0 + r, j0 + c);
        CHECK(bad == 0, "fa_dropout_keep_mask(p %g) differs from the documented rule at %lld elements", (double)ps[t],
              (long long)bad);
    }
    CHECK(fa_dropout_keep_rate(0.1f) == 230.0 / 256.0, "keep rate at 0.1: %g", fa_dropout_keep_rate(0.1f));
    CHECK(fa_dropout_keep_rate(0.0f) == 1.0, "keep rate at 0");
    CHECK(fa_dropout_keep_rate(1.0f) == -1.0 && fa_dropout_keep_rate(-0.5f) == -1.0 && fa_dropout_keep_rate(NAN) == -1.0,
          "keep rate of a bad p");
    CHECK(fa_dropout_keep_mask(1.0f, 1, 0, 0, 0, 0, 1, 0, 1, m) == FA_ERR_INVALID, "p = 1 accepted");
    CHECK(fa_dropout_keep_mask(0.5f, 1, 0, 0, 0, -1, 1, 0, 1, m) == FA_ERR_INVALID, "a negative row accepted");
    /* columns or rows past INT64_MAX: an overflow, refused (it returned FA_OK and wrote nothing) */
    CHECK(fa_dropout_keep_mask(0.5f, 1, 0, 0, 0, 0, 1, INT64_MAX - 3, 8, m) == FA_ERR_OVERFLOW &&
              fa_dropout_keep_mask(0.5f, 1, 0, 0, 0, INT64_MAX, 2, 0, 1, m) == FA_ERR_OVERFLOW,
          "indices past INT64_MAX accepted: %s", fa_last_error());
}

/* The keep rate over a million elements within 4 sigma of T / 256, under fixed generator
 * keys: the check is statistical, and a key drawn from the test's seed made a correct
 * generator fail it about once in 16,000 draws a rate (a CI run draws it some 16 times, and
 * one run did fail at 4.02 sigma; over 40 seeds the deviations had mean -0.1 to 0.2 sigma and
 * spread 1.0-1.1, as a fair generator's). The masks' other tests draw their keys. */
static void test_rate(void) {
    static const float ps[] = {0.1f, 0.5f, 0.8f};
    const int64_t rows = 1000, cols = 1000;
    uint8_t *m = tu_alloc((size_t)(rows * cols));
    for (int t = 0; t < 3; t++) {
        const double r = fa_dropout_keep_rate(ps[t]), n = (double)(rows * cols), sigma = sqrt(r * (1.0 - r) / n);
        fa_dropout_keep_mask(ps[t], 0x243f6a8885a308d3ull + (uint64_t)t, 7, 1, 2, 0, rows, 5, cols, m);
        int64_t kept = 0;
        for (int64_t x = 0; x < rows * cols; x++) kept += m[x];
        const double got = (double)kept / n;
        printf("keep rate at p %.2f: %.5f, documented %.5f (%.1f sigma)\n", (double)ps[t], got, r, (got - r) / sigma);
        CHECK(fabs(got - r) <= 4.0 * sigma, "keep rate at p %g: %.6f, documented %.6f", (double)ps[t], got, r);
    }
    free(m);
}

/* ---- the mask the kernels apply, read back from o and dv ---------------------------- */

/* q = 0 makes every visible p of a row 1 / Sk; v_j = e_j makes o_i[j] = p z_ij / (1 - p_drop)
 * and do_i = e_i makes dv_j[i] = the same: their zeros are exactly the dropped elements.
 * seqs, cq, ck: a packed batch of seqs sequences (cu_seqlens), or dense when seqs = 0. */
static void mask_readback(fa_dtype dt, int64_t B, int64_t Hq, int64_t Hk, int64_t Sq, int64_t Sk, int seqs,
                          const int32_t *cq, const int32_t *ck, int threads, int64_t bq, int64_t bk) {
    fa_problem p;
    fa_problem_init(&p);
    const int64_t W = Sq > Sk ? Sq : Sk;
    p.batch = seqs ? seqs : B, p.heads_q = Hq, p.heads_kv = Hk, p.seq_q = Sq, p.seq_k = Sk;
    p.head_dim = 8, p.head_dim_v = W, p.dtype = dt;
    p.dropout_p = 0.3f, p.dropout_seed = tu_next(&rng), p.dropout_offset = tu_int(&rng, 0, 5);
    if (seqs) p.cu_seqlens_q = cq, p.cu_seqlens_k = ck, B = 1;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = B * Hq * Sq * 8, nk = B * Hk * Sk * 8, nv = B * Hk * Sk * W, no = B * Hq * Sq * W;
    void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *v = tu_alloc(nv * es), *o = tu_alloc(no * es);
    void *g = tu_alloc(no * es), *dq = tu_alloc(nq * es), *dk = tu_alloc(nk * es), *dv = tu_alloc(nv * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
    memset(q, 0, nq * es);
    tu_fill(&rng, dt, k, nk, 1.0);
    for (int64_t x = 0; x < nv; x++) chk_store(dt, v, x, 0.0f);
    for (int64_t x = 0; x < no; x++) chk_store(dt, g, x, 0.0f);
    /* row r of v (dense [B, Hk, Sk, W] or packed [Sk, Hk, W]) is e_{local key}; likewise do */
    for (int64_t b = 0; b < (seqs ? seqs : B); b++)
        for (int64_t j = 0; j < (seqs ? ck[b + 1] - ck[b] : Sk); j++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t row = seqs ? ((ck[b] + j) * Hk + h) * W : ((b * Hk + h) * Sk + j) * W;
                chk_store(dt, v, row + j, 1.0f);
            }
    for (int64_t b = 0; b < (seqs ? seqs : B); b++)
        for (int64_t i = 0; i < (seqs ? cq[b + 1] - cq[b] : Sq); i++)
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t row = seqs ? ((cq[b] + i) * Hq + h) * W : ((b * Hq + h) * Sq + i) * W;
                chk_store(dt, g, row + i, 1.0f);
            }
    tu_poison(dt, o, no), tu_poison(dt, dv, nv);
    fa_plan *pl = check_plan(&p, threads, bq, bk);
    if (!pl) return;
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
    fa_status st = fa_forward(pl, &fa);
    CHECK(st == FA_OK, "fa_forward: %s", fa_last_error());
    fa_backward_args ba = {0};
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = g, ba.lse = lse, ba.dq = dq, ba.dk = dk, ba.dv = dv;
    st = fa_backward(pl, &ba);
    CHECK(st == FA_OK, "fa_backward: %s", fa_last_error());
    int64_t bad_o = 0, bad_dv = 0, kept = 0, total = 0;
    uint8_t *m = tu_alloc((size_t)W);
    for (int64_t b = 0; b < (seqs ? seqs : B); b++) {
        const int64_t sq = seqs ? cq[b + 1] - cq[b] : Sq, sk = seqs ? ck[b + 1] - ck[b] : Sk;
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                fa_dropout_keep_mask(p.dropout_p, p.dropout_seed, p.dropout_offset, b, h, i, 1, 0, sk, m);
                const int64_t orow = seqs ? ((cq[b] + i) * Hq + h) * W : ((b * Hq + h) * Sq + i) * W;
                for (int64_t j = 0; j < sk; j++) {
                    bad_o += (chk_load(dt, o, orow + j) != 0.0f) != m[j];
                    /* dv of kv head h / group sums its query heads: one query head per kv head here */
                    if (Hq == Hk) {
                        const int64_t vrow = seqs ? ((ck[b] + j) * Hk + h) * W : ((b * Hk + h) * Sk + j) * W;
                        bad_dv += (chk_load(dt, dv, vrow + i) != 0.0f) != m[j];
                    }
                    kept += m[j], total++;
                }
            }
    }
    CHECK(bad_o == 0 && bad_dv == 0,
          "%s %s, %d threads, tiles %lldx%lld: the kernels' mask differs from fa_dropout_keep_mask at %lld (o) and "
          "%lld (dv) of %lld elements",
          fa_dtype_name(dt), seqs ? "packed" : "dense", threads, (long long)bq, (long long)bk, (long long)bad_o,
          (long long)bad_dv, (long long)total);
    CHECK(kept > 0 && kept < total, "a mask of %lld kept of %lld", (long long)kept, (long long)total);
    fa_plan_destroy(pl);
    void *bufs[] = {q, k, v, o, g, dq, dk, dv, lse, m};
    for (size_t x = 0; x < sizeof bufs / sizeof bufs[0]; x++) free(bufs[x]);
}

static void test_readback(void) {
    static const fa_dtype dts[] = {FA_F32, FA_F16, FA_BF16};
    static const int64_t tiles[][2] = {{0, 0}, {16, 16}, {32, 48}};
    for (int d = 0; d < 3; d++)
        for (int t = 0; t < 3; t++) {
            mask_readback(dts[d], 2, 3, 3, 37, 53, 0, NULL, NULL, 1 + t, tiles[t][0], tiles[t][1]);
            mask_readback(dts[d], 1, 4, 2, 21, 40, 0, NULL, NULL, 2, tiles[t][0], tiles[t][1]); /* GQA: o only */
        }
    /* keys not starting on a Philox block (tiles of 20), and rows of more than one 256-key span */
    mask_readback(FA_BF16, 1, 2, 2, 24, 90, 0, NULL, NULL, 2, 8, 20);
    mask_readback(FA_F32, 1, 2, 2, 30, 70, 0, NULL, NULL, 1, 16, 20);
    mask_readback(FA_BF16, 1, 1, 1, 40, 600, 0, NULL, NULL, 2, 16, 512);
    mask_readback(FA_F16, 1, 1, 1, 40, 600, 0, NULL, NULL, 1, 16, 600);
    static const int32_t cq[] = {0, 13, 13, 50}, ck[] = {0, 29, 31, 70};
    for (int d = 0; d < 3; d++) mask_readback(dts[d], 0, 2, 2, 50, 70, 3, cq, ck, 1 + d, d ? 16 : 0, d ? 32 : 0);
}

/* ---- against the float64 reference ------------------------------------------------- */

typedef struct {
    fa_problem p;
    void *q, *k, *v, *o, *g, *dq, *dk, *dv;
    float *lse;
    int64_t nq, nk, nv, no;
} dcase;

static void dcase_make(dcase *c, fa_dtype dt, int causal, float softcap, float drop) {
    memset(c, 0, sizeof *c);
    fa_problem *p = &c->p;
    fa_problem_init(p);
    p->batch = 2, p->heads_q = 4, p->heads_kv = 2, p->seq_q = tu_int(&rng, 20, 90), p->seq_k = tu_int(&rng, 20, 110);
    p->head_dim = 32, p->head_dim_v = 24, p->dtype = dt, p->causal = causal, p->softcap = softcap;
    p->dropout_p = drop, p->dropout_seed = tu_next(&rng), p->dropout_offset = tu_next(&rng);
    const size_t es = fa_dtype_size(dt);
    c->nq = 2 * 4 * p->seq_q * 32, c->nk = 2 * 2 * p->seq_k * 32, c->nv = 2 * 2 * p->seq_k * 24, c->no = 2 * 4 * p->seq_q * 24;
    c->q = tu_alloc(c->nq * es), c->dq = tu_alloc(c->nq * es), c->k = tu_alloc(c->nk * es), c->dk = tu_alloc(c->nk * es);
    c->v = tu_alloc(c->nv * es), c->dv = tu_alloc(c->nv * es), c->o = tu_alloc(c->no * es), c->g = tu_alloc(c->no * es);
    c->lse = tu_alloc(sizeof(float) * (size_t)(2 * 4 * p->seq_q));
    tu_fill(&rng, dt, c->q, c->nq, 1.5), tu_fill(&rng, dt, c->k, c->nk, 1.5);
    tu_fill(&rng, dt, c->v, c->nv, 1.0), tu_fill(&rng, dt, c->g, c->no, 1.0);
}

static void dcase_free(dcase *c) {
    void *bufs[] = {c->q, c->k, c->v, c->o, c->g, c->dq, c->dk, c->dv, c->lse};
    for (size_t x = 0; x < sizeof bufs / sizeof bufs[0]; x++) free(bufs[x]);
}

/* Forward then backward on a plan of the case, outputs poisoned first. */
static int dcase_run(dcase *c, int threads, int64_t bq, int64_t bk, fa_counts *fc, fa_counts *bc) {
    fa_plan *pl = check_plan(&c->p, threads, bq, bk);
    if (!pl) return 0;
    tu_poison(c->p.dtype, c->o, c->no), tu_poison(c->p.dtype, c->dq, c->nq);
    tu_poison(c->p.dtype, c->dk, c->nk), tu_poison(c->p.dtype, c->dv, c->nv);
    fa_forward_args fa = {0};
    fa.q = c->q, fa.k = c->k, fa.v = c->v, fa.o = c->o, fa.lse = c->lse, fa.counts = fc;
    fa_status st = fa_forward(pl, &fa);
    CHECK(st == FA_OK, "fa_forward: %s", fa_last_error());
    fa_backward_args ba = {0};
    ba.q = c->q, ba.k = c->k, ba.v = c->v, ba.o = c->o, ba.d_o = c->g, ba.lse = c->lse;
    ba.dq = c->dq, ba.dk = c->dk, ba.dv = c->dv, ba.counts = bc;
    st = fa_backward(pl, &ba);
    CHECK(st == FA_OK, "fa_backward: %s", fa_last_error());
    if (fc && bc) {
        fa_cost cf, cb;
        fa_plan_cost(pl, FA_FORWARD, &cf), fa_plan_cost(pl, FA_BACKWARD, &cb);
        CHECK(fc->flops == cf.flops && fc->transcendentals == cf.transcendentals && bc->flops == cb.flops &&
                  bc->transcendentals == cb.transcendentals,
              "counts differ from the plan under dropout");
    }
    fa_plan_destroy(pl);
    return 1;
}

/* The keep mask [B, Hq, Sq, Sk] of the case, from the public hook. */
static uint8_t *dcase_mask(const dcase *c) {
    const fa_problem *p = &c->p;
    uint8_t *m = tu_alloc((size_t)(p->batch * p->heads_q * p->seq_q * p->seq_k));
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            fa_dropout_keep_mask(p->dropout_p, p->dropout_seed, p->dropout_offset, b, h, 0, p->seq_q, 0, p->seq_k,
                                 m + (b * p->heads_q + h) * p->seq_q * p->seq_k);
    return m;
}

static void test_reference(fa_dtype dt, int causal, float softcap, float drop, int threads, int64_t bq, int64_t bk) {
    dcase c;
    dcase_make(&c, dt, causal, softcap, drop);
    const fa_problem *p = &c.p;
    fa_counts fc, bc;
    if (!dcase_run(&c, threads, bq, bk, &fc, &bc)) return dcase_free(&c);
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q, Sk = p->seq_k;
    uint8_t *m = dcase_mask(&c);
    double *ro = tu_alloc(sizeof(double) * (size_t)c.no), *rl = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq));
    fa_forward_args fa = {0};
    fa.q = c.q, fa.k = c.k, fa.v = c.v;
    fa_ref_forward_dropout(p, &fa, m, ro, rl);
    const int64_t od[4] = {B, Hq, Sq, 24}, ld[4] = {B, Hq, Sq, 1}, qd[4] = {B, Hq, Sq, 32}, kd[4] = {B, Hk, Sk, 32},
                  vd[4] = {B, Hk, Sk, 24};
    const fa_strides dense = {{0, 0, 0, 0}};
    const int before = failures;
    const check_result eo = check_tensor("o", dt, c.o, &dense, ro, od, check_tol_of(dt), NULL, 0);
    check_tensor("lse", FA_F32, c.lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
    /* gradients for the saved o, each term allowed its factor's rounding (as test_backward) */
    double *rq = tu_alloc(sizeof(double) * (size_t)c.nq), *rk = tu_alloc(sizeof(double) * (size_t)c.nk);
    double *rv = tu_alloc(sizeof(double) * (size_t)c.nv);
    double *aq = tu_alloc(sizeof(double) * (size_t)c.nq), *ak = tu_alloc(sizeof(double) * (size_t)c.nk);
    double *av = tu_alloc(sizeof(double) * (size_t)c.nv);
    fa_backward_args ba = {0};
    ba.q = c.q, ba.k = c.k, ba.v = c.v, ba.o = c.o, ba.d_o = c.g;
    fa_ref_backward_dropout(p, &ba, m, 1, 0, rq, rk, rv);
    fa_ref_backward_dropout(p, &ba, m, 1, 1, aq, ak, av);
    const double u = dt == FA_F32 ? 0.0 : check_unit(dt);
    for (int64_t x = 0; x < c.nq; x++) aq[x] *= u;
    for (int64_t x = 0; x < c.nk; x++) ak[x] *= u;
    for (int64_t x = 0; x < c.nv; x++) av[x] *= u;
    const check_result eq = check_tensor("dq", dt, c.dq, &dense, rq, qd, check_tol_grad(dt), aq, 0);
    const check_result ek = check_tensor("dk", dt, c.dk, &dense, rk, kd, check_tol_grad(dt), ak, 0);
    const check_result ev = check_tensor("dv", dt, c.dv, &dense, rv, vd, check_tol_grad(dt), av, 0);
    printf("%s %s Sq %lld Sk %lld%s%s p %.2f, %d threads, tiles %lldx%lld: o %.2e dq %.2e dk %.2e dv %.2e (of the "
           "bound: %.2f %.2f %.2f %.2f)\n",
           failures > before ? "FAIL" : "PASS", fa_dtype_name(dt), (long long)Sq, (long long)Sk, causal ? " causal" : "",
           softcap > 0 ? " softcap" : "", (double)drop, threads, (long long)bq, (long long)bk, eo.err / eo.mag,
           eq.err / eq.mag, ek.err / ek.mag, ev.err / ev.mag, eo.ratio, eq.ratio, ek.ratio, ev.ratio);
    void *bufs[] = {m, ro, rl, rq, rk, rv, aq, ak, av};
    for (size_t x = 0; x < sizeof bufs / sizeof bufs[0]; x++) free(bufs[x]);
    dcase_free(&c);
}

/* ---- bits: threads, and p = 0 ------------------------------------------------------ */

static int same_bytes(const void *a, const void *b, int64_t n) { return memcmp(a, b, (size_t)n) == 0; }

static void test_threads(fa_dtype dt) {
    dcase c;
    dcase_make(&c, dt, 1, 0.0f, 0.2f);
    const size_t es = fa_dtype_size(dt);
    void *first[4] = {tu_alloc(c.no * es), tu_alloc(c.nq * es), tu_alloc(c.nk * es), tu_alloc(c.nv * es)};
    for (int threads = 1; threads <= 3; threads++) {
        dcase_run(&c, threads, 32, 32, NULL, NULL);
        void *now[4] = {c.o, c.dq, c.dk, c.dv};
        const int64_t n[4] = {c.no, c.nq, c.nk, c.nv};
        for (int x = 0; x < 4; x++) {
            if (threads == 1) memcpy(first[x], now[x], n[x] * es);
            else CHECK(same_bytes(first[x], now[x], n[x] * (int64_t)es), "%s: %s on %d threads differs from 1 thread",
                       fa_dtype_name(dt), (const char *[]){"o", "dq", "dk", "dv"}[x], threads);
        }
    }
    for (int x = 0; x < 4; x++) free(first[x]);
    dcase_free(&c);
}

static void test_p_zero(fa_dtype dt) {
    dcase c;
    dcase_make(&c, dt, 0, 0.0f, 0.0f);
    const size_t es = fa_dtype_size(dt);
    dcase_run(&c, 2, 0, 0, NULL, NULL);
    void *off[4] = {tu_alloc(c.no * es), tu_alloc(c.nq * es), tu_alloc(c.nk * es), tu_alloc(c.nv * es)};
    void *now[4] = {c.o, c.dq, c.dk, c.dv};
    const int64_t n[4] = {c.no, c.nq, c.nk, c.nv};
    for (int x = 0; x < 4; x++) memcpy(off[x], now[x], n[x] * es);
    c.p.dropout_seed = 0, c.p.dropout_offset = 0; /* no dropout at all: the default problem */
    dcase_run(&c, 2, 0, 0, NULL, NULL);
    for (int x = 0; x < 4; x++) {
        CHECK(same_bytes(off[x], now[x], n[x] * (int64_t)es), "%s: p = 0 with a seed differs from no dropout (%s)",
              fa_dtype_name(dt), (const char *[]){"o", "dq", "dk", "dv"}[x]);
        free(off[x]);
    }
    dcase_free(&c);
}

/* ---- what refuses dropout ---------------------------------------------------------- */

static void test_refusals(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 2, p.seq_q = 4, p.seq_k = 8, p.head_dim = 16, p.dtype = FA_BF16;
    fa_options o = {0};
    o.backend = FA_BACKEND_CPU;
    fa_plan *pl = NULL;
    static const float bad[] = {-0.1f, 1.0f, 1.5f, NAN};
    for (int x = 0; x < 4; x++) {
        p.dropout_p = bad[x];
        CHECK(fa_plan_create(&p, &o, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "dropout_p"),
              "dropout_p %g accepted (%s)", (double)bad[x], fa_last_error());
    }
    p.dropout_p = 0.1f;
    int32_t lens[1] = {3};
    p.cache_seqlens = lens;
    CHECK(fa_plan_create(&p, &o, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "dropout") &&
              strstr(fa_last_error(), "cache_seqlens"),
          "decode with dropout: %s", fa_last_error());
    p.cache_seqlens = NULL;
    CHECK(fa_supports_common(&p, FA_FORWARD, FA_USE_SEQ_PARALLEL) == FA_ERR_INVALID &&
              strstr(fa_last_error(), "dropout") && strstr(fa_last_error(), "sequence parallel"),
          "sequence parallel with dropout: %s", fa_last_error());
    p.dropout_p = 0.0f;
    CHECK(fa_supports_common(&p, FA_FORWARD, FA_USE_SEQ_PARALLEL) == FA_OK, "sequence parallel without dropout");
    p.dropout_p = 0.1f;
    o.backend = FA_BACKEND_CUDA;
    CHECK(fa_plan_create(&p, &o, &pl) == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "dropout"),
          "cuda with dropout: %s", fa_last_error());
}

/* A batch run as two calls of one item each, the second with dropout_batch0 = 1, draws the
 * masks of the whole batch: o, lse, dq, dk and dv of item 1 bit for bit the whole call's
 * (and with dropout_batch0 left 0, item 0's masks: other results). A negative
 * dropout_batch0, or one that overflows with the batch, is FA_ERR_INVALID. */
static void test_batch_split(fa_dtype dt) {
    dcase c;
    dcase_make(&c, dt, 1, 0.0f, 0.3f);
    if (!dcase_run(&c, 2, 0, 0, NULL, NULL)) return dcase_free(&c);
    const size_t es = fa_dtype_size(dt);
    const int64_t hq = c.nq / 2, hk = c.nk / 2, hv = c.nv / 2, ho = c.no / 2, hl = 4 * c.p.seq_q; /* one item's */
    dcase one = c; /* item 1 of the same tensors, as a batch of 1 */
    one.p.batch = 1;
    one.q = (char *)c.q + hq * es, one.k = (char *)c.k + hk * es, one.v = (char *)c.v + hv * es, one.g = (char *)c.g + ho * es;
    one.nq = hq, one.nk = hk, one.nv = hv, one.no = ho;
    void *o = tu_alloc(ho * es), *dq = tu_alloc(hq * es), *dk = tu_alloc(hk * es), *dv = tu_alloc(hv * es);
    float *lse = tu_alloc(sizeof(float) * (size_t)hl);
    one.o = o, one.dq = dq, one.dk = dk, one.dv = dv, one.lse = lse;
    for (int base = 1; base >= 0; base--) {
        one.p.dropout_batch0 = base;
        if (!dcase_run(&one, 1, 0, 0, NULL, NULL)) break;
        const int same = !memcmp(o, (char *)c.o + ho * es, ho * es) && !memcmp(lse, c.lse + hl, sizeof(float) * hl) &&
                         !memcmp(dq, (char *)c.dq + hq * es, hq * es) && !memcmp(dk, (char *)c.dk + hk * es, hk * es) &&
                         !memcmp(dv, (char *)c.dv + hv * es, hv * es);
        CHECK(same == (base == 1), "batch item 1 alone with dropout_batch0 %d: %s the whole batch's results (%s)", base,
              same ? "equals" : "differs from", fa_dtype_name(dt));
    }
    fa_problem bad = one.p;
    fa_plan *pl = NULL;
    fa_options opt = {.backend = FA_BACKEND_CPU};
    bad.dropout_batch0 = -1;
    CHECK(fa_plan_create(&bad, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "dropout_batch0"),
          "a negative dropout_batch0: %s", fa_last_error());
    bad.dropout_batch0 = INT64_MAX;
    CHECK(fa_plan_create(&bad, &opt, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "dropout_batch0"),
          "dropout_batch0 + batch past int64: %s", fa_last_error());
    void *x[] = {o, dq, dk, dv, lse};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
    dcase_free(&c);
}

int main(void) {
    rng = check_seed("test_dropout");
    test_generator();
    test_rate();
    test_readback();
    static const fa_dtype dts[] = {FA_F32, FA_F16, FA_BF16};
    for (int d = 0; d < 3; d++) {
        test_reference(dts[d], 0, 0.0f, 0.1f, 2, 0, 0);
        test_reference(dts[d], 1, 0.0f, 0.5f, 3, 32, 48);
        test_reference(dts[d], 0, 5.0f, 0.3f, 1, 16, 16);
        test_threads(dts[d]);
        test_p_zero(dts[d]);
        test_batch_split(dts[d]);
    }
    test_refusals();
    return check_finish("test_dropout");
}
