/* Tests an internal on purpose: the amx table's bf16 decode step in the tile unit
 * (cpu/decode_bf16_amx.c) on random tiles of every shape it takes (head and value dims 32 to
 * 128, 1 to 8 query rows (4 at a time), 1 to 128 keys, rows of a wider cache: strides past the dims), one
 * tile or two in a row (the second folded into the first's state), against a float64
 * reference of the step with p unrounded:
 *   lse within 1e-5 (1 + |lse|) plus the scores' f32 sums' error,
 *   o within bf16's rounding of p (2^-8 of the column's largest |v|) plus 1e-5 of it,
 * and against the AVX512_BF16 step it replaces (the same bounds); the tiles it must leave to
 * that step give its bits exactly: a value row holding inf or NaN (0 * inf would reach the
 * column beside it), head dims not multiples of 32, value dims past 128. Exits 77 (skipped)
 * where the amx table is not in use. */
#include "cpu/decode_kernels.h"
#include "check.h"

static uint64_t rng;

#define MAXM 8
#define MAXD 160
#define MAXN FA_DECODE_MAX_TILE
#define WIDE 2 /* cache rows hold WIDE heads: strides past the dims */

typedef struct {
    int m, d, dv, n;
    uint16_t q[MAXM * MAXD], k[MAXN * WIDE * MAXD], v[MAXN * WIDE * MAXD];
} tile_case;

typedef struct {
    float mx[MAXM], sum[MAXM], acc[MAXM * MAXD];
} state;

static double bf(const uint16_t *x, int64_t i) { return chk_load(FA_BF16, x, i); }

static void make(tile_case *t, int m, int d, int dv, int n, double qmag) {
    t->m = m, t->d = d, t->dv = dv, t->n = n;
    tu_fill(&rng, FA_BF16, t->q, m * d, qmag);
    tu_fill(&rng, FA_BF16, t->k, (int64_t)n * WIDE * MAXD, 1.0);
    tu_fill(&rng, FA_BF16, t->v, (int64_t)n * WIDE * MAXD, 1.0);
}

static fa_decode_step view(const tile_case *t, state *s, float scale, fa_decode_prefetch *pf) {
    const fa_decode_step x = {t->q, t->k, t->v, WIDE * MAXD, WIDE * MAXD, t->m, t->d, t->n, t->dv, t->dv,
                              scale, s->mx, s->sum, s->acc, pf};
    return x;
}

static void fresh(state *s) {
    for (int r = 0; r < MAXM; r++) s->mx[r] = -INFINITY, s->sum[r] = 0.0f;
    memset(s->acc, 0, sizeof s->acc);
}

/* The float64 reference of the tiles in turn from a fresh state: o = acc / sum, lse. */
static void reference(const tile_case *const *tiles, int nt, float scale, double *o, double *lse, double *serr) {
    const int m = tiles[0]->m, dv = tiles[0]->dv, d = tiles[0]->d;
    for (int r = 0; r < m; r++) {
        double mx = -INFINITY, sum = 0, acc[MAXD] = {0}, err = 0;
        for (int x = 0; x < nt; x++) {
            const tile_case *t = tiles[x];
            double sc[MAXN], top = -INFINITY;
            for (int j = 0; j < t->n; j++) {
                double dot = 0, mag = 0;
                for (int c = 0; c < d; c++) {
                    const double p = bf(t->q, r * d + c) * bf(t->k, (int64_t)j * WIDE * MAXD + c);
                    dot += p, mag += fabs(p);
                }
                sc[j] = scale * dot, top = fmax(top, sc[j]);
                err = fmax(err, fabs(scale) * mag * 0x1p-20); /* f32 sums of d products */
            }
            const double mn = fmax(mx, top), alpha = exp(mx - mn);
            sum *= alpha;
            for (int c = 0; c < dv; c++) acc[c] *= alpha;
            for (int j = 0; j < t->n; j++) {
                const double p = exp(sc[j] - mn);
                sum += p;
                for (int c = 0; c < dv; c++) acc[c] += p * bf(t->v, (int64_t)j * WIDE * MAXD + c);
            }
            mx = mn;
        }
        for (int c = 0; c < dv; c++) o[r * dv + c] = acc[c] / sum;
        lse[r] = mx + log(sum), serr[r] = err;
    }
}

/* One tile (or two in a row) through the tile step and the AVX512_BF16 step, each checked
 * against the reference. */
static void compare(const char *what, const tile_case *a, const tile_case *b) {
    const tile_case *tiles[2] = {a, b};
    const int nt = b ? 2 : 1, m = a->m, dv = a->dv;
    const float scale = (float)(1.0 / sqrt((double)a->d));
    static double o[MAXM * MAXD], lse[MAXM], serr[MAXM];
    reference(tiles, nt, scale, o, lse, serr);
    static char lines[1 << 16];
    fa_decode_prefetch pf = {(const char *)lines, NULL, 0, sizeof lines, 0, 3, 0};
    state amx, vec;
    fresh(&amx), fresh(&vec);
    for (int x = 0; x < nt; x++) {
        const fa_decode_step sa = view(tiles[x], &amx, scale, &pf), sv = view(tiles[x], &vec, scale, NULL);
        fa_decode_step_bf16_amx(&sa);
        fa_decode_step_bf16(&sv);
    }
    const state *got[2] = {&amx, &vec};
    const char *name[2] = {"tile step", "AVX512_BF16 step"};
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < m; r++) {
            const double l = got[g]->mx[r] + log(got[g]->sum[r]), lt = 1e-5 * (1 + fabs(lse[r])) + serr[r];
            CHECK(fabs(l - lse[r]) <= lt, "%s, %s: row %d lse %.9g, reference %.9g (bound %.3g)", what, name[g], r, l,
                  lse[r], lt);
            for (int c = 0; c < dv; c++) {
                double vmax = 0;
                for (int x = 0; x < nt; x++)
                    for (int j = 0; j < tiles[x]->n; j++)
                        vmax = fmax(vmax, fabs(bf(tiles[x]->v, (int64_t)j * WIDE * MAXD + c)));
                const double oc = got[g]->acc[r * dv + c] / got[g]->sum[r], ot = (0x1p-8 + 1e-5) * vmax + 1e-30;
                if (!(fabs(oc - o[r * dv + c]) <= ot)) {
                    CHECK(0, "%s, %s: row %d column %d o %.9g, reference %.9g (bound %.3g)", what, name[g], r, c, oc,
                          o[r * dv + c], ot);
                    return;
                }
            }
        }
}

/* A tile the tile step leaves to the AVX512_BF16 step: the same bits, from a state of an
 * earlier tile. */
static void declined(const char *what, const tile_case *t) {
    state s, w;
    for (int r = 0; r < MAXM; r++) s.mx[r] = (float)r * 0.25f, s.sum[r] = 1.5f;
    for (int i = 0; i < MAXM * MAXD; i++) s.acc[i] = (float)(i % 7) - 3.0f;
    w = s;
    const fa_decode_step a = view(t, &s, 0.125f, NULL), b = view(t, &w, 0.125f, NULL);
    fa_decode_step_bf16_amx(&a);
    fa_decode_step_bf16(&b);
    CHECK(!memcmp(&s, &w, sizeof s), "%s: the state differs from the AVX512_BF16 step's", what);
}

int main(void) {
    rng = check_seed("test_decode_bf16_amx");
    if (strcmp(fa_cpu_isa(), "amx")) {
        printf("test_decode_bf16_amx: skipped (isa %s: the tile step is the amx table's)\n", fa_cpu_isa());
        return 77;
    }
    static tile_case a, b;
    int cases = 0;
    for (int i = 0; i < 160; i++) {
        const int d = 32 * (int)tu_int(&rng, 1, 4), dv = 32 * (int)tu_int(&rng, 1, 4), m = (int)tu_int(&rng, 1, MAXM);
        const int n = i < 8 ? (int[]){1, 2, 15, 16, 17, 31, 33, 128}[i] : (int)tu_int(&rng, 1, MAXN);
        const double qmag = (double[]){0.5, 3.0, 20.0}[i % 3];
        make(&a, m, d, dv, n, qmag);
        char what[96];
        snprintf(what, sizeof what, "m %d d %d dv %d n %d |q| %g", m, d, dv, n, qmag);
        compare(what, &a, NULL);
        if (i % 4 == 0) { /* a second tile from the first's state, its scores larger */
            make(&b, m, d, dv, (int)tu_int(&rng, 1, MAXN), qmag * 2);
            compare(what, &a, &b);
        }
        cases++;
    }
    /* the tiles it leaves alone */
    /* a value row's inf or NaN: even and odd columns, a full 16-key block and the staged last
     * one, for 4 rows and for 7 (a second pass of rows) */
    const int at[][2] = {{17, 33}, {0, 0}, {39, 127}, {16, 64}, {32, 96}};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int x = 0; x < 5; x++)
        for (int y = 0; y < 3; y++)
            for (int m = 4; m <= 7; m += 3) {
                make(&a, m, 128, 128, 40, 1.0);
                chk_store(FA_BF16, a.v, (int64_t)at[x][0] * WIDE * MAXD + at[x][1], bad[y]);
                char what[96];
                snprintf(what, sizeof what, "%d rows, value row %d column %d holding %g", m, at[x][0], at[x][1],
                         (double)bad[y]);
                declined(what, &a);
            }
    make(&a, 4, 48, 64, 40, 1.0);
    declined("head dim 48", &a);
    make(&a, 4, 64, 160, 40, 1.0);
    declined("value dim 160", &a);
    printf("test_decode_bf16_amx: %d tiles against the float64 reference\n", cases);
    return check_finish("test_decode_bf16_amx");
}
