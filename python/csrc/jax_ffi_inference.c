/* XLA FFI handlers for the inference shapes (README, "Inference shapes"): packed variable-length batches
 * (forward and backward) and kv-cache decoding (paged too), behind flashattn.jax's
 * varlen_attention and kvcache_attention. CPU platform only: the library runs these shapes
 * on the CPU, and the length arrays it plans from are then host memory.
 *
 * Buffers, in order (the optional ones only when their attribute says so):
 *   varlen forward   args q [Tq, Hq, D], k [Tk, Hk, D], v [Tk, Hk, Dv], cu_seqlens_q [B+1],
 *                         cu_seqlens_k [B+1] (int32), [alibi_slopes [Hq]], [sinks [Hq]],
 *                         [seed: uint32 [4], dropout's seed and offset as (low, high) words
 *                         each, with attribute dropout_p > 0 (as jax_ffi.c's)]
 *                    rets o [Tq, Hq, Dv], lse [Hq, Tq]
 *   varlen backward  args q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, [alibi_slopes], [sinks],
 *                         [seed]
 *                    rets dq, dk, dv, [dsink]
 *   kvcache          args q [B, Sq, Hq, D], k_cache, v_cache ([B, S, Hk, D] or paged
 *                         [num_pages, page_size, Hk, D]), cache_seqlens [B] (int32),
 *                         [k_new, v_new [B, Sq, Hk, D]], [block_table [B, max_pages] int32],
 *                         [alibi_slopes], [k_scale, v_scale [B, S, Hk] or [num_pages, page_size,
 *                         Hk] f32: a quantized cache, int8 or float8_e4m3fn (docs/caches.md)],
 *                         [k_prefix [P, Hk, D], v_prefix [P, Hk, Dv]: a shared prefix (has_prefix)]
 *                    rets o [B, Sq, Hq, Dv], lse [B, Hq, Sq], and with k_new/v_new k_cache,
 *                         v_cache (aliased to the cache arguments: the updated caches) and for
 *                         a quantized cache k_scale, v_scale (aliased likewise)
 * Every buffer is row-major and dense. The varlen calls take leading (vmapped) dims
 * (vmap_method="expand_dims", as jax_ffi.c's): every buffer gains them, each the vmapped size
 * or 1 where that input was not mapped (the results: the full sizes), and the handler runs one
 * call per flattened leading index, broadcasting the inputs that have a leading 1. With one
 * seed (its leading dims all 1) index i's sequences draw dropout's masks at b = i * B + s
 * (dropout_batch0), as one packed batch of every index's sequences in turn would; with a seed
 * per index, each draws its own from b = s. The kv-cache call has no leading dims (it is
 * called with vmap_method="sequential"). The library validates the lengths and page ids and
 * names the argument; the handlers check what only the buffers' shapes tell. */
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

#define MAX_BUFFERS 16

typedef struct {
    const XLA_FFI_CallFrame *frame;
    fa_problem p;
    int64_t has_new_kv, paged;
    int64_t has_prefix; /* decode: k_prefix and v_prefix follow the other arguments */
    int64_t cache_dtype; /* decode: 0, or FA_INT8 / FA_FP8_E4M3 (a quantized cache) */
    int64_t threads; /* fa_options.threads: 0 the library's default */
    int64_t lead; /* varlen: the number of leading (vmapped) dims, 0 for the kv-cache call */
    const int64_t *lead_dims; /* their full sizes (the first result's) */
    fj_buffer arg[MAX_BUFFERS], ret[MAX_BUFFERS];
    int64_t n_args, n_rets;
} icall;

#define BAD(c, ...) fj_error((c)->frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "flashattn: " __VA_ARGS__)

static XLA_FFI_Error *read_options(icall *c, int decode) {
    const XLA_FFI_CallFrame *f = c->frame;
    fa_problem *p = &c->p;
    int64_t causal, has_scale, has_diag = 0, has_alibi, has_sinks;
    XLA_FFI_Error *e;
    if ((e = fj_attr_i64(f, "causal", &causal)) || (e = fj_attr_i64(f, "window_left", &p->window_left)) ||
        (e = fj_attr_i64(f, "window_right", &p->window_right)) || (e = fj_attr_f32(f, "softcap", &p->softcap)) ||
        (e = fj_attr_i64(f, "has_scale", &has_scale)) || (e = fj_attr_f32(f, "scale", &p->scale)) ||
        (e = fj_attr_i64(f, "has_alibi", &has_alibi)) || (e = fj_attr_i64(f, "threads", &c->threads)) ||
        (e = fj_attr_i64(f, "has_sinks", &has_sinks)))
        return e;
    if (c->threads < 0 || c->threads > INT32_MAX) return BAD(c, "threads = %lld is negative or does not fit int32", (long long)c->threads);
    if (decode) {
        if ((e = fj_attr_i64(f, "has_new_kv", &c->has_new_kv)) || (e = fj_attr_i64(f, "paged", &c->paged)) ||
            (e = fj_attr_i64(f, "cache_dtype", &c->cache_dtype)) || (e = fj_attr_i64(f, "has_prefix", &c->has_prefix)))
            return e;
        if (c->cache_dtype && c->cache_dtype != FA_INT8 && c->cache_dtype != FA_FP8_E4M3)
            return BAD(c, "cache_dtype %lld is not int8 (%d) or fp8_e4m3 (%d)", (long long)c->cache_dtype, FA_INT8,
                       FA_FP8_E4M3);
    } else if ((e = fj_attr_i64(f, "has_diag_offset", &has_diag)) || (e = fj_attr_i64(f, "diag_offset", &p->diag_offset)) ||
               (e = fj_attr_f32(f, "dropout_p", &p->dropout_p))) {
        return e;
    }
    p->causal = causal != 0;
    p->has_scale = has_scale != 0;
    p->has_diag_offset = has_diag != 0;
    p->has_alibi = has_alibi != 0;
    p->has_sinks = has_sinks != 0;
    return NULL;
}

/* Arguments and results named in order; NULL names end each list. */
static XLA_FFI_Error *read_buffers(icall *c, const char *const *args, const char *const *rets) {
    XLA_FFI_Error *e;
    for (c->n_args = 0; args[c->n_args]; c->n_args++)
        if ((e = fj_arg(c->frame, c->n_args, args[c->n_args], &c->arg[c->n_args]))) return e;
    for (c->n_rets = 0; rets[c->n_rets]; c->n_rets++)
        if ((e = fj_ret(c->frame, c->n_rets, rets[c->n_rets], &c->ret[c->n_rets]))) return e;
    if (c->n_args != c->frame->args.size || c->n_rets != c->frame->rets.size)
        return BAD(c, "the call has %lld arguments and %lld results, its options need %lld and %lld",
                   (long long)c->frame->args.size, (long long)c->frame->rets.size, (long long)c->n_args,
                   (long long)c->n_rets);
    return NULL;
}

/* A buffer's data, or for an empty one (XLA may give it no address) a non-NULL address the
 * library will not read: a packed batch with no rows is a valid problem. */
static void *data(const fj_buffer *b) {
    static char empty;
    return b->data ? b->data : &empty;
}

/* Buffer b is `name` of rank n after the call's leading dims (c->lead: each the full size,
 * or 1 for an argument) with those dims want (a negative entry: any) and element type dt. */
static XLA_FFI_Error *expect(const icall *c, const fj_buffer *b, const char *name, int64_t n, const int64_t *want,
                             XLA_FFI_DataType dt) {
    if (b->dtype != dt) return BAD(c, "%s must be %s, got %s", name, fj_dtype_name(dt), fj_dtype_name(b->dtype));
    if (b->rank != n + c->lead)
        return BAD(c, "%s must have rank %lld, got %lld", name, (long long)(n + c->lead), (long long)b->rank);
    const int is_result = b >= c->ret && b < c->ret + MAX_BUFFERS;
    for (int64_t j = 0; j < c->lead; j++)
        if (b->dims[j] != c->lead_dims[j] && (is_result || b->dims[j] != 1))
            return BAD(c, "%s has leading (vmapped) dim %lld where the results have %lld", name, (long long)b->dims[j],
                       (long long)c->lead_dims[j]);
    for (int64_t j = 0; j < n; j++)
        if (want[j] >= 0 && b->dims[c->lead + j] != want[j])
            return BAD(c, "%s has %lld in dim %lld, expected %lld", name, (long long)b->dims[c->lead + j],
                       (long long)j, (long long)want[j]);
    return NULL;
}

/* Buffer b's data for flattened leading index idx (row-major over the full leading dims; a
 * leading dim of 1 broadcasts), as data() for an empty one. */
static void *slice(const icall *c, const fj_buffer *b, int64_t idx) {
    int64_t size = 1, offset = 0;
    for (int64_t j = c->lead; j < b->rank; j++) size *= b->dims[j];
    for (int64_t j = c->lead - 1; j >= 0; j--) {
        const int64_t m = idx % c->lead_dims[j];
        idx /= c->lead_dims[j];
        if (b->dims[j] != 1) offset += m * size;
        size *= b->dims[j];
    }
    return (char *)data(b) + (size_t)offset * fj_elem_bytes(b->dtype);
}

static XLA_FFI_Error *set_dtype(icall *c, XLA_FFI_DataType dt) {
    switch (dt) {
    case XLA_FFI_DataType_F32: c->p.dtype = FA_F32; return NULL;
    case XLA_FFI_DataType_F16: c->p.dtype = FA_F16; return NULL;
    case XLA_FFI_DataType_BF16: c->p.dtype = FA_BF16; return NULL;
    default: return BAD(c, "q must be float32, float16 or bfloat16, got %s", fj_dtype_name(dt));
    }
}

static fa_status plan_cpu(const icall *c, fa_plan **plan) {
    fa_options opt;
    memset(&opt, 0, sizeof opt);
    opt.backend = FA_BACKEND_CPU;
    opt.threads = (int)c->threads;
    return fa_plan_create(&c->p, &opt, plan);
}

/* The sizes both shapes give the problem (the rest differs: lengths, pages). */
static void set_sizes(fa_problem *p, int64_t batch, int64_t hq, int64_t hk, int64_t sq, int64_t sk, int64_t d,
                      int64_t dv) {
    p->batch = batch;
    p->heads_q = hq;
    /* the library reads heads_kv 0 as heads_q: caches with no heads (and a q with some, which
     * the Python front refuses first) must not be read as Hq heads; -1 makes the plan refuse */
    p->heads_kv = hk == 0 && hq > 0 ? -1 : hk;
    p->seq_q = sq;
    p->seq_k = sk;
    p->head_dim = d;
    p->head_dim_v = dv;
}

/* The start every handler shares: the frame answered if XLA only asked for metadata
 * (*answered), else c cleared and its options read (decode: the kv-cache handler's). */
static XLA_FFI_Error *start(XLA_FFI_CallFrame *frame, int decode, icall *c, int *answered) {
    XLA_FFI_Error *e = fj_begin(frame, answered);
    if (e || *answered) return e;
    memset(c, 0, sizeof *c);
    c->frame = frame;
    fa_problem_init(&c->p);
    return read_options(c, decode);
}

/* ---- packed variable-length batches -------------------------------------------------- */

enum { V_Q, V_K, V_V, V_O, V_LSE, V_DO };

static XLA_FFI_Error *varlen(XLA_FFI_CallFrame *frame, int backward) {
    int answered;
    icall c;
    XLA_FFI_Error *e = start(frame, 0, &c, &answered);
    if (e || answered) return e;
    static const char *const fwd_args[] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "alibi_slopes", NULL};
    static const char *const bwd_args[] = {"q", "k", "v", "o", "lse", "do", "cu_seqlens_q", "cu_seqlens_k",
                                           "alibi_slopes", NULL};
    static const char *const fwd_rets[] = {"o", "lse", NULL}, *const bwd_rets[] = {"dq", "dk", "dv", "dsink", NULL};
    const char *args[MAX_BUFFERS], *rets[5];
    const char *const *names = backward ? bwd_args : fwd_args;
    int64_t n = 0, m = 0;
    for (; names[n]; n++) args[n] = names[n];
    if (!c.p.has_alibi) n--; /* slopes last, then sinks */
    const int64_t i_sinks = n;
    if (c.p.has_sinks) args[n++] = "sinks";
    const int64_t i_seed = n;
    if (c.p.dropout_p != 0.0f) args[n++] = "seed";
    args[n] = NULL;
    for (const char *const *rn = backward ? bwd_rets : fwd_rets; rn[m]; m++) rets[m] = rn[m];
    if (backward && !c.p.has_sinks) m--; /* dsink last */
    rets[m] = NULL;
    if ((e = read_buffers(&c, args, rets))) return e;
    const fj_buffer *a = c.arg, *r = c.ret;
    const int64_t cu = backward ? 6 : 3;
    c.lead = a[V_Q].rank - 3; /* leading (vmapped) dims: the results carry them in full */
    if (c.lead < 0 || a[V_K].rank != a[V_Q].rank)
        return BAD(&c, "q and k must have rank 3 ([total, heads, head_dim]; more under vmap), got %lld and %lld",
                   (long long)a[V_Q].rank, (long long)a[V_K].rank);
    if (r[0].rank != a[V_Q].rank)
        return BAD(&c, "%s must have rank %lld, got %lld", rets[0], (long long)a[V_Q].rank, (long long)r[0].rank);
    c.lead_dims = r[0].dims;
    int64_t n_lead = 1;
    for (int64_t j = 0; j < c.lead; j++) n_lead *= c.lead_dims[j];
    const int64_t L = c.lead;
    const XLA_FFI_DataType dt = a[V_Q].dtype;
    if ((e = set_dtype(&c, dt))) return e;
    const int64_t *qd = a[V_Q].dims + L;
    const int64_t Tq = qd[0], Hq = qd[1], D = qd[2];
    const int64_t Tk = a[V_K].dims[L], Hk = a[V_K].dims[L + 1];
    const int64_t kd[3] = {Tk, Hk, D}, vd[3] = {Tk, Hk, -1}, B1[1] = {a[cu].rank == 1 + L ? a[cu].dims[L] : -1};
    if ((e = expect(&c, &a[V_Q], "q", 3, qd, dt)) || (e = expect(&c, &a[V_K], "k", 3, kd, dt)) ||
        (e = expect(&c, &a[V_V], "v", 3, vd, dt)) ||
        (e = expect(&c, &a[cu], "cu_seqlens_q", 1, B1, XLA_FFI_DataType_S32)) ||
        (e = expect(&c, &a[cu + 1], "cu_seqlens_k", 1, B1, XLA_FFI_DataType_S32)))
        return e;
    const int64_t Dv = a[V_V].dims[L + 2], od[3] = {Tq, Hq, Dv}, lsed[2] = {Hq, Tq}, hq[1] = {Hq};
    if (B1[0] < 1) return BAD(&c, "cu_seqlens_q must have batch + 1 >= 1 entries, got %lld", (long long)B1[0]);
    if (c.p.has_alibi && (e = expect(&c, &a[cu + 2], "alibi_slopes", 1, hq, XLA_FFI_DataType_F32))) return e;
    if (c.p.has_sinks && ((e = expect(&c, &a[i_sinks], "sinks", 1, hq, XLA_FFI_DataType_F32)) ||
                          (backward && (e = expect(&c, &c.ret[3], "dsink", 1, hq, XLA_FFI_DataType_F32)))))
        return e;
    const int64_t four[1] = {4};
    if (c.p.dropout_p != 0.0f && (e = expect(&c, &a[i_seed], "seed", 1, four, XLA_FFI_DataType_U32))) return e;
    if (backward) {
        if ((e = expect(&c, &a[V_O], "o", 3, od, dt)) || (e = expect(&c, &a[V_LSE], "lse", 2, lsed, XLA_FFI_DataType_F32)) ||
            (e = expect(&c, &a[V_DO], "do", 3, od, dt)) || (e = expect(&c, &r[0], "dq", 3, qd, dt)) ||
            (e = expect(&c, &r[1], "dk", 3, kd, dt)) || (e = expect(&c, &r[2], "dv", 3, a[V_V].dims + L, dt)))
            return e;
    } else if ((e = expect(&c, &r[0], "o", 3, od, dt)) || (e = expect(&c, &r[1], "lse", 2, lsed, XLA_FFI_DataType_F32))) {
        return e;
    }
    fa_problem *p = &c.p;
    set_sizes(p, B1[0] - 1, Hq, Hk, Tq, Tk, D, Dv);
    /* indices that share the seed (differ only along leading dims it is not mapped along)
     * draw at b = n * B + s, n their index over those dims (fj_dropout_batch0): with one seed
     * for all, those of one packed batch of every index's sequences in turn */
    fa_status s = FA_OK;
    for (int64_t i = 0; i < n_lead && s == FA_OK; i++) {
        /* a plan per index: its lengths (and seed) may be its own, and dropout's b is */
        p->cu_seqlens_q = slice(&c, &a[cu], i);
        p->cu_seqlens_k = slice(&c, &a[cu + 1], i);
        if (c.p.dropout_p != 0.0f) {
            const uint32_t *w = slice(&c, &a[i_seed], i); /* host memory: the CPU platform */
            p->dropout_seed = (uint64_t)w[1] << 32 | w[0];
            p->dropout_offset = (uint64_t)w[3] << 32 | w[2];
            p->dropout_batch0 = fj_dropout_batch0(c.lead_dims, a[i_seed].dims, L, i, p->batch);
        }
        fa_plan *plan = NULL;
        if ((s = plan_cpu(&c, &plan)) != FA_OK) break;
        /* the slopes, sinks and dsink as XLA gave them where it gave no address (no heads) */
        const float *slopes = c.p.has_alibi && a[cu + 2].data ? slice(&c, &a[cu + 2], i) : NULL;
        const float *sinks = c.p.has_sinks && a[i_sinks].data ? slice(&c, &a[i_sinks], i) : NULL;
        if (backward) {
            fa_backward_args b;
            memset(&b, 0, sizeof b);
            b.q = slice(&c, &a[V_Q], i), b.k = slice(&c, &a[V_K], i), b.v = slice(&c, &a[V_V], i);
            b.o = slice(&c, &a[V_O], i), b.lse = slice(&c, &a[V_LSE], i), b.d_o = slice(&c, &a[V_DO], i);
            b.dq = slice(&c, &r[0], i), b.dk = slice(&c, &r[1], i), b.dv = slice(&c, &r[2], i);
            b.alibi_slopes = slopes, b.sinks = sinks, b.dsink = c.p.has_sinks && r[3].data ? slice(&c, &r[3], i) : NULL;
            s = fa_backward(plan, &b);
        } else {
            fa_forward_args f;
            memset(&f, 0, sizeof f);
            f.q = slice(&c, &a[V_Q], i), f.k = slice(&c, &a[V_K], i), f.v = slice(&c, &a[V_V], i);
            f.o = slice(&c, &r[0], i), f.lse = slice(&c, &r[1], i), f.alibi_slopes = slopes, f.sinks = sinks;
            s = fa_forward(plan, &f);
        }
        fa_plan_destroy(plan);
    }
    return s == FA_OK ? NULL : fj_library_error(c.frame->api, s);
}

/* ---- kv-cache decoding ------------------------------------------------------------------ */

static size_t buffer_bytes(const fj_buffer *b) {
    size_t n = fj_elem_bytes(b->dtype);
    for (int64_t j = 0; j < b->rank; j++) n *= (size_t)b->dims[j];
    return n;
}

static XLA_FFI_Error *kvcache(XLA_FFI_CallFrame *frame) {
    int answered;
    icall c;
    XLA_FFI_Error *e = start(frame, 1, &c, &answered);
    if (e || answered) return e;
    const char *args[MAX_BUFFERS];
    int64_t n = 0;
    args[n++] = "q", args[n++] = "k_cache", args[n++] = "v_cache", args[n++] = "cache_seqlens";
    const int64_t i_new = n;
    if (c.has_new_kv) args[n++] = "k", args[n++] = "v";
    const int64_t i_table = n;
    if (c.paged) args[n++] = "block_table";
    const int64_t i_slopes = n;
    if (c.p.has_alibi) args[n++] = "alibi_slopes";
    const int64_t i_sinks = n;
    if (c.p.has_sinks) args[n++] = "sinks";
    const int64_t i_scale = n, quant = c.cache_dtype != 0;
    if (quant) args[n++] = "k_scale", args[n++] = "v_scale";
    const int64_t i_prefix = n;
    if (c.has_prefix) args[n++] = "k_prefix", args[n++] = "v_prefix";
    args[n] = NULL;
    static const char *const rets[] = {"o", "lse", "k_cache (updated)", "v_cache (updated)", "k_scale (updated)",
                                       "v_scale (updated)", NULL};
    static const char *const plain_rets[] = {"o", "lse", "k_cache (updated)", "v_cache (updated)", NULL};
    static const char *const read_only_rets[] = {"o", "lse", NULL};
    if ((e = read_buffers(&c, args, !c.has_new_kv ? read_only_rets : quant ? rets : plain_rets))) return e;
    const fj_buffer *a = c.arg, *r = c.ret;
    if (a[0].rank != 4 || a[1].rank != 4 || a[2].rank != 4)
        return BAD(&c, "q, k_cache and v_cache must have rank 4, got %lld, %lld and %lld", (long long)a[0].rank,
                   (long long)a[1].rank, (long long)a[2].rank);
    const XLA_FFI_DataType dt = a[0].dtype;
    if ((e = set_dtype(&c, dt))) return e;
    const int64_t B = a[0].dims[0], Sq = a[0].dims[1], Hq = a[0].dims[2], D = a[0].dims[3];
    const int64_t rows = a[1].dims[1], Hk = a[1].dims[2], Dv = a[2].dims[3];
    const int64_t kc[4] = {c.paged ? -1 : B, rows, Hk, D}, vc[4] = {a[1].dims[0], rows, Hk, Dv};
    const int64_t lens[1] = {B}, o[4] = {B, Sq, Hq, Dv}, lse[3] = {B, Hq, Sq}, hq[1] = {Hq};
    const int64_t kn[4] = {B, Sq, Hk, D}, vn[4] = {B, Sq, Hk, Dv}, table[2] = {B, -1};
    const XLA_FFI_DataType ct = !quant ? dt : c.cache_dtype == FA_INT8 ? XLA_FFI_DataType_S8 : XLA_FFI_DataType_F8E4M3FN;
    const int64_t sc[3] = {a[1].dims[0], rows, Hk};
    if (quant && ((e = expect(&c, &a[i_scale], "k_scale", 3, sc, XLA_FFI_DataType_F32)) ||
                  (e = expect(&c, &a[i_scale + 1], "v_scale", 3, sc, XLA_FFI_DataType_F32)) ||
                  (c.has_new_kv && ((e = expect(&c, &r[4], "k_scale (updated)", 3, sc, XLA_FFI_DataType_F32)) ||
                                    (e = expect(&c, &r[5], "v_scale (updated)", 3, sc, XLA_FFI_DataType_F32))))))
        return e;
    if ((e = expect(&c, &a[1], "k_cache", 4, kc, ct)) || (e = expect(&c, &a[2], "v_cache", 4, vc, ct)) ||
        (e = expect(&c, &a[3], "cache_seqlens", 1, lens, XLA_FFI_DataType_S32)) ||
        (c.has_new_kv && ((e = expect(&c, &a[i_new], "k", 4, kn, dt)) || (e = expect(&c, &a[i_new + 1], "v", 4, vn, dt)))) ||
        (c.paged && (e = expect(&c, &a[i_table], "block_table", 2, table, XLA_FFI_DataType_S32))) ||
        (c.p.has_alibi && (e = expect(&c, &a[i_slopes], "alibi_slopes", 1, hq, XLA_FFI_DataType_F32))) ||
        (c.p.has_sinks && (e = expect(&c, &a[i_sinks], "sinks", 1, hq, XLA_FFI_DataType_F32))) ||
        (c.has_prefix && ((e = expect(&c, &a[i_prefix], "k_prefix", 3, (int64_t[3]){-1, Hk, D}, dt)) ||
                          (e = expect(&c, &a[i_prefix + 1], "v_prefix", 3,
                                      (int64_t[3]){a[i_prefix].dims[0], Hk, Dv}, dt)))) ||
        (e = expect(&c, &r[0], "o", 4, o, dt)) || (e = expect(&c, &r[1], "lse", 3, lse, XLA_FFI_DataType_F32)) ||
        (c.has_new_kv && ((e = expect(&c, &r[2], "k_cache (updated)", 4, a[1].dims, ct)) ||
                          (e = expect(&c, &r[3], "v_cache (updated)", 4, a[2].dims, ct)))))
        return e;
    fa_problem *p = &c.p;
    set_sizes(p, B, Hq, Hk, Sq, rows, D, Dv);
    p->cache_seqlens = data(&a[3]);
    p->has_new_kv = c.has_new_kv != 0;
    if (quant) p->has_cache_dtype = 1, p->cache_dtype = (fa_dtype)c.cache_dtype;
    if (c.has_prefix) p->shared_prefix_len = a[i_prefix].dims[0];
    if (c.paged) {
        p->page_size = rows;
        p->num_pages = a[1].dims[0];
        p->max_pages = a[i_table].dims[1];
        if (__builtin_mul_overflow(p->max_pages, rows, &p->seq_k))
            return BAD(&c, "block_table's %lld pages of %lld rows overflow", (long long)p->max_pages, (long long)rows);
    }
    fa_plan *plan = NULL;
    fa_status s = plan_cpu(&c, &plan);
    if (s != FA_OK) return fj_library_error(c.frame->api, s);
    /* with new tokens the updated caches are results aliased to the cache arguments
     * (input_output_aliases); where XLA gave separate buffers the caches are copied first,
     * so that the results are the whole updated caches. Without, the caches are only read. */
    void *k = data(&a[1]), *v = data(&a[2]);
    float *ks = quant ? data(&a[i_scale]) : NULL, *vs = quant ? data(&a[i_scale + 1]) : NULL;
    if (c.has_new_kv) {
        for (int j = 1; j <= 2; j++)
            if (r[j + 1].data != a[j].data && buffer_bytes(&a[j])) memcpy(r[j + 1].data, a[j].data, buffer_bytes(&a[j]));
        k = data(&r[2]), v = data(&r[3]);
        for (int j = 0; quant && j < 2; j++)
            if (r[4 + j].data != a[i_scale + j].data && buffer_bytes(&a[i_scale + j]))
                memcpy(r[4 + j].data, a[i_scale + j].data, buffer_bytes(&a[i_scale + j]));
        if (quant) ks = data(&r[4]), vs = data(&r[5]);
    }
    fa_forward_args f;
    memset(&f, 0, sizeof f);
    f.q = data(&a[0]), f.k = k, f.v = v, f.o = data(&r[0]), f.lse = data(&r[1]);
    f.k_new = c.has_new_kv ? data(&a[i_new]) : NULL;
    f.v_new = c.has_new_kv ? data(&a[i_new + 1]) : NULL;
    f.block_table = c.paged ? data(&a[i_table]) : NULL;
    f.alibi_slopes = c.p.has_alibi ? a[i_slopes].data : NULL;
    f.sinks = c.p.has_sinks ? a[i_sinks].data : NULL;
    f.k_scale = ks, f.v_scale = vs;
    if (c.has_prefix) f.k_prefix = data(&a[i_prefix]), f.v_prefix = data(&a[i_prefix + 1]);
    s = fa_forward(plan, &f);
    fa_plan_destroy(plan);
    return s == FA_OK ? NULL : fj_library_error(c.frame->api, s);
}

/* ---- the handlers jax.ffi.register_ffi_target receives ------------------------------- */

FJ_EXPORT XLA_FFI_Error *fa_jax_varlen_forward_cpu(XLA_FFI_CallFrame *frame) { return varlen(frame, 0); }
FJ_EXPORT XLA_FFI_Error *fa_jax_varlen_backward_cpu(XLA_FFI_CallFrame *frame) { return varlen(frame, 1); }
FJ_EXPORT XLA_FFI_Error *fa_jax_kvcache_cpu(XLA_FFI_CallFrame *frame) { return kvcache(frame); }
