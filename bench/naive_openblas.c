/* naive_openblas: the naive attention peer, in f32, on Debian's OpenBLAS.
 *
 * For every (b, h): S = scale Q K^T (sgemm), a row softmax (AVX-512, OpenMP over rows;
 * causal rows stop at the diagonal, the rest of the row is zeroed), O = P V (sgemm). The
 * score matrix is one Sq x Sk buffer reused across heads, so memory is O(S^2), not the
 * O(B H S^2) of a batched naive implementation. Causal still computes the full products,
 * as a naive implementation does.
 *
 *   naive_openblas B H S D [--causal] [--reps N] [--json]
 *
 * GFLOP/s counts 2 (D + Dv) x the visible (i, j) pairs (flops_useful of the plan): 4 B H S^2 D
 * non-causal, 2 B H S (S + 1) D causal. Run it with OPENBLAS_NUM_THREADS and
 * OMP_NUM_THREADS set to the thread count (bench/run.sh does, with
 * OPENBLAS_CORETYPE=SKYLAKEX so OpenBLAS uses its AVX-512 kernels on any AVX-512 CPU).
 *
 * Before it is timed, the warm-up's output is checked against float64 (CHECK_ROWS query rows
 * of every (b, h), error over max |reference| within CHECK_TOL); a wrong output prints WRONG
 * (JSON: "wrong") and exits 1 untimed. Inputs: a fixed LCG (seed 0x9e3779b97f4a7c15),
 * uniform in [-1, 1). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* The CBLAS entry point, declared here so no header path is needed (enums are ints). */
enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* exp on 16 floats: 2^n * p(r), x = n ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial
 * (relative error about 2e-7); below -104 the result is 0, exp(-inf) included. */
__attribute__((target("avx512f"))) static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Row softmax of s[0..n) in place; keys at and after `len` are zeroed (causal). */
__attribute__((target("avx512f"))) static void softmax_row(float *s, int64_t n, int64_t len) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
    __mmask16 tail = (__mmask16)((1u << (len - j)) - 1);
    m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, s + j));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j + 16 <= len; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mx));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
        __m512 e = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), mx)));
        _mm512_mask_storeu_ps(s + j, tail, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (j = 0; j + 16 <= len; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
    if (tail) _mm512_mask_storeu_ps(s + j, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + j), inv));
    if (len < n) memset(s + len, 0, (size_t)(n - len) * sizeof(float));
}

static void attention(int64_t B, int64_t H, int64_t S, int64_t D, int causal, const float *q,
                      const float *k, const float *v, float *o, float *sbuf) {
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t bh = 0; bh < B * H; bh++) {
        const float *qh = q + bh * S * D, *kh = k + bh * S * D, *vh = v + bh * S * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)S, (int)D, scale, qh,
                    (int)D, kh, (int)D, 0.0f, sbuf, (int)S);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < S; i++) softmax_row(sbuf + i * S, S, causal ? i + 1 : S);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)S, 1.0f, sbuf,
                    (int)S, vh, (int)D, 0.0f, o + bh * S * D, (int)D);
    }
}

enum { CHECK_ROWS = 16 };
#define CHECK_TOL 1e-4

/* max |o - ref| / max |ref| over CHECK_ROWS rows of every (b, h), ref in float64. */
static double check_rows(int64_t B, int64_t H, int64_t S, int64_t D, int causal, const float *q,
                         const float *k, const float *v, const float *o) {
    double *p = malloc((size_t)S * sizeof(double)), err = 0, big = 0;
    if (!p) return INFINITY;
    const int64_t nrows = S < CHECK_ROWS ? S : CHECK_ROWS;
    for (int64_t bh = 0; bh < B * H; bh++) {
        const float *qh = q + bh * S * D, *kh = k + bh * S * D, *vh = v + bh * S * D;
        for (int64_t r = 0; r < nrows; r++) {
            const int64_t i = nrows > 1 ? r * (S - 1) / (nrows - 1) : 0, len = causal ? i + 1 : S;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; j++) {
                double d = 0;
                for (int64_t c = 0; c < D; c++) d += (double)qh[i * D + c] * (double)kh[j * D + c];
                p[j] = d / sqrt((double)D);
                if (p[j] > mx) mx = p[j];
            }
            for (int64_t j = 0; j < len; j++) sum += p[j] = exp(p[j] - mx);
            for (int64_t c = 0; c < D; c++) {
                double ref = 0;
                for (int64_t j = 0; j < len; j++) ref += p[j] * (double)vh[j * D + c];
                ref /= sum;
                const double e = fabs((double)o[bh * S * D + i * D + c] - ref);
                err = (e > err || e != e) ? e : err; /* a NaN stays */
                big = fabs(ref) > big ? fabs(ref) : big;
            }
        }
    }
    free(p);
    return err / (big > 0 ? big : 1e-300);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: naive_openblas B H S D [--causal] [--reps N] [--json]\n");
        return 2;
    }
    int64_t B = atoll(argv[1]), H = atoll(argv[2]), S = atoll(argv[3]), D = atoll(argv[4]);
    int causal = 0, reps = 3, json = 0;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--causal")) causal = 1;
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else { fprintf(stderr, "naive_openblas: unknown argument %s\n", argv[i]); return 2; }
    }
    if (B < 1 || H < 1 || S < 1 || D < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "naive_openblas: bad sizes\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512f")) {
        fprintf(stderr, "naive_openblas: needs AVX-512\n");
        return 1;
    }
    size_t n = (size_t)(B * H * S * D);
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float));
    float *v = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    float *sbuf = malloc((size_t)(S * S) * sizeof(float));
    if (!q || !k || !v || !o || !sbuf) { fprintf(stderr, "naive_openblas: out of memory\n"); return 1; }
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        float x[3];
        for (int t = 0; t < 3; t++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[t] = (float)((double)(st >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
        }
        q[i] = x[0]; k[i] = x[1]; v[i] = x[2];
    }
    memset(sbuf, 0, (size_t)(S * S) * sizeof(float));

    double pairs = causal ? (double)S * (double)(S + 1) / 2 : (double)S * (double)S;
    double flops = 2.0 * (double)(2 * D) * pairs * (double)(B * H);
    attention(B, H, S, D, causal, q, k, v, o, sbuf); /* warm-up */
    const double rel = check_rows(B, H, S, D, causal, q, k, v, o);
    if (!(rel <= CHECK_TOL)) {
        if (json)
            printf("{\"wrong\": \"WRONG vs float64: error / max abs ref %.2e (tol %g); not timed\", "
                   "\"check_rel_err\": %.3g, \"check_tol\": %g}\n", rel, CHECK_TOL, rel, CHECK_TOL);
        fprintf(stderr, "naive_openblas: WRONG vs float64: error / max abs ref %.2e (tol %g); not timed\n",
                rel, CHECK_TOL);
        return 1;
    }
    double *t = malloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        attention(B, H, S, D, causal, q, k, v, o, sbuf);
        t[r] = now() - t0;
        fprintf(stderr, "naive_openblas rep %d: %.4f s\n", r, t[r]);
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    double check = 0;
    for (size_t i = 0; i < n; i += 997) check += o[i];
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double best = t[0], med = t[reps / 2];
    if (json)
        printf("{\"seconds\": %.6f, \"median_seconds\": %.6f, \"max_seconds\": %.6f, \"gflops\": %.2f, "
               "\"flops_counted\": %.0f, \"peak_rss_mb\": %.1f, \"openblas_core\": \"%s\", "
               "\"openblas_threads\": %d, \"checksum\": %.6g, \"check_rel_err\": %.3g, \"check_tol\": %g}\n",
               best, med, t[reps - 1], flops / best * 1e-9, flops, (double)ru.ru_maxrss / 1024.0,
               openblas_get_corename(), openblas_get_num_threads(), check, rel, CHECK_TOL);
    else
        printf("naive OpenBLAS (%s, %d threads) B=%lld H=%lld S=%lld D=%lld%s: %.4f s (median %.4f), "
               "%.1f GFLOP/s\n",
               openblas_get_corename(), openblas_get_num_threads(), (long long)B, (long long)H,
               (long long)S, (long long)D, causal ? " causal" : "", best, med, flops / best * 1e-9);
    free(t); free(q); free(k); free(v); free(o); free(sbuf);
    return 0;
}
