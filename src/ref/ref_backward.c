/* The naive float64 backward: docs/semantics.md differentiated by hand, one query row at a
 * time, with the row's scores, probabilities and output recomputed from scratch.
 *
 *   s = scale q.k  ->  (softcap) cap tanh(s / cap)  ->  + bias_scale bias  ->  - slope |i + off - j|
 *   lse = log(exp(sink_h) + sum_j exp(s_j)) (no sink: exp(sink_h) = 0)
 *   p = exp(s - lse) over visible keys, o = sum_j p_j v_j, L = sum(o * do)
 *   dv_j += p_j do,  dp_j = do . v_j,  ds_j = p_j (dp_j - do . o)
 *   (dropout: p_j z_j in o and dv, ds_j = p_j (z_j dp_j - do . o), z_j = keep_j / (1 - p_drop))
 *   dbias_ij += bias_scale ds_j,  (softcap) ds_j *= 1 - tanh^2 (as sech^2),
 *   dq += scale ds_j k_j,  dk_j += scale ds_j q
 *   dsink_h += -exp(sink_h - lse) (do . o)   (d lse / d sink = exp(sink - lse), and o = sum p v
 *                                             scales by exp(-lse) as a whole)
 * GQA: dk and dv of a kv head sum over the query heads that read it. */
#include "ref.h"

#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Strides as given, or contiguous [n0, n1, n2, n3] when all are zero. */
static fa_strides ref_strides(fa_strides st, int64_t n1, int64_t n2, int64_t n3) {
    if (st.s[0] == 0 && st.s[1] == 0 && st.s[2] == 0 && st.s[3] == 0) {
        st.s[3] = 1;
        st.s[2] = n3;
        st.s[1] = n2 * n3;
        st.s[0] = n1 * n2 * n3;
    }
    return st;
}

/* A contiguous double copy of a [B, H, S, W] tensor of the problem's dtype. */
static double *ref_load(const fa_problem *p, const void *base, fa_strides st, int64_t H,
                        int64_t S, int64_t W) {
    st = ref_strides(st, H, S, W);
    double *x = malloc(sizeof(double) * (size_t)(p->batch * H * S * W + 1));
    if (!x) abort(); /* tests only */
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t w = 0; w < W; w++)
                    x[((b * H + h) * S + s) * W + w] =
                        (double)fa_load(p->dtype, base, fa_offset(&st, b, h, s, w));
    return x;
}

/* saved_o: delta = do . (the caller's a->o) instead of do . (this function's own o).
 * abs_terms: sums of the terms' magnitudes, |ds| |k|, |ds| |q|, p |do|, instead of the terms. */
static void ref_backward(const fa_problem *p, const fa_backward_args *a, const uint8_t *keep, int saved_o,
                         int abs_terms, double *dq, double *dk, double *dv, double *dbias, double *dsink) {
    const int64_t B = p->batch, Hq = p->heads_q, Hk = p->heads_kv, Sq = p->seq_q,
                  Sk = p->seq_k, D = p->head_dim, Dv = p->head_dim_v, off = p->has_diag_offset ? p->diag_offset : Sk - Sq;
    const int64_t group = Hk ? Hq / Hk : 1;
    const unsigned char *attend = fa_ref_attend_get(); /* ref.h */
    const double scale = p->has_scale ? (double)p->scale : 1.0 / sqrt((double)D);
    const double cap = (double)p->softcap;
    const double bias_scale = p->has_bias_scale ? (double)p->bias_scale : 1.0;
    const double kept = keep ? 1.0 / (1.0 - (double)p->dropout_p) : 1.0; /* dropout: a kept weight's factor */
    double *z = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1)); /* a row's dropout factors */
    double *Q = ref_load(p, a->q, p->q_stride, Hq, Sq, D);
    double *K = ref_load(p, a->k, p->k_stride, Hk, Sk, D);
    double *V = ref_load(p, a->v, p->v_stride, Hk, Sk, Dv);
    double *dO = ref_load(p, a->d_o, p->o_stride, Hq, Sq, Dv);
    double *Os = saved_o ? ref_load(p, a->o, p->o_stride, Hq, Sq, Dv) : NULL;
    const int64_t bias_rows = p->bias_seq_q == 1 ? 1 : Sq; /* 1: one row for every query row */
    fa_strides bs = ref_strides(p->bias_stride, p->bias_heads, bias_rows, Sk);

    memset(dq, 0, sizeof(double) * (size_t)(B * Hq * Sq * D));
    memset(dk, 0, sizeof(double) * (size_t)(B * Hk * Sk * D));
    memset(dv, 0, sizeof(double) * (size_t)(B * Hk * Sk * Dv));
    if (dbias) memset(dbias, 0, sizeof(double) * (size_t)(p->bias_batch * p->bias_heads * bias_rows * Sk));
    if (dsink) memset(dsink, 0, sizeof(double) * (size_t)Hq);

    double *s = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1));
    double *th = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1));
    double *o = malloc(sizeof(double) * (size_t)(Dv > 0 ? Dv : 1));
    if (!s || !th || !o || !z) abort(); /* tests only */

    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Sq; i++) {
                const double *qi = Q + ((b * Hq + h) * Sq + i) * D;
                const double *gi = dO + ((b * Hq + h) * Sq + i) * Dv;
                const double *Kh = K + (b * Hk + hk) * Sk * D, *Vh = V + (b * Hk + hk) * Sk * Dv;
                double *dqi = dq + ((b * Hq + h) * Sq + i) * D;
                double *dKh = dk + (b * Hk + hk) * Sk * D, *dVh = dv + (b * Hk + hk) * Sk * Dv;
                /* scores; invisible keys get -inf */
                double mx = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    int vis = 1;
                    if (p->causal && j > i + off) vis = 0;
                    /* distances, not positions: i + off +- window may overflow int64 */
                    if (p->window_left >= 0 && i + off - j > p->window_left) vis = 0;
                    if (p->window_right >= 0 && j - (i + off) > p->window_right) vis = 0;
                    if (p->has_segment_ids &&
                        a->q_segment_ids[b * Sq + i] != a->kv_segment_ids[b * Sk + j])
                        vis = 0;
                    if (attend && !attend[((b * Hq + h) * Sq + i) * Sk + j]) vis = 0;
                    s[j] = -INFINITY;
                    th[j] = 0.0;
                    if (!vis) continue;
                    double x = 0.0;
                    for (int64_t d = 0; d < D; d++) x += qi[d] * Kh[j * D + d];
                    x = fa_ref_f32_range(fa_ref_f32_range(x) * scale);
                    if (cap > 0.0) {
                        const double y = x / cap, ch = cosh(y);
                        th[j] = 1.0 / (ch * ch); /* sech^2 = 1 - tanh^2, without its cancellation */
                        x = cap * tanh(y);
                    }
                    if (p->has_bias) {
                        int64_t bb = p->bias_batch == 1 ? 0 : b, bh = p->bias_heads == 1 ? 0 : h;
                        const int64_t bi = bias_rows == 1 ? 0 : i;
                        const double t = fa_ref_f32_range(
                            bias_scale * (double)a->bias[bb * bs.s[0] + bh * bs.s[1] + bi * bs.s[2] + j * bs.s[3]]);
                        x = t == -INFINITY ? t : fa_ref_f32_range(x + t);
                    }
                    if (p->has_alibi) x = fa_ref_f32_range(x - (double)a->alibi_slopes[h] * fabs((double)(i + off - j)));
                    s[j] = x;
                    if (x > mx) mx = x;
                }
                int any_nan = 0; /* NaN or +inf in a visible score: a NaN row */
                for (int64_t j = 0; j < Sk; j++) any_nan |= s[j] != s[j] || s[j] == INFINITY;
                if (mx == -INFINITY && !any_nan) continue; /* no visible key: o = 0, no gradient */
                const double sink = p->has_sinks ? (double)a->sinks[h] : -INFINITY;
                const double top = sink > mx ? sink : mx;
                double sum = exp(sink - top);
                for (int64_t j = 0; j < Sk; j++) sum += exp(s[j] - top);
                const double lse = any_nan ? NAN : top + log(sum);
                for (int64_t j = 0; j < Sk; j++) /* now p; 0 if hidden */
                    s[j] = s[j] == -INFINITY ? 0.0 : exp(s[j] - lse);

                for (int64_t j = 0; j < Sk; j++)
                    z[j] = keep && !keep[((b * Hq + h) * Sq + i) * Sk + j] ? 0.0 : kept;
                for (int64_t c = 0; c < Dv; c++) o[c] = 0.0;
                for (int64_t j = 0; j < Sk; j++)
                    if (s[j] != 0.0)
                        for (int64_t c = 0; c < Dv; c++) o[c] += s[j] * z[j] * Vh[j * Dv + c];
                const double *oi = Os ? Os + ((b * Hq + h) * Sq + i) * Dv : o;
                double delta = 0.0;
                for (int64_t c = 0; c < Dv; c++) delta += gi[c] * oi[c];
                if (dsink && p->has_sinks) dsink[h] -= exp(sink - lse) * delta;

                for (int64_t j = 0; j < Sk; j++) {
                    if (s[j] == 0.0) continue; /* p = 0: no contribution */
                    double dp = 0.0;
                    for (int64_t c = 0; c < Dv; c++) {
                        dp += gi[c] * Vh[j * Dv + c];
                        dVh[j * Dv + c] += s[j] * z[j] * (abs_terms ? fabs(gi[c]) : gi[c]);
                    }
                    double ds = s[j] * (z[j] * dp - delta);
                    if (dbias) {
                        const int64_t bb = p->bias_batch == 1 ? 0 : b, bh = p->bias_heads == 1 ? 0 : h;
                        const int64_t bi = bias_rows == 1 ? 0 : i; /* a broadcast row sums every i */
                        dbias[((bb * p->bias_heads + bh) * bias_rows + bi) * Sk + j] += bias_scale * ds;
                    }
                    if (cap > 0.0) ds *= th[j];
                    ds *= scale;
                    if (abs_terms) {
                        for (int64_t d = 0; d < D; d++) {
                            dqi[d] += fabs(ds * Kh[j * D + d]);
                            dKh[j * D + d] += fabs(ds * qi[d]);
                        }
                        continue;
                    }
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += ds * Kh[j * D + d];
                        dKh[j * D + d] += ds * qi[d];
                    }
                }
            }
        }
    free(s);
    free(z);
    free(th);
    free(o);
    free(Q);
    free(K);
    free(V);
    free(dO);
    free(Os);
}

void fa_ref_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                     double *dv) {
    ref_backward(p, a, NULL, 0, 0, dq, dk, dv, NULL, NULL);
}

void fa_ref_backward_dbias(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                           double *dv, double *dbias) {
    ref_backward(p, a, NULL, 0, 0, dq, dk, dv, dbias, NULL);
}

void fa_ref_backward_saved_o(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk,
                             double *dv, double *dbias) {
    ref_backward(p, a, NULL, 1, 0, dq, dk, dv, dbias, NULL);
}

void fa_ref_backward_abs_terms(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk, double *dv) {
    ref_backward(p, a, NULL, 1, 1, dq, dk, dv, NULL, NULL);
}

void fa_ref_backward_sinks(const fa_problem *p, const fa_backward_args *a, int saved_o, double *dq, double *dk,
                           double *dv, double *dsink) {
    ref_backward(p, a, NULL, saved_o, 0, dq, dk, dv, NULL, dsink);
}

void fa_ref_backward_dropout(const fa_problem *p, const fa_backward_args *a, const uint8_t *keep, int saved_o,
                             int abs_terms, double *dq, double *dk, double *dv) {
    ref_backward(p, a, keep, saved_o, abs_terms, dq, dk, dv, NULL, NULL);
}
