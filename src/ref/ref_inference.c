/* The float64 reference of the inference shapes (docs/semantics.md, packed batches and kv-cache decoding), for tests only: each
 * packed sequence or cached sequence is gathered into a plain dense problem and handed to
 * the dense reference (ref_forward.c, ref_backward.c). Nothing here is shared with the
 * kernels: the page lookup, the append and the packing are written out again. */
#include "ref.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void *ref_alloc(size_t n) {
    void *x = calloc(n ? n : 1, 1);
    if (!x) abort(); /* tests only */
    return x;
}

/* A packed [rows, heads, width] tensor's strides ([B, H, S, D] order, s[0] unused). */
static fa_strides packed(fa_strides st, int64_t heads, int64_t width) {
    if (!st.s[0] && !st.s[1] && !st.s[2] && !st.s[3]) st.s[1] = width, st.s[2] = heads * width, st.s[3] = 1;
    st.s[0] = 0;
    return st;
}

/* Sequence b of a packed problem as a dense batch-1 problem over offset pointers. */
static fa_problem varlen_seq(const fa_problem *p, int64_t b) {
    fa_problem s = *p;
    const int64_t Hk = p->heads_kv ? p->heads_kv : p->heads_q, Dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    s.batch = 1;
    s.seq_q = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
    s.seq_k = p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
    s.cu_seqlens_q = s.cu_seqlens_k = NULL;
    s.q_stride = packed(p->q_stride, p->heads_q, p->head_dim);
    s.k_stride = packed(p->k_stride, Hk, p->head_dim);
    s.v_stride = packed(p->v_stride, Hk, Dv);
    s.o_stride = packed(p->o_stride, p->heads_q, Dv);
    return s;
}

static const void *at_row(const void *base, const fa_strides *st, int64_t row, fa_dtype t) {
    return base ? (const char *)base + st->s[2] * row * (int64_t)fa_dtype_size(t) : NULL;
}

void fa_ref_varlen_forward(const fa_problem *p, const fa_forward_args *a, double *o, double *lse) {
    const int64_t Hq = p->heads_q, Dv = p->head_dim_v ? p->head_dim_v : p->head_dim, tq = p->seq_q;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_problem s = varlen_seq(p, b);
        const int64_t q0 = p->cu_seqlens_q[b], k0 = p->cu_seqlens_k[b];
        if (s.seq_q == 0) continue;
        fa_forward_args sa = *a;
        sa.q = at_row(a->q, &s.q_stride, q0, p->dtype);
        sa.k = at_row(a->k, &s.k_stride, k0, p->dtype);
        sa.v = at_row(a->v, &s.v_stride, k0, p->dtype);
        double *ob = ref_alloc(sizeof(double) * (size_t)(Hq * s.seq_q * Dv));
        double *lb = ref_alloc(sizeof(double) * (size_t)(Hq * s.seq_q));
        fa_ref_forward(&s, &sa, ob, lb); /* [1, Hq, Sq_b, Dv] */
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < s.seq_q; i++) {
                for (int64_t c = 0; c < Dv; c++) o[((q0 + i) * Hq + h) * Dv + c] = ob[(h * s.seq_q + i) * Dv + c];
                lse[h * tq + q0 + i] = lb[h * s.seq_q + i];
            }
        free(ob);
        free(lb);
    }
}

void fa_ref_varlen_backward(const fa_problem *p, const fa_backward_args *a, double *dq, double *dk, double *dv) {
    const int64_t Hq = p->heads_q, Hk = p->heads_kv ? p->heads_kv : Hq, D = p->head_dim;
    const int64_t Dv = p->head_dim_v ? p->head_dim_v : D;
    memset(dk, 0, sizeof(double) * (size_t)(p->seq_k * Hk * D));
    memset(dv, 0, sizeof(double) * (size_t)(p->seq_k * Hk * Dv));
    memset(dq, 0, sizeof(double) * (size_t)(p->seq_q * Hq * D));
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_problem s = varlen_seq(p, b);
        const int64_t q0 = p->cu_seqlens_q[b], k0 = p->cu_seqlens_k[b];
        if (s.seq_q == 0 || s.seq_k == 0) continue; /* zero gradients */
        fa_backward_args sa = *a;
        sa.q = at_row(a->q, &s.q_stride, q0, p->dtype);
        sa.k = at_row(a->k, &s.k_stride, k0, p->dtype);
        sa.v = at_row(a->v, &s.v_stride, k0, p->dtype);
        sa.d_o = at_row(a->d_o, &s.o_stride, q0, p->dtype);
        double *gq = ref_alloc(sizeof(double) * (size_t)(Hq * s.seq_q * D));
        double *gk = ref_alloc(sizeof(double) * (size_t)(Hk * s.seq_k * D));
        double *gv = ref_alloc(sizeof(double) * (size_t)(Hk * s.seq_k * Dv));
        fa_ref_backward(&s, &sa, gq, gk, gv);
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < s.seq_q; i++)
                for (int64_t c = 0; c < D; c++) dq[((q0 + i) * Hq + h) * D + c] = gq[(h * s.seq_q + i) * D + c];
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t j = 0; j < s.seq_k; j++) {
                for (int64_t c = 0; c < D; c++) dk[((k0 + j) * Hk + h) * D + c] = gk[(h * s.seq_k + j) * D + c];
                for (int64_t c = 0; c < Dv; c++) dv[((k0 + j) * Hk + h) * Dv + c] = gv[(h * s.seq_k + j) * Dv + c];
            }
        free(gq);
        free(gk);
        free(gv);
    }
}

/* Element (position t, kv head h, column c) of sequence b's keys or values: from the cache
 * (paged through block_table) below cache_seqlens[b], else from the new rows. Default
 * (all-zero) cache strides: [item, rows, Hk, W] row-major. */
static float cached(const fa_problem *p, const void *cache, fa_strides st, const void *fresh, const int32_t *table,
                    int64_t W, int64_t b, int64_t t, int64_t h, int64_t c) {
    const int64_t Hk = p->heads_kv ? p->heads_kv : p->heads_q, len = p->cache_seqlens[b];
    if (t >= len) return fa_load(p->dtype, fresh, ((b * p->seq_q + (t - len)) * Hk + h) * W + c);
    int64_t item = b, row = t;
    const int64_t rows = p->page_size ? p->page_size : p->seq_k;
    if (p->page_size) item = table[b * p->max_pages + t / p->page_size], row = t % p->page_size;
    if (!st.s[0] && !st.s[1] && !st.s[2] && !st.s[3]) st.s[3] = 1, st.s[1] = W, st.s[2] = Hk * W, st.s[0] = rows * Hk * W;
    return fa_load(p->dtype, cache, item * st.s[0] + h * st.s[1] + row * st.s[2] + c * st.s[3]);
}

void fa_ref_decode(const fa_problem *p, const fa_forward_args *a, double *o, double *lse) {
    const int64_t Hq = p->heads_q, Hk = p->heads_kv ? p->heads_kv : Hq, D = p->head_dim, Sq = p->seq_q;
    const int64_t Dv = p->head_dim_v ? p->head_dim_v : D;
    fa_strides qs = p->q_stride;
    if (!qs.s[0] && !qs.s[1] && !qs.s[2] && !qs.s[3]) qs.s[3] = 1, qs.s[1] = D, qs.s[2] = Hq * D, qs.s[0] = Sq * Hq * D;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t sk = p->cache_seqlens[b] + (p->has_new_kv ? Sq : 0);
        fa_problem s = *p;
        s.dtype = FA_F32; /* the gathered copies hold the dtype's values exactly */
        s.batch = 1, s.seq_k = sk, s.cache_seqlens = NULL, s.has_new_kv = 0;
        s.page_size = s.num_pages = s.max_pages = 0;
        memset(&s.q_stride, 0, sizeof s.q_stride), s.k_stride = s.v_stride = s.o_stride = s.q_stride;
        float *Q = ref_alloc(sizeof(float) * (size_t)(Hq * Sq * D));
        float *K = ref_alloc(sizeof(float) * (size_t)(Hk * sk * D + 1));
        float *V = ref_alloc(sizeof(float) * (size_t)(Hk * sk * Dv + 1));
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t c = 0; c < D; c++)
                    Q[(h * Sq + i) * D + c] = fa_load(p->dtype, a->q, b * qs.s[0] + h * qs.s[1] + i * qs.s[2] + c * qs.s[3]);
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t t = 0; t < sk; t++) {
                for (int64_t c = 0; c < D; c++)
                    K[(h * sk + t) * D + c] = cached(p, a->k, p->k_stride, a->k_new, a->block_table, D, b, t, h, c);
                for (int64_t c = 0; c < Dv; c++)
                    V[(h * sk + t) * Dv + c] = cached(p, a->v, p->v_stride, a->v_new, a->block_table, Dv, b, t, h, c);
            }
        double *ob = ref_alloc(sizeof(double) * (size_t)(Hq * Sq * Dv)), *lb = ref_alloc(sizeof(double) * (size_t)(Hq * Sq));
        fa_forward_args sa = *a;
        sa.q = Q, sa.k = K, sa.v = V;
        if (sk > 0) {
            fa_ref_forward(&s, &sa, ob, lb);
        } else { /* nothing to see */
            for (int64_t r = 0; r < Hq * Sq; r++) lb[r] = p->has_sinks ? (double)a->sinks[r / Sq] : -INFINITY;
        }
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Sq; i++) {
                for (int64_t c = 0; c < Dv; c++) o[((b * Sq + i) * Hq + h) * Dv + c] = ob[(h * Sq + i) * Dv + c];
                lse[(b * Hq + h) * Sq + i] = lb[h * Sq + i];
            }
        free(Q), free(K), free(V), free(ob), free(lb);
    }
}
