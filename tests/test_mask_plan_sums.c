/* A masked plan's figures that no kernel counts, against their definitions element by
 * element: flops_useful (the visible pairs: the mask's dense array AND causal and window,
 * docs/masks.md) and min_bytes (the q rows and k/v rows an ideal kernel reads: per mask
 * block that is not empty and shows causal and window some pair, the keys some of its rows
 * see and the rows that see some of its keys; per key block the most any of its blocks
 * reaches, likewise per query block; k/v rows per (batch, kv head) the most any of its
 * query heads needs). Random masks of every constructor, broadcast or per batch item and
 * head, GQA, offsets, windows and block edges; the cost model sums these over the blocks
 * once per plan (src/cost_mask.c), this test per element. */
#include "check.h"

typedef struct {
    int causal;
    int64_t off, wl, wr, sq, sk;
} vis_rule;

static int sees(const vis_rule *v, int64_t i, int64_t j) {
    const int64_t d = i + v->off;
    return (!v->causal || j <= d) && (v->wl < 0 || j >= d - v->wl) && (v->wr < 0 || j <= d + v->wr);
}

/* Keys of block (qb, kb) that some of its rows see, and rows that see some of its keys. */
static void reach(const vis_rule *v, int64_t bq, int64_t bk, int64_t qb, int64_t kb, int64_t *keys, int64_t *rows) {
    const int64_t r1 = qb * bq + bq < v->sq ? qb * bq + bq : v->sq, c1 = kb * bk + bk < v->sk ? kb * bk + bk : v->sk;
    *keys = *rows = 0;
    for (int64_t j = kb * bk; j < c1; j++) {
        int any = 0;
        for (int64_t i = qb * bq; i < r1 && !any; i++) any = sees(v, i, j);
        *keys += any;
    }
    for (int64_t i = qb * bq; i < r1; i++) {
        int any = 0;
        for (int64_t j = kb * bk; j < c1 && !any; j++) any = sees(v, i, j);
        *rows += any;
    }
}

/* The sum over n lines (line x at x * line) of the largest of its len entries (step apart). */
static int64_t sum_of_most(const int64_t *a, int64_t n, int64_t len, int64_t line, int64_t step) {
    int64_t total = 0;
    for (int64_t x = 0; x < n; x++) {
        int64_t most = 0;
        for (int64_t y = 0; y < len; y++) most = a[x * line + y * step] > most ? a[x * line + y * step] : most;
        total += most;
    }
    return total;
}

static int fn_pred(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    (void)ctx;
    return (i * 7 + j * 3 + b + 2 * h) % 5 < 2 || j == i;
}

static fa_mask *random_mask(uint64_t *r, const fa_mask_shape *s, int64_t off) {
    fa_mask *m = NULL, *a = NULL, *b = NULL;
    switch (tu_int(r, 0, 5)) {
    case 0: fa_mask_causal(s, off, &m); break;
    case 1: fa_mask_window(s, off, tu_int(r, 0, 40), tu_int(r, -1, 30), &m); break;
    case 2: fa_mask_chunked(s, off, tu_int(r, 1, 90), &m); break;
    case 3: fa_mask_from_fn(s, fn_pred, NULL, &m); break;
    case 4: {
        const int64_t n = s->batch * s->heads * s->seq_q * s->seq_k, dens = tu_int(r, 0, 4);
        uint8_t *x = tu_alloc((size_t)n);
        for (int64_t e = 0; e < n; e++) x[e] = tu_int(r, 0, 3) < dens;
        fa_mask_from_dense(s, x, &m);
        free(x);
        break;
    }
    default:
        fa_mask_causal(s, off, &a), fa_mask_chunked(s, off, tu_int(r, 1, 60), &b);
        if (a && b) (tu_int(r, 0, 1) ? fa_mask_and : fa_mask_or)(a, b, &m);
        fa_mask_destroy(a), fa_mask_destroy(b);
    }
    CHECK(m != NULL, "building a mask: %s", fa_last_error());
    return m;
}

static void one_case(uint64_t *r, int c) {
    const int64_t B = tu_int(r, 1, 3), Hk = tu_int(r, 1, 2), Hq = Hk * tu_int(r, 1, 3);
    const int64_t Sq = tu_int(r, 1, 260), Sk = tu_int(r, 0, 2) ? tu_int(r, 1, 260) : Sq;
    const int64_t edges[] = {0, 8, 16, 48, 64, 128};
    const fa_mask_shape s = {tu_int(r, 0, 1) ? B : 1, tu_int(r, 0, 1) ? Hq : 1, Sq, Sk, edges[tu_int(r, 0, 5)],
                             edges[tu_int(r, 0, 5)]};
    fa_mask *m = random_mask(r, &s, tu_int(r, 0, 1) ? Sk - Sq : tu_int(r, -20, 20));
    if (!m) return;
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hk, p.seq_q = Sq, p.seq_k = Sk, p.mask = m;
    p.head_dim = 16 * tu_int(r, 1, 4), p.head_dim_v = tu_int(r, 0, 1) ? p.head_dim : 24;
    p.dtype = tu_int(r, 0, 1) ? FA_BF16 : FA_F32;
    p.causal = (int)tu_int(r, 0, 1);
    if (tu_int(r, 0, 2) == 0) p.window_left = tu_int(r, 0, 80), p.window_right = tu_int(r, -1, 40);
    if (tu_int(r, 0, 2) == 0) p.has_diag_offset = 1, p.diag_offset = tu_int(r, -30, 30);
    tu_keep_aligned_diag(&p);
    fa_options o = {0};
    o.backend = FA_BACKEND_CPU;
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(&p, &o, &pl) == FA_OK, "case %d: plan: %s", c, fa_last_error());
    if (!pl) {
        fa_mask_destroy(m);
        return;
    }
    fa_cost f, b;
    fa_plan_cost(pl, FA_FORWARD, &f), fa_plan_cost(pl, FA_BACKWARD, &b);

    const vis_rule v = {p.causal, p.has_diag_offset ? p.diag_offset : Sk - Sq, p.window_left, p.window_right, Sq, Sk};
    const int64_t bq = s.block_q ? s.block_q : 128, bk = s.block_k ? s.block_k : 128;
    const int64_t nqb = (Sq + bq - 1) / bq, nkb = (Sk + bk - 1) / bk;
    uint8_t *dense = tu_alloc((size_t)(s.batch * s.heads * Sq * Sk));
    fa_mask_to_dense(m, dense);
    int64_t pairs = 0, q_rows = 0, kv_rows = 0;
    int64_t *keys_of = tu_alloc(sizeof(int64_t) * (size_t)Hq); /* per query head of batch item bi */
    int64_t *reached = tu_alloc(sizeof(int64_t) * (size_t)(2 * nqb * nkb));
    for (int64_t bi = 0; bi < B; bi++) {
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t mb = s.batch == 1 ? 0 : bi, mh = s.heads == 1 ? 0 : h;
            const uint8_t *at = dense + (mb * s.heads + mh) * Sq * Sk;
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t j = 0; j < Sk; j++) pairs += at[i * Sk + j] && sees(&v, i, j);
            for (int64_t qb = 0; qb < nqb; qb++) /* each block's reach: keys, rows (0, 0 where it is empty) */
                for (int64_t kb = 0; kb < nkb; kb++) {
                    int64_t *kr = reached + 2 * (qb * nkb + kb);
                    kr[0] = kr[1] = 0;
                    if (fa_mask_block(m, mb, mh, qb, kb) != FA_BLOCK_EMPTY) reach(&v, bq, bk, qb, kb, kr, kr + 1);
                }
            /* per key block the most keys any of its blocks reaches; per query block the most rows */
            const int64_t keys = sum_of_most(reached, nkb, nqb, 2, 2 * nkb);
            const int64_t rows = sum_of_most(reached + 1, nqb, nkb, 2 * nkb, 2);
            q_rows += rows, keys_of[h] = keys;
        }
        for (int64_t hk = 0; hk < Hk; hk++) {
            int64_t most = 0;
            for (int64_t h = hk * (Hq / Hk); h < (hk + 1) * (Hq / Hk); h++) most = keys_of[h] > most ? keys_of[h] : most;
            kv_rows += most;
        }
    }
    const int64_t es = (int64_t)fa_dtype_size(p.dtype), D = p.head_dim, Dv = p.head_dim_v;
    const int64_t fwd_min = q_rows * D * es + kv_rows * (D + Dv) * es + B * Hq * Sq * (Dv * es + 4);
    const int64_t bwd_min = q_rows * ((D + 2 * Dv) * es + 4) + kv_rows * (D + Dv) * es +
                            B * Hq * Sq * D * es + B * Hk * Sk * (D + Dv) * es;
    CHECK(f.flops_useful == pairs * 2 * (D + Dv) && b.flops_useful == pairs * 2 * (3 * D + 2 * Dv),
          "case %d: flops_useful %lld / %lld, %lld visible pairs", c, (long long)f.flops_useful, (long long)b.flops_useful,
          (long long)pairs);
    CHECK(f.min_bytes == fwd_min && b.min_bytes == bwd_min,
          "case %d: min_bytes %lld / %lld, defined %lld / %lld (q rows %lld, kv rows %lld; B %lld Hq %lld Hk %lld Sq %lld "
          "Sk %lld, mask [%lld %lld] blocks %lld x %lld)",
          c, (long long)f.min_bytes, (long long)b.min_bytes, (long long)fwd_min, (long long)bwd_min, (long long)q_rows,
          (long long)kv_rows, (long long)B, (long long)Hq, (long long)Hk, (long long)Sq, (long long)Sk,
          (long long)s.batch, (long long)s.heads, (long long)bq, (long long)bk);
    free(keys_of), free(reached), free(dense);
    fa_plan_destroy(pl);
    fa_mask_destroy(m);
}

int main(void) {
    uint64_t r = check_seed("test_mask_plan_sums");
    const int cases = tu_check_cases() ? tu_check_cases() : 400;
    for (int c = 0; c < cases; c++) one_case(&r, c);
    return check_finish("test_mask_plan_sums");
}
