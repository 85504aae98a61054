/* Tests an internal on purpose: src/schedule.h (and the plan's views of it in internal.h),
 * against a brute force written from docs/semantics.md ("Which keys a row sees") in 128-bit
 * arithmetic, without calling schedule.h. Per row: the visible key interval, at extreme
 * values (windows 0, 1 and near INT64_MAX on either side, -1, offsets near +-2^31, +-2^62
 * and the ends of int64, Sq much larger and much smaller than Sk), every candidate edge
 * checked key by key. Per tile, over small shapes: the key tiles of a query tile, the query
 * tiles of a key tile, the tile kinds, the rows that see a key and the pair counts against
 * the element-by-element matrix. Then packed (cu_seqlens, empty sequences among them) and
 * decode plans: each sequence's schedule row by row and the plan's flops_useful. Seeded
 * (FA_TEST_SEED); meant to be UBSan-clean. */
#include "check.h"
#include "internal.h" /* tests an internal on purpose (first comment) */

typedef __int128 wide;

static int failures;
static uint64_t rng; /* seed: check.h */

/* The masks of one problem, as the docs state them. */
typedef struct {
    int64_t sq, sk, off;
    int causal;
    int64_t wl, wr;
} masks;

/* docs/semantics.md: row i sits at key position i + off; causal: j <= i + off; window
 * (l, r): i + off - l <= j <= i + off + r, a side of -1 unbounded. */
static int ref_visible(const masks *m, int64_t i, int64_t j) {
    const wide at = (wide)i + m->off;
    if (m->causal && j > at) return 0;
    if (m->wl != -1 && j < at - m->wl) return 0;
    if (m->wr != -1 && j > at + m->wr) return 0;
    return 1;
}

static fa_sched as_sched(const masks *m) {
    fa_sched s = {m->sq, m->sk, m->off, m->causal, m->wl, m->wr};
    return s;
}

static void describe(const masks *m, char *buf, size_t n) {
    snprintf(buf, n, "Sq %lld Sk %lld off %lld causal %d window (%lld, %lld)", (long long)m->sq, (long long)m->sk,
             (long long)m->off, m->causal, (long long)m->wl, (long long)m->wr);
}

/* Row i's interval from schedule.h against the brute force at every key that could be an
 * edge of either (the visible keys of a row are an interval by the docs' definition, so
 * agreeing at both sides of every edge of both is agreeing everywhere), or at every key
 * when there are few. */
static void check_row(const masks *m, int64_t i) {
    const fa_sched s = as_sched(m);
    int64_t lo, hi;
    const int any = fa_sched_span(&s, i, i + 1, &lo, &hi);
    wide cand[32];
    int nc = 0;
    const wide at = (wide)i + m->off, base[] = {0, m->sk - 1, lo, hi, at, at - m->wl, at + m->wr};
    for (size_t b = 0; b < sizeof base / sizeof base[0]; b++)
        for (int d = -1; d <= 1; d++) cand[nc++] = base[b] + d;
    cand[nc++] = tu_int(&rng, 0, m->sk - 1);
    const int64_t every = m->sk <= 300 ? m->sk : 0;
    for (int64_t x = 0; x < nc + every; x++) {
        const wide jw = x < nc ? cand[x] : x - nc;
        if (jw < 0 || jw >= m->sk) continue;
        const int64_t j = (int64_t)jw;
        const int want = ref_visible(m, i, j), got = any && lo <= j && j <= hi;
        if (want != got || fa_sched_visible(&s, i, j) != want) {
            char d[200];
            describe(m, d, sizeof d);
            CHECK(0, "%s: row %lld key %lld visible %d, schedule.h says %d (span [%lld, %lld], visible %d)", d,
                     (long long)i, (long long)j, want, got, (long long)lo, (long long)hi, fa_sched_visible(&s, i, j));
            return;
        }
    }
    CHECK(any == (lo <= hi) && (!any || (lo >= 0 && hi < m->sk)), "row %lld: span [%lld, %lld] returned %d",
             (long long)i, (long long)lo, (long long)hi, any);
}

/* Visible pairs of rows [r0, r1) by the brute force: per row, its interval found from the
 * definition's three bounds in 128 bits. */
static wide ref_pairs(const masks *m, int64_t r0, int64_t r1) {
    wide total = 0;
    for (int64_t i = r0; i < r1; i++) {
        const wide at = (wide)i + m->off;
        wide lo = 0, hi = m->sk - 1;
        if (m->causal && at < hi) hi = at;
        if (m->wl != -1 && at - m->wl > lo) lo = at - m->wl;
        if (m->wr != -1 && at + m->wr < hi) hi = at + m->wr;
        if (hi >= lo) total += hi - lo + 1;
    }
    return total;
}

/* Rows worth checking: both ends, the middle, a random one, and where the diagonal or a
 * window edge crosses the first or the last key. */
static void check_rows(const masks *m) {
    const wide at0 = m->off, edges[] = {-at0, m->sk - 1 - at0, -at0 + m->wl, m->sk - 1 - at0 + m->wl,
                                        -at0 - m->wr, m->sk - 1 - at0 - m->wr};
    int64_t rows[40];
    int n = 0;
    rows[n++] = 0, rows[n++] = m->sq - 1, rows[n++] = m->sq / 2, rows[n++] = tu_int(&rng, 0, m->sq - 1);
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int d = -1; d <= 1; d++)
            if (edges[e] + d >= 0 && edges[e] + d < m->sq) rows[n++] = (int64_t)(edges[e] + d);
    for (int r = 0; r < n; r++) check_row(m, rows[r]);
    /* pair counts over a short run of rows somewhere (the brute force is per row) */
    const int64_t r0 = rows[tu_int(&rng, 0, n - 1)], len = tu_int(&rng, 0, 200);
    const int64_t r1 = len < m->sq - r0 ? r0 + len : m->sq;
    const fa_sched s = as_sched(m);
    const wide got = fa_sched_pairs(&s, r0, r1), want = ref_pairs(m, r0, r1);
    if (got != want) {
        char d[200];
        describe(m, d, sizeof d);
        CHECK(0, "%s: pairs of rows [%lld, %lld): %lld, brute force %lld", d, (long long)r0, (long long)r1,
                 (long long)got, (long long)want);
    }
}

static const int64_t P31 = (int64_t)1 << 31, P62 = (int64_t)1 << 62;

static int64_t pick(const int64_t *v, size_t n) { return v[tu_int(&rng, 0, (int64_t)n - 1)]; }

/* A window side: unbounded, 0, 1, small, or huge (2^31, 2^62, INT64_MAX and neighbours). */
static int64_t any_window(void) {
    const int64_t w[] = {-1, -1, 0, 1, 2, 3, 17, 1000, P31 - 1, P31, P31 + 1, P62 - 1, P62, P62 + 1,
                         INT64_MAX - 1, INT64_MAX};
    return pick(w, sizeof w / sizeof w[0]);
}

/* Extreme masks. Half the cases pair a far diagonal with a window that reaches back
 * (off = -X + d, right side X + e, or off = X + d, left side X + e), so that the visible
 * keys are a real band even at the ends of int64. */
static void random_extreme(void) {
    const int64_t lens[] = {1, 2, 3, 17, 64, 1000, P31 - 2, P31 - 1};
    masks m;
    m.sq = tu_int(&rng, 0, 2) ? pick(lens, 8) : tu_int(&rng, 1, P31 - 1);
    m.sk = tu_int(&rng, 0, 2) ? pick(lens, 8) : tu_int(&rng, 1, P31 - 1);
    m.causal = (int)tu_int(&rng, 0, 1);
    m.wl = any_window(), m.wr = any_window();
    const int64_t offs[] = {0, 1, -1, 2, -2, P31 - 1, -(P31 - 1), P31, -P31, P31 + 1, -P31 - 1, P62 - 1, -(P62 - 1),
                            P62, -P62, P62 + 1, -P62 - 1, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1};
    m.off = tu_int(&rng, 0, 3) ? pick(offs, sizeof offs / sizeof offs[0]) : m.sk - m.sq;
    if (tu_int(&rng, 0, 1)) {
        const int64_t xs[] = {P31, P62, INT64_MAX - 64};
        const int64_t x = pick(xs, 3), d = tu_int(&rng, -40, 40), e = tu_int(&rng, -40, 40);
        const int64_t w = x + e > INT64_MAX - 64 ? INT64_MAX : x + e;
        if (tu_int(&rng, 0, 1)) m.off = -x + d, m.wr = w, m.causal = 0;
        else m.off = x + d, m.wl = w;
    }
    check_rows(&m);
}

/* Small shapes: tiles against the element matrix. */
#define MAXS 40
static void random_tiles(void) {
    masks m;
    m.sq = tu_int(&rng, 1, MAXS), m.sk = tu_int(&rng, 1, MAXS), m.causal = (int)tu_int(&rng, 0, 1);
    const int64_t small_w[] = {-1, 0, 1, 2, 5, 13, INT64_MAX};
    m.wl = pick(small_w, 7), m.wr = pick(small_w, 7);
    m.off = tu_int(&rng, 0, 2) ? tu_int(&rng, -m.sq - 3, m.sk + 3) : m.sk - m.sq;
    if (tu_int(&rng, 0, 4) == 0) { /* far diagonals with windows reaching back */
        const int64_t x = tu_int(&rng, 0, 1) ? P62 : INT64_MAX - 64, d = tu_int(&rng, -50, 50);
        if (tu_int(&rng, 0, 1)) m.off = -x + d, m.wr = x + tu_int(&rng, -50, 50), m.causal = 0;
        else m.off = x + d, m.wl = x + tu_int(&rng, -50, 50);
    }
    const int64_t bq = tu_int(&rng, 1, 9), bk = tu_int(&rng, 1, 9);
    const int64_t nq = (m.sq + bq - 1) / bq, nk = (m.sk + bk - 1) / bk;
    static unsigned char vis[MAXS][MAXS];
    for (int64_t i = 0; i < m.sq; i++)
        for (int64_t j = 0; j < m.sk; j++) vis[i][j] = (unsigned char)ref_visible(&m, i, j);
    const fa_sched s = as_sched(&m);
    char d[200];
    describe(&m, d, sizeof d);
    /* visible elements of rows [r0, r1) x keys [c0, c1) */
#define COUNT(r0, r1, c0, c1, out)                                                                                     \
    do {                                                                                                               \
        out = 0;                                                                                                       \
        for (int64_t i_ = (r0); i_ < (r1); i_++)                                                                       \
            for (int64_t j_ = (c0); j_ < (c1); j_++) out += vis[i_][j_];                                               \
    } while (0)
    for (int64_t t = 0; t < nq; t++) {
        const int64_t r0 = t * bq, r1 = r0 + bq < m.sq ? r0 + bq : m.sq;
        int64_t kt0, kt1, first = -1, last = -2;
        fa_sched_key_tiles(&s, r0, r1, bk, &kt0, &kt1);
        for (int64_t kt = 0; kt < nk; kt++) {
            const int64_t c0 = kt * bk, c1 = c0 + bk < m.sk ? c0 + bk : m.sk;
            int64_t cnt;
            COUNT(r0, r1, c0, c1, cnt);
            if (cnt && first < 0) first = kt;
            if (cnt) last = kt;
            const int kind = fa_sched_tile_kind(&s, r0, r1, c0, c1);
            const int want = cnt == 0 ? FA_TILE_EMPTY : cnt == (r1 - r0) * (c1 - c0) ? FA_TILE_FULL : FA_TILE_PARTIAL;
            CHECK(kind == want, "%s, tiles %lldx%lld: pair (%lld, %lld) kind %d, want %d", d, (long long)bq,
                     (long long)bk, (long long)t, (long long)kt, kind, want);
        }
        /* the computed key tiles are exactly those holding a visible element: one run */
        for (int64_t kt = first; kt >= 0 && kt <= last; kt++) {
            int64_t cnt;
            COUNT(r0, r1, kt * bk, kt * bk + bk < m.sk ? kt * bk + bk : m.sk, cnt);
            CHECK(cnt > 0, "%s: query tile %lld's visible key tiles are not one run", d, (long long)t);
        }
        const int64_t w0 = first < 0 ? 0 : first, w1 = first < 0 ? 0 : last + 1;
        CHECK(kt0 == w0 && kt1 == w1, "%s, tiles %lldx%lld: query tile %lld visits [%lld, %lld), want [%lld, %lld)", d,
                 (long long)bq, (long long)bk, (long long)t, (long long)kt0, (long long)kt1, (long long)w0,
                 (long long)w1);
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        const int64_t c0 = kt * bk, c1 = c0 + bk < m.sk ? c0 + bk : m.sk;
        int64_t qt0, qt1, first = -1, last = -2;
        fa_sched_query_tiles(&s, bq, bk, kt, &qt0, &qt1);
        for (int64_t t = 0; t < nq; t++) {
            int64_t cnt;
            COUNT(t * bq, t * bq + bq < m.sq ? t * bq + bq : m.sq, c0, c1, cnt);
            if (cnt && first < 0) first = t;
            if (cnt) last = t;
        }
        const int none = first < 0;
        CHECK(none ? qt0 == qt1 : qt0 == first && qt1 == last + 1,
                 "%s, tiles %lldx%lld: key tile %lld is visited by [%lld, %lld), want [%lld, %lld)", d, (long long)bq,
                 (long long)bk, (long long)kt, (long long)qt0, (long long)qt1, (long long)first, (long long)last + 1);
    }
    int64_t live0, live1, first = -1, last = -2; /* the rows that see some key: one run */
    fa_sched_live_rows(&s, &live0, &live1);
    for (int64_t i = 0; i < m.sq; i++) {
        int64_t cnt;
        COUNT(i, i + 1, 0, m.sk, cnt);
        if (cnt && first < 0) first = i;
        if (cnt) last = i;
        CHECK(!(cnt == 0 && first >= 0 && i < last), "%s: row %lld sees nothing between rows that see keys", d,
                 (long long)i);
    }
    CHECK(first < 0 ? live0 == live1 : live0 == first && live1 == last + 1, "%s: live rows [%lld, %lld), want [%lld, %lld)",
             d, (long long)live0, (long long)live1, (long long)first, (long long)last + 1);
    for (int r = 0; r < 8; r++) { /* kinds and pairs of any rectangle */
        int64_t r0 = tu_int(&rng, 0, m.sq - 1), r1 = tu_int(&rng, r0 + 1, m.sq);
        int64_t c0 = tu_int(&rng, 0, m.sk - 1), c1 = tu_int(&rng, c0 + 1, m.sk), cnt, rows;
        COUNT(r0, r1, c0, c1, cnt);
        const int want = cnt == 0 ? FA_TILE_EMPTY : cnt == (r1 - r0) * (c1 - c0) ? FA_TILE_FULL : FA_TILE_PARTIAL;
        CHECK(fa_sched_tile_kind(&s, r0, r1, c0, c1) == want, "%s: rows [%lld, %lld) keys [%lld, %lld) kind", d,
                 (long long)r0, (long long)r1, (long long)c0, (long long)c1);
        COUNT(r0, r1, 0, m.sk, rows);
        CHECK(fa_sched_pairs(&s, r0, r1) == rows, "%s: rows [%lld, %lld) pairs %lld, want %lld", d, (long long)r0,
                 (long long)r1, (long long)fa_sched_pairs(&s, r0, r1), (long long)rows);
    }
#undef COUNT
}

/* Row by row, sequence b's schedule as the plan builds it against the docs' masks for a
 * problem of sq rows and sk keys (off: the docs' per-sequence rule). Returns its pairs. */
static wide check_sequence(const fa_sched *s, const fa_problem *p, int64_t sq, int64_t sk, const char *what,
                           int64_t b) {
    masks m = {sq, sk, p->has_diag_offset ? p->diag_offset : sk - sq, p->causal, p->window_left, p->window_right};
    CHECK(s->seq_q == sq && s->seq_k == sk && s->off == m.off, "%s sequence %lld: schedule Sq %lld Sk %lld off %lld, "
             "want %lld %lld %lld", what, (long long)b, (long long)s->seq_q, (long long)s->seq_k, (long long)s->off,
             (long long)sq, (long long)sk, (long long)m.off);
    if (sq > 0 && sk > 0)
        for (int64_t i = 0; i < sq; i++) check_row(&m, i);
    return ref_pairs(&m, 0, sq);
}

static void random_masks(fa_problem *p) {
    p->causal = (int)tu_int(&rng, 0, 1);
    p->window_left = any_window(), p->window_right = any_window();
    if (tu_int(&rng, 0, 2) == 0) {
        const int64_t d[] = {0, 3, -3, INT32_MAX, -INT32_MAX};
        p->has_diag_offset = 1, p->diag_offset = pick(d, 5);
    }
    tu_keep_aligned_diag(p);
}

/* The plan of p (NULL, counted as a failure, if it is refused). */
static fa_plan *plan_of(const fa_problem *p, const char *what) {
    fa_plan *pl = NULL;
    const fa_status st = fa_plan_create(p, NULL, &pl);
    CHECK(st == FA_OK, "%s plan: %s", what, fa_last_error());
    return st ? NULL : pl;
}

/* The plan's flops_useful is 2 (D + Dv) x the brute force's visible pairs (one head of D =
 * Dv = 8 here); then the plan goes. */
static void check_useful(fa_plan *pl, wide pairs, const char *what) {
    fa_cost c;
    fa_plan_cost(pl, FA_FORWARD, &c);
    CHECK(c.flops_useful == pairs * 2 * 16, "%s flops_useful %lld, want %lld", what, (long long)c.flops_useful,
             (long long)(pairs * 32));
    fa_plan_destroy(pl);
}

/* Packed batches, empty sequences among them. */
static void random_varlen(void) {
    fa_problem p;
    fa_problem_init(&p);
    int32_t cq[7] = {0}, ck[7] = {0};
    const int64_t B = tu_int(&rng, 1, 6);
    for (int64_t b = 0; b < B; b++) {
        cq[b + 1] = cq[b] + (int32_t)(tu_int(&rng, 0, 3) ? tu_int(&rng, 0, 30) : 0);
        ck[b + 1] = ck[b] + (int32_t)(tu_int(&rng, 0, 3) ? tu_int(&rng, 0, 30) : 0);
    }
    if (!cq[B]) cq[B] = 1;
    if (!ck[B]) ck[B] = 1;
    p.batch = B, p.heads_q = p.heads_kv = 1, p.head_dim = p.head_dim_v = 8;
    p.seq_q = cq[B], p.seq_k = ck[B], p.cu_seqlens_q = cq, p.cu_seqlens_k = ck;
    random_masks(&p);
    fa_plan *pl = plan_of(&p, "varlen");
    if (!pl) return;
    wide pairs = 0;
    for (int64_t b = 0; b < B; b++) {
        fa_plan sub;
        fa_varlen_subplan(pl, b, &sub);
        const fa_sched s = fa_plan_sched(&sub);
        pairs += check_sequence(&s, &p, cq[b + 1] - cq[b], ck[b + 1] - ck[b], "varlen", b);
    }
    check_useful(pl, pairs, "varlen");
}

/* Decoding: each sequence's cache plus new keys; windows near INT64_MAX included (the span
 * once overflowed there). */
static void random_decode(void) {
    fa_problem p;
    fa_problem_init(&p);
    int32_t lens[6];
    const int64_t B = tu_int(&rng, 1, 6), cap = 48;
    p.batch = B, p.heads_q = p.heads_kv = 1, p.head_dim = p.head_dim_v = 8, p.seq_q = tu_int(&rng, 1, 4);
    p.has_new_kv = (int)tu_int(&rng, 0, 1), p.seq_k = cap;
    for (int64_t b = 0; b < B; b++) lens[b] = (int32_t)tu_int(&rng, 0, cap - (p.has_new_kv ? p.seq_q : 0));
    p.cache_seqlens = lens;
    random_masks(&p);
    fa_plan *pl = plan_of(&p, "decode");
    if (!pl) return;
    wide pairs = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t sk = lens[b] + (p.has_new_kv ? p.seq_q : 0);
        const fa_sched s = fa_decode_sched(pl, b);
        pairs += check_sequence(&s, &p, p.seq_q, sk, "decode", b);
        int64_t lo, hi, wlo = sk, whi = -1; /* the keys some row sees, by the brute force */
        masks m = {p.seq_q, sk, p.has_diag_offset ? p.diag_offset : sk - p.seq_q, p.causal, p.window_left, p.window_right};
        for (int64_t i = 0; i < p.seq_q; i++)
            for (int64_t j = 0; j < sk; j++)
                if (ref_visible(&m, i, j)) wlo = j < wlo ? j : wlo, whi = j > whi ? j : whi;
        fa_decode_key_span(pl, b, &lo, &hi);
        CHECK(whi < 0 ? lo > hi : lo == wlo && hi == whi, "decode sequence %lld: key span [%lld, %lld], want [%lld, %lld]",
                 (long long)b, (long long)lo, (long long)hi, (long long)wlo, (long long)whi);
    }
    check_useful(pl, pairs, "decode");
}

int main(void) {
    seed = tu_seed(), rng = seed;
    printf("test_schedule: FA_TEST_SEED=%llu\n", (unsigned long long)seed);
    const int cases = tu_check_cases() ? tu_check_cases() : 20000;
    for (int i = 0; i < cases && failures < 10; i++) random_extreme();
    printf("%s rows: %d extreme cases, intervals key by key at every edge\n", failures ? "FAIL" : "PASS", cases);
    const int f0 = failures;
    for (int i = 0; i < cases && failures < 10; i++) random_tiles();
    printf("%s tiles: %d small shapes, key tiles, query tiles, kinds and pairs against the element matrix\n",
           failures > f0 ? "FAIL" : "PASS", cases);
    const int f1 = failures;
    for (int i = 0; i < cases / 10 && failures < 10; i++) random_varlen(), random_decode();
    printf("%s plans: %d packed and %d decode plans, sequence by sequence\n", failures > f1 ? "FAIL" : "PASS",
           cases / 10, cases / 10);
    if (failures) printf("test_schedule: %d FAILED (FA_TEST_SEED=%llu)\n", failures, (unsigned long long)seed);
    return failures ? 1 : 0;
}
