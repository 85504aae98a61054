/* What a plan made from capacities (fa_problem.lengths_per_call) bounds, docs/semantics.md
 * "Lengths per call": for decoding every figure of any call (a window cutting the keys,
 * random capacities), for packed batches the workspace, peak bytes and useful flops (fixed
 * and random capacities, and the tiles a shorter sequence may widen to). A call's own cost
 * is fa_plan_cost_lengths'; the calls themselves run in test_lengths_per_call.c. FA_TEST_SEED
 * reproduces a run. */
#include "ref/ref.h"
#include "check.h"

static uint64_t rng;

/* A plan made from capacities and its forward cost (NULL, counted as a failure, if either fails). */
static fa_plan *capacity_plan(const fa_problem *p, const fa_options *opt, const char *label, fa_cost *cap) {
    fa_plan *pl = NULL;
    if (fa_plan_create(p, opt, &pl) == FA_OK && fa_plan_cost(pl, FA_FORWARD, cap) == FA_OK) {
        /* its figures are the capacity's, not a call's: not exact (a call's: fa_plan_cost_lengths) */
        CHECK(!fa_plan_exact(pl), "%s: a plan made from capacities says its figures are exact", label);
        return pl;
    }
    CHECK(0, "%s: plan: %s", label, fa_last_error());
    fa_plan_destroy(pl);
    return NULL;
}

/* A window cuts the keys of a plan made from capacities: every length a call may pass runs
 * in a workspace of the plan's own workspace_bytes and costs at most the plan's cost (a
 * window of 600 keys over 1536 crosses 2 chunks at full capacity and 3 at 1025 keys, and
 * more tiles at some lengths: both bounds once missed that), with the output and the exact
 * cost of a fresh plan made with that length. */
static void window_workspace(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 4, p.heads_kv = 1, p.head_dim = 16, p.seq_q = 1, p.seq_k = 1536, p.dtype = FA_F32;
    p.causal = 1, p.window_left = 600, p.lengths_per_call = FA_LENGTHS_CACHE;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = 2;
    fa_cost cap;
    fa_plan *one = capacity_plan(&p, &opt, "window workspace", &cap);
    if (!one) return;
    const int64_t nc = p.seq_k * p.head_dim, nq = p.heads_q * p.head_dim;
    float *k = tu_alloc(sizeof(float) * (size_t)nc), *v = tu_alloc(sizeof(float) * (size_t)nc);
    float *q = tu_alloc(sizeof(float) * (size_t)nq), *o = tu_alloc(sizeof(float) * (size_t)nq);
    float *o2 = tu_alloc(sizeof(float) * (size_t)nq);
    void *ws = tu_alloc((size_t)cap.workspace_bytes);
    tu_fill(&rng, FA_F32, k, nc, 2.0), tu_fill(&rng, FA_F32, v, nc, 1.0), tu_fill(&rng, FA_F32, q, nq, 2.0);
    for (int32_t len = 1; len <= p.seq_k && !failures; len += len < 1000 ? 37 : len < 1100 ? 1 : 29) {
        fa_forward_args a = {0};
        a.q = q, a.k = k, a.v = v, a.o = o, a.cache_seqlens = &len, a.workspace = ws;
        a.workspace_size = (size_t)cap.workspace_bytes;
        tu_poison(FA_F32, o, nq);
        fa_status st = fa_forward(one, &a);
        CHECK(st == FA_OK, "window workspace: %d keys in the plan's %lld bytes: %s", len, (long long)cap.workspace_bytes,
              fa_last_error());
        fa_problem fresh = p;
        fresh.lengths_per_call = 0, fresh.cache_seqlens = &len;
        fa_plan *pl = NULL;
        if (st || fa_plan_create(&fresh, &opt, &pl)) break;
        fa_cost want, got; /* the call's own figures are its lengths', not the capacity's bound */
        fa_plan_cost_lengths(one, FA_FORWARD, &len, NULL, NULL, &want), fa_plan_cost(pl, FA_FORWARD, &got);
        CHECK(!memcmp(&want, &got, sizeof got), "window workspace: %d keys: fa_plan_cost_lengths differs from a fresh "
              "plan's cost (workspace %lld vs %lld)", len, (long long)want.workspace_bytes, (long long)got.workspace_bytes);
        CHECK(got.flops <= cap.flops && got.transcendentals <= cap.transcendentals &&
                  got.bytes_accessed <= cap.bytes_accessed && got.workspace_bytes <= cap.workspace_bytes &&
                  got.peak_bytes <= cap.peak_bytes,
              "window workspace: %d keys: the call's cost passes the capacity plan's (flops %lld vs %lld, bytes %lld "
              "vs %lld, workspace %lld vs %lld)", len, (long long)got.flops, (long long)cap.flops,
              (long long)got.bytes_accessed, (long long)cap.bytes_accessed, (long long)got.workspace_bytes,
              (long long)cap.workspace_bytes);
        fa_forward_args a2 = {0};
        a2.q = q, a2.k = k, a2.v = v, a2.o = o2;
        st = fa_forward(pl, &a2);
        fa_plan_destroy(pl);
        CHECK(st == FA_OK && !memcmp(o, o2, sizeof(float) * (size_t)nq), "window workspace: %d keys: o differs from a "
              "fresh plan's", len);
    }
    free(k), free(v), free(q), free(o), free(o2), free(ws);
    fa_plan_destroy(one);
}


/* What a packed capacity plan bounds (docs/semantics.md, "Lengths per call"): the workspace,
 * peak bytes and useful flops of every call, here 400 random splits of its rows and keys
 * into 4 sequences each, without a mask, causal, with a window, f32 and bf16 (the tiles then
 * depend on a sequence's keys). */
static void packed_bounds(void) {
    for (int mode = 0; mode < 3; mode++)
        for (int bf = 0; bf < 2; bf++) {
            fa_problem p;
            fa_problem_init(&p);
            p.batch = 4, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 128, p.seq_q = 2600, p.seq_k = 2600;
            p.dtype = bf ? FA_BF16 : FA_F32, p.causal = mode > 0, p.window_left = mode == 2 ? 700 : -1;
            p.lengths_per_call = FA_LENGTHS_PACKED;
            fa_options opt = {0};
            opt.backend = FA_BACKEND_CPU, opt.threads = 2;
            fa_cost cap;
            fa_plan *one = capacity_plan(&p, &opt, "packed bounds", &cap);
            if (!one) return;
            for (int call = 0; call < 400 && !failures; call++) {
                int32_t cq[5] = {0}, ck[5] = {0};
                for (int b = 0; b < 4; b++) {
                    cq[b + 1] = cq[b] + (int32_t)tu_int(&rng, 0, p.seq_q - cq[b]);
                    ck[b + 1] = call % 2 ? cq[b + 1] : ck[b] + (int32_t)tu_int(&rng, 0, p.seq_k - ck[b]);
                }
                fa_cost c;
                fa_status st = fa_plan_cost_lengths(one, FA_FORWARD, NULL, cq, ck, &c);
                CHECK(st == FA_OK && c.workspace_bytes <= cap.workspace_bytes && c.peak_bytes <= cap.peak_bytes &&
                          c.flops_useful <= cap.flops_useful,
                      "packed bounds: mode %d %s, cu_seqlens_q %d %d %d %d, cu_seqlens_k %d %d %d %d: workspace %lld "
                      "(capacity %lld), peak %lld (%lld), useful %lld (%lld)%s%s",
                      mode, bf ? "bf16" : "f32", cq[1], cq[2], cq[3], cq[4], ck[1], ck[2], ck[3], ck[4],
                      (long long)c.workspace_bytes, (long long)cap.workspace_bytes, (long long)c.peak_bytes,
                      (long long)cap.peak_bytes, (long long)c.flops_useful, (long long)cap.flops_useful,
                      st ? ": " : "", st ? fa_last_error() : "");
            }
            fa_plan_destroy(one);
        }
}

/* The workspace bound where a sequence's tiles depend on its lengths the most: bf16, D of
 * 128 or 256, 2048 keys and more (wider key tiles where a window's walk allows them), a
 * window with an explicit diagonal offset; the capacity's one sequence once chose narrower
 * tiles than a shorter call (167 x 2545 rows, window 53 82, offset 95: 394496 bytes, a call
 * of 91 x 2478 426752). 40 random capacities, 20 calls each (the first the case above). */
static void packed_bounds_wide_tiles(void) {
    for (int it = 0; it < 40 && !failures; it++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = it ? tu_int(&rng, 1, 3) : 1, p.heads_q = p.heads_kv = it ? tu_int(&rng, 1, 2) : 2;
        p.head_dim = p.head_dim_v = it && tu_int(&rng, 0, 1) ? 128 : 256, p.dtype = FA_BF16;
        p.seq_q = it ? tu_int(&rng, 1, 600) : 167, p.seq_k = it ? tu_int(&rng, 2048, 3200) : 2545;
        p.causal = it ? (int)tu_int(&rng, 0, 1) : 1;
        p.window_left = it ? tu_int(&rng, 0, 300) : 53, p.window_right = it ? tu_int(&rng, -1, 300) : 82;
        p.has_diag_offset = 1, p.diag_offset = it ? tu_int(&rng, -200, 2600) : 95;
        p.lengths_per_call = FA_LENGTHS_PACKED;
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CPU, opt.threads = it ? (int)tu_int(&rng, 1, 2) : 1;
        fa_cost cap;
        fa_plan *one = capacity_plan(&p, &opt, "packed bounds (wide tiles)", &cap);
        if (!one) return;
        for (int call = 0; call < 20 && !failures; call++) {
            int32_t cq[4] = {0}, ck[4] = {0};
            for (int64_t b = 0; b < p.batch; b++) {
                cq[b + 1] = cq[b] + (int32_t)tu_int(&rng, 0, p.seq_q - cq[b]);
                ck[b + 1] = ck[b] + (int32_t)tu_int(&rng, 0, p.seq_k - ck[b]);
            }
            if (!it && !call) cq[1] = 91, ck[1] = 2478;
            fa_cost c;
            fa_status st = fa_plan_cost_lengths(one, FA_FORWARD, NULL, cq, ck, &c);
            CHECK(st == FA_OK && c.workspace_bytes <= cap.workspace_bytes && c.peak_bytes <= cap.peak_bytes,
                  "packed bounds (wide tiles): %lld x %lld D %lld window %lld %lld offset %lld, a call of %d x %d: "
                  "workspace %lld (capacity %lld), peak %lld (%lld)%s%s",
                  (long long)p.seq_q, (long long)p.seq_k, (long long)p.head_dim, (long long)p.window_left,
                  (long long)p.window_right, (long long)p.diag_offset, cq[1], ck[1], (long long)c.workspace_bytes,
                  (long long)cap.workspace_bytes, (long long)c.peak_bytes, (long long)cap.peak_bytes, st ? ": " : "",
                  st ? fa_last_error() : "");
        }
        fa_plan_destroy(one);
    }
}

/* The same bounds over random capacities: Sq != Sk, GQA, causal, a window finite on both
 * sides or one, an explicit diagonal offset, chosen tiles, 1 or 2 threads; 30 random splits
 * each (empty sequences too) into up to 5 sequences, of which the first runs in a workspace
 * of the plan's own workspace_bytes with counts equal to fa_plan_cost_lengths. flops,
 * transcendentals, bytes_accessed and min_bytes are not bounds (a sequence aligned
 * otherwise than the one capacity sequence can see more keys): their largest ratios to the
 * capacity's are printed, the figures docs/semantics.md quotes. */
static void packed_bounds_random(void) {
    double most[4] = {0, 0, 0, 0}; /* flops, transcendentals, bytes_accessed, min_bytes */
    int cases = 0, calls = 0;
    for (int it = 0; it < 300 && !failures; it++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = tu_int(&rng, 1, 5), p.heads_kv = tu_int(&rng, 1, 2), p.heads_q = p.heads_kv * tu_int(&rng, 1, 3);
        p.seq_q = tu_int(&rng, 1, 400), p.seq_k = tu_int(&rng, 1, 400);
        p.head_dim = 8 * tu_int(&rng, 1, 8), p.head_dim_v = 8 * tu_int(&rng, 1, 8);
        p.dtype = tu_int(&rng, 0, 1) ? FA_BF16 : FA_F32;
        const int mode = (int)tu_int(&rng, 0, 3); /* none, causal, window, causal with a diagonal offset */
        if (mode == 1 || mode == 3) p.causal = 1;
        if (mode == 2) p.window_left = tu_int(&rng, -1, 60), p.window_right = tu_int(&rng, -1, 60);
        if (mode == 3) p.has_diag_offset = 1, p.diag_offset = tu_int(&rng, -100, 100);
        p.lengths_per_call = FA_LENGTHS_PACKED;
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CPU, opt.threads = (int)tu_int(&rng, 1, 2);
        if (tu_int(&rng, 0, 1)) opt.block_q = tu_int(&rng, 1, 160), opt.block_k = tu_int(&rng, 1, 160);
        fa_cost cap;
        fa_plan *one = capacity_plan(&p, &opt, "packed bounds (random)", &cap);
        if (!one) return;
        cases++;
        for (int split = 0; split < 30 && !failures; split++) {
            int32_t cq[6] = {0}, ck[6] = {0};
            for (int64_t b = 0; b < p.batch; b++) {
                cq[b + 1] = cq[b] + (int32_t)tu_int(&rng, 0, (p.seq_q - cq[b]) * 2 / (p.batch - b));
                ck[b + 1] = ck[b] + (int32_t)tu_int(&rng, 0, (p.seq_k - ck[b]) * 2 / (p.batch - b));
                if (cq[b + 1] > p.seq_q) cq[b + 1] = (int32_t)p.seq_q;
                if (ck[b + 1] > p.seq_k) ck[b + 1] = (int32_t)p.seq_k;
            }
            fa_cost c;
            const fa_status st = fa_plan_cost_lengths(one, FA_FORWARD, NULL, cq, ck, &c);
            CHECK(st == FA_OK && c.workspace_bytes <= cap.workspace_bytes && c.peak_bytes <= cap.peak_bytes &&
                      c.flops_useful <= cap.flops_useful,
                  "packed bounds (random) case %d split %d: B %lld Sq %lld Sk %lld mode %d tiles %lld x %lld: workspace "
                  "%lld (capacity %lld), peak %lld (%lld), useful %lld (%lld)%s%s",
                  it, split, (long long)p.batch, (long long)p.seq_q, (long long)p.seq_k, mode, (long long)opt.block_q,
                  (long long)opt.block_k, (long long)c.workspace_bytes, (long long)cap.workspace_bytes,
                  (long long)c.peak_bytes, (long long)cap.peak_bytes, (long long)c.flops_useful,
                  (long long)cap.flops_useful, st ? ": " : "", st ? fa_last_error() : "");
            const int64_t got[4] = {c.flops, c.transcendentals, c.bytes_accessed, c.min_bytes};
            const int64_t at[4] = {cap.flops, cap.transcendentals, cap.bytes_accessed, cap.min_bytes};
            for (int f = 0; f < 4; f++)
                if (at[f] > 0 && (double)got[f] / (double)at[f] > most[f]) most[f] = (double)got[f] / (double)at[f];
            if (split == 0 && st == FA_OK) { /* the call itself, in the plan's workspace */
                const size_t es = fa_dtype_size(p.dtype);
                const int64_t nq = p.seq_q * p.heads_q, nk = p.seq_k * p.heads_kv;
                void *q = tu_alloc((size_t)(nq * p.head_dim) * es), *k = tu_alloc((size_t)(nk * p.head_dim) * es);
                void *v = tu_alloc((size_t)(nk * p.head_dim_v) * es), *o = tu_alloc((size_t)(nq * p.head_dim_v) * es);
                void *ws = tu_alloc((size_t)cap.workspace_bytes + 1);
                tu_fill(&rng, p.dtype, q, nq * p.head_dim, 1.0), tu_fill(&rng, p.dtype, k, nk * p.head_dim, 1.0);
                tu_fill(&rng, p.dtype, v, nk * p.head_dim_v, 1.0);
                fa_counts cnt = {0};
                fa_forward_args a = {0};
                a.q = q, a.k = k, a.v = v, a.o = o, a.counts = &cnt, a.cu_seqlens_q = cq, a.cu_seqlens_k = ck;
                a.workspace = ws, a.workspace_size = (size_t)cap.workspace_bytes;
                const fa_status run = fa_forward(one, &a);
                CHECK(run == FA_OK && cnt.flops == c.flops && cnt.transcendentals == c.transcendentals,
                      "packed bounds (random) case %d: the call in the plan's workspace: %s; counts %lld/%lld, "
                      "fa_plan_cost_lengths %lld/%lld",
                      it, run ? fa_last_error() : "ok", (long long)cnt.flops, (long long)cnt.transcendentals,
                      (long long)c.flops, (long long)c.transcendentals);
                calls++;
                void *x[] = {q, k, v, o, ws};
                for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
            }
        }
        fa_plan_destroy(one);
    }
    printf("packed bounds (random): %d capacities x 30 splits, %d calls in the plan's workspace; largest ratios to "
           "the capacity's figures: flops %.2f, transcendentals %.2f, bytes_accessed %.2f, min_bytes %.2f\n",
           cases, calls, most[0], most[1], most[2], most[3]);
}

/* A decode plan made from capacities bounds every call's cost (docs/semantics.md): every
 * figure of fa_plan_cost_lengths at most the capacity's, over random capacities (GQA, Sq_new
 * 1..4, appends, pages, int8 and fp8 caches, causal, windows, 1 or 2 threads) and 40 random
 * lengths each. A window that cuts the full caches once let a shorter call's last tile,
 * fuller than the full cache's, run more keys than the plan counted. */
static void decode_bounds_random(void) {
    int cases = 0;
    for (int it = 0; it < 600 && !failures; it++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = tu_int(&rng, 1, 4), p.heads_kv = tu_int(&rng, 1, 2), p.heads_q = p.heads_kv * tu_int(&rng, 1, 4);
        p.seq_q = tu_int(&rng, 1, 4), p.seq_k = tu_int(&rng, 1, 700), p.head_dim = p.head_dim_v = 8 * tu_int(&rng, 1, 16);
        p.dtype = tu_int(&rng, 0, 1) ? FA_BF16 : FA_F32;
        if (tu_int(&rng, 0, 2) == 0)
            p.has_cache_dtype = 1, p.cache_dtype = tu_int(&rng, 0, 1) ? FA_INT8 : FA_FP8_E4M3, p.dtype = FA_BF16;
        const int mode = (int)tu_int(&rng, 0, 2); /* none, causal, causal with a window */
        p.causal = mode > 0;
        if (mode == 2) p.window_left = tu_int(&rng, 0, 300);
        p.has_new_kv = (int)tu_int(&rng, 0, 1);
        if (p.has_new_kv && p.seq_k < p.seq_q) p.seq_k = p.seq_q;
        if (tu_int(&rng, 0, 1)) {
            p.page_size = 16 * tu_int(&rng, 1, 2), p.max_pages = (p.seq_k + p.page_size - 1) / p.page_size;
            p.seq_k = p.max_pages * p.page_size, p.num_pages = p.batch * p.max_pages + 1;
        }
        p.lengths_per_call = FA_LENGTHS_CACHE;
        fa_options opt = {0};
        opt.backend = FA_BACKEND_CPU, opt.threads = (int)tu_int(&rng, 1, 2);
        fa_cost cap;
        fa_plan *one = capacity_plan(&p, &opt, "decode bounds (random)", &cap);
        if (!one) return;
        cases++;
        for (int call = 0; call < 40 && !failures; call++) {
            int32_t lens[4];
            for (int64_t b = 0; b < p.batch; b++)
                lens[b] = (int32_t)tu_int(&rng, 0, p.seq_k - (p.has_new_kv ? p.seq_q : 0));
            fa_cost c;
            const fa_status st = fa_plan_cost_lengths(one, FA_FORWARD, lens, NULL, NULL, &c);
            const int64_t got[7] = {c.flops, c.flops_useful, c.transcendentals, c.bytes_accessed,
                                    c.min_bytes, c.workspace_bytes, c.peak_bytes};
            const int64_t at[7] = {cap.flops, cap.flops_useful, cap.transcendentals, cap.bytes_accessed,
                                   cap.min_bytes, cap.workspace_bytes, cap.peak_bytes};
            static const char *name[7] = {"flops", "flops_useful", "transcendentals", "bytes_accessed",
                                          "min_bytes", "workspace_bytes", "peak_bytes"};
            CHECK(st == FA_OK, "decode bounds (random) case %d: cost: %s", it, fa_last_error());
            for (int f = 0; f < 7 && st == FA_OK; f++)
                CHECK(got[f] <= at[f],
                      "decode bounds (random) case %d: B %lld Sq %lld capacity %lld, window %lld, append %d, pages "
                      "of %lld, cache dtype %s, first length %d: %s %lld above the capacity's %lld",
                      it, (long long)p.batch, (long long)p.seq_q, (long long)p.seq_k, (long long)p.window_left,
                      p.has_new_kv, (long long)p.page_size, p.has_cache_dtype ? fa_dtype_name(p.cache_dtype) : "none",
                      lens[0], name[f], (long long)got[f], (long long)at[f]);
        }
        fa_plan_destroy(one);
    }
    printf("decode bounds (random): %d capacities x 40 lengths, every figure at most the capacity's\n", cases);
}

int main(void) {
    rng = check_seed("test_capacity_bounds");
    window_workspace();
    packed_bounds();
    packed_bounds_random();
    packed_bounds_wide_tiles();
    decode_bounds_random();
    return check_finish("test_capacity_bounds");
}
