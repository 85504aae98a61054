/* flashattn: exact, memory-efficient attention (FlashAttention forward and backward).
 *
 * The one public header. Describe a problem (fa_problem), make a plan from shapes alone
 * (fa_plan_create), ask the plan what the kernel will cost (fa_plan_cost), then run it
 * (fa_forward, fa_backward). What it computes (score order, masks, rounding, what the cost
 * figures mean, status codes): docs/semantics.md; non-finite inputs: docs/nonfinite.md. */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FA_BUILDING_LIBRARY) && defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/* ---- types ------------------------------------------------------------------------ */

/* FA_INT8 and FA_FP8_E4M3 (OCP e4m3fn) are kv-cache element types only (fa_problem.cache_dtype,
 * docs/caches.md): codes with one f32 scale per (token, kv head). */
typedef enum { FA_F32 = 0, FA_F16 = 1, FA_BF16 = 2, FA_INT8 = 3, FA_FP8_E4M3 = 4 } fa_dtype;

typedef enum { FA_BACKEND_AUTO = 0, FA_BACKEND_CPU = 1, FA_BACKEND_CUDA = 2 } fa_backend;

typedef enum { FA_FORWARD = 0, FA_BACKWARD = 1 } fa_pass;

/* Status codes. FA_ERR_INVALID (bad shapes or values), FA_ERR_NULL and FA_ERR_OVERFLOW
 * are the caller's mistakes (the CLI exits 2 for them); the rest are failures (exit 1). */
typedef enum {
    FA_OK = 0,
    FA_ERR_INVALID = 1,     /* a shape, stride or option value is not allowed */
    FA_ERR_NULL = 2,        /* a required pointer is NULL */
    FA_ERR_OVERFLOW = 3,    /* sizes whose products overflow int64 */
    FA_ERR_UNSUPPORTED = 4, /* valid, but not supported by this build or backend */
    FA_ERR_NO_MEMORY = 5,   /* an allocation failed */
    FA_ERR_BACKEND = 6,     /* the backend failed (no device, a CUDA error, ...) */
    FA_ERR_IO = 7,          /* reading or writing a file failed */
    FA_ERR_INTERNAL = 8     /* a bug in flashattn */
} fa_status;

/* Strides are in elements, one per dimension, for [B, H, S, D]-shaped tensors. A stride
 * array of all zeros means contiguous BHSD. Strides must be >= 0, and a tensor's last
 * element must end within int64 bytes of its start (else FA_ERR_OVERFLOW). */
typedef struct {
    int64_t s[4];
} fa_strides;

/* A block-sparse mask (section "masks as data" below, docs/masks.md). */
typedef struct fa_mask fa_mask;

/* The problem: shapes, dtype, options. Make one with fa_problem_init, then set fields. */
typedef struct {
    int64_t batch;      /* B */
    int64_t heads_q;    /* Hq */
    int64_t heads_kv;   /* Hk; Hq must be a multiple of Hk (GQA/MQA) */
    int64_t seq_q;      /* Sq, at most INT32_MAX (FA_ERR_INVALID above) */
    int64_t seq_k;      /* Sk, at most INT32_MAX */
    int64_t head_dim;   /* D, of q and k: 1..FA_MAX_HEAD_DIM */
    int64_t head_dim_v; /* Dv, of v and o: 1..FA_MAX_HEAD_DIM */
    fa_dtype dtype;     /* of q, k, v, o (and do, dq, dk, dv) */

    fa_strides q_stride, k_stride, v_stride, o_stride; /* q's also for dq, k's for dk, v's for dv, o's for do */

    int has_scale; /* 0: scale = 1/sqrt(head_dim) */
    float scale;
    int causal;            /* key j visible to query i if j <= i + off (off: see diag_offset) */
    int64_t window_left;   /* -1 unbounded (the default) */
    int64_t window_right;  /* -1 unbounded (the default) */
    float softcap;         /* 0: off; > 0: s = cap * tanh(s / cap) */
    int has_alibi;         /* slopes [Hq] f32, finite (checked by each call) */
    int has_bias;          /* additive f32 bias [bias_batch, bias_heads, bias_seq_q, Sk] */
    int64_t bias_batch;    /* 1 or B; without has_bias it must stay unset (1, or 0) */
    int64_t bias_heads;    /* 1 or Hq; without has_bias it must stay unset (1, or 0) */
    fa_strides bias_stride; /* all zeros: contiguous; a stride of a size-1 dim is ignored */
    int has_segment_ids;   /* q_segment_ids [B, Sq], kv_segment_ids [B, Sk], int32, contiguous */

    /* Where masks align. Query row i sits at key position i + off: causal shows keys
     * j <= i + off, windows are measured from i + off, ALiBi uses |i + off - j|. By default
     * off = Sk - Sq (bottom-right, as FlashAttention-2); has_diag_offset sets off =
     * diag_offset instead (0: top-left, as PyTorch's is_causal and the Pallas TPU kernel; any
     * value within +-INT32_MAX: a block of a larger problem, as the sequence-parallel code
     * uses; FA_ERR_INVALID outside). It needs something to place: causal, a window or ALiBi
     * (FA_ERR_INVALID without; a mask object carries its own diag_offset). */
    int has_diag_offset;
    int64_t diag_offset;
    /* Bias scale: s += bias_scale * bias (has_bias_scale; else 1). The Pallas TPU kernel adds
     * its bias before scaling, which is bias_scale = scale. Must be finite. Needs has_bias:
     * has_bias_scale without a bias is FA_ERR_INVALID, as bias_grad's is. */
    int has_bias_scale;
    float bias_scale;
    /* The backward also writes dbias (fa_backward_args.dbias, f32, contiguous, the bias's
     * shape [bias_batch, bias_heads, bias_seq_q, Sk], summed over broadcast dims in a fixed order).
     * A plan-time flag so that the backward's cost includes it. Needs has_bias. CPU backend
     * only: a CUDA plan refuses it (FA_ERR_UNSUPPORTED) and AUTO picks the CPU. */
    int bias_grad;

    /* Packed variable-length batches (docs/semantics.md, "Which keys a row sees"):
     * cu_seqlens_q and cu_seqlens_k, host int32 [batch + 1] prefix sums (0 first,
     * non-decreasing, ending at seq_q and seq_k, the packed totals), read and copied at plan
     * time. Sequence b is query rows [cu_q[b], cu_q[b+1]) and key rows [cu_k[b],
     * cu_k[b+1]); every mask applies within it, aligned at its own Sk_b - Sq_b (or
     * diag_offset). All-zero strides then mean the packed layouts
     * q [seq_q, Hq, D], k [seq_k, Hk, D], v [seq_k, Hk, Dv], o [seq_q, Hq, Dv] (stride s[0]
     * unused); lse is [Hq, seq_q]. No bias or segment ids. Both passes. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    /* KV-cache decoding (forward only): cache_seqlens, host int32 [batch], read and copied at
     * plan time. k and v are caches of seq_k = S_cache_max rows per sequence; sequence b
     * attends to rows [0, cache_seqlens[b]) plus, with has_new_kv, the seq_q rows of
     * fa_forward_args k_new/v_new [B, seq_q, Hk, D], written into the caches at rows
     * cache_seqlens[b].. first. Masks align at Sk_b - seq_q (bottom-right per sequence).
     * All-zero strides mean q [B, seq_q, Hq, D], caches [B, seq_k, Hk, D], o [B, seq_q, Hq, Dv];
     * lse is [B, Hq, seq_q]. Cache rows past a sequence's length are never read. No bias or
     * segment ids. */
    const int32_t *cache_seqlens;
    int has_new_kv;
    /* Paged caches (with cache_seqlens): page_size > 0 (a multiple of 16) makes k and v
     * [num_pages, page_size, Hk, D] (strides s[0] per page, s[2] per row) and
     * fa_forward_args.block_table [B, max_pages] int32 maps position t of sequence b to row
     * t % page_size of page block_table[b][t / page_size]; seq_k must be max_pages * page_size. */
    int64_t page_size;
    int64_t num_pages;
    int64_t max_pages;
    /* Attention sinks (docs/semantics.md, "Attention sinks"): a per-head logit sink_h
     * (fa_forward_args.sinks, f32 [Hq], finite) joins each row's softmax denominator and
     * adds nothing to o; lse includes it. The backward takes the same sinks and writes
     * their gradient (fa_backward_args.dsink). CPU backend only. */
    int has_sinks;
    /* Lengths per call (docs/semantics.md, "Lengths per call"): FA_LENGTHS_CACHE makes a
     * kv-cache decoding plan from capacities alone (cache_seqlens NULL; batch, heads, seq_k =
     * S_cache_max, the pages), and each fa_forward passes its lengths in
     * fa_forward_args.cache_seqlens; FA_LENGTHS_PACKED likewise for packed batches
     * (cu_seqlens NULL; seq_q and seq_k the packed tensors' rows, the most a call may use;
     * fa_forward_args.cu_seqlens_q/k; forward only). fa_plan_cost is then the cost at full
     * capacity (decoding: an upper bound of every call; packed: only its workspace, peak
     * bytes and useful flops bound a call's) and fa_plan_cost_lengths the exact cost of
     * given lengths.
     * 0 (FA_LENGTHS_AT_PLAN): the problem's lengths, copied at plan time; a call may pass
     * them again, and then they must be equal. */
    int lengths_per_call;
    /* Shared prefix (cascade; docs/semantics.md, "Shared prefixes"): with kv-cache decoding,
     * every sequence first attends to the same shared_prefix_len keys, fa_forward_args
     * k_prefix [P, Hk, D] and v_prefix [P, Hk, Dv] (contiguous, the dtype), at positions
     * 0 .. P - 1, then to its own cache at positions P + t. One call reads the prefix once
     * for all sequences (each prefix tile against the query heads of every sequence). 0: none. */
    int64_t shared_prefix_len;
    /* Dropout for training (docs/semantics.md, "Dropout"): each p_ij after the softmax is
     * kept with probability about 1 - dropout_p (exactly fa_dropout_keep_rate) and scaled by
     * 1 / (1 - dropout_p), else zeroed; lse stays the undropped normalizer. dropout_p in
     * [0, 1), 0: off. Which elements are kept is a function of (dropout_seed, dropout_offset,
     * b, h, i, j) alone (Philox 4x32-10), the same in the forward and in the backward that
     * regenerates it, for any thread count, tile or instruction set. Dense and packed
     * (cu_seqlens) problems on the CPU; decoding, CUDA and sequence parallel refuse it. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    /* A block-sparse mask (docs/masks.md), NULL: none. Its seq_q and seq_k must be the
     * problem's, its batch 1 or B, its heads 1 or Hq; it combines by AND with causal, window
     * and segment ids. The plan keeps its own reference. Dense problems on the CPU backend. */
    const fa_mask *mask;
    /* The bias's query dim (has_bias): 0 or seq_q, a bias row per query row; 1, one row
     * [bias_batch, bias_heads, 1, Sk] broadcast over every query row (its s[2] stride is
     * ignored), as a key-padding bias is; dbias then has that shape too, summed over the
     * query rows in a fixed order (dbias itself is CPU-only, as bias_grad is). Without
     * has_bias it must be 0 (FA_ERR_INVALID otherwise). */
    int64_t bias_seq_q;
    /* Quantized kv caches (with cache_seqlens; docs/caches.md): has_cache_dtype with
     * cache_dtype FA_INT8 or FA_FP8_E4M3 makes k and v caches of 1-byte codes (strides in
     * elements, as ever), dequantized as code x scale with fa_forward_args k_scale / v_scale;
     * k_new / v_new stay in dtype and are quantized on append (fa_quantize_rows' rule).
     * cache_dtype equal to dtype is the plain cache. Decoding only, CPU backend. */
    int has_cache_dtype;
    fa_dtype cache_dtype;
    /* Dropout's batch index of this problem's batch item 0 (>= 0; 0 by default): the b of
     * (b, h, i, j) above is dropout_batch0 + b, so that calls that each run a part of a
     * batch (a vmapped or sharded one) draw the masks the whole batch would, each passing
     * its first item's index. A packed batch's sequence s is dropout_batch0 + s. */
    int64_t dropout_batch0;
} fa_problem;

/* fa_problem.lengths_per_call */
enum { FA_LENGTHS_AT_PLAN = 0, FA_LENGTHS_CACHE = 1, FA_LENGTHS_PACKED = 2 };

/* The most CPU threads a plan may ask for (fa_options.threads, or OpenMP's default when
 * that is 0); more is FA_ERR_INVALID. OpenMP runtimes fail or crash far above it. */
#define FA_MAX_THREADS 1024

/* The largest head dims (fa_problem.head_dim, head_dim_v); more is FA_ERR_INVALID. The
 * kernels index a row's elements and size their per-thread tiles from them. */
#define FA_MAX_HEAD_DIM 65536

/* Plan options: where and how to run. Zero means "let the library choose". */
typedef struct {
    fa_backend backend; /* AUTO: CUDA for f16/bf16 where built with it and an NVIDIA device
                           node exists, else CPU; check fa_plan_backend() before passing
                           host or device pointers */
    int threads;      /* CPU threads, 1..FA_MAX_THREADS; 0: OpenMP's default */
    int64_t block_q;  /* query rows per tile, both passes; 0: chosen by the library (CUDA runs compiled
                       * tiles: it takes a size only where its forward and backward tiles both have it,
                       * else refuses, and AUTO plans on the CPU) */
    int64_t block_k;  /* keys per tile; 0: chosen by the library */
} fa_options;

/* The analytic cost of one pass (docs/semantics.md, "The plan and what its figures mean"). Exact where fa_plan_exact says so. */
typedef struct {
    int64_t flops;
    int64_t flops_useful;
    int64_t transcendentals;
    int64_t bytes_accessed;
    int64_t min_bytes;
    int64_t workspace_bytes;
    int64_t peak_bytes;
    int64_t naive_peak_bytes;
} fa_cost;

/* What the kernels counted while they ran. */
typedef struct {
    int64_t flops;
    int64_t transcendentals;
} fa_counts;

typedef struct fa_plan fa_plan;

/* Progress of a long call: work items (tiles) done out of total. Called by the CPU backend
 * at most once per percent, from one worker thread at a time; keep it short. */
typedef void (*fa_progress_fn)(void *ctx, int64_t done, int64_t total);

/* Tensors of one forward call. Pointers are host pointers for the CPU backend and device
 * pointers for CUDA. lse may be NULL (the kernel computes it anyway). A feature's tensors
 * (bias, slopes, segment ids, sinks, the decode arrays) are given exactly when the problem has
 * the feature: one given without it is FA_ERR_INVALID, naming it and the flag (it would be
 * ignored), as in fa_backward_args (dbias without bias_grad, dsink without has_sinks).
 * Outputs may not share memory with inputs: FA_ERR_INVALID, naming both, when the bytes
 * of o or lse, from the lowest to the highest address its shape and strides reach, meet
 * those of an input the problem uses (q, k, v, bias, slopes, segment ids, sinks, the
 * decode arrays); inputs may share memory with each other. A decode append writes the
 * caches k and v (and their scales) in place, which is allowed; nothing else may meet
 * them, and no element may be shared between them. An o whose own elements do not each
 * have an address of their own (a stride of 0 over more than one element, strides that
 * do not nest) is refused too (docs/semantics.md, "Tensors and heads"). */
typedef struct {
    const void *q, *k, *v;
    void *o;
    float *lse;                  /* [B, Hq, Sq] contiguous, or NULL */
    const float *bias;           /* when has_bias */
    const float *alibi_slopes;   /* when has_alibi */
    const int32_t *q_segment_ids, *kv_segment_ids; /* when has_segment_ids */
    void *workspace;             /* NULL: the library allocates workspace_bytes itself */
    size_t workspace_size;
    void *stream;                /* CUDA stream (cudaStream_t), NULL for the default */
    fa_counts *counts;           /* if not NULL, receives what the kernels counted */
    fa_progress_fn progress;     /* optional (CPU backend) */
    void *progress_ctx;
    /* Decoding: k_new [B, seq_q, Hk, D] and v_new [B, seq_q, Hk, Dv], contiguous (has_new_kv),
     * are copied into the caches k and v, which must then be writable memory; every
     * argument is checked before anything is written. block_table for paged caches. */
    const void *k_new, *v_new;
    const int32_t *block_table;
    const float *sinks;          /* when has_sinks: [Hq] f32, finite */
    /* The lengths of this call, host int32 (the layouts of fa_problem's): required by a plan
     * with lengths_per_call (cache_seqlens [batch] for FA_LENGTHS_CACHE, cu_seqlens_q/k
     * [batch + 1] for FA_LENGTHS_PACKED, the last entries at most seq_q and seq_k), checked
     * before anything is written; optional for a plan made with lengths, which must then be
     * equal to them (FA_ERR_INVALID names the first that differs). */
    const int32_t *cache_seqlens;
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    /* The shared prefix's keys and values (fa_problem.shared_prefix_len > 0). */
    const void *k_prefix, *v_prefix;
    /* Quantized caches (fa_problem.cache_dtype): one f32 scale per (cache row, kv head), laid
     * out as the cache rows: [B, seq_k, Hk] dense or [num_pages, page_size, Hk] paged,
     * contiguous; finite and >= 0. Appends write the new rows' scales, so they are writable
     * then (cast away const, as the caches). */
    const float *k_scale, *v_scale;
} fa_forward_args;

/* Tensors of one backward call: the forward's inputs, its saved o and lse, and do.
 * As in the forward, an output (dq, dk, dv, dbias, dsink) whose byte range meets an
 * input's is FA_ERR_INVALID naming both. Outputs may interleave (dq, dk and dv in one
 * packed dqkv buffer, at different offsets), but two that share an element are refused
 * (docs/semantics.md says how exactly), and so is dq, dk or dv whose own elements do not
 * each have an address of their own (a zero stride over more than one element, or
 * strides that do not nest). */
typedef struct {
    const void *q, *k, *v, *o, *d_o;
    const float *lse;            /* [B, Hq, Sq] contiguous, required */
    void *dq, *dk, *dv;          /* strided like q, k, v */
    float *dbias;                /* when the problem has bias_grad: [bias_batch, bias_heads, bias_seq_q, Sk] */
    const float *bias;
    const float *alibi_slopes;
    const int32_t *q_segment_ids, *kv_segment_ids;
    void *workspace;
    size_t workspace_size;
    void *stream;
    fa_counts *counts;
    fa_progress_fn progress;     /* optional (CPU backend) */
    void *progress_ctx;
    const float *sinks;          /* when has_sinks: [Hq] f32, finite, as in the forward */
    float *dsink;                /* when has_sinks: [Hq] f32, summed over batch and rows in a fixed order */
} fa_backward_args;

/* ---- masks as data (docs/masks.md) ------------------------------------------------
 * A block-sparse mask: at a granularity of block_q x block_k, per (batch or 1, head or 1)
 * each block is empty (skipped), full (run without per-element masking) or partial (a
 * bitmap of its (i, j) elements). Immutable and reference counted: plans hold a reference,
 * so fa_mask_destroy right after fa_plan_create is fine. A problem's mask (fa_problem.mask)
 * combines by AND with causal, window and segment ids. Constructors set *out to NULL on
 * error and fa_last_error names the problem. */

typedef struct {
    int64_t batch;            /* 1 (the same for every batch item) or B */
    int64_t heads;            /* 1 (the same for every query head) or Hq */
    int64_t seq_q, seq_k;
    int64_t block_q, block_k; /* block edges, 1..4096; 0: 128 each (a FlexAttention BlockMask's) */
} fa_mask_shape;

typedef enum { FA_BLOCK_EMPTY = 0, FA_BLOCK_PARTIAL = 1, FA_BLOCK_FULL = 2 } fa_block_kind;

/* Query row i sits at key position d = i + diag_offset (seq_k - seq_q: bottom-right; 0:
 * top-left). Built in time linear in the number of blocks (plus the partial blocks' bitmaps). */
FA_API fa_status fa_mask_causal(const fa_mask_shape *s, int64_t diag_offset, fa_mask **out); /* j <= d */
/* d - left <= j <= d + right; a side of -1 is unbounded */
FA_API fa_status fa_mask_window(const fa_mask_shape *s, int64_t diag_offset, int64_t left, int64_t right,
                                fa_mask **out);
/* chunked causal (Llama 4's attention_chunk): j <= d and floor(j / chunk) == floor(d / chunk) */
FA_API fa_status fa_mask_chunked(const fa_mask_shape *s, int64_t diag_offset, int64_t chunk, fa_mask **out);
/* prefix-LM: prefix_len[batch] (the mask's batch); j < prefix_len[b] or j <= d */
FA_API fa_status fa_mask_prefix_lm(const fa_mask_shape *s, int64_t diag_offset, const int64_t *prefix_len,
                                   fa_mask **out);
/* documents packed in a sequence: doc_counts[batch]; doc_lengths concatenated, each batch
 * item's summing to seq_q == seq_k; key j visible to row i iff they lie in the same document */
FA_API fa_status fa_mask_documents(const fa_mask_shape *s, const int64_t *doc_counts, const int64_t *doc_lengths,
                                   fa_mask **out);
/* attend [batch, heads, seq_q, seq_k] contiguous, nonzero = attend (time: every element) */
FA_API fa_status fa_mask_from_dense(const fa_mask_shape *s, const uint8_t *attend, fa_mask **out);
/* a predicate, called once per element, nonzero = attend */
typedef int (*fa_mask_fn)(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j);
FA_API fa_status fa_mask_from_fn(const fa_mask_shape *s, fa_mask_fn fn, void *ctx, fa_mask **out);
/* From block kinds (a FlexAttention BlockMask, a splash MaskInfo): kinds [batch, heads, nqb,
 * nkb] of fa_block_kind (int8, nqb = ceil(seq_q / block_q), nkb likewise); bitmaps: for each
 * PARTIAL block in row-major order of kinds, block_q * block_k bytes (nonzero = attend; rows
 * and keys past seq_q / seq_k ignored); NULL when there is no partial block. The kinds are
 * kept as given: every listed block is visited, and no other. */
FA_API fa_status fa_mask_from_blocks(const fa_mask_shape *s, const int8_t *kinds, const uint8_t *bitmaps,
                                     fa_mask **out);
/* Element-wise AND and OR. The shapes must agree: seq_q, seq_k and blocks equal; batch and
 * heads equal or one of them 1 (broadcast). */
FA_API fa_status fa_mask_and(const fa_mask *a, const fa_mask *b, fa_mask **out);
FA_API fa_status fa_mask_or(const fa_mask *a, const fa_mask *b, fa_mask **out);
/* One mask per query head: masks[h] (heads 1 each; seq_q, seq_k and blocks equal; batch
 * equal or 1) is head h's, n >= 1 of them. Each block's kind is kept as that head's mask has
 * it, so the blocks visited are the heads' own. Built in time linear in the blocks (plus the
 * partial blocks' bitmaps): a mask per head needs no dense array. */
FA_API fa_status fa_mask_stack_heads(const fa_mask *const *masks, int64_t n, fa_mask **out);
/* Drops the caller's reference (plans keep their own); NULL is fine. */
FA_API void fa_mask_destroy(fa_mask *m);

/* Queries: the shape (blocks resolved), one block's kind (fa_block_kind; -1 for an index out
 * of range), the dense array [batch, heads, seq_q, seq_k] (1 = attend), and the visible
 * (i, j) pairs, full and partial blocks, summed over the mask's batch and heads. */
FA_API fa_status fa_mask_get_shape(const fa_mask *m, fa_mask_shape *out);
FA_API int fa_mask_block(const fa_mask *m, int64_t b, int64_t h, int64_t qb, int64_t kb);
FA_API fa_status fa_mask_to_dense(const fa_mask *m, uint8_t *attend);
FA_API fa_status fa_mask_stats(const fa_mask *m, int64_t *visible_pairs, int64_t *full_blocks,
                               int64_t *partial_blocks);

/* ---- describe a problem ----------------------------------------------------------- */

/* Zeroes p and sets defaults: f32, windows -1, heads_kv = heads_q and Dv = D when left 0. */
FA_API void fa_problem_init(fa_problem *p);

/* ---- plan ------------------------------------------------------------------------- */

/* Validates the problem and options and fixes block sizes. No tensor data, no allocation
 * beyond the plan. On error *out is NULL and fa_last_error() names the problem. A plan is
 * not changed by the calls: several threads may run fa_forward / fa_backward on one plan at
 * once (each its own tensors and workspace; fa_last_error is per thread), and destroy it
 * once none is running. */
FA_API fa_status fa_plan_create(const fa_problem *p, const fa_options *opt, fa_plan **out);
FA_API void fa_plan_destroy(fa_plan *plan);

/* ---- query the plan --------------------------------------------------------------- */

/* The plan's cost of a pass (docs/semantics.md). A plan whose backward the library does not
 * run (kv-cache decoding, lengths per call: fa_backward refuses it, naming why) states a
 * backward of all zeros, and fa_plan_blocks gives it 0 x 0 tiles. */
FA_API fa_status fa_plan_cost(const fa_plan *plan, fa_pass pass, fa_cost *out);
/* The exact cost of one call with these lengths (those the plan's kind takes, the others
 * NULL; checked as fa_forward checks them): what that call's counts report. O(batch). For
 * a plan made with lengths, they must be its own (or all NULL: fa_plan_cost's figures). */
FA_API fa_status fa_plan_cost_lengths(const fa_plan *plan, fa_pass pass, const int32_t *cache_seqlens,
                                      const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, fa_cost *out);
/* 1 when the cost figures are exact; 0 when they are an upper bound (segment ids). */
FA_API int fa_plan_exact(const fa_plan *plan);
FA_API fa_backend fa_plan_backend(const fa_plan *plan);
/* The tiles a pass runs (block_q x block_k); 0s for a pass other than FA_FORWARD or
 * FA_BACKWARD (fa_last_error says why) and for the backward of a plan that has none
 * (fa_plan_cost); nothing written for a NULL plan. */
FA_API void fa_plan_blocks(const fa_plan *plan, fa_pass pass, int64_t *block_q, int64_t *block_k);
FA_API int fa_plan_threads(const fa_plan *plan);
/* The problem the plan runs, validated: strides, scale and the other defaults resolved;
 * valid while the plan lives (NULL for a NULL plan). Its length arrays are the plan's own
 * copies, and NULL in a plan made from capacities (lengths_per_call: a call's lengths come in
 * fa_forward_args), so that fa_plan_create takes it again for the same plan. */
FA_API const fa_problem *fa_plan_problem(const fa_plan *plan);
/* The scale the kernels use (the default resolved). */
FA_API float fa_plan_scale(const fa_plan *plan);

/* ---- run -------------------------------------------------------------------------- */

FA_API fa_status fa_forward(const fa_plan *plan, const fa_forward_args *args);
FA_API fa_status fa_backward(const fa_plan *plan, const fa_backward_args *args);

/* ---- compose attention states ------------------------------------------------------ */

/* Merges two attention states over disjoint key sets into the state over their union
 * (FlashInfer's merge_state; docs/semantics.md, "Merging attention states"): per row r and
 * head h, lse = logaddexp(lse_a, lse_b) and o = (e^(lse_a - lse) o_a + e^(lse_b - lse) o_b),
 * computed in double, rounded to f32 and then to dtype. o_* [rows, heads, head_dim_v] of dtype and
 * lse_* [rows, heads] f32, contiguous; an empty state (lse = -inf) contributes nothing, and
 * two empty ones give o = 0, lse = -inf. sinks (NULL: none) are attention-sink logits
 * [heads] f32: the inputs then exclude the sink and the merge adds it once, to the
 * denominator only (lse = logaddexp(lse_a, lse_b, sink)). o and lse may be o_a / o_b and
 * lse_a / lse_b (in place); other overlaps are not allowed. head_dim_v 0 merges the lse
 * alone (o_a, o_b and o unused, NULL allowed). */
FA_API fa_status fa_merge_states(fa_dtype dtype, int64_t rows, int64_t heads, int64_t head_dim_v, const void *o_a,
                                 const float *lse_a, const void *o_b, const float *lse_b, const float *sinks, void *o,
                                 float *lse);
/* ---- dropout ---------------------------------------------------------------------- */

/* The fraction of elements dropout keeps at dropout_p: T / 256 with T = round(256 (1 - p))
 * (docs/semantics.md, "Dropout"); -1 if p is not in [0, 1). */
FA_API double fa_dropout_keep_rate(float dropout_p);
/* The keep mask the kernels use: out[r * n_cols + c] = 1 if element (b, h, i0 + r, j0 + c)
 * of a problem with this dropout_p, seed and offset is kept, else 0 (for a packed batch, b
 * is the sequence and i, j count within it). For tests and for users who recompute the
 * dropped weights. FA_ERR_INVALID for a p outside [0, 1) or negative indices or counts. */
FA_API fa_status fa_dropout_keep_mask(float dropout_p, uint64_t seed, uint64_t offset, int64_t b, int64_t h,
                                      int64_t i0, int64_t n_rows, int64_t j0, int64_t n_cols, uint8_t *out);

/* ---- errors and environment ------------------------------------------------------- */

FA_API const char *fa_status_string(fa_status s);
/* The message of the last failed call on this thread ("" if none). fa_plan_create,
 * fa_forward, fa_backward, fa_merge_states and fa_plan_cost_lengths clear it when they
 * start, so after one of them succeeds it is "" again; the other calls leave it alone when
 * they succeed. */
FA_API const char *fa_last_error(void);
/* 1 if this build has the CUDA backend and a device is present. */
FA_API int fa_cuda_available(void);
/* The CPU microkernel set in use ("scalar", "avx512", ...); FA_ISA forces one ("none" where
 * FA_ISA names a set this CPU or build cannot run: fa_last_error says why, as plans refuse it). */
FA_API const char *fa_cpu_isa(void);
/* Exponentials a second that kernel set's exp reaches on threads threads at once (rows of
 * 128 scores in L1, as the forward calls it; best of a few repetitions, about 0.1 s): the
 * figure `flashattn calibrate` (docs/cli.md) feeds its time model. 0 if threads is not in
 * 1..FA_MAX_THREADS, or FA_ISA names a kernel set this CPU cannot run (fa_cpu_isa then gives
 * "none" and fa_last_error says why). */
FA_API double fa_cpu_exp_rate(int threads);

/* ---- dtypes and host buffers ------------------------------------------------------ */

FA_API const char *fa_dtype_name(fa_dtype t);
/* Bytes per element: 4 for f32, 2 for f16 and bf16, 1 for int8 and fp8_e4m3; 0 for a value
 * that is not an fa_dtype. */
FA_API size_t fa_dtype_size(fa_dtype t);
/* Converts n elements of dtype from at src into dtype to at dst, rounding as the kernels
 * round (to nearest, ties to even; NaN stays NaN: docs/semantics.md, "Rounding"); the same
 * dtype is a copy. f16 <-> bf16 goes through f32, which is exact. int8 and fp8_e4m3 convert
 * as codes with scale 1 (fa_quantize_rows' rounding, clamped or saturated; NaN to int8 is 0).
 * src and dst may not overlap. A dtype that is not an fa_dtype, a NULL src or dst with
 * n > 0, or src and dst sharing memory, converts nothing, writes nothing and leaves the reason in fa_last_error() (a
 * successful call leaves fa_last_error() as it was). */
FA_API void fa_convert(fa_dtype from, const void *src, fa_dtype to, void *dst, size_t n);
/* Quantizes rows of a kv cache (docs/caches.md): rows x width elements of dtype from
 * (f32, f16 or bf16; contiguous) into codes of dtype to (FA_INT8 or FA_FP8_E4M3; rows x width
 * bytes) and scales[rows] (f32), each row with scale = amax / 127 (int8) or amax / 448
 * (fp8), 1 where amax is 0, and codes x / scale rounded to nearest even, clamped to +-127 or
 * saturated to +-448. A non-finite element, or src, codes and scales sharing memory, is
 * FA_ERR_INVALID, and nothing is written. */
FA_API fa_status fa_quantize_rows(fa_dtype to, fa_dtype from, const void *src, int64_t rows, int64_t width,
                                  void *codes, float *scales);
/* malloc and free, the allocator of the library's own buffers. In a build with the test-only
 * allocation-failure injection (CMake FA_ALLOC_FAILURE_INJECTION, FA_ALLOC_FAIL_AT in
 * docs/environment.md) a program's allocations through these are counted with the library's,
 * so a test can make any one of them fail (the command line allocates through them). */
FA_API void *fa_malloc(size_t bytes);
FA_API void fa_free(void *p); /* NULL is fine */

/* ---- device memory and timing (a CUDA build; otherwise each returns FA_ERR_UNSUPPORTED,
 * "flashattn was built without CUDA"). Errors set fa_last_error(). ------------------- */

FA_API fa_status fa_cuda_malloc(void **ptr, size_t bytes);
FA_API void fa_cuda_free(void *ptr); /* NULL is fine */
FA_API fa_status fa_cuda_memcpy_to_device(void *dst, const void *src, size_t bytes);
FA_API fa_status fa_cuda_memcpy_to_host(void *dst, const void *src, size_t bytes);
FA_API fa_status fa_cuda_synchronize(void);
/* Free and total bytes of the current device. */
FA_API fa_status fa_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* n elements of dtype dt, uniform in [-amp, amp) from a counter-based hash of seed (the same
 * values for the same seed); asynchronous on the default stream. */
FA_API fa_status fa_cuda_fill_random(void *ptr, size_t n, fa_dtype dt, uint64_t seed, float amp);
/* Events for timing on a stream (NULL: the default stream). */
FA_API fa_status fa_cuda_event_create(void **ev);
FA_API void fa_cuda_event_destroy(void *ev);
FA_API fa_status fa_cuda_event_record(void *ev, void *stream);
/* Milliseconds between two recorded events (waits for the second). */
FA_API fa_status fa_cuda_event_elapsed_ms(void *start, void *end, float *ms);

/* ---- bindings ---------------------------------------------------------------------- */

/* Which public struct fa_struct_size measures. Language bindings that mirror the structs
 * (the Python package) compare their sizes at load time, so a stale mirror fails loudly. */
typedef enum {
    FA_STRUCT_PROBLEM = 0,
    FA_STRUCT_OPTIONS = 1,
    FA_STRUCT_COST = 2,
    FA_STRUCT_COUNTS = 3,
    FA_STRUCT_FORWARD_ARGS = 4,
    FA_STRUCT_BACKWARD_ARGS = 5
} fa_struct_id;
/* sizeof the struct named by which, as this library was compiled; 0 for an unknown id. */
FA_API size_t fa_struct_size(int which);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
