/* The one definition of which keys a query row sees, and of the tile schedule built on it
 * (docs/semantics.md, "Which keys a row sees"). The plan, the cost model and its
 * closed-form walk, every CPU driver, the inference plans and the CUDA kernels include
 * this header; none derives visibility itself. (The float64 references in src/ref stay
 * independent on purpose, and tests/test_schedule.c checks this file against a brute
 * force written from the docs.)
 *
 * Plain C, no libc beyond stdint.h: under nvcc every function is __host__ __device__.
 *
 * A problem's masks: row i (0 <= i < Sq) sits at key position d = i + off; key j
 * (0 <= j < Sk) is visible when
 *     causal:           j <= d
 *     window (l, r):    d - l <= j <= d + r      (a side of -1 is unbounded)
 * so row i sees the interval [lo(i), hi(i)] of keys, clipped to [0, Sk), empty when
 * lo > hi. Before clipping lo(i) = i + off - l and hi(i) = i + off (+ r) are lines of
 * slope 1 (or unbounded), and lo(i) <= i + off <= hi(i): both ends only grow with i and
 * consecutive rows' intervals overlap, so the keys any row of [r0, r1) sees form the one
 * interval [lo(r0), hi(r1 - 1)]. The tile schedule rests on that: a query tile visits the
 * key tiles that overlap its rows' interval, and the query tiles that visit a key tile
 * are contiguous.
 *
 * Overflow: every function is exact for every int64 off, window sides in [-1, INT64_MAX]
 * (any negative side is unbounded), 0 <= Sk < INT64_MAX and rows i >= 0. The line values
 * are computed with additions that saturate, and each saturates in one direction only
 * (see fa_sched_lo / fa_sched_hi), then clamped to [-1, Sk]: a saturated sum stands for
 * a true value beyond int64, which the clamp would have sent to the same end. */
#ifndef FA_SCHEDULE_H
#define FA_SCHEDULE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FA_SCHED_FN __host__ __device__ static inline
#else
#define FA_SCHED_FN static inline
#endif

/* One problem's masks: a dense (batch, head), a packed sequence (its own Sq_b, Sk_b and
 * offset) or a decoded sequence (its cache plus new keys). */
typedef struct fa_sched {
    int64_t seq_q, seq_k; /* query rows and keys */
    int64_t off;          /* row i sits at key position i + off */
    int causal;
    int64_t window_left, window_right; /* -1: unbounded */
} fa_sched;

/* How a (query tile, key tile) pair is computed. */
enum {
    FA_TILE_EMPTY = 0,   /* no row sees any key of the tile: skipped */
    FA_TILE_PARTIAL = 1, /* some (row, key) pairs hidden: masked element by element */
    FA_TILE_FULL = 2     /* every row sees every key of the tile: no mask needed */
};

/* The diagonal of a problem of sq rows and sk keys: sk - sq (bottom-right) unless
 * has_diag_offset, then diag_offset (docs/semantics.md). */
FA_SCHED_FN int64_t fa_sched_off(int64_t sq, int64_t sk, int has_diag_offset, int64_t diag_offset) {
    return has_diag_offset ? diag_offset : sk - sq;
}

/* 1 if the diagonal (off) places anything: causal, a window (either side bounded) or ALiBi.
 * A mask object carries its own diagonal, fixed when it was built (fa_mask_causal etc.). */
FA_SCHED_FN int fa_sched_aligns(int causal, int64_t window_left, int64_t window_right, int alibi) {
    return causal || window_left >= 0 || window_right >= 0 || alibi;
}

/* The masks of a problem of sq rows and sk keys. */
FA_SCHED_FN fa_sched fa_sched_make(int64_t sq, int64_t sk, int has_diag_offset, int64_t diag_offset, int causal,
                                   int64_t window_left, int64_t window_right) {
    fa_sched s;
    s.seq_q = sq;
    s.seq_k = sk;
    s.off = fa_sched_off(sq, sk, has_diag_offset, diag_offset);
    s.causal = causal;
    s.window_left = window_left;
    s.window_right = window_right;
    return s;
}

/* a + b for b >= 0 (it can only overflow upward): INT64_MAX where the sum would pass it. */
FA_SCHED_FN int64_t fa_sched_add_sat(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
/* a - b for b >= 0 (it can only overflow downward): INT64_MIN where it would pass it. */
FA_SCHED_FN int64_t fa_sched_sub_sat(int64_t a, int64_t b) { return a < INT64_MIN + b ? INT64_MIN : a - b; }

/* lo(i), clamped to [-1, Sk]: -1 stands for "before the first key" (an unbounded left
 * side), Sk for "past the last". Monotone in i. Safe: off - l can only overflow downward;
 * saturated at INT64_MIN, adding i (0 <= i <= INT64_MAX) leaves it <= -1, as the true value
 * is, so both clamp to -1; then + i can only overflow upward, where the true value passes
 * INT64_MAX > Sk and both clamp to Sk. */
FA_SCHED_FN int64_t fa_sched_lo(const fa_sched *s, int64_t i) {
    if (s->window_left < 0) return -1;
    const int64_t lo = fa_sched_add_sat(fa_sched_sub_sat(s->off, s->window_left), i);
    return lo < -1 ? -1 : lo > s->seq_k ? s->seq_k : lo;
}

/* hi(i), clamped to [-1, Sk] (Sk: an unbounded right side). Monotone in i. Safe:
 * i + off and then + r only add non-negative terms, so each can only overflow upward,
 * where the true value passes INT64_MAX > Sk: saturated, both clamp to Sk. */
FA_SCHED_FN int64_t fa_sched_hi(const fa_sched *s, int64_t i) {
    const int64_t d = fa_sched_add_sat(s->off, i);
    int64_t hi = s->seq_k;
    if (s->causal && d < hi) hi = d;
    if (s->window_right >= 0) {
        const int64_t w = fa_sched_add_sat(d, s->window_right);
        if (w < hi) hi = w;
    }
    return hi < -1 ? -1 : hi;
}

/* Keys [*lo, *hi] that some row of [r0, r1) sees, clipped to [0, Sk); returns 0 (and
 * *lo > *hi) when there is none. One row: r1 = r0 + 1. */
FA_SCHED_FN int fa_sched_span(const fa_sched *s, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi) {
    if (r1 <= r0) {
        *lo = 0, *hi = -1;
        return 0;
    }
    const int64_t l = fa_sched_lo(s, r0), h = fa_sched_hi(s, r1 - 1);
    *lo = l < 0 ? 0 : l;
    *hi = h > s->seq_k - 1 ? s->seq_k - 1 : h;
    return *lo <= *hi;
}

/* The rows [*r0, *r1) that see at least one key: contiguous, since a row's interval is
 * never empty before clipping, so a row sees nothing only where hi < 0 (a prefix of the
 * rows) or lo > Sk - 1 (a suffix). Two binary searches. */
FA_SCHED_FN void fa_sched_live_rows(const fa_sched *s, int64_t *r0, int64_t *r1) {
    int64_t a = 0, b = s->seq_k > 0 ? s->seq_q : 0; /* first row whose hi reaches key 0 */
    while (a < b) {
        const int64_t i = a + (b - a) / 2;
        if (fa_sched_hi(s, i) >= 0) b = i;
        else a = i + 1;
    }
    *r0 = a;
    b = s->seq_k > 0 ? s->seq_q : 0; /* first row at or past r0 whose lo passes the last key */
    while (a < b) {
        const int64_t i = a + (b - a) / 2;
        if (fa_sched_lo(s, i) > s->seq_k - 1) b = i;
        else a = i + 1;
    }
    *r1 = a;
}

/* Is key j (0 <= j < Sk) visible to row i by the masks (segment ids and bias apart)? */
FA_SCHED_FN int fa_sched_visible(const fa_sched *s, int64_t i, int64_t j) {
    return j >= fa_sched_lo(s, i) && j <= fa_sched_hi(s, i);
}

/* The key tiles [*kt0, *kt1) of bk keys that query rows [r0, r1) visit: those that overlap
 * the rows' visible keys ([0, 0) when they see none). FlashAttention-3's
 * get_n_block_min_max. */
FA_SCHED_FN void fa_sched_key_tiles(const fa_sched *s, int64_t r0, int64_t r1, int64_t bk, int64_t *kt0,
                                    int64_t *kt1) {
    int64_t lo, hi;
    if (!fa_sched_span(s, r0, r1, &lo, &hi)) {
        *kt0 = *kt1 = 0;
        return;
    }
    *kt0 = lo / bk;
    *kt1 = hi / bk + 1;
}

/* The inverse (FlashAttention-3's get_m_block_min_max): the query tiles [*qt0, *qt1) of bq
 * rows (the last one partial) whose fa_sched_key_tiles holds key tile kt (0 <= kt * bk <
 * Sk); *qt0 == *qt1 when none does. Tile t visits kt exactly when lo(t bq) <= c1 - 1 and
 * hi(last row of t) >= c0, for the tile's keys [c0, c1): the first holds for a prefix of
 * the tiles, the second for a suffix (both ends grow), so two binary searches over the
 * tiles find both edges, O(log(Sq / bq)). */
FA_SCHED_FN void fa_sched_query_tiles(const fa_sched *s, int64_t bq, int64_t bk, int64_t kt, int64_t *qt0,
                                      int64_t *qt1) {
    const int64_t nq = (s->seq_q + bq - 1) / bq, c0 = kt * bk;
    const int64_t c1 = s->seq_k - c0 < bk ? s->seq_k : c0 + bk;
    int64_t a = 0, b = nq; /* first tile whose last row reaches key c0 */
    while (a < b) {
        const int64_t t = a + (b - a) / 2, last = (t + 1) * bq < s->seq_q ? (t + 1) * bq - 1 : s->seq_q - 1;
        if (fa_sched_hi(s, last) >= c0) b = t;
        else a = t + 1;
    }
    *qt0 = a;
    b = nq; /* first tile at or past qt0 whose first row starts past key c1 - 1 */
    while (a < b) {
        const int64_t t = a + (b - a) / 2;
        if (fa_sched_lo(s, t * bq) > c1 - 1) b = t;
        else a = t + 1;
    }
    *qt1 = a;
}

/* The kind of the pair rows [r0, r1) x keys [c0, c1) (within [0, Sq) x [0, Sk)): empty
 * when no row sees a key of it (then the schedule skips it: the rows' keys form one
 * interval), full when every row sees every key. */
FA_SCHED_FN int fa_sched_tile_kind(const fa_sched *s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return FA_TILE_EMPTY;
    if (fa_sched_lo(s, r0) > c1 - 1 || fa_sched_hi(s, r1 - 1) < c0) return FA_TILE_EMPTY;
    if (fa_sched_lo(s, r1 - 1) <= c0 && fa_sched_hi(s, r0) >= c1 - 1) return FA_TILE_FULL;
    return FA_TILE_PARTIAL;
}

#if !defined(__CUDACC__) /* 128-bit sums: the cost model's, on the host */
/* Sum over i in [0, n) of clamp(i + c, 0, cap): a clamped line, in closed form. Rows where
 * i + c <= 0 add 0, where i + c >= cap add cap, in between i + c. */
static inline __int128 fa_sched_sum_clamped(__int128 c, __int128 n, __int128 cap) {
    if (n <= 0) return 0;
    __int128 i_lo = 1 - c, i_hi = cap - c; /* first i with i + c >= 1, with i + c >= cap */
    if (i_lo < 0) i_lo = 0;
    if (i_hi < 0) i_hi = 0;
    if (i_lo > n) i_lo = n;
    if (i_hi > n) i_hi = n;
    __int128 total = (n - i_hi) * cap;
    if (i_hi > i_lo) total += (i_lo + c + i_hi - 1 + c) * (i_hi - i_lo) / 2;
    return total;
}

/* Visible (row, key) pairs of rows [r0, r1), in closed form: the sum over the rows of
 * clamp(hi + 1, 0, Sk) - clamp(lo, 0, Sk), each a clamped line (lo <= hi + 1 before
 * clamping, so an empty row adds 0). Lines in 128 bits, where nothing overflows. */
static inline __int128 fa_sched_pairs(const fa_sched *s, int64_t r0, int64_t r1) {
    if (r1 <= r0) return 0;
    const __int128 n = (__int128)r1 - r0, sk = s->seq_k, d0 = (__int128)s->off + r0;
    __int128 hi_sum = n * sk, lo_sum = 0;
    if (s->causal || s->window_right >= 0)
        hi_sum = fa_sched_sum_clamped(d0 + (s->causal ? 0 : s->window_right) + 1, n, sk);
    if (s->window_left >= 0) lo_sum = fa_sched_sum_clamped(d0 - s->window_left, n, sk);
    return hi_sum - lo_sum;
}
#endif

#endif /* FA_SCHEDULE_H */
