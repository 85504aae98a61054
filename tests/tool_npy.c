/* Test helper for tests/test_cli.sh (no Python needed):
 *   tool_npy rand PATH DESCR D0 [D1 ...] [--seed N]   random '<f4' / '<f2' ([-1, 1)) or '<i4'
 *                                                     (segment ids 0, 0, 1, 1, 2 ... per row)
 *   tool_npy raw PATH [--magic S] [--major N] [--header TEXT] [--hlen N] [--data BYTES]
 *                                                     a hand-made file, for malformed cases
 *   tool_npy write PATH DESCR D0 [D1 ...] -- V0 V1 ...  '<i4', '<i8' or '|b1' with the given values
 *                                                     (the last one repeated to fill the shape);
 *                                                     '|b1' with "tril": 1 where column <= row
 *   tool_npy info PATH                                prints "DESCR d0,d1,... finite|nonfinite"
 *   tool_npy measure OUT CMD [ARGS...]                runs CMD, writes "wall_ms max_rss_kb"
 *                                                     to OUT, exits with CMD's status
 *   tool_npy refcheck Q K V O [--causal] [--window L R] [--do DO --dq DQ --dk DK --dv DV]
 *                     [--dropout P --seed S]             (the keep mask from fa_dropout_keep_mask)
 *                                                     compares float32 outputs of the CLI with
 *                                                     the float64 reference (src/ref)
 *   tool_npy compare A B TOL                          float32 files of one shape agree within
 *                                                     TOL * (1 + |b|) elementwise
 * Its .npy parsing is deliberately independent of tools/npy.c. */
#include "flashattn.h"
#include "ref/ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int die(const char *msg, const char *arg) {
    fprintf(stderr, "tool_npy: %s %s\n", msg, arg ? arg : "");
    return 3;
}

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Writes preamble (version major.0) + header text padded to a multiple of 64 + newline. */
static void write_header(FILE *f, int major, const char *dict) {
    size_t pre = major == 1 ? 10 : 12, len = strlen(dict) + 1;
    size_t pad = (64 - (pre + len) % 64) % 64, hlen = len + pad;
    fwrite("\x93NUMPY", 1, 6, f);
    unsigned char v[6] = {(unsigned char)major, 0, (unsigned char)(hlen & 255),
                          (unsigned char)(hlen >> 8), 0, 0};
    fwrite(v, 1, pre - 6, f);
    fputs(dict, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
}

static int cmd_rand(int argc, char **argv) {
    if (argc < 3) return die("usage: rand PATH DESCR DIMS...", NULL);
    const char *path = argv[0], *descr = argv[1];
    uint64_t seed = 1;
    int64_t shape[8], n = 1;
    int nd = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
            continue;
        }
        if (nd == 8) return die("too many dims", NULL);
        shape[nd] = strtoll(argv[i], NULL, 10);
        n *= shape[nd++];
    }
    char dict[256], sh[160] = "(";
    for (int i = 0; i < nd; i++)
        snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%lld%s", (long long)shape[i],
                 nd == 1 ? "," : i + 1 < nd ? ", " : "");
    strcat(sh, ")");
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, sh);
    FILE *f = fopen(path, "wb");
    if (!f) return die("cannot create", path);
    write_header(f, 1, dict);
    int64_t last = nd ? shape[nd - 1] : 1;
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(next(&seed) >> 11) * 0x1p-52 - 1.0;
        if (strcmp(descr, "<f4") == 0) {
            float x = (float)u;
            fwrite(&x, 4, 1, f);
        } else if (strcmp(descr, "<f2") == 0) {
            uint16_t h;
            const float x = (float)u;
            fa_convert(FA_F32, &x, FA_F16, &h, 1);
            fwrite(&h, 2, 1, f);
        } else if (strcmp(descr, "<i4") == 0) {
            int32_t s = (int32_t)((i % last) * 3 / last);
            fwrite(&s, 4, 1, f);
        } else {
            uint64_t z = next(&seed); /* any other descr: 8 bytes per element */
            fwrite(&z, 8, 1, f);
        }
    }
    return fclose(f) ? die("write failed", path) : 0;
}

static int cmd_raw(int argc, char **argv) {
    if (argc < 1) return die("usage: raw PATH ...", NULL);
    const char *path = argv[0], *magic = "\x93NUMPY",
               *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    int major = 1;
    long hlen = -1, data = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--magic") == 0) magic = argv[i + 1];
        else if (strcmp(argv[i], "--major") == 0) major = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--header") == 0) dict = argv[i + 1];
        else if (strcmp(argv[i], "--hlen") == 0) hlen = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--data") == 0) data = atol(argv[i + 1]);
        else return die("unknown raw option", argv[i]);
    }
    FILE *f = fopen(path, "wb");
    if (!f) return die("cannot create", path);
    size_t len = strlen(dict);
    fwrite(magic, 1, strlen(magic) < 6 ? strlen(magic) : 6, f);
    unsigned long hl = hlen >= 0 ? (unsigned long)hlen : len;
    unsigned char v[6] = {(unsigned char)major, 0, (unsigned char)(hl & 255),
                          (unsigned char)((hl >> 8) & 255), (unsigned char)((hl >> 16) & 255),
                          (unsigned char)(hl >> 24)};
    fwrite(v, 1, major >= 2 ? 6 : 4, f);
    fwrite(dict, 1, len, f);
    for (long i = 0; i < data; i++) fputc(i & 1 ? 0x3f : 0, f);
    return fclose(f) ? die("write failed", path) : 0;
}

static int cmd_write(int argc, char **argv) {
    if (argc < 4) return die("usage: write PATH DESCR DIMS... -- VALUES...", NULL);
    const char *path = argv[0], *descr = argv[1];
    const int size = strcmp(descr, "<i4") == 0 ? 4 : strcmp(descr, "<i8") == 0 ? 8 : strcmp(descr, "|b1") == 0 ? 1 : 0;
    if (!size) return die("write: DESCR must be <i4, <i8 or |b1, got", descr);
    int i = 2, nd = 0;
    long long dims[8], count = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0 && nd < 8; i++) dims[nd] = atoll(argv[i]), count *= dims[nd++];
    if (i >= argc - 1) return die("write: no values after --", NULL);
    char shape[160] = "", *s = shape;
    for (int d = 0; d < nd; d++) s += sprintf(s, "%lld%s", dims[d], nd == 1 ? "," : d + 1 < nd ? ", " : "");
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    while ((10 + len + 1) % 64) dict[len++] = ' ';
    dict[len++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f) return die("cannot create", path);
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 255), (unsigned char)(len >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)len, f);
    const int tril = strcmp(argv[i + 1], "tril") == 0, nv = argc - i - 1;
    const long long cols = nd ? dims[nd - 1] : 1;
    for (long long x = 0; x < count; x++) {
        long long v = tril ? x % cols <= x / cols % (nd > 1 ? dims[nd - 2] : 1) : atoll(argv[i + 1 + (x < nv ? x : nv - 1)]);
        for (int b = 0; b < size; b++) fputc((int)((unsigned long long)v >> (8 * b)) & 255, f);
    }
    return fclose(f) ? die("write failed", path) : 0;
}

static int cmd_info(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return die("cannot open", path);
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) || pre[6] != 1)
        return die("not a version 1 .npy", path);
    size_t hlen = pre[8] | (size_t)pre[9] << 8;
    char *h = calloc(hlen + 1, 1);
    if (!h || fread(h, 1, hlen, f) != hlen) return die("short header", path);
    const char *d = strstr(h, "'descr': '"), *s = strstr(h, "'shape': (");
    if (!d || !s) return die("header lacks descr or shape", path);
    char descr[8] = {0};
    memcpy(descr, d + 10, 3);
    printf("%s ", descr);
    int64_t n = 1;
    const char *p = s + 10;
    for (int first = 1; *p && *p != ')';) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        char *end;
        long long x = strtoll(p, &end, 10);
        printf("%s%lld", first ? "" : ",", x);
        n *= x;
        first = 0;
        p = end;
    }
    long nonfinite = 0, got = 0;
    float x;
    while (fread(&x, 4, 1, f) == 1) {
        got++;
        if (!isfinite(x)) nonfinite++;
    }
    fclose(f);
    free(h);
    if (got != n) {
        printf(" size-mismatch(%ld of %lld)\n", got, (long long)n);
        return 1;
    }
    if (nonfinite) printf(" nonfinite(%ld)\n", nonfinite);
    else printf(" finite\n");
    return 0;
}

static int cmd_measure(int argc, char **argv) {
    if (argc < 2) return die("usage: measure OUT CMD [ARGS...]", NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) return die("fork failed", NULL);
    if (pid == 0) {
        execv(argv[1], argv + 1);
        _exit(127);
    }
    int status;
    struct rusage ru; /* the only child, so the children's peak is its peak */
    if (waitpid(pid, &status, 0) < 0 || getrusage(RUSAGE_CHILDREN, &ru) != 0)
        return die("wait failed", NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    FILE *o = fopen(argv[0], "w");
    if (!o) return die("cannot write", argv[0]);
    fprintf(o, "%.3f %ld\n", ms, (long)ru.ru_maxrss);
    fclose(o);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* A float32 version-1 .npy: data (malloc'ed) and its shape. */
static float *load_f32(const char *path, int64_t shape[4], int *ndim) {
    FILE *f = fopen(path, "rb");
    unsigned char pre[10];
    if (!f || fread(pre, 1, 10, f) != 10 || pre[6] != 1) {
        if (f) fclose(f);
        return NULL;
    }
    size_t hlen = pre[8] | (size_t)pre[9] << 8;
    char h[4096] = {0};
    if (hlen >= sizeof h || fread(h, 1, hlen, f) != hlen || !strstr(h, "'<f4'")) {
        fclose(f);
        return NULL;
    }
    const char *p = strstr(h, "'shape': (");
    int64_t n = 1;
    *ndim = 0;
    for (p = p ? p + 10 : ")"; *p && *p != ')' && *ndim < 4;) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        char *end;
        shape[*ndim] = strtoll(p, &end, 10);
        n *= shape[(*ndim)++];
        p = end;
    }
    float *x = malloc(sizeof(float) * (size_t)n);
    if (x && fread(x, sizeof(float), (size_t)n, f) != (size_t)n) {
        free(x);
        x = NULL;
    }
    fclose(f);
    return x;
}

/* Max of |got - ref| / (1e-4 + 1e-4 |ref|) over n elements; prints and returns 1 if > 1. */
static int compare(const char *what, const float *got, const double *ref, int64_t n) {
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (1e-4 + 1e-4 * fabs(ref[i]));
        if (!(e <= worst)) worst = e, at = i;
    }
    if (worst > 1) {
        printf("%s: element %lld is %g, reference %g\n", what, (long long)at, (double)got[at],
               ref[at]);
        return 1;
    }
    return 0;
}

static int cmd_refcheck(int argc, char **argv) {
    if (argc < 4) return die("usage: refcheck Q K V O [options]", NULL);
    const char *grad[4] = {NULL, NULL, NULL, NULL}; /* do dq dk dv */
    const char *bias_path = NULL, *dbias_path = NULL, *sinks_path = NULL, *dsink_path = NULL;
    fa_problem p;
    fa_problem_init(&p);
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--causal") == 0) p.causal = 1;
        else if (strcmp(argv[i], "--window") == 0 && i + 2 < argc)
            p.window_left = atoll(argv[i + 1]), p.window_right = atoll(argv[i + 2]), i += 2;
        else if (i + 1 < argc && strcmp(argv[i], "--do") == 0) grad[0] = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--dq") == 0) grad[1] = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--dk") == 0) grad[2] = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--dv") == 0) grad[3] = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--bias") == 0) bias_path = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--dbias") == 0) dbias_path = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--sinks") == 0) sinks_path = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--dsink") == 0) dsink_path = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--bias-scale") == 0)
            p.has_bias_scale = 1, p.bias_scale = (float)atof(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--diag-offset") == 0)
            p.has_diag_offset = 1, p.diag_offset = atoll(argv[++i]);
        else if (strcmp(argv[i], "--top-left") == 0) p.has_diag_offset = 1, p.diag_offset = 0;
        else if (i + 1 < argc && strcmp(argv[i], "--dropout") == 0) p.dropout_p = (float)atof(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) p.dropout_seed = strtoull(argv[++i], NULL, 0);
        else return die("unknown refcheck option", argv[i]);
    }
    int64_t sq[4], sk[4], sv[4], so[4], sx[4];
    int nd;
    float *q = load_f32(argv[0], sq, &nd), *k = load_f32(argv[1], sk, &nd);
    float *v = load_f32(argv[2], sv, &nd), *o = load_f32(argv[3], so, &nd);
    if (!q || !k || !v || !o) return die("cannot read float32 inputs", NULL);
    p.batch = sq[0], p.heads_q = sq[1], p.heads_kv = sk[1], p.seq_q = sq[2], p.seq_k = sk[2];
    p.head_dim = sq[3], p.head_dim_v = sv[3];
    int64_t nq = sq[0] * sq[1] * sq[2] * sq[3], nk = sk[0] * sk[1] * sk[2] * sk[3];
    int64_t nv = sv[0] * sv[1] * sv[2] * sv[3], no = so[0] * so[1] * so[2] * so[3];
    int64_t sb[4] = {0}, nb = 0;
    float *bias = NULL;
    if (bias_path) {
        if (!(bias = load_f32(bias_path, sb, &nd)) || nd != 4) return die("cannot read a 4-D float32 bias", bias_path);
        p.has_bias = 1, p.bias_batch = sb[0], p.bias_heads = sb[1], p.bias_seq_q = sb[2];
        nb = sb[0] * sb[1] * sb[2] * sb[3];
    }
    float *sinks = NULL;
    if (sinks_path) {
        if (!(sinks = load_f32(sinks_path, sx, &nd)) || nd != 1 || sx[0] != p.heads_q)
            return die("cannot read float32 sinks [Hq]", sinks_path);
        p.has_sinks = 1;
    }
    double *ro = malloc(sizeof(double) * (size_t)no), *rl = malloc(sizeof(double) * (size_t)no);
    fa_forward_args fa = {0};
    fa.q = q, fa.k = k, fa.v = v, fa.bias = bias, fa.sinks = sinks;
    uint8_t *keep = NULL; /* dropout's mask [B, Hq, Sq, Sk] */
    if (p.dropout_p > 0) {
        if (dbias_path) return die("refcheck takes --dropout or --dbias, not both", NULL);
        if (sinks) return die("refcheck takes --dropout or --sinks, not both", NULL);
        const int64_t per = p.seq_q * p.seq_k;
        if (!(keep = malloc((size_t)(p.batch * p.heads_q * per)))) return die("out of memory", NULL);
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t h = 0; h < p.heads_q; h++)
                if (fa_dropout_keep_mask(p.dropout_p, p.dropout_seed, 0, b, h, 0, p.seq_q, 0, p.seq_k,
                                         keep + (b * p.heads_q + h) * per))
                    return die("fa_dropout_keep_mask:", fa_last_error());
    }
    fa_ref_forward_dropout(&p, &fa, keep, ro, rl);
    int bad = compare("o", o, ro, no);
    if (grad[0]) {
        float *d_o = load_f32(grad[0], sx, &nd), *dq = load_f32(grad[1], sx, &nd);
        float *dk = load_f32(grad[2], sx, &nd), *dv = load_f32(grad[3], sx, &nd);
        if (!d_o || !dq || !dk || !dv) return die("cannot read gradients", NULL);
        double *rq = malloc(sizeof(double) * (size_t)nq), *rk = malloc(sizeof(double) * (size_t)nk);
        double *rv = malloc(sizeof(double) * (size_t)nv);
        double *rb = dbias_path ? malloc(sizeof(double) * (size_t)(nb ? nb : 1)) : NULL;
        fa_backward_args ba = {0};
        ba.q = q, ba.k = k, ba.v = v, ba.d_o = d_o, ba.bias = bias, ba.sinks = sinks;
        if (keep) {
            fa_ref_backward_dropout(&p, &ba, keep, 0, 0, rq, rk, rv);
        } else if (sinks) { /* sinks (with no dbias): their gradient too */
            double rs[1024];
            if (p.heads_q > 1024) return die("refcheck --sinks takes at most 1024 heads", sinks_path);
            fa_ref_backward_sinks(&p, &ba, 0, rq, rk, rv, rs);
            float *ds = dsink_path ? load_f32(dsink_path, sx, &nd) : NULL;
            if (dsink_path && (!ds || nd != 1 || sx[0] != p.heads_q)) return die("cannot read dsink [Hq]", dsink_path);
            if (ds) bad |= compare("dsink", ds, rs, p.heads_q);
            free(ds);
        } else {
            fa_ref_backward_dbias(&p, &ba, rq, rk, rv, rb);
        }
        bad |= compare("dq", dq, rq, nq) | compare("dk", dk, rk, nk) | compare("dv", dv, rv, nv);
        if (rb) {
            int64_t sd[4] = {0};
            float *db = load_f32(dbias_path, sd, &nd);
            if (!db || memcmp(sd, sb, sizeof sd) != 0) return die("cannot read dbias of the bias's shape", dbias_path);
            bad |= compare("dbias", db, rb, nb);
            free(db), free(rb);
        }
        free(d_o), free(dq), free(dk), free(dv), free(rq), free(rk), free(rv);
    }
    free(q), free(k), free(v), free(o), free(ro), free(rl), free(bias), free(sinks), free(keep);
    if (!bad) printf("matches the reference\n");
    return bad;
}

static int cmd_compare(const char *pa, const char *pb, double tol) {
    int64_t sa[4] = {0}, sb[4] = {0};
    int na = 0, nb = 0;
    float *a = load_f32(pa, sa, &na), *b = load_f32(pb, sb, &nb);
    if (!a || !b || na != nb || memcmp(sa, sb, sizeof sa) != 0) {
        printf("cannot compare %s and %s (unreadable or different shapes)\n", pa, pb);
        return 1;
    }
    int64_t n = 1;
    for (int i = 0; i < na; i++) n *= sa[i];
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (1 + fabs((double)b[i]));
        if (!(e <= worst)) worst = e, at = i;
    }
    printf("max error %.3g at element %lld (%g vs %g)\n", worst, (long long)at, (double)a[at],
           (double)b[at]);
    free(a), free(b);
    return worst <= tol ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return die("usage: tool_npy rand|raw|info|measure ...", NULL);
    if (strcmp(argv[1], "rand") == 0) return cmd_rand(argc - 2, argv + 2);
    if (strcmp(argv[1], "raw") == 0) return cmd_raw(argc - 2, argv + 2);
    if (strcmp(argv[1], "write") == 0) return cmd_write(argc - 2, argv + 2);
    if (strcmp(argv[1], "info") == 0 && argc == 3) return cmd_info(argv[2]);
    if (strcmp(argv[1], "measure") == 0) return cmd_measure(argc - 2, argv + 2);
    if (strcmp(argv[1], "refcheck") == 0) return cmd_refcheck(argc - 2, argv + 2);
    if (strcmp(argv[1], "compare") == 0 && argc == 5)
        return cmd_compare(argv[2], argv[3], atof(argv[4]));
    return die("unknown command", argv[1]);
}
