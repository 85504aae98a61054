/* measure.h: the clock, the median and the input stream of the timing programs. */
#include "measure.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double measure_now(void) { return seconds(CLOCK_MONOTONIC); }

double measure_cpu_now(void) { return seconds(CLOCK_PROCESS_CPUTIME_ID); }

static int by_value(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double measure_median(double *t, int n) {
    if (n <= 0) return 0;
    qsort(t, (size_t)n, sizeof *t, by_value);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

void measure_fill(uint64_t *state, fa_dtype t, void *x, int64_t n) {
    enum { CHUNK = 1024 }; /* converted a chunk at a time: no buffer of n floats */
    float f[CHUNK];
    const size_t es = fa_dtype_size(t);
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (int64_t i = 0; i < m; i++) {
            uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            f[i] = (float)((double)(z >> 11) * 0x1p-52 - 1.0);
        }
        fa_convert(FA_F32, f, t, (char *)x + (size_t)i0 * es, (size_t)m);
    }
}

static int parse_dtype(const char *v, fa_dtype *dt) {
    static const fa_dtype all[3] = {FA_F32, FA_F16, FA_BF16};
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, fa_dtype_name(all[i]))) return *dt = all[i], 0;
    return 1;
}

int measure_parse(const char *prog, int argc, char **argv, const measure_opt *opts, fa_dtype *dtype) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const measure_opt *o = opts;
        while (o->name && strcmp(o->name, a)) o++;
        if (o->name && o->on) {
            *o->on = 1;
            continue;
        }
        if (!o->name && !(dtype && !strcmp(a, "--dtype"))) {
            fprintf(stderr, "%s: unknown argument %s\n", prog, a);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return 2;
        }
        i++;
        if (!o->name) {
            if (parse_dtype(v, dtype)) {
                fprintf(stderr, "%s: --dtype %s: not f32, f16 or bf16\n", prog, v);
                return 2;
            }
            continue;
        }
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno) {
            fprintf(stderr, "%s: %s '%s' is not an integer\n", prog, a, v);
            return 2;
        }
        *o->value = x;
    }
    return 0;
}
