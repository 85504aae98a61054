/* `flashattn run` and `flashattn grad`: attention on tensors from .npy files. The problem
 * comes from the files' shapes; every header is checked, and every output path opened (as
 * a temporary), before any data is read or computed; outputs appear only when all succeed. */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 4-D float tensor input: header checked, no dimension zero. */
static int header4(const char *flag, const char *path, npy_header *h) {
    char err[NPY_ERR_LEN], sh[256];
    int rc = npy_read_header(path, NPY_F32 | NPY_F16, h, err, sizeof err);
    if (rc) return cli_fail(rc, "%s %s", flag, err);
    npy_shape_str(h->ndim, h->shape, sh, sizeof sh);
    if (h->ndim != 4) return cli_fail(2, "%s %s: shape %s is not 4-D [B, H, S, D]", flag, path, sh);
    if (h->count == 0) return cli_fail(2, "%s %s: shape %s has a zero dimension", flag, path, sh);
    return 0;
}

static int same(const char *flag, const char *path, const char *what, int64_t got,
                const char *ref, int64_t want) {
    if (got == want) return 0;
    return cli_fail(2, "%s %s: %s %" PRId64 " does not match %s's %" PRId64, flag, path, what, got,
                    ref, want);
}

static int agrees(const char *flag, int64_t given, int64_t actual) {
    if (!given || given == actual) return 0;
    return cli_fail(2, "%s %" PRId64 " does not match the input files' %" PRId64, flag, given,
                    actual);
}

/* The problem described by q [B,Hq,Sq,D], k [B,Hk,Sk,D], v [B,Hk,Sk,Dv]. */
static int derive(const cli_args *a, const npy_header *q, const npy_header *k,
                  const npy_header *v, fa_problem *p) {
    const int64_t *Q = q->shape, *K = k->shape, *V = v->shape;
    int rc;
    if ((rc = same("--k", a->k, "batch", K[0], "q", Q[0])) ||
        (rc = same("--k", a->k, "head dim", K[3], "q", Q[3])) ||
        (rc = same("--v", a->v, "batch", V[0], "k", K[0])) ||
        (rc = same("--v", a->v, "heads", V[1], "k", K[1])) ||
        (rc = same("--v", a->v, "seq", V[2], "k", K[2])))
        return rc;
    if (Q[1] % K[1] != 0)
        return cli_fail(2, "q has %" PRId64 " heads, not a multiple of k's %" PRId64 " heads", Q[1],
                        K[1]);
    fa_problem_init(p);
    p->batch = Q[0];
    p->heads_q = Q[1];
    p->heads_kv = K[1];
    p->seq_q = Q[2];
    p->seq_k = K[2];
    p->head_dim = Q[3];
    p->head_dim_v = V[3];
    if ((rc = agrees("--batch", a->batch, p->batch)) || (rc = agrees("--heads", a->heads, p->heads_q)) ||
        (rc = agrees("--kv-heads", a->kv_heads, p->heads_kv)) ||
        (rc = agrees("--seq", a->seq, p->seq_q)) || (rc = agrees("--seq", a->seq, p->seq_k)) ||
        (rc = agrees("--seq-q", a->seq_q, p->seq_q)) || (rc = agrees("--seq-k", a->seq_k, p->seq_k)) ||
        (rc = agrees("--head-dim", a->head_dim, p->head_dim)) ||
        (rc = agrees("--v-head-dim", a->v_head_dim, p->head_dim_v)))
        return rc;
    if (a->has_dtype) {
        p->dtype = a->dtype;
    } else {
        if (q->kind != k->kind || q->kind != v->kind)
            return cli_fail(2, "q, k and v do not share a dtype; pass --dtype to cast them");
        p->dtype = q->kind == NPY_F32 ? FA_F32 : FA_F16;
    }
    return 0;
}

typedef struct {
    const char *flag, *path;
    int slot;         /* which host buffer of cli_run holds it */
    int ndim;
    int64_t shape[4];
    void *data;       /* in the problem's dtype (lse: f32) */
    int is_f32;
    npy_out file;
} output;

static int add_output(output *outs, int *n, const char *flag, const char *path, int slot,
                      int ndim, const int64_t *shape) {
    if (!path) return 0;
    for (int i = 0; i < *n; i++) /* files, not strings: out/o.npy and ./out/o.npy are one */
        if (npy_same_file(outs[i].path, path))
            return cli_fail(2, "%s and %s name the same file %s", outs[i].flag, flag, path);
    output *o = &outs[(*n)++];
    memset(o, 0, sizeof *o);
    o->flag = flag;
    o->path = path;
    o->slot = slot;
    o->ndim = ndim;
    memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return 0;
}

static size_t elems(const output *o) {
    size_t n = 1;
    for (int i = 0; i < o->ndim; i++) n *= (size_t)o->shape[i];
    return n;
}

/* Converts and writes every output to its temporary, prints --count's line (count: NULL for
 * none) and flushes stdout, then renames them all into place: a stdout that cannot be
 * written leaves no output. */
static int write_outputs(output *outs, int n, fa_dtype t, const fa_counts *count) {
    char err[NPY_ERR_LEN];
    for (int i = 0; i < n; i++) {
        const float *x = outs[i].data;
        float *conv = NULL;
        if (!outs[i].is_f32 && t != FA_F32) {
            conv = cli_to_f32(t, outs[i].data, (int64_t)elems(&outs[i]));
            if (!conv) return cli_fail(1, "%s %s: out of memory", outs[i].flag, outs[i].path);
            x = conv;
        }
        int rc = npy_out_write(&outs[i].file, outs[i].ndim, outs[i].shape, x, err, sizeof err);
        fa_free(conv);
        if (rc) return cli_fail(rc, "%s %s", outs[i].flag, err);
    }
    for (int i = 0; i < n; i++) { /* every temporary named first: a failure then replaces no target */
        int rc = npy_out_prepare(&outs[i].file, err, sizeof err);
        if (rc) return cli_fail(rc, "%s %s", outs[i].flag, err);
    }
    if (count)
        printf("{\"flops\": %" PRId64 ", \"transcendentals\": %" PRId64 "}\n", count->flops, count->transcendentals);
    if (cli_flush_stdout()) return 1;
    for (int i = 0; i < n; i++) {
        int rc = npy_out_commit(&outs[i].file, err, sizeof err);
        if (rc) return cli_fail(rc, "%s %s", outs[i].flag, err);
    }
    return 0;
}

void cli_progress_report(void *ctx, int64_t done, int64_t total) {
    cli_progress *ps = ctx;
    int64_t tenth = done * 10 / total;
    if (tenth == ps->last_tenth) return;
    ps->last_tenth = tenth;
    fprintf(stderr, "flashattn: %s %3d%% (%" PRId64 "/%" PRId64 " %s)\n", ps->pass, (int)(done * 100 / total),
            done, total, ps->unit ? ps->unit : "tiles");
}

int cli_progress_wanted(const cli_args *a, const fa_plan *plan) {
    fa_cost cost;
    /* long CPU calls show progress on stderr (500 GFLOP is seconds even on many cores) */
    return fa_plan_backend(plan) == FA_BACKEND_CPU &&
           (a->progress || (fa_plan_cost(plan, FA_FORWARD, &cost) == FA_OK && cost.flops > (int64_t)5e11));
}

int cli_run(const cli_args *a) {
    if (cli_inference_wanted(a)) return cli_run_inference(a); /* cli_inference.c */
    int grad = a->cmd == CMD_GRAD;
    npy_header hq, hk, hv, hdo;
    fa_problem p;
    fa_options opt;
    cli_extras x = {0};
    int rc;
    if ((rc = cli_run_problem(a, &hq, &hk, &hv, &hdo, &p, &opt))) return rc;
    if ((rc = cli_extras_supported(a, &p, &opt)) || (rc = cli_extras_load(a, &p, 0, &x))) return rc;

    fa_plan *plan = NULL;
    if ((rc = cli_plan_create(&p, &opt, &plan))) return rc;
    cli_mem mem;
    if ((rc = cli_mem_init(&mem, plan))) {
        fa_plan_destroy(plan);
        return rc;
    }

    int64_t oshape[4] = {p.batch, p.heads_q, p.seq_q, p.head_dim_v};
    int64_t bshape[4] = {p.bias_batch, p.bias_heads, p.bias_seq_q == 1 ? 1 : p.seq_q, p.seq_k};
    output outs[8];
    int nout = 0;
    if ((rc = add_output(outs, &nout, "--out", a->out, 4, 4, oshape)) ||
        (rc = add_output(outs, &nout, "--lse", a->lse, 5, 3, oshape)) ||
        (rc = add_output(outs, &nout, "--dq", a->dq, 6, 4, hq.shape)) ||
        (rc = add_output(outs, &nout, "--dk", a->dk, 7, 4, hk.shape)) ||
        (rc = add_output(outs, &nout, "--dv", a->dv, 8, 4, hv.shape)) ||
        (rc = add_output(outs, &nout, "--dbias", a->dbias, 9, 4, bshape)) ||
        (rc = add_output(outs, &nout, "--dsink", a->dsink, 10, 1, oshape + 1))) {
        fa_plan_destroy(plan);
        return rc;
    }
    int opened = 0;
    char err[NPY_ERR_LEN];
    for (; opened < nout; opened++)
        if ((rc = npy_out_open(&outs[opened].file, outs[opened].path, err, sizeof err))) {
            cli_fail(rc, "%s %s", outs[opened].flag, err);
            break;
        }

    /* Host buffers, then where the kernels see them (the same pointers on the CPU). */
    size_t es = fa_dtype_size(p.dtype);
    size_t nq = (size_t)hq.count, nk = (size_t)hk.count, nv = (size_t)hv.count;
    size_t no = (size_t)(p.batch * p.heads_q * p.seq_q * p.head_dim_v);
    size_t nl = (size_t)(p.batch * p.heads_q * p.seq_q);
    size_t nb = a->dbias ? (size_t)(p.bias_batch * p.bias_heads * bshape[2] * p.seq_k) : 0;
    void *h[10] = {0}, *d[10] = {0}; /* q k v do o lse dq dk dv dbias */
    size_t bytes[10] = {nq * es, nk * es, nv * es, no * es, no * es, nl * 4, nq * es, nk * es, nv * es, nb * 4};
    const int nbuf = grad ? (a->dbias ? 10 : 9) : 6;
    fa_counts counts = {0, 0};
    if (rc) goto done;
    if ((rc = cli_read_tensor("--q", a->q, p.dtype, &hq, &h[0])) ||
        (rc = cli_read_tensor("--k", a->k, p.dtype, &hk, &h[1])) ||
        (rc = cli_read_tensor("--v", a->v, p.dtype, &hv, &h[2])) ||
        (grad && (rc = cli_read_tensor("--do", a->d_o, p.dtype, &hdo, &h[3]))) ||
        (rc = cli_extras_load(a, &p, 1, &x)))
        goto done;
    for (int i = 4; i < nbuf; i++)
        if (!(h[i] = fa_malloc(bytes[i] ? bytes[i] : 1))) {
            rc = cli_fail(1, "out of memory (%zu bytes)", bytes[i]);
            goto done;
        }
    for (int i = 0; i < nbuf; i++)
        if (h[i] && (rc = cli_mem_put(&mem, h[i], bytes[i], i < 4, &d[i]))) goto done;
    void *dx[4] = {x.bias, x.slopes, x.q_seg, x.kv_seg}, *ddx[4] = {0};
    size_t xb[4] = {0};
    if (x.bias) xb[0] = (size_t)(p.bias_batch * p.bias_heads * bshape[2] * p.seq_k) * 4;
    if (x.slopes) xb[1] = (size_t)p.heads_q * 4;
    if (x.q_seg) xb[2] = (size_t)(p.batch * p.seq_q) * 4, xb[3] = (size_t)(p.batch * p.seq_k) * 4;
    for (int i = 0; i < 4; i++)
        if (dx[i] && (rc = cli_mem_put(&mem, dx[i], xb[i], 1, &ddx[i]))) goto done_dev;

    const int show = cli_progress_wanted(a, plan);
    cli_progress ps = {"forward", -1, NULL};
    fa_forward_args fw;
    memset(&fw, 0, sizeof fw);
    if (show) fw.progress = cli_progress_report, fw.progress_ctx = &ps;
    fw.q = d[0], fw.k = d[1], fw.v = d[2], fw.o = d[4], fw.lse = d[5];
    fw.bias = ddx[0], fw.alibi_slopes = ddx[1], fw.q_segment_ids = ddx[2], fw.kv_segment_ids = ddx[3];
    fw.sinks = x.sinks; /* host memory: sinks are CPU-only (the CUDA backend refuses them) */
    fw.counts = (a->count && !grad) ? &counts : NULL;
    fa_status st = fa_forward(plan, &fw);
    if (st != FA_OK) {
        rc = cli_fail_status(st, "forward");
        goto done_dev;
    }
    if (grad) {
        fa_backward_args bw;
        memset(&bw, 0, sizeof bw);
        bw.q = d[0], bw.k = d[1], bw.v = d[2], bw.d_o = d[3], bw.o = d[4], bw.lse = d[5];
        bw.dq = d[6], bw.dk = d[7], bw.dv = d[8], bw.dbias = d[9];
        bw.bias = fw.bias, bw.alibi_slopes = fw.alibi_slopes;
        bw.q_segment_ids = fw.q_segment_ids, bw.kv_segment_ids = fw.kv_segment_ids;
        bw.sinks = x.sinks, bw.dsink = x.dsink;
        bw.counts = a->count ? &counts : NULL;
        cli_progress pb = {"backward", -1, NULL};
        if (show) bw.progress = cli_progress_report, bw.progress_ctx = &pb;
        st = fa_backward(plan, &bw);
        if (st != FA_OK) {
            rc = cli_fail_status(st, "backward");
            goto done_dev;
        }
    }
    for (int i = 4; i < nbuf; i++)
        if ((rc = cli_mem_get(&mem, h[i], d[i], bytes[i]))) goto done_dev;
    for (int i = 0; i < nout; i++) {
        outs[i].data = outs[i].slot == 10 ? x.dsink : h[outs[i].slot];
        outs[i].is_f32 = outs[i].slot == 5 || outs[i].slot >= 9;
    }
    if ((rc = write_outputs(outs, nout, p.dtype, a->count ? &counts : NULL))) goto done_dev;

done_dev:
    for (int i = 0; i < 4; i++) cli_mem_free(&mem, dx[i], ddx[i]);
done:
    for (int i = 0; i < 10; i++) {
        cli_mem_free(&mem, h[i], d[i]);
        fa_free(h[i]);
    }
    for (int i = 0; i < opened; i++) npy_out_abort(&outs[i].file);
    cli_extras_free(&x);
    fa_plan_destroy(plan);
    return rc;
}

int cli_run_problem(const cli_args *a, npy_header *hq, npy_header *hk, npy_header *hv,
                    npy_header *hdo, fa_problem *p, fa_options *opt) {
    int grad = a->cmd == CMD_GRAD, rc;
    if ((rc = cli_need_files(a))) return rc;
    if ((rc = header4("--q", a->q, hq)) || (rc = header4("--k", a->k, hk)) ||
        (rc = header4("--v", a->v, hv)) || (grad && (rc = header4("--do", a->d_o, hdo))) ||
        (rc = derive(a, hq, hk, hv, p)))
        return rc;
    if (grad) {
        const int64_t *D = hdo->shape;
        if ((rc = same("--do", a->d_o, "batch", D[0], "q", p->batch)) ||
            (rc = same("--do", a->d_o, "heads", D[1], "q", p->heads_q)) ||
            (rc = same("--do", a->d_o, "seq", D[2], "q", p->seq_q)) ||
            (rc = same("--do", a->d_o, "head dim", D[3], "v", p->head_dim_v)))
            return rc;
        if (!a->has_dtype && hdo->kind != hq->kind)
            return cli_fail(2, "do and q do not share a dtype; pass --dtype to cast them");
    }
    cli_apply_options(a, p, opt);
    return 0;
}

int cli_need_files(const cli_args *a) {
    const int grad = a->cmd == CMD_GRAD;
    const char *missing = !a->q ? "--q" : !a->k ? "--k" : !a->v ? "--v" : NULL;
    if (!missing && !grad && !a->out) missing = "--out";
    if (!missing && grad)
        missing = !a->d_o ? "--do" : !a->dq ? "--dq" : !a->dk ? "--dk" : !a->dv ? "--dv" : NULL;
    return missing ? cli_fail(2, "%s: missing %s", a->name, missing) : 0;
}
