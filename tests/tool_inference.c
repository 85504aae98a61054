/* Test helper for tests/test_cli_inference.sh (the inference shapes' command line):
 *   tool_inference ints PATH D0 [D1] -- V...     an int32 .npy of the given values
 *   tool_inference varlen Q K V CQ CK O LSE [--causal]
 *                                                the CLI's packed o and lse against the
 *                                                float64 reference (src/ref)
 *   tool_inference varlen-grad Q K V DO CQ CK DQ DK DV [--causal] [--window L R]
 *                                                the CLI's packed dq, dk, dv (grad)
 *                                                against the float64 reference
 *   tool_inference decode Q K V LENS O LSE [--causal] [--table BT] [--new KN VN]
 *                                                the CLI's decode o and lse against the
 *                                                reference; K and V the caches before the run
 *   tool_inference cache OLD NEW LENS KN [--table BT]
 *                                                NEW is OLD with KN's rows written at
 *                                                position LENS[b] (paged through BT)
 * Its .npy parsing is independent of tools/npy.c (float32 and int32, version 1). */
#include "flashattn.h"
#include "ref/ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *msg, const char *arg) {
    fprintf(stderr, "tool_inference: %s %s\n", msg, arg ? arg : "");
    return 3;
}

/* Everything a command allocates, freed when it returns. */
static void *owned[64];
static int n_owned;
static void *keep(void *x) {
    if (x && n_owned < 64) owned[n_owned++] = x;
    return x;
}

typedef struct {
    int ndim;
    int64_t shape[4], n;
    void *data; /* float or int32 */
} arr;

static int load(const char *path, const char *descr, arr *a) {
    FILE *f = fopen(path, "rb");
    unsigned char pre[10];
    char h[4096] = {0};
    memset(a, 0, sizeof *a);
    if (!f) return die("cannot open", path);
    size_t hlen = 0;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) || pre[6] != 1 ||
        (hlen = pre[8] | (size_t)pre[9] << 8) >= sizeof h || fread(h, 1, hlen, f) != hlen || !strstr(h, descr)) {
        fclose(f);
        return die("not a version-1 .npy of", descr);
    }
    const char *p = strstr(h, "'shape': (");
    a->n = 1;
    for (p = p ? p + 10 : ")"; *p && *p != ')' && a->ndim < 4;) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        char *end;
        a->shape[a->ndim] = strtoll(p, &end, 10);
        a->n *= a->shape[a->ndim++];
        p = end;
    }
    a->data = keep(malloc((size_t)a->n * 4 + 4));
    const int ok = a->data && fread(a->data, 4, (size_t)a->n, f) == (size_t)a->n;
    fclose(f);
    return ok ? 0 : die("short data in", path);
}

static int cmd_ints(int argc, char **argv) {
    int64_t dims[2] = {0, 0};
    int nd = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++) dims[nd < 2 ? nd++ : 1] = atoll(argv[i]);
    int64_t n = nd == 2 ? dims[0] * dims[1] : dims[0];
    if (i >= argc || argc - i - 1 != n) return die("ints: the value count does not match the shape", NULL);
    char dict[160], sh[64];
    if (nd == 2) snprintf(sh, sizeof sh, "(%lld, %lld)", (long long)dims[0], (long long)dims[1]);
    else snprintf(sh, sizeof sh, "(%lld,)", (long long)dims[0]);
    snprintf(dict, sizeof dict, "{'descr': '<i4', 'fortran_order': False, 'shape': %s, }", sh);
    size_t len = strlen(dict) + 1, pad = (64 - (10 + len) % 64) % 64, hl = len + pad;
    FILE *f = fopen(argv[0], "wb");
    if (!f) return die("cannot create", argv[0]);
    unsigned char v[4] = {1, 0, (unsigned char)(hl & 255), (unsigned char)(hl >> 8)};
    fwrite("\x93NUMPY", 1, 6, f), fwrite(v, 1, 4, f), fputs(dict, f);
    for (size_t k = 0; k < pad; k++) fputc(' ', f);
    fputc('\n', f);
    for (int64_t k = 0; k < n; k++) {
        int32_t x = (int32_t)atol(argv[i + 1 + k]);
        fwrite(&x, 4, 1, f);
    }
    return fclose(f) ? die("write failed", argv[0]) : 0;
}

/* |got - ref| <= 1e-4 (1 + |ref|) everywhere (-inf lse must match exactly). */
static int check(const char *what, const float *got, const double *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(got[i])) {
            if ((double)got[i] != ref[i]) return printf("%s[%lld]: %g, reference %g\n", what, (long long)i, got[i], ref[i]), 1;
            continue;
        }
        if (!(fabs(got[i] - ref[i]) <= 1e-4 * (1 + fabs(ref[i]))))
            return printf("%s[%lld]: %g, reference %g\n", what, (long long)i, got[i], ref[i]), 1;
    }
    return 0;
}

/* The CLI's o and lse against a float64 reference forward of p and a. */
static int against(void (*ref)(const fa_problem *, const fa_forward_args *, double *, double *),
                   const fa_problem *p, const fa_forward_args *a, const arr *o, const arr *l) {
    double *ro = keep(malloc(sizeof(double) * (size_t)o->n)), *rl = keep(malloc(sizeof(double) * (size_t)l->n));
    ref(p, a, ro, rl);
    const int bad = check("o", o->data, ro, o->n) | check("lse", l->data, rl, l->n);
    if (!bad) printf("matches the reference\n");
    return bad;
}

static int cmd_varlen(int argc, char **argv) {
    if (argc < 7) return die("usage: varlen Q K V CQ CK O LSE [--causal]", NULL);
    arr q, k, v, cq, ck, o, l;
    if (load(argv[0], "<f4", &q) || load(argv[1], "<f4", &k) || load(argv[2], "<f4", &v) ||
        load(argv[3], "<i4", &cq) || load(argv[4], "<i4", &ck) || load(argv[5], "<f4", &o) || load(argv[6], "<f4", &l))
        return 3;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = cq.n - 1, p.heads_q = q.shape[1], p.heads_kv = k.shape[1], p.head_dim = q.shape[2];
    p.head_dim_v = v.shape[2], p.seq_q = q.shape[0], p.seq_k = k.shape[0];
    p.cu_seqlens_q = cq.data, p.cu_seqlens_k = ck.data;
    p.causal = argc > 7 && !strcmp(argv[7], "--causal");
    fa_forward_args a = {0};
    a.q = q.data, a.k = k.data, a.v = v.data;
    return against(fa_ref_varlen_forward, &p, &a, &o, &l);
}

static int cmd_varlen_grad(int argc, char **argv) {
    if (argc < 9) return die("usage: varlen-grad Q K V DO CQ CK DQ DK DV [--causal] [--window L R]", NULL);
    arr q, k, v, d_o, cq, ck, dq, dk, dv;
    if (load(argv[0], "<f4", &q) || load(argv[1], "<f4", &k) || load(argv[2], "<f4", &v) ||
        load(argv[3], "<f4", &d_o) || load(argv[4], "<i4", &cq) || load(argv[5], "<i4", &ck) ||
        load(argv[6], "<f4", &dq) || load(argv[7], "<f4", &dk) || load(argv[8], "<f4", &dv))
        return 3;
    if (dq.n != q.n || dk.n != k.n || dv.n != v.n) return printf("a gradient's size differs from its input's\n"), 1;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = cq.n - 1, p.heads_q = q.shape[1], p.heads_kv = k.shape[1], p.head_dim = q.shape[2];
    p.head_dim_v = v.shape[2], p.seq_q = q.shape[0], p.seq_k = k.shape[0];
    p.cu_seqlens_q = cq.data, p.cu_seqlens_k = ck.data;
    for (int i = 9; i < argc; i++) {
        if (!strcmp(argv[i], "--causal")) p.causal = 1;
        else if (!strcmp(argv[i], "--window") && i + 2 < argc)
            p.window_left = atoll(argv[i + 1]), p.window_right = atoll(argv[i + 2]), i += 2;
        else return die("bad option", argv[i]);
    }
    double *rq = keep(malloc(sizeof(double) * (size_t)q.n + 8)), *rk = keep(malloc(sizeof(double) * (size_t)k.n + 8));
    double *rv = keep(malloc(sizeof(double) * (size_t)v.n + 8));
    if (!rq || !rk || !rv) return die("out of memory", NULL);
    fa_backward_args a = {0};
    a.q = q.data, a.k = k.data, a.v = v.data, a.d_o = d_o.data;
    fa_ref_varlen_backward(&p, &a, rq, rk, rv);
    const int bad = check("dq", dq.data, rq, q.n) | check("dk", dk.data, rk, k.n) | check("dv", dv.data, rv, v.n);
    if (!bad) printf("matches the reference\n");
    return bad;
}

static int cmd_decode(int argc, char **argv) {
    if (argc < 6) return die("usage: decode Q K V LENS O LSE [--causal] [--table BT] [--new KN VN]", NULL);
    arr q, k, v, lens, o, l, bt = {0}, kn = {0}, vn = {0};
    if (load(argv[0], "<f4", &q) || load(argv[1], "<f4", &k) || load(argv[2], "<f4", &v) ||
        load(argv[3], "<i4", &lens) || load(argv[4], "<f4", &o) || load(argv[5], "<f4", &l))
        return 3;
    fa_problem p;
    fa_problem_init(&p);
    for (int i = 6; i < argc; i++) {
        if (!strcmp(argv[i], "--causal")) p.causal = 1;
        else if (!strcmp(argv[i], "--table") && i + 1 < argc && !load(argv[i + 1], "<i4", &bt)) i++;
        else if (!strcmp(argv[i], "--new") && i + 2 < argc && !load(argv[i + 1], "<f4", &kn) &&
                 !load(argv[i + 2], "<f4", &vn))
            i += 2, p.has_new_kv = 1;
        else return die("bad option", argv[i]);
    }
    p.batch = lens.n, p.seq_q = q.shape[1], p.heads_q = q.shape[2], p.head_dim = q.shape[3];
    p.heads_kv = k.shape[2], p.head_dim_v = v.shape[3], p.cache_seqlens = lens.data;
    if (bt.data) p.page_size = k.shape[1], p.num_pages = k.shape[0], p.max_pages = bt.shape[1];
    p.seq_k = bt.data ? p.max_pages * p.page_size : k.shape[1];
    fa_forward_args a = {0};
    a.q = q.data, a.k = k.data, a.v = v.data, a.k_new = kn.data, a.v_new = vn.data, a.block_table = bt.data;
    return against(fa_ref_decode, &p, &a, &o, &l);
}

/* x rounded to bf16 (nearest, ties to even), as a float: what a run with --dtype bf16 appends. */
static float to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static int cmd_cache(int argc, char **argv) {
    if (argc < 4) return die("usage: cache OLD NEW LENS KN [--table BT | --bf16]", NULL);
    arr old, now, lens, kn, bt = {0};
    const int bf16 = argc > 4 && !strcmp(argv[4], "--bf16"); /* the new rows as bf16 gives them */
    if (load(argv[0], "<f4", &old) || load(argv[1], "<f4", &now) || load(argv[2], "<i4", &lens) ||
        load(argv[3], "<f4", &kn) || (argc > 5 && !bf16 && load(argv[5], "<i4", &bt)))
        return 3;
    if (bf16)
        for (int64_t i = 0; i < kn.n; i++) ((float *)kn.data)[i] = to_bf16(((float *)kn.data)[i]);
    if (old.n != now.n) return printf("the cache changed shape\n"), 1;
    float *want = old.data;
    const int32_t *len = lens.data, *table = bt.data;
    const int64_t rows = old.shape[1], W = old.shape[2] * old.shape[3], Sq = kn.shape[1];
    for (int64_t b = 0; b < lens.n; b++)
        for (int64_t t = 0; t < Sq; t++) {
            const int64_t pos = len[b] + t;
            const int64_t row = table ? table[b * bt.shape[1] + pos / rows] * rows + pos % rows : b * rows + pos;
            memcpy(want + row * W, (float *)kn.data + (b * Sq + t) * W, sizeof(float) * (size_t)W);
        }
    if (memcmp(want, now.data, sizeof(float) * (size_t)old.n)) return printf("the cache is not the expected one\n"), 1;
    printf("the cache is the expected one\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return die("usage: tool_inference ints|varlen|varlen-grad|decode|cache ...", NULL);
    int rc = 3;
    if (!strcmp(argv[1], "ints")) rc = cmd_ints(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "varlen")) rc = cmd_varlen(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "varlen-grad")) rc = cmd_varlen_grad(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "decode")) rc = cmd_decode(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "cache")) rc = cmd_cache(argc - 2, argv + 2);
    else die("unknown command", argv[1]);
    while (n_owned) free(owned[--n_owned]);
    return rc;
}
