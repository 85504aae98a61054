/* Plans: validate a problem and resolve its defaults, ask the backend table (backend.h)
 * which backend runs it and with which tiles, then let the cost model fill in what the
 * kernels will cost. Shapes only, no tensor data. The passes go to the plan's backend
 * after the one argument check (args.c). */
#include "backend.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Largest tile edge accepted; scratch grows with it and nothing gains beyond it. */
#define FA_MAX_BLOCK 4096

void fa_problem_init(fa_problem *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->dtype = FA_F32;
    p->window_left = -1;
    p->window_right = -1;
    p->bias_batch = 1;
    p->bias_heads = 1;
}

static fa_status check_positive(const char *name, int64_t v) {
    if (v <= 0) return fa_error(FA_ERR_INVALID, "%s must be positive, got %lld", name, (long long)v);
    return FA_OK;
}

/* Sizes that may be 0 (an empty problem: fa_problem_empty); head dims may not. */
static fa_status check_size(const char *name, int64_t v) {
    if (v < 0) return fa_error(FA_ERR_INVALID, "%s must be >= 0, got %lld", name, (long long)v);
    return FA_OK;
}

fa_status fa_check_reach(const char *name, const fa_strides *st, const int64_t dims[4], int64_t es) {
    for (int i = 0; i < 4; i++)
        if (dims[i] == 0) return FA_OK; /* no elements: nothing is addressed */
    int64_t last = 0, bytes;
    for (int i = 0; i < 4; i++) {
        int64_t t;
        if (__builtin_mul_overflow(dims[i] - 1, st->s[i], &t) || __builtin_add_overflow(last, t, &last))
            return fa_error(FA_ERR_OVERFLOW, "%s strides reach beyond int64 offsets", name);
    }
    /* the kernels address base + offset x element size: an element offset that fits can
     * still wrap as bytes (and read another batch item's rows) */
    if (__builtin_add_overflow(last, 1, &bytes) || __builtin_mul_overflow(bytes, es, &bytes))
        return fa_error(FA_ERR_OVERFLOW, "%s strides reach element offset %lld, whose byte offset (%lld bytes an "
                                         "element) overflows int64", name, (long long)last, (long long)es);
    return FA_OK;
}

/* Fills all-zero strides with contiguous ones, rejects negative strides, and checks that
 * the largest byte offset fits int64. dims: the tensor's [B, H, S, D]; es: bytes an element. */
static fa_status resolve_strides(const char *name, fa_strides *st, const int64_t dims[4], int64_t es) {
    int zero = 1;
    for (int i = 0; i < 4; i++) {
        if (st->s[i] < 0)
            return fa_error(FA_ERR_INVALID, "%s's stride of dim %d (%s) is negative: %lld", name, i,
                            fa_stride_dim_name(i), (long long)st->s[i]);
        if (st->s[i] != 0) zero = 0;
    }
    if (zero) {
        int64_t acc = 1;
        for (int i = 3; i >= 0; i--) {
            st->s[i] = acc;
            if (__builtin_mul_overflow(acc, dims[i], &acc))
                return fa_error(FA_ERR_OVERFLOW, "%s has more elements than int64 can count", name);
        }
    }
    return fa_check_reach(name, st, dims, es);
}

static fa_status check_counts(const fa_problem *p) {
    /* every tensor's element count must fit int64 (the score matrix too: the naive figure),
     * with a margin: 8 bytes an element, and 128 rows or keys (a tile's scratch). A packed
     * batch's seq_q and seq_k are its totals: its tensors are [total, heads, dim] and its
     * naive scores [heads, total_q, total_k] (cost.c), no batch factor. */
    const int packed = p->cu_seqlens_q || p->cu_seqlens_k || p->lengths_per_call == FA_LENGTHS_PACKED;
    const int64_t b = packed ? 1 : p->batch;
    int64_t dims[][4] = {{b, p->heads_q, p->seq_q, p->head_dim},
                         {b, p->heads_kv, p->seq_k, p->head_dim},
                         {b, p->heads_kv, p->seq_k, p->head_dim_v},
                         {b, p->heads_q, p->seq_q, p->head_dim_v},
                         {b, p->heads_q, p->seq_q, p->seq_k}};
    const char *names[] = {"q", "k", "v", "o", "the score matrix"};
    for (int t = 0; t < 5; t++) {
        int64_t n = 8 * 128; /* bytes of a double, the widest element anyone stores, x a tile */
        /* a zero size counts as 1: an empty problem's per-row and per-tile sizes (tiles of
         * head_dim columns, a row's bytes) must fit int64 all the same */
        for (int i = 0; i < 4; i++)
            if (__builtin_mul_overflow(n, dims[t][i] ? dims[t][i] : 1, &n))
                return fa_error(FA_ERR_OVERFLOW,
                                "%s [%lld, %lld, %lld, %lld] is too large: the library counts its bytes, and a "
                                "tile's, in int64 with a margin of 1024 (8-byte elements, 128-row tiles), and "
                                "that overflows", names[t],
                                (long long)dims[t][0], (long long)dims[t][1], (long long)dims[t][2],
                                (long long)dims[t][3]);
    }
    return FA_OK;
}

/* The scalar fields, and the defaults of heads_kv and head_dim_v: what a backend's
 * supports needs to see. */
static fa_status validate_scalars(fa_plan *pl) {
    fa_problem *p = &pl->p;
    fa_status s;
    if (p->heads_kv == 0) p->heads_kv = p->heads_q;
    if (p->head_dim_v == 0) p->head_dim_v = p->head_dim;
    if ((s = check_size("batch", p->batch)) || (s = check_size("heads_q", p->heads_q)) ||
        (s = check_size("heads_kv", p->heads_kv)) || (s = check_size("seq_q", p->seq_q)) ||
        (s = check_size("seq_k", p->seq_k)) || (s = check_positive("head_dim", p->head_dim)) ||
        (s = check_positive("head_dim_v", p->head_dim_v)))
        return s;
    /* the kernels index a row's elements with int and size their tiles by rows x D */
    if (p->head_dim > FA_MAX_HEAD_DIM || p->head_dim_v > FA_MAX_HEAD_DIM)
        return fa_error(FA_ERR_INVALID, "head dims are too large: head_dim %lld, head_dim_v %lld (at most %d each)",
                        (long long)p->head_dim, (long long)p->head_dim_v, FA_MAX_HEAD_DIM);
    /* segment ids index with int32 (and the schedule's arithmetic assumes lengths < 2^31) */
    if (p->seq_q > INT32_MAX || p->seq_k > INT32_MAX)
        return fa_error(FA_ERR_INVALID, "sequence lengths are limited to %d, got seq_q %lld, seq_k %lld", INT32_MAX,
                        (long long)p->seq_q, (long long)p->seq_k);
    if (p->heads_kv > 0 && p->heads_q % p->heads_kv != 0) /* (heads_kv is 0 only with heads_q 0) */
        return fa_error(FA_ERR_INVALID, "heads_q (%lld) is not a multiple of heads_kv (%lld)",
                        (long long)p->heads_q, (long long)p->heads_kv);
    if (p->dtype != FA_F32 && p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_error(FA_ERR_INVALID, "dtype %d is not f32, f16 or bf16", (int)p->dtype);
    if (p->has_cache_dtype && p->cache_dtype != p->dtype && !fa_dtype_quantized(p->cache_dtype))
        return fa_error(FA_ERR_INVALID, "cache_dtype %s (%d) must be the dtype (%s), int8 or fp8_e4m3",
                        fa_dtype_name(p->cache_dtype), (int)p->cache_dtype, fa_dtype_name(p->dtype));
    if ((s = check_counts(p))) return s;
    if (p->has_scale && !isfinite(p->scale))
        return fa_error(FA_ERR_INVALID, "scale must be finite, got %g", (double)p->scale);
    if (!isfinite(p->softcap) || p->softcap < 0)
        return fa_error(FA_ERR_INVALID, "softcap must be finite and >= 0 (0 = off), got %g", (double)p->softcap);
    /* s * (1 / softcap): below 2^-126 the reciprocal overflows (0 * inf = NaN scores); above
     * 2^100 every score under softcap * 2^-126 becomes subnormal there, which a caller's
     * flush-to-zero (XLA sets it) turns into 0 rather than into s (docs/semantics.md) */
    if (p->softcap > 0 && (p->softcap < FLT_MIN || p->softcap > 0x1p100f))
        return fa_error(FA_ERR_INVALID, "softcap must be 0 (off) or within [2^-126, 2^100] = [%g, %g], got %g",
                        (double)FLT_MIN, (double)0x1p100f, (double)p->softcap);
    if (p->window_left < -1 || p->window_right < -1)
        return fa_error(FA_ERR_INVALID, "window (%lld, %lld): each side must be >= -1 (-1 = unbounded)",
                        (long long)p->window_left, (long long)p->window_right);
    if (p->has_diag_offset && (p->diag_offset < -(int64_t)INT32_MAX || p->diag_offset > (int64_t)INT32_MAX))
        return fa_error(FA_ERR_INVALID, "diag_offset must be within +-%d, got %lld", INT32_MAX,
                        (long long)p->diag_offset);
    /* a diagonal that places nothing would be ignored silently: a caller's mistake */
    if (p->has_diag_offset && !fa_sched_aligns(p->causal, p->window_left, p->window_right, p->has_alibi))
        return fa_error(FA_ERR_INVALID, "diag_offset (has_diag_offset) places causal, a window or ALiBi, and none is set "
                                        "(a mask object carries its own diag_offset)");
    if (p->has_bias_scale && !isfinite(p->bias_scale))
        return fa_error(FA_ERR_INVALID, "bias_scale must be finite, got %g", (double)p->bias_scale);
    if (p->lengths_per_call < FA_LENGTHS_AT_PLAN || p->lengths_per_call > FA_LENGTHS_PACKED)
        return fa_error(FA_ERR_INVALID, "lengths_per_call must be 0, FA_LENGTHS_CACHE (1) or FA_LENGTHS_PACKED (2), got %d",
                        p->lengths_per_call);
    /* the bias's fields without a bias would be ignored silently: a caller's mistake */
    if (p->bias_grad && !p->has_bias)
        return fa_error(FA_ERR_INVALID, "bias_grad needs a bias (has_bias)");
    if (p->has_bias_scale && !p->has_bias)
        return fa_error(FA_ERR_INVALID, "bias_scale (has_bias_scale) needs a bias (has_bias)");
    /* (0 and 1 are both unset: fa_problem_init's 1, or a problem zeroed by its caller) */
    if (!p->has_bias && ((p->bias_batch != 0 && p->bias_batch != 1) || (p->bias_heads != 0 && p->bias_heads != 1) ||
                         p->bias_seq_q != 0))
        return fa_error(FA_ERR_INVALID, "bias_batch, bias_heads and bias_seq_q need a bias (has_bias): got %lld, %lld, "
                                        "%lld without one (unset: 1, 1, 0)",
                        (long long)p->bias_batch, (long long)p->bias_heads, (long long)p->bias_seq_q);
    if (!p->has_bias && (p->bias_stride.s[0] || p->bias_stride.s[1] || p->bias_stride.s[2] || p->bias_stride.s[3]))
        return fa_error(FA_ERR_INVALID, "bias_stride needs a bias (has_bias): got {%lld, %lld, %lld, %lld} without one "
                                        "(unset: all zeros)",
                        (long long)p->bias_stride.s[0], (long long)p->bias_stride.s[1], (long long)p->bias_stride.s[2],
                        (long long)p->bias_stride.s[3]);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f)) /* NaN fails too */
        return fa_error(FA_ERR_INVALID, "dropout_p must be in [0, 1) (0 = off), got %g", (double)p->dropout_p);
    int64_t last;
    if (p->dropout_batch0 < 0 || __builtin_add_overflow(p->dropout_batch0, p->batch, &last))
        return fa_error(FA_ERR_INVALID, "dropout_batch0 must be >= 0 with dropout_batch0 + batch within int64, got %lld",
                        (long long)p->dropout_batch0);
    return FA_OK;
}

/* The inference shapes' arrays, the strides, the bias's broadcast dims, and flags made 0/1. */
static fa_status validate_layout(fa_plan *pl) {
    fa_problem *p = &pl->p;
    fa_status s;
    if ((s = fa_validate_inference(pl))) return s; /* varlen and decode: plan_inference.c */

    int64_t qd[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim};
    int64_t kd[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim};
    int64_t vd[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim_v};
    int64_t od[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim_v};
    const int64_t es = (int64_t)fa_dtype_size(p->dtype), kv_es = (int64_t)fa_dtype_size(fa_cache_dtype(p));
    if ((s = resolve_strides("q", &p->q_stride, qd, es)) || (s = resolve_strides("k", &p->k_stride, kd, kv_es)) ||
        (s = resolve_strides("v", &p->v_stride, vd, kv_es)) || (s = resolve_strides("o", &p->o_stride, od, es)))
        return s;
    if (p->has_bias) {
        if (p->bias_batch != 1 && p->bias_batch != p->batch)
            return fa_error(FA_ERR_INVALID, "bias batch dim is %lld but must be 1 or batch (%lld)",
                            (long long)p->bias_batch, (long long)p->batch);
        if (p->bias_heads != 1 && p->bias_heads != p->heads_q)
            return fa_error(FA_ERR_INVALID, "bias heads dim is %lld but must be 1 or heads_q (%lld)",
                            (long long)p->bias_heads, (long long)p->heads_q);
        if (p->bias_seq_q == 0) p->bias_seq_q = p->seq_q;
        if (p->bias_seq_q != 1 && p->bias_seq_q != p->seq_q)
            return fa_error(FA_ERR_INVALID, "bias seq_q dim is %lld but must be 1 or seq_q (%lld) (0 = seq_q)",
                            (long long)p->bias_seq_q, (long long)p->seq_q);
        int64_t bd[4] = {p->bias_batch, p->bias_heads, p->bias_seq_q, p->seq_k};
        for (int i = 0; i < 3; i++) /* a size-1 dim's stride is ignored (flashattn.h), its sign too */
            if (bd[i] == 1 && p->bias_stride.s[i] < 0) p->bias_stride.s[i] = 0;
        if ((s = resolve_strides("bias", &p->bias_stride, bd, (int64_t)sizeof(float)))) return s;
        /* broadcast dims read the same slice whatever their stride says */
        if (p->bias_batch == 1) p->bias_stride.s[0] = 0;
        if (p->bias_heads == 1) p->bias_stride.s[1] = 0;
        if (p->bias_seq_q == 1) p->bias_stride.s[2] = 0;
    }
    if (p->has_bias && !p->has_bias_scale) p->bias_scale = 1.0f, p->has_bias_scale = 1;
    p->bias_grad = p->bias_grad != 0;
    p->has_alibi = p->has_alibi != 0;
    p->has_bias = p->has_bias != 0;
    p->has_segment_ids = p->has_segment_ids != 0;
    p->causal = p->causal != 0;
    p->has_sinks = p->has_sinks != 0;
    return FA_OK;
}

static fa_status check_block(const char *name, int64_t v) {
    if (v < 0 || v > FA_MAX_BLOCK)
        return fa_error(FA_ERR_INVALID, "%s must be in [1, %d] (0 = default), got %lld", name, FA_MAX_BLOCK,
                        (long long)v);
    return FA_OK;
}

/* Asks the backend table: the one named, or for AUTO the first whose supports says yes
 * and whose device is present (the GPU where built and found, for what it runs; else the
 * CPU); a refusal is the last backend's, in its words. */
static fa_status choose_backend(fa_plan *pl, const fa_options *o) {
    fa_backend b = o->backend;
    if (b != FA_BACKEND_AUTO && b != FA_BACKEND_CPU && b != FA_BACKEND_CUDA)
        return fa_error(FA_ERR_INVALID, "backend %d is not auto, cpu or cuda", (int)b);
    if (o->threads < 0 || o->threads > FA_MAX_THREADS)
        return fa_error(FA_ERR_INVALID, "threads must be 1..%d (0 = default), got %d", FA_MAX_THREADS, o->threads);
    fa_status s;
    if ((s = check_block("block_q", o->block_q)) || (s = check_block("block_k", o->block_k))) return s;
    if (b != FA_BACKEND_AUTO) {
        pl->be = fa_backend_of(b);
        s = pl->be->supports(&pl->p, FA_FORWARD, 0);
        if (!s && pl->be->takes_blocks) s = pl->be->takes_blocks(&pl->p, o);
    } else {
        int n;
        const fa_backend_entry *const *order = fa_backend_order(&n);
        for (int i = 0; i < n; i++) {
            if (order[i]->present && !order[i]->present()) continue;
            pl->be = order[i];
            s = pl->be->supports(&pl->p, FA_FORWARD, FA_USE_RUN);
            if (!s && pl->be->takes_blocks) s = pl->be->takes_blocks(&pl->p, o);
            if (!s) break;
        }
        if (!s) fa_clear_error(); /* a backend passed over is no failure of the call's */
    }
    pl->backend = pl->be->id;
    return s;
}

fa_status fa_plan_create(const fa_problem *problem, const fa_options *opt, fa_plan **out) {
    fa_fork_guard();
    fa_clear_error();
    if (!out) return fa_error(FA_ERR_NULL, "fa_plan_create: out is NULL");
    *out = NULL;
    if (!problem) return fa_error(FA_ERR_NULL, "fa_plan_create: problem is NULL");
    fa_options defaults = {0};
    if (!opt) opt = &defaults;

    fa_plan *pl = fa_calloc(1, sizeof *pl);
    if (!pl) return fa_error(FA_ERR_NO_MEMORY, "fa_plan_create: cannot allocate the plan");
    pl->p = *problem;
    pl->batch0 = problem->dropout_batch0; /* dropout's b of batch item 0 (a packed batch: its sequences') */
    fa_status s = validate_scalars(pl);
    if (!s) s = choose_backend(pl, opt);
    if (!s) s = validate_layout(pl);
    if (!s) s = fa_mask_check_problem(pl->p.mask, &pl->p); /* mask.c */
    if (!s) { /* the masks' alignment first: the tiles are chosen from the walk it gives */
        pl->off = fa_sched_off(pl->p.seq_q, pl->p.seq_k, pl->p.has_diag_offset, pl->p.diag_offset);
        s = pl->be->choose_blocks(pl, opt);
    }
    if (!s) {
        pl->scale = pl->p.has_scale ? pl->p.scale : (float)(1.0 / sqrt((double)pl->p.head_dim));
        pl->p.scale = pl->scale;
        pl->p.has_scale = 1;
        s = fa_cost_compute(pl);
    }
    if (s) {
        fa_free(pl->lens);
        fa_free(pl);
        return s;
    }
    fa_mask_retain(pl->p.mask);
    /* a capacity plan's lengths are stand-ins (plan_inference.c, capacity_lens): the caller
     * gives lengths with each call, and fa_plan_create refuses a lengths_per_call problem with
     * lengths, so the problem it shows has none */
    pl->shown = pl->p;
    if (pl->capacity) pl->shown.cu_seqlens_q = pl->shown.cu_seqlens_k = pl->shown.cache_seqlens = NULL;
    *out = pl;
    return FA_OK;
}

void fa_plan_destroy(fa_plan *plan) {
    if (plan) fa_free(plan->lens), fa_mask_destroy((fa_mask *)plan->p.mask);
    fa_free(plan);
}

fa_status fa_plan_cost(const fa_plan *plan, fa_pass pass, fa_cost *out) {
    if (!plan || !out) return fa_error(FA_ERR_NULL, "fa_plan_cost: %s is NULL", plan ? "out" : "plan");
    if (pass != FA_FORWARD && pass != FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "fa_plan_cost: pass %d is not FA_FORWARD or FA_BACKWARD", (int)pass);
    *out = pass == FA_FORWARD ? plan->fwd : plan->bwd;
    return FA_OK;
}

/* Not for segment ids (their tiles skip by the data) nor for a plan made from capacities
 * (lengths per call: its figures are the capacity's; a call's own are fa_plan_cost_lengths). */
int fa_plan_exact(const fa_plan *plan) { return plan && !plan->p.has_segment_ids && !plan->capacity; }
fa_backend fa_plan_backend(const fa_plan *plan) { return plan ? plan->backend : FA_BACKEND_AUTO; }
int fa_plan_threads(const fa_plan *plan) { return plan ? plan->threads : 0; }
const fa_problem *fa_plan_problem(const fa_plan *plan) { return plan ? &plan->shown : NULL; }
float fa_plan_scale(const fa_plan *plan) { return plan ? plan->scale : 0.0f; }

void fa_plan_blocks(const fa_plan *plan, fa_pass pass, int64_t *block_q, int64_t *block_k) {
    if (!plan) return;
    const int ok = pass == FA_FORWARD || pass == FA_BACKWARD; /* else 0s and the reason, as fa_plan_cost says */
    if (!ok) fa_error(FA_ERR_INVALID, "fa_plan_blocks: pass %d is not FA_FORWARD or FA_BACKWARD", (int)pass);
    const int none = pass == FA_BACKWARD && plan->bwd_none; /* a plan with no backward: 0 x 0 */
    if (block_q) *block_q = !ok || none ? 0 : pass == FA_BACKWARD ? plan->bwd_bq : plan->fwd_bq;
    if (block_k) *block_k = !ok || none ? 0 : pass == FA_BACKWARD ? plan->bwd_bk : plan->fwd_bk;
}

fa_status fa_forward(const fa_plan *plan, const fa_forward_args *args) {
    fa_clear_error();
    if (!plan) return fa_error(FA_ERR_NULL, "fa_forward: plan is NULL");
    fa_status s = fa_error_in(plan->be->supports(&plan->p, FA_FORWARD, FA_USE_RUN), "fa_forward");
    fa_plan view; /* the plan with this call's lengths (lengths.c) */
    const fa_plan *use = plan;
    if (!s && args)
        s = fa_call_plan(plan, args->cache_seqlens, args->cu_seqlens_q, args->cu_seqlens_k, "fa_forward", &view, &use);
    if (!s) s = fa_check_forward_args(&use->p, args, use->fwd.workspace_bytes, plan->backend == FA_BACKEND_CPU,
                                      "fa_forward");
    if (!s) s = fa_check_forward_overlaps(&use->p, args, "fa_forward");
    return s ? s : plan->be->forward(use, args);
}

fa_status fa_backward(const fa_plan *plan, const fa_backward_args *args) {
    fa_clear_error();
    if (!plan) return fa_error(FA_ERR_NULL, "fa_backward: plan is NULL");
    /* decoding has no backward */
    fa_status s = fa_error_in(plan->be->supports(&plan->p, FA_BACKWARD, FA_USE_RUN), "fa_backward");
    if (!s) s = fa_check_backward_args(&plan->p, args, plan->bwd.workspace_bytes, plan->backend == FA_BACKEND_CPU,
                                       "fa_backward");
    if (!s) s = fa_check_backward_overlaps(&plan->p, args, "fa_backward");
    return s ? s : plan->be->backward(plan, args);
}
