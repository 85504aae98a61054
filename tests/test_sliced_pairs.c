/* The forward's sliced pairs (src/schedule_mask.h, fa_sched_mask_slice_keys; the ragged
 * products of src/cpu/isa.h, gemm_abt_rows): where the ISA has them (amx, avx512bf16), each
 * slice of 32 rows of a pair computes only the keys up to the last one its rows see, so that
 * a diagonal pair's first rows skip the keys of its last. Checked, on random chunked, document,
 * prefix-LM and causal masks, random block bitmaps, and the problem's own causal without a mask
 * (Sq != Sk for some), in every dtype:
 *   - the plan's forward flops and transcendentals against the elements counted from the
 *     dense mask itself, per element (elements()), and the forward's counts against the plan;
 *   - o and lse against the float64 reference (outputs poisoned first);
 *   - o and lse bit for bit against tiles of 32, 48, 70 or 96 rows (one slice per pair, or
 *     a last slice cut short; every row sees the same key tiles in the same order), here
 *     with sinks and dropout in some cases.
 * Elsewhere pairs run whole and the count is the whole pairs'. FA_TEST_SEED replays a run,
 * FA_CHECK_CASES=N runs N cases. */
#include "check.h"
#include "ref/ref.h"

#include <string.h>

#define SLICE 32 /* rows per slice (FA_FWD_SLICE) and the key step (FA_SCHED_TRIM) */

static int64_t up32(int64_t x) { return (x + SLICE - 1) / SLICE * SLICE; }

/* The last key in [c0, c1) that a row of [a, b) sees in att [Sq, Sk] (-1: none). */
static int64_t last_seen(const uint8_t *att, int64_t sk, int64_t a, int64_t b, int64_t c0, int64_t c1) {
    int64_t last = -1;
    for (int64_t i = a; i < b; i++)
        for (int64_t j = c1 - 1; j > last && j >= c0; j--)
            if (att[i * sk + j]) last = j;
    return last;
}

/* The elements one (b, h) computes under tiles of bq x bk, and the rows that compute some
 * in a pair (one rescale each), from the mask's elements: a pair with a visible element
 * computes its keys from the 32-key step holding the first visible one to the end of the
 * step holding the last (whole_span: the whole key tile, as without a mask); with slices, the rows of each 32 compute the keys of that span up
 * to the end of the 32-key step holding the last one they see (none: no work). This is the
 * plan's rule where the tiles hold whole mask blocks and nothing but the mask hides keys. */
static void elements(const uint8_t *att, int64_t sq, int64_t sk, int64_t bq, int64_t bk, int sliced, int whole_span,
                     int64_t *rows_keys, int64_t *rows_tiles) {
    *rows_keys = *rows_tiles = 0;
    for (int64_t r0 = 0; r0 < sq; r0 += bq) {
        const int64_t r1 = r0 + bq < sq ? r0 + bq : sq;
        for (int64_t c0 = 0; c0 < sk; c0 += bk) {
            const int64_t c1 = c0 + bk < sk ? c0 + bk : sk;
            int64_t first = c1;
            for (int64_t i = r0; i < r1; i++)
                for (int64_t j = c0; j < first; j++)
                    if (att[i * sk + j]) first = j;
            const int64_t last = last_seen(att, sk, r0, r1, c0, c1);
            if (last < 0) continue;
            const int64_t jf = whole_span ? c0 : c0 + (first - c0) / SLICE * SLICE;
            const int64_t end = whole_span || up32(last + 1 - c0) > c1 - c0 ? c1 - c0 : up32(last + 1 - c0);
            const int64_t nt = c0 + end - jf;
            for (int64_t a = r0; a < r1; a += sliced ? SLICE : bq) {
                const int64_t b = a + (sliced ? SLICE : bq) < r1 ? a + (sliced ? SLICE : bq) : r1;
                const int64_t l = sliced ? last_seen(att, sk, a, b, jf, jf + nt) : jf + nt - 1;
                const int64_t ns = l < 0 ? 0 : up32(l + 1 - jf) < nt ? up32(l + 1 - jf) : nt;
                *rows_keys += (b - a) * ns;
                *rows_tiles += ns ? b - a : 0;
            }
        }
    }
}

/* A random mask of one of the kinds, blocks of `blk` (a divisor of the tiles). */
static fa_mask *random_mask(uint64_t *r, int64_t sq, int64_t sk, int64_t blk, char *what, size_t cap) {
    fa_mask_shape s = {1, 1, sq, sk, blk, blk};
    fa_mask *m = NULL;
    fa_status st = FA_OK;
    const int kind = (int)tu_int(r, 0, 4);
    if (kind == 0) {
        const int64_t c = tu_int(r, 20, 300);
        snprintf(what, cap, "chunked(%lld)", (long long)c);
        st = fa_mask_chunked(&s, sk - sq, c, &m);
    } else if (kind == 1 && sq == sk) {
        int64_t lens[12], counts[1] = {tu_int(r, 1, 12)}, left = sq - counts[0]; /* each at least 1 */
        for (int64_t d = 0; d < counts[0]; d++) {
            const int64_t extra = d + 1 < counts[0] ? tu_int(r, 0, left / 2) : left;
            lens[d] = 1 + extra, left -= extra;
        }
        snprintf(what, cap, "%lld documents", (long long)counts[0]);
        st = fa_mask_documents(&s, counts, lens, &m);
    } else if (kind == 2) {
        int64_t prefix[1] = {tu_int(r, 0, sk)};
        snprintf(what, cap, "prefix_lm(%lld)", (long long)prefix[0]);
        st = fa_mask_prefix_lm(&s, sk - sq, prefix, &m);
    } else if (kind == 3) {
        const int64_t off = tu_int(r, -100, 100);
        snprintf(what, cap, "causal(diag offset %lld)", (long long)off);
        st = fa_mask_causal(&s, off, &m);
    } else { /* per block: empty, full, or random at a density, under a causal edge */
        uint8_t *a = tu_alloc((size_t)(sq * sk));
        for (int64_t qb = 0; qb * blk < sq; qb++)
            for (int64_t kb = 0; kb * blk < sk; kb++) {
                const int form = (int)tu_int(r, 0, 3);
                const double density = tu_uniform(r);
                for (int64_t i = qb * blk; i < sq && i < (qb + 1) * blk; i++)
                    for (int64_t j = kb * blk; j < sk && j < (kb + 1) * blk; j++)
                        a[i * sk + j] =
                            (uint8_t)(j <= i + sk - sq && (form == 1 || (form >= 2 && tu_uniform(r) < density)));
            }
        snprintf(what, cap, "random blocks");
        st = fa_mask_from_dense(&s, a, &m);
        free(a);
    }
    CHECK(st == FA_OK, "%s: %s", what, fa_last_error());
    return m;
}

/* One forward under tiles bq x bk: o and lse, its counts against the plan's and the
 * plan's against elements(). */
static int run(const fa_problem *p, const fa_forward_args *args, const uint8_t *att, int64_t bq, int64_t bk, int sliced,
               int64_t blk, void *o, float *lse, const char *label) {
    fa_plan *pl = check_plan(p, 2, bq, bk);
    if (!pl) return 1;
    fa_forward_args a = *args;
    a.o = o, a.lse = lse;
    const int64_t no = p->batch * p->heads_q * p->seq_q;
    tu_poison(p->dtype, o, no * p->head_dim_v), tu_poison(FA_F32, lse, no);
    fa_counts cnt = {-1, -1};
    a.counts = &cnt;
    const fa_status st = fa_forward(pl, &a);
    CHECK(st == FA_OK, "%s: fa_forward: %s", label, fa_last_error());
    fa_cost c;
    fa_plan_cost(pl, FA_FORWARD, &c);
    CHECK(cnt.flops == c.flops && cnt.transcendentals == c.transcendentals,
          "%s, tiles %lld x %lld: counts %lld flops %lld trans, plan %lld %lld", label, (long long)bq, (long long)bk,
          (long long)cnt.flops, (long long)cnt.transcendentals, (long long)c.flops, (long long)c.transcendentals);
    int64_t rk, rt;
    if (bq % blk) { /* mask blocks taller than the tiles: their spans reach past a tile's rows */
        fa_plan_destroy(pl);
        return st != FA_OK;
    }
    elements(att, p->seq_q, p->seq_k, bq, bk, sliced, !p->mask, &rk, &rt);
    const int64_t heads = p->batch * p->heads_q;
    const int64_t flops = heads * rk * 2 * (p->head_dim + p->head_dim_v);
    const int64_t trans = heads * (rk + rt + p->seq_q * (1 + p->has_sinks));
    CHECK(c.flops == flops && c.transcendentals == trans,
          "%s, tiles %lld x %lld (%s): plan %lld flops %lld trans, per element %lld %lld", label, (long long)bq,
          (long long)bk, sliced ? "sliced" : "whole pairs", (long long)c.flops, (long long)c.transcendentals,
          (long long)flops, (long long)trans);
    fa_plan_destroy(pl);
    return st != FA_OK;
}

static void one_case(uint64_t *r, int idx, int sliced) {
    static const fa_dtype dts[] = {FA_F32, FA_F16, FA_BF16};
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_kv = 1, p.heads_q = tu_int(r, 1, 2);
    p.seq_q = tu_int(r, 100, 700), p.seq_k = tu_int(r, 0, 1) ? p.seq_q : tu_int(r, 100, 700);
    p.head_dim = tu_int(r, 0, 1) ? 32 : 64, p.head_dim_v = tu_int(r, 0, 2) ? p.head_dim : 72;
    p.dtype = dts[tu_int(r, 0, 2)];
    const int64_t blk = tu_int(r, 0, 1) ? 32 : 64, bk = tu_int(r, 0, 1) ? 128 : 256;
    char what[64], label[256];
    fa_mask *m = NULL;
    if (tu_int(r, 0, 5) == 0) { /* no mask object: the problem's causal (whole key tiles per pair) */
        p.causal = 1, p.has_diag_offset = 1, p.diag_offset = tu_int(r, -100, 100);
        snprintf(what, sizeof what, "the problem's causal (diag offset %lld)", (long long)p.diag_offset);
    } else {
        m = random_mask(r, p.seq_q, p.seq_k, blk, what, sizeof what);
        if (!m) return;
        p.mask = m;
    }
    const int extras = (int)tu_int(r, 0, 3); /* 1: sinks, 2: dropout (bit-identity only), 3: both */
    p.has_sinks = extras & 1;
    if (extras & 2) p.dropout_p = 0.25f, p.dropout_seed = tu_next(r);
    snprintf(label, sizeof label, "#%d %s %s Hq%lld Sq%lld Sk%lld D%lld Dv%lld mask blocks %lld, sinks %d dropout %g",
             idx, what, fa_dtype_name(p.dtype), (long long)p.heads_q, (long long)p.seq_q, (long long)p.seq_k,
             (long long)p.head_dim, (long long)p.head_dim_v, (long long)blk, p.has_sinks, (double)p.dropout_p);
    const int64_t H = p.heads_q, nq = H * p.seq_q * p.head_dim, nk = p.seq_k * p.head_dim, nv = p.seq_k * p.head_dim_v;
    const int64_t no = H * p.seq_q * p.head_dim_v, rows = H * p.seq_q;
    void *q = tu_alloc((size_t)nq * 4), *k = tu_alloc((size_t)nk * 4), *v = tu_alloc((size_t)nv * 4);
    void *o1 = tu_alloc((size_t)no * 4), *o2 = tu_alloc((size_t)no * 4);
    float *l1 = tu_alloc(sizeof(float) * (size_t)rows), *l2 = tu_alloc(sizeof(float) * (size_t)rows);
    float sinks[2] = {(float)tu_uniform(r) * 4 - 2, (float)tu_uniform(r) * 4 - 2};
    uint8_t *att = tu_alloc((size_t)(p.seq_q * p.seq_k));
    tu_fill(r, p.dtype, q, nq, 2.0), tu_fill(r, p.dtype, k, nk, 2.0), tu_fill(r, p.dtype, v, nv, 1.0);
    if (m) CHECK(fa_mask_to_dense(m, att) == FA_OK, "to_dense: %s", fa_last_error());
    else /* per element, docs/semantics.md: key j visible to row i where j <= i + diag_offset */
        for (int64_t i = 0; i < p.seq_q; i++)
            for (int64_t j = 0; j < p.seq_k; j++) att[i * p.seq_k + j] = (uint8_t)(j <= i + p.diag_offset);
    fa_forward_args a = {0};
    a.q = q, a.k = k, a.v = v;
    if (p.has_sinks) a.sinks = sinks;
    int bad = run(&p, &a, att, 128, bk, sliced, blk, o1, l1, label);
    static const int64_t other_bq[] = {32, 48, 70, 96}; /* a slice per pair, or slices cut short */
    const int64_t bq2 = other_bq[tu_int(r, 0, 3)];
    bad |= run(&p, &a, att, bq2, bk, sliced, blk, o2, l2, label);
    if (!bad) {
        const size_t esz = fa_dtype_size(p.dtype);
        CHECK(memcmp(o1, o2, (size_t)no * esz) == 0 && memcmp(l1, l2, sizeof(float) * (size_t)rows) == 0,
              "%s: o or lse differ between tiles of 128 and %lld rows (bk %lld)", label, (long long)bq2, (long long)bk);
    }
    if (!bad && p.dropout_p == 0.0f) { /* against the reference */
        int64_t att_h = p.seq_q * p.seq_k;
        uint8_t *att_all = tu_alloc((size_t)(H * att_h));
        for (int64_t h = 0; h < H; h++) memcpy(att_all + h * att_h, att, (size_t)att_h);
        double *ro = tu_alloc(sizeof(double) * (size_t)no), *rl = tu_alloc(sizeof(double) * (size_t)rows);
        fa_ref_attend(att_all);
        fa_ref_forward(&p, &a, ro, rl);
        fa_ref_attend(NULL);
        double max_lse = 0;
        for (int64_t x = 0; x < rows; x++)
            if (isfinite(rl[x]) && fabs(rl[x]) > max_lse) max_lse = fabs(rl[x]);
        const fa_strides dense = {{0, 0, 0, 0}};
        const int64_t od[4] = {1, H, p.seq_q, p.head_dim_v}, ld[4] = {1, H, p.seq_q, 1};
        const int before = failures;
        check_tensor("o", p.dtype, o1, &dense, ro, od, check_tol_scores(p.dtype, max_lse), NULL, 0);
        check_tensor("lse", FA_F32, l1, &dense, rl, ld, CHECK_TOL_LSE, NULL, 1);
        if (failures > before) printf("  in %s\n", label);
        free(att_all), free(ro), free(rl);
    }
    if (m) fa_mask_destroy(m);
    free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2), free(att);
}

int main(void) {
    uint64_t r = check_seed("test_sliced_pairs");
    /* the tables with gemm_abt_rows */
    const int sliced = strcmp(fa_cpu_isa(), "amx") == 0 || strcmp(fa_cpu_isa(), "avx512bf16") == 0;
    const int n = tu_check_cases() ? tu_check_cases() : 40;
    printf("isa %s: %s\n", fa_cpu_isa(), sliced ? "pairs in slices of 32 rows" : "whole pairs");
    for (int i = 0; i < n; i++) one_case(&r, i, sliced);
    return check_finish("test_sliced_pairs");
}
