/* The decode call's checks of what its arguments hold, before anything is written
 * (decode.c calls fa_cpu_decode_check first): the block-table entries a call uses, the
 * rows its appends write (no two into one slot, none into a row some sequence reads), the
 * new rows of a quantized cache (finite) and the scales of every cached row it reads
 * (finite, >= 0). A failed check is FA_ERR_INVALID naming the first offending element; the
 * caches are untouched. */
#include "../internal.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The rows [r0, r1] of a page that an append writes through block_table[b][j]. */
typedef struct {
    int64_t page, r0, r1, b, j;
} dec_write;

static int dec_write_order(const void *x, const void *y) {
    const dec_write *u = x, *w = y;
    if (u->page != w->page) return u->page < w->page ? -1 : 1;
    return u->r0 < w->r0 ? -1 : u->r0 > w->r0;
}

/* FA_ERR_INVALID if two appended rows land in one slot of a page (two sequences' block
 * tables, or one's twice, naming the same page): the cache would then depend on the order
 * of the writes; or if an appended row lands in a row that a sequence reads as cached
 * (block tables may share pages, a common prefix's: appends must go to rows no sequence
 * holds). The written runs, one per (sequence, page), sorted by page and first row: a run
 * that starts before the furthest end so far on its page overlaps it; then each page a
 * sequence reads, found among them by bisection. */
static fa_status dec_check_appends(const struct fa_plan *pl, const fa_forward_args *a, void *scratch) {
    const fa_problem *p = &pl->p;
    const int64_t ps = p->page_size, Sq = p->seq_q;
    int64_t n = 0; /* at most (Sq - 1) / ps + 2 a sequence: fa_decode_check_bytes */
    for (int64_t b = 0; b < p->batch; b++) n += (pl->lens[b] + Sq - 1) / ps - pl->lens[b] / ps + 1;
    dec_write *w = (dec_write *)((char *)scratch + (8 - (uintptr_t)scratch % 8) % 8);
    int64_t k = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t first = pl->lens[b], last = first + Sq - 1;
        for (int64_t j = first / ps; j <= last / ps; j++) {
            const dec_write run = {a->block_table[b * p->max_pages + j], (first > j * ps ? first : j * ps) - j * ps,
                                   (last < j * ps + ps - 1 ? last : j * ps + ps - 1) - j * ps, b, j};
            w[k++] = run;
        }
    }
    qsort(w, (size_t)n, sizeof *w, dec_write_order);
    fa_status s = FA_OK;
    for (int64_t i = 1, far = 0; i < n && !s; i++) {
        if (w[i].page != w[far].page) far = i;
        else if (w[i].r0 <= w[far].r1)
            s = fa_error(FA_ERR_INVALID,
                         "fa_forward: block_table[%lld][%lld] and block_table[%lld][%lld] both name page %lld, and the "
                         "appended tokens would write its row %lld twice",
                         (long long)w[far].b, (long long)w[far].j, (long long)w[i].b, (long long)w[i].j,
                         (long long)w[i].page, (long long)w[i].r0);
        else if (w[i].r1 > w[far].r1) far = i;
    }
    for (int64_t b = 0; b < p->batch && !s; b++) /* the rows each sequence reads: [0, lens[b]) */
        for (int64_t j = 0; j * ps < pl->lens[b] && !s; j++) {
            const int64_t page = a->block_table[b * p->max_pages + j];
            const int64_t last = pl->lens[b] - 1 - j * ps < ps - 1 ? pl->lens[b] - 1 - j * ps : ps - 1;
            int64_t lo = 0, hi = n; /* the first run on page or after it */
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (w[mid].page < page) lo = mid + 1;
                else hi = mid;
            }
            if (lo < n && w[lo].page == page && w[lo].r0 <= last) /* runs sorted by r0: the first starts lowest */
                s = fa_error(FA_ERR_INVALID,
                             "fa_forward: the tokens appended to sequence %lld would write row %lld of page %lld "
                             "(block_table[%lld][%lld]), which sequence %lld reads as its cached position %lld "
                             "(block_table[%lld][%lld])",
                             (long long)w[lo].b, (long long)w[lo].r0, (long long)page, (long long)w[lo].b,
                             (long long)w[lo].j, (long long)b, (long long)(j * ps + w[lo].r0), (long long)b,
                             (long long)j);
        }
    return s;
}

/* 1 if a scale of x[0..n) is not finite and >= 0: one branch-free pass on the bits, which
 * the compiler vectorizes (the float comparisons it was first written as stayed scalar). The
 * finite floats >= 0 are +0 .. FLT_MAX (bits 0 .. 0x7f7fffff) and -0 (0x80000000). */
static int dec_scales_bad(const float *restrict x, int64_t n) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (uint32_t)(u > 0x7f7fffffu) & (uint32_t)(u != 0x80000000u);
    }
    return bad != 0;
}

/* The rows a scale run holds: a sequence's (dense caches) or a page's. Run t0 (a multiple of
 * it) of sequence b: *n rows from cache row *row0. */
static int64_t dec_scale_run(const struct fa_plan *pl) { return pl->p.page_size ? pl->p.page_size : pl->p.seq_k; }
static void dec_scale_rows(const struct fa_plan *pl, const fa_forward_args *a, int64_t b, int64_t t0, int64_t *n,
                           int64_t *row0) {
    const fa_problem *p = &pl->p;
    const int64_t run = dec_scale_run(pl);
    *n = pl->lens[b] - t0 < run ? pl->lens[b] - t0 : run;
    *row0 = p->page_size ? (int64_t)a->block_table[b * p->max_pages + t0 / run] * run : b * run;
}

/* 1 if a scale some row of the call reads is bad. Every call reads them all (2 MiB at 32K
 * tokens, Hk = 8): a pass bound by the memory, which one thread made 3-5% of an fp8 decode
 * call; in blocks spread over the call's threads it costs about half that (bench/RESULTS.md,
 * 2026-12-05 late). */
#define DEC_CHECK_BLOCK 16384 /* floats */
static int dec_quant_scales_bad(const struct fa_plan *pl, const fa_forward_args *a, int threads) {
    const fa_problem *p = &pl->p;
    const int64_t Hk = p->heads_kv, run = dec_scale_run(pl);
    int64_t total = 0;
    for (int64_t b = 0; b < p->batch; b++) total += pl->lens[b] * Hk;
    if (total < 4 * DEC_CHECK_BLOCK) threads = 1; /* not worth a parallel region */
    int bad = 0;
#pragma omp parallel num_threads(threads) reduction(| : bad)
    {
        const int64_t me = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t blk = 0; /* blocks in one order for every thread; block blk is thread blk % nt's */
        for (int x = 0; x < 2; x++) {
            const float *sc = x ? a->v_scale : a->k_scale;
            for (int64_t b = 0; b < p->batch; b++)
                for (int64_t t0 = 0; t0 < pl->lens[b]; t0 += run) {
                    int64_t n, row0;
                    dec_scale_rows(pl, a, b, t0, &n, &row0);
                    for (int64_t i = 0; i < n * Hk; i += DEC_CHECK_BLOCK, blk++) {
                        const int64_t len = n * Hk - i < DEC_CHECK_BLOCK ? n * Hk - i : DEC_CHECK_BLOCK;
                        if (blk % nt == me) bad |= dec_scales_bad(sc + row0 * Hk + i, len);
                    }
                }
        }
    }
    return bad;
}

/* A quantized cache's scales of every row a call reads (finite, >= 0) and its new rows
 * (finite: an int8 or fp8 code cannot hold inf or NaN), before anything is written. The
 * scale layout follows the rows (dec_scale_at); block-table entries were checked. */
static fa_status dec_check_quant(const struct fa_plan *pl, const fa_forward_args *a) {
    const fa_problem *p = &pl->p;
    const int64_t Hk = p->heads_kv, run = dec_scale_run(pl);
    const int bad = dec_quant_scales_bad(pl, a, fa_call_threads(pl));
    for (int x = 0; x < 2 && bad; x++) { /* the first bad one, for the message */
        const float *sc = x ? a->v_scale : a->k_scale;
        for (int64_t b = 0; b < p->batch; b++)
            for (int64_t t0 = 0; t0 < pl->lens[b]; t0 += run) {
                int64_t n, row0;
                dec_scale_rows(pl, a, b, t0, &n, &row0);
                for (int64_t i = 0; i < n * Hk; i++) {
                    const float v = sc[row0 * Hk + i];
                    if (!isfinite(v) || v < 0.0f)
                        return fa_error(FA_ERR_INVALID,
                                        "fa_forward: %s[%lld] (sequence %lld, cache row %lld, kv head %lld) is %g; the "
                                        "scales of a quantized cache must be finite and >= 0",
                                        x ? "v_scale" : "k_scale", (long long)(row0 * Hk + i), (long long)b,
                                        (long long)(t0 + i / Hk), (long long)(i % Hk), (double)v);
                }
            }
    }
    if (!p->has_new_kv) return FA_OK;
    for (int x = 0; x < 2; x++) {
        const int64_t D = x ? p->head_dim_v : p->head_dim, n = p->batch * p->seq_q * Hk * D;
        const void *src = x ? a->v_new : a->k_new;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(fa_load(p->dtype, src, i))) /* [B, Sq_new, Hk, D]: the index as a caller writes it */
                return fa_error(FA_ERR_INVALID,
                                "fa_forward: %s[%lld, %lld, %lld, %lld] (element %lld of [B, Sq_new, Hk, D]) is not "
                                "finite; an %s cache cannot hold it",
                                x ? "v_new" : "k_new", (long long)(i / D / Hk / p->seq_q),
                                (long long)(i / D / Hk % p->seq_q), (long long)(i / D % Hk), (long long)(i % D),
                                (long long)i, fa_dtype_name(p->cache_dtype));
    }
    return FA_OK;
}

/* internal.h: every block-table entry a call uses, the appends' rows and a quantized cache's
 * scales, before anything is written (the pointers were checked at the entry, args.c). */
int64_t fa_decode_check_bytes(const struct fa_plan *pl) {
    const fa_problem *p = &pl->p;
    if (!p->page_size || !p->has_new_kv) return 0;
    const __int128 n = (__int128)p->batch * ((p->seq_q - 1) / p->page_size + 2) * (__int128)sizeof(dec_write) + 8;
    return n > INT64_MAX ? INT64_MAX : (int64_t)n;
}

fa_status fa_cpu_decode_check_pages(const struct fa_plan *pl, const fa_forward_args *a) {
    const fa_problem *p = &pl->p;
    if (!p->page_size) return FA_OK;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t used = (fa_decode_keys(pl, b) + p->page_size - 1) / p->page_size;
        for (int64_t j = 0; j < used; j++) {
            const int32_t id = a->block_table[b * p->max_pages + j];
            if (id < 0 || id >= p->num_pages)
                return fa_error(FA_ERR_INVALID,
                                "fa_forward: block_table[%lld][%lld] = %d is out of range [0, %lld) (num_pages)",
                                (long long)b, (long long)j, id, (long long)p->num_pages);
        }
    }
    return FA_OK;
}

fa_status fa_cpu_decode_check(const struct fa_plan *pl, const fa_forward_args *a, void *scratch) {
    const fa_problem *p = &pl->p;
    if (!p->page_size) return fa_dtype_quantized(fa_cache_dtype(p)) ? dec_check_quant(pl, a) : FA_OK;
    fa_status s = fa_cpu_decode_check_pages(pl, a);
    if (s) return s;
    s = p->has_new_kv ? dec_check_appends(pl, a, scratch) : FA_OK;
    return !s && fa_dtype_quantized(fa_cache_dtype(p)) ? dec_check_quant(pl, a) : s;
}
