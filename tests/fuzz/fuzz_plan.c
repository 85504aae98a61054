/* Fuzzes fa_plan_create on arbitrary fa_problem and fa_options contents. It must never
 * crash, hang or overflow (UBSan), and whatever it answers must hold together: a failure
 * has a known status, a message and no plan; a plan has positive blocks and threads, a
 * resolved finite scale, strides filled in, and costs that are non-negative and add up
 * (peak >= min + workspace, equal where every row sees every key, and naive peak >= min,
 * except for kv caches, whose min_bytes counts traffic, not storage; useful flops <=
 * flops), the same on a second call. Each integer field is either a small value, one of the
 * edges below, or 8 raw bytes, so the decoder reaches both the valid region and the overflow
 * boundaries. */
#include "flashattn.h"
#define FUZZ_HARNESS "plan"
#include "fuzz_bytes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const int64_t EDGES[] = {0, 1, 2, 3, 7, 8, 64, 127, 128, 129, 256, 4096, 4097, 65536,
                                INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 32, (int64_t)1 << 40,
                                (int64_t)1 << 62, INT64_MAX / 8, INT64_MAX / 4, INT64_MAX - 4, INT64_MAX,
                                -1, -2, INT64_MIN / 4, INT64_MIN};

static int64_t take_i64(fuzz_bytes *b) {
    uint64_t sel = take_u64(b, 1);
    if (sel < 128) return (int64_t)sel;                       /* small */
    if (sel < 224) return EDGES[(sel - 128) % (sizeof EDGES / sizeof EDGES[0])];
    if (sel < 240) return -(int64_t)take_u64(b, 1);          /* small negative */
    int64_t v;
    take_raw(b, &v, sizeof v);
    return v;
}

static float take_f32(fuzz_bytes *b) {
    static const float VALUES[] = {0.0f, 1.0f, 0.125f, 30.0f, -1.0f, -0.0f, 1e-45f, 3.4e38f, INFINITY, -INFINITY, NAN};
    uint64_t sel = take_u64(b, 1);
    if (sel < 192) return VALUES[sel % (sizeof VALUES / sizeof VALUES[0])];
    float f;
    take_raw(b, &f, sizeof f);
    return f;
}

static void take_strides(fuzz_bytes *b, fa_strides *s) {
    if (take_u64(b, 1) < 160) return; /* contiguous (all zero) most of the time */
    for (int i = 0; i < 4; i++) s->s[i] = take_i64(b);
}

/* Length arrays (cu_seqlens, cache_seqlens) live here: the plan copies them, the harness
 * owns them. Entries are small steps (a prefix sum when cumulative) or raw int32s. */
#define MAX_LENS 65
static int32_t lens_q[MAX_LENS], lens_k[MAX_LENS], lens_cache[MAX_LENS];

static const int32_t *take_lens(fuzz_bytes *b, int32_t *out, int64_t n, int cumulative) {
    int32_t acc = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t sel = take_u64(b, 1);
        /* the step wraps in uint32 (an earlier raw entry may be near INT32_MAX): the
         * harness itself must not overflow; a non-monotonic result is the plan's to refuse */
        const int32_t step = (int32_t)(sel % 40);
        if (sel < 200 && cumulative) acc = i ? (int32_t)((uint32_t)acc + (uint32_t)step) : 0;
        else if (sel < 200) acc = step;
        else take_raw(b, &acc, sizeof acc);
        out[i] = acc;
    }
    return out;
}

/* Most fields get a value the decoder chose; mode 0 takes the whole struct as raw bytes
 * (its pointers then cleared: a caller's pointers must be valid, which bytes cannot say). */
static void decode(fuzz_bytes *b, fa_problem *p, fa_options *o, int *opt_null) {
    uint64_t mode = take_u64(b, 1);
    *opt_null = (mode & 0x80) != 0;
    if ((mode & 0x7f) == 0) {
        take_raw(b, p, sizeof *p);
        take_raw(b, o, sizeof *o);
        p->cu_seqlens_q = p->cu_seqlens_k = p->cache_seqlens = NULL;
        p->mask = NULL; /* a mask is an object the library's constructors made: bytes cannot be one */
        if (p->batch < 1 || p->batch > MAX_LENS) p->lengths_per_call = 0; /* O(batch) capacities: bounded batches */
        return;
    }
    fa_problem_init(p);
    p->batch = take_i64(b), p->heads_q = take_i64(b), p->heads_kv = take_i64(b);
    p->seq_q = take_i64(b), p->seq_k = take_i64(b);
    p->head_dim = take_i64(b), p->head_dim_v = take_i64(b);
    p->dtype = (fa_dtype)take_range(b, -1, 3);
    take_strides(b, &p->q_stride), take_strides(b, &p->k_stride);
    take_strides(b, &p->v_stride), take_strides(b, &p->o_stride);
    uint64_t flags = take_u64(b, 2);
    p->has_scale = flags & 1, p->causal = (flags >> 1) & 1, p->has_alibi = (flags >> 2) & 1;
    p->has_bias = (flags >> 3) & 1, p->has_segment_ids = (flags >> 4) & 1;
    p->has_diag_offset = (flags >> 5) & 1, p->has_bias_scale = (flags >> 6) & 1;
    p->bias_grad = (flags >> 7) & 1, p->has_new_kv = (flags >> 13) & 1;
    if (p->has_scale) p->scale = take_f32(b);
    if ((flags >> 9) & 1) p->softcap = take_f32(b);
    if ((flags >> 10) & 1) p->window_left = take_i64(b);
    if ((flags >> 11) & 1) p->window_right = take_i64(b);
    if (p->has_bias) {
        p->bias_batch = take_i64(b), p->bias_heads = take_i64(b);
        take_strides(b, &p->bias_stride);
    }
    if (p->has_diag_offset) p->diag_offset = take_i64(b);
    if (p->has_bias_scale) p->bias_scale = take_f32(b);
    if ((flags >> 8) & 1 && p->batch >= 1 && p->batch < MAX_LENS) { /* packed variable-length */
        p->cu_seqlens_q = take_lens(b, lens_q, p->batch + 1, 1);
        p->cu_seqlens_k = take_lens(b, lens_k, p->batch + 1, 1);
    }
    if ((flags >> 12) & 1 && p->batch >= 1 && p->batch <= MAX_LENS) { /* kv-cache decoding */
        p->cache_seqlens = take_lens(b, lens_cache, p->batch, 0);
        if ((flags >> 14) & 1) p->page_size = take_i64(b), p->num_pages = take_i64(b), p->max_pages = take_i64(b);
    }
    if ((flags >> 15) & 1 && p->batch >= 1 && p->batch <= MAX_LENS) { /* lengths per call: capacities only */
        p->lengths_per_call = (int)take_range(b, -1, 3);
        if (p->lengths_per_call == FA_LENGTHS_CACHE) p->cache_seqlens = NULL;
        if (p->lengths_per_call == FA_LENGTHS_PACKED) p->cu_seqlens_q = p->cu_seqlens_k = NULL;
    }
    if ((flags >> 16) & 1) p->shared_prefix_len = take_i64(b);
    o->backend = (fa_backend)take_range(b, -1, 3);
    o->threads = (int)take_range(b, -2, 64);
    o->block_q = take_i64(b), o->block_k = take_i64(b);
}

static void check_cost(const fa_plan *pl, fa_pass pass) {
    fa_cost c;
    FUZZ_CHECK(fa_plan_cost(pl, pass, &c) == FA_OK, "pass %d", (int)pass);
    const fa_problem *p = fa_plan_problem(pl);
    const int kv_cache = p->cache_seqlens || p->lengths_per_call == FA_LENGTHS_CACHE;
    const int empty = !p->batch || !p->heads_q || !p->seq_q || !p->seq_k; /* docs/semantics.md */
    if (pass == FA_BACKWARD && kv_cache) { /* decoding is forward only: all zero */
        FUZZ_CHECK(c.flops == 0 && c.bytes_accessed == 0 && c.min_bytes == 0 && c.peak_bytes == 0,
                   "decode's backward figures are not 0");
        return;
    }
    FUZZ_CHECK(c.flops >= 0 && c.flops_useful >= 0 && c.transcendentals >= 0 && c.bytes_accessed >= 0 &&
                   (empty ? c.min_bytes >= 0 : c.min_bytes > 0) && c.workspace_bytes >= 0 && c.naive_peak_bytes >= 0,
               "pass %d: a negative figure", (int)pass);
    /* peak holds each tensor once, plus the workspace. min_bytes reads only what a row that
     * sees a key needs (docs/semantics.md, the plan's figures): the q rows that see a key,
     * the keys some row sees, the bias at visible pairs. So peak >= min + workspace, equal
     * when every row sees every key (no causal, no window, and keys to see). For a kv cache
     * min_bytes counts its valid rows, and appended rows both read (k_new) and written (the
     * cache), so there the two figures are not comparable. */
    if (!kv_cache) {
        /* dense and not empty only: a packed batch's sequences may have no keys */
        const int all_visible = !p->causal && p->window_left < 0 && p->window_right < 0 && p->seq_k > 0 &&
                                !p->mask && !p->cu_seqlens_q && !p->lengths_per_call && !empty;
        FUZZ_CHECK(all_visible ? c.peak_bytes == c.min_bytes + c.workspace_bytes
                               : c.peak_bytes >= c.min_bytes + c.workspace_bytes,
                   "pass %d: peak %lld min %lld workspace %lld (every key visible: %d)", (int)pass,
                   (long long)c.peak_bytes, (long long)c.min_bytes, (long long)c.workspace_bytes, all_visible);
        FUZZ_CHECK(c.naive_peak_bytes >= c.min_bytes, "pass %d", (int)pass);
    } else {
        FUZZ_CHECK(c.peak_bytes > c.workspace_bytes, "pass %d: peak %lld workspace %lld", (int)pass,
                   (long long)c.peak_bytes, (long long)c.workspace_bytes);
    }
    FUZZ_CHECK(c.flops_useful <= c.flops, "pass %d: useful %lld > flops %lld", (int)pass, (long long)c.flops_useful,
               (long long)c.flops);
    const int64_t rows = p->heads_q * p->seq_q * (p->cu_seqlens_q ? 1 : p->batch); /* seq_q: packed total */
    if (pass == FA_FORWARD) /* one log per query row at least */
        FUZZ_CHECK(c.transcendentals >= rows, "forward transcendentals %lld, rows %lld", (long long)c.transcendentals,
                   (long long)rows);
    int64_t bq = 0, bk = 0;
    fa_plan_blocks(pl, pass, &bq, &bk);
    FUZZ_CHECK(bq >= 1 && bq <= 4096 && bk >= 1 && bk <= 4096, "pass %d blocks %lld x %lld", (int)pass, (long long)bq,
               (long long)bk);
}

static void check_plan(const fa_plan *pl, const fa_problem *in) {
    const fa_problem *p = fa_plan_problem(pl);
    /* zero sizes make an empty problem (docs/semantics.md); head dims stay positive */
    FUZZ_CHECK(p->batch >= 0 && p->heads_q >= 0 && p->heads_kv >= 0 && p->seq_q >= 0 && p->seq_k >= 0 &&
                   p->head_dim > 0 && p->head_dim_v > 0,
               "a negative or zero head dimension was accepted");
    FUZZ_CHECK(p->heads_kv ? p->heads_q % p->heads_kv == 0 : p->heads_q == 0, "heads %lld / %lld",
               (long long)p->heads_q, (long long)p->heads_kv);
    FUZZ_CHECK(p->batch == in->batch && p->heads_q == in->heads_q && p->seq_q == in->seq_q && p->seq_k == in->seq_k &&
                   p->head_dim == in->head_dim,
               "the plan changed the problem's shape");
    FUZZ_CHECK(p->window_left >= -1 && p->window_right >= -1, "windows");
    FUZZ_CHECK(isfinite(fa_plan_scale(pl)) && isfinite(p->softcap) && p->softcap >= 0, "scale/softcap");
    const fa_strides *st[] = {&p->q_stride, &p->k_stride, &p->v_stride, &p->o_stride};
    for (int t = 0; t < 4; t++)
        FUZZ_CHECK(st[t]->s[0] || st[t]->s[1] || st[t]->s[2] || st[t]->s[3], "tensor %d strides left all zero", t);
    fa_backend be = fa_plan_backend(pl);
    FUZZ_CHECK(be == FA_BACKEND_CPU || be == FA_BACKEND_CUDA, "backend %d", (int)be);
    FUZZ_CHECK(fa_plan_threads(pl) >= 1, "threads %d", fa_plan_threads(pl));
    FUZZ_CHECK(fa_plan_exact(pl) == !p->has_segment_ids, "exact");
    check_cost(pl, FA_FORWARD);
    check_cost(pl, FA_BACKWARD);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_bytes b = {data, size};
    fa_problem p;
    fa_options o = {0};
    int opt_null = 0;
    decode(&b, &p, &o, &opt_null);
    fa_plan *pl = (fa_plan *)1;
    fa_status s = fa_plan_create(&p, opt_null ? NULL : &o, &pl);
    if (s != FA_OK) {
        FUZZ_CHECK(pl == NULL, "a failed plan_create left *out set");
        FUZZ_CHECK(s >= FA_ERR_INVALID && s <= FA_ERR_INTERNAL && s != FA_ERR_INTERNAL, "status %d", (int)s);
        FUZZ_CHECK(fa_last_error()[0] != 0, "status %s without a message", fa_status_string(s));
        return 0;
    }
    check_plan(pl, &p);
    /* the same inputs give the same plan */
    fa_plan *again = NULL;
    FUZZ_CHECK(fa_plan_create(&p, opt_null ? NULL : &o, &again) == FA_OK, "second plan_create failed");
    for (int pass = 0; pass < 2; pass++) {
        fa_cost c1, c2;
        fa_plan_cost(pl, (fa_pass)pass, &c1), fa_plan_cost(again, (fa_pass)pass, &c2);
        FUZZ_CHECK(c1.flops == c2.flops && c1.bytes_accessed == c2.bytes_accessed && c1.peak_bytes == c2.peak_bytes,
                   "pass %d costs differ between two identical plans", pass);
    }
    fa_plan_destroy(again);
    fa_plan_destroy(pl);
    return 0;
}
