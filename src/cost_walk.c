/* The tile sums of the cost model (fa_tile_walk in internal.h) in closed form.
 *
 * Query tile t (rows [t bq, t bq + bq), full tiles t < T = Sq / bq) visits key tiles
 * [lo(t) / bk, hi(t) / bk] with lo(t) = max(0, key_lo(t bq)) and hi(t) = min(Sk - 1,
 * key_hi(t bq + bq - 1)) (fa_sched_key_tiles). key_lo and key_hi are i + constant (or
 * unbounded), so both ends are lines of slope bq, clamped, and hi - lo >= 0 before
 * clamping: a tile is empty only where hi < 0 or lo > Sk - 1. Five monotone predicates
 * split [0, T) into at most six bands (found by binary search over t, evaluating
 * schedule.h's fa_sched_lo / fa_sched_hi: the lines clamped to [-1, Sk], equal to them
 * wherever a band uses their value), inside which every clamp is fixed; there each sum is
 * a constant times the band's length or a sum of floor((bq t + c) / bk) over t, which
 * floor_sum adds up in O(log). The partial last tile, if any, is taken as the walk takes it.
 * Walking every tile instead took O(Sq / bq): ~20 s for Sq = 2^31 - 1 with bq = 1. */
#include "internal.h"

typedef __int128 wide;
typedef unsigned __int128 uwide;

/* Sum over i in [0, n) of floor((a i + b) / m), for a, b >= 0 and m > 0 (the Euclidean
 * reduction: each round swaps the roles of a and m, as in the gcd). Here n < 2^32 and
 * a, b, m < 2^63, so every intermediate stays below 2^127. */
static uwide floor_sum(uwide n, uwide m, uwide a, uwide b) {
    uwide total = 0;
    for (;;) {
        if (a >= m) total += n * (n - 1) / 2 * (a / m), a %= m;
        if (b >= m) total += n * (b / m), b %= m;
        const uwide y = a * n + b;
        if (y < m) return total;
        n = y / m, b = y % m;
        const uwide t = m;
        m = a, a = t;
    }
}

/* The ends of full query tile t before clipping to [0, Sk) (clamped to [-1, Sk]). */
static int64_t raw_lo(const fa_sched *s, int64_t bq, int64_t t) { return fa_sched_lo(s, t * bq); }
static int64_t raw_hi(const fa_sched *s, int64_t bq, int64_t t) { return fa_sched_hi(s, t * bq + bq - 1); }

enum { HI_REACHES_0, LO_PAST_END, LO_REACHES_0, HI_PAST_END, HI_IN_LAST_TILE, NPRED };

/* Predicate k of tile t; each is false, then true, as t grows (both ends only grow). */
static int pred(const fa_sched *s, int64_t bq, int64_t bk, int k, int64_t t) {
    const int64_t sk = s->seq_k;
    switch (k) {
    case HI_REACHES_0: return raw_hi(s, bq, t) >= 0;
    case LO_PAST_END: return raw_lo(s, bq, t) > sk - 1;
    case LO_REACHES_0: return raw_lo(s, bq, t) >= 0;
    case HI_PAST_END: return raw_hi(s, bq, t) >= sk - 1;
    default: return raw_hi(s, bq, t) >= (sk - 1) / bk * bk; /* kt1 * bk reaches past Sk */
    }
}

/* The first t in [0, T] where predicate k holds (T if none). */
static int64_t first_true(const fa_sched *s, int64_t bq, int64_t bk, int k, int64_t T) {
    int64_t a = 0, b = T;
    while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (pred(s, bq, bk, k, mid)) b = mid;
        else a = mid + 1;
    }
    return a;
}

/* Adds the full tiles [t0, t1), inside which no predicate changes, to w. */
static void add_band(const fa_sched *s, int64_t bq, int64_t bk, int64_t t0, int64_t t1, fa_tile_walk *w) {
    const int64_t sk = s->seq_k;
    const wide n = t1 - t0;
    if (!pred(s, bq, bk, HI_REACHES_0, t0) || pred(s, bq, bk, LO_PAST_END, t0)) return; /* empty tiles */
    /* sums over the band of kt0 = lo / bk and kt1 = hi / bk + 1, and of min(kt1 bk, Sk) */
    wide sum_kt0 = 0, sum_kt1, sum_end;
    if (pred(s, bq, bk, LO_REACHES_0, t0))
        sum_kt0 = (wide)floor_sum((uwide)n, (uwide)bk, (uwide)bq, (uwide)raw_lo(s, bq, t0));
    if (pred(s, bq, bk, HI_PAST_END, t0)) sum_kt1 = n * ((sk - 1) / bk + 1);
    else sum_kt1 = (wide)floor_sum((uwide)n, (uwide)bk, (uwide)bq, (uwide)raw_hi(s, bq, t0)) + n;
    sum_end = pred(s, bq, bk, HI_IN_LAST_TILE, t0) ? n * sk : sum_kt1 * bk;
    const wide pairs = sum_kt1 - sum_kt0, keys = sum_end - sum_kt0 * bk;
    w->pairs += pairs;
    w->keys += keys;
    w->rows_tiles += pairs * bq;
    w->rows_keys += keys * bq;
}

fa_tile_walk fa_tile_walk_sums(const struct fa_plan *pl, int64_t bq, int64_t bk) {
    fa_tile_walk w = {0};
    const fa_sched s = fa_plan_sched(pl);
    const int64_t sq = s.seq_q, sk = s.seq_k, T = sq / bq;
    w.qtiles = T + (sq % bq != 0);
    int64_t cut[NPRED + 2];
    cut[0] = 0, cut[1] = T;
    for (int k = 0; k < NPRED; k++) cut[k + 2] = first_true(&s, bq, bk, k, T);
    for (int i = 1; i < NPRED + 2; i++) /* sort the band edges (a few) */
        for (int j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
            const int64_t x = cut[j];
            cut[j] = cut[j - 1], cut[j - 1] = x;
        }
    for (int i = 0; i + 1 < NPRED + 2; i++)
        if (cut[i] < cut[i + 1]) add_band(&s, bq, bk, cut[i], cut[i + 1], &w);
    if (sq % bq) { /* the partial last tile, as the walk takes it */
        int64_t kt0, kt1;
        fa_sched_key_tiles(&s, T * bq, sq, bk, &kt0, &kt1);
        if (kt1 > kt0) {
            const int64_t m = sq - T * bq, end = kt1 * bk < sk ? kt1 * bk : sk;
            w.rows_keys += (wide)m * (end - kt0 * bk);
            w.rows_tiles += (wide)m * (kt1 - kt0);
            w.keys += end - kt0 * bk;
            w.pairs += kt1 - kt0;
        }
    }
    return w;
}
