/* Tests an internal on purpose. The cost model's tile sums in closed form (src/cost_walk.c,
 * fa_tile_walk_sums, and what the forward's slices of rows take from them,
 * fa_tile_walk_slice_cut) against the walk they replace: every query tile in turn through the
 * kernels' schedule
 * (schedule.h's key tiles), summing what it computes. Random shapes (Sq, Sk, block sizes,
 * causal, windows of every size including unbounded and huge ones, diagonal offsets
 * far off both ends), a few with a million query tiles, and edge shapes (one row, one key,
 * blocks larger than the sequence). Also plans Sq = 2^31 - 1 with block_q = 1 end to end
 * (its closed form makes that instant; the walk took ~20 s). Times nothing. Seeded
 * (FA_TEST_SEED). Internal on purpose: it includes internal.h. */
#include "check.h"
#include "internal.h" /* tests an internal on purpose (first comment) */

static int failures;
static uint64_t seed;

/* The walk the cost model took before (O(query tiles)): the test's oracle. */
static fa_tile_walk oracle(const struct fa_plan *pl, int64_t bq, int64_t bk) {
    fa_tile_walk w;
    memset(&w, 0, sizeof w);
    const int64_t sq = pl->p.seq_q, sk = pl->p.seq_k;
    for (int64_t r0 = 0; r0 < sq; r0 += bq) {
        int64_t r1 = r0 + bq < sq ? r0 + bq : sq, kt0, kt1;
        fa_key_tile_range(pl, r0, r1, bk, &kt0, &kt1);
        w.qtiles++;
        if (kt1 <= kt0) continue;
        int64_t m = r1 - r0, k_end = kt1 * bk < sk ? kt1 * bk : sk;
        __int128 n = k_end - kt0 * bk;
        w.rows_keys += (__int128)m * n;
        w.rows_tiles += (__int128)m * (kt1 - kt0);
        w.keys += n;
        w.pairs += kt1 - kt0;
    }
    return w;
}

/* What slices of `slice` rows take from the walk: in each pair of a tile, each slice computes
 * the keys up to the last one its last row's hi reaches, in steps of 32 from the key tile's
 * first key (none below it); only the key tiles past what the first slice's rows all see can
 * lose any. */
static void oracle_cut(const struct fa_plan *pl, int64_t bq, int64_t bk, int64_t slice, __int128 *keys,
                       __int128 *rows) {
    *keys = *rows = 0;
    const int64_t sq = pl->p.seq_q, sk = pl->p.seq_k;
    if (!pl->p.causal && pl->p.window_right < 0) return;
    for (int64_t r0 = 0; r0 < sq; r0 += bq) {
        int64_t r1 = r0 + bq < sq ? r0 + bq : sq, kt0, kt1;
        fa_key_tile_range(pl, r0, r1, bk, &kt0, &kt1);
        const int64_t e0 = (r0 + slice < r1 ? r0 + slice : r1) - 1, h0 = fa_key_hi(pl, e0);
        const int64_t from = h0 < 0 ? 0 : (h0 + 1) / bk; /* tiles before: all their keys are at most h0 */
        for (int64_t kt = kt0 > from ? kt0 : from; kt < kt1; kt++) {
            const int64_t c0 = kt * bk, n = bk < sk - c0 ? bk : sk - c0;
            if (h0 >= c0 + n - 1) continue;
            for (int64_t a = r0; a < r1; a += slice) {
                const int64_t b = a + slice < r1 ? a + slice : r1, hb = fa_key_hi(pl, b - 1);
                const int64_t h = hb < c0 + n - 1 ? hb : c0 + n - 1;
                const int64_t steps = h < c0 ? 0 : (h + 1 - c0 + 31) / 32 * 32, ns = steps < n ? steps : n;
                *keys += (__int128)(b - a) * (n - ns);
                *rows += ns ? 0 : b - a;
            }
        }
    }
}

static int same(const fa_tile_walk *a, const fa_tile_walk *b) {
    return a->rows_keys == b->rows_keys && a->rows_tiles == b->rows_tiles && a->keys == b->keys &&
           a->pairs == b->pairs && a->qtiles == b->qtiles;
}

/* A plan of just the fields the schedule reads (problem lengths, masks, offset). */
static void shape(struct fa_plan *pl, int64_t sq, int64_t sk, int causal, int64_t wl, int64_t wr, int has_off,
                  int64_t off) {
    memset(pl, 0, sizeof *pl);
    fa_problem_init(&pl->p);
    pl->p.seq_q = sq, pl->p.seq_k = sk, pl->p.causal = causal, pl->p.window_left = wl, pl->p.window_right = wr;
    pl->off = has_off ? off : sk - sq;
}

static void check(const struct fa_plan *pl, int64_t bq, int64_t bk, const char *what) {
    const fa_tile_walk got = fa_tile_walk_sums(pl, bq, bk), want = oracle(pl, bq, bk);
    /* the slices: the forward's 32 rows and another height, where the walk is affordable */
    const int64_t heights[2] = {32, 1 + (int64_t)((uint64_t)(pl->p.seq_q * 7 + bq * 3 + bk) % 40)};
    for (int i = 0; i < 2; i++) {
        const int64_t sl = heights[i];
        if ((double)pl->p.seq_q / (double)sl * ((double)bq / (double)bk + 3) > 4e6) continue;
        __int128 gk, gr, wk, wr;
        fa_tile_walk_slice_cut(pl, bq, bk, sl, &gk, &gr);
        oracle_cut(pl, bq, bk, sl, &wk, &wr);
        if (gk == wk && gr == wr) continue;
        failures++;
        printf("FAIL (FA_TEST_SEED=%llu) %s: Sq=%lld Sk=%lld bq=%lld bk=%lld causal=%d window (%lld, %lld) off %lld: "
               "slices of %lld rows take %lld elements, %lld rows; the walk says %lld, %lld\n",
               (unsigned long long)seed, what, (long long)pl->p.seq_q, (long long)pl->p.seq_k, (long long)bq,
               (long long)bk, pl->p.causal, (long long)pl->p.window_left, (long long)pl->p.window_right,
               (long long)pl->off, (long long)sl, (long long)gk, (long long)gr, (long long)wk, (long long)wr);
    }
    if (same(&got, &want)) return;
    failures++;
    printf("FAIL (FA_TEST_SEED=%llu) %s: Sq=%lld Sk=%lld bq=%lld bk=%lld causal=%d window (%lld, %lld) off %lld: "
           "closed form pairs %lld keys %lld rows_keys %lld, walk %lld %lld %lld\n",
           (unsigned long long)seed, what, (long long)pl->p.seq_q, (long long)pl->p.seq_k, (long long)bq,
           (long long)bk, pl->p.causal, (long long)pl->p.window_left, (long long)pl->p.window_right,
           (long long)pl->off, (long long)got.pairs, (long long)got.keys, (long long)got.rows_keys,
           (long long)want.pairs, (long long)want.keys, (long long)want.rows_keys);
}

/* A window side: unbounded, small, about the sequence, huge but finite, or near INT64_MAX. */
static int64_t window_side(uint64_t *r, int64_t s) {
    switch (tu_int(r, 0, 4)) {
    case 0: return -1;
    case 1: return tu_int(r, 0, 8);
    case 2: return tu_int(r, 0, 2 * s);
    case 3: return tu_int(r, ((int64_t)1 << 40) - 4, ((int64_t)1 << 40) + 4);
    default: return INT64_MAX - tu_int(r, 0, 3);
    }
}

static void random_case(uint64_t *r, int64_t max_seq, int64_t max_block, const char *what) {
    struct fa_plan pl;
    const int64_t sq = tu_int(r, 1, max_seq), sk = tu_int(r, 1, max_seq);
    /* one draw per statement: the order of a call's arguments is unspecified, the seed's replay must not be */
    const int has_off = tu_int(r, 0, 2) == 0;
    const int64_t off = tu_int(r, -(sq + sk + 5), sq + sk + 5);
    const int causal = (int)tu_int(r, 0, 1);
    const int64_t wl = window_side(r, sk), wr = window_side(r, sk), bq = tu_int(r, 1, max_block);
    const int64_t bk = tu_int(r, 1, max_block);
    shape(&pl, sq, sk, causal, wl, wr, has_off, off);
    check(&pl, bq, bk, what);
}

int main(void) {
    seed = tu_seed();
    uint64_t rng = seed;
    printf("test_cost_walk: FA_TEST_SEED=%llu\n", (unsigned long long)seed);
    const int cases = tu_check_cases() ? tu_check_cases() : 20000;
    for (int i = 0; i < cases; i++) random_case(&rng, 300, 40, "small");
    for (int i = 0; i < cases / 10; i++) random_case(&rng, 20000, 300, "medium");
    for (int i = 0; i < 10; i++) random_case(&rng, 1000000, 2, "a million query tiles");
    for (int i = 0; i < 40; i++) { /* long sequences, in at most 50000 query tiles for the walk's sake */
        struct fa_plan pl;
        const int64_t sq = tu_int(&rng, 1, INT32_MAX), sk = tu_int(&rng, 1, INT32_MAX);
        const int causal = (int)tu_int(&rng, 0, 1), has_off = (int)tu_int(&rng, 0, 1);
        const int64_t wl = window_side(&rng, sk), wr = window_side(&rng, sk), off = tu_int(&rng, -(sq + sk), sq + sk);
        const int64_t tiles = tu_int(&rng, 1, 50000), bq = sq / tiles + tu_int(&rng, 1, 3), bk = tu_int(&rng, 1, sk);
        shape(&pl, sq, sk, causal, wl, wr, has_off, off);
        check(&pl, bq, bk, "long sequences");
    }

    struct fa_plan pl; /* edges: one row or key, blocks past the sequence, offsets past both ends */
    const int64_t lens[] = {1, 2, 15, 16, 17, 64};
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int causal = 0; causal <= 1; causal++)
                for (int64_t bs = 1; bs <= 80; bs += 13) {
                    shape(&pl, lens[a], lens[b], causal, -1, -1, 0, 0);
                    check(&pl, bs, 81 - bs, "edges");
                    shape(&pl, lens[a], lens[b], causal, 0, 0, 1, -lens[a] - 3);
                    check(&pl, bs, bs, "edges, offset before the keys");
                    shape(&pl, lens[a], lens[b], causal, 2, -1, 1, lens[b] + 3);
                    check(&pl, bs, 1, "edges, offset past the keys");
                }

    /* the slow case of the walk, end to end through fa_plan_create */
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = INT32_MAX, p.seq_k = 4096, p.head_dim = 64, p.causal = 1;
    fa_options opt = {FA_BACKEND_CPU, 1, 1, 0};
    fa_plan *big = NULL;
    fa_status st = fa_plan_create(&p, &opt, &big);
    fa_cost c;
    if (st == FA_OK) fa_plan_cost(big, FA_FORWARD, &c);
    /* causal bottom-right, Sq > Sk: rows below Sq - Sk see no key; the rest see 1..Sk */
    const int64_t useful = (int64_t)4096 * 4097 / 2 * 2 * 128;
    if (st != FA_OK || c.flops_useful != useful || c.flops < useful) {
        failures++;
        printf("FAIL (FA_TEST_SEED=%llu) plan Sq=2^31-1 block_q=1: %s (%s), useful flops %lld, want %lld\n",
               (unsigned long long)seed, fa_status_string(st), fa_last_error(), st ? 0LL : (long long)c.flops_useful,
               (long long)useful);
    }
    fa_plan_destroy(big);
    printf("%s (FA_TEST_SEED=%llu): %d failure(s)\n", failures ? "FAILED" : "ok", (unsigned long long)seed, failures);
    return failures ? 1 : 0;
}
