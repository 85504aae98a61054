/* The naive float64 forward: docs/semantics.md written out literally, one query row at a
 * time over its whole score row. No tiles, no online softmax, nothing shared with the
 * kernels beyond reading an element of the problem's dtype. */
#include "ref.h"

#include "internal.h"

#include <math.h>
#include <stdlib.h>

/* Strides as given, or contiguous for dims [n0, n1, n2, n3] when all four are zero. */
static fa_strides fwd_ref_strides(fa_strides st, int64_t n1, int64_t n2, int64_t n3) {
    if (st.s[0] == 0 && st.s[1] == 0 && st.s[2] == 0 && st.s[3] == 0) {
        st.s[3] = 1;
        st.s[2] = n3;
        st.s[1] = n2 * n3;
        st.s[0] = n1 * n2 * n3;
    }
    return st;
}

/* A contiguous double copy of a [B, H, S, W] tensor of the problem's dtype. */
static double *fwd_ref_load(const fa_problem *p, const void *base, const fa_strides *st, int64_t H, int64_t S,
                            int64_t W) {
    double *x = malloc(sizeof(double) * (size_t)(p->batch * H * S * W + 1));
    if (!x) abort(); /* tests only */
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t w = 0; w < W; w++)
                    x[((b * H + h) * S + s) * W + w] = (double)fa_load(p->dtype, base, fa_offset(st, b, h, s, w));
    return x;
}

static const unsigned char *ref_attend;
void fa_ref_attend(const unsigned char *attend) { ref_attend = attend; }
const unsigned char *fa_ref_attend_get(void) { return ref_attend; }

static void ref_forward(const fa_problem *p, const fa_forward_args *a, const uint8_t *keep, double *o, double *lse) {
    const int64_t B = p->batch, Hq = p->heads_q, Sq = p->seq_q, Sk = p->seq_k, D = p->head_dim;
    const int64_t Hk = p->heads_kv ? p->heads_kv : Hq, Dv = p->head_dim_v ? p->head_dim_v : D;
    const int64_t off = p->has_diag_offset ? p->diag_offset : Sk - Sq, group = Hk ? Hq / Hk : 1;
    const double scale = p->has_scale ? (double)p->scale : 1.0 / sqrt((double)D);
    const double cap = (double)p->softcap;
    const double bias_scale = p->has_bias_scale ? (double)p->bias_scale : 1.0;
    const double kept = keep ? 1.0 / (1.0 - (double)p->dropout_p) : 1.0; /* a kept weight's factor */
    const fa_strides qs = fwd_ref_strides(p->q_stride, Hq, Sq, D);
    const fa_strides ks = fwd_ref_strides(p->k_stride, Hk, Sk, D);
    const fa_strides vs = fwd_ref_strides(p->v_stride, Hk, Sk, Dv);
    const int64_t bias_rows = p->bias_seq_q == 1 ? 1 : Sq; /* 1: one row for every query row */
    const fa_strides bs = fwd_ref_strides(p->bias_stride, p->bias_heads, bias_rows, Sk);

    double *Q = fwd_ref_load(p, a->q, &qs, Hq, Sq, D);
    double *K = fwd_ref_load(p, a->k, &ks, Hk, Sk, D);
    double *V = fwd_ref_load(p, a->v, &vs, Hk, Sk, Dv);
    double *s = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1));
    char *vis = malloc((size_t)(Sk > 0 ? Sk : 1));
    if (!s || !vis) abort(); /* tests only */

    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            const double *Kh = K + (b * Hk + hk) * Sk * D, *Vh = V + (b * Hk + hk) * Sk * Dv;
            for (int64_t i = 0; i < Sq; i++) {
                const double *qi = Q + ((b * Hq + h) * Sq + i) * D;
                double *oi = o + ((b * Hq + h) * Sq + i) * Dv;
                double mx = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    /* visibility: every mask in use must allow (i, j) */
                    int v = 1;
                    if (p->causal && j > i + off) v = 0;
                    /* distances, not positions: i + off +- window may overflow int64 */
                    if (p->window_left >= 0 && i + off - j > p->window_left) v = 0;
                    if (p->window_right >= 0 && j - (i + off) > p->window_right) v = 0;
                    if (p->has_segment_ids && a->q_segment_ids[b * Sq + i] != a->kv_segment_ids[b * Sk + j])
                        v = 0;
                    if (ref_attend && !ref_attend[((b * Hq + h) * Sq + i) * Sk + j]) v = 0;
                    /* the score */
                    double x = 0.0;
                    for (int64_t d = 0; d < D; d++) x += qi[d] * Kh[j * D + d];
                    x = fa_ref_f32_range(fa_ref_f32_range(x) * scale);
                    if (cap > 0) x = cap * tanh(x / cap);
                    if (p->has_bias) {
                        const int64_t bb = p->bias_batch == 1 ? 0 : b, bh = p->bias_heads == 1 ? 0 : h;
                        const int64_t bi = bias_rows == 1 ? 0 : i;
                        const double t = fa_ref_f32_range(
                            bias_scale * (double)a->bias[bb * bs.s[0] + bh * bs.s[1] + bi * bs.s[2] + j * bs.s[3]]);
                        x = t == -INFINITY ? t : fa_ref_f32_range(x + t);
                    }
                    if (p->has_alibi) x = fa_ref_f32_range(x - (double)a->alibi_slopes[h] * fabs((double)(i + off - j)));
                    if (x == -INFINITY) v = 0; /* a score of -inf counts as not visible */
                    vis[j] = (char)v;
                    s[j] = x;
                    if (v && x > mx) mx = x;
                }
                /* a sink: one more term exp(sink_h) in the denominator, none in o */
                const double sink = p->has_sinks ? (double)a->sinks[h] : -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Sk; j++) any |= vis[j];
                if (!any) {
                    for (int64_t c = 0; c < Dv; c++) oi[c] = 0.0;
                    if (lse) lse[(b * Hq + h) * Sq + i] = sink; /* log(exp(sink)), or log(0) */
                    continue;
                }
                const double top = sink > mx ? sink : mx;
                double sum = exp(sink - top);
                for (int64_t j = 0; j < Sk; j++)
                    if (vis[j]) sum += exp(s[j] - top);
                const double l = top + log(sum);
                if (lse) lse[(b * Hq + h) * Sq + i] = l;
                for (int64_t c = 0; c < Dv; c++) oi[c] = 0.0;
                for (int64_t j = 0; j < Sk; j++) {
                    if (!vis[j]) continue;
                    const double pj = exp(s[j] - l) * (keep && !keep[((b * Hq + h) * Sq + i) * Sk + j] ? 0.0 : kept);
                    for (int64_t c = 0; c < Dv; c++) oi[c] += pj * Vh[j * Dv + c];
                }
            }
        }
    free(Q);
    free(K);
    free(V);
    free(s);
    free(vis);
}

void fa_ref_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse) {
    ref_forward(p, a, NULL, o, lse);
}

void fa_ref_forward_dropout(const fa_problem *p, const fa_forward_args *a, const uint8_t *keep, double *o,
                            double *lse) {
    ref_forward(p, a, keep, o, lse);
}
