/* fa_merge_states against float64: random key sets split in two, each part's state (o, lse)
 * computed in double from its scores and values and rounded to the dtype, merged, and
 * compared with the union's state in double; empty parts (lse = -inf, o left NaN: never
 * read), both empty, attention sinks (added once, to the denominator), in-place merging,
 * NaN propagation and bad arguments. FA_TEST_SEED reproduces a run. */
#include "check.h"

static uint64_t rng;

#define ROWS 5
#define HEADS 3
#define DV 24
#define KEYS 40

/* The state of keys [j0, j1) of one (row, head): o[DV], lse; with a sink logit (or -inf). */
static void state(const double *s, const double *v, int j0, int j1, double sink, double *o, double *lse) {
    double m = sink;
    for (int j = j0; j < j1; j++) m = s[j] > m ? s[j] : m;
    double l = sink == -INFINITY ? 0.0 : exp(sink - m);
    for (int x = 0; x < DV; x++) o[x] = 0.0;
    if (m == -INFINITY) {
        *lse = -INFINITY;
        return;
    }
    for (int j = j0; j < j1; j++) {
        const double p = exp(s[j] - m);
        l += p;
        for (int x = 0; x < DV; x++) o[x] += p * v[j * DV + x];
    }
    for (int x = 0; x < DV; x++) o[x] /= l;
    *lse = m + log(l);
}

static void random_merge(fa_dtype dt, int with_sinks, int in_place) {
    const size_t es = fa_dtype_size(dt);
    const int64_t n = ROWS * HEADS;
    void *oa = tu_alloc(n * DV * es), *ob = tu_alloc(n * DV * es), *o = tu_alloc(n * DV * es);
    float la[ROWS * HEADS], lb[ROWS * HEADS], l[ROWS * HEADS], sinks[HEADS];
    double want[ROWS * HEADS * DV], wl[ROWS * HEADS], s[KEYS], v[KEYS * DV], tmp[DV], t;
    for (int h = 0; h < HEADS; h++) sinks[h] = h == 2 ? -INFINITY : (float)(3.0 * tu_uniform(&rng));
    for (int64_t i = 0; i < n; i++) {
        const int h = (int)(i % HEADS);
        for (int j = 0; j < KEYS; j++) s[j] = 6.0 * tu_uniform(&rng) + (i % 4 == 1 ? 80.0 : 0.0); /* large lse too */
        for (int j = 0; j < KEYS * DV; j++) v[j] = tu_uniform(&rng);
        /* the split: all in a, all in b, or a random cut */
        const int cut = i % 5 == 0 ? 0 : i % 5 == 1 ? KEYS : (int)tu_int(&rng, 1, KEYS - 1);
        const double sk = with_sinks ? sinks[h] : -INFINITY;
        state(s, v, 0, KEYS, sk, want + i * DV, &wl[i]);
        state(s, v, 0, cut, -INFINITY, tmp, &t);
        la[i] = (float)t;
        for (int x = 0; x < DV; x++) chk_store(dt, oa, i * DV + x, cut ? (float)tmp[x] : NAN); /* empty: garbage */
        state(s, v, cut, KEYS, -INFINITY, tmp, &t);
        lb[i] = (float)t;
        for (int x = 0; x < DV; x++) chk_store(dt, ob, i * DV + x, cut < KEYS ? (float)tmp[x] : NAN);
    }
    tu_poison(dt, o, n * DV);
    void *out = in_place ? oa : o;
    float *lout = in_place ? la : l;
    fa_status st = fa_merge_states(dt, ROWS, HEADS, DV, oa, la, ob, lb, with_sinks ? sinks : NULL, out, lout);
    CHECK(st == FA_OK, "merge %s: %s", fa_dtype_name(dt), fa_last_error());
    const int64_t od[4] = {1, ROWS, HEADS, DV}, ld[4] = {1, ROWS, HEADS, 1};
    const fa_strides dense = {{0, 0, 0, 0}};
    /* the inputs' rounding to dtype (and the lse's to f32, times |o| <= 1) bound the error */
    check_tensor("merged o", dt, out, &dense, want, od, check_tol_of(dt), NULL, 0);
    check_tensor("merged lse", FA_F32, lout, &dense, wl, ld, CHECK_TOL_LSE, NULL, 1);
    free(oa), free(ob), free(o);
}

static void edges(void) {
    float oa[4] = {NAN, NAN, NAN, NAN}, ob[4] = {NAN, NAN, NAN, NAN}, o[4], la[2] = {-INFINITY, NAN}, lb[2] = {-INFINITY, 0};
    float l[2];
    CHECK(fa_merge_states(FA_F32, 2, 1, 2, oa, la, ob, lb, NULL, o, l) == FA_OK, "edges: %s", fa_last_error());
    CHECK(o[0] == 0 && o[1] == 0 && l[0] == -INFINITY, "edges: two empty states give o = 0, lse = -inf");
    CHECK(isnan(o[2]) && isnan(l[1]), "edges: a NaN lse gives a NaN state");
    /* a sink alone: o = 0, lse = the sink */
    const float sink = 1.5f;
    CHECK(fa_merge_states(FA_F32, 1, 1, 2, oa, la, ob, lb, &sink, o, l) == FA_OK && o[0] == 0 && l[0] == 1.5f,
          "edges: a sink alone: o %g lse %g", (double)o[0], (double)l[0]);
    const float bad = NAN;
    CHECK(fa_merge_states(FA_F32, 1, 1, 2, oa, la, ob, lb, &bad, o, l) == FA_ERR_INVALID &&
              strstr(fa_last_error(), "sinks[0]"),
          "edges: a NaN sink: %s", fa_last_error());
    CHECK(fa_merge_states(FA_F32, 1, 1, 2, oa, la, NULL, lb, NULL, o, l) == FA_ERR_NULL && strstr(fa_last_error(), "o_b"),
          "edges: a NULL input: %s", fa_last_error());
    CHECK(fa_merge_states(FA_F32, 1, 0, 2, oa, la, ob, lb, NULL, o, l) == FA_ERR_INVALID, "edges: zero heads");
    CHECK(fa_merge_states((fa_dtype)7, 1, 1, 2, oa, la, ob, lb, NULL, o, l) == FA_ERR_INVALID, "edges: a bad dtype");
    CHECK(fa_merge_states(FA_F32, 0, 1, 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == FA_OK, "edges: no rows");
    /* head_dim_v 0: no o, the lse still merged (logaddexp with the sink) */
    const float la2[2] = {0.5f, -INFINITY}, lb2[2] = {-1.0f, -INFINITY};
    float l2[2] = {NAN, NAN};
    CHECK(fa_merge_states(FA_BF16, 1, 2, 0, NULL, la2, NULL, lb2, NULL, NULL, l2) == FA_OK &&
              fabsf(l2[0] - (float)log(exp(0.5) + exp(-1.0))) < 1e-6f && l2[1] == -INFINITY,
          "edges: head_dim_v 0: %s, lse %g %g", fa_last_error(), (double)l2[0], (double)l2[1]);
    CHECK(fa_merge_states(FA_F32, 1, 1, 0, NULL, la, NULL, NULL, NULL, NULL, l) == FA_ERR_NULL &&
              strstr(fa_last_error(), "lse_b"),
          "edges: head_dim_v 0 without lse_b: %s", fa_last_error());
}

/* o and lse may be o_a / o_b and lse_a / lse_b exactly (in place); any other overlap is
 * refused, naming both, with nothing written (o one element into o_a once merged rows
 * shifted into each other, and returned FA_OK). */
static void overlaps(void) {
    float big[16], keep[16], ob[8] = {8, 7, 6, 5, 4, 3, 2, 1}, la[3] = {0.5f, 0.2f, 0}, lb[2] = {0.1f, 0.3f};
    float o[8], l[2], lkeep[3];
    for (int i = 0; i < 16; i++) big[i] = (float)i;
    memcpy(keep, big, sizeof big), memcpy(lkeep, la, sizeof la);
    const struct {
        const char *what, *out, *in;
        void *o;
        float *lse;
    } bad[] = {{"o one element into o_a", "o (bytes", "overlaps o_a (bytes", big + 1, l},
               {"lse one element into lse_a", "lse (bytes", "overlaps lse_a (bytes", o, la + 1},
               {"lse inside o_b", "lse (bytes", "overlaps o_b (bytes", o, ob + 2},
               {"lse inside o", "o (bytes", "overlaps lse (bytes", big + 8, big + 10}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const fa_status st = fa_merge_states(FA_F32, 1, 2, 4, big, la, ob, lb, NULL, bad[i].o, bad[i].lse);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), bad[i].out) && strstr(fa_last_error(), bad[i].in),
              "overlaps: %s: status %d, \"%s\"", bad[i].what, (int)st, fa_last_error());
        CHECK(!memcmp(big, keep, sizeof big) && !memcmp(la, lkeep, sizeof la), "overlaps: %s: an input was written",
              bad[i].what);
    }
    /* in place into the b state: allowed, and the same as apart */
    CHECK(fa_merge_states(FA_F32, 1, 2, 4, big, la, ob, lb, NULL, o, l) == FA_OK, "overlaps: apart: %s", fa_last_error());
    CHECK(fa_merge_states(FA_F32, 1, 2, 4, big, la, ob, lb, NULL, ob, lb) == FA_OK && !memcmp(o, ob, sizeof o) &&
              !memcmp(l, lb, sizeof l),
          "overlaps: o = o_b, lse = lse_b in place: %s", fa_last_error());
}

int main(void) {
    rng = check_seed("test_merge_states");
    const fa_dtype dts[3] = {FA_F32, FA_F16, FA_BF16};
    for (int d = 0; d < 3; d++)
        for (int sinks = 0; sinks < 2; sinks++) random_merge(dts[d], sinks, d == 1);
    edges();
    overlaps();
    return check_finish("test_merge_states");
}
