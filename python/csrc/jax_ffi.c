/* XLA FFI handlers: flashattn's forward and backward as JAX custom calls.
 *
 * The Python front (python/flashattn/jax/) calls these through jax.ffi.ffi_call with the
 * tensors as buffers and the options as scalar attributes. A handler builds one fa_problem
 * from the buffers' dims and the attributes, plans it (microseconds), and runs it. Errors
 * come back to Python as XLA errors carrying the library's message.
 *
 * Buffers, in order (the optional ones only when their attribute says so):
 *   forward  args q, k, v, [bias], [alibi_slopes], [q_segment_ids, kv_segment_ids], [sinks], [seed]
 *            rets o, lse
 *   backward args q, k, v, o, lse, do, [bias], [alibi_slopes], [q_segment_ids, kv_segment_ids], [sinks],
 *            [seed]
 *            rets dq, dk, dv, [dbias], [dsink]
 * seed (with dropout_p > 0): uint32 [4], dropout's seed and offset as (low, high) 32-bit
 * words each, a buffer rather than an attribute so that a traced seed does not recompile.
 * Attribute "mask": the address of a library-built fa_mask (flashattn.masks; the Python front
 * keeps it alive for the process), 0 for none.
 * q, k, v, o, do are [B, S, H, D] (layout 1) or [B, H, S, D] (layout 0), row-major; lse is
 * [B, H, Sq]. Under jax.vmap (vmap_method="expand_dims") every buffer gains leading dims,
 * each the vmapped size or 1 where that input was not mapped. Where all tensors carry them
 * (the usual case), the leading dims fold into B: one plan, one call. Otherwise (or with a
 * per-batch mask) the handler runs one call per leading index, broadcasting the inputs
 * that have a leading 1. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "flashattn.h"
#include "jax_ffi_frame.h"

#if defined(__GNUC__)
#define FJ_EXPORT __attribute__((visibility("default")))
#else
#define FJ_EXPORT
#endif

/* The tensors a call can carry, arguments then results. */
enum {
    T_Q, T_K, T_V, T_O, T_LSE, T_DO, T_BIAS, T_SLOPES, T_QSEG, T_KVSEG, T_SINKS, T_SEED,
    T_OUT_O, T_OUT_LSE, T_DQ, T_DK, T_DV, T_DBIAS, T_DSINK, T_COUNT
};
static const char *const tensor_name[T_COUNT] = {
    "q", "k", "v", "o", "lse", "do", "bias", "alibi_slopes", "q_segment_ids", "kv_segment_ids", "sinks", "seed",
    "o", "lse", "dq", "dk", "dv", "dbias", "dsink"};
/* Rank of each tensor without the leading (vmapped) dims. */
static const int64_t base_rank[T_COUNT] = {4, 4, 4, 4, 3, 4, 4, 1, 2, 2, 1, 1, 4, 3, 4, 4, 4, 4, 1};

typedef struct {
    const XLA_FFI_CallFrame *frame;
    int backward;
    fj_buffer t[T_COUNT];
    int has[T_COUNT];
    int64_t lead;        /* number of leading dims (q's rank - 4) */
    const int64_t *lead_dims; /* the full leading dims (the first result's) */
    int64_t n_lead;      /* their product */
    int64_t layout;      /* 0: [B, H, S, D], 1: [B, S, H, D] */
    int64_t threads;     /* fa_options.threads: 0 the library's default */
    fa_problem p;        /* one slice: the problem without the leading dims */
} call;

#define BAD(c, fmt, ...) \
    fj_error((c)->frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "flashattn: " fmt, __VA_ARGS__)

/* ---- reading the call --------------------------------------------------------------- */

static XLA_FFI_Error *read_options(call *c) {
    const XLA_FFI_CallFrame *f = c->frame;
    fa_problem *p = &c->p;
    int64_t causal, has_scale, has_diag, has_bscale, has_bias, has_alibi, has_seg, has_sinks, bias_grad = 0, mask = 0;
    XLA_FFI_Error *e;
    if ((e = fj_attr_i64(f, "layout", &c->layout)) || (e = fj_attr_i64(f, "causal", &causal)) ||
        (e = fj_attr_i64(f, "window_left", &p->window_left)) ||
        (e = fj_attr_i64(f, "window_right", &p->window_right)) ||
        (e = fj_attr_f32(f, "softcap", &p->softcap)) || (e = fj_attr_i64(f, "has_scale", &has_scale)) ||
        (e = fj_attr_f32(f, "scale", &p->scale)) || (e = fj_attr_i64(f, "has_diag_offset", &has_diag)) ||
        (e = fj_attr_i64(f, "diag_offset", &p->diag_offset)) ||
        (e = fj_attr_i64(f, "has_bias_scale", &has_bscale)) ||
        (e = fj_attr_f32(f, "bias_scale", &p->bias_scale)) || (e = fj_attr_i64(f, "has_bias", &has_bias)) ||
        (e = fj_attr_i64(f, "has_alibi", &has_alibi)) || (e = fj_attr_i64(f, "has_segment_ids", &has_seg)) ||
        (e = fj_attr_i64(f, "threads", &c->threads)) || (e = fj_attr_i64(f, "has_sinks", &has_sinks)) ||
        (e = fj_attr_i64(f, "mask", &mask)) ||
        (c->backward && (e = fj_attr_i64(f, "bias_grad", &bias_grad))))
        return e;
    if ((e = fj_attr_f32(f, "dropout_p", &p->dropout_p))) return e; /* its seed: the seed buffer */
    if (c->threads < 0 || c->threads > INT32_MAX) return BAD(c, "threads = %lld does not fit int32", (long long)c->threads);
    if (c->layout != 0 && c->layout != 1) return BAD(c, "layout must be 0 or 1, got %lld", (long long)c->layout);
    p->causal = causal != 0;
    p->has_scale = has_scale != 0;
    p->has_diag_offset = has_diag != 0;
    p->has_bias_scale = has_bscale != 0;
    p->has_bias = has_bias != 0;
    p->has_alibi = has_alibi != 0;
    p->has_segment_ids = has_seg != 0;
    p->bias_grad = bias_grad != 0;
    p->has_sinks = has_sinks != 0;
    /* a library-built fa_mask by address (flashattn.jax keeps it alive for the process), 0: none */
    p->mask = (const fa_mask *)(uintptr_t)mask;
    return NULL;
}

static XLA_FFI_Error *read_buffers(call *c) {
    const XLA_FFI_CallFrame *f = c->frame;
    const fa_problem *p = &c->p;
    XLA_FFI_Error *e;
    int want[T_COUNT] = {0};
    want[T_Q] = want[T_K] = want[T_V] = 1;
    want[T_O] = want[T_LSE] = want[T_DO] = c->backward;
    want[T_BIAS] = p->has_bias;
    want[T_SLOPES] = p->has_alibi;
    want[T_QSEG] = want[T_KVSEG] = p->has_segment_ids;
    want[T_SINKS] = p->has_sinks;
    want[T_SEED] = p->dropout_p != 0.0f;
    want[T_OUT_O] = want[T_OUT_LSE] = !c->backward;
    want[T_DQ] = want[T_DK] = want[T_DV] = c->backward;
    want[T_DBIAS] = c->backward && p->bias_grad;
    want[T_DSINK] = c->backward && p->has_sinks;
    int64_t n_args = 0, n_rets = 0;
    for (int r = 0; r < T_COUNT; r++) {
        c->has[r] = want[r];
        if (!want[r]) continue;
        e = r < T_OUT_O ? fj_arg(f, n_args++, tensor_name[r], &c->t[r]) : fj_ret(f, n_rets++, tensor_name[r], &c->t[r]);
        if (e) return e;
    }
    if (n_args != f->args.size || n_rets != f->rets.size)
        return BAD(c, "the call has %lld arguments and %lld results, its options need %lld and %lld",
                   (long long)f->args.size, (long long)f->rets.size, (long long)n_args, (long long)n_rets);
    return NULL;
}

/* Ranks, leading dims and element types. */
static XLA_FFI_Error *check_buffers(call *c) {
    c->lead = c->t[T_Q].rank - 4;
    if (c->lead < 0) return BAD(c, "q must have rank 4 (more under vmap), got %lld", (long long)c->t[T_Q].rank);
    /* results carry every leading dim in full; an input has each in full or as 1 */
    const fj_buffer *first = &c->t[c->backward ? T_DQ : T_OUT_O];
    if (first->rank != 4 + c->lead)
        return BAD(c, "%s must have rank %lld, got %lld", tensor_name[c->backward ? T_DQ : T_OUT_O],
                   (long long)(4 + c->lead), (long long)first->rank);
    c->lead_dims = first->dims;
    c->n_lead = 1;
    for (int64_t j = 0; j < c->lead; j++) c->n_lead *= c->lead_dims[j];
    XLA_FFI_DataType dt = c->t[T_Q].dtype;
    if (dt != XLA_FFI_DataType_F32 && dt != XLA_FFI_DataType_F16 && dt != XLA_FFI_DataType_BF16)
        return BAD(c, "q must be float32, float16 or bfloat16, got %s", fj_dtype_name(dt));
    for (int r = 0; r < T_COUNT; r++) {
        if (!c->has[r]) continue;
        const fj_buffer *b = &c->t[r];
        if (b->rank != base_rank[r] + c->lead)
            return BAD(c, "%s must have rank %lld, got %lld", tensor_name[r], (long long)(base_rank[r] + c->lead),
                       (long long)b->rank);
        int is_result = r >= T_OUT_O;
        for (int64_t j = 0; j < c->lead; j++)
            if (b->dims[j] != c->lead_dims[j] && (is_result || b->dims[j] != 1))
                return BAD(c, "%s has leading (vmapped) dim %lld where the results have %lld", tensor_name[r],
                           (long long)b->dims[j], (long long)c->lead_dims[j]);
        XLA_FFI_DataType want = dt;
        if (r == T_LSE || r == T_OUT_LSE || r == T_BIAS || r == T_SLOPES || r == T_DBIAS || r == T_SINKS ||
            r == T_DSINK)
            want = XLA_FFI_DataType_F32;
        if (r == T_QSEG || r == T_KVSEG) want = XLA_FFI_DataType_S32;
        if (r == T_SEED) want = XLA_FFI_DataType_U32;
        if (b->dtype != want)
            return BAD(c, "%s must be %s, got %s", tensor_name[r], fj_dtype_name(want), fj_dtype_name(b->dtype));
    }
    return NULL;
}

/* ---- shapes -> one fa_problem -------------------------------------------------------- */

/* Dims of tensor r without its leading dims. */
static const int64_t *tail(const call *c, int r) { return c->t[r].dims + c->lead; }

/* A 4-D tensor's [B, H, S, D] in the call's layout. */
static void bhsd(const call *c, int r, int64_t out[4]) {
    const int64_t *d = tail(c, r);
    out[0] = d[0];
    out[1] = c->layout ? d[2] : d[1];
    out[2] = c->layout ? d[1] : d[2];
    out[3] = d[3];
}

/* Element strides, in [B, H, S, D] order, of a row-major tensor in the call's layout. */
static fa_strides layout_strides(const call *c, int r) {
    const int64_t *d = tail(c, r);
    fa_strides s;
    s.s[0] = d[1] * d[2] * d[3];
    s.s[1] = c->layout ? d[3] : d[2] * d[3];
    s.s[2] = c->layout ? d[2] * d[3] : d[3];
    s.s[3] = 1;
    return s;
}

/* Checks that tensor r's dims (without leading dims) equal want (n of them, memory order). */
static XLA_FFI_Error *expect_dims(const call *c, int r, const int64_t *want, int64_t n) {
    const int64_t *d = tail(c, r);
    if (memcmp(d, want, (size_t)n * sizeof *d) == 0) return NULL;
    char got[160] = "", exp[160] = "";
    for (int64_t j = 0; j < n; j++) {
        size_t g = strlen(got), x = strlen(exp);
        snprintf(got + g, sizeof got - g, "%s%lld", j ? ", " : "", (long long)d[j]);
        snprintf(exp + x, sizeof exp - x, "%s%lld", j ? ", " : "", (long long)want[j]);
    }
    return BAD(c, "%s has shape [%s], expected [%s] from q, k and v", tensor_name[r], got, exp);
}

/* A 4-D tensor's memory-order dims from [B, H, S, D]. */
static void in_layout(const call *c, int64_t b, int64_t h, int64_t s, int64_t d, int64_t out[4]) {
    out[0] = b;
    out[1] = c->layout ? s : h;
    out[2] = c->layout ? h : s;
    out[3] = d;
}

static XLA_FFI_Error *build_problem(call *c) {
    fa_problem *p = &c->p;
    int64_t q[4], k[4], v[4];
    bhsd(c, T_Q, q);
    bhsd(c, T_K, k);
    bhsd(c, T_V, v);
    int64_t B = q[0], Hq = q[1], Sq = q[2], Hk = k[1], Sk = k[2];
    if (k[0] != B || v[0] != B)
        return BAD(c, "q, k and v must share the batch size, got %lld, %lld and %lld", (long long)B,
                   (long long)k[0], (long long)v[0]);
    if (k[3] != q[3]) return BAD(c, "k has head_dim %lld but q has %lld", (long long)k[3], (long long)q[3]);
    /* the library reads heads_kv 0 as heads_q: k and v with no heads would be read past their end */
    if (Hk == 0 && Hq > 0) return BAD(c, "k and v have 0 heads but q has %lld", (long long)Hq);
    if (v[1] != Hk || v[2] != Sk)
        return BAD(c, "v has %lld heads and %lld keys but k has %lld and %lld", (long long)v[1], (long long)v[2],
                   (long long)Hk, (long long)Sk);
    p->batch = B;
    p->heads_q = Hq;
    p->heads_kv = Hk;
    p->seq_q = Sq;
    p->seq_k = Sk;
    p->head_dim = q[3];
    p->head_dim_v = v[3];
    switch (c->t[T_Q].dtype) {
    case XLA_FFI_DataType_F16: p->dtype = FA_F16; break;
    case XLA_FFI_DataType_BF16: p->dtype = FA_BF16; break;
    default: p->dtype = FA_F32; break;
    }
    p->q_stride = layout_strides(c, T_Q);
    p->k_stride = layout_strides(c, T_K);
    p->v_stride = layout_strides(c, T_V);
    int64_t o[4], lse[3] = {B, Hq, Sq}, qseg[2] = {B, Sq}, kvseg[2] = {B, Sk}, slopes[1] = {Hq};
    in_layout(c, B, Hq, Sq, p->head_dim_v, o);
    XLA_FFI_Error *e = NULL;
    int out_o = c->backward ? T_O : T_OUT_O;
    if ((e = expect_dims(c, out_o, o, 4))) return e;
    p->o_stride = layout_strides(c, out_o);
    if (c->backward) {
        if ((e = expect_dims(c, T_LSE, lse, 3)) || (e = expect_dims(c, T_DO, o, 4)) ||
            (e = expect_dims(c, T_DQ, tail(c, T_Q), 4)) || (e = expect_dims(c, T_DK, tail(c, T_K), 4)) ||
            (e = expect_dims(c, T_DV, tail(c, T_V), 4)))
            return e;
    } else if ((e = expect_dims(c, T_OUT_LSE, lse, 3))) {
        return e;
    }
    if (p->has_bias) {
        const int64_t *bd = tail(c, T_BIAS);
        int64_t want[4] = {bd[0], bd[1], bd[2] == 1 ? 1 : Sq, Sk}; /* a size-1 Sq: one row for all (bias_seq_q) */
        if ((e = expect_dims(c, T_BIAS, want, 4))) return e;
        p->bias_batch = bd[0];
        p->bias_heads = bd[1];
        p->bias_seq_q = bd[2];
        if (p->bias_grad && (e = expect_dims(c, T_DBIAS, bd, 4))) return e;
    }
    if (p->has_alibi && (e = expect_dims(c, T_SLOPES, slopes, 1))) return e;
    if (p->has_sinks && ((e = expect_dims(c, T_SINKS, slopes, 1)) ||
                         (c->backward && (e = expect_dims(c, T_DSINK, slopes, 1)))))
        return e; /* sinks and dsink: [Hq], as the slopes */
    if (p->has_segment_ids && ((e = expect_dims(c, T_QSEG, qseg, 2)) || (e = expect_dims(c, T_KVSEG, kvseg, 2))))
        return e;
    const int64_t seed[1] = {4};
    if (c->has[T_SEED] && (e = expect_dims(c, T_SEED, seed, 1))) return e;
    return NULL;
}

/* ---- leading (vmapped) dims ---------------------------------------------------------- */

static int leading_is_full(const call *c, int r) {
    return memcmp(c->t[r].dims, c->lead_dims, (size_t)c->lead * sizeof(int64_t)) == 0;
}

static int leading_is_ones(const call *c, int r) {
    for (int64_t j = 0; j < c->lead; j++)
        if (c->t[r].dims[j] != 1) return 0;
    return 1;
}

/* Whether the leading dims can fold into B: every tensor carries them, except ALiBi slopes,
 * sinks, dropout's seed and a batch-1 bias that are shared by all (their dbias would not be;
 * nor would dsink, which the backward sums over B: per vmapped index it runs one call each;
 * a seed per index is one plan each). A library mask is the same for every vmapped index:
 * one of batch 1 folds, one per batch item (batch B > 1) covers one index's B, not the
 * folded batch, so it runs one call per index too. */
static int can_fold(const call *c) {
    if (c->n_lead == 1) return 1;
    if (c->has[T_DSINK]) return 0;
    fa_mask_shape ms;
    if (c->p.mask && (fa_mask_get_shape(c->p.mask, &ms) != FA_OK || ms.batch != 1)) return 0;
    for (int r = 0; r < T_OUT_O; r++) {
        if (!c->has[r]) continue;
        int full = leading_is_full(c, r), ones = leading_is_ones(c, r);
        if (r == T_SLOPES || r == T_SINKS || r == T_SEED) {
            if (!ones) return 0;
        } else if (r == T_BIAS) {
            int per_example = full && c->p.bias_batch == c->p.batch;
            int shared = ones && c->p.bias_batch == 1 && !c->p.bias_grad;
            if (!per_example && !shared) return 0;
        } else if (!full) {
            return 0;
        }
    }
    return 1;
}

/* Tensor r's data for leading index idx (row-major over the full leading dims); a leading
 * dim of 1 broadcasts. */
static void *slice_ptr(const call *c, int r, int64_t idx) {
    const fj_buffer *b = &c->t[r];
    int64_t slice = 1;
    for (int64_t j = c->lead; j < b->rank; j++) slice *= b->dims[j];
    int64_t offset = 0, stride = slice;
    for (int64_t j = c->lead - 1; j >= 0; j--) {
        int64_t m = idx % c->lead_dims[j];
        idx /= c->lead_dims[j];
        if (b->dims[j] != 1) offset += m * stride;
        stride *= b->dims[j];
    }
    return (char *)b->data + (size_t)offset * fj_elem_bytes(b->dtype);
}

/* ---- running ------------------------------------------------------------------------- */

/* The CUDA stream and workspace XLA provides (the GPU platform only). */
typedef struct {
    void *stream;
    void *workspace;
    size_t size;
} device_ctx;

static XLA_FFI_Error *device_begin(const call *c, const fa_plan *plan, device_ctx *d) {
    const XLA_FFI_Api *api = c->frame->api;
    XLA_FFI_Stream_Get_Args sa;
    memset(&sa, 0, sizeof sa);
    sa.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    sa.ctx = c->frame->ctx;
    XLA_FFI_Error *e = api->XLA_FFI_Stream_Get(&sa);
    if (e) return e;
    d->stream = sa.stream;
    fa_cost cost;
    fa_plan_cost(plan, c->backward ? FA_BACKWARD : FA_FORWARD, &cost);
    d->size = (size_t)cost.workspace_bytes;
    if (d->size == 0) return NULL;
    XLA_FFI_DeviceMemory_Allocate_Args aa;
    memset(&aa, 0, sizeof aa);
    aa.struct_size = XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE;
    aa.ctx = c->frame->ctx;
    aa.size = d->size;
    aa.alignment = 256;
    if ((e = api->XLA_FFI_DeviceMemory_Allocate(&aa))) return e;
    d->workspace = aa.data;
    return NULL;
}

static XLA_FFI_Error *device_end(const call *c, device_ctx *d) {
    if (d->workspace == NULL) return NULL;
    XLA_FFI_DeviceMemory_Free_Args fa;
    memset(&fa, 0, sizeof fa);
    fa.struct_size = XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE;
    fa.ctx = c->frame->ctx;
    fa.size = d->size;
    fa.data = d->workspace;
    return c->frame->api->XLA_FFI_DeviceMemory_Free(&fa);
}

/* One library call for leading index idx (or for everything, folded, with idx 0). */
static fa_status run_one(const call *c, const fa_plan *plan, const device_ctx *d, int64_t idx) {
#define P(r) (c->has[r] ? slice_ptr(c, r, idx) : NULL)
    if (!c->backward) {
        fa_forward_args a;
        memset(&a, 0, sizeof a);
        a.q = P(T_Q), a.k = P(T_K), a.v = P(T_V), a.o = P(T_OUT_O), a.lse = P(T_OUT_LSE);
        a.bias = P(T_BIAS), a.alibi_slopes = P(T_SLOPES), a.q_segment_ids = P(T_QSEG), a.kv_segment_ids = P(T_KVSEG);
        a.sinks = P(T_SINKS);
        a.stream = d->stream, a.workspace = d->workspace, a.workspace_size = d->size;
        return fa_forward(plan, &a);
    }
    fa_backward_args a;
    memset(&a, 0, sizeof a);
    a.q = P(T_Q), a.k = P(T_K), a.v = P(T_V), a.o = P(T_O), a.lse = P(T_LSE), a.d_o = P(T_DO);
    a.dq = P(T_DQ), a.dk = P(T_DK), a.dv = P(T_DV), a.dbias = P(T_DBIAS), a.sinks = P(T_SINKS), a.dsink = P(T_DSINK);
    a.bias = P(T_BIAS), a.alibi_slopes = P(T_SLOPES), a.q_segment_ids = P(T_QSEG), a.kv_segment_ids = P(T_KVSEG);
    a.stream = d->stream, a.workspace = d->workspace, a.workspace_size = d->size;
    return fa_backward(plan, &a);
#undef P
}

static XLA_FFI_Error *handle(XLA_FFI_CallFrame *frame, int backward, fa_backend backend) {
    int answered;
    XLA_FFI_Error *e = fj_begin(frame, &answered);
    if (e || answered) return e;
    call c;
    memset(&c, 0, sizeof c);
    c.frame = frame;
    c.backward = backward;
    fa_problem_init(&c.p);
    if ((e = read_options(&c)) || (e = read_buffers(&c)) || (e = check_buffers(&c)) || (e = build_problem(&c)))
        return e;
    if (c.n_lead == 0) return NULL; /* an empty vmap: nothing to compute */
    int64_t calls = c.n_lead;
    if (can_fold(&c)) {
        c.p.batch *= c.n_lead;
        /* a bias per vmapped example had bias_batch == B; a shared one stays batch 1 */
        if (c.p.has_bias && leading_is_full(&c, T_BIAS)) c.p.bias_batch *= c.n_lead;
        calls = 1;
    }
    fa_options opt;
    memset(&opt, 0, sizeof opt);
    opt.backend = backend;
    opt.threads = (int)c.threads;
    /* the seed is part of the problem: one plan per vmapped index when each has its own;
     * one seed shared by indices that run a call each: a plan each too, each drawing at its
     * items' indices in the folded batch (dropout_batch0, fj_dropout_batch0: over the
     * leading dims the seed is not mapped along), as one folded call would, so that the
     * folded forward and a backward that cannot fold (dsink) draw the same masks */
    const int shared_seed = c.has[T_SEED] && leading_is_ones(&c, T_SEED);
    const int plan_each = c.has[T_SEED] && (!shared_seed || calls > 1);
    fa_plan *plan = NULL;
    fa_status s = FA_OK;
    device_ctx d;
    memset(&d, 0, sizeof d);
    for (int64_t i = 0; i < calls && s == FA_OK && !e; i++) {
        if (plan && !plan_each) {
            s = run_one(&c, plan, &d, i);
            continue;
        }
        fa_plan_destroy(plan);
        plan = NULL;
        /* host memory on the CPU platform; the CUDA backend refuses dropout when planning,
         * before a seed would be needed (its buffer is device memory) */
        if (c.has[T_SEED] && backend == FA_BACKEND_CPU) {
            const uint32_t *w = slice_ptr(&c, T_SEED, i);
            c.p.dropout_seed = (uint64_t)w[1] << 32 | w[0];
            c.p.dropout_offset = (uint64_t)w[3] << 32 | w[2];
            c.p.dropout_batch0 = fj_dropout_batch0(c.lead_dims, c.t[T_SEED].dims, c.lead, i, c.p.batch);
        }
        if ((s = fa_plan_create(&c.p, &opt, &plan)) != FA_OK) break;
        if (backend == FA_BACKEND_CUDA && i == 0 && (e = device_begin(&c, plan, &d))) break;
        s = run_one(&c, plan, &d, i);
    }
    if (s != FA_OK) e = fj_library_error(c.frame->api, s);
    XLA_FFI_Error *e2 = device_end(&c, &d);
    fa_plan_destroy(plan);
    return e ? e : e2;
}

/* ---- the handlers jax.ffi.register_ffi_target receives ------------------------------- */

FJ_EXPORT XLA_FFI_Error *fa_jax_forward_cpu(XLA_FFI_CallFrame *frame) { return handle(frame, 0, FA_BACKEND_CPU); }
FJ_EXPORT XLA_FFI_Error *fa_jax_backward_cpu(XLA_FFI_CallFrame *frame) { return handle(frame, 1, FA_BACKEND_CPU); }
FJ_EXPORT XLA_FFI_Error *fa_jax_forward_cuda(XLA_FFI_CallFrame *frame) { return handle(frame, 0, FA_BACKEND_CUDA); }
FJ_EXPORT XLA_FFI_Error *fa_jax_backward_cuda(XLA_FFI_CallFrame *frame) { return handle(frame, 1, FA_BACKEND_CUDA); }
