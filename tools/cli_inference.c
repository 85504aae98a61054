/* `flashattn run` and `plan` for the inference shapes (docs/cli.md, docs/semantics.md): packed
 * variable-length batches (--cu-seqlens-q/-k) and kv-cache decoding (--cache-seqlens,
 * optionally paged with --block-table, appending --k-new/--v-new); `flashattn grad` for
 * packed batches (the varlen backward: dq, dk, dv packed like q, k, v). As for dense runs, every
 * header is checked, the plan made (it validates the lengths) and every output opened (an
 * unnamed file, tools/npy.h) before any data is read; outputs, and with --update-cache the
 * rewritten caches, appear only when everything succeeded. The caches are rewritten as
 * float32 .npy at their own paths. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_inference_wanted(const cli_args *a) { return a->cu_seqlens_q || a->cu_seqlens_k || a->cache_seqlens; }

/* An int32 file of ndim dimensions, data included. */
static int read_i32(const char *flag, const char *path, int ndim, npy_header *h, int32_t **data) {
    char err[NPY_ERR_LEN], sh[256];
    int rc = npy_read(path, NPY_I32, h, (void **)data, err, sizeof err);
    if (rc) return cli_fail(rc, "%s %s", flag, err);
    if (h->ndim != ndim || h->count == 0) {
        fa_free(*data);
        *data = NULL;
        npy_shape_str(h->ndim, h->shape, sh, sizeof sh);
        return cli_fail(2, "%s %s: shape %s is not a non-empty %d-D int32 array", flag, path, sh, ndim);
    }
    return 0;
}

/* A float tensor's header, of ndim dimensions, none zero. */
static int float_header(const char *flag, const char *path, int ndim, npy_header *h) {
    char err[NPY_ERR_LEN], sh[256];
    int rc = npy_read_header(path, NPY_F32 | NPY_F16, h, err, sizeof err);
    if (rc) return cli_fail(rc, "%s %s", flag, err);
    npy_shape_str(h->ndim, h->shape, sh, sizeof sh);
    if (h->ndim != ndim || h->count == 0)
        return cli_fail(2, "%s %s: shape %s is not a %d-D tensor without zero dimensions", flag, path, sh, ndim);
    return 0;
}

static int dim_is(const char *flag, const char *path, const char *what, int64_t got, const char *ref, int64_t want) {
    if (got == want) return 0;
    return cli_fail(2, "%s %s: %s %" PRId64 " does not match %s's %" PRId64, flag, path, what, got, ref, want);
}

/* The lengths of `plan`: cu_seqlens (two arrays, one allocation) or cache_seqlens. */
int cli_inference_problem(const cli_args *a, fa_problem *p, int32_t **lens) {
    *lens = NULL;
    if (!a->heads || !a->head_dim) return cli_fail(2, "%s: missing %s", a->name, !a->heads ? "--heads" : "--head-dim");
    if (a->kv_heads && a->heads % a->kv_heads)
        return cli_fail(2, "%s: --heads %" PRId64 " is not a multiple of --kv-heads %" PRId64, a->name, a->heads,
                        a->kv_heads);
    fa_problem_init(p);
    p->heads_q = a->heads, p->heads_kv = a->kv_heads ? a->kv_heads : a->heads;
    p->head_dim = a->head_dim, p->head_dim_v = a->v_head_dim ? a->v_head_dim : a->head_dim;
    p->dtype = a->has_dtype ? a->dtype : FA_F32;
    npy_header h, h2;
    int32_t *x = NULL, *y = NULL;
    int rc;
    if (a->cu_seqlens_q) {
        if ((rc = read_i32("--cu-seqlens-q", a->cu_seqlens_q, 1, &h, &x))) return rc;
        if ((rc = read_i32("--cu-seqlens-k", a->cu_seqlens_k, 1, &h2, &y))) return fa_free(x), rc;
        const int64_t n = h.count;
        if (h2.count != n || n < 2) {
            fa_free(x), fa_free(y);
            return cli_fail(2, "--cu-seqlens-q has %" PRId64 " entries and --cu-seqlens-k %" PRId64
                               "; both must be batch + 1 >= 2", n, h2.count);
        }
        if (a->batch && a->batch != n - 1) {
            fa_free(x), fa_free(y);
            return cli_fail(2, "--batch %" PRId64 " does not match the %" PRId64 " sequences of --cu-seqlens-q",
                            a->batch, n - 1);
        }
        int32_t *both = fa_malloc(sizeof(int32_t) * (size_t)(2 * n));
        if (!both) return fa_free(x), fa_free(y), cli_fail(1, "out of memory");
        memcpy(both, x, sizeof(int32_t) * (size_t)n);
        memcpy(both + n, y, sizeof(int32_t) * (size_t)n);
        fa_free(x), fa_free(y);
        p->batch = n - 1, p->seq_q = both[n - 1], p->seq_k = both[2 * n - 1];
        p->cu_seqlens_q = both, p->cu_seqlens_k = both + n;
        *lens = both;
        /* --seq-q / --seq-k (or --seq for both): with --lengths-per-call the capacities, at
         * least the sums' ends; without, the rows the sums reach, so one that differs is refused
         * rather than ignored */
        const int64_t given[2] = {a->seq_q ? a->seq_q : a->seq, a->seq_k ? a->seq_k : a->seq};
        for (int x = 0; x < 2; x++) {
            const int64_t end = x ? p->seq_k : p->seq_q;
            const char *flag = (x ? a->seq_k : a->seq_q) ? (x ? "--seq-k" : "--seq-q") : "--seq";
            if (!given[x] || given[x] == end || (a->lengths_per_call && given[x] > end)) continue;
            return cli_fail(2, "%s %" PRId64 " %s the %" PRId64 " rows --cu-seqlens-%c reaches%s", flag, given[x],
                            a->lengths_per_call ? "is below" : "does not match", end, x ? 'k' : 'q',
                            a->lengths_per_call ? " (a capacity holds them)" : "");
        }
        if (a->lengths_per_call) { /* capacities: --seq-q / --seq-k / --seq, else the sums' ends */
            p->lengths_per_call = FA_LENGTHS_PACKED, p->cu_seqlens_q = p->cu_seqlens_k = NULL;
            if (given[0]) p->seq_q = given[0];
            if (given[1]) p->seq_k = given[1];
        }
        return 0;
    }
    if ((rc = read_i32("--cache-seqlens", a->cache_seqlens, 1, &h, &x))) return rc;
    p->batch = h.count;
    p->cache_seqlens = x;
    *lens = x;
    if (a->lengths_per_call) p->lengths_per_call = FA_LENGTHS_CACHE, p->cache_seqlens = NULL; /* capacities only */
    if (a->batch && a->batch != p->batch)
        return cli_fail(2, "--batch %" PRId64 " does not match the %" PRId64 " entries of --cache-seqlens", a->batch,
                        p->batch);
    p->seq_q = a->seq_q ? a->seq_q : a->seq ? a->seq : 1; /* new tokens per sequence */
    if (a->k_prefix) { /* a shared prefix: its rows from the header */
        if ((rc = float_header("--k-prefix", a->k_prefix, 3, &h2))) return rc;
        p->shared_prefix_len = h2.shape[0];
    }
    if (a->k_new) {
        if ((rc = float_header("--k-new", a->k_new, 4, &h2)) ||
            (rc = dim_is("--k-new", a->k_new, "batch", h2.shape[0], "--cache-seqlens", p->batch)))
            return rc;
        p->has_new_kv = 1, p->seq_q = h2.shape[1];
    }
    if (a->block_table) {
        if (!a->page_size || !a->num_pages)
            return cli_fail(2, "%s: --block-table needs --page-size and --num-pages here", a->name);
        char err[NPY_ERR_LEN];
        if ((rc = npy_read_header(a->block_table, NPY_I32, &h2, err, sizeof err)))
            return cli_fail(rc, "--block-table %s", err);
        if (h2.ndim == 2 && h2.shape[0] == p->batch && h2.shape[1] < 1) /* the command line's rule (cli.md) */
            return cli_fail(2, "--block-table %s: shape [%" PRId64 ", 0] has a zero dimension", a->block_table,
                            p->batch);
        if (h2.ndim != 2 || h2.shape[0] != p->batch)
            return cli_fail(2, "--block-table %s: must be int32 [batch = %" PRId64 ", max_pages]", a->block_table,
                            p->batch);
        p->page_size = a->page_size, p->num_pages = a->num_pages, p->max_pages = h2.shape[1];
        if (__builtin_mul_overflow(p->max_pages, p->page_size, &p->seq_k))
            return cli_fail(2, "--block-table %s: %" PRId64 " pages of --page-size %" PRId64 " overflow int64",
                            a->block_table, p->max_pages, p->page_size);
        const int64_t sk = a->seq_k ? a->seq_k : a->seq; /* the capacity is the table's */
        if (sk && sk != p->seq_k)
            return cli_fail(2, "%s %" PRId64 " does not match the paged capacity: --block-table's %" PRId64
                               " pages x --page-size %" PRId64 " = %" PRId64, a->seq_k ? "--seq-k" : "--seq", sk,
                            p->max_pages, p->page_size, p->seq_k);
        return 0;
    }
    p->seq_k = a->seq_k ? a->seq_k : a->seq;
    if (!p->seq_k) return cli_fail(2, "%s: missing --seq-k (the cache capacity S_cache_max)", a->name);
    return 0;
}

typedef struct {
    const char *flag, *path;
    int ndim;
    int64_t shape[4];
    int slot; /* 0 o, 1 lse (f32), 2 the k cache, 3 the v cache, 4 dq, 5 dk, 6 dv, 7 dsink (f32) */
    npy_out file;
} out_file;

/* Everything a run holds, freed in one place. */
typedef struct {
    npy_header hq, hk, hv, hkn, hvn, h1, h2, hb, hdo, hkp, hvp;
    int32_t *lens_q, *lens_k, *table;
    void *q, *k, *v, *kn, *vn, *o, *d_o, *dq, *dk, *dv, *kp, *vp;
    float *lse;
    out_file outs[8];
    int nout, opened;
    char *cache_path[2]; /* --update-cache: where the k and v caches are rewritten (a link's target) */
    fa_plan *plan;
    cli_extras x;
} run_state;

static void release(run_state *s) {
    for (int i = 0; i < s->opened; i++) npy_out_abort(&s->outs[i].file);
    void *bufs[] = {s->lens_q, s->lens_k, s->table, s->q, s->k, s->v, s->kn, s->vn, s->o, s->lse,
                    s->d_o, s->dq, s->dk, s->dv, s->kp, s->vp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) fa_free(bufs[i]);
    cli_extras_free(&s->x);
    fa_plan_destroy(s->plan);
    free(s->cache_path[0]), free(s->cache_path[1]);
}

/* Where a cache rewritten in place goes: the path itself, or where a symbolic link (a chain
 * of them) ends, so that the file the link names is updated and the link stays a link (a
 * rename onto the link would replace it with a regular file and leave its target stale). */
static int cache_target(const char *flag, const char *path, char **out) {
    struct stat st;
    *out = NULL;
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return 0;
    if (!(*out = realpath(path, NULL)))
        return cli_fail(2, "%s %s: cannot resolve the symbolic link: %s", flag, path, strerror(errno));
    return 0;
}

static void add_out(run_state *s, const char *flag, const char *path, int slot, int ndim, const int64_t *shape) {
    if (!path) return;
    out_file *o = &s->outs[s->nout++];
    memset(o, 0, sizeof *o);
    o->flag = flag, o->path = path, o->slot = slot, o->ndim = ndim;
    memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

/* Headers and lengths of a run into the problem (no tensor data yet). */
static int describe(const cli_args *a, run_state *s, fa_problem *p) {
    int rc;
    fa_problem_init(p);
    const int varlen = a->cu_seqlens_q != NULL, nd = varlen ? 3 : 4;
    if ((rc = float_header("--q", a->q, nd, &s->hq)) || (rc = float_header("--k", a->k, nd, &s->hk)) ||
        (rc = float_header("--v", a->v, nd, &s->hv)))
        return rc;
    const int64_t *Q = s->hq.shape, *K = s->hk.shape, *V = s->hv.shape;
    if ((rc = dim_is("--v", a->v, "rows", V[0], "k", K[0])) || (rc = dim_is("--v", a->v, "dim 1", V[1], "k", K[1])) ||
        (rc = dim_is("--k", a->k, "head dim", K[nd - 1], "q", Q[nd - 1])) ||
        (varlen ? 0 : (rc = dim_is("--v", a->v, "dim 2", V[2], "k", K[2]))))
        return rc;
    const int64_t Hq = Q[nd - 2], Hk = K[nd - 2];
    if (Hq % Hk) return cli_fail(2, "q has %" PRId64 " heads, not a multiple of k's %" PRId64, Hq, Hk);
    p->heads_q = Hq, p->heads_kv = Hk, p->head_dim = Q[nd - 1], p->head_dim_v = V[nd - 1];
    if (a->has_dtype) p->dtype = a->dtype;
    else if (s->hq.kind != s->hk.kind || s->hq.kind != s->hv.kind)
        return cli_fail(2, "q, k and v do not share a dtype; pass --dtype to cast them");
    else p->dtype = s->hq.kind == NPY_F32 ? FA_F32 : FA_F16;
    if (varlen) {
        if ((rc = read_i32("--cu-seqlens-q", a->cu_seqlens_q, 1, &s->h1, &s->lens_q)) ||
            (rc = read_i32("--cu-seqlens-k", a->cu_seqlens_k, 1, &s->h2, &s->lens_k)))
            return rc;
        if (s->h1.count != s->h2.count || s->h1.count < 2)
            return cli_fail(2, "--cu-seqlens-q has %" PRId64 " entries and --cu-seqlens-k %" PRId64
                               "; both must be batch + 1 >= 2", s->h1.count, s->h2.count);
        p->batch = s->h1.count - 1, p->seq_q = Q[0], p->seq_k = K[0];
        p->cu_seqlens_q = s->lens_q, p->cu_seqlens_k = s->lens_k;
        if (a->cmd != CMD_GRAD) return 0;
        /* do is packed like o [total_q, Hq, Dv]: each dim named, with the file it comes from */
        const int64_t want[3] = {Q[0], Hq, p->head_dim_v};
        const char *what[3] = {"rows total_q", "heads Hq", "head dim Dv"}, *from[3] = {"--q", "--q", "--v"};
        if ((rc = float_header("--do", a->d_o, 3, &s->hdo))) return rc;
        for (int d = 0; d < 3; d++)
            if ((rc = dim_is("--do", a->d_o, what[d], s->hdo.shape[d], from[d], want[d]))) return rc;
        if (!a->has_dtype && s->hdo.kind != s->hq.kind)
            return cli_fail(2, "do and q do not share a dtype; pass --dtype to cast them");
        return 0;
    }
    if ((rc = read_i32("--cache-seqlens", a->cache_seqlens, 1, &s->h1, &s->lens_q))) return rc;
    p->batch = s->h1.count, p->seq_q = Q[1], p->cache_seqlens = s->lens_q;
    if ((rc = dim_is("--q", a->q, "batch", Q[0], "--cache-seqlens", p->batch))) return rc;
    if (a->block_table) {
        if ((rc = read_i32("--block-table", a->block_table, 2, &s->hb, &s->table)) ||
            (rc = dim_is("--block-table", a->block_table, "batch", s->hb.shape[0], "--cache-seqlens", p->batch)))
            return rc;
        p->page_size = K[1], p->num_pages = K[0], p->max_pages = s->hb.shape[1], p->seq_k = p->max_pages * K[1];
    } else {
        if ((rc = dim_is("--k", a->k, "batch", K[0], "--cache-seqlens", p->batch))) return rc;
        p->seq_k = K[1];
    }
    if (a->k_new) {
        const char *nf[2] = {"--k-new", "--v-new"}, *np[2] = {a->k_new, a->v_new};
        npy_header *nh[2] = {&s->hkn, &s->hvn};
        for (int i = 0; i < 2; i++) { /* [B, Sq_new, Hk, D] and [B, Sq_new, Hk, Dv]: each dim named, with its source */
            const int64_t want[4] = {p->batch, p->seq_q, Hk, i ? p->head_dim_v : p->head_dim};
            const char *what[4] = {"batch", "Sq_new", "kv heads Hk", i ? "head dim Dv" : "head dim D"},
                       *from[4] = {"--cache-seqlens", "--q", i ? "--v" : "--k", i ? "--v" : "--k"};
            if ((rc = float_header(nf[i], np[i], 4, nh[i]))) return rc;
            for (int d = 0; d < 4; d++)
                if ((rc = dim_is(nf[i], np[i], what[d], nh[i]->shape[d], from[d], want[d]))) return rc;
        }
        p->has_new_kv = 1;
    }
    if (a->k_prefix) { /* the shared prefix: [P, Hk, D] and [P, Hk, Dv] */
        if ((rc = float_header("--k-prefix", a->k_prefix, 3, &s->hkp)) ||
            (rc = float_header("--v-prefix", a->v_prefix, 3, &s->hvp)))
            return rc;
        const int64_t P = s->hkp.shape[0], want[2][3] = {{P, Hk, p->head_dim}, {P, Hk, p->head_dim_v}};
        const char *what[2][3] = {{"rows P", "kv heads Hk", "head dim D"}, {"rows P", "kv heads Hk", "head dim Dv"}},
                   *from[2][3] = {{"--k-prefix", "--k", "--k"}, {"--k-prefix", "--v", "--v"}};
        for (int d = 0; d < 3; d++)
            if ((rc = dim_is("--k-prefix", a->k_prefix, what[0][d], s->hkp.shape[d], from[0][d], want[0][d])) ||
                (rc = dim_is("--v-prefix", a->v_prefix, what[1][d], s->hvp.shape[d], from[1][d], want[1][d])))
                return rc;
        p->shared_prefix_len = P;
    }
    return 0;
}

/* Shape flags given to run or grad must agree with the files, as for dense runs (the
 * totals for packed batches; Sq_new and S_cache_max for caches, as `plan` reads them). */
static int flags_agree(const cli_args *a, const fa_problem *p) {
    const struct {
        const char *flag;
        int64_t given, actual;
    } c[] = {{"--batch", a->batch, p->batch},          {"--heads", a->heads, p->heads_q},
             {"--kv-heads", a->kv_heads, p->heads_kv}, {"--head-dim", a->head_dim, p->head_dim},
             {"--v-head-dim", a->v_head_dim, p->head_dim_v}, {"--seq-q", a->seq_q, p->seq_q},
             {"--seq-k", a->seq_k, p->seq_k},          {"--seq", a->seq, p->seq_q},
             {"--seq", a->seq, p->seq_k}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].given && c[i].given != c[i].actual)
            return cli_fail(2, "%s %" PRId64 " does not match the input files' %" PRId64, c[i].flag, c[i].given,
                            c[i].actual);
    return 0;
}

/* grad: the varlen backward of sum(o * do) after the forward that made o and lse. */
static int backward(const cli_args *a, run_state *s, const fa_problem *p, fa_counts *counts) {
    const size_t es = fa_dtype_size(p->dtype);
    const size_t nq = (size_t)s->hq.count, nk = (size_t)s->hk.count, nv = (size_t)s->hv.count;
    s->dq = fa_malloc(nq * es + 1), s->dk = fa_malloc(nk * es + 1), s->dv = fa_malloc(nv * es + 1);
    if (!s->dq || !s->dk || !s->dv) return cli_fail(1, "out of memory (gradients)");
    fa_backward_args bw;
    memset(&bw, 0, sizeof bw);
    bw.q = s->q, bw.k = s->k, bw.v = s->v, bw.o = s->o, bw.lse = s->lse, bw.d_o = s->d_o;
    bw.dq = s->dq, bw.dk = s->dk, bw.dv = s->dv, bw.alibi_slopes = s->x.slopes, bw.counts = counts;
    bw.sinks = s->x.sinks, bw.dsink = s->x.dsink;
    cli_progress pb = {"backward", -1, NULL};
    if (cli_progress_wanted(a, s->plan)) bw.progress = cli_progress_report, bw.progress_ctx = &pb;
    fa_status st = fa_backward(s->plan, &bw);
    return st == FA_OK ? 0 : cli_fail_status(st, "backward");
}

/* --update-cache of a cache computed in another dtype than its file's (bf16 from float32,
 * say): the file's own values (read again as float32, exact for float32 and f16 files) with
 * only the appended rows replaced by theirs, so that the rows already cached keep their
 * precision. cache: the cache the call wrote, as float32; row: floats per (row, all heads). */
static int keep_cached_rows(const cli_args *a, const run_state *s, const fa_problem *p, int v, const float *cache,
                            float **out) {
    const npy_header *h = v ? &s->hv : &s->hk;
    int rc = cli_read_tensor(v ? "--v" : "--k", v ? a->v : a->k, FA_F32, h, (void **)out);
    if (rc) return rc;
    const int64_t row = h->shape[2] * h->shape[3];
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seq_q; i++) {
            const int64_t t = (int64_t)s->lens_q[b] + i;
            const int64_t r = s->table ? (int64_t)s->table[b * p->max_pages + t / p->page_size] * p->page_size +
                                             t % p->page_size
                                       : b * p->seq_k + t;
            memcpy(*out + r * row, cache + r * row, sizeof(float) * (size_t)row);
        }
    return 0;
}

int cli_run_inference(const cli_args *a) {
    const int grad = a->cmd == CMD_GRAD;
    if (cli_need_files(a)) return 2;
    run_state s;
    memset(&s, 0, sizeof s);
    fa_problem p;
    fa_options opt;
    int rc = describe(a, &s, &p);
    if (!rc) rc = flags_agree(a, &p);
    if (!rc && a->lengths_per_call) { /* the plan from the files' capacities; the lengths go with the call */
        p.lengths_per_call = a->cu_seqlens_q ? FA_LENGTHS_PACKED : FA_LENGTHS_CACHE;
        p.cu_seqlens_q = p.cu_seqlens_k = p.cache_seqlens = NULL;
    }
    if (!rc) {
        cli_apply_options(a, &p, &opt);
        rc = cli_extras_supported(a, &p, &opt); /* the library's refusal before any file's shape check */
        if (!rc) rc = cli_extras_load(a, &p, 0, &s.x);
    }
    if (!rc) rc = cli_plan_create(&p, &opt, &s.plan);
    if (rc) return release(&s), rc;
    const int varlen = a->cu_seqlens_q != NULL;
    const int64_t o_shape[4] = {varlen ? p.seq_q : p.batch, varlen ? p.heads_q : p.seq_q,
                                varlen ? p.head_dim_v : p.heads_q, p.head_dim_v};
    const int64_t l_shape[3] = {varlen ? p.heads_q : p.batch, varlen ? p.seq_q : p.heads_q, p.seq_q};
    add_out(&s, "--out", a->out, 0, varlen ? 3 : 4, o_shape);
    add_out(&s, "--lse", a->lse, 1, varlen ? 2 : 3, l_shape);
    if (a->update_cache) {
        if ((rc = cache_target("--k", a->k, &s.cache_path[0])) || (rc = cache_target("--v", a->v, &s.cache_path[1])))
            return release(&s), rc;
        add_out(&s, "--k", s.cache_path[0] ? s.cache_path[0] : a->k, 2, 4, s.hk.shape);
        add_out(&s, "--v", s.cache_path[1] ? s.cache_path[1] : a->v, 3, 4, s.hv.shape);
    }
    if (grad) { /* packed like q, k and v */
        add_out(&s, "--dq", a->dq, 4, 3, s.hq.shape);
        add_out(&s, "--dk", a->dk, 5, 3, s.hk.shape);
        add_out(&s, "--dv", a->dv, 6, 3, s.hv.shape);
        const int64_t hq[1] = {p.heads_q};
        if (p.has_sinks) add_out(&s, "--dsink", a->dsink, 7, 1, hq); /* float32 [Hq], as dense runs write it */
    }
    /* files, not strings: with --update-cache, --out ./kc.npy would replace the --k cache kc.npy */
    for (int i = 0; i < s.nout; i++)
        for (int j = 0; j < i; j++)
            if (npy_same_file(s.outs[i].path, s.outs[j].path)) {
                /* said before release: a cache's path is the realpath release frees */
                rc = cli_fail(2, "%s and %s name the same file %s", s.outs[j].flag, s.outs[i].flag, s.outs[i].path);
                release(&s);
                return rc;
            }
    char err[NPY_ERR_LEN];
    for (; s.opened < s.nout; s.opened++)
        if ((rc = npy_out_open(&s.outs[s.opened].file, s.outs[s.opened].path, err, sizeof err)))
            return release(&s), cli_fail(rc, "%s %s", s.outs[s.opened].flag, err);

    const size_t es = fa_dtype_size(p.dtype);
    const int64_t no = o_shape[0] * o_shape[1] * o_shape[2] * (varlen ? 1 : o_shape[3]);
    const int64_t nl = p.heads_q * (varlen ? p.seq_q : p.batch * p.seq_q);
    if ((rc = cli_read_tensor("--q", a->q, p.dtype, &s.hq, &s.q)) ||
        (rc = cli_read_tensor("--k", a->k, p.dtype, &s.hk, &s.k)) ||
        (rc = cli_read_tensor("--v", a->v, p.dtype, &s.hv, &s.v)) ||
        (a->k_new && (rc = cli_read_tensor("--k-new", a->k_new, p.dtype, &s.hkn, &s.kn))) ||
        (a->v_new && (rc = cli_read_tensor("--v-new", a->v_new, p.dtype, &s.hvn, &s.vn))) ||
        (a->k_prefix && (rc = cli_read_tensor("--k-prefix", a->k_prefix, p.dtype, &s.hkp, &s.kp))) ||
        (a->v_prefix && (rc = cli_read_tensor("--v-prefix", a->v_prefix, p.dtype, &s.hvp, &s.vp))) ||
        (grad && (rc = cli_read_tensor("--do", a->d_o, p.dtype, &s.hdo, &s.d_o))) ||
        (rc = cli_extras_load(a, &p, 1, &s.x)))
        return release(&s), rc;
    s.o = fa_malloc((size_t)no * es + 1);
    s.lse = fa_malloc(sizeof(float) * (size_t)nl + 1);
    if (!s.o || !s.lse) return release(&s), cli_fail(1, "out of memory");
    if (a->lengths_per_call && varlen) { /* rows past the sums' ends, which the call leaves: o = 0, lse = -inf */
        memset(s.o, 0, (size_t)no * es);
        for (int64_t i = 0; i < nl; i++) s.lse[i] = -INFINITY;
    }

    fa_counts counts = {0, 0};
    fa_forward_args fw;
    memset(&fw, 0, sizeof fw);
    fw.q = s.q, fw.k = s.k, fw.v = s.v, fw.o = s.o, fw.lse = s.lse, fw.alibi_slopes = s.x.slopes;
    fw.sinks = s.x.sinks;
    fw.k_new = s.kn, fw.v_new = s.vn, fw.block_table = s.table, fw.counts = grad ? NULL : &counts;
    fw.k_prefix = s.kp, fw.v_prefix = s.vp;
    /* as dense runs show it (a long packed batch is as slow); decoding counts its work items */
    cli_progress ps = {"forward", -1, varlen ? NULL : "work items"};
    if (cli_progress_wanted(a, s.plan)) fw.progress = cli_progress_report, fw.progress_ctx = &ps;
    if (a->lengths_per_call) {
        if (varlen) fw.cu_seqlens_q = s.lens_q, fw.cu_seqlens_k = s.lens_k;
        else fw.cache_seqlens = s.lens_q;
    }
    fa_status st = fa_forward(s.plan, &fw); /* checks every argument before it writes the caches */
    if (st != FA_OK) return release(&s), cli_fail_status(st, "forward");
    if (grad && (rc = backward(a, &s, &p, &counts))) return release(&s), rc; /* --count: the backward's */

    const void *data[8] = {s.o, s.lse, s.k, s.v, s.dq, s.dk, s.dv, s.x.dsink};
    for (int i = 0; i < s.nout && !rc; i++) {
        const int slot = s.outs[i].slot;
        const float *x = data[slot];
        float *conv = NULL;
        if (slot != 1 && slot != 7 && p.dtype != FA_F32) {
            int64_t n = 1;
            for (int d = 0; d < s.outs[i].ndim; d++) n *= s.outs[i].shape[d];
            if (!(conv = cli_to_f32(p.dtype, data[slot], n))) rc = cli_fail(1, "%s: out of memory", s.outs[i].flag);
            x = conv;
            float *kept = NULL; /* a cache: its rows as they were but the appended ones */
            if (!rc && (slot == 2 || slot == 3) && !(rc = keep_cached_rows(a, &s, &p, slot == 3, conv, &kept))) {
                fa_free(conv);
                x = conv = kept;
            }
        }
        if (!rc && (rc = npy_out_write(&s.outs[i].file, s.outs[i].ndim, s.outs[i].shape, x, err, sizeof err)))
            cli_fail(rc, "%s %s", s.outs[i].flag, err);
        fa_free(conv);
    }
    for (int i = 0; i < s.nout && !rc; i++) /* every temporary named first: a failure replaces no target */
        if ((rc = npy_out_prepare(&s.outs[i].file, err, sizeof err))) cli_fail(rc, "%s %s", s.outs[i].flag, err);
    /* stdout written and flushed before any commit: a stdout that fails leaves no output */
    if (!rc && a->count)
        printf("{\"flops\": %" PRId64 ", \"transcendentals\": %" PRId64 "}\n", counts.flops, counts.transcendentals);
    if (!rc) rc = cli_flush_stdout();
    for (int i = 0; i < s.nout && !rc; i++)
        if ((rc = npy_out_commit(&s.outs[i].file, err, sizeof err))) cli_fail(rc, "%s %s", s.outs[i].flag, err);
    release(&s);
    return rc;
}
