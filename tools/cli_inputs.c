/* Input files: the optional bias, ALiBi slopes, segment ids and sinks (headers checked against the
 * problem, data read only when a command runs, after the library said their features combine
 * with it), and q/k/v/do tensors cast to the problem's dtype. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static int read_file(const char *flag, const char *path, int kinds, int load, npy_header *h,
                     void **data) {
    char err[NPY_ERR_LEN];
    int rc = load ? npy_read(path, kinds, h, data, err, sizeof err)
                  : npy_read_header(path, kinds, h, err, sizeof err);
    if (rc) return cli_fail(rc, "%s %s", flag, err);
    return 0;
}

/* "has shape (a, b) but must be (c, d)" for a file whose dims do not match want. */
static int check_shape(const char *flag, const char *path, const npy_header *h, int ndim,
                       const int64_t *want, const char *hint) {
    int ok = h->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = h->shape[i] == want[i];
    if (ok) return 0;
    char got[256], exp[256];
    npy_shape_str(h->ndim, h->shape, got, sizeof got);
    npy_shape_str(ndim, want, exp, sizeof exp);
    return cli_fail(2, "%s %s: shape %s does not match the problem: want %s%s", flag, path, got,
                    exp, hint);
}

int cli_extras_supported(const cli_args *a, const fa_problem *p, const fa_options *o) {
    const int masked = a->mask_chunk || a->prefix_len || a->documents || a->mask;
    if (!a->bias && !a->q_segments && !a->alibi && !a->sinks && !masked) return 0;
    fa_problem probe = *p;
    /* a bias broadcast over everything, and any mask of the problem's shape: shapes every
     * problem accepts, so that only the combination can be refused */
    probe.has_bias = a->bias != NULL, probe.bias_batch = probe.bias_heads = 1, probe.bias_seq_q = 0;
    probe.has_segment_ids = a->q_segments != NULL;
    probe.has_alibi = a->alibi != NULL;
    probe.has_sinks = a->sinks != NULL;
    fa_mask *m = NULL;
    const fa_mask_shape s = {1, 1, p->seq_q, p->seq_k, 0, 0};
    if (masked && fa_mask_causal(&s, 0, &m) == FA_OK) probe.mask = m; /* else the mask flags say why */
    fa_plan *pl = NULL;
    int rc = cli_plan_create(&probe, o, &pl);
    fa_plan_destroy(pl);
    fa_mask_destroy(m);
    return rc;
}

int cli_extras_load(const cli_args *a, fa_problem *p, int load, cli_extras *x) {
    memset(x, 0, sizeof *x);
    npy_header h;
    int rc;
    if ((rc = cli_mask_apply(a, p))) return rc; /* cli_mask.c */
    if (a->alibi) {
        if ((rc = read_file("--alibi", a->alibi, NPY_F32, load, &h, (void **)&x->slopes))) return rc;
        int64_t want[1] = {p->heads_q};
        if ((rc = check_shape("--alibi", a->alibi, &h, 1, want, " (one slope per query head)")))
            return rc;
        p->has_alibi = 1;
    }
    if (a->bias) {
        if ((rc = read_file("--bias", a->bias, NPY_F32, load, &h, (void **)&x->bias))) return rc;
        int64_t want[4] = {p->batch, p->heads_q, p->seq_q, p->seq_k};
        if (h.ndim == 4 && h.shape[0] == 1) want[0] = 1;
        if (h.ndim == 4 && h.shape[1] == 1) want[1] = 1;
        if (h.ndim == 4 && h.shape[2] == 1) want[2] = 1; /* one row for every query row */
        if ((rc = check_shape("--bias", a->bias, &h, 4, want,
                              " ([B or 1, Hq or 1, Sq or 1, Sk], float32)")))
            return rc;
        p->has_bias = 1;
        p->bias_batch = h.shape[0];
        p->bias_heads = h.shape[1];
        p->bias_seq_q = h.shape[2];
    }
    if (a->q_segments) {
        if ((rc = read_file("--q-segments", a->q_segments, NPY_I32, load, &h, (void **)&x->q_seg)))
            return rc;
        int64_t wq[2] = {p->batch, p->seq_q};
        if ((rc = check_shape("--q-segments", a->q_segments, &h, 2, wq, " ([B, Sq], int32)")))
            return rc;
        if ((rc = read_file("--kv-segments", a->kv_segments, NPY_I32, load, &h,
                            (void **)&x->kv_seg)))
            return rc;
        int64_t wk[2] = {p->batch, p->seq_k};
        if ((rc = check_shape("--kv-segments", a->kv_segments, &h, 2, wk, " ([B, Sk], int32)")))
            return rc;
        p->has_segment_ids = 1;
    }
    if (a->sinks) {
        if ((rc = read_file("--sinks", a->sinks, NPY_F32, load, &h, (void **)&x->sinks))) return rc;
        int64_t want[1] = {p->heads_q};
        if ((rc = check_shape("--sinks", a->sinks, &h, 1, want, " (one sink logit per query head)"))) return rc;
        p->has_sinks = 1;
        if (load && !(x->dsink = fa_malloc((size_t)p->heads_q * sizeof(float))))
            return cli_fail(1, "--sinks: out of memory");
    }
    return 0;
}

void cli_extras_free(cli_extras *x) {
    fa_free(x->bias);
    fa_free(x->slopes);
    fa_free(x->q_seg);
    fa_free(x->kv_seg);
    fa_free(x->sinks);
    fa_free(x->dsink);
    memset(x, 0, sizeof *x);
}

float *cli_to_f32(fa_dtype t, const void *x, int64_t n) {
    float *y = fa_malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!y) return NULL;
    fa_convert(t, x, FA_F32, y, (size_t)n);
    return y;
}

int cli_read_tensor(const char *flag, const char *path, fa_dtype t, const npy_header *expect,
                    void **out) {
    npy_header h;
    void *raw;
    int rc = read_file(flag, path, NPY_F32 | NPY_F16, 1, &h, &raw);
    if (rc) return rc;
    if (h.ndim != expect->ndim || memcmp(h.shape, expect->shape, sizeof h.shape) != 0 ||
        h.kind != expect->kind) {
        fa_free(raw);
        return cli_fail(2, "%s %s: changed while being read", flag, path);
    }
    fa_dtype from = h.kind == NPY_F32 ? FA_F32 : FA_F16;
    if (from == t) {
        *out = raw;
        return 0;
    }
    void *y = fa_malloc((size_t)h.count * fa_dtype_size(t) + 1);
    if (!y) {
        fa_free(raw);
        return cli_fail(1, "%s %s: out of memory", flag, path);
    }
    fa_convert(from, raw, t, y, (size_t)h.count);
    fa_free(raw);
    *out = y;
    return 0;
}
