/* `flashattn bench --decode` and `flashattn bench --varlen lens`: the inference shapes on
 * random data (one warm-up call, then --iters timed calls, the median reported).
 *
 * --decode: one decode step of --seq-q new queries (default 1) per sequence against caches
 * of --cache-len tokens (bottom-right causal), optionally paged (--page-size, pages in a
 * shuffled order). Reported as bytes of cache read per second: B x Hk x cache_len x
 * (D + Dv) x dtype bytes, each read once per step.
 * --huge-pages: the caches are allocated 2 MiB-aligned with madvise(MADV_HUGEPAGE), as an
 * inference server would hold a cache of this size (Linux transparent huge pages; where the
 * system refuses, the pages stay 4 KiB and the run says so). Decode's passes over a tile
 * cross a page per two rows on 4 KiB pages, and in a virtual machine each TLB miss costs a
 * two-level walk: measured here, huge pages read the cache 15-30% faster.
 * --varlen 128,4096,...: one packed batch of those sequence lengths (Sq = Sk per sequence)
 * against the same batch padded to the longest with segment ids (the only way to pack
 * before cu_seqlens); both report time per useful flop. */
#define _DEFAULT_SOURCE /* madvise */
#include "cli.h"
#include "measure.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Median seconds of iters forward calls after one warm-up (and, if cpu_median, the median of
 * all threads' cpu seconds per call). Call i takes the arguments fw[i % n] (bench --decode
 * --layers: one set of caches per layer, as a model's step visits them), the warm-up fw[n - 1]. */
static int time_forward(const char *what, const fa_plan *pl, const fa_forward_args *fw, int64_t n, int iters,
                        double *median, double *cpu_median) {
    double t[64], cpu[64];
    if (iters > 64) iters = 64;
    fa_status st = fa_forward(pl, &fw[n - 1]);
    for (int i = 0; st == FA_OK && i < iters; i++) {
        const double t0 = measure_now(), c0 = measure_cpu_now();
        st = fa_forward(pl, &fw[i % n]);
        t[i] = measure_now() - t0;
        /* cpu: all threads' time, which on a shared machine shows how much of the wall the run got */
        cpu[i] = measure_cpu_now() - c0;
        fprintf(stderr, "bench: %s %d/%d: %.6f s (cpu %.6f s)\n", what, i + 1, iters, t[i], cpu[i]);
    }
    if (st != FA_OK) return cli_fail_status(st, what);
    *median = measure_median(t, iters);
    if (cpu_median) *cpu_median = measure_median(cpu, iters);
    return 0;
}

static void *zalloc(size_t n) { return calloc(n ? n : 1, 1); }

/* Bytes of this process's memory on transparent huge pages (Linux), or -1. */
static int64_t huge_page_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

/* n zeroed bytes on 2 MiB pages where the system grants them (*huge stays 1), else 0. */
#define HUGE_PAGE ((size_t)2 << 20)
static void *zalloc_huge(size_t n, int *huge) {
    const size_t m = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *x = aligned_alloc(HUGE_PAGE, m ? m : HUGE_PAGE);
    if (!x) return NULL;
#ifdef MADV_HUGEPAGE
    if (madvise(x, m, MADV_HUGEPAGE)) *huge = 0;
#else
    *huge = 0;
#endif
    memset(x, 0, m); /* first touch: the pages are faulted in now, huge where granted */
    return x;
}

/* The inference benchmarks time the shapes alone, on random data: the library is asked first
 * whether the option files' features combine with the problem (its message names both),
 * then a feature it would run (ALiBi, sinks, a mask over dense rows) is refused here rather
 * than dropped without a word: `run` with the same shapes takes the files. */
static int refuse_option_files(const cli_args *a, const char *bench, const fa_problem *p, const fa_options *o) {
    int rc = cli_extras_supported(a, p, o);
    if (rc) return rc;
    const char *flag = a->bias ? "--bias" : a->alibi ? "--alibi" : a->sinks ? "--sinks"
                     : a->q_segments ? "--q-segments" : a->kv_segments ? "--kv-segments" : a->mask ? "--mask"
                     : a->documents ? "--documents" : a->prefix_len ? "--prefix-len" : a->mask_chunk ? "--mask-chunk"
                     : NULL;
    return flag ? cli_fail(2, "bench %s times the shapes alone and does not apply %s (run takes it with the same shapes)",
                           bench, flag)
                : 0;
}

#define MAX_LAYERS 4096 /* bench --decode --layers: a model's, and then some */
static int bench_decode(const cli_args *a) {
    /* the first one missing, by name (a given --cache-len is at least 1: cli_args.c) */
    const char *missing = !a->batch ? "--batch" : !a->heads ? "--heads" : !a->head_dim ? "--head-dim"
                        : !a->cache_len ? "--cache-len" : NULL;
    if (missing) return cli_fail(2, "bench --decode: missing %s (it needs --batch, --heads, --head-dim and --cache-len)", missing);
    if (a->layers > MAX_LAYERS) return cli_fail(2, "bench --decode: --layers %lld: at most %d", (long long)a->layers, MAX_LAYERS);
    fa_problem p;
    fa_options opt;
    fa_problem_init(&p);
    const int64_t B = a->batch, N = a->cache_len, ps = a->page_size;
    p.batch = B, p.heads_q = a->heads, p.heads_kv = a->kv_heads ? a->kv_heads : a->heads;
    p.head_dim = a->head_dim, p.head_dim_v = a->v_head_dim ? a->v_head_dim : a->head_dim;
    p.dtype = a->has_dtype ? a->dtype : FA_BF16;
    p.seq_q = a->seq_q ? a->seq_q : 1;
    cli_apply_options(a, &p, &opt);
    p.causal = 1;
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)B), *table = NULL;
    if (!lens) return cli_fail(1, "out of memory");
    for (int64_t b = 0; b < B; b++) lens[b] = (int32_t)N;
    p.cache_seqlens = lens;
    int64_t rows = B * (N > 0 ? N : 1);
    p.seq_k = N > 0 ? N : 1;
    if (ps) {
        p.page_size = ps, p.max_pages = (p.seq_k + ps - 1) / ps, p.num_pages = B * p.max_pages;
        p.seq_k = p.max_pages * ps, rows = p.num_pages * ps;
        table = malloc(sizeof(int32_t) * (size_t)p.num_pages);
        if (!table) return free(lens), cli_fail(1, "out of memory");
        uint64_t r = 0x7ab1e;
        for (int64_t i = 0; i < p.num_pages; i++) table[i] = (int32_t)i;
        for (int64_t i = p.num_pages - 1; i > 0; i--) { /* pages in a shuffled order */
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t j = (int64_t)((r >> 33) % (uint64_t)(i + 1));
            const int32_t x = table[i];
            table[i] = table[j], table[j] = x;
        }
    }
    fa_plan *pl = NULL;
    int rc = refuse_option_files(a, "--decode", &p, &opt);
    if (!rc) rc = cli_plan_create(&p, &opt, &pl);
    if (rc) return free(lens), free(table), rc;
    const size_t es = fa_dtype_size(p.dtype), cs = fa_dtype_size(p.has_cache_dtype ? p.cache_dtype : p.dtype);
    const int quant = p.has_cache_dtype && (p.cache_dtype == FA_INT8 || p.cache_dtype == FA_FP8_E4M3);
    const int64_t nq = B * p.seq_q * p.heads_q * p.head_dim, no = B * p.seq_q * p.heads_q * p.head_dim_v;
    /* --layers L: L sets of caches (k, v and a quantized cache's scales), call i reading set
     * i % L, as a model's step reads each layer's own: sets beyond the last-level cache put
     * every call's reads in memory, as in a model, where one set would be read from that cache */
    const int64_t L = a->layers ? a->layers : 1;
    const int64_t kbytes = rows * p.heads_kv * p.head_dim * (int64_t)cs, vbytes = rows * p.heads_kv * p.head_dim_v * (int64_t)cs;
    const int64_t sbytes = quant ? rows * p.heads_kv * 4 : 0; /* [rows, Hk] f32 scales each */
    int huge = a->huge_pages;
    void *q = zalloc(nq * es), *o = zalloc(no * es);
    float *lse = zalloc(sizeof(float) * (size_t)(B * p.heads_q * p.seq_q));
    fa_forward_args *fw = calloc((size_t)L, sizeof *fw);
    void **sets = calloc((size_t)L, 4 * sizeof *sets); /* k, v, k scales, v scales of each set */
    int ok = q && o && lse && fw && sets;
    for (int64_t l = 0; ok && l < L; l++) {
        const int64_t sz[4] = {kbytes, vbytes, sbytes, sbytes};
        for (int x = 0; x < 4 && ok; x++) /* the scales on the caches' kind of pages */
            if (sz[x]) ok = (sets[4 * l + x] = huge ? zalloc_huge((size_t)sz[x], &huge) : zalloc((size_t)sz[x])) != NULL;
    }
    const int64_t on_huge = huge_page_bytes(); /* after the caches' first touch */
    if (a->huge_pages && (!huge || on_huge < 0))
        fprintf(stderr, "flashattn: bench --huge-pages: %s\n",
                !huge ? "madvise(MADV_HUGEPAGE) refused; 4 KiB pages" : "cannot read /proc/self/smaps_rollup to confirm");
    double t = 0, tc = 0;
    if (!ok) {
        rc = cli_fail(1, "out of memory (bench --decode: %lld set(s) of caches of %lld bytes)", (long long)L,
                      (long long)(kbytes + vbytes + 2 * sbytes));
    } else {
        uint64_t st = 0x5eed;
        measure_fill(&st, p.dtype, q, nq);
        /* a quantized cache's random codes go through the library's quantizer a row block at a time */
        const int64_t chunk = 4096, nk = rows * p.heads_kv, wmax = p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
        float *buf = quant ? malloc(sizeof(float) * (size_t)(chunk * wmax)) : NULL;
        if (quant && !buf) rc = cli_fail(1, "out of memory");
        for (int64_t l = 0; l < L && !rc; l++) {
            void *k = sets[4 * l], *v = sets[4 * l + 1];
            float *ks = sets[4 * l + 2], *vs = sets[4 * l + 3];
            if (quant) {
                for (int x = 0; x < 2 && !rc; x++)
                    for (int64_t r = 0, w = x ? p.head_dim_v : p.head_dim; r < nk && !rc; r += chunk) {
                        const int64_t n = nk - r < chunk ? nk - r : chunk;
                        measure_fill(&st, FA_F32, buf, n * w);
                        if (fa_quantize_rows(p.cache_dtype, FA_F32, buf, n, w, (char *)(x ? v : k) + r * w, (x ? vs : ks) + r))
                            rc = cli_fail(1, "bench --decode: %s", fa_last_error());
                    }
            } else {
                measure_fill(&st, p.dtype, k, rows * p.heads_kv * p.head_dim);
                measure_fill(&st, p.dtype, v, rows * p.heads_kv * p.head_dim_v);
            }
            fw[l].q = q, fw[l].k = k, fw[l].v = v, fw[l].o = o, fw[l].lse = lse, fw[l].block_table = table;
            fw[l].k_scale = ks, fw[l].v_scale = vs;
        }
        free(buf);
        if (!rc) rc = time_forward("decode", pl, fw, L, a->iters ? a->iters : 20, &t, &tc);
    }
    if (!rc) {
        fa_cost c;
        fa_plan_cost(pl, FA_FORWARD, &c);
        const double cache = (double)B * (double)p.heads_kv * (double)N *
                             ((double)(p.head_dim + p.head_dim_v) * (double)cs + (quant ? 8.0 : 0.0)); /* codes and scales */
        if (a->json)
            printf("{\"decode\": {\"seconds\": %.6g, \"cache_bytes\": %.0f, \"gbytes_per_s\": %.6g, \"cpu_seconds\": %.6g, "
                   "\"gbytes_per_cpu_s\": %.6g, \"bytes_accessed\": %" PRId64 ", \"flops\": %" PRId64
                   ", \"threads\": %d, \"isa\": \"%s\", \"huge_page_bytes\": %" PRId64 ", \"layers\": %lld}}\n",
                   t, cache, cache / t * 1e-9, tc, cache / (tc / fa_plan_threads(pl)) * 1e-9, c.bytes_accessed, c.flops,
                   fa_plan_threads(pl), fa_cpu_isa(), on_huge, (long long)L);
        else
            printf("decode    %10.6f s  %8.2f GB/s of cache read (%.0f bytes a call, %lld set(s) of caches in turn; plan "
                   "bytes_accessed %" PRId64 ", %.2f GFLOP/s; %.0f MiB of the process on huge pages)\n", t, cache / t * 1e-9,
                   cache, (long long)L, c.bytes_accessed, (double)c.flops / t * 1e-9,
                   on_huge < 0 ? 0.0 : (double)on_huge / 1048576.0);
    }
    for (int64_t l = 0; sets && l < 4 * L; l++) free(sets[l]);
    free(sets), free(fw), free(q), free(o), free(lse), free(lens), free(table);
    fa_plan_destroy(pl);
    return rc;
}

/* Parses "128,4096,..." into at most 4096 lengths. */
static int parse_lens(const char *s, int64_t *lens, int64_t *n) {
    *n = 0;
    while (*s) {
        char *end = (char *)s;
        /* decimal digits only (docs/cli.md, "Numbers"): strtoll would skip spaces and take a sign */
        const long long v = *s >= '0' && *s <= '9' ? strtoll(s, &end, 10) : -1;
        if (v < 0 || v > (1 << 24) || *n >= 4096 || (*end && *end != ','))
            return cli_fail(2, "--varlen: '%s' is not a comma-separated list of lengths in [0, 2^24]", s);
        lens[(*n)++] = v;
        if (*end && !end[1]) /* a comma with no length after it: "4,4," */
            return cli_fail(2, "--varlen: '%s' ends with a comma", s);
        s = *end ? end + 1 : end;
    }
    if (!*n) return cli_fail(2, "--varlen: no lengths given");
    return 0;
}

static int bench_varlen(const cli_args *a) {
    static int64_t L[4096];
    int64_t B, total = 0, longest = 0;
    int rc = parse_lens(a->varlen_lens, L, &B);
    if (rc) return rc;
    if (!a->heads || !a->head_dim) return cli_fail(2, "bench --varlen: needs --heads and --head-dim");
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (!cu) return cli_fail(1, "out of memory");
    cu[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        total += L[b], cu[b + 1] = (int32_t)total;
        if (L[b] > longest) longest = L[b];
    }
    fa_problem pk, pd;
    fa_options opt;
    fa_problem_init(&pk);
    pk.batch = B, pk.heads_q = a->heads, pk.heads_kv = a->kv_heads ? a->kv_heads : a->heads;
    pk.head_dim = a->head_dim, pk.head_dim_v = a->v_head_dim ? a->v_head_dim : a->head_dim;
    pk.dtype = a->has_dtype ? a->dtype : FA_F32;
    cli_apply_options(a, &pk, &opt);
    pd = pk;
    pk.seq_q = pk.seq_k = total, pk.cu_seqlens_q = pk.cu_seqlens_k = cu;
    pd.seq_q = pd.seq_k = longest, pd.has_segment_ids = 1; /* padded: rows past a length are segment 1/2 */
    fa_plan *plk = NULL, *pld = NULL;
    if ((rc = refuse_option_files(a, "--varlen", &pk, &opt)) || (rc = cli_plan_create(&pk, &opt, &plk)) ||
        (rc = cli_plan_create(&pd, &opt, &pld)))
        return free(cu), fa_plan_destroy(plk), rc;
    const size_t es = fa_dtype_size(pk.dtype);
    const int64_t Hq = pk.heads_q, Hk = pk.heads_kv, D = pk.head_dim, Dv = pk.head_dim_v, Pn = B * longest;
    const int64_t rows = Pn > total ? Pn : total;
    void *q = zalloc(rows * Hq * D * es), *k = zalloc(rows * Hk * D * es), *v = zalloc(rows * Hk * Dv * es);
    void *o = zalloc(rows * Hq * Dv * es);
    float *lse = zalloc(sizeof(float) * (size_t)(rows * Hq));
    int32_t *qs = zalloc(sizeof(int32_t) * (size_t)Pn), *ks = zalloc(sizeof(int32_t) * (size_t)Pn);
    double tk = 0, td = 0;
    if (!q || !k || !v || !o || !lse || !qs || !ks) {
        rc = cli_fail(1, "out of memory");
    } else {
        uint64_t st = 0x5eed;
        measure_fill(&st, pk.dtype, q, rows * Hq * D), measure_fill(&st, pk.dtype, k, rows * Hk * D);
        measure_fill(&st, pk.dtype, v, rows * Hk * Dv);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < longest; i++) qs[b * longest + i] = i < L[b] ? 0 : 1, ks[b * longest + i] = i < L[b] ? 0 : 2;
        fa_forward_args fw;
        memset(&fw, 0, sizeof fw);
        fw.q = q, fw.k = k, fw.v = v, fw.o = o, fw.lse = lse;
        const int iters = a->iters ? a->iters : 3;
        rc = time_forward("varlen packed", plk, &fw, 1, iters, &tk, NULL);
        fw.q_segment_ids = qs, fw.kv_segment_ids = ks;
        if (!rc) rc = time_forward("padded + segment ids", pld, &fw, 1, iters, &td, NULL);
    }
    if (!rc) {
        fa_cost ck, cd;
        fa_plan_cost(plk, FA_FORWARD, &ck), fa_plan_cost(pld, FA_FORWARD, &cd);
        const double useful = (double)ck.flops_useful; /* the same pairs are visible in both */
        /* no useful flops (every length 0): time per useful flop, and so the ratio, is
         * undefined, not the ratio of two timings of nothing */
        char ratio[64];
        if (ck.flops_useful > 0) snprintf(ratio, sizeof ratio, "%.4g", tk / td);
        else snprintf(ratio, sizeof ratio, "null");
        if (a->json)
            printf("{\"varlen\": {\"seconds\": %.6g, \"useful_gflops\": %.6g, \"flops\": %" PRId64 "}, \"padded\": "
                   "{\"seconds\": %.6g, \"useful_gflops\": %.6g, \"flops\": %" PRId64 "}, \"flops_useful\": %" PRId64
                   ", \"time_per_useful_flop_ratio\": %s}\n",
                   tk, useful / tk * 1e-9, ck.flops, td, useful / td * 1e-9, cd.flops, ck.flops_useful, ratio);
        else {
            printf("packed    %10.4f s  %8.2f useful GFLOP/s (%" PRId64 " flops computed)\n"
                   "padded    %10.4f s  %8.2f useful GFLOP/s (%" PRId64 " flops computed, segment ids)\n",
                   tk, useful / tk * 1e-9, ck.flops, td, useful / td * 1e-9, cd.flops);
            if (ck.flops_useful > 0)
                printf("useful flops %" PRId64 "; packed time per useful flop = %.3f x padded's\n", ck.flops_useful,
                       tk / td);
            else
                printf("useful flops 0; packed time per useful flop: undefined (no useful flops)\n");
        }
    }
    free(q), free(k), free(v), free(o), free(lse), free(qs), free(ks), free(cu);
    fa_plan_destroy(plk), fa_plan_destroy(pld);
    return rc;
}

int cli_bench_unread_flags(const cli_args *a) {
    if (a->decode && a->varlen_lens) return cli_fail(2, "bench: --decode and --varlen are separate benchmarks");
    const struct { int given; const char *flag; } decode_only[] = {
        {a->huge_pages, "--huge-pages"}, {a->layers != 0, "--layers"}, {a->page_size != 0, "--page-size"},
        {a->cache_len != 0, "--cache-len"}};
    for (size_t i = 0; !a->decode && i < sizeof decode_only / sizeof decode_only[0]; i++)
        if (decode_only[i].given)
            return cli_fail(2, "bench: %s applies to --decode (its caches) only", decode_only[i].flag);
    /* --varlen's lengths give the batch and every sequence; --decode reads --batch and --seq-q
     * (the new tokens), --cache-len giving the keys */
    const struct { int given; const char *flag; int decode_reads; } shaped[] = {
        {a->seq != 0, "--seq", 0}, {a->seq_k != 0, "--seq-k", 0}, {a->seq_q != 0, "--seq-q", 1},
        {a->batch != 0, "--batch", 1}};
    for (size_t i = 0; i < sizeof shaped / sizeof shaped[0]; i++) {
        if (!shaped[i].given) continue;
        if (a->varlen_lens)
            return cli_fail(2, "bench: %s does not apply to --varlen (its lengths give the batch and sequences)",
                            shaped[i].flag);
        if (a->decode && !shaped[i].decode_reads)
            return cli_fail(2, "bench: %s does not apply to --decode (--cache-len gives the keys, --seq-q the new "
                            "tokens)", shaped[i].flag);
    }
    return 0;
}

int cli_bench_inference(const cli_args *a) {
    int rc = cli_bench_unread_flags(a);
    if (rc) return rc;
    return a->decode ? bench_decode(a) : bench_varlen(a);
}
