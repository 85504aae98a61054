/* Tests an internal on purpose: the fp8 decode step in f16 arithmetic (cpu/decode_cache_fp16.c)
 * against the f32 step it replaces (cpu/decode_cache_avx512.c's fa_decode_cache_step_f32_avx512),
 * tile by tile, on random tiles of every head dim it takes (multiples of 32 up to 256), 1 to
 * 128 keys, 1 to 13 query rows, codes of every kind (subnormals, zeros, -0, the largest)
 * and q, key and value scales from 1e-30 to 1e30:
 *   lse within docs/caches.md's bound on a score's f16 error (plus the f32 step's own 1e-5),
 *   o within what that bound moves the weights by, plus p V's 2^-6.8 of the largest |v|;
 * and the tiles it must leave to the f32 step, with the state untouched: a NaN code in a key
 * or a value row, a non-finite q element, head dims it does not take, a problem that is not
 * bf16, a value scale of 2^118 or more (2^126 with fp8's 2^8); and that the AVX-512 tables'
 * step (fa_decode_cache_step_avx512) gives the f16 step's bits where it runs and the f32
 * step's where it declines. Exits 77 (skipped) where the CPU lacks AVX512_FP16 and GFNI (the
 * step declines every tile there) or AVX-512 (no AVX-512 table to call). */
#include "cpu/decode_kernels.h"
#include "check.h"
#include "quant_ref.h"

static uint64_t rng;
static double worst_share; /* the largest error's share of its bound, over every comparison */

#define MAXM 13
#define MAXD 256
#define MAXN FA_DECODE_MAX_TILE

static double e4m3(uint8_t c) { return ind_value(FA_FP8_E4M3, c); } /* the code's value (not NaN) */

typedef struct {
    int m, d, dv, n;
    float q[MAXM * MAXD], ks[MAXN], vs[MAXN];
    uint8_t k[MAXN * MAXD], v[MAXN * MAXD];
} tile_case;

/* A code: mostly any (never NaN), some of the rarer kinds. */
static uint8_t draw_code(int small) {
    const int64_t kind = tu_int(&rng, 0, 15);
    uint8_t c;
    if (small || kind == 0) c = (uint8_t)tu_int(&rng, 0, 15); /* zero, subnormals, smallest normals */
    else if (kind == 1) c = 0x7e;                             /* 448 */
    else c = (uint8_t)tu_int(&rng, 0, 0x7e);
    return (uint8_t)(c | (tu_int(&rng, 0, 1) ? 0x80 : 0));
}

static void make(tile_case *t, int m, int d, int dv, int n, double qmag, double kmag, double vmag) {
    t->m = m, t->d = d, t->dv = dv, t->n = n;
    for (int i = 0; i < m * d; i++) { /* q as a bf16 problem has it: bf16 values */
        uint16_t h;
        chk_store(FA_BF16, &h, 0, (float)(tu_uniform(&rng) * qmag));
        t->q[i] = chk_load(FA_BF16, &h, 0);
    }
    for (int j = 0; j < n; j++) {
        const int small = tu_int(&rng, 0, 7) == 0;
        for (int c = 0; c < d; c++) t->k[j * d + c] = draw_code(small);
        for (int c = 0; c < dv; c++) t->v[j * dv + c] = draw_code(small);
        t->ks[j] = (float)(kmag * (0.5 + tu_uniform(&rng) * 0.25 + 0.25));
        t->vs[j] = (float)(vmag * (0.5 + tu_uniform(&rng) * 0.25 + 0.25));
        if (tu_int(&rng, 0, 31) == 0) t->ks[j] = 0.0f; /* amax 0 would give 1; 0 is a valid scale too */
    }
}

static fa_decode_cache_tile view(const tile_case *t) {
    fa_decode_cache_tile x;
    memset(&x, 0, sizeof x);
    x.q = t->q, x.k = t->k, x.v = t->v, x.t = FA_FP8_E4M3;
    x.kstride = t->d, x.vstride = t->dv, x.kcol = x.vcol = 1;
    x.kscale = t->ks, x.vscale = t->vs, x.sstride = 1;
    x.m = t->m, x.d = t->d, x.n = t->n, x.dv = t->dv;
    return x;
}

typedef struct {
    float mx[MAXM], sum[MAXM], acc[MAXM * MAXD];
} state;

static void fresh(state *s, int m, int dv) {
    for (int r = 0; r < m; r++) s->mx[r] = -INFINITY, s->sum[r] = 0.0f;
    memset(s->acc, 0, sizeof(float) * (size_t)(m * dv));
}

/* The bound on row r's score error for key j (docs/caches.md, "The error"), in scaled units. */
static double score_bound(const tile_case *t, int r, int j, double scale) {
    double s = 0, qmax = 0;
    for (int c = 0; c < t->d; c++) {
        s += fabs(t->q[r * t->d + c] * e4m3(t->k[j * t->d + c]) * t->ks[j]);
        qmax = fmax(qmax, fabs(t->q[r * t->d + c]));
    }
    return scale * (((double)t->d / 32 + 6) * ldexp(s, -11) + (2.0 * t->d + 32) * ldexp(qmax * t->ks[j], -21));
}

/* One tile (or two, the second from the first's state) through both steps; checks the
 * outputs against the bounds. */
static void compare(const char *what, const tile_case *a, const tile_case *b) {
    const int m = a->m, dv = a->dv;
    const float scale = (float)(1.0 / sqrt((double)a->d));
    state f32, f16;
    fresh(&f32, m, dv), fresh(&f16, m, dv);
    const tile_case *tiles[2] = {a, b};
    int ran = 1;
    for (int x = 0; x < (b ? 2 : 1); x++) {
        const fa_decode_cache_tile v = view(tiles[x]);
        fa_decode_cache_step_f32_avx512(&v, scale, FA_BF16, f32.mx, f32.sum, f32.acc, dv);
        ran &= fa_decode_cache_step_fp16(&v, scale, FA_BF16, f16.mx, f16.sum, f16.acc, dv);
    }
    CHECK(ran, "%s: the f16 step declined a tile it takes", what);
    double worst = 0; /* the largest error's share of its bound */
    for (int r = 0; r < m; r++) {
        double bs = 0, vmax[MAXD] = {0};
        for (int x = 0; x < (b ? 2 : 1); x++)
            for (int j = 0; j < tiles[x]->n; j++) {
                bs = fmax(bs, score_bound(tiles[x], r, j, scale));
                for (int c = 0; c < dv; c++)
                    vmax[c] = fmax(vmax[c], fabs(e4m3(tiles[x]->v[j * dv + c]) * tiles[x]->vs[j]));
            }
        const double l32 = f32.mx[r] + log(f32.sum[r]), l16 = f16.mx[r] + log(f16.sum[r]);
        const double lt = bs + 1e-5 * (1 + fabs(l32));
        worst = fmax(worst, fabs(l16 - l32) / lt);
        CHECK(fabs(l16 - l32) <= lt, "%s: row %d lse %.9g, the f32 step's %.9g (bound %.3g)", what, r, l16, l32, lt);
        for (int c = 0; c < dv; c++) {
            const double o32 = f32.acc[r * dv + c] / f32.sum[r], o16 = f16.acc[r * dv + c] / f16.sum[r];
            /* a column of zeros has no error whatever the scores' bound (inf times 0 is not one) */
            const double ot = (vmax[c] > 0 ? (expm1(2 * bs) + pow(2.0, -6.8) + 1e-5) * vmax[c] : 0.0) + 1e-30;
            worst = fmax(worst, fabs(o16 - o32) / ot);
            if (!(fabs(o16 - o32) <= ot)) {
                CHECK(0, "%s: row %d column %d o %.9g, the f32 step's %.9g (bound %.3g)", what, r, c, o16, o32, ot);
                return;
            }
        }
    }
    worst_share = fmax(worst_share, worst);
}

/* A state as an earlier tile leaves it. */
static void earlier(state *s, int m, int dv) {
    memset(s, 0, sizeof *s); /* compared whole, unused rows too */
    fresh(s, m, dv);
    for (int r = 0; r < m; r++) s->mx[r] = (float)r, s->sum[r] = 1.5f;
    for (int i = 0; i < m * dv; i++) s->acc[i] = (float)(i % 7) - 3.0f;
}

/* The tables' step on tile t gives the bits of the step it should take: the f16 one (f16 1)
 * or the f32 one. */
static void routed(const char *what, const tile_case *t, fa_dtype pd, int f16) {
    state table, want;
    earlier(&table, t->m, t->dv), earlier(&want, t->m, t->dv);
    const fa_decode_cache_tile v = view(t);
    fa_decode_cache_step_avx512(&v, 0.1f, pd, table.mx, table.sum, table.acc, t->dv);
    if (f16) fa_decode_cache_step_fp16(&v, 0.1f, pd, want.mx, want.sum, want.acc, t->dv);
    else fa_decode_cache_step_f32_avx512(&v, 0.1f, pd, want.mx, want.sum, want.acc, t->dv);
    CHECK(!memcmp(&table, &want, sizeof table), "%s: the tables' step does not give the %s step's bits", what,
          f16 ? "f16" : "f32");
}

/* A tile the f16 step must leave alone: it returns 0 and changes nothing, and the tables'
 * step gives the f32 step's bits for it. */
static void declined(const char *what, const tile_case *t, fa_dtype pd) {
    state s;
    earlier(&s, t->m, t->dv);
    state before = s;
    const fa_decode_cache_tile v = view(t);
    const int ran = fa_decode_cache_step_fp16(&v, 0.1f, pd, s.mx, s.sum, s.acc, t->dv);
    CHECK(!ran && !memcmp(&s, &before, sizeof s), "%s: ran %d, state unchanged %d", what, ran, !memcmp(&s, &before, sizeof s));
    routed(what, t, pd, 0);
}

int main(void) {
    rng = check_seed("test_decode_fp16");
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        printf("test_decode_fp16: skipped (this CPU lacks AVX-512: no table calls the step)\n");
        return 77;
    }
    static tile_case a, b;
    make(&a, 4, 128, 128, 128, 2.0, 0.01, 0.01);
    {
        state s;
        fresh(&s, a.m, a.dv);
        const fa_decode_cache_tile v = view(&a);
        if (!fa_decode_cache_step_fp16(&v, 0.1f, FA_BF16, s.mx, s.sum, s.acc, a.dv)) {
            printf("test_decode_fp16: skipped (this CPU lacks AVX512_FP16 or GFNI)\n");
            return 77;
        }
    }
    static const double mags[][3] = {{2, 0.01, 0.01}, {1e-30, 1e-3, 1e3}, {1e30, 1e-28, 1e-20}, {3, 1e20, 1e-30},
                                     {0.01, 1, 1}, {50, 0.002, 0.002}};
    int cases = 0;
    for (int d = 32; d <= MAXD; d += 32)
        for (int k = 0; k < 3; k++, cases++) {
            const double *g = mags[tu_int(&rng, 0, 5)];
            const int m = (int)tu_int(&rng, 1, MAXM), n = (int)tu_int(&rng, 1, MAXN), dv = 32 * (int)tu_int(&rng, 1, 8);
            make(&a, m, d, dv, n, g[0], g[1], g[2]);
            char what[120];
            snprintf(what, sizeof what, "d=%d dv=%d m=%d n=%d |q| %g kscale %g vscale %g", d, dv, m, n, g[0], g[1], g[2]);
            compare(what, &a, NULL);
            routed(what, &a, FA_BF16, 1);
            if (k == 0) { /* a second tile from the first's state */
                make(&b, m, d, dv, (int)tu_int(&rng, 1, MAXN), g[0] * 3, g[1], g[2] * 0.25);
                snprintf(what, sizeof what, "two tiles, d=%d dv=%d m=%d", d, dv, m);
                compare(what, &a, &b);
            }
        }
    /* tiles left to the f32 step, untouched */
    make(&a, 5, 128, 96, 70, 2.0, 0.01, 0.01);
    declined("a problem that is not bf16", &a, FA_F16);
    a.k[33 * 128 + 7] = 0xff;
    declined("a NaN key code", &a, FA_BF16);
    a.k[33 * 128 + 7] = 0x01, a.v[69 * 96 + 95] = 0x7f;
    declined("a NaN value code (found in p V: the state put back)", &a, FA_BF16);
    a.v[69 * 96 + 95] = 0x00, a.q[3 * 128 + 5] = INFINITY;
    declined("an inf q element", &a, FA_BF16);
    a.q[3 * 128 + 5] = NAN;
    declined("a NaN q element", &a, FA_BF16);
    a.q[3 * 128 + 5] = 1.0f, a.vs[12] = 5e35f; /* times fp8's 2^8: 1.28e38, finite, past 2^126 */
    declined("a value scale of 2^118 (its weights' power of two is no f32)", &a, FA_BF16);
    make(&a, 4, 80, 64, 20, 2.0, 0.01, 0.01);
    declined("head dim 80 (not a multiple of 32)", &a, FA_BF16);
    make(&a, 4, 64, 48, 20, 2.0, 0.01, 0.01);
    declined("value head dim 48", &a, FA_BF16);
    const int failed = check_finish("test_decode_fp16");
    if (!failed)
        printf("test_decode_fp16: %d tile comparisons within the bounds (the largest error %.3f of its bound), 8 declined "
               "tiles untouched\n",
               cases + 8, worst_share);
    return failed;
}
