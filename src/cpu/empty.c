/* Problems with nothing to compute (fa_problem_empty: a zero batch, query heads, seq_q or
 * seq_k, dense, packed or decoding): their outputs, written directly. Where there are
 * query rows but no keys (seq_k 0) each row gets o = 0 and lse = -inf (with sinks, lse =
 * sink_h), as a row that sees no key does (docs/semantics.md); the backward's gradients are
 * all zero (dk, dv of keys no row reads, dq of rows that read no key, dbias of entries
 * nobody adds to), and dsink_h is minus the sum of the rows' do . o: zero, since o = 0, but
 * NaN where do holds NaN or inf, as for a row whose keys are all hidden
 * (docs/nonfinite.md). Nothing is
 * allocated and the counts are 0 flops and, as the forward driver counts, one log per
 * row and with sinks one exp (the cost model, cost.c and cost_inference.c, states the
 * same). A packed call writes its own rows only: those of its cu_seqlens_q (a plan of
 * lengths per call may have more rows than a call uses). */
#include "../internal.h"

#include <math.h>
#include <string.h>

/* Leading dim of the layouts: packed batches are one [total, H, W] sequence (stride s[0]
 * unused); dense and decode tensors have B. */
static int64_t lead(const struct fa_plan *pl) { return pl->shape == FA_SHAPE_VARLEN ? 1 : pl->p.batch; }

/* Zeros of a [n0, n1, n2, n3] view with strides st, in dtype t (0.0 has all bits zero in
 * every dtype, whatever the view's order). */
static void zero_view(void *x, const fa_strides *st, fa_dtype t, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    for (int64_t a = 0; a < n0; a++)
        for (int64_t b = 0; b < n1; b++)
            for (int64_t c = 0; c < n2; c++)
                for (int64_t d = 0; d < n3; d++) fa_store(t, x, fa_offset(st, a, b, c, d), 0.0f);
}

fa_status fa_cpu_empty_forward(const struct fa_plan *pl, const fa_forward_args *a) {
    const fa_problem *p = &pl->p;
    const int64_t L = lead(pl);
    /* a decode step's block table is judged as in any step, though nothing is read */
    if (pl->shape == FA_SHAPE_DECODE) {
        const fa_status s = fa_cpu_decode_check_pages(pl, a);
        if (s) return s;
    }
    /* the call's rows: a packed batch's end its own lengths' (the plan's view, lengths.c) */
    const int64_t rows = pl->shape == FA_SHAPE_VARLEN ? p->cu_seqlens_q[p->batch] : p->seq_q;
    /* rows exist only when seq_k is the zero (B, Hq, Sq > 0): each sees no key */
    zero_view(a->o, &p->o_stride, p->dtype, L, p->heads_q, rows, p->head_dim_v);
    if (a->lse)
        for (int64_t b = 0; b < L; b++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t i = 0; i < rows; i++)
                    a->lse[fa_lse_index(pl, b, h, i)] = p->has_sinks ? a->sinks[h] : -INFINITY;
    if (a->counts) { /* the log of each row's lse, and the sink's exp (sinks.h) */
        a->counts->flops = 0;
        a->counts->transcendentals = L * p->heads_q * rows * (1 + p->has_sinks);
    }
    return FA_OK;
}

double fa_keyless_delta_sum(const struct fa_plan *pl, const fa_backward_args *a, int64_t b, int64_t h, int64_t r0,
                            int64_t r1) {
    const fa_problem *p = &pl->p;
    double sum = 0.0; /* the rows' deltas, as the kernels' dsink sums them (backward_run.c) */
    for (int64_t i = r0; i < r1; i++) sum += fa_bwd_delta_row(p, a, (b * p->heads_q + h) * p->seq_q + i);
    return sum;
}

fa_status fa_cpu_empty_backward(const struct fa_plan *pl, const fa_backward_args *a) {
    const fa_problem *p = &pl->p;
    const int64_t L = lead(pl);
    zero_view(a->dq, &p->q_stride, p->dtype, L, p->heads_q, p->seq_q, p->head_dim);
    zero_view(a->dk, &p->k_stride, p->dtype, L, p->heads_kv, p->seq_k, p->head_dim);
    zero_view(a->dv, &p->v_stride, p->dtype, L, p->heads_kv, p->seq_k, p->head_dim_v);
    const int64_t nb = p->bias_grad ? p->bias_batch * p->bias_heads * p->bias_seq_q * p->seq_k : 0;
    if (nb) memset(a->dbias, 0, sizeof(float) * (size_t)nb);
    /* rows (B, Hq, Sq > 0) exist only when seq_k is the zero; a packed call's: its own */
    const int64_t rows = pl->shape == FA_SHAPE_VARLEN ? p->cu_seqlens_q[p->batch] : p->seq_q;
    for (int64_t h = 0; p->has_sinks && h < p->heads_q; h++) {
        double sum = 0.0;
        for (int64_t b = 0; b < L; b++) sum += fa_keyless_delta_sum(pl, a, b, h, 0, rows);
        a->dsink[h] = (float)(0.0 - sum); /* +0 for a zero sum, as the kernels give */
    }
    if (a->counts) a->counts->flops = a->counts->transcendentals = 0;
    return FA_OK;
}
