/* The rates cache (a flat JSON object of "<isa>/t<threads>/<name>": number) and the time
 * model (rates.h says what it is). */
#include "rates.h"
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_KEYS 512
#define KEY_LEN 96

/* The names of an entry's fields, in file order. */
static const char *const dtype_names[3] = {"f32", "f16", "bf16"}; /* indexed by fa_dtype */

typedef struct {
    int n;
    char key[MAX_KEYS][KEY_LEN];
    double val[MAX_KEYS];
} kv_list;

int cli_rates_path(char *buf, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/') n = snprintf(buf, len, "%s/flashattn/rates.json", xdg);
    else if (home && *home) n = snprintf(buf, len, "%s/.cache/flashattn/rates.json", home);
    else return 1;
    return n < 0 || (size_t)n >= len;
}

/* Reads every "key": number pair of the file; anything else is skipped. A missing file is
 * an empty list; one that cannot be opened or read otherwise (out of memory, permissions,
 * an I/O error) is -1 with errno set, so that no caller takes it for "no rates". */
static int read_kv(const char *path, kv_list *kv) {
    kv->n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
    errno = 0; /* what a failed read leaves here says why (EISDIR, EIO) */
    int c;
    while ((c = fgetc(f)) != EOF && kv->n < MAX_KEYS) {
        if (c != '"') continue;
        char key[KEY_LEN];
        size_t k = 0;
        while ((c = fgetc(f)) != EOF && c != '"')
            if (k + 1 < sizeof key) key[k++] = (char)c;
        key[k] = 0;
        double v;
        if (fscanf(f, " : %lf", &v) == 1) {
            snprintf(kv->key[kv->n], KEY_LEN, "%s", key);
            kv->val[kv->n++] = v;
        }
    }
    const int bad = ferror(f), why = errno ? errno : EIO;
    fclose(f);
    errno = why;
    return bad ? -1 : 0;
}

static void set_kv(kv_list *kv, const char *key, double v) {
    for (int i = 0; i < kv->n; i++)
        if (strcmp(kv->key[i], key) == 0) {
            kv->val[i] = v;
            return;
        }
    if (kv->n == MAX_KEYS) return;
    snprintf(kv->key[kv->n], KEY_LEN, "%s", key);
    kv->val[kv->n++] = v;
}

static int get_kv(const kv_list *kv, const char *key, double *v) {
    for (int i = 0; i < kv->n; i++)
        if (strcmp(kv->key[i], key) == 0) {
            *v = kv->val[i];
            return 1;
        }
    return 0;
}

/* Walks the fields of an entry: for each, its name and where it lives in r. */
typedef struct {
    char name[32];
    double *at;
} field;

static int fields_of(cli_rates *r, field *f) {
    int n = 0;
    const struct { const char *name; double *at; } fixed[] = {
        {"fma_gflops", &r->fma_gflops},
        {"dpbf16_gflops", &r->dpbf16_gflops},
        {"read_gbps", &r->read_gbps},
        {"exp_per_s", &r->exp_per_s},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++, n++) {
        snprintf(f[n].name, sizeof f[n].name, "%s", fixed[i].name);
        f[n].at = fixed[i].at;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < 3; t++, n++) {
            snprintf(f[n].name, sizeof f[n].name, "eff_%s_%s", pass ? "backward" : "forward",
                     dtype_names[t]);
            f[n].at = &r->eff[pass][t];
        }
    return n;
}

int cli_rates_load(const char *isa, int threads, cli_rates *r) {
    char path[4096], key[KEY_LEN];
    if (cli_rates_path(path, sizeof path)) return 1;
    kv_list *kv = malloc(sizeof *kv);
    if (!kv) return -1; /* errno: ENOMEM */
    if (read_kv(path, kv)) {
        const int e = errno;
        free(kv);
        errno = e;
        return -1;
    }
    memset(r, 0, sizeof *r);
    snprintf(r->isa, sizeof r->isa, "%s", isa);
    r->threads = threads;
    field f[16];
    int nf = fields_of(r, f), found = 0;
    for (int i = 0; i < nf; i++) {
        snprintf(key, sizeof key, "%.31s/t%d/%.31s", isa, threads, f[i].name);
        found += get_kv(kv, key, f[i].at);
    }
    free(kv);
    return found == nf ? 0 : 1;
}

/* mkdir -p of the directories above path. */
static int make_parents(char *path) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
        *s = '/';
        if (bad) return 1;
    }
    return 0;
}

int cli_rates_save(const cli_rates *r, int (*before_commit)(void *ctx), void *ctx, char *err, size_t errlen) {
    char path[4096], key[KEY_LEN], nerr[NPY_ERR_LEN];
    if (cli_rates_path(path, sizeof path)) {
        snprintf(err, errlen, "no cache directory (set XDG_CACHE_HOME or HOME)");
        return 1;
    }
    kv_list *kv = malloc(sizeof *kv);
    if (!kv) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    if (read_kv(path, kv)) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        free(kv);
        return 1;
    }
    cli_rates copy = *r;
    field f[16];
    int nf = fields_of(&copy, f);
    for (int i = 0; i < nf; i++) {
        snprintf(key, sizeof key, "%.31s/t%d/%.31s", r->isa, r->threads, f[i].name);
        set_kv(kv, key, *f[i].at);
    }
    /* the text in memory first, then the file as the command's outputs are written (npy.h):
     * an unnamed or mkstemp temporary beside it, renamed onto it only when whole, removed on
     * any failure and by an interrupting signal; concurrent calibrations never share one */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int bad = !mem;
    if (mem) {
        fprintf(mem, "{\n");
        for (int i = 0; i < kv->n; i++)
            fprintf(mem, "  \"%s\": %.6g%s\n", kv->key[i], kv->val[i], i + 1 < kv->n ? "," : "");
        fprintf(mem, "}\n");
        bad = ferror(mem) != 0;
        bad = fclose(mem) != 0 || bad;
    }
    free(kv);
    if (bad) {
        snprintf(err, errlen, "out of memory");
        free(text);
        return 1;
    }
    npy_out o;
    memset(&o, 0, sizeof o);
    if (make_parents(path)) {
        snprintf(err, errlen, "cannot create the directory of %s: %s", path, strerror(errno));
        bad = 1;
    } else if (npy_out_open(&o, path, nerr, sizeof nerr) || npy_out_write_bytes(&o, text, len, nerr, sizeof nerr) ||
               npy_out_prepare(&o, nerr, sizeof nerr)) {
        snprintf(err, errlen, "%s", nerr);
        bad = 1;
    } else if (before_commit && before_commit(ctx)) {
        bad = -1; /* the caller said why */
    } else if (npy_out_commit(&o, nerr, sizeof nerr)) {
        snprintf(err, errlen, "%s", nerr);
        bad = 1;
    }
    npy_out_abort(&o); /* removes any temporary; nothing after a commit */
    free(text);
    return bad;
}

double cli_rates_peak(const cli_rates *r, fa_dtype t) {
    const int bf16_units = strcmp(r->isa, "avx512bf16") == 0 || strcmp(r->isa, "amx") == 0;
    if (t == FA_BF16 && bf16_units && r->dpbf16_gflops > 0) return r->dpbf16_gflops;
    return r->fma_gflops;
}

int cli_rates_predict(const cli_rates *r, const fa_plan *plan, fa_pass pass, cli_prediction *out) {
    const fa_problem *p = fa_plan_problem(plan);
    if (fa_plan_backend(plan) != FA_BACKEND_CPU) return 1;
    const double eff = r->eff[pass == FA_BACKWARD][p->dtype], peak = cli_rates_peak(r, p->dtype);
    if (!(eff > 0) || !(peak > 0) || !(r->exp_per_s > 0) || !(r->read_gbps > 0)) return 1;
    fa_cost c;
    if (fa_plan_cost(plan, pass, &c) != FA_OK) return 1;
    out->peak_gflops = peak;
    out->efficiency = eff;
    out->compute = (double)c.flops / (peak * 1e9 * eff);
    out->exps = (double)c.transcendentals / r->exp_per_s;
    out->memory = (double)c.bytes_accessed / (r->read_gbps * 1e9);
    const double busy = out->compute + out->exps;
    out->seconds = busy > out->memory ? busy : out->memory;
    return 0;
}
