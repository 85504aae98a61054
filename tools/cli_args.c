/* Flag parsing: one table of every flag, the subcommands that take it, its arity and where
 * its value goes; each value checked where it is parsed, so the message names the flag and
 * the value. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALL (CMD_PLAN | CMD_RUN | CMD_GRAD | CMD_BENCH)
#define FILES (CMD_RUN | CMD_GRAD)

typedef enum {
    F_BATCH, F_HEADS, F_KV_HEADS, F_SEQ, F_SEQ_Q, F_SEQ_K, F_HEAD_DIM, F_V_HEAD_DIM, F_DTYPE,
    F_CAUSAL, F_WINDOW, F_SOFTCAP, F_SCALE, F_ALIBI, F_BIAS, F_Q_SEG, F_KV_SEG, F_BACKEND,
    F_THREADS, F_BLOCK_Q, F_BLOCK_K, F_BUDGET, F_JSON, F_COUNT, F_ITERS, F_Q, F_K, F_V, F_OUT,
    F_LSE, F_DO, F_DQ, F_DK, F_DV, F_PASS, F_HELP, F_BIAS_SCALE, F_DIAG_OFFSET, F_TOP_LEFT, F_DBIAS,
    F_SEQ_PARALLEL, F_ZIGZAG,
    F_CU_Q, F_CU_K, F_CACHE_LENS, F_BLOCK_TABLE, F_K_NEW, F_V_NEW, F_UPDATE_CACHE, F_PAGE_SIZE,
    F_NUM_PAGES, F_DECODE, F_CACHE_LEN, F_VARLEN, F_HUGE_PAGES, F_SINKS, F_DSINK, F_K_PREFIX, F_V_PREFIX,
    F_DROPOUT, F_SEED, F_MASK_CHUNK, F_PREFIX_LEN, F_DOCUMENTS, F_MASK, F_CACHE_DTYPE, F_LENGTHS_PER_CALL,
    F_PROGRESS, F_NO_CACHE, F_LAYERS, F_COUNT_OF_FLAGS
} flag_id;

/* How apply() takes a flag's value: an int64 or int of at least lo, a file name, or a switch,
 * each stored at offset `at` of cli_args; OWN flags have their own case in apply(). */
enum { V_I64, V_INT, V_FILE, V_ON, V_OWN };
#define I64(name, field, lo, cmds) {name, 1, cmds, V_I64, offsetof(cli_args, field), lo}
#define FILE_ARG(name, field, cmds) {name, 1, cmds, V_FILE, offsetof(cli_args, field), 0}
#define ON(name, field, cmds) {name, 0, cmds, V_ON, offsetof(cli_args, field), 0}
#define OWN(name, nvals, cmds) {name, nvals, cmds, V_OWN, 0, 0}

static const struct {
    const char *name;
    int nvals;
    int cmds;
    int kind;
    size_t at;
    int64_t lo;
} flags[F_COUNT_OF_FLAGS] = {
    [F_BATCH] = I64("--batch", batch, 1, ALL), [F_HEADS] = I64("--heads", heads, 1, ALL),
    [F_KV_HEADS] = I64("--kv-heads", kv_heads, 1, ALL), [F_SEQ] = I64("--seq", seq, 1, ALL),
    [F_SEQ_Q] = I64("--seq-q", seq_q, 1, ALL), [F_SEQ_K] = I64("--seq-k", seq_k, 1, ALL),
    [F_HEAD_DIM] = I64("--head-dim", head_dim, 1, ALL),
    [F_V_HEAD_DIM] = I64("--v-head-dim", v_head_dim, 1, ALL),
    [F_DTYPE] = OWN("--dtype", 1, ALL), [F_CAUSAL] = ON("--causal", causal, ALL),
    [F_WINDOW] = OWN("--window", 2, ALL), [F_SOFTCAP] = OWN("--softcap", 1, ALL),
    [F_SCALE] = OWN("--scale", 1, ALL), [F_ALIBI] = FILE_ARG("--alibi", alibi, ALL),
    [F_BIAS] = FILE_ARG("--bias", bias, ALL), [F_Q_SEG] = FILE_ARG("--q-segments", q_segments, ALL),
    [F_KV_SEG] = FILE_ARG("--kv-segments", kv_segments, ALL), [F_BACKEND] = OWN("--backend", 1, ALL),
    [F_THREADS] = OWN("--threads", 1, ALL | CMD_CALIBRATE), [F_BLOCK_Q] = I64("--block-q", block_q, 1, ALL),
    [F_BLOCK_K] = I64("--block-k", block_k, 1, ALL), [F_BUDGET] = OWN("--memory-budget", 1, CMD_PLAN),
    [F_JSON] = ON("--json", json, CMD_PLAN | CMD_BENCH | CMD_CALIBRATE), [F_COUNT] = ON("--count", count, FILES),
    [F_ITERS] = {"--iters", 1, CMD_BENCH, V_INT, offsetof(cli_args, iters), 1},
    [F_Q] = FILE_ARG("--q", q, FILES), [F_K] = FILE_ARG("--k", k, FILES), [F_V] = FILE_ARG("--v", v, FILES),
    [F_OUT] = FILE_ARG("--out", out, FILES), [F_LSE] = FILE_ARG("--lse", lse, FILES),
    [F_DO] = FILE_ARG("--do", d_o, CMD_GRAD), [F_DQ] = FILE_ARG("--dq", dq, CMD_GRAD),
    [F_DK] = FILE_ARG("--dk", dk, CMD_GRAD), [F_DV] = FILE_ARG("--dv", dv, CMD_GRAD),
    [F_PASS] = OWN("--pass", 1, CMD_BENCH), [F_HELP] = ON("--help", help, ALL | CMD_CALIBRATE),
    [F_BIAS_SCALE] = OWN("--bias-scale", 1, ALL), [F_DIAG_OFFSET] = OWN("--diag-offset", 1, ALL),
    [F_TOP_LEFT] = OWN("--top-left", 0, ALL), [F_DBIAS] = FILE_ARG("--dbias", dbias, CMD_GRAD),
    [F_SEQ_PARALLEL] = OWN("--seq-parallel", 1, FILES | CMD_BENCH),
    [F_ZIGZAG] = ON("--zigzag", zigzag, FILES | CMD_BENCH),
    [F_CU_Q] = FILE_ARG("--cu-seqlens-q", cu_seqlens_q, CMD_PLAN | FILES),
    [F_CU_K] = FILE_ARG("--cu-seqlens-k", cu_seqlens_k, CMD_PLAN | FILES),
    [F_CACHE_LENS] = FILE_ARG("--cache-seqlens", cache_seqlens, CMD_PLAN | CMD_RUN),
    [F_BLOCK_TABLE] = FILE_ARG("--block-table", block_table, CMD_PLAN | CMD_RUN),
    [F_K_NEW] = FILE_ARG("--k-new", k_new, CMD_PLAN | CMD_RUN),
    [F_V_NEW] = FILE_ARG("--v-new", v_new, CMD_PLAN | CMD_RUN),
    [F_UPDATE_CACHE] = ON("--update-cache", update_cache, CMD_RUN),
    [F_PROGRESS] = ON("--progress", progress, FILES),
    [F_PAGE_SIZE] = I64("--page-size", page_size, 1, CMD_PLAN | CMD_BENCH),
    [F_NUM_PAGES] = I64("--num-pages", num_pages, 1, CMD_PLAN),
    [F_DECODE] = ON("--decode", decode, CMD_BENCH),
    [F_CACHE_LEN] = I64("--cache-len", cache_len, 1, CMD_BENCH), /* 0: not given */
    [F_VARLEN] = FILE_ARG("--varlen", varlen_lens, CMD_BENCH),
    [F_HUGE_PAGES] = ON("--huge-pages", huge_pages, CMD_BENCH),
    [F_SINKS] = FILE_ARG("--sinks", sinks, ALL), [F_DSINK] = FILE_ARG("--dsink", dsink, CMD_GRAD),
    [F_K_PREFIX] = FILE_ARG("--k-prefix", k_prefix, CMD_PLAN | CMD_RUN),
    [F_V_PREFIX] = FILE_ARG("--v-prefix", v_prefix, CMD_PLAN | CMD_RUN),
    [F_DROPOUT] = OWN("--dropout", 1, ALL), [F_SEED] = OWN("--seed", 1, ALL),
    [F_MASK_CHUNK] = I64("--mask-chunk", mask_chunk, 1, ALL),
    [F_PREFIX_LEN] = FILE_ARG("--prefix-len", prefix_len, ALL),
    [F_DOCUMENTS] = FILE_ARG("--documents", documents, ALL), [F_MASK] = FILE_ARG("--mask", mask, ALL),
    [F_CACHE_DTYPE] = OWN("--cache-dtype", 1, CMD_PLAN | CMD_BENCH),
    [F_LENGTHS_PER_CALL] = ON("--lengths-per-call", lengths_per_call, CMD_PLAN | CMD_RUN),
    [F_NO_CACHE] = ON("--no-cache", no_cache, CMD_CALIBRATE),
    [F_LAYERS] = I64("--layers", layers, 1, CMD_BENCH), /* 0: not given */
};

int cli_fail(int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    fprintf(stderr, "flashattn: %s\n", msg);
    return code;
}

int cli_flush_stdout(void) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    const int e = errno;
    return cli_fail(1, "cannot write to stdout%s%s", e ? ": " : "", e ? strerror(e) : "");
}

int cli_fail_status(fa_status st, const char *context) {
    const char *m = fa_last_error();
    int code = (st == FA_ERR_INVALID || st == FA_ERR_NULL || st == FA_ERR_OVERFLOW) ? 2 : 1;
    return cli_fail(code, "%s: %s", context, (m && *m) ? m : fa_status_string(st));
}

/* The command line's numbers (docs/cli.md, "Numbers"): decimal only, the whole value, no
 * spaces of any kind (strtoll and strtod skip leading whitespace, tabs and newlines too; a
 * check of s[0] == ' ' let "\t2" through), no hexadecimal (strtod takes "0x1p-3"),
 * infinities or NaNs. Integers: [+-]digits. Reals: [+-]digits[.digits][e[+-]digits], or
 * [+-].digits[e[+-]digits]. */
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *digits(const char *s) {
    while (is_digit(*s)) s++;
    return s;
}

int cli_is_decimal_int(const char *s) {
    if (*s == '+' || *s == '-') s++;
    const char *e = digits(s);
    return e > s && !*e;
}

static int is_decimal_real(const char *s) {
    if (*s == '+' || *s == '-') s++;
    const char *e = digits(s);
    int n = (int)(e - s);
    if (*e == '.') {
        const char *f = digits(e + 1);
        n += (int)(f - (e + 1));
        e = f;
    }
    if (!n) return 0;
    if (*e == 'e' || *e == 'E') {
        const char *x = e + 1;
        if (*x == '+' || *x == '-') x++;
        e = digits(x);
        if (e == x) return 0;
    }
    return !*e;
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t *out) {
    char *end;
    if (!cli_is_decimal_int(s)) return cli_fail(2, "%s: '%s' is not an integer (decimal digits, optional sign)", flag, s);
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) return cli_fail(2, "%s: '%s' is out of range", flag, s);
    if (v < lo) return cli_fail(2, "%s: %lld is below %lld", flag, v, (long long)lo);
    *out = v;
    return 0;
}

static int parse_int(const char *flag, const char *s, int lo, int *out) {
    int64_t v;
    int rc = parse_i64(flag, s, lo, &v);
    if (rc) return rc;
    if (v > INT_MAX) return cli_fail(2, "%s: %lld is too large", flag, (long long)v);
    *out = (int)v;
    return 0;
}

/* A finite decimal real whose float32 is finite, as the double it reads (parse_float's). */
static int parse_real(const char *flag, const char *s, double *out) {
    char *end;
    if (!is_decimal_real(s)) {
        const double w = strtod(s, &end); /* say so where strtod would have taken an infinity or a NaN */
        if (*s != ' ' && (*s < '\t' || *s > '\r') && !*end && !isfinite(w))
            return cli_fail(2, "%s: '%s' is not a finite float32", flag, s);
        return cli_fail(2, "%s: '%s' is not a number (decimal, as 0.125 or 1e-3)", flag, s);
    }
    double v = strtod(s, &end);
    if (*end || !isfinite(v) || !isfinite((float)v))
        return cli_fail(2, "%s: '%s' is not a finite float32", flag, s);
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out) {
    double v;
    if (parse_real(flag, s, &v)) return 2;
    *out = (float)v;
    return 0;
}

/* --seed: decimal digits, or 0x and hex digits; no sign, no spaces. */
static int is_seed(const char *s) {
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        const char *h = s + 2;
        while ((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f') || (*h >= 'A' && *h <= 'F')) h++;
        return h > s + 2 && !*h;
    }
    return *s && !*digits(s);
}

/* Sizes: decimal digits with an optional fraction, then an optional unit K, M, G, T, P or E
 * (powers of 1024, either case, optionally followed by "iB" or "B"), or a bare "B". All in
 * integers, so every size up to INT64_MAX is exact (through a double, 7.99999999999999999E
 * rounded up to 2^63 and overflowed): the whole part times the unit, plus the fraction's
 * bytes, which must be whole (no fractions of a byte: 1.5K = 1536, 1.3K is refused).
 * Hexadecimal, exponents, signs and spaces are refused (strtod would take "0x10" and "1e9").
 * Returns 0, -1 (not a size, or above INT64_MAX) or -2 (not a whole number of bytes). */
int cli_parse_bytes(const char *s, int64_t *out) {
    const char *c = s, *f0 = NULL, *f1 = NULL; /* the fraction's digits: [f0, f1) */
    int64_t whole = 0;
    int digits = 0;
    for (; *c >= '0' && *c <= '9'; c++, digits++) {
        int d = *c - '0';
        if (whole > (INT64_MAX - d) / 10) return -1;
        whole = whole * 10 + d;
    }
    if (*c == '.')
        for (f0 = f1 = ++c; *c >= '0' && *c <= '9'; c++, digits++) f1 = c + 1;
    if (!digits) return -1;
    int shift = 0;
    const char *u = *c ? strchr("KMGTPE", *c >= 'a' && *c <= 'z' ? *c - 32 : *c) : NULL;
    if (u) {
        shift = 10 * (int)(u - "KMGTPE" + 1);
        c++;
        if (c[0] == 'i' && c[1] == 'B') c += 2;
        else if (*c == 'B') c++;
    } else if (*c == 'B') {
        c++;
    }
    if (*c) return -1;
    while (f1 > f0 && f1[-1] == '0') f1--; /* 1.50K is 1.5K */
    /* The fraction 0.d1..dn of a unit U = 2^shift, in bytes, from the last digit up:
     * x = (d_i U + x) / 10. Where the total is whole every step divides exactly (x_i = 10
     * x_(i-1) - d_(i-1) U); a step that does not means a fraction of a byte. x < U <= 2^60
     * and d U <= 9 * 2^60, so the sums fit in 64 unsigned bits. */
    const uint64_t unit = (uint64_t)1 << shift;
    uint64_t part = 0;
    for (const char *d = f1; d > f0; d--) {
        uint64_t t = (uint64_t)(d[-1] - '0') * unit + part;
        if (t % 10) return -2;
        part = t / 10;
    }
    if (whole > (INT64_MAX >> shift)) return -1;
    const int64_t bytes = whole << shift;
    if ((uint64_t)(INT64_MAX - bytes) < part) return -1;
    *out = bytes + (int64_t)part;
    return 0;
}

static int set_file(const char **slot, const char *flag, const char *v) {
    if (!*v) return cli_fail(2, "%s: empty file name", flag);
    *slot = v;
    return 0;
}

/* Applies one flag with its values: the table's kinds generically, OWN flags here. */
static int apply(cli_args *a, flag_id id, char **v) {
    const char *f = flags[id].name;
    void *field = (char *)a + flags[id].at;
    switch (flags[id].kind) {
    case V_I64: return parse_i64(f, v[0], flags[id].lo, field);
    case V_INT: return parse_int(f, v[0], (int)flags[id].lo, field);
    case V_FILE: return set_file(field, f, v[0]);
    case V_ON: *(int *)field = 1; return 0;
    }
    switch (id) {
    case F_DTYPE:
        a->has_dtype = 1;
        if (strcmp(v[0], "f32") == 0 || strcmp(v[0], "float32") == 0) a->dtype = FA_F32;
        else if (strcmp(v[0], "f16") == 0 || strcmp(v[0], "float16") == 0) a->dtype = FA_F16;
        else if (strcmp(v[0], "bf16") == 0 || strcmp(v[0], "bfloat16") == 0) a->dtype = FA_BF16;
        else return cli_fail(2, "--dtype: '%s' is not one of f32, f16, bf16", v[0]);
        return 0;
    case F_CACHE_DTYPE:
        a->has_cache_dtype = 1;
        if (strcmp(v[0], "int8") == 0) a->cache_dtype = FA_INT8;
        else if (strcmp(v[0], "fp8") == 0 || strcmp(v[0], "fp8_e4m3") == 0) a->cache_dtype = FA_FP8_E4M3;
        else return cli_fail(2, "--cache-dtype: '%s' is not one of int8, fp8", v[0]);
        return 0;
    case F_WINDOW:
        a->has_window = 1;
        if (parse_i64("--window (left)", v[0], -1, &a->window_left)) return 2;
        return parse_i64("--window (right)", v[1], -1, &a->window_right);
    case F_SOFTCAP:
        a->has_softcap = 1;
        double cap; /* judged by the value given: -1e-50 is negative, not a cap that rounds to 0 */
        if (parse_real(f, v[0], &cap)) return 2;
        if (cap < 0) return cli_fail(2, "--softcap: %s is negative", v[0]);
        a->softcap = (float)cap;
        if (a->softcap == 0 && cap != 0) /* rounded to 0, which means off */
            return cli_fail(2, "--softcap: %s rounds to 0 in float32, which would turn the cap off", v[0]);
        return 0;
    case F_SCALE:
        a->has_scale = 1;
        return parse_float(f, v[0], &a->scale);
    case F_BACKEND:
        if (strcmp(v[0], "auto") == 0) a->backend = FA_BACKEND_AUTO;
        else if (strcmp(v[0], "cpu") == 0) a->backend = FA_BACKEND_CPU;
        else if (strcmp(v[0], "cuda") == 0) a->backend = FA_BACKEND_CUDA;
        else return cli_fail(2, "--backend: '%s' is not one of auto, cpu, cuda", v[0]);
        return 0;
    case F_THREADS:
        if (parse_int(f, v[0], 1, &a->threads)) return 2;
        if (a->threads > FA_MAX_THREADS) /* the library refuses it too; say so before any work */
            return cli_fail(2, "--threads: %d is above the maximum of %d", a->threads, FA_MAX_THREADS);
        return 0;
    case F_BUDGET:
        a->has_budget = 1;
        int bad = cli_parse_bytes(v[0], &a->budget);
        if (bad == -2)
            return cli_fail(2, "--memory-budget: '%s' is not a whole number of bytes (1.5K is 1536; 1.3K is refused)",
                            v[0]);
        if (bad)
            return cli_fail(2, "--memory-budget: '%s' is not a size (bytes, or e.g. 24G, 512M, 1.5T; at most 2^63-1)",
                            v[0]);
        return 0;
    case F_PASS:
        if (strcmp(v[0], "both") == 0) a->pass = 0;
        else if (strcmp(v[0], "forward") == 0) a->pass = 1;
        else if (strcmp(v[0], "backward") == 0) a->pass = 2;
        else return cli_fail(2, "--pass: '%s' is not one of forward, backward, both", v[0]);
        return 0;
    case F_BIAS_SCALE:
        a->has_bias_scale = 1;
        return parse_float(f, v[0], &a->bias_scale);
    case F_DIAG_OFFSET:
        a->has_diag_offset = 1;
        if (parse_i64(f, v[0], -(int64_t)INT32_MAX, &a->diag_offset)) return 2;
        if (a->diag_offset > INT32_MAX) /* the library's bound (docs/semantics.md), named by the flag */
            return cli_fail(2, "%s: %lld is above %d", f, (long long)a->diag_offset, INT32_MAX);
        return 0;
    case F_TOP_LEFT: a->has_diag_offset = 1, a->diag_offset = 0; return 0;
    case F_DROPOUT: { /* judged as the value given, as the Python fronts judge dropout_p: -1e-50 is
                       * negative (its float is -0), 0.99999999 below 1 but 1 as a float */
        double p;
        a->has_dropout = 1;
        if (parse_real(f, v[0], &p)) return 2;
        if (!(p >= 0.0 && p < 1.0)) return cli_fail(2, "--dropout: %s is not in [0, 1)", v[0]);
        a->dropout = p == 0.0 ? 0.0f : (float)p; /* -0 is 0 */
        if (a->dropout >= 1.0f)
            return cli_fail(2, "--dropout: %s rounds to 1 in float32, the library's type (at most 0.99999994)", v[0]);
        return 0;
    }
    case F_SEED: {
        char *end = NULL;
        errno = 0;
        /* decimal, or hex after 0x (docs/cli.md): never octal, so 010 is ten; no sign or
         * space (strtoull skips "\t" and negates "-5" to 2^64-5) */
        const int hex = v[0][0] == '0' && (v[0][1] == 'x' || v[0][1] == 'X');
        const unsigned long long x = is_seed(v[0]) ? strtoull(v[0], &end, hex ? 16 : 10) : 0;
        if (!is_seed(v[0]) || *end || errno == ERANGE)
            return cli_fail(2, "--seed: '%s' is not an integer in 0 .. 2^64-1 (decimal, or hex after 0x)", v[0]);
        a->has_seed = 1, a->seed = (uint64_t)x;
        return 0;
    }
    case F_SEQ_PARALLEL:
        if (strcmp(v[0], "ring") == 0) a->seq_parallel = CLI_SP_RING;
        else if (strcmp(v[0], "ulysses") == 0) a->seq_parallel = CLI_SP_ULYSSES;
        else return cli_fail(2, "--seq-parallel: '%s' is not one of ring, ulysses", v[0]);
        return 0;
    default: break;
    }
    return cli_fail(1, "internal error: flag %d", (int)id);
}

/* 1 if the flags give something --diag-offset places in the problem: causal, a window or
 * ALiBi (the library's rule, fa_problem.has_diag_offset). */
static int cli_aligns(const cli_args *a) {
    return a->causal || a->window_left >= 0 || a->window_right >= 0 || a->alibi != NULL;
}

int cli_parse(int cmd, const char *name, int argc, char **argv, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->name = name;
    a->window_left = a->window_right = -1;
    unsigned char seen[F_COUNT_OF_FLAGS] = {0};
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i], *vals[2] = {NULL, NULL}, inline_buf[64];
        const char *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (strcmp(arg, "-h") == 0) {
            a->help = 1;
            continue;
        }
        int id = -1;
        for (int f = 0; f < F_COUNT_OF_FLAGS; f++)
            if (strlen(flags[f].name) == n && strncmp(arg, flags[f].name, n) == 0) id = f;
        if (id < 0 || !(flags[id].cmds & cmd)) {
            snprintf(inline_buf, sizeof inline_buf, "%.*s", (int)(n < 40 ? n : 40), arg);
            if (arg[0] != '-')
                return cli_fail(2, "%s: unexpected argument '%s' (see flashattn %s --help)",
                                name, inline_buf, name);
            if (id >= 0) { /* another command's flag: say whose */
                static const struct { int cmd; const char *name; } all[] = {
                    {CMD_PLAN, "plan"}, {CMD_RUN, "run"}, {CMD_GRAD, "grad"}, {CMD_BENCH, "bench"},
                    {CMD_CALIBRATE, "calibrate"}};
                char whose[64] = "";
                for (size_t c = 0; c < sizeof all / sizeof all[0]; c++)
                    if (flags[id].cmds & all[c].cmd)
                        snprintf(whose + strlen(whose), sizeof whose - strlen(whose), "%s%s", *whose ? ", " : "",
                                 all[c].name);
                return cli_fail(2, "%s: unknown option '%s' (an option of %s; see flashattn %s --help)", name,
                                inline_buf, whose, name);
            }
            return cli_fail(2, "%s: unknown option '%s' (see flashattn %s --help)", name,
                            inline_buf, name);
        }
        if (seen[id]) return cli_fail(2, "%s: %s given twice", name, flags[id].name);
        seen[id] = 1;
        int nv = flags[id].nvals;
        if (eq) {
            if (nv != 1) return cli_fail(2, "%s: %s does not take '=value'", name, flags[id].name);
            vals[0] = (char *)eq + 1;
        } else {
            if (i + nv >= argc)
                return cli_fail(2, "%s: %s needs %d value%s", name, flags[id].name, nv,
                                nv > 1 ? "s" : "");
            for (int k = 0; k < nv; k++) vals[k] = argv[i + 1 + k];
            i += nv;
        }
        int rc = apply(a, (flag_id)id, vals);
        if (rc) return rc;
    }
    if (a->help) return 0;
    if (a->seq && (a->seq_q || a->seq_k))
        return cli_fail(2, "%s: give either --seq or --seq-q and --seq-k, not both", name);
    if (seen[F_DIAG_OFFSET] && seen[F_TOP_LEFT])
        return cli_fail(2, "%s: give either --diag-offset or --top-left, not both", name);
    if (a->has_bias_scale && !a->bias) return cli_fail(2, "%s: --bias-scale needs --bias", name);
    if (a->has_diag_offset && !cli_aligns(a) && !a->mask_chunk && !a->prefix_len)
        return cli_fail(2, "%s: %s places --causal, --window, --alibi, --mask-chunk and --prefix-len, and none is given",
                        name, seen[F_TOP_LEFT] ? "--top-left" : "--diag-offset");
    if (a->has_seed && !a->has_dropout) return cli_fail(2, "%s: --seed needs --dropout", name);
    if (a->dbias && !a->bias) return cli_fail(2, "%s: --dbias needs --bias", name);
    if (a->dsink && !a->sinks) return cli_fail(2, "%s: --dsink needs --sinks", name);
    if (a->zigzag && !a->seq_parallel)
        return cli_fail(2, "%s: --zigzag needs --seq-parallel ring|ulysses", name);
    if (!!a->cu_seqlens_q != !!a->cu_seqlens_k)
        return cli_fail(2, "%s: --cu-seqlens-q and --cu-seqlens-k go together; %s is missing", name,
                        a->cu_seqlens_q ? "--cu-seqlens-k" : "--cu-seqlens-q");
    if (a->cache_seqlens && a->cu_seqlens_q) /* as the library's supports words it (src/backend.c) */
        return cli_fail(2, "%s: --cu-seqlens-q/-k (packed variable-length batches) do not combine with "
                           "--cache-seqlens (kv-cache decoding)", name);
    if (!!a->k_new != !!a->v_new)
        return cli_fail(2, "%s: --k-new and --v-new go together; %s is missing", name,
                        a->k_new ? "--v-new" : "--k-new");
    if (!a->cache_seqlens && (a->k_new || a->block_table || a->update_cache))
        return cli_fail(2, "%s: %s needs --cache-seqlens", name,
                        a->k_new ? "--k-new" : a->block_table ? "--block-table" : "--update-cache");
    if (!!a->k_prefix != !!a->v_prefix)
        return cli_fail(2, "%s: --k-prefix and --v-prefix (a shared prefix) go together; %s is missing", name,
                        a->k_prefix ? "--v-prefix" : "--k-prefix");
    if (a->k_prefix && !a->cache_seqlens)
        return cli_fail(2, "%s: --k-prefix (a shared prefix) needs --cache-seqlens (kv-cache decoding)", name);
    if (a->lengths_per_call && !a->cache_seqlens && !a->cu_seqlens_q)
        return cli_fail(2, "%s: --lengths-per-call needs --cache-seqlens or --cu-seqlens-q/-k (the lengths a call "
                           "passes)", name);
    if (a->update_cache && !a->k_new)
        return cli_fail(2, "%s: --update-cache needs --k-new and --v-new (nothing to append)", name);
    if (cmd == CMD_PLAN && (a->page_size || a->num_pages) && !a->block_table)
        return cli_fail(2, "%s: %s describes the paged cache of --block-table, which is missing", name,
                        a->page_size ? "--page-size" : "--num-pages");
    if (!!a->q_segments != !!a->kv_segments)
        return cli_fail(2, "%s: --q-segments and --kv-segments go together; %s is missing", name,
                        a->q_segments ? "--kv-segments" : "--q-segments");
    return 0;
}

int cli_shape_from_flags(const cli_args *a, fa_problem *p) {
    const char *missing = !a->batch ? "--batch" : !a->heads ? "--heads"
                          : !a->head_dim ? "--head-dim" : NULL;
    if (!missing && !a->seq && !(a->seq_q && a->seq_k))
        missing = (a->seq_q || a->seq_k) ? (a->seq_q ? "--seq-k" : "--seq-q") : "--seq";
    if (missing) return cli_fail(2, "%s: missing %s", a->name, missing);
    if (a->kv_heads && a->heads % a->kv_heads != 0)
        return cli_fail(2, "%s: --heads %lld is not a multiple of --kv-heads %lld", a->name,
                        (long long)a->heads, (long long)a->kv_heads);
    fa_problem_init(p);
    p->batch = a->batch;
    p->heads_q = a->heads;
    p->heads_kv = a->kv_heads ? a->kv_heads : a->heads;
    p->seq_q = a->seq ? a->seq : a->seq_q;
    p->seq_k = a->seq ? a->seq : a->seq_k;
    p->head_dim = a->head_dim;
    p->head_dim_v = a->v_head_dim ? a->v_head_dim : a->head_dim;
    p->dtype = a->has_dtype ? a->dtype : FA_F32;
    return 0;
}

void cli_apply_options(const cli_args *a, fa_problem *p, fa_options *o) {
    p->causal = a->causal;
    if (a->has_cache_dtype) p->has_cache_dtype = 1, p->cache_dtype = a->cache_dtype;
    p->window_left = a->window_left;
    p->window_right = a->window_right;
    if (a->has_softcap) p->softcap = a->softcap;
    if (a->has_scale) {
        p->has_scale = 1;
        p->scale = a->scale;
    }
    if (a->has_bias_scale) p->has_bias_scale = 1, p->bias_scale = a->bias_scale;
    /* the problem's diagonal places causal, windows and ALiBi; the mask flags' masks take it
     * when they are built (cli_mask.c) */
    if (a->has_diag_offset && cli_aligns(a)) p->has_diag_offset = 1, p->diag_offset = a->diag_offset;
    if (a->has_dropout) p->dropout_p = a->dropout, p->dropout_seed = a->seed; /* seed 0 unless given */
    p->bias_grad = a->dbias != NULL;
    memset(o, 0, sizeof *o);
    o->backend = a->backend;
    o->threads = a->threads;
    o->block_q = a->block_q;
    o->block_k = a->block_k;
}

int cli_plan_create(const fa_problem *p, const fa_options *o, fa_plan **plan) {
    fa_status st = fa_plan_create(p, o, plan);
    if (st == FA_OK) return 0;
    /* an FA_ISA, FA_BWD_SCHEDULE or OMP_NUM_THREADS the library refused is the environment's
     * fault, not the problem's */
    const char *m = fa_last_error();
    int env = m && (strncmp(m, "FA_ISA", 6) == 0 || strncmp(m, "FA_BWD_SCHEDULE", 15) == 0 ||
                    strncmp(m, "OpenMP", 6) == 0);
    return cli_fail_status(st, env ? "environment" : st == FA_ERR_INVALID || st == FA_ERR_OVERFLOW ? "invalid problem"
                                                                                                 : "plan");
}
