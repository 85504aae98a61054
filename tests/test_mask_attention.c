/* Block-sparse masks (docs/masks.md) in the forward and the backward: random masks (every
 * constructor, dense bitmaps with empty rows, single elements and all-full blocks, given
 * blocks, AND and OR), broadcast or not over batch and heads, combined with the problem's
 * causal, window, segment ids, bias (and dbias), ALiBi and softcap, GQA, Sq != Sk, every
 * dtype, default and odd tiles; then the same bits for every thread count. Each case
 * compares o, lse and the gradients with the float64 reference, which is told the mask per
 * element (fa_ref_attend) from the test's own definitions (mask_defs.h), and the kernels'
 * counts with the plan to the unit (flops, transcendentals, both passes), and flops_useful
 * with a brute-force count of the visible pairs. FA_ISA and FA_BWD_SCHEDULE pick the kernels
 * and the backward's schedule; a fresh seed every run, FA_TEST_SEED replays one. */
#include "backward_check.h"
#include "mask_defs.h"

/* A random dense bitmap in blocks of bq x bk: blocks empty, full or random (a density per
 * block), then some rows emptied and a few single elements set. */
static void random_bitmap(uint64_t *r, uint8_t *a, int64_t n_slices, int64_t sq, int64_t sk, int64_t bq, int64_t bk) {
    for (int64_t x = 0; x < n_slices; x++) {
        uint8_t *s = a + x * sq * sk;
        for (int64_t qb = 0; qb * bq < sq; qb++)
            for (int64_t kb = 0; kb * bk < sk; kb++) {
                const int kind = (int)tu_int(r, 0, 3), density = (int)tu_int(r, 1, 7);
                for (int64_t i = qb * bq; i < sq && i < qb * bq + bq; i++)
                    for (int64_t j = kb * bk; j < sk && j < kb * bk + bk; j++)
                        s[i * sk + j] = (uint8_t)(kind == 0 ? 0 : kind == 1 ? 1 : (int)(tu_next(r) % 8) < density);
            }
        for (int64_t i = 0; i < sq; i++)
            if (tu_int(r, 0, 7) == 0) memset(s + i * sk, 0, (size_t)sk); /* a row that sees no key */
        for (int64_t t = tu_int(r, 0, 3); t > 0; t--) s[tu_int(r, 0, sq - 1) * sk + tu_int(r, 0, sk - 1)] = 1;
    }
}

/* A random mask of shape s, its elements in att [s.batch, s.heads, Sq, Sk]. */
static fa_mask *random_mask(uint64_t *r, const fa_mask_shape *s, uint8_t *att, int depth, char *what, size_t len) {
    const int64_t sq = s->seq_q, sk = s->seq_k, slices = s->batch * s->heads, n = slices * sq * sk;
    const int64_t bq = s->block_q ? s->block_q : 128, bk = s->block_k ? s->block_k : 128;
    int kind = (int)tu_int(r, 0, depth ? 6 : 9); /* nested: no further AND / OR */
    if (kind == 4 && sq != sk) kind = 3;   /* documents pack Sq == Sk */
    fa_mask *m = NULL;
    fa_status st = FA_OK;
    if (kind <= 4) { /* the constructors, against their definitions */
        int64_t prefix[4], counts[4], lens[4 * 200], at = 0;
        for (int64_t b = 0; b < s->batch; b++) {
            prefix[b] = tu_int(r, 0, sk);
            int64_t left = sq, k = 0;
            while (left > 0) {
                const int64_t l = tu_int(r, 1, left < 40 ? left : 40);
                lens[at++] = l, left -= l, k++;
            }
            counts[b] = k;
        }
        mask_def d = {kind, tu_int(r, -10, 10) + (tu_int(r, 0, 1) ? sk - sq : 0), tu_int(r, -1, 30), tu_int(r, -1, 30),
                      tu_int(r, 1, 50), prefix, counts, lens};
        if (kind == 4) d.off = 0;
        if (kind == 1 && d.left < 0 && d.right < 0) d.left = 7;
        switch (kind) {
        case 0: st = fa_mask_causal(s, d.off, &m); break;
        case 1: st = fa_mask_window(s, d.off, d.left, d.right, &m); break;
        case 2: st = fa_mask_chunked(s, d.off, d.chunk, &m); break;
        case 3: st = fa_mask_prefix_lm(s, d.off, prefix, &m); break;
        default: st = fa_mask_documents(s, counts, lens, &m); break;
        }
        for (int64_t b = 0; b < s->batch; b++)
            for (int64_t h = 0; h < s->heads; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < sk; j++) att[((b * s->heads + h) * sq + i) * sk + j] = (uint8_t)mask_def_attends(&d, b, i, j);
        static const char *names[] = {"causal", "window", "chunked", "prefix_lm", "documents"};
        snprintf(what, len, "%s(off %lld, l %lld, r %lld, chunk %lld)", names[kind], (long long)d.off, (long long)d.left,
                 (long long)d.right, (long long)d.chunk);
    } else if (kind <= 6) { /* a dense bitmap; as given blocks: every block partial or as its elements say */
        random_bitmap(r, att, slices, sq, sk, bq, bk);
        if (kind == 5) {
            st = fa_mask_from_dense(s, att, &m);
            snprintf(what, len, "dense bitmap");
        } else {
            const int64_t nqb = (sq + bq - 1) / bq, nkb = (sk + bk - 1) / bk;
            int8_t *kinds = tu_alloc((size_t)(slices * nqb * nkb));
            uint8_t *bits = tu_alloc((size_t)(slices * nqb * nkb * bq * bk));
            int64_t np = 0;
            for (int64_t x = 0; x < slices; x++)
                for (int64_t qb = 0; qb < nqb; qb++)
                    for (int64_t kb = 0; kb < nkb; kb++) {
                        int64_t on = 0, all = 0;
                        uint8_t *bm = bits + np * bq * bk;
                        memset(bm, 0, (size_t)(bq * bk));
                        for (int64_t i = qb * bq; i < sq && i < qb * bq + bq; i++)
                            for (int64_t j = kb * bk; j < sk && j < kb * bk + bk; j++, all++)
                                on += bm[(i - qb * bq) * bk + (j - kb * bk)] = att[(x * sq + i) * sk + j];
                        const int k = on == 0 && tu_int(r, 0, 1) ? FA_BLOCK_EMPTY : on == all && tu_int(r, 0, 1) ? FA_BLOCK_FULL
                                                                                                              : FA_BLOCK_PARTIAL;
                        kinds[(x * nqb + qb) * nkb + kb] = (int8_t)k;
                        np += k == FA_BLOCK_PARTIAL;
                    }
            st = fa_mask_from_blocks(s, kinds, bits, &m);
            free(kinds), free(bits);
            snprintf(what, len, "given blocks");
        }
    } else { /* AND / OR of two random masks (7: and, 8: or; 9: and, the second one broadcast) */
        fa_mask_shape s2 = *s;
        if (kind == 9) s2.batch = 1, s2.heads = 1;
        uint8_t *a = tu_alloc((size_t)n), *b = tu_alloc((size_t)(s2.batch * s2.heads * sq * sk));
        char wa[120], wb[120];
        fa_mask *ma = random_mask(r, s, a, 1, wa, sizeof wa), *mb = random_mask(r, &s2, b, 1, wb, sizeof wb);
        if (kind == 8) st = fa_mask_or(ma, mb, &m);
        else st = fa_mask_and(ma, mb, &m);
        for (int64_t x = 0; x < n; x++) {
            const int64_t e = x % (sq * sk), xb = s2.batch == 1 && s2.heads == 1 ? e : x;
            att[x] = (uint8_t)(kind == 8 ? a[x] || b[xb] : a[x] && b[xb]);
        }
        snprintf(what, len, "(%s) %s (%s)", wa, kind == 8 ? "|" : "&", wb);
        fa_mask_destroy(ma), fa_mask_destroy(mb);
        free(a), free(b);
    }
    CHECK(st == FA_OK && m, "%s: %s", what, fa_last_error());
    return m;
}

/* Pairs visible under the problem's causal and window and att ([B, Hq, Sq, Sk]). */
static int64_t visible_pairs(const fa_problem *p, const uint8_t *att) {
    const int64_t off = p->has_diag_offset ? p->diag_offset : p->seq_k - p->seq_q;
    int64_t n = 0;
    for (int64_t x = 0; x < p->batch * p->heads_q; x++)
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t j = 0; j < p->seq_k; j++) {
                int v = att[(x * p->seq_q + i) * p->seq_k + j] != 0;
                if (p->causal && j > i + off) v = 0;
                if (p->window_left >= 0 && i + off - j > p->window_left) v = 0;
                if (p->window_right >= 0 && j - (i + off) > p->window_right) v = 0;
                n += v;
            }
    return n;
}

static int check_case(tcase *cp, fa_mask *m, const uint8_t *att, const fa_mask_shape *msp, const fa_options *optp,
                      const char *what, int idx);

static int run_case(uint64_t *r, int idx) {
    static const fa_dtype dts[] = {FA_F32, FA_F16, FA_BF16};
    static const int64_t blocks[] = {0, 16, 32, 64, 24, 8};
    fa_problem p;
    fa_problem_init(&p);
    p.batch = tu_int(r, 1, 2), p.heads_kv = tu_int(r, 1, 2), p.heads_q = p.heads_kv * tu_int(r, 1, 2);
    p.seq_q = tu_int(r, 1, 150), p.seq_k = tu_int(r, 0, 2) ? p.seq_q : tu_int(r, 1, 150);
    static const int64_t dims[] = {16, 32, 40};
    p.head_dim = dims[tu_int(r, 0, 2)], p.head_dim_v = tu_int(r, 0, 3) ? p.head_dim : 24;
    p.dtype = dts[tu_int(r, 0, 2)];
    const int flags = (tu_int(r, 0, 2) == 0 ? M_CAUSAL : 0) | (tu_int(r, 0, 4) == 0 ? M_WINDOW : 0) |
                      (tu_int(r, 0, 3) == 0 ? M_SOFTCAP : 0) | (tu_int(r, 0, 5) == 0 ? M_SEG : 0) |
                      (tu_int(r, 0, 5) == 0 ? M_ALIBI : 0) | (tu_int(r, 0, 7) == 0 ? M_BIAS : 0);
    fa_mask_shape ms = {tu_int(r, 0, 1) ? p.batch : 1, tu_int(r, 0, 1) ? p.heads_q : 1, p.seq_q, p.seq_k,
                        blocks[tu_int(r, 0, 5)], blocks[tu_int(r, 0, 5)]};
    const int64_t sq = p.seq_q, sk = p.seq_k, B = p.batch, Hq = p.heads_q;
    uint8_t *att_m = tu_alloc((size_t)(ms.batch * ms.heads * sq * sk)), *att = tu_alloc((size_t)(B * Hq * sq * sk));
    char what[400];
    fa_mask *m = random_mask(r, &ms, att_m, 0, what, sizeof what);
    if (!m) {
        free(att_m), free(att);
        return 1;
    }
    for (int64_t b = 0; b < B; b++) /* the mask broadcast to [B, Hq, Sq, Sk] for the reference */
        for (int64_t h = 0; h < Hq; h++)
            memcpy(att + (b * Hq + h) * sq * sk,
                   att_m + ((ms.batch == 1 ? 0 : b) * ms.heads + (ms.heads == 1 ? 0 : h)) * sq * sk, (size_t)(sq * sk));
    tcase c;
    case_init(&c, &p, flags, r, 0);
    c.p.mask = m;
    fa_options opt = {FA_BACKEND_CPU, (int)tu_int(r, 1, 3), 0, 0};
    if (tu_int(r, 0, 2) == 0) opt.block_q = blocks[tu_int(r, 1, 5)], opt.block_k = blocks[tu_int(r, 1, 5)];
    const int bad = check_case(&c, m, att, &ms, &opt, what, idx);
    case_free(&c);
    free(att_m), free(att);
    return bad;
}

/* Case c (its mask m, given to the reference per element as att [B, Hq, Sq, Sk]) under
 * opt: the forward and backward against the reference, their counts against the plan. m
 * is released here (the plan keeps its own reference). 1 if it failed. */
static int check_case(tcase *cp, fa_mask *m, const uint8_t *att, const fa_mask_shape *msp, const fa_options *optp,
                      const char *what, int idx) {
    tcase c = *cp;
    const fa_problem p = c.p;
    const fa_mask_shape ms = *msp;
    const fa_options opt = *optp;
    const int64_t sq = p.seq_q, sk = p.seq_k, B = p.batch, Hq = p.heads_q;
    fa_plan *pl = NULL;
    fa_status st = fa_plan_create(&c.p, &opt, &pl);
    fa_mask_destroy(m); /* the plan keeps its own reference */
    char label[700];
    int64_t fbq = 0, fbk = 0, bbq = 0, bbk = 0;
    if (pl) fa_plan_blocks(pl, FA_FORWARD, &fbq, &fbk), fa_plan_blocks(pl, FA_BACKWARD, &bbq, &bbk);
    snprintf(label, sizeof label,
             "#%d %s B%lld Hq%lld Hk%lld Sq%lld Sk%lld D%lld Dv%lld causal %d window (%lld, %lld) softcap %g seg %d "
             "alibi %d bias %d off %s%lld; "
             "mask %s [%lld, %lld] blocks %lldx%lld; tiles fwd %lldx%lld bwd %lldx%lld",
             idx, fa_dtype_name(p.dtype), (long long)B, (long long)Hq, (long long)p.heads_kv, (long long)sq, (long long)sk,
             (long long)p.head_dim, (long long)p.head_dim_v, c.p.causal, (long long)c.p.window_left,
             (long long)c.p.window_right, (double)c.p.softcap, c.p.has_segment_ids, c.p.has_alibi, c.p.has_bias,
             c.p.has_diag_offset ? "" : "default ",
             (long long)c.p.diag_offset, what, (long long)ms.batch, (long long)ms.heads, (long long)ms.block_q,
             (long long)ms.block_k, (long long)fbq, (long long)fbk, (long long)bbq, (long long)bbk);
    CHECK(st == FA_OK, "%s: plan: %s", label, fa_last_error());
    int bad = failures;
    if (pl) {
        fa_ref_attend(att);
        /* the forward against the reference, its counts against the plan */
        const int64_t rows = B * Hq * sq, Dv = c.p.head_dim_v;
        const fa_problem *rp = fa_plan_problem(pl);
        double *ro = tu_alloc(sizeof(double) * (size_t)(rows * Dv)), *rl = tu_alloc(sizeof(double) * (size_t)rows);
        fa_forward_args fa = case_fwd_args(&c);
        fa_ref_forward(&c.p, &fa, ro, rl);
        tu_poison(c.p.dtype, c.o, c.no);
        for (int64_t x = 0; x < rows; x++) c.lse[x] = NAN;
        fa_counts cnt = {-1, -1};
        fa.counts = &cnt;
        st = fa_forward(pl, &fa);
        CHECK(st == FA_OK, "%s: forward: %s", label, fa_last_error());
        fa_cost fc, bc;
        fa_plan_cost(pl, FA_FORWARD, &fc), fa_plan_cost(pl, FA_BACKWARD, &bc);
        CHECK(cnt.flops == fc.flops && cnt.transcendentals == fc.transcendentals,
              "%s: forward counts %lld flops %lld trans, plan %lld %lld", label, (long long)cnt.flops,
              (long long)cnt.transcendentals, (long long)fc.flops, (long long)fc.transcendentals);
        const int64_t vis = visible_pairs(&c.p, att);
        const int64_t D = c.p.head_dim;
        CHECK(fc.flops_useful == vis * 2 * (D + Dv) && bc.flops_useful == vis * 2 * (3 * D + 2 * Dv),
              "%s: flops_useful %lld / %lld, %lld visible pairs", label, (long long)fc.flops_useful,
              (long long)bc.flops_useful, (long long)vis);
        CHECK(fc.min_bytes <= fc.bytes_accessed && bc.min_bytes <= bc.bytes_accessed, "%s: min_bytes above bytes", label);
        double max_lse = 0;
        for (int64_t x = 0; x < rows; x++)
            if (isfinite(rl[x]) && fabs(rl[x]) > max_lse) max_lse = fabs(rl[x]);
        const int64_t od[4] = {B, Hq, sq, Dv}, ld[4] = {B, Hq, sq, 1};
        check_tensor("o", c.p.dtype, c.o, &rp->o_stride, ro, od, check_tol_scores(c.p.dtype, max_lse), NULL, 0);
        check_tensor("lse", FA_F32, c.lse, &(fa_strides){{0, 0, 0, 0}}, rl, ld, CHECK_TOL_LSE, NULL, 1);
        if (failures > bad) printf("  in forward %s (FA_TEST_SEED=%llu)\n", label, (unsigned long long)seed);
        free(ro), free(rl);
        /* the backward (its saved o and lse from the reference, or from the kernel's own forward
         * every other case): counts, then the gradients against the reference */
        if (idx % 2) case_forward_kernel(&c, pl);
        else case_forward_ref(&c, pl);
        fa_backward_args ba = case_bwd_args(&c);
        cnt.flops = cnt.transcendentals = -1;
        ba.counts = &cnt;
        st = fa_backward(pl, &ba);
        CHECK(st == FA_OK && cnt.flops == bc.flops && cnt.transcendentals == bc.transcendentals,
              "%s: backward %s, counts %lld flops %lld trans, plan %lld %lld", label, fa_last_error(),
              (long long)cnt.flops, (long long)cnt.transcendentals, (long long)bc.flops, (long long)bc.transcendentals);
        bc_quiet = 1;
        run_and_compare(&c, pl, label);
        fa_ref_attend(NULL);
    }
    fa_plan_destroy(pl);
    *cp = c;
    return failures > bad;
}

/* The forward's trimmed pairs (schedule_mask.h, fa_sched_mask_key_span): tiles of 32 x 128
 * over chunks of 48 and over documents, so that pairs compute from 32 to 128 of their keys,
 * starting at the key tile's first key (k and v taken as prefixes of the packed tile on the
 * ISAs with bt_prefix, b_prefix) or past it (packed again), with Dv = 72 (several column
 * panels of a packed v), in every dtype, against the reference. */
static int trimmed_pairs(uint64_t *r, int idx) {
    static const fa_dtype dts[] = {FA_F32, FA_F16, FA_BF16};
    int failed = 0;
    for (int d = 0; d < 3; d++)
        for (int kind = 0; kind < 2; kind++) {
            fa_problem p;
            fa_problem_init(&p);
            p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seq_q = p.seq_k = 200, p.head_dim = 40, p.head_dim_v = 72;
            p.dtype = dts[d];
            fa_mask_shape ms = {1, 1, 200, 200, 8, 8};
            int64_t counts[1] = {5}, lens[5] = {37, 70, 13, 50, 30};
            fa_mask *m = NULL;
            CHECK((kind ? fa_mask_documents(&ms, counts, lens, &m) : fa_mask_chunked(&ms, 0, 48, &m)) == FA_OK,
                  "trimmed pairs: mask: %s", fa_last_error());
            if (!m) return 1;
            uint8_t *att = tu_alloc((size_t)(2 * 200 * 200));
            CHECK(fa_mask_to_dense(m, att) == FA_OK, "to_dense: %s", fa_last_error());
            memcpy(att + 200 * 200, att, 200 * 200); /* both heads */
            tcase c;
            case_init(&c, &p, M_CAUSAL, r, 0);
            c.p.mask = m;
            fa_options opt = {FA_BACKEND_CPU, 2, 32, 128};
            failed += check_case(&c, m, att, &ms, &opt, kind ? "documents 37,70,13,50,30" : "chunked(48)", idx + 2 * d + kind);
            case_free(&c);
            free(att);
        }
    return failed;
}

/* The same bits from 1 and 3 threads, forward and backward (each output element is summed in
 * a fixed order whatever the threads: docs/semantics.md), on a dense bitmap under causal. */
static void thread_counts(uint64_t *r) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 4, p.heads_kv = 2, p.seq_q = 150, p.seq_k = 130, p.head_dim = 32, p.dtype = FA_BF16;
    fa_mask_shape s = {1, 4, 150, 130, 32, 32};
    uint8_t *att = tu_alloc((size_t)(4 * 150 * 130));
    random_bitmap(r, att, 4, 150, 130, 32, 32);
    fa_mask *m = NULL;
    CHECK(fa_mask_from_dense(&s, att, &m) == FA_OK, "from_dense: %s", fa_last_error());
    tcase c;
    case_init(&c, &p, M_CAUSAL, r, 0);
    c.p.mask = m;
    void *o1 = tu_alloc((size_t)c.no * 2), *d1[3] = {tu_alloc((size_t)c.nq * 2), tu_alloc((size_t)c.nk * 2), tu_alloc((size_t)c.nv * 2)};
    for (int threads = 1; threads <= 3; threads += 2) {
        fa_options opt = {FA_BACKEND_CPU, threads, 0, 0};
        fa_plan *pl = NULL;
        CHECK(fa_plan_create(&c.p, &opt, &pl) == FA_OK, "plan: %s", fa_last_error());
        if (!pl) break;
        fa_forward_args fa = case_fwd_args(&c);
        CHECK(fa_forward(pl, &fa) == FA_OK, "forward: %s", fa_last_error());
        fa_backward_args ba = case_bwd_args(&c);
        CHECK(fa_backward(pl, &ba) == FA_OK, "backward: %s", fa_last_error());
        if (threads == 1) {
            memcpy(o1, c.o, (size_t)c.no * 2), memcpy(d1[0], c.dq, (size_t)c.nq * 2);
            memcpy(d1[1], c.dk, (size_t)c.nk * 2), memcpy(d1[2], c.dv, (size_t)c.nv * 2);
        } else {
            CHECK(!memcmp(o1, c.o, (size_t)c.no * 2) && !memcmp(d1[0], c.dq, (size_t)c.nq * 2) &&
                      !memcmp(d1[1], c.dk, (size_t)c.nk * 2) && !memcmp(d1[2], c.dv, (size_t)c.nv * 2),
                  "1 and 3 threads give different bits under a mask");
        }
        fa_plan_destroy(pl);
    }
    fa_mask_destroy(m);
    case_free(&c);
    free(att), free(o1), free(d1[0]), free(d1[1]), free(d1[2]);
}

/* What a mask does not combine with, refused in words that name both. */
static void refusals(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = 2, p.seq_q = 8, p.seq_k = 8, p.head_dim = 16;
    fa_mask_shape s = {1, 1, 8, 8, 0, 0};
    fa_mask *m = NULL;
    CHECK(fa_mask_causal(&s, 0, &m) == FA_OK, "causal");
    p.mask = m;
    fa_plan *pl = NULL;
    fa_options cuda = {FA_BACKEND_CUDA, 0, 0, 0};
    CHECK(fa_plan_create(&p, &cuda, &pl) == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "mask"), "cuda: %s",
          fa_last_error());
    int32_t cu[3] = {0, 4, 8};
    fa_problem v = p;
    v.cu_seqlens_q = v.cu_seqlens_k = cu;
    CHECK(fa_plan_create(&v, NULL, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "mask") &&
              strstr(fa_last_error(), "cu_seqlens"),
          "varlen: %s", fa_last_error());
    fa_problem d = p;
    int32_t lens[2] = {3, 5};
    d.cache_seqlens = lens;
    CHECK(fa_plan_create(&d, NULL, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "mask") &&
              strstr(fa_last_error(), "cache_seqlens"),
          "decode: %s", fa_last_error());
    fa_problem w = p;
    w.seq_k = 9;
    CHECK(fa_plan_create(&w, NULL, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "seq"), "shape: %s", fa_last_error());
    fa_mask_shape s3 = {3, 1, 8, 8, 0, 0};
    fa_mask *m3 = NULL;
    CHECK(fa_mask_causal(&s3, 0, &m3) == FA_OK, "causal");
    w = p, w.mask = m3;
    CHECK(fa_plan_create(&w, NULL, &pl) == FA_ERR_INVALID && strstr(fa_last_error(), "batch"), "batch: %s", fa_last_error());
    fa_mask_destroy(m3), fa_mask_destroy(m);
}

int main(void) {
    uint64_t r = check_seed("test_mask_attention");
    const int n = tu_check_cases() ? tu_check_cases() : 24; /* FA_CHECK_CASES=N: a longer run */
    int failed = 0;
    for (int i = 0; i < n; i++) failed += run_case(&r, i);
    failed += trimmed_pairs(&r, n);
    printf("test_mask_attention: %d of %d cases failed\n", failed, n + 6);
    thread_counts(&r);
    refusals();
    return check_finish("test_mask_attention");
}
