/* A shared prefix (cascade decode) against the same batch without sharing: B sequences, one
 * new token each, over a P-token shared prefix plus S-token own caches (bf16, Hq / Hk heads,
 * D = 128). The unshared batch is a paged cache whose block tables all name the same prefix
 * pages (so memory stays small), which it reads once per sequence; the cascade reads them
 * once per call. Prints one JSON line: medians of ROUNDS interleaved rounds, each plan's
 * bytes and flops, and the speedup.
 *   cascade [B (64)] [P (16384)] [S (512)] [threads (2)] [rounds (3)] */
#include "flashattn.h"
#include "measure.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HQ 32
#define HK 8
#define D 128
#define PAGE 64

static double run_once(fa_plan *pl, const fa_forward_args *a) {
    const double t0 = measure_now();
    if (fa_forward(pl, a)) {
        fprintf(stderr, "cascade: %s\n", fa_last_error());
        exit(1);
    }
    return measure_now() - t0;
}

int main(int argc, char **argv) {
    const int64_t B = argc > 1 ? atol(argv[1]) : 64, P = argc > 2 ? atol(argv[2]) : 16384, S = argc > 3 ? atol(argv[3]) : 512;
    const int threads = argc > 4 ? atoi(argv[4]) : 2, rounds = argc > 5 ? atoi(argv[5]) : 3;
    if (B < 1 || P < PAGE || P % PAGE || S < PAGE || S % PAGE || rounds < 1 || rounds > 64) {
        fprintf(stderr, "cascade: B >= 1, P and S multiples of %d, 1 <= rounds <= 64\n", PAGE);
        return 2;
    }
    const int64_t W = HK * D, own_pages = S / PAGE, pre_pages = P / PAGE, pages = pre_pages + B * own_pages;
    uint64_t seed = 7;
    uint16_t *q = malloc(sizeof *q * (size_t)(B * HQ * D)), *o = malloc(sizeof *o * (size_t)(B * HQ * D));
    uint16_t *kp = malloc(sizeof *kp * (size_t)(P * W)), *vp = malloc(sizeof *vp * (size_t)(P * W));
    uint16_t *k = malloc(sizeof *k * (size_t)(B * S * W)), *v = malloc(sizeof *v * (size_t)(B * S * W));
    uint16_t *pk = malloc(sizeof *pk * (size_t)(pages * PAGE * W)), *pv = malloc(sizeof *pv * (size_t)(pages * PAGE * W));
    int32_t *lens = malloc(sizeof *lens * (size_t)B), *ulens = malloc(sizeof *ulens * (size_t)B);
    int32_t *table = malloc(sizeof *table * (size_t)(B * (pre_pages + own_pages)));
    if (!q || !o || !kp || !vp || !k || !v || !pk || !pv || !lens || !ulens || !table) return fprintf(stderr, "cascade: out of memory\n"), 1;
    measure_fill(&seed, FA_BF16, q, B * HQ * D), measure_fill(&seed, FA_BF16, kp, P * W);
    measure_fill(&seed, FA_BF16, vp, P * W), measure_fill(&seed, FA_BF16, k, B * S * W), measure_fill(&seed, FA_BF16, v, B * S * W);
    memcpy(pk, kp, sizeof *kp * (size_t)(P * W)), memcpy(pv, vp, sizeof *vp * (size_t)(P * W)); /* the prefix pages */
    memcpy(pk + P * W, k, sizeof *k * (size_t)(B * S * W)), memcpy(pv + P * W, v, sizeof *v * (size_t)(B * S * W));
    for (int64_t b = 0; b < B; b++) {
        lens[b] = (int32_t)S, ulens[b] = (int32_t)(P + S);
        for (int64_t j = 0; j < pre_pages + own_pages; j++)
            table[b * (pre_pages + own_pages) + j] = (int32_t)(j < pre_pages ? j : pre_pages + b * own_pages + j - pre_pages);
    }
    fa_problem c;
    fa_problem_init(&c);
    c.batch = B, c.heads_q = HQ, c.heads_kv = HK, c.head_dim = D, c.seq_q = 1, c.seq_k = S, c.dtype = FA_BF16;
    c.causal = 1, c.cache_seqlens = lens, c.shared_prefix_len = P;
    fa_problem u = c;
    u.shared_prefix_len = 0, u.cache_seqlens = ulens, u.seq_k = P + S;
    u.page_size = PAGE, u.num_pages = pages, u.max_pages = pre_pages + own_pages;
    fa_options opt = {0};
    opt.backend = FA_BACKEND_CPU, opt.threads = threads;
    fa_plan *pc = NULL, *pu = NULL;
    if (fa_plan_create(&c, &opt, &pc) || fa_plan_create(&u, &opt, &pu)) return fprintf(stderr, "cascade: %s\n", fa_last_error()), 1;
    fa_cost cc, cu;
    fa_plan_cost(pc, FA_FORWARD, &cc), fa_plan_cost(pu, FA_FORWARD, &cu);
    fa_forward_args ac = {0}, au = {0};
    ac.q = q, ac.k = k, ac.v = v, ac.o = o, ac.k_prefix = kp, ac.v_prefix = vp;
    au.q = q, au.k = pk, au.v = pv, au.o = o, au.block_table = table;
    double tc[64], tu[64];
    run_once(pc, &ac), run_once(pu, &au); /* warm: pages touched, threads started */
    for (int r = 0; r < rounds; r++) tc[r] = run_once(pc, &ac), tu[r] = run_once(pu, &au);
    const double mc = measure_median(tc, rounds), mu = measure_median(tu, rounds);
    printf("{\"batch\": %lld, \"prefix\": %lld, \"suffix\": %lld, \"heads_q\": %d, \"heads_kv\": %d, \"head_dim\": %d, "
           "\"threads\": %d, \"rounds\": %d, \"cascade_ms\": %.3f, \"unshared_ms\": %.3f, \"speedup\": %.2f, "
           "\"cascade_bytes\": %lld, \"unshared_bytes\": %lld, \"cascade_flops\": %lld, \"cascade_gbps\": %.1f, "
           "\"cascade_gflops\": %.1f, \"unshared_gbps\": %.1f}\n",
           (long long)B, (long long)P, (long long)S, HQ, HK, D, threads, rounds, mc * 1e3, mu * 1e3, mu / mc,
           (long long)cc.bytes_accessed, (long long)cu.bytes_accessed, (long long)cc.flops, cc.bytes_accessed / mc * 1e-9,
           cc.flops / mc * 1e-9, cu.bytes_accessed / mu * 1e-9);
    fa_plan_destroy(pc), fa_plan_destroy(pu);
    free(q), free(o), free(kp), free(vp), free(k), free(v), free(pk), free(pv), free(lens), free(ulens), free(table);
    return 0;
}
