/* The mask flags (docs/cli.md, docs/masks.md): --mask-chunk, --prefix-len, --documents and
 * --mask each build one block-sparse mask through the public constructors (blocks of 128);
 * several are ANDed. The mask is a plan input, so even `plan` reads these files whole. It is
 * built once per process (cli_extras_load runs twice in run and bench) and freed at exit. */
#include "cli.h"

#include <errno.h>

#include <stdlib.h>
#include <string.h>

static fa_mask *built; /* the command's mask, freed at exit */

static void free_built(void) { fa_mask_destroy(built); }

/* An int32 or int64 .npy of 1 to max_dims dims, as int64 (malloc'ed). */
static int read_ints(const char *flag, const char *path, int max_dims, npy_header *h, int64_t **out) {
    char err[NPY_ERR_LEN];
    void *raw;
    int rc = npy_read(path, NPY_I32 | NPY_I64, h, &raw, err, sizeof err);
    if (rc) return cli_fail(rc, "%s %s", flag, err);
    if (h->ndim < 1 || h->ndim > max_dims) {
        fa_free(raw);
        return cli_fail(2, "%s %s: want %s, got %d", flag, path, max_dims == 1 ? "1 dim" : "1 or 2 dims", h->ndim);
    }
    int64_t *v = fa_malloc((size_t)(h->count ? h->count : 1) * sizeof(int64_t));
    if (!v) {
        fa_free(raw);
        return cli_fail(1, "%s %s: out of memory", flag, path);
    }
    for (int64_t i = 0; i < h->count; i++) v[i] = h->kind == NPY_I32 ? ((int32_t *)raw)[i] : ((int64_t *)raw)[i];
    fa_free(raw);
    *out = v;
    return 0;
}

static int prefix_mask(const cli_args *a, const fa_mask_shape *s, int64_t off, fa_mask **m) {
    int64_t *lens = fa_malloc((size_t)s->batch * sizeof(int64_t)), one;
    if (!lens) return cli_fail(1, "--prefix-len: out of memory");
    if (cli_is_decimal_int(a->prefix_len)) { /* a number (docs/cli.md, "Numbers"): every batch item */
        errno = 0;
        one = strtoll(a->prefix_len, NULL, 10);
        if (errno == ERANGE) return fa_free(lens), cli_fail(2, "--prefix-len: '%s' is out of range", a->prefix_len);
        if (one < 0) return fa_free(lens), cli_fail(2, "--prefix-len: %lld is negative", (long long)one);
        for (int64_t b = 0; b < s->batch; b++) lens[b] = one;
    } else {
        npy_header h;
        int64_t *v;
        int rc = read_ints("--prefix-len", a->prefix_len, 1, &h, &v);
        if (rc) return fa_free(lens), rc;
        if (h.ndim != 1 || h.shape[0] != s->batch) {
            fa_free(v), fa_free(lens);
            return cli_fail(2, "--prefix-len %s: want shape (%lld,) (one length per batch item)", a->prefix_len,
                            (long long)s->batch);
        }
        memcpy(lens, v, (size_t)s->batch * sizeof(int64_t));
        fa_free(v);
    }
    fa_status st = fa_mask_prefix_lm(s, off, lens, m);
    fa_free(lens);
    return st ? cli_fail_status(st, "--prefix-len") : 0;
}

static int documents_mask(const cli_args *a, const fa_mask_shape *s, fa_mask **m) {
    npy_header h;
    int64_t *v;
    int rc = read_ints("--documents", a->documents, 2, &h, &v);
    if (rc) return rc;
    const int64_t rows = h.ndim == 2 ? h.shape[0] : 1, n = h.ndim == 2 ? h.shape[1] : h.shape[0];
    if (h.ndim == 2 && rows != s->batch) {
        fa_free(v);
        return cli_fail(2, "--documents %s: %lld rows, want one per batch item (%lld)", a->documents, (long long)rows,
                        (long long)s->batch);
    }
    int64_t *counts = fa_malloc((size_t)s->batch * sizeof(int64_t));
    int64_t *lens = fa_malloc((size_t)(s->batch * (n ? n : 1)) * sizeof(int64_t));
    if (!counts || !lens) {
        fa_free(v), fa_free(counts), fa_free(lens);
        return cli_fail(1, "--documents: out of memory");
    }
    int64_t at = 0;
    for (int64_t b = 0; b < s->batch; b++) { /* each row's lengths up to its first 0 */
        const int64_t *row = v + (rows == 1 ? 0 : b * n);
        counts[b] = 0;
        for (int64_t k = 0; k < n && row[k] != 0; k++) lens[at++] = row[k], counts[b]++;
    }
    fa_status st = fa_mask_documents(s, counts, lens, m);
    fa_free(v), fa_free(counts), fa_free(lens);
    return st ? cli_fail_status(st, "--documents") : 0;
}

static int dense_mask(const cli_args *a, fa_mask_shape *s, const fa_problem *p, fa_mask **m) {
    char err[NPY_ERR_LEN];
    npy_header h;
    void *raw;
    int rc = npy_read(a->mask, NPY_BOOL, &h, &raw, err, sizeof err);
    if (rc) return cli_fail(rc, "--mask %s", err);
    const int64_t *d = h.shape + (h.ndim == 4 ? 2 : 0);
    const int ok = (h.ndim == 2 || h.ndim == 4) && d[0] == p->seq_q && d[1] == p->seq_k &&
                   (h.ndim == 2 || ((h.shape[0] == 1 || h.shape[0] == p->batch) && (h.shape[1] == 1 || h.shape[1] == p->heads_q)));
    if (!ok) {
        char got[256];
        npy_shape_str(h.ndim, h.shape, got, sizeof got);
        fa_free(raw);
        return cli_fail(2, "--mask %s: shape %s does not match the problem: want (%lld, %lld) or (B or 1, Hq or 1, %lld, %lld)",
                        a->mask, got, (long long)p->seq_q, (long long)p->seq_k, (long long)p->seq_q, (long long)p->seq_k);
    }
    fa_mask_shape ds = *s;
    ds.batch = h.ndim == 4 ? h.shape[0] : 1, ds.heads = h.ndim == 4 ? h.shape[1] : 1;
    fa_status st = fa_mask_from_dense(&ds, raw, m);
    fa_free(raw);
    return st ? cli_fail_status(st, "--mask") : 0;
}

/* *acc = *acc AND m (m consumed). */
static int and_into(fa_mask **acc, fa_mask *m) {
    if (!*acc) {
        *acc = m;
        return 0;
    }
    fa_mask *both = NULL;
    fa_status st = fa_mask_and(*acc, m, &both);
    fa_mask_destroy(*acc), fa_mask_destroy(m);
    *acc = both;
    return st ? cli_fail_status(st, "combining the mask flags") : 0;
}

int cli_mask_apply(const cli_args *a, fa_problem *p) {
    if (!a->mask_chunk && !a->prefix_len && !a->documents && !a->mask) return 0;
    if (built) {
        p->mask = built;
        return 0;
    }
    /* one mask for every batch item unless a file gives per-item data */
    fa_mask_shape s = {a->prefix_len || a->documents ? p->batch : 1, 1, p->seq_q, p->seq_k, 0, 0};
    const int64_t off = a->has_diag_offset ? a->diag_offset : p->seq_k - p->seq_q; /* as causal aligns */
    fa_mask *acc = NULL, *m = NULL;
    int rc = 0;
    if (a->mask_chunk) {
        fa_status st = fa_mask_chunked(&s, off, a->mask_chunk, &m);
        rc = st ? cli_fail_status(st, "--mask-chunk") : and_into(&acc, m);
    }
    if (!rc && a->prefix_len && !(rc = prefix_mask(a, &s, off, &m))) rc = and_into(&acc, m);
    if (!rc && a->documents && !(rc = documents_mask(a, &s, &m))) rc = and_into(&acc, m);
    if (!rc && a->mask) {
        fa_mask_shape ds = s;
        rc = dense_mask(a, &ds, p, &m);
        if (!rc) rc = and_into(&acc, m);
    }
    if (rc) {
        fa_mask_destroy(acc);
        return rc;
    }
    built = acc;
    atexit(free_built);
    p->mask = built;
    return 0;
}
