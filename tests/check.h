/* The C tests' one check header (as llm.c's validate_result): the seeded random inputs and
 * the poison they start from, one CHECK for a condition, and one tolerance rule for
 * comparing an output with the float64 reference (src/ref), its bounds in one table by
 * dtype. Each test is one program and includes this once; `failures` and `seed` are its
 * counters, check_finish() its verdict.
 *
 * The rule, for every element of a [B, H, S, W] tensor:
 *     |got - ref| <= atol * M + rtol * |ref| + allow
 * where M is the largest |ref| of the tensor, 1 if all are 0 (a tensor's rounding errors
 * scale with its largest terms, not with each element: the error analyses of
 * FlashAttention bound max|o - ref| / max|ref|), rtol is relative to the element itself, and allow is an
 * optional per-element allowance a test derives from the data (the backward's rounded
 * terms, an f32 noise floor). A NaN passes only where the reference is NaN (a NaN input a
 * row sees, docs/nonfinite.md), and an infinite reference (lse of a row that sees no key)
 * must be matched exactly. The first few faults print with their [b, h, s, w]
 * indices and values; the rest are counted. */
#ifndef FA_TEST_CHECK_H
#define FA_TEST_CHECK_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Element idx of a tensor of dtype t, as f32, and the store back (round to nearest even):
 * through the public fa_convert, so the tests convert as any caller would. */
static inline float chk_load(fa_dtype t, const void *base, int64_t idx) {
    float x;
    fa_convert(t, (const char *)base + idx * (int64_t)fa_dtype_size(t), FA_F32, &x, 1);
    return x;
}
static inline void chk_store(fa_dtype t, void *base, int64_t idx, float x) {
    fa_convert(FA_F32, &x, t, (char *)base + idx * (int64_t)fa_dtype_size(t), 1);
}

/* Element offset of [b, h, s, d] in a tensor with strides st (elements). */
static inline int64_t chk_offset(const fa_strides *st, int64_t b, int64_t h, int64_t s, int64_t d) {
    return b * st->s[0] + h * st->s[1] + s * st->s[2] + d * st->s[3];
}

/* ---- the program's counters and CHECK ------------------------------------------------ */

static int failures;  /* failed checks so far */
static uint64_t seed; /* this run's seed: FA_TEST_SEED=seed replays it */

#define CHECK_MAX_PRINT 8 /* faults printed per program (per tensor for check_tensor); the rest counted */

/* A failed condition: counted, and among the first few printed with the seed, the place
 * and the message. */
#define CHECK(cond, ...)                                                                               \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            if (++failures <= CHECK_MAX_PRINT) {                                                       \
                printf("FAIL (FA_TEST_SEED=%llu) %s:%d: ", (unsigned long long)seed, __FILE__, __LINE__);  \
                printf(__VA_ARGS__);                                                                   \
                printf("\n");                                                                          \
            }                                                                                          \
        }                                                                                              \
    } while (0)

/* The verdict line and the exit status (0: all passed). */
static inline int check_finish(const char *program) {
    if (failures)
        printf("%s: %d FAILED (%s; FA_TEST_SEED=%llu replays)\n", program, failures,
               failures > CHECK_MAX_PRINT ? "the first printed, the rest counted" : "each printed",
               (unsigned long long)seed);
    else printf("%s: all passed\n", program);
    return failures != 0;
}

/* ---- seeded random inputs, poison ----------------------------------------------------- */

/* splitmix64 */
static inline uint64_t tu_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* A fresh seed per run, or FA_TEST_SEED's (decimal or 0x hex). */
static inline uint64_t tu_seed(void) {
    const char *e = getenv("FA_TEST_SEED");
    if (e && *e) return strtoull(e, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
}
/* Sets the program's seed (tu_seed) and prints it with the ISA in use; returns it, the
 * start of the caller's random stream. */
static inline uint64_t check_seed(const char *program) {
    seed = tu_seed();
    printf("%s: seed %llu (FA_TEST_SEED=%llu reproduces), isa %s\n", program, (unsigned long long)seed,
           (unsigned long long)seed, fa_cpu_isa());
    return seed;
}
/* FA_CHECK_CASES: how many random configurations a long differential run draws (make
 * check-long); 0 (unset) means the program's own fixed sweep. */
static inline int tu_check_cases(void) {
    const char *e = getenv("FA_CHECK_CASES");
    long n = e && *e ? strtol(e, NULL, 10) : 0;
    return n > 0 ? (n > 100000000 ? 100000000 : (int)n) : 0;
}
/* uniform in [-1, 1) */
static inline double tu_uniform(uint64_t *s) {
    return (double)(tu_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}
static inline int64_t tu_int(uint64_t *s, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(tu_next(s) % (uint64_t)(hi - lo + 1));
}
/* A diagonal offset places causal, windows and ALiBi, and the library refuses one that places
 * nothing (fa_problem.has_diag_offset): generators that draw it apart from those drop it where
 * nothing aligns. Call it once the problem's masks and ALiBi are set. */
static inline void tu_keep_aligned_diag(fa_problem *p) {
    if (!(p->causal || p->window_left >= 0 || p->window_right >= 0 || p->has_alibi)) p->has_diag_offset = 0;
}
/* Fills n elements of dtype t with uniform values times amp (rounded to the dtype). */
static inline void tu_fill(uint64_t *s, fa_dtype t, void *x, int64_t n, double amp) {
    for (int64_t i = 0; i < n; i++) chk_store(t, x, i, (float)(tu_uniform(s) * amp));
}
/* NaN everywhere, so elements a kernel forgets to write are caught. */
static inline void tu_poison(fa_dtype t, void *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) chk_store(t, x, i, NAN);
}
static inline void *tu_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes); exit(1); }
    return p;
}

/* ---- the tolerance table ---------------------------------------------------------------- */

typedef struct {
    double atol; /* times M, the tensor's largest |ref| */
    double rtol; /* times |ref| of the element */
} check_tol;

/* Outputs (o, dq, dk, dv) of each dtype, u being its unit roundoff: the tightest bound
 * any test used before they were one table (test_forward's f32, test_backward's f16 and
 * bf16), which passes everywhere on every ISA (avx512bf16, avx512, avx2, scalar, amx):
 * f32  (u = 6e-8): exps good to ~1e-7, f32 sums over <= 300 keys and 256 dims, and the
 *      backward's dS = p (dP - delta) cancelling where the softmax is peaked: 1e-5 (seen:
 *      forward ~2e-6, backward <= 4e-6). The forward's f32 scores carry a few u |s| each,
 *      a relative error of p: a test scales the bound by max(1, max|lse| / 8) where
 *      scores reach |s| ~ |lse| >> 1 (check_tol_scores).
 * f16  (u = 4.9e-4) and bf16 (u = 3.9e-3): p (and dS) rounded to the dtype before their
 *      products and every output once, each within u relative, independent errors: 5 u
 *      (seen: at most 0.25 of the bound, forward and backward, over 800 random forward
 *      and 500 backward configurations per ISA). */
static inline check_tol check_tol_of(fa_dtype t) {
    static const check_tol table[3] = {
        [FA_F32] = {1e-5, 0.0},
        [FA_F16] = {5.0 * 0x1p-11, 0.0},
        [FA_BF16] = {5.0 * 0x1p-8, 0.0},
    };
    return table[t == FA_F16 ? FA_F16 : t == FA_BF16 ? FA_BF16 : FA_F32];
}
/* Gradients checked without the per-element allowance of their terms' rounding (test_varlen;
 * test_backward and test_semantics pass that allowance): dS = p (dP - delta) cancels where
 * the softmax is peaked, leaving an f32 error of ~1e-5 of the tensor's largest |ref| on an
 * element whose reference is ~0 (seen: 1.1e-5, dk of a packed f32 batch). f32: 1e-4, the
 * bound test_varlen held before the table; f16, bf16: the table's. */
static inline check_tol check_tol_grad(fa_dtype t) {
    const check_tol f32 = {1e-4, 0.0};
    return t == FA_F32 ? f32 : check_tol_of(t);
}
/* lse, f32 for every dtype: computed from f32 scores (products of f16/bf16 inputs are exact
 * in f32) and the f32 row sum of unrounded p: 1e-5 (1 + |lse|), judged per row (M = 1). */
static const check_tol CHECK_TOL_LSE = {1e-5, 1e-5};
/* CUDA's bounds (test_cuda): its exps are ex2.approx (~2 ulp) and its sums run in another
 * order; these are the bounds test_cuda held it to before the table (f16 1e-2, bf16 4e-2,
 * lse 1e-4 (1 + |lse|)), kept until a device run can show tighter ones pass. */
static inline check_tol check_tol_cuda(fa_dtype t) {
    const check_tol f16 = {1e-2, 0.0}, bf16 = {4e-2, 0.0};
    return t == FA_F16 ? f16 : bf16;
}
static const check_tol CHECK_TOL_CUDA_LSE = {1e-4, 1e-4};
/* The unit roundoff of a dtype. */
static inline double check_unit(fa_dtype t) { return t == FA_BF16 ? 0x1p-8 : t == FA_F16 ? 0x1p-11 : 0x1p-24; }
/* The forward's f32 bound grown with the scores that matter (see the table). */
static inline check_tol check_tol_scores(fa_dtype t, double max_lse) {
    check_tol c = check_tol_of(t);
    if (t == FA_F32 && max_lse > 8.0) c.atol *= max_lse / 8.0;
    return c;
}

/* ---- comparing a tensor with the reference -------------------------------------------- */

typedef struct {
    int64_t faults;  /* elements outside the bound (NaN included) */
    double err, mag; /* max|got - ref| (infinite on NaN), M = max|ref| over finite refs */
    double ratio;    /* max over elements of (|got - ref| - allow) / (atol M + rtol |ref|) */
} check_result;

/* Compares got, a [B, H, S, W] tensor of dtype t laid out by st (all-zero: contiguous),
 * with ref (contiguous doubles) under the rule above; allow: per element (contiguous like
 * ref), or NULL. unit_scale: M = 1 instead of max|ref| (lse: per-row relative). Prints the
 * first faults as "FAIL name[b, h, s, w]: got .. want .. (bound ..)" with the seed, counts
 * the rest, and adds 1 to failures if any. */
static inline check_result check_tensor(const char *name, fa_dtype t, const void *got, const fa_strides *st,
                                        const double *ref, const int64_t dims[4], check_tol tol,
                                        const double *allow, int unit_scale) {
    const int64_t B = dims[0], H = dims[1], S = dims[2], W = dims[3], n = B * H * S * W;
    fa_strides s = *st;
    if (!s.s[0] && !s.s[1] && !s.s[2] && !s.s[3]) s.s[3] = 1, s.s[2] = W, s.s[1] = S * W, s.s[0] = H * S * W;
    check_result r = {0, 0.0, 0.0, 0.0};
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > r.mag) r.mag = fabs(ref[i]);
    const double M = unit_scale || r.mag == 0.0 ? 1.0 : r.mag; /* (an all-zero reference: absolute) */
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = i / (H * S * W), h = i / (S * W) % H, q = i / W % S, w = i % W;
        const double g = chk_load(t, got, b * s.s[0] + h * s.s[1] + q * s.s[2] + w * s.s[3]), want = ref[i];
        const double bound = tol.atol * M + tol.rtol * fabs(want), e = fabs(g - want);
        int bad;
        if (isnan(want)) bad = !isnan(g);
        else if (isinf(want) || isinf(g)) bad = g != want;
        else {
            bad = !(e - (allow ? allow[i] : 0.0) <= bound);
            if (!(e <= r.err)) r.err = isnan(g) ? INFINITY : e;
            const double x = (e - (allow ? allow[i] : 0.0)) / (bound > 0 ? bound : 1e-300);
            if (!(x <= r.ratio)) r.ratio = isnan(g) ? INFINITY : x;
        }
        if (!bad) continue;
        if (++r.faults <= CHECK_MAX_PRINT / 2)
            printf("FAIL (FA_TEST_SEED=%llu) %s[%lld, %lld, %lld, %lld]: got %.9g want %.9g (bound %.3g%s)\n",
                   (unsigned long long)seed, name, (long long)b, (long long)h, (long long)q, (long long)w, g, want,
                   bound + (allow ? allow[i] : 0.0), allow ? " with its allowance" : "");
    }
    if (r.faults > CHECK_MAX_PRINT / 2)
        printf("FAIL %s: %lld more elements outside the bound\n", name, (long long)(r.faults - CHECK_MAX_PRINT / 2));
    if (r.faults) failures++;
    return r;
}

/* An allowance of v for each of n elements (check_tensor's allow); the caller frees it. */
static inline double *check_allow_const(int64_t n, double v) {
    double *a = tu_alloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) a[i] = v;
    return a;
}

/* Elements of a buffer of n elements outside the [B, H, S, W] view st that are no longer
 * the NaN they were poisoned with (a kernel writing past its view); printed and counted
 * as a failure if any. */
static inline int64_t check_outside(const char *name, fa_dtype t, const void *buf, int64_t n, const fa_strides *st,
                                    const int64_t dims[4]) {
    fa_strides s = *st;
    if (!s.s[0] && !s.s[1] && !s.s[2] && !s.s[3]) s.s[3] = 1, s.s[2] = dims[3], s.s[1] = dims[2] * dims[3], s.s[0] = dims[1] * dims[2] * dims[3];
    char *inside = calloc((size_t)n + 1, 1);
    for (int64_t b = 0; b < dims[0]; b++)
        for (int64_t h = 0; h < dims[1]; h++)
            for (int64_t q = 0; q < dims[2]; q++)
                for (int64_t w = 0; w < dims[3]; w++) inside[b * s.s[0] + h * s.s[1] + q * s.s[2] + w * s.s[3]] = 1;
    int64_t touched = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!inside[i] && !isnan(chk_load(t, buf, i)) && touched++ == 0) first = i;
    free(inside);
    if (touched) {
        printf("FAIL (FA_TEST_SEED=%llu) %s: %lld elements outside the view were written (the first at %lld)\n",
               (unsigned long long)seed, name, (long long)touched, (long long)first);
        failures++;
    }
    return touched;
}

/* A CPU plan; NULL (and a failure counted) if it is refused. bq, bk: 0 = the default. */
static inline fa_plan *check_plan(const fa_problem *p, int threads, int64_t bq, int64_t bk) {
    fa_options o = {0};
    o.backend = FA_BACKEND_CPU;
    o.threads = threads;
    o.block_q = bq;
    o.block_k = bk;
    fa_plan *pl = NULL;
    const fa_status st = fa_plan_create(p, &o, &pl);
    CHECK(st == FA_OK, "fa_plan_create: %s: %s", fa_status_string(st), fa_last_error());
    return pl;
}

/* ---- the workspace a call actually uses ---------------------------------------------- */

typedef fa_status (*check_ws_call)(void *ctx, void *workspace, size_t size);

typedef struct {
    fa_status status;    /* of the call in exactly `bytes` (the last of its runs) */
    int64_t written;     /* 1 + the last byte offset a run changed: the high-water mark */
    int guard_hit;       /* a byte past the end changed */
    fa_status one_short; /* the call given bytes - 1 (FA_OK when bytes is 0) */
} check_ws;

#define CHECK_WS_GUARD 4096

/* Measures the workspace a call uses instead of trusting a formula: runs call in a buffer
 * of exactly `bytes` followed by a guard of CHECK_WS_GUARD bytes, twice, the buffer and
 * guard filled with 0x5a and then 0xa5 (a byte the call writes equal to one fill is
 * still seen by the other run), and reports the highest byte either run changed, whether
 * the guard changed, and the call's answer when given one byte less. The workspace
 * starts misaligned by `skew` bytes (the drivers must align within their slack). */
static inline check_ws check_workspace(check_ws_call call, void *ctx, size_t bytes, size_t skew) {
    check_ws r = {FA_OK, 0, 0, FA_OK};
    unsigned char *buf = tu_alloc(bytes + CHECK_WS_GUARD + skew + 64);
    unsigned char *ws = buf + (64 - (uintptr_t)buf % 64) % 64 + skew;
    static const unsigned char fill[2] = {0x5a, 0xa5};
    for (int k = 0; k < 2; k++) {
        memset(ws, fill[k], bytes + CHECK_WS_GUARD);
        r.status = call(ctx, ws, bytes);
        for (size_t i = bytes + CHECK_WS_GUARD; i > 0; i--)
            if (ws[i - 1] != fill[k]) {
                if ((int64_t)i > r.written) r.written = (int64_t)i;
                break;
            }
        for (size_t i = bytes; i < bytes + CHECK_WS_GUARD; i++) r.guard_hit |= ws[i] != fill[k];
    }
    if (bytes > 0) r.one_short = call(ctx, ws, bytes - 1);
    free(buf);
    return r;
}

typedef struct {
    const fa_plan *plan;
    const fa_forward_args *fwd; /* one of the two */
    const fa_backward_args *bwd;
} check_ws_pass;

static inline fa_status check_ws_run(void *ctx, void *workspace, size_t size) {
    const check_ws_pass *c = ctx;
    if (c->fwd) {
        fa_forward_args a = *c->fwd;
        a.workspace = workspace, a.workspace_size = size, a.counts = NULL, a.progress = NULL;
        return fa_forward(c->plan, &a);
    }
    fa_backward_args a = *c->bwd;
    a.workspace = workspace, a.workspace_size = size, a.counts = NULL, a.progress = NULL;
    return fa_backward(c->plan, &a);
}

/* The plan's workspace_bytes for a pass against what the call (args: its inputs and
 * outputs, workspace ignored) uses, measured (check_workspace; docs/semantics.md,
 * workspace_bytes): in exactly that many bytes it runs and writes nothing past them, one
 * byte less is refused with FA_ERR_INVALID naming workspace_size. The forward's workspace
 * starts a byte off alignment (its driver aligns within its slack); the backward's is
 * 64-byte aligned: its delta array sits at the very start, with no slack to align it
 * (UBSan: misaligned float stores in src/cpu/backward.c when it is not). Returns the
 * high-water mark of the bytes written (-1 if a check failed). */
static inline int64_t check_pass_workspace(const char *label, const fa_plan *pl, const fa_forward_args *fwd,
                                           const fa_backward_args *bwd) {
    fa_cost cost;
    fa_plan_cost(pl, fwd ? FA_FORWARD : FA_BACKWARD, &cost);
    const check_ws_pass c = {pl, fwd, bwd};
    const int before = failures;
    const check_ws r = check_workspace(check_ws_run, (void *)&c, (size_t)cost.workspace_bytes, fwd ? 1 : 0);
    CHECK(r.status == FA_OK, "%s: in a workspace of exactly workspace_bytes = %lld: %s", label,
          (long long)cost.workspace_bytes, fa_last_error());
    CHECK(!r.guard_hit && r.written <= cost.workspace_bytes,
          "%s: wrote %lld bytes of a workspace of workspace_bytes = %lld%s", label, (long long)r.written,
          (long long)cost.workspace_bytes, r.guard_hit ? " (past its end)" : "");
    CHECK(cost.workspace_bytes == 0 || (r.one_short == FA_ERR_INVALID && strstr(fa_last_error(), "workspace_size")),
          "%s: a workspace one byte short of %lld gave %s (%s)", label, (long long)cost.workspace_bytes,
          fa_status_string(r.one_short), fa_last_error());
    return failures > before ? -1 : r.written;
}

#endif
