/* The plan's wider key tiles (src/cpu/backend_cpu.c, wider_keys; docs/masks.md): where an
 * ISA has them (AMX: 256 keys for bf16, then 512, in the forward at any key count and head
 * dim; the backward's 256 with seq_k >= 2048 and D >= 128), the plan takes each when its own
 * walk of the tiles says it executes at most 8% more elements than the narrower ones chosen
 * so far. Checked here:
 *   - the choice, against the plan's own counts: for each problem, the forward's flops at
 *     128, 256 and 512 keys (fa_options.block_k), and which tiles were taken (no mask,
 *     causal, chunked 2048, 16 documents (their pairs trimmed to the keys a row may see,
 *     schedule_mask.h), a window of 2048, causal at D = 64 and at 1024 keys take 512; a window
 *     of 1024 256; windows of 512, and of 256 over 1024 keys, keep 128; the backward widens
 *     to 256 without a mask or window only, from 2048 keys and D = 128);
 *   - the results of the default tiles at these lengths against the float64 reference, o,
 *     lse and the gradients (outputs poisoned first), on every ISA;
 *   - the key tiles and the forward's bits at 1 to 8 threads (thread_independent).
 * The choice is checked only where fa_cpu_isa() is "amx" (other tables have no wider
 * tiles: their choice is the one test_mask_attention sees). FA_TEST_SEED replays a run. */
#include "check.h"
#include "ref/ref.h"

#include <string.h>

static uint64_t rng;

typedef struct {
    const char *name;
    int64_t seq, dim;
    int causal;
    int64_t window; /* left, with right 0; -1: none */
    int mask;       /* 0 none, 1 chunked 2048, 2 sixteen documents */
    int64_t want_fwd_bk, want_bwd_bk;
} choice_case;

static fa_mask *make_mask(int kind, int64_t seq) {
    if (!kind) return NULL;
    fa_mask_shape s = {1, 1, seq, seq, 0, 0};
    fa_mask *m = NULL;
    if (kind == 1) {
        CHECK(fa_mask_chunked(&s, 0, 2048, &m) == FA_OK, "fa_mask_chunked: %s", fa_last_error());
        return m;
    }
    int64_t lens[16], at = 0, counts[1] = {16};
    for (int d = 0; d < 16; d++) { /* uneven lengths, summing to seq */
        lens[d] = d < 15 ? seq / 16 + (d % 3 - 1) * (seq / 64) : seq - at;
        at += lens[d];
    }
    CHECK(fa_mask_documents(&s, counts, lens, &m) == FA_OK, "fa_mask_documents: %s", fa_last_error());
    return m;
}

static void problem_of(const choice_case *c, fa_mask *m, fa_problem *p) {
    fa_problem_init(p);
    p->batch = 1, p->heads_q = 8, p->heads_kv = 8, p->seq_q = p->seq_k = c->seq;
    p->head_dim = p->head_dim_v = c->dim, p->dtype = FA_BF16, p->causal = c->causal;
    p->window_left = c->window, p->window_right = c->window >= 0 ? 0 : -1;
    p->mask = m;
}

static int64_t forward_flops(const fa_plan *pl) {
    fa_cost c;
    CHECK(fa_plan_cost(pl, FA_FORWARD, &c) == FA_OK, "fa_plan_cost: %s", fa_last_error());
    return c.flops;
}

static void choices(void) {
    static const choice_case cases[] = {
        {"no mask S=4096", 4096, 128, 0, -1, 0, 512, 256},
        {"causal S=2048", 2048, 128, 1, -1, 0, 512, 256},
        {"causal S=16384", 16384, 128, 1, -1, 0, 512, 256},
        {"causal S=8192 D=256", 8192, 256, 1, -1, 0, 512, 256},
        {"chunked 2048 S=16384", 16384, 128, 1, -1, 1, 512, 128},
        {"window 2048 S=16384", 16384, 128, 1, 2048, 0, 512, 128},
        {"window 1024 S=16384", 16384, 128, 1, 1024, 0, 256, 128},
        {"window 512 S=16384", 16384, 128, 1, 512, 0, 128, 128},
        {"16 documents S=16384", 16384, 128, 1, -1, 2, 512, 128},
        {"causal S=4096 D=64", 4096, 64, 1, -1, 0, 512, 128},
        {"causal S=1024", 1024, 128, 1, -1, 0, 512, 128},
        {"no mask S=768 D=64", 768, 64, 0, -1, 0, 512, 128},
        {"window 256 S=1024", 1024, 128, 1, 256, 0, 128, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const choice_case *c = &cases[i];
        fa_mask *m = make_mask(c->mask, c->seq);
        fa_problem p;
        problem_of(c, m, &p);
        fa_plan *chosen = check_plan(&p, 2, 0, 0), *narrow = check_plan(&p, 2, 0, 128);
        fa_mask_destroy(m);
        if (!chosen || !narrow) continue;
        int64_t fbq, fbk, bbq, bbk, nbq;
        fa_plan_blocks(chosen, FA_FORWARD, &fbq, &fbk);
        fa_plan_blocks(chosen, FA_BACKWARD, &bbq, &bbk);
        fa_plan_blocks(narrow, FA_FORWARD, &nbq, NULL);
        CHECK(fbk == c->want_fwd_bk, "%s: forward tiles %lld x %lld, want %lld keys", c->name, (long long)fbq,
              (long long)fbk, (long long)c->want_fwd_bk);
        CHECK(bbk == c->want_bwd_bk, "%s: backward tiles %lld x %lld, want %lld keys", c->name, (long long)bbq,
              (long long)bbk, (long long)c->want_bwd_bk);
        /* the rule itself, from the plan's counts: each wider width where it executes <= 8%
         * more than the width taken before it */
        if (nbq == fbq) {
            fa_plan *w256 = check_plan(&p, 2, fbq, 256), *w512 = check_plan(&p, 2, fbq, 512);
            if (w256 && w512) {
                const double f128 = (double)forward_flops(narrow), f256 = (double)forward_flops(w256),
                             f512 = (double)forward_flops(w512);
                double taken = f128;
                int64_t want = 128;
                if (f256 <= 1.08 * taken) want = 256, taken = f256;
                if (f512 <= 1.08 * taken) want = 512;
                CHECK(fbk == want, "%s: %lld-key tiles taken; the rule gives %lld (flops at 256 and 512 keys %.4f and "
                      "%.4f x 128's)", c->name, (long long)fbk, (long long)want, f256 / f128, f512 / f128);
            }
            fa_plan_destroy(w256), fa_plan_destroy(w512);
        }
        printf("  %-24s forward %lld x %lld, backward %lld x %lld\n", c->name, (long long)fbq, (long long)fbk,
               (long long)bbq, (long long)bbk);
        fa_plan_destroy(chosen);
        if (narrow) fa_plan_destroy(narrow);
    }
}

/* One problem at the default tiles against the reference: both passes. */
static void against_reference(int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hk, int causal) {
    char label[96];
    snprintf(label, sizeof label, "bf16 Sq%lld Sk%lld Hq%lld Hk%lld D128 causal %d", (long long)Sq, (long long)Sk,
             (long long)Hq, (long long)Hk, causal);
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = Hq, p.heads_kv = Hk, p.seq_q = Sq, p.seq_k = Sk;
    p.head_dim = p.head_dim_v = 128, p.dtype = FA_BF16, p.causal = causal;
    fa_plan *pl = check_plan(&p, 2, 0, 0);
    if (!pl) return;
    int64_t fbq, fbk, bbq, bbk;
    fa_plan_blocks(pl, FA_FORWARD, &fbq, &fbk);
    fa_plan_blocks(pl, FA_BACKWARD, &bbq, &bbk);
    printf("  %s (isa %s): forward %lld x %lld, backward %lld x %lld\n", label, fa_cpu_isa(), (long long)fbq,
           (long long)fbk, (long long)bbq, (long long)bbk);
    const int64_t nq = Hq * Sq * 128, nk = Hk * Sk * 128, rows = Hq * Sq;
    void *q = tu_alloc(2 * (size_t)nq), *k = tu_alloc(2 * (size_t)nk), *v = tu_alloc(2 * (size_t)nk);
    void *o = tu_alloc(2 * (size_t)nq), *g = tu_alloc(2 * (size_t)nq);
    void *dq = tu_alloc(2 * (size_t)nq), *dk = tu_alloc(2 * (size_t)nk), *dv = tu_alloc(2 * (size_t)nk);
    float *lse = tu_alloc(sizeof(float) * (size_t)rows);
    tu_fill(&rng, FA_BF16, q, nq, 2.0), tu_fill(&rng, FA_BF16, k, nk, 2.0), tu_fill(&rng, FA_BF16, v, nk, 1.0);
    tu_fill(&rng, FA_BF16, g, nq, 1.0);
    tu_poison(FA_BF16, o, nq), tu_poison(FA_F32, lse, rows);
    tu_poison(FA_BF16, dq, nq), tu_poison(FA_BF16, dk, nk), tu_poison(FA_BF16, dv, nk);
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
    fa_status st = fa_forward(pl, &fa);
    CHECK(st == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    fa_backward_args ba = {0};
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = g, ba.lse = lse, ba.dq = dq, ba.dk = dk, ba.dv = dv;
    if (!st) {
        st = fa_backward(pl, &ba);
        CHECK(st == FA_OK, "%s: fa_backward: %s", label, fa_last_error());
    }
    double *ro = tu_alloc(sizeof(double) * (size_t)nq), *rl = tu_alloc(sizeof(double) * (size_t)rows);
    double *rdq = tu_alloc(sizeof(double) * (size_t)nq), *rdk = tu_alloc(sizeof(double) * (size_t)nk);
    double *rdv = tu_alloc(sizeof(double) * (size_t)nk);
    fa_ref_forward(&p, &fa, ro, rl);
    fa_ref_backward(&p, &ba, rdq, rdk, rdv);
    const fa_strides dense = {{0, 0, 0, 0}};
    const int64_t od[4] = {1, Hq, Sq, 128}, kd[4] = {1, Hk, Sk, 128}, ld[4] = {1, 1, 1, rows};
    printf("    %s\n", label);
    check_tensor("o", FA_BF16, o, &dense, ro, od, check_tol_of(FA_BF16), NULL, 0);
    check_tensor("lse", FA_F32, lse, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
    check_tensor("dq", FA_BF16, dq, &dense, rdq, od, check_tol_grad(FA_BF16), NULL, 0);
    check_tensor("dk", FA_BF16, dk, &dense, rdk, kd, check_tol_grad(FA_BF16), NULL, 0);
    check_tensor("dv", FA_BF16, dv, &dense, rdv, kd, check_tol_grad(FA_BF16), NULL, 0);
    free(q), free(k), free(v), free(o), free(g), free(dq), free(dk), free(dv), free(lse);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
    fa_plan_destroy(pl);
}

/* The key tiles order a row's sums, so they must not depend on the thread count (only the
 * rows per tile may: the forward halves them while there are under 4 work items a thread).
 * A window of (700, 100) over 2048 keys, one head: at 5 threads the query tiles halve, and
 * the wider keys were once judged on the halved tiles (256 keys against 512 at 1 thread:
 * o one bf16 ulp apart). Plans at 1 to 8 threads give the same key tiles; the forward's o
 * and lse the same bits at 1 and 5 threads. */
static void thread_independent(void) {
    static const struct { int64_t batch, heads, seq, left, right; int causal; } cases[] = {
        {1, 1, 2048, 700, 100, 0}, {1, 1, 2600, 300, 300, 0}, {1, 1, 2048, -1, -1, 1},
        {1, 2, 4096, 1024, 0, 1},  {2, 1, 2048, -1, -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fa_problem p;
        fa_problem_init(&p);
        p.batch = cases[i].batch, p.heads_q = p.heads_kv = cases[i].heads, p.seq_q = p.seq_k = cases[i].seq;
        p.head_dim = p.head_dim_v = 128, p.dtype = FA_BF16, p.causal = cases[i].causal;
        p.window_left = cases[i].left, p.window_right = cases[i].right;
        char label[96];
        snprintf(label, sizeof label, "B %lld H %lld S %lld window (%lld, %lld) causal %d", (long long)p.batch,
                 (long long)p.heads_q, (long long)p.seq_q, (long long)p.window_left, (long long)p.window_right,
                 p.causal);
        int64_t bk1 = 0, bq1 = 0;
        for (int threads = 1; threads <= 8; threads++) {
            fa_plan *pl = check_plan(&p, threads, 0, 0);
            if (!pl) break;
            int64_t bq, bk;
            fa_plan_blocks(pl, FA_FORWARD, &bq, &bk);
            if (threads == 1) bq1 = bq, bk1 = bk;
            CHECK(bk == bk1, "%s: forward tiles %lld x %lld at %d threads, %lld x %lld at 1", label, (long long)bq,
                  (long long)bk, threads, (long long)bq1, (long long)bk1);
            fa_plan_destroy(pl);
        }
        if (i > 0) continue; /* the bits of the first case */
        const int64_t n = p.batch * p.heads_q * p.seq_q * 128, rows = p.batch * p.heads_q * p.seq_q;
        void *q = tu_alloc(2 * (size_t)n), *k = tu_alloc(2 * (size_t)n), *v = tu_alloc(2 * (size_t)n);
        void *o[2] = {tu_alloc(2 * (size_t)n), tu_alloc(2 * (size_t)n)};
        float *lse[2] = {tu_alloc(4 * (size_t)rows), tu_alloc(4 * (size_t)rows)};
        tu_fill(&rng, FA_BF16, q, n, 2.0), tu_fill(&rng, FA_BF16, k, n, 2.0), tu_fill(&rng, FA_BF16, v, n, 1.0);
        for (int x = 0; x < 2; x++) {
            fa_plan *pl = check_plan(&p, x ? 5 : 1, 0, 0);
            tu_poison(FA_BF16, o[x], n), tu_poison(FA_F32, lse[x], rows);
            fa_forward_args fa = {0};
            fa.q = q, fa.k = k, fa.v = v, fa.o = o[x], fa.lse = lse[x];
            CHECK(pl && fa_forward(pl, &fa) == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
            fa_plan_destroy(pl);
        }
        CHECK(!memcmp(o[0], o[1], 2 * (size_t)n) && !memcmp(lse[0], lse[1], 4 * (size_t)rows),
              "%s: o or lse differ between 1 and 5 threads", label);
        free(q), free(k), free(v), free(o[0]), free(o[1]), free(lse[0]), free(lse[1]);
    }
    printf("  the key tiles and the forward's bits do not depend on the thread count\n");
}

int main(void) {
    rng = check_seed("test_wide_tiles");
    const int amx = strcmp(fa_cpu_isa(), "amx") == 0;
    if (amx) {
        printf("the plan's choices (isa amx, bf16, 2 threads):\n");
        choices();
    } else {
        printf("the plan's choices: skipped (isa %s has no wider tiles)\n", fa_cpu_isa());
    }
    thread_independent();
    printf("the default tiles against the float64 reference:\n");
    against_reference(2100, 2100, 2, 1, 1); /* causal, GQA, a cut last tile of both edges */
    against_reference(64, 4100, 1, 1, 0);   /* few rows over many keys, unmasked */
    against_reference(700, 700, 2, 2, 1);   /* short: 512 keys and a cut tile of 188 */
    against_reference(40, 300, 2, 1, 0);    /* the keys' tile cut to the 300 keys there are */
    return check_finish("test_wide_tiles");
}
