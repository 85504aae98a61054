/* The backward tests' shared machinery: a problem with its tensors (random data, strided
 * layouts, masks), the saved forward outputs, and the comparison of fa_backward's
 * gradients with the float64 reference under bounds derived from the dtype. Included by
 * test_backward.c only (each test is one program). */
#ifndef FA_BACKWARD_CHECK_H
#define FA_BACKWARD_CHECK_H

#include "cases.h"
#include "ref/ref.h"

static int bc_quiet; /* run_and_compare prints only failures (the long run) */

/* ---- one problem with its tensors ------------------------------------------------------ */

/* M_BIAS also asks for dbias (bias_grad) and, half the time, a bias_scale; M_BCAST makes the
 * bias [1, 1, Sq, Sk] (otherwise each dim is broadcast or not at random). */
enum { M_CAUSAL = 1, M_WINDOW = 2, M_SEG = 4, M_BIAS = 8, M_ALIBI = 16, M_SOFTCAP = 32, M_NEGINF = 64, M_BCAST = 128 };
/* A scale other than the default 1/sqrt(D): 0.3 to 2.5 times it, a quarter of them negative. */
enum { M_SCALE = 256 };
/* The problem's own options as given (a row of cases.h): no diag offset, window, softcap,
 * scale, bias dims or bias_scale drawn at random; the other bits say which tensors to make. */
enum { M_ASIS = 512 };
/* One bias row for every query row (bias_seq_q 1): the bias [bias_batch, bias_heads, 1, Sk]. */
enum { M_BROW = 1024 };

typedef struct {
    fa_problem p;
    void *q, *k, *v, *o, *g, *dq, *dk, *dv; /* g = do */
    int64_t nq, nk, nv, no;                 /* buffer elements (padding included) */
    float *lse, *bias, *slopes, *dbias;     /* dbias: when bias_grad */
    int64_t nbias;                          /* bias (and dbias) elements */
    int32_t *qseg, *kseg;
    double *o_exact; /* [B, Hq, Sq, Dv] the reference o, before it is rounded into o */
} tcase;

/* Strides for a [B, H, S, W] tensor in layout 0 (contiguous, given as zeros), 1 (BSHD with
 * padded rows) or 2 (BHWS: the last two dims transposed); returns the buffer elements. */
static int64_t make_layout(int layout, int64_t B, int64_t H, int64_t S, int64_t W, fa_strides *st) {
    memset(st, 0, sizeof *st);
    if (layout == 1) {
        const int64_t row = W + 3;
        st->s[3] = 1, st->s[1] = row, st->s[2] = H * row, st->s[0] = S * H * row;
        return B * S * H * row;
    }
    if (layout == 2) {
        st->s[2] = 1, st->s[3] = S, st->s[1] = W * S, st->s[0] = H * W * S;
    }
    return B * H * S * W;
}

static double rnd01(uint64_t *s) { return 0.5 * (tu_uniform(s) + 1.0); }

/* Allocates and fills a case. p: shapes and options set (strides are chosen here).
 * layouts: 0 all contiguous, 1 each tensor's layout at random, 2 every tensor a strided
 * view (padded rows or transposed), so dq, dk, dv are written through views too. */
static void case_init(tcase *c, const fa_problem *p, int mask, uint64_t *rng, int layouts) {
    memset(c, 0, sizeof *c);
    c->p = *p;
    fa_problem *q = &c->p;
    if (!q->heads_kv) q->heads_kv = q->heads_q;
    if (!q->head_dim_v) q->head_dim_v = q->head_dim;
    const int64_t B = q->batch, Hq = q->heads_q, Hk = q->heads_kv, Sq = q->seq_q, Sk = q->seq_k;
    const size_t es = fa_dtype_size(q->dtype);
    c->nq = make_layout(layouts ? (int)tu_int(rng, layouts == 2 ? 1 : 0, 2) : 0, B, Hq, Sq, q->head_dim, &q->q_stride);
    c->nk = make_layout(layouts ? (int)tu_int(rng, layouts == 2 ? 1 : 0, 2) : 0, B, Hk, Sk, q->head_dim, &q->k_stride);
    c->nv = make_layout(layouts ? (int)tu_int(rng, layouts == 2 ? 1 : 0, 2) : 0, B, Hk, Sk, q->head_dim_v, &q->v_stride);
    c->no = make_layout(layouts ? (int)tu_int(rng, layouts == 2 ? 1 : 0, 2) : 0, B, Hq, Sq, q->head_dim_v, &q->o_stride);
    c->q = tu_alloc(c->nq * es), c->dq = tu_alloc(c->nq * es);
    c->k = tu_alloc(c->nk * es), c->dk = tu_alloc(c->nk * es);
    c->v = tu_alloc(c->nv * es), c->dv = tu_alloc(c->nv * es);
    c->o = tu_alloc(c->no * es), c->g = tu_alloc(c->no * es);
    tu_fill(rng, q->dtype, c->q, c->nq, 1.5);
    tu_fill(rng, q->dtype, c->k, c->nk, 1.5);
    tu_fill(rng, q->dtype, c->v, c->nv, 1.0);
    tu_fill(rng, q->dtype, c->g, c->no, 1.0);
    c->lse = tu_alloc(sizeof(float) * (size_t)(B * Hq * Sq));
    if (mask & M_CAUSAL) q->causal = 1;
    /* now and then masks aligned elsewhere (top-left, or a block of a larger problem) */
    if (!(mask & (M_NEGINF | M_ASIS)) && tu_int(rng, 0, 3) == 0) q->has_diag_offset = 1, q->diag_offset = tu_int(rng, -Sq, Sk);
    if (mask & M_WINDOW) {
        static const int64_t w[] = {-1, 0, 5, 40};
        do {
            q->window_left = w[tu_int(rng, 0, 3)];
            q->window_right = w[tu_int(rng, 0, 3)];
        } while (q->window_left < 0 && q->window_right < 0);
    }
    if (mask & M_SOFTCAP) q->softcap = (float)(0.5 + 9.5 * rnd01(rng)); /* down to saturation */
    if (mask & M_SCALE) {
        q->has_scale = 1;
        q->scale = (float)((0.3 + 2.2 * rnd01(rng)) / sqrt((double)q->head_dim) * (tu_int(rng, 0, 3) ? 1 : -1));
    }
    if (mask & M_ALIBI) {
        q->has_alibi = 1;
        c->slopes = tu_alloc(sizeof(float) * (size_t)Hq);
        for (int64_t h = 0; h < Hq; h++) c->slopes[h] = (float)(0.01 + 0.3 * rnd01(rng));
    }
    tu_keep_aligned_diag(q);
    if (mask & M_BIAS) {
        q->has_bias = 1;
        if (!(mask & M_ASIS)) {
            q->bias_batch = tu_int(rng, 0, 1) && !(mask & M_BCAST) ? B : 1;
            q->bias_heads = tu_int(rng, 0, 1) && !(mask & M_BCAST) ? Hq : 1;
        }
        q->bias_grad = 1;
        /* (negative only without -inf entries: -inf times a negative scale is +inf) */
        if (!(mask & M_ASIS) && tu_int(rng, 0, 1)) q->has_bias_scale = 1, q->bias_scale = tu_int(rng, 0, 1) || (mask & M_NEGINF) ? 0.75f : -1.5f;
        if (mask & M_BROW) q->bias_seq_q = 1;
        const int64_t rows = mask & M_BROW ? 1 : Sq;
        int64_t n = c->nbias = q->bias_batch * q->bias_heads * rows * Sk;
        c->bias = tu_alloc(sizeof(float) * (size_t)n);
        c->dbias = tu_alloc(sizeof(float) * (size_t)(n + 64)); /* 64 poisoned past the end: no write may reach them */
        tu_poison(FA_F32, c->dbias + n, 64);
        for (int64_t i = 0; i < n; i++) c->bias[i] = (float)tu_uniform(rng);
        if (mask & M_NEGINF) { /* some -inf scores, and a whole row of them */
            for (int64_t i = 0; i < n; i++)
                if (tu_int(rng, 0, 9) == 0) c->bias[i] = -INFINITY;
            for (int64_t j = 0; j < Sk; j++) c->bias[(rows / 2) * Sk + j] = -INFINITY;
        }
    }
    if (mask & M_SEG) {
        q->has_segment_ids = 1;
        c->qseg = tu_alloc(sizeof(int32_t) * (size_t)(B * Sq));
        c->kseg = tu_alloc(sizeof(int32_t) * (size_t)(B * Sk));
        /* runs of ids 0..2 on keys; queries also get 3, which no key has (dead rows) */
        for (int64_t i = 0; i < B * Sq; i++) c->qseg[i] = (int32_t)tu_int(rng, 0, 3);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Sk; j++) c->kseg[b * Sk + j] = (int32_t)(3 * j / Sk);
    }
}

static void case_free(tcase *c) {
    void *ptrs[] = {c->q, c->k, c->v, c->o, c->g, c->dq, c->dk, c->dv, c->lse, c->bias, c->slopes, c->qseg, c->kseg,
                    c->o_exact, c->dbias};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
}

static fa_forward_args case_fwd_args(const tcase *c) {
    fa_forward_args a;
    memset(&a, 0, sizeof a);
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.lse = c->lse;
    a.bias = c->bias, a.alibi_slopes = c->slopes;
    a.q_segment_ids = c->qseg, a.kv_segment_ids = c->kseg;
    return a;
}

static fa_backward_args case_bwd_args(const tcase *c) {
    fa_backward_args a;
    memset(&a, 0, sizeof a);
    a.q = c->q, a.k = c->k, a.v = c->v, a.o = c->o, a.d_o = c->g, a.lse = c->lse;
    a.dq = c->dq, a.dk = c->dk, a.dv = c->dv, a.dbias = c->dbias;
    a.bias = c->bias, a.alibi_slopes = c->slopes;
    a.q_segment_ids = c->qseg, a.kv_segment_ids = c->kseg;
    return a;
}

/* The saved forward outputs, from the float64 reference: o rounded to the dtype, lse to f32. */
static void case_forward_ref(tcase *c, const fa_plan *pl) {
    const fa_problem *p = &c->p, *rp = fa_plan_problem(pl);
    const int64_t rows = p->batch * p->heads_q * p->seq_q, Dv = p->head_dim_v;
    free(c->o_exact);
    double *o = c->o_exact = tu_alloc(sizeof(double) * (size_t)(rows * Dv));
    double *lse = tu_alloc(sizeof(double) * (size_t)rows);
    fa_forward_args a = case_fwd_args(c);
    fa_ref_forward(p, &a, o, lse);
    for (int64_t r = 0; r < rows; r++) {
        c->lse[r] = (float)lse[r];
        const int64_t b = r / (p->heads_q * p->seq_q), h = r / p->seq_q % p->heads_q, i = r % p->seq_q;
        for (int64_t x = 0; x < Dv; x++)
            chk_store(p->dtype, c->o, chk_offset(&rp->o_stride, b, h, i, x), (float)o[r * Dv + x]);
    }
    free(lse);
}

/* The saved forward outputs from the kernel's own forward instead (the reference's o is
 * still kept in o_exact). */
static int case_forward_kernel(tcase *c, const fa_plan *pl) {
    case_forward_ref(c, pl);
    fa_forward_args a = case_fwd_args(c);
    fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "fa_forward: %s: %s", fa_status_string(st), fa_last_error());
    return st == FA_OK;
}

/* The backward reads delta_i = do_i . o_i from the saved o, which is rounded to the dtype:
 * it computes the exact gradients of a delta off by e_i = do_i . (o_saved_i - o_i). Where
 * the softmax is nearly one-hot, dP - delta cancels and e_i, tiny as it is (u |do| |o|),
 * dominates the small dq and dk that remain; that is the saved o's error, not the kernel's.
 * So the reference takes delta from the same saved o (fa_ref_backward_saved_o), which also
 * weights the shift by softcap's 1 - tanh^2 per key as the kernel does. */

/* max over rows of a [B, H, S, W] tensor of the row's 2-norm (l2) or largest |element|. */
static double max_row_norm(fa_dtype t, const void *x, const fa_strides *st, int64_t B, int64_t H, int64_t S,
                           int64_t W, int l2) {
    double best = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++) {
                double n = 0.0;
                for (int64_t w = 0; w < W; w++) {
                    const double e = fabs((double)chk_load(t, x, chk_offset(st, b, h, s, w)));
                    n = l2 ? n + e * e : (e > n ? e : n);
                }
                n = l2 ? sqrt(n) : n;
                best = n > best ? n : best;
            }
    return best;
}

/* Where dq or dk vanish mathematically (a row that sees one key has p = 1 and dP = delta),
 * the kernel returns f32 rounding noise and the relative error means nothing. So each is
 * also allowed 8 u_f32 times the size of the terms it sums, scale |dP - delta| |k or q|,
 * with |dP - delta| <= 2 |do_i|_2 max_j |v_j|_2:
 *   dq_i: sum_j p_ij (...) <= scale 2 max|do|_2 max|v|_2 max|k|          (sum_j p_ij = 1)
 *   dk_j: sum_i p_ij (...) <= scale 2 max|v|_2 max|q| max_j sum_i p_ij |do_i|_1, the last
 *         the largest |dv_j|_1 of the reference run with |do| for do. */
static void noise_floors(const tcase *c, const fa_plan *pl, double *fq, double *fk) {
    const fa_problem *p = &c->p, *rp = fa_plan_problem(pl);
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q, Sk = p->seq_k;
    const int64_t D = p->head_dim, Dv = p->head_dim_v;
    const double scale = fabs((double)fa_plan_scale(pl)), u32 = 0x1p-24;
    const double vmax = max_row_norm(p->dtype, c->v, &rp->v_stride, B, Hk, Sk, Dv, 1);
    const double gmax = max_row_norm(p->dtype, c->g, &rp->o_stride, B, Hq, Sq, Dv, 1);
    const double kmax = max_row_norm(p->dtype, c->k, &rp->k_stride, B, Hk, Sk, D, 0);
    const double qmax = max_row_norm(p->dtype, c->q, &rp->q_stride, B, Hq, Sq, D, 0);
    void *gabs = tu_alloc((size_t)c->no * fa_dtype_size(p->dtype));
    for (int64_t i = 0; i < c->no; i++) chk_store(p->dtype, gabs, i, fabsf(chk_load(p->dtype, c->g, i)));
    fa_backward_args a = case_bwd_args(c);
    a.d_o = gabs;
    double *tq = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq * D)), *tk = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * D));
    double *tv = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * Dv));
    fa_ref_backward(p, &a, tq, tk, tv);
    double colmax = 0.0;
    for (int64_t j = 0; j < B * Hk * Sk; j++) {
        double n = 0.0;
        for (int64_t x = 0; x < Dv; x++) n += fabs(tv[j * Dv + x]);
        colmax = n > colmax ? n : colmax;
    }
    *fq = 8.0 * u32 * scale * 2.0 * gmax * vmax * kmax;
    *fk = 8.0 * u32 * scale * 2.0 * vmax * qmax * colmax;
    free(gabs), free(tq), free(tk), free(tv);
}

/* The bounds on max|g - ref| / max|ref| are check.h's table (the reference takes delta from
 * the same saved o, fa_ref_backward_saved_o). */

/* max_i |e_i|, e_i = do_i . (o_saved_i - o_i): the saved o's share of the error of dS,
 * hence of dbias, per element (|p_ij e_i| <= |e_i|). The reference now takes delta from the
 * saved o too (fa_ref_backward_saved_o), so this allowance is a margin, not a need. */
static double saved_o_error_max(const tcase *c, const fa_plan *pl) {
    const fa_problem *p = &c->p, *rp = fa_plan_problem(pl);
    const int64_t Hq = p->heads_q, Sq = p->seq_q, Dv = p->head_dim_v, rows = p->batch * Hq * Sq;
    double best = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (Hq * Sq), h = r / Sq % Hq, i = r % Sq;
        double e = 0.0;
        for (int64_t x = 0; x < Dv; x++) {
            const int64_t at = chk_offset(&rp->o_stride, b, h, i, x);
            e += (double)chk_load(p->dtype, c->g, at) * ((double)chk_load(p->dtype, c->o, at) - c->o_exact[r * Dv + x]);
        }
        best = fabs(e) > best ? fabs(e) : best;
    }
    return best;
}

/* dbias (f32, whatever the dtype) against the reference's: dS = p (dP - delta) is formed in
 * f32 from the dtype's inputs, so the f32 bound applies, plus, per (b, h) summed into an
 * element, the saved o's error of delta and the f32 noise floor of dP - delta
 * (8 u_f32 2 max|do|_2 max|v|_2, as noise_floors), times |bias_scale|. */
static void dbias_check(const tcase *c, const fa_plan *pl, const double *ref, char *msg, size_t len) {
    const fa_problem *p = &c->p;
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q, Sk = p->seq_k;
    const fa_problem *rp = fa_plan_problem(pl);
    const double vmax = max_row_norm(p->dtype, c->v, &rp->v_stride, B, Hk, Sk, p->head_dim_v, 1);
    const double gmax = max_row_norm(p->dtype, c->g, &rp->o_stride, B, Hq, Sq, p->head_dim_v, 1);
    const int64_t rows = p->bias_seq_q == 1 ? 1 : Sq; /* a shared row sums every query row's term */
    const double share = (double)(B / p->bias_batch * (Hq / p->bias_heads) * (Sq / rows));
    const double w = p->has_bias_scale ? fabs((double)p->bias_scale) : 1.0;
    const double floor = w * share * (saved_o_error_max(c, pl) + 8.0 * 0x1p-24 * 2.0 * gmax * vmax);
    double *allow = check_allow_const(c->nbias, floor);
    const int64_t dims[4] = {p->bias_batch, p->bias_heads, rows, Sk};
    const check_result r =
        check_tensor("dbias", FA_F32, c->dbias, &(fa_strides){{0, 0, 0, 0}}, ref, dims, check_tol_of(FA_F32), allow, 0);
    free(allow);
    snprintf(msg, len, " dbias %.2e%s", r.mag > 0.0 ? r.err / r.mag : r.err, r.mag > 0.0 ? "" : " abs");
}

/* One gradient against its reference under check.h's rule, with the allowance of its
 * terms' rounding and noise floor (see run_and_compare); also its buffer's padding must
 * still be the poison. */
static check_result grad_check(const char *name, fa_dtype t, const void *got, int64_t nbuf, const fa_strides *st,
                               const double *ref, const double *allow, int64_t B, int64_t H, int64_t S, int64_t W) {
    const int64_t dims[4] = {B, H, S, W};
    check_outside(name, t, got, nbuf, st, dims);
    return check_tensor(name, t, got, st, ref, dims, check_tol_of(t), allow, 0);
}

/* Runs fa_backward on a case (gradients poisoned first) and compares with the reference.
 * Returns 0 if it passes (one failure counted otherwise). label: printed with the numbers. */
static int run_and_compare(tcase *c, const fa_plan *pl, const char *label) {
    const fa_problem *p = &c->p, *rp = fa_plan_problem(pl);
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q, Sk = p->seq_k;
    const int64_t D = p->head_dim, Dv = p->head_dim_v;
    tu_poison(p->dtype, c->dq, c->nq);
    tu_poison(p->dtype, c->dk, c->nk);
    tu_poison(p->dtype, c->dv, c->nv);
    if (c->dbias) tu_poison(FA_F32, c->dbias, c->nbias);
    fa_backward_args a = case_bwd_args(c);
    fa_status st = fa_backward(pl, &a);
    if (st != FA_OK) {
        CHECK(0, "%s: fa_backward returned %s: %s", label, fa_status_string(st), fa_last_error());
        return 1;
    }
    double *rq = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq * D));
    double *rk = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * D));
    double *rv = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * Dv));
    double *rb = c->dbias ? tu_alloc(sizeof(double) * (size_t)c->nbias) : NULL;
    fa_ref_backward_saved_o(p, &a, rq, rk, rv, rb);
    double fq, fk;
    noise_floors(c, pl, &fq, &fk);
    const int before = failures;
    /* Each term of a gradient sum has a factor rounded to the dtype (p, dS: u/2 each), so an
     * element may be off by u times the sum of its terms' magnitudes, however much they
     * cancel (the long run found a bf16 row with sum |dS k| = 2.22 against dq = 0.0103, off
     * by 0.7 u of that sum, while the bound below scales with max|dq| = 0.21); dq and dk
     * also get their f32 noise floors (noise_floors). */
    const double u = check_unit(p->dtype);
    double *aq = tu_alloc(sizeof(double) * (size_t)(B * Hq * Sq * D)), *ak = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * D));
    double *av = tu_alloc(sizeof(double) * (size_t)(B * Hk * Sk * Dv));
    fa_ref_backward_abs_terms(p, &a, aq, ak, av);
    for (int64_t x = 0; x < B * Hq * Sq * D; x++) aq[x] = u * aq[x] + fq;
    for (int64_t x = 0; x < B * Hk * Sk * D; x++) ak[x] = u * ak[x] + fk;
    for (int64_t x = 0; x < B * Hk * Sk * Dv; x++) av[x] *= u;
    const check_result eq = grad_check("dq", p->dtype, c->dq, c->nq, &rp->q_stride, rq, aq, B, Hq, Sq, D);
    const check_result ek = grad_check("dk", p->dtype, c->dk, c->nk, &rp->k_stride, rk, ak, B, Hk, Sk, D);
    const check_result ev = grad_check("dv", p->dtype, c->dv, c->nv, &rp->v_stride, rv, av, B, Hk, Sk, Dv);
    free(aq), free(ak), free(av);
    const double tol = check_tol_of(p->dtype).atol;
    /* passed only thanks to the f32 noise floor or the terms' rounding allowance */
    const int floored = eq.err > tol * eq.mag || ek.err > tol * ek.mag || ev.err > tol * ev.mag;
    char edb[48] = "";
    if (rb) dbias_check(c, pl, rb, edb, sizeof edb);
    const int bad = failures > before;
    failures = before + bad; /* one failed case, however many of its checks failed */
    char e3[3][32];
    const check_result *es[3] = {&eq, &ek, &ev};
    for (int g = 0; g < 3; g++) /* relative; absolute where the reference is exactly 0 */
        snprintf(e3[g], sizeof e3[g], es[g]->mag > 0.0 ? "%.2e" : "%.1e abs",
                 es[g]->mag > 0.0 ? es[g]->err / es[g]->mag : es[g]->err);
    if (bad || !bc_quiet)
        printf("%s %s: dq %s dk %s dv %s%s (bound %.1e%s)\n", bad ? "FAIL" : "PASS", label, e3[0], e3[1], e3[2], edb,
               tol, floored ? "; within the f32 noise floor and the terms' rounding" : "");
    free(rb);
    free(rq);
    free(rk);
    free(rv);
    return bad;
}

#endif
