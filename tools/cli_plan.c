/* `flashattn plan`: the plan of a problem described by flags alone (option files are read for
 * their headers only), its cost for both passes, and whether it fits a memory budget. */
#include "cli.h"
#include "rates.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* x in the largest of seven units, each base times the last ("%.2f" but plain units whole). */
static const char *human(double x, double base, const char *const u[7], char *buf, size_t len) {
    int i = 0;
    while (x >= base && i < 6) x /= base, i++;
    snprintf(buf, len, i ? "%.2f%s" : "%.0f%s", x, u[i]);
    return buf;
}

const char *cli_human_bytes(double b, char *buf, size_t len) {
    static const char *const u[7] = {" B", " KiB", " MiB", " GiB", " TiB", " PiB", " EiB"};
    return human(b, 1024, u, buf, len);
}

const char *cli_human_count(double x, char *buf, size_t len) {
    static const char *const u[7] = {"", " K", " M", " G", " T", " P", " E"};
    return human(x, 1000, u, buf, len);
}

/* The budget when none is given: this machine's memory. */
static int64_t default_budget(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0) return INT64_MAX;
    return (int64_t)pages * size;
}

static void json_cost(const char *name, const fa_cost *c, int64_t bq, int64_t bk) {
    printf("\"%s\": {\"flops\": %" PRId64 ", \"flops_useful\": %" PRId64
           ", \"transcendentals\": %" PRId64 ", \"bytes_accessed\": %" PRId64
           ", \"min_bytes\": %" PRId64 ", \"workspace_bytes\": %" PRId64
           ", \"peak_bytes\": %" PRId64 ", \"naive_peak_bytes\": %" PRId64
           ", \"block_q\": %" PRId64 ", \"block_k\": %" PRId64 "}",
           name, c->flops, c->flops_useful, c->transcendentals, c->bytes_accessed, c->min_bytes,
           c->workspace_bytes, c->peak_bytes, c->naive_peak_bytes, bq, bk);
}

static const char *tf(int b) { return b ? "true" : "false"; }

/* Both passes' predicted seconds from the cached rates r (rates.h; NULL: none for this
 * kernel set and thread count, or not a CPU plan); 0 when there are none. */
static int predict(const fa_plan *plan, const cli_rates *r, cli_prediction *f, cli_prediction *b) {
    return r && !cli_rates_predict(r, plan, FA_FORWARD, f) && !cli_rates_predict(r, plan, FA_BACKWARD, b);
}

static void print_json(const fa_plan *plan, const cli_rates *r, const fa_cost *f, const fa_cost *b, int64_t budget) {
    const fa_problem *p = fa_plan_problem(plan);
    int64_t fq, fk, bq, bk;
    fa_plan_blocks(plan, FA_FORWARD, &fq, &fk);
    fa_plan_blocks(plan, FA_BACKWARD, &bq, &bk);
    int cuda = fa_plan_backend(plan) == FA_BACKEND_CUDA;
    printf("{\"backend\": \"%s\", ", cuda ? "cuda" : "cpu");
    const int none = bq == 0; /* a plan with no backward (fa_plan_cost): null, not zeros */
    json_cost("forward", f, fq, fk);
    printf(", ");
    if (none) printf("\"backward\": null");
    else json_cost("backward", b, bq, bk);
    printf(", \"exact\": %s, \"fits\": %s, \"fits_backward\": %s, \"naive_fits\": %s",
           tf(fa_plan_exact(plan)), tf(f->peak_bytes <= budget), none ? "null" : tf(b->peak_bytes <= budget),
           tf(f->naive_peak_bytes <= budget));
    printf(", \"memory_budget\": %" PRId64 ", \"isa\": \"%s\", \"threads\": %d", budget,
           cuda ? "cuda" : fa_cpu_isa(), fa_plan_threads(plan));
    cli_prediction pf, pb;
    if (predict(plan, r, &pf, &pb) && none)
        printf(", \"predicted_seconds\": {\"forward\": %.6g, \"backward\": null}", pf.seconds);
    else if (predict(plan, r, &pf, &pb))
        printf(", \"predicted_seconds\": {\"forward\": %.6g, \"backward\": %.6g}", pf.seconds, pb.seconds);
    else
        printf(", \"predicted_seconds\": null");
    printf(", \"problem\": {\"batch\": %" PRId64 ", \"heads_q\": %" PRId64 ", \"heads_kv\": %" PRId64
           ", \"seq_q\": %" PRId64 ", \"seq_k\": %" PRId64 ", \"head_dim\": %" PRId64
           ", \"head_dim_v\": %" PRId64 ", \"dtype\": \"%s\", \"scale\": %.9g, \"causal\": %s"
           ", \"window\": [%" PRId64 ", %" PRId64 "], \"softcap\": %.9g, \"bias\": %s"
           ", \"alibi\": %s, \"segment_ids\": %s, \"dropout\": %.9g, \"dropout_keep_rate\": %.9g",
           p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_k, p->head_dim, p->head_dim_v,
           fa_dtype_name(p->dtype), (double)fa_plan_scale(plan), tf(p->causal), p->window_left,
           p->window_right, (double)p->softcap, tf(p->has_bias), tf(p->has_alibi),
           tf(p->has_segment_ids), (double)p->dropout_p, fa_dropout_keep_rate(p->dropout_p));
    if (p->has_diag_offset) printf(", \"diag_offset\": %" PRId64, p->diag_offset);
    else printf(", \"diag_offset\": null"); /* causal and windows aligned bottom-right */
    if (p->has_bias_scale) printf(", \"bias_scale\": %.9g", (double)p->bias_scale);
    else printf(", \"bias_scale\": null");
    printf(", \"sinks\": %s", tf(p->has_sinks));
    /* the inference shapes: what seq_k means there (a cache's capacity), pages, cache type */
    const int packed = p->cu_seqlens_q || p->lengths_per_call == FA_LENGTHS_PACKED;
    const int decode = p->cache_seqlens || p->lengths_per_call == FA_LENGTHS_CACHE;
    if (packed || decode) {
        printf(", \"inference\": {\"shape\": \"%s\", \"lengths_per_call\": %s", packed ? "packed" : "decode",
               tf(p->lengths_per_call != 0));
        if (decode)
            printf(", \"cache_dtype\": \"%s\", \"page_size\": %" PRId64 ", \"num_pages\": %" PRId64
                   ", \"max_pages\": %" PRId64 ", \"new_kv\": %s, \"shared_prefix_len\": %" PRId64,
                   fa_dtype_name(p->has_cache_dtype ? p->cache_dtype : p->dtype), p->page_size, p->num_pages,
                   p->max_pages, tf(p->has_new_kv), p->shared_prefix_len);
        printf("}");
    } else printf(", \"inference\": null");
    int64_t vis = 0, full = 0, part = 0;
    fa_mask_shape ms;
    if (p->mask && fa_mask_stats(p->mask, &vis, &full, &part) == FA_OK && fa_mask_get_shape(p->mask, &ms) == FA_OK)
        printf(", \"mask\": {\"batch\": %" PRId64 ", \"heads\": %" PRId64 ", \"block_q\": %" PRId64
               ", \"block_k\": %" PRId64 ", \"visible_pairs\": %" PRId64 ", \"full_blocks\": %" PRId64
               ", \"partial_blocks\": %" PRId64 "}}}\n",
               ms.batch, ms.heads, ms.block_q, ms.block_k, vis, full, part);
    else printf(", \"mask\": null}}\n");
}

/* One figure of both passes (none: the plan has no backward, the forward's alone). */
static void human_row(const char *name, int64_t f, int64_t b, int bytes, int none) {
    char hf[32], hb[32];
    if (bytes) {
        cli_human_bytes((double)f, hf, sizeof hf);
        cli_human_bytes((double)b, hb, sizeof hb);
    } else {
        cli_human_count((double)f, hf, sizeof hf);
        cli_human_count((double)b, hb, sizeof hb);
    }
    if (none) printf("  %-17s %22" PRId64 " %s\n", name, f, hf);
    else printf("  %-17s %22" PRId64 " %-11s %22" PRId64 " %s\n", name, f, hf, b, hb);
}

static void print_human(const fa_plan *plan, const cli_rates *r, const fa_cost *f, const fa_cost *b, int64_t budget,
                        int budget_given) {
    const fa_problem *p = fa_plan_problem(plan);
    int64_t fq, fk, bq, bk;
    fa_plan_blocks(plan, FA_FORWARD, &fq, &fk);
    fa_plan_blocks(plan, FA_BACKWARD, &bq, &bk);
    int cuda = fa_plan_backend(plan) == FA_BACKEND_CUDA;
    printf("problem   B=%" PRId64 " Hq=%" PRId64 " Hk=%" PRId64 " Sq=%" PRId64 " Sk=%" PRId64
           " D=%" PRId64 " Dv=%" PRId64 " %s, scale %.6g",
           p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_k, p->head_dim, p->head_dim_v,
           fa_dtype_name(p->dtype), (double)fa_plan_scale(plan));
    if (p->causal) printf(", causal");
    if (p->window_left >= 0 || p->window_right >= 0)
        printf(", window (%" PRId64 ", %" PRId64 ")", p->window_left, p->window_right);
    if (p->has_diag_offset) printf(", diagonal offset %" PRId64, p->diag_offset);
    if (p->softcap > 0) printf(", softcap %.6g", (double)p->softcap);
    if (p->has_bias)
        printf(", bias [%" PRId64 ", %" PRId64 ", %s, Sk]", p->bias_batch, p->bias_heads,
               p->bias_seq_q == 1 && p->seq_q != 1 ? "1" : "Sq");
    if (p->has_bias_scale) printf(", bias scale %.6g", (double)p->bias_scale);
    if (p->has_sinks) printf(", sinks");
    if (p->has_alibi) printf(", alibi");
    if (p->has_segment_ids) printf(", segment ids");
    if (p->has_cache_dtype && p->cache_dtype != p->dtype) /* the cost counts its codes and scales */
        printf(", %s cache", fa_dtype_name(p->cache_dtype));
    if (p->dropout_p > 0)
        printf(", dropout %.6g (keeps %.6g, seed %" PRIu64 ")", (double)p->dropout_p, fa_dropout_keep_rate(p->dropout_p),
               p->dropout_seed);
    int64_t vis = 0, full = 0, part = 0;
    if (p->mask && fa_mask_stats(p->mask, &vis, &full, &part) == FA_OK) /* over the mask's batch and heads */
        printf(", mask (%" PRId64 " visible pairs; %" PRId64 " full and %" PRId64 " partial blocks)", vis, full, part);
    printf("\n");
    if (cuda) printf("backend   cuda\n");
    else printf("backend   cpu (%s kernels, %d threads)\n", fa_cpu_isa(), fa_plan_threads(plan));
    const int none = bq == 0; /* no backward: decoding, lengths per call (fa_plan_cost) */
    if (none)
        printf("blocks    forward %" PRId64 " x %" PRId64 " (query rows x keys); no backward: %s\n", fq, fk,
               p->cache_seqlens || p->lengths_per_call == FA_LENGTHS_CACHE ? "decoding has none"
                                                                           : "a plan of lengths per call has none");
    else
        printf("blocks    forward %" PRId64 " x %" PRId64 ", backward %" PRId64 " x %" PRId64
               " (query rows x keys)\n", fq, fk, bq, bk);
    printf("cost%s\n", fa_plan_exact(plan) ? " (exact)"
                       : p->lengths_per_call ? " at capacity (lengths per call: without the flag, plan gives a call's "
                                               "exact cost)"
                                             : " (upper bound: segment ids may skip more tiles)");
    if (none) printf("  %-17s %34s\n", "", "forward");
    else printf("  %-17s %34s %34s\n", "", "forward", "backward");
    human_row("flops", f->flops, b->flops, 0, none);
    human_row("flops_useful", f->flops_useful, b->flops_useful, 0, none);
    human_row("transcendentals", f->transcendentals, b->transcendentals, 0, none);
    human_row("bytes_accessed", f->bytes_accessed, b->bytes_accessed, 1, none);
    human_row("min_bytes", f->min_bytes, b->min_bytes, 1, none);
    human_row("workspace_bytes", f->workspace_bytes, b->workspace_bytes, 1, none);
    human_row("peak_bytes", f->peak_bytes, b->peak_bytes, 1, none);
    human_row("naive_peak_bytes", f->naive_peak_bytes, b->naive_peak_bytes, 1, none);
    cli_prediction pf, pb;
    if (predict(plan, r, &pf, &pb) && none) {
        printf("  %-17s %22.4g %s\n", "predicted_seconds", pf.seconds, "s");
        printf("    (max(flops / (%.0f GFLOP/s x tile efficiency %.2f) + exps, bytes / bandwidth);\n"
               "     rates from `flashattn calibrate`)\n", pf.peak_gflops, pf.efficiency);
    } else if (predict(plan, r, &pf, &pb)) {
        printf("  %-17s %22.4g %-11s %22.4g %s\n", "predicted_seconds", pf.seconds, "s", pb.seconds, "s");
        printf("    (max(flops / (%.0f GFLOP/s x tile efficiency %.2f | %.2f) + exps, bytes / bandwidth);\n"
               "     rates from `flashattn calibrate`)\n", pf.peak_gflops, pf.efficiency, pb.efficiency);
    } else if (fa_plan_backend(plan) == FA_BACKEND_CPU) {
        printf("  predicted_seconds: run `flashattn calibrate --threads %d` once to predict them\n",
               fa_plan_threads(plan));
    }
    char hb[32], hx[32];
    printf("memory budget %s%s\n", cli_human_bytes((double)budget, hb, sizeof hb),
           budget_given ? "" : " (this machine's memory; set with --memory-budget)");
    printf("  flash forward  %s (peak %s)\n", f->peak_bytes <= budget ? "fits" : "does NOT fit",
           cli_human_bytes((double)f->peak_bytes, hx, sizeof hx));
    if (!none)
        printf("  flash backward %s (peak %s)\n", b->peak_bytes <= budget ? "fits" : "does NOT fit",
               cli_human_bytes((double)b->peak_bytes, hx, sizeof hx));
    printf("  naive forward  %s (peak %s)\n",
           f->naive_peak_bytes <= budget ? "fits" : "does NOT fit",
           cli_human_bytes((double)f->naive_peak_bytes, hx, sizeof hx));
}

int cli_plan(const cli_args *a) {
    fa_problem p;
    fa_options o;
    cli_extras x;
    int32_t *lens = NULL; /* varlen and decode: the length arrays, plan inputs */
    int rc = cli_inference_wanted(a) ? cli_inference_problem(a, &p, &lens) : cli_shape_from_flags(a, &p);
    if (rc) return fa_free(lens), rc;
    cli_apply_options(a, &p, &o);
    rc = cli_extras_supported(a, &p, &o);
    if (!rc) rc = cli_extras_load(a, &p, 0, &x); /* headers only: a plan never reads tensor data */
    if (rc) return fa_free(lens), rc;
    fa_plan *plan;
    rc = cli_plan_create(&p, &o, &plan);
    if (!rc && p.lengths_per_call && lens) { /* the lengths a call would pass: judged as that call would */
        const int packed = p.lengths_per_call == FA_LENGTHS_PACKED;
        fa_cost c;
        if (fa_plan_cost_lengths(plan, FA_FORWARD, packed ? NULL : lens, packed ? lens : NULL,
                                 packed ? lens + p.batch + 1 : NULL, &c) != FA_OK) {
            const char *msg = fa_last_error(), *own = strstr(msg, "fa_plan_cost_lengths: ");
            rc = cli_fail(2, "%s: %s", packed ? "--cu-seqlens-q/-k" : "--cache-seqlens",
                          own == msg ? msg + strlen("fa_plan_cost_lengths: ") : msg); /* not a call the user made */
            fa_plan_destroy(plan);
        }
    }
    fa_free(lens);
    if (rc) return rc;
    fa_cost f, b;
    fa_status st = fa_plan_cost(plan, FA_FORWARD, &f);
    if (st == FA_OK) st = fa_plan_cost(plan, FA_BACKWARD, &b);
    if (st != FA_OK) {
        fa_plan_destroy(plan);
        return cli_fail_status(st, "plan cost");
    }
    cli_rates r; /* a cache that cannot be read is a failure, not "no rates" */
    const int loaded = fa_plan_backend(plan) == FA_BACKEND_CPU ? cli_rates_load(fa_cpu_isa(), fa_plan_threads(plan), &r)
                                                               : 1;
    if (loaded < 0) {
        const int e = errno;
        fa_plan_destroy(plan);
        return cli_fail(1, "plan: cannot read the rates cache (`flashattn calibrate`): %s", strerror(e));
    }
    int64_t budget = a->has_budget ? a->budget : default_budget();
    if (a->json) print_json(plan, loaded ? NULL : &r, &f, &b, budget);
    else print_human(plan, loaded ? NULL : &r, &f, &b, budget, a->has_budget);
    fa_plan_destroy(plan);
    return 0;
}
