/* Decoding quantized kv caches (docs/caches.md) against the float64 reference, with codes
 * and scales from an independent quantizer (quant_ref.h; the rule itself: test_quantize.c):
 * int8 and fp8 caches, dense and paged with shuffled pages,
 * one new token and chunked prefill (Sq > 1, causal), f32 / bf16 / f16 compute: o within
 * the dtype's tolerance of float64 attention over the dequantized values, and within the
 * documented bound of float64 attention over the original values; the caches afterwards
 * hold the new rows' codes and scales, untouched elsewhere (NaN scales past the lengths are
 * never read); counts == plan; bad scales (NaN, inf, negative) and missing scale arrays are
 * errors with nothing written; a non-finite q element spoils its own row only; other shapes
 * and backends refuse quantized caches. */
#include "ref/ref.h"
#include "check.h"
#include "quant_ref.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static uint64_t rng;

/* ---- decoding ------------------------------------------------------------------------ */

#define MAXB 4

typedef struct {
    fa_problem p;
    int32_t lens[MAXB], *table;
    int64_t cap, rows; /* per sequence; cache rows in all (B x cap or pages x page size) */
    float *q32, *ko, *vo, *kno, *vno;   /* original values: q, caches (dense [B, cap, Hk, D]), new rows */
    void *q, *kn, *vn, *o;              /* in the compute dtype */
    uint8_t *kc, *vc, *kc0, *vc0;       /* codes (the layout decoded: dense or paged), and before the call */
    float *ks, *vs, *ks0, *vs0;
    float *lse;
} qcase;

/* Row of (b, t): the dense or paged cache row. */
static int64_t row_of(const qcase *c, int64_t b, int64_t t) {
    const fa_problem *p = &c->p;
    return p->page_size ? (int64_t)c->table[b * p->max_pages + t / p->page_size] * p->page_size + t % p->page_size
                        : b * c->cap + t;
}

static void make(qcase *c, int64_t B, int64_t Hq, int64_t Hk, int64_t D, int64_t Sq, fa_dtype dt, fa_dtype ct,
                 int paged) {
    memset(c, 0, sizeof *c);
    fa_problem *p = &c->p;
    fa_problem_init(p);
    p->batch = B, p->heads_q = Hq, p->heads_kv = Hk, p->head_dim = D, p->head_dim_v = D, p->seq_q = Sq, p->dtype = dt;
    p->has_cache_dtype = 1, p->cache_dtype = ct, p->has_new_kv = 1, p->causal = Sq > 1;
    c->cap = 16 * tu_int(&rng, 4, 60);
    for (int64_t b = 0; b < B; b++) c->lens[b] = (int32_t)(b == 1 ? 0 : tu_int(&rng, 0, c->cap - Sq));
    if (paged) {
        p->page_size = 16 * tu_int(&rng, 1, 4);
        p->max_pages = (c->cap + p->page_size - 1) / p->page_size;
        c->cap = p->seq_k = p->max_pages * p->page_size;
        p->num_pages = B * p->max_pages + 2;
        c->table = tu_alloc(sizeof(int32_t) * (size_t)(B * p->max_pages));
        int32_t *perm = tu_alloc(sizeof(int32_t) * (size_t)p->num_pages);
        for (int64_t i = 0; i < p->num_pages; i++) perm[i] = (int32_t)i;
        for (int64_t i = p->num_pages - 1; i > 0; i--) { /* shuffled pages */
            const int64_t j = tu_int(&rng, 0, i);
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        memcpy(c->table, perm, sizeof(int32_t) * (size_t)(B * p->max_pages));
        free(perm);
        c->rows = p->num_pages * p->page_size;
    } else {
        p->seq_k = c->cap;
        c->rows = B * c->cap;
    }
    p->cache_seqlens = c->lens;
    const int64_t nq = B * Sq * Hq * D, nn = B * Sq * Hk * D, nc = B * c->cap * Hk * D, ncode = c->rows * Hk * D;
    const size_t es = fa_dtype_size(dt);
    c->q = tu_alloc(nq * es), c->o = tu_alloc(nq * es), c->kn = tu_alloc(nn * es), c->vn = tu_alloc(nn * es);
    c->q32 = tu_alloc(nq * 4), c->kno = tu_alloc(nn * 4), c->vno = tu_alloc(nn * 4);
    c->ko = tu_alloc(nc * 4), c->vo = tu_alloc(nc * 4);
    tu_fill(&rng, dt, c->q, nq, 2.0), tu_fill(&rng, dt, c->kn, nn, 2.0), tu_fill(&rng, dt, c->vn, nn, 1.0);
    for (int64_t i = 0; i < nq; i++) c->q32[i] = chk_load(dt, c->q, i);
    for (int64_t i = 0; i < nn; i++) c->kno[i] = chk_load(dt, c->kn, i), c->vno[i] = chk_load(dt, c->vn, i);
    for (int64_t i = 0; i < nc; i++) /* rows of varied magnitude: per-row scales matter */
        c->ko[i] = (float)(tu_uniform(&rng) * 2.0 * (1 + (i / D) % 5)), c->vo[i] = (float)tu_uniform(&rng);
    c->kc = tu_alloc(ncode), c->vc = tu_alloc(ncode), c->kc0 = tu_alloc(ncode), c->vc0 = tu_alloc(ncode);
    c->ks = tu_alloc(c->rows * Hk * 4), c->vs = tu_alloc(c->rows * Hk * 4);
    c->ks0 = tu_alloc(c->rows * Hk * 4), c->vs0 = tu_alloc(c->rows * Hk * 4);
    for (int64_t i = 0; i < ncode; i++) c->kc[i] = (uint8_t)tu_int(&rng, 0, 255), c->vc[i] = (uint8_t)tu_int(&rng, 0, 255);
    for (int64_t i = 0; i < c->rows * Hk; i++) c->ks[i] = c->vs[i] = NAN; /* rows nobody owns: never read */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->lens[b]; t++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t r = row_of(c, b, t) * Hk + h, src = ((b * c->cap + t) * Hk + h) * D;
                c->ks[r] = ind_quant(ct, c->ko + src, D, c->kc + r * D);
                c->vs[r] = ind_quant(ct, c->vo + src, D, c->vc + r * D);
            }
    memcpy(c->kc0, c->kc, ncode), memcpy(c->vc0, c->vc, ncode);
    memcpy(c->ks0, c->ks, c->rows * Hk * 4), memcpy(c->vs0, c->vs, c->rows * Hk * 4);
    c->lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
}

static void release(qcase *c) {
    void *x[] = {c->table, c->q32, c->ko, c->vo, c->kno, c->vno, c->q, c->kn, c->vn, c->o, c->kc, c->vc,
                 c->kc0, c->vc0, c->ks, c->vs, c->ks0, c->vs0, c->lse};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

static fa_forward_args args_of(qcase *c, fa_counts *cnt) {
    fa_forward_args a = {0};
    a.q = c->q, a.k = c->kc, a.v = c->vc, a.o = c->o, a.lse = c->lse, a.counts = cnt;
    a.k_new = c->kn, a.v_new = c->vn, a.block_table = c->table, a.k_scale = c->ks, a.v_scale = c->vs;
    return a;
}

/* float64 attention (fa_ref_decode, f32 dense caches) over the original values (deq = 0)
 * or the dequantized ones (deq = 1: the expected codes of the new rows too). */
static void reference(const qcase *c, int deq, double *o, double *lse) {
    const fa_problem *p = &c->p;
    const int64_t B = p->batch, Hk = p->heads_kv, D = p->head_dim, Sq = p->seq_q;
    const fa_dtype ct = p->cache_dtype;
    fa_problem r = *p;
    r.dtype = FA_F32, r.has_cache_dtype = 0, r.page_size = r.num_pages = r.max_pages = 0, r.seq_k = c->cap;
    float *K = tu_alloc(B * c->cap * Hk * D * 4), *V = tu_alloc(B * c->cap * Hk * D * 4);
    float *KN = tu_alloc(B * Sq * Hk * D * 4), *VN = tu_alloc(B * Sq * Hk * D * 4);
    memcpy(K, c->ko, B * c->cap * Hk * D * 4), memcpy(V, c->vo, B * c->cap * Hk * D * 4);
    memcpy(KN, c->kno, B * Sq * Hk * D * 4), memcpy(VN, c->vno, B * Sq * Hk * D * 4);
    if (deq) {
        uint8_t codes[512];
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < c->lens[b]; t++)
                for (int64_t h = 0; h < Hk; h++) {
                    const int64_t r0 = row_of(c, b, t) * Hk + h, dst = ((b * c->cap + t) * Hk + h) * D;
                    for (int64_t x = 0; x < D; x++) {
                        K[dst + x] = (float)(ind_value(ct, c->kc0[r0 * D + x]) * c->ks0[r0]);
                        V[dst + x] = (float)(ind_value(ct, c->vc0[r0 * D + x]) * c->vs0[r0]);
                    }
                }
        for (int64_t i = 0; i < B * Sq * Hk; i++) {
            float s = ind_quant(ct, c->kno + i * D, D, codes);
            for (int64_t x = 0; x < D; x++) KN[i * D + x] = (float)(ind_value(ct, codes[x]) * s);
            s = ind_quant(ct, c->vno + i * D, D, codes);
            for (int64_t x = 0; x < D; x++) VN[i * D + x] = (float)(ind_value(ct, codes[x]) * s);
        }
    }
    fa_forward_args a = {0};
    a.q = c->q32, a.k = K, a.v = V, a.k_new = KN, a.v_new = VN;
    fa_ref_decode(&r, &a, o, lse);
    free(K), free(V), free(KN), free(VN);
}

/* The bound of docs/caches.md for output element (b, i, h, x): with delta the largest
 * scale * sum_c |q_c| |k_jc - k^_jc| over the row's keys j, |o^ - o| <= (e^(2 delta) - 1)
 * max_j |v_jx| + max_j |v_jx - v^_jx| (the quantization errors of the call's own data). */
static void bound(const qcase *c, const double *deq_unused, double *out) {
    (void)deq_unused;
    const fa_problem *p = &c->p;
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, D = p->head_dim, Sq = p->seq_q;
    const fa_dtype ct = p->cache_dtype;
    const double sc = 1.0 / sqrt((double)D);
    uint8_t codes[512];
    for (int64_t b = 0; b < B; b++) {
        const int64_t sk = c->lens[b] + Sq;
        double *dk = tu_alloc(sizeof(double) * (size_t)(sk * Hk * D)), *dv = tu_alloc(sizeof(double) * (size_t)(sk * Hk * D));
        double *vmax = tu_alloc(sizeof(double) * (size_t)(Hk * D));
        for (int64_t i = 0; i < Hk * D; i++) vmax[i] = 0;
        for (int64_t t = 0; t < sk; t++)
            for (int64_t h = 0; h < Hk; h++) {
                const float *ko, *vo;
                uint8_t kq[512], vq[512];
                float ks, vs;
                if (t < c->lens[b]) {
                    const int64_t r0 = row_of(c, b, t) * Hk + h;
                    ko = c->ko + ((b * c->cap + t) * Hk + h) * D, vo = c->vo + ((b * c->cap + t) * Hk + h) * D;
                    memcpy(kq, c->kc0 + r0 * D, D), memcpy(vq, c->vc0 + r0 * D, D), ks = c->ks0[r0], vs = c->vs0[r0];
                } else {
                    const int64_t n = ((b * Sq + t - c->lens[b]) * Hk + h) * D;
                    ko = c->kno + n, vo = c->vno + n;
                    ks = ind_quant(ct, ko, D, kq), vs = ind_quant(ct, vo, D, vq);
                }
                for (int64_t x = 0; x < D; x++) {
                    const int64_t at = (t * Hk + h) * D + x;
                    dk[at] = fabs(ko[x] - ind_value(ct, kq[x]) * ks);
                    dv[at] = fabs(vo[x] - ind_value(ct, vq[x]) * vs);
                    vmax[h * D + x] = fmax(vmax[h * D + x], fabs(vo[x]));
                }
            }
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t hk = h / (Hq / Hk);
                const float *q = c->q32 + ((b * Sq + i) * Hq + h) * D;
                double delta = 0;
                for (int64_t t = 0; t < sk; t++) {
                    double s = 0;
                    for (int64_t x = 0; x < D; x++) s += fabs(q[x]) * dk[(t * Hk + hk) * D + x];
                    delta = fmax(delta, sc * s);
                }
                for (int64_t x = 0; x < D; x++) {
                    double dvm = 0;
                    for (int64_t t = 0; t < sk; t++) dvm = fmax(dvm, dv[(t * Hk + hk) * D + x]);
                    out[((b * Sq + i) * Hq + h) * D + x] = expm1(2 * delta) * vmax[hk * D + x] + dvm;
                }
            }
        free(dk), free(dv), free(vmax);
    }
    (void)codes;
}

/* A plan of p on the CPU with 2 threads (NULL, with a failure recorded, if it is refused). */
static fa_plan *plan_2_threads(const fa_problem *p, const char *what) {
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_plan *pl = NULL;
    const fa_status st = fa_plan_create(p, &opt, &pl);
    CHECK(st == FA_OK, "%s: plan: %s", what, fa_last_error());
    return st ? NULL : pl;
}

static void run(const char *label, qcase *c) {
    const fa_problem *p = &c->p;
    const int64_t no = p->batch * p->seq_q * p->heads_q * p->head_dim, Hk = p->heads_kv, D = p->head_dim;
    double *rd = tu_alloc(sizeof(double) * (size_t)no), *ro = tu_alloc(sizeof(double) * (size_t)no);
    double *bnd = tu_alloc(sizeof(double) * (size_t)no);
    double *ld = tu_alloc(sizeof(double) * (size_t)(p->batch * p->heads_q * p->seq_q));
    reference(c, 1, rd, ld);
    reference(c, 0, ro, ld);
    bound(c, rd, bnd);
    fa_plan *pl = plan_2_threads(p, label);
    if (!pl) return;
    fa_status st;
    fa_cost fc;
    fa_plan_cost(pl, FA_FORWARD, &fc);
    fa_counts cnt = {0};
    fa_forward_args a = args_of(c, &cnt);
    tu_poison(p->dtype, c->o, no);
    st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "%s: forward: %s", label, fa_last_error());
    CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals, "%s: counts %lld/%lld, plan %lld/%lld",
          label, (long long)cnt.flops, (long long)cnt.transcendentals, (long long)fc.flops, (long long)fc.transcendentals);
    double mx = 0, ed = 0, over = 0;
    for (int64_t i = 0; i < no; i++) mx = fmax(mx, fabs(rd[i]));
    const double tol = (p->dtype == FA_F32 ? 2e-5 : 2e-2) * (mx > 0 ? mx : 1);
    for (int64_t i = 0; i < no; i++) {
        const double g = chk_load(p->dtype, c->o, i);
        const double e = isnan(g) ? INFINITY : fabs(g - rd[i]);
        ed = fmax(ed, e);
        const double eo = isnan(g) ? INFINITY : fabs(g - ro[i]) - bnd[i] - tol;
        over = fmax(over, eo);
    }
    CHECK(ed <= tol, "%s: o differs from float64 on the dequantized values by %.3g (tolerance %.3g)", label, ed, tol);
    CHECK(over <= 0, "%s: o exceeds the bound against float64 on the original values by %.3g", label, over);
    /* the caches: the new rows' codes and scales, untouched elsewhere */
    uint8_t *wk = tu_alloc(c->rows * Hk * D), *wv = tu_alloc(c->rows * Hk * D);
    float *wks = tu_alloc(c->rows * Hk * 4), *wvs = tu_alloc(c->rows * Hk * 4);
    memcpy(wk, c->kc0, c->rows * Hk * D), memcpy(wv, c->vc0, c->rows * Hk * D);
    memcpy(wks, c->ks0, c->rows * Hk * 4), memcpy(wvs, c->vs0, c->rows * Hk * 4);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t t = 0; t < p->seq_q; t++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t r = row_of(c, b, c->lens[b] + t) * Hk + h, n = ((b * p->seq_q + t) * Hk + h) * D;
                wks[r] = ind_quant(p->cache_dtype, c->kno + n, D, wk + r * D);
                wvs[r] = ind_quant(p->cache_dtype, c->vno + n, D, wv + r * D);
            }
    CHECK(!memcmp(wk, c->kc, c->rows * Hk * D) && !memcmp(wv, c->vc, c->rows * Hk * D) &&
              !memcmp(wks, c->ks, c->rows * Hk * 4) && !memcmp(wvs, c->vs, c->rows * Hk * 4),
          "%s: the caches after the call are not the expected codes and scales", label);
    free(wk), free(wv), free(wks), free(wvs);
    /* bad input: a bad scale of a cached row, a missing scale array, a non-finite new row,
     * k_scale inside the key cache's codes (both written by the append) */
    int64_t b0 = 0;
    while (b0 < p->batch && !c->lens[b0]) b0++;
    for (int kind = 0; kind < 6; kind++) {
        if (kind < 3 && b0 == p->batch) continue;
        memcpy(c->kc, c->kc0, c->rows * Hk * D), memcpy(c->ks, c->ks0, c->rows * Hk * 4);
        memcpy(c->vs, c->vs0, c->rows * Hk * 4);
        fa_forward_args w = a;
        float *bad = kind == 1 ? c->vs : c->ks;
        const int64_t at = kind < 3 ? row_of(c, b0, c->lens[b0] - 1) * Hk + Hk - 1 : 0;
        if (kind < 3) bad[at] = kind == 0 ? NAN : kind == 1 ? INFINITY : -0.5f;
        if (kind == 3) w.v_scale = NULL;
        float keep = 0;
        if (kind == 4) keep = c->kno[3], chk_store(p->dtype, c->kn, 3, INFINITY);
        if (kind == 5) w.k_scale = (const float *)(c->kc + 64); /* rows x Hk floats fit in rows x Hk x D codes */
        tu_poison(p->dtype, c->o, no);
        st = fa_forward(pl, &w);
        int same = !memcmp(c->kc, c->kc0, c->rows * Hk * D);
        for (int64_t i = 0; i < no; i++) same &= isnan(chk_load(p->dtype, c->o, i));
        for (int64_t i = 0; i < c->rows * Hk; i++)
            if (!(kind < 3 && i == at && bad == c->ks)) same &= !memcmp(&c->ks[i], &c->ks0[i], 4);
        CHECK(st == (kind == 3 ? FA_ERR_NULL : FA_ERR_INVALID) && same &&
                  strstr(fa_last_error(), kind == 3 ? "v_scale" : kind == 4 ? "k_new" : kind == 1 ? "v_scale" : "k_scale") &&
                  (kind != 5 || strstr(fa_last_error(), "share memory")),
              "%s: bad input %d gave %s (%s), nothing written: %d", label, kind, fa_status_string(st), fa_last_error(),
              same);
        if (kind == 4) chk_store(p->dtype, c->kn, 3, keep);
    }
    fa_plan_destroy(pl);
    free(rd), free(ro), free(bnd), free(ld);
}

/* A q element that is not finite (NaN or inf) makes its own row's o not finite, as with a
 * plain cache, and leaves the other sequence's bits as they were (amx's int8 step has no
 * integer digits for it and leaves such a tile to the f32 step: docs/caches.md). */
static void nonfinite_q(void) {
    for (int kind = 0; kind < 2; kind++) {
        qcase c;
        make(&c, 2, 8, 2, 128, 1, FA_BF16, FA_INT8, 0);
        const fa_problem *p = &c.p;
        const int64_t D = p->head_dim, no = p->batch * p->heads_q * D, h = 5;
        fa_plan *pl = plan_2_threads(p, "non-finite q");
        fa_status st;
        if (!pl) {
            release(&c);
            continue;
        }
        fa_forward_args a = args_of(&c, NULL);
        tu_poison(p->dtype, c.o, no);
        st = fa_forward(pl, &a);
        float *o1 = tu_alloc(sizeof(float) * (size_t)no);
        for (int64_t i = 0; i < no; i++) o1[i] = chk_load(p->dtype, c.o, i);
        /* sequence 0, head h: inf of the sign that makes its score against key 0 +inf (or NaN
         * where that key's element is 0), so that the row has a score that is not -inf (a row
         * whose every score is -inf is one with no visible key: o = 0, docs/nonfinite.md) */
        const int64_t hk = h / (p->heads_q / p->heads_kv), Hk = p->heads_kv;
        const float k7 = c.lens[0] ? (float)(int8_t)c.kc[(row_of(&c, 0, 0) * Hk + hk) * D + 7] : c.kno[hk * D + 7];
        chk_store(p->dtype, c.q, h * D + 7, kind ? (k7 < 0.0f ? -INFINITY : INFINITY) : NAN);
        tu_poison(p->dtype, c.o, no);
        st |= fa_forward(pl, &a);
        int row_bad = 1, others_finite = 1, seq1_same = 1;
        for (int64_t i = 0; i < no; i++) {
            const float g = chk_load(p->dtype, c.o, i);
            if (i / D == h) row_bad &= !isfinite(g);
            else if (i < p->heads_q * D) others_finite &= isfinite(g) != 0;
            else seq1_same &= !memcmp(&g, &o1[i], 4);
        }
        CHECK(st == FA_OK && row_bad && others_finite && seq1_same,
              "a q element %s: status %s, its row not finite %d, the other rows finite %d, the other sequence "
              "unchanged %d",
              kind ? "inf" : "NaN", fa_status_string(st), row_bad, others_finite, seq1_same);
        free(o1);
        fa_plan_destroy(pl);
        release(&c);
    }
}

/* Whether this run's fp8 tiles of bf16 problems take the f16-arithmetic step (an AVX-512
 * table on a CPU with AVX512_FP16 and GFNI: docs/caches.md, "How a tile computes"). */
static int f16_arithmetic(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    const char *isa = fa_cpu_isa();
    return (!strcmp(isa, "amx") || !strcmp(isa, "avx512bf16") || !strcmp(isa, "avx512")) &&
           __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)) && (c & (1u << 8));
#else
    return 0;
#endif
}

/* docs/caches.md's bound on a score's error in f16 arithmetic, the largest over the keys row
 * (b, h) of sequence b sees (Sq = 1): scale * ((D / 32 + 6) 2^-11 sum_c |q_c k^_jc| +
 * (2 D + 32) 2^-21 max_c |q_c| kscale_j), which bounds its lse's error too. */
static double f16_score_bound(const qcase *c, int64_t b, int64_t h) {
    const fa_problem *p = &c->p;
    const int64_t Hq = p->heads_q, Hk = p->heads_kv, D = p->head_dim, hk = h / (Hq / Hk);
    const float *q = c->q32 + (b * Hq + h) * D;
    double qmax = 0, worst = 0;
    for (int64_t x = 0; x < D; x++) qmax = fmax(qmax, fabs(q[x]));
    for (int64_t t = 0; t <= c->lens[b]; t++) {
        uint8_t codes[512];
        const uint8_t *kc = codes;
        float ks;
        if (t < c->lens[b]) {
            const int64_t r0 = row_of(c, b, t) * Hk + hk;
            kc = c->kc0 + r0 * D, ks = c->ks0[r0];
        } else {
            ks = ind_quant(p->cache_dtype, c->kno + (b * Hk + hk) * D, D, codes);
        }
        double s = 0;
        for (int64_t x = 0; x < D; x++) s += fabs(q[x] * ind_value(p->cache_dtype, kc[x]) * ks);
        worst = fmax(worst, ((double)D / 32 + 6) * ldexp(s, -11) + (2.0 * (double)D + 32) * ldexp(qmax * ks, -21));
    }
    return worst / sqrt((double)D);
}

/* fp8 codes of every kind in the cached rows: zeros, subnormals and the smallest normals in
 * many rows (amx's fp8 step converts rows holding them by another route than the others:
 * docs/caches.md), against float64 on those codes; then a NaN code in one key row makes the
 * rows of its kv head's query heads in its sequence not finite and leaves every other
 * output's bits as they were. bf16 (q in one bf16 piece) and f32 (three). */
static void fp8_codes(void) {
    for (int k = 0; k < 2; k++) {
        qcase c;
        make(&c, 2, 8, 2, k ? 40 : 128, 1, k ? FA_F32 : FA_BF16, FA_FP8_E4M3, 0);
        while (c.lens[0] < 16) release(&c), make(&c, 2, 8, 2, k ? 40 : 128, 1, k ? FA_F32 : FA_BF16, FA_FP8_E4M3, 0);
        const fa_problem *p = &c.p;
        const int64_t D = p->head_dim, Hk = p->heads_kv, no = p->batch * p->heads_q * D;
        for (int64_t r = 0; r < c.rows * Hk; r++) { /* rows of small codes alone, scaled up, and mixed rows */
            const int small = tu_uniform(&rng) < 0.5;
            for (int64_t x = 0; x < D; x++) {
                uint8_t y;
                do y = (uint8_t)(small ? tu_int(&rng, 0, 15) | (tu_int(&rng, 0, 1) << 7) : tu_int(&rng, 0, 255));
                while ((y & 0x7f) == 0x7f);
                c.kc[r * D + x] = c.kc0[r * D + x] = y;
                c.vc[r * D + x] = c.vc0[r * D + x] = (uint8_t)tu_int(&rng, 0, 255) & 0xf7; /* never 0x7f */
            }
            c.ks[r] = c.ks0[r] = small ? 30.0f : 0.002f;
        }
        double *rd = tu_alloc(sizeof(double) * (size_t)no), *ld = tu_alloc(sizeof(double) * (size_t)(p->batch * p->heads_q));
        reference(&c, 1, rd, ld);
        fa_plan *pl = plan_2_threads(p, "fp8 codes");
        fa_status st;
        if (!pl) {
            free(rd), free(ld), release(&c);
            continue;
        }
        fa_forward_args a = args_of(&c, NULL);
        tu_poison(p->dtype, c.o, no);
        st = fa_forward(pl, &a);
        double mx = 0, ed = 0;
        for (int64_t i = 0; i < no; i++) mx = fmax(mx, fabs(rd[i]));
        float *o1 = tu_alloc(sizeof(float) * (size_t)no);
        for (int64_t i = 0; i < no; i++) {
            o1[i] = chk_load(p->dtype, c.o, i);
            ed = fmax(ed, isnan(o1[i]) ? INFINITY : fabs(o1[i] - rd[i]));
        }
        const double tol = (p->dtype == FA_F32 ? 2e-5 : 2e-2) * (mx > 0 ? mx : 1);
        /* lse, an f32 of the scores, whatever the dtype: within 1e-5 of float64 for f32 scores;
         * f16 arithmetic's scores (bf16 problems where it runs) add their documented bound */
        const int f16 = p->dtype == FA_BF16 && f16_arithmetic();
        double el = 0, eb = 0; /* the largest error, and its share of the row's tolerance */
        for (int64_t i = 0; i < p->batch * p->heads_q; i++) {
            const double e = fabs(c.lse[i] - ld[i]);
            const double lt = 1e-5 * (1 + fabs(ld[i])) + (f16 ? f16_score_bound(&c, i / p->heads_q, i % p->heads_q) : 0);
            el = fmax(el, e), eb = fmax(eb, e / lt);
        }
        CHECK(st == FA_OK && ed <= tol && eb <= 1,
              "fp8 codes of every kind, %s D=%lld: %s, o differs from float64 by %.3g (tolerance %.3g), lse by %.3g "
              "(%.3g of its tolerance%s)",
              fa_dtype_name(p->dtype), (long long)D, fa_status_string(st), ed, tol, el, eb,
              f16 ? ", with f16 arithmetic's bound" : "");
        const int64_t hk = 1, row = row_of(&c, 0, 13) * Hk + hk; /* sequence 0, key 13 */
        c.kc[row * D + D / 2] = 0xff;
        memcpy(c.kc0, c.kc, (size_t)(c.rows * Hk * D));
        tu_poison(p->dtype, c.o, no);
        st = fa_forward(pl, &a);
        int row_bad = 1, others_same = 1;
        for (int64_t i = 0; i < no; i++) {
            const float g = chk_load(p->dtype, c.o, i);
            if (i < p->heads_q * D && (i / D) / (p->heads_q / Hk) == hk) row_bad &= !isfinite(g);
            else others_same &= !memcmp(&g, &o1[i], 4);
        }
        CHECK(st == FA_OK && row_bad && others_same,
              "an fp8 NaN key code, %s: status %s, its heads' rows not finite %d, every other output unchanged %d",
              fa_dtype_name(p->dtype), fa_status_string(st), row_bad, others_same);
        /* a NaN value code instead (in another kv head, the key codes as they were): its column
         * of that head's query heads' rows NaN, their other columns finite, every other head's
         * output as before (bit for bit; the f16 step leaves such a tile, found only in p V, to
         * the f32 step with its state as it was, so the head's other columns may move by a
         * rounding) */
        c.kc[row * D + D / 2] = c.kc0[row * D + D / 2] = 0x11;
        tu_poison(p->dtype, c.o, no);
        st = fa_forward(pl, &a);
        for (int64_t i = 0; i < no; i++) o1[i] = chk_load(p->dtype, c.o, i);
        const int64_t hv = 0, vrow = row_of(&c, 0, c.lens[0] - 1) * Hk + hv; /* sequence 0, its last cached key */
        c.vc[vrow * D + 3] = 0x7f;
        tu_poison(p->dtype, c.o, no);
        fa_status sv = fa_forward(pl, &a);
        int col_bad = 1, rest_same = 1;
        for (int64_t i = 0; i < no; i++) {
            const float g = chk_load(p->dtype, c.o, i);
            if (i < p->heads_q * D && (i / D) / (p->heads_q / Hk) == hv) {
                if (i % D == 3) col_bad &= isnan(g) != 0;
                else rest_same &= isfinite(g) && fabs(g - o1[i]) <= tol;
            } else {
                rest_same &= !memcmp(&g, &o1[i], 4);
            }
        }
        c.vc[vrow * D + 3] = c.vc0[vrow * D + 3];
        CHECK(st == FA_OK && sv == FA_OK && col_bad && rest_same,
              "an fp8 NaN value code, %s: status %s, its heads' column NaN %d, the rest finite, other heads unchanged %d",
              fa_dtype_name(p->dtype), fa_status_string(sv), col_bad, rest_same);
        free(o1), free(rd), free(ld);
        fa_plan_destroy(pl);
        release(&c);
    }
}

/* Quantized caches elsewhere are refused, naming both features. */
static void refusals(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 4, p.seq_q = 4, p.seq_k = 64, p.head_dim = 32, p.dtype = FA_BF16;
    p.has_cache_dtype = 1, p.cache_dtype = FA_INT8;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU;
    fa_plan *pl = NULL;
    fa_status st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "quantized") && strstr(fa_last_error(), "dense attention"),
          "a quantized cache in dense attention: %s (%s)", fa_status_string(st), fa_last_error());
    int32_t cu[2] = {0, 4}, cuk[2] = {0, 64};
    p.cu_seqlens_q = cu, p.cu_seqlens_k = cuk;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "quantized") && strstr(fa_last_error(), "cu_seqlens"),
          "a quantized cache with cu_seqlens: %s (%s)", fa_status_string(st), fa_last_error());
    p.cu_seqlens_q = p.cu_seqlens_k = NULL;
    int32_t lens[1] = {10};
    p.cache_seqlens = lens, p.seq_q = 1;
    p.cache_dtype = FA_F16;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "cache_dtype f16"), "an f16 cache of bf16 attention: %s (%s)",
          fa_status_string(st), fa_last_error());
    p.cache_dtype = FA_FP8_E4M3;
    opt.backend = FA_BACKEND_CUDA;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "cuda") && strstr(fa_last_error(), "quantized"),
          "a quantized cache on cuda: %s (%s)", fa_status_string(st), fa_last_error());
    p.dtype = FA_INT8, p.has_cache_dtype = 0;
    opt.backend = FA_BACKEND_CPU;
    st = fa_plan_create(&p, &opt, &pl);
    CHECK(st == FA_ERR_INVALID, "int8 as the compute dtype: %s", fa_status_string(st));
}

int main(void) {
    seed = tu_seed();
    rng = seed;
    printf("test_decode_quant: seed %llu (FA_TEST_SEED=%llu reproduces), isa %s\n", (unsigned long long)seed,
           (unsigned long long)seed, fa_cpu_isa());
    refusals();
    nonfinite_q();
    fp8_codes();
    static const fa_dtype dts[3] = {FA_F32, FA_BF16, FA_F16}, cts[2] = {FA_INT8, FA_FP8_E4M3};
    static const int64_t shapes[][4] = {{8, 2, 128, 1}, {4, 1, 40, 5}, {6, 3, 64, 2}, {8, 8, 32, 16}}; /* Hq Hk D Sq */
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (int paged = 0; paged <= 1; paged++)
            for (int s = 0; s < 4; s++) {
                const int64_t *sh = shapes[s];
                const fa_dtype dt = dts[(k + paged + s) % 3];
                qcase c;
                make(&c, tu_int(&rng, 1, MAXB), sh[0], sh[1], sh[2], sh[3], dt, cts[k], paged);
                char label[160];
                snprintf(label, sizeof label, "#%d %s cache, %s, B=%lld Hq=%lld Hk=%lld D=%lld Sq=%lld cap=%lld%s", n++,
                         fa_dtype_name(cts[k]), fa_dtype_name(dt), (long long)c.p.batch, (long long)sh[0],
                         (long long)sh[1], (long long)sh[2], (long long)sh[3], (long long)c.cap, paged ? " paged" : "");
                run(label, &c);
                release(&c);
            }
    /* fp8 caches of bf16 problems with head dims that are not multiples of 64 (their last 32
     * columns loaded masked in the f16-arithmetic step), or past 128 (two p V blocks) */
    static const int64_t odd[][4] = {{4, 2, 96, 1}, {8, 2, 256, 1}, {6, 2, 160, 3}};
    for (int s = 0; s < 3; s++) {
        qcase c;
        make(&c, tu_int(&rng, 1, MAXB), odd[s][0], odd[s][1], odd[s][2], odd[s][3], FA_BF16, FA_FP8_E4M3, s == 1);
        char label[160];
        snprintf(label, sizeof label, "#%d fp8 cache, bf16, B=%lld Hq=%lld Hk=%lld D=%lld Sq=%lld cap=%lld%s", n++,
                 (long long)c.p.batch, (long long)odd[s][0], (long long)odd[s][1], (long long)odd[s][2],
                 (long long)odd[s][3], (long long)c.cap, s == 1 ? " paged" : "");
        run(label, &c);
        release(&c);
    }
    if (!check_finish("test_decode_quant")) printf("test_decode_quant: %d decode cases passed\n", n);
    return failures ? 1 : 0;
}
