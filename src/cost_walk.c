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

/* ---- the forward's slices (internal.h, fwd_slice) -------------------------------------- *
 * A plan whose forward runs pairs in slices of rows computes, in each pair, only the keys up
 * to the last one a slice's rows may see (fa_sched_mask_slice_keys). Without a mask that is
 * the slice's last row's hi, so only the pairs a tile's hi edge crosses lose keys, and what
 * one full tile loses depends only on where that edge falls in its key tile, (t bq + c) mod bk
 * for hi(i) = i + c, wherever no clamp to [-1, Sk] and no cut last key tile is near: there
 * it repeats every P = bk / gcd(bq, bk) tiles. So the tiles there are summed one period at a
 * time, and the few others (where hi first reaches key 0, and near the last key tile) one by
 * one, by the same function the driver asks. */

/* What rows [r0, r1) lose to slices: elements (m times keys) and rows of slices that compute
 * nothing (one rescale each). */
static void tile_cut(const fa_sched *s, int64_t bk, int64_t slice, int64_t r0, int64_t r1, wide *keys, wide *rows) {
    int64_t kt0, kt1;
    fa_sched_key_tiles(s, r0, r1, bk, &kt0, &kt1);
    const fa_sched_mask none = {0};
    const int64_t first_slice_end = r0 + slice < r1 ? r0 + slice : r1;
    const int64_t from = (fa_sched_hi(s, first_slice_end - 1) + 1) / bk; /* tiles before: every slice sees all */
    for (int64_t kt = kt0 > from ? kt0 : from; kt < kt1; kt++) {
        const int64_t c0 = kt * bk, n = bk < s->seq_k - c0 ? bk : s->seq_k - c0;
        if (fa_sched_tile_kind(s, r0, r1, c0, c0 + n) == FA_TILE_FULL) continue;
        for (int64_t a = r0; a < r1; a += slice) {
            const int64_t b = a + slice < r1 ? a + slice : r1;
            const int64_t ns = fa_sched_mask_slice_keys(s, &none, a, b, c0, n);
            *keys += (wide)(b - a) * (n - ns);
            *rows += ns ? 0 : b - a;
        }
    }
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        const int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The first full tile t in [lo, T] with hi(row t bq + at) >= bound (T if none; monotone). */
static int64_t first_reaching(const fa_sched *s, int64_t bq, int64_t at, int64_t bound, int64_t lo, int64_t T) {
    int64_t a = lo, b = T;
    while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (fa_sched_hi(s, mid * bq + at) >= bound) b = mid;
        else a = mid + 1;
    }
    return a;
}

void fa_tile_walk_slice_cut(const struct fa_plan *pl, int64_t bq, int64_t bk, int64_t slice, wide *keys, wide *rows) {
    *keys = *rows = 0;
    const fa_sched s = fa_plan_sched(pl);
    const int64_t sq = s.seq_q, sk = s.seq_k, T = sq / bq;
    if (!slice || sq <= 0 || sk <= 0 || (!s.causal && s.window_right < 0)) return; /* no hi edge */
    const int64_t kfull = sk / bk * bk; /* keys of the full key tiles */
    /* [ta, tb): every row's hi in [0, kfull): no clamp, edge key tiles whole: periodic */
    const int64_t ta = first_reaching(&s, bq, 0, 0, 0, T);
    const int64_t tb = first_reaching(&s, bq, bq - 1, kfull, ta, T);
    if (ta > 0) tile_cut(&s, bk, slice, (ta - 1) * bq, ta * bq, keys, rows); /* the one where hi reaches 0 */
    const int64_t P = bk / gcd64(bq, bk), L = tb - ta;
    if (L <= 2 * P) {
        for (int64_t t = ta; t < tb; t++) tile_cut(&s, bk, slice, t * bq, t * bq + bq, keys, rows);
    } else {
        wide pk = 0, pr = 0, rk = 0, rr = 0; /* a period; its first L mod P tiles */
        for (int64_t t = 0; t < P; t++) {
            if (t == L % P) rk = pk, rr = pr;
            tile_cut(&s, bk, slice, (ta + t) * bq, (ta + t) * bq + bq, &pk, &pr);
        }
        *keys += (wide)(L / P) * pk + rk, *rows += (wide)(L / P) * pr + rr;
    }
    /* past tb: until a tile's first slice sees to the last key (then none loses a key) */
    for (int64_t t = tb; t < T; t++) {
        const int64_t end = t * bq + (slice < bq ? slice : bq) - 1;
        if (fa_sched_hi(&s, end) >= sk - 1) break;
        tile_cut(&s, bk, slice, t * bq, t * bq + bq, keys, rows);
    }
    if (sq % bq) tile_cut(&s, bk, slice, T * bq, sq, keys, rows); /* the partial last tile */
}
