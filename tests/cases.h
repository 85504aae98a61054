/* The one list of attention cases every backend runs (as ggml's test-backend-ops runs each
 * case on every backend): test_forward (o, lse), test_backward (dq, dk, dv, dbias) and
 * test_cuda (forward and backward on a device) each take every row below, build its
 * tensors from their seeded stream and compare with the float64 reference through
 * check.h. The rows cover every head-dim class (D in {1, 8, 32, 40, 64, 72, 96, 128, 160,
 * 256}, Dv != D), the three dtypes, causal, windows (0 wide, one-sided), diag offsets
 * (top-left, arbitrary), Sq != Sk both ways, rows with no visible key, softcap (saturated
 * too), biases (per head with -inf entries, broadcast over heads, scaled), ALiBi, segment
 * ids, GQA and MQA, non-default and negative scales, BSHD and non-unit-stride layouts and
 * odd sizes.
 *
 * Every ISA: tests/run_all.sh runs the whole ctest suite once per CPU instruction set this
 * machine has (FA_ISA, from tool_isas), so each row runs on each ISA; test_cuda runs them
 * on a CUDA device (an f32 row in bf16 there: CUDA has no f32 kernels). */
#ifndef FA_TEST_CASES_H
#define FA_TEST_CASES_H

#include "check.h"

typedef struct {
    const char *name;
    int64_t B, Hq, Hk, Sq, Sk, D, Dv;
    fa_dtype dt;
    int causal;
    int window;      /* window_left/right = wl/wr (-1: that side unbounded) */
    int64_t wl, wr;
    int has_diag;    /* masks aligned at diag instead of Sk - Sq */
    int64_t diag;
    float softcap;
    int bias;        /* 0 none; 1 [1, Hq, Sq, Sk] with some -inf entries; 2 [B, 1, Sq, Sk] */
    float bias_scale; /* 0: not set (1) */
    int alibi, seg;   /* seg: three runs per sequence, and one query row matching no key */
    int layout;       /* 0 BHSD, 1 BSHD, 2 q and o with column stride 2 (no aligned rows) */
    float scale;      /* 0: the default 1/sqrt(D) */
} fa_case;

#define FA_CASE_SHAPE(n, b, hq, hk, sq, sk, d, dv, t) .name = n, .B = b, .Hq = hq, .Hk = hk, .Sq = sq, .Sk = sk, .D = d, .Dv = dv, .dt = t

static const fa_case FA_CASES[] = {
    {FA_CASE_SHAPE("D64 bf16 plain", 1, 2, 2, 200, 200, 64, 64, FA_BF16)},
    {FA_CASE_SHAPE("D128 bf16 causal", 1, 1, 1, 200, 200, 128, 128, FA_BF16), .causal = 1},
    {FA_CASE_SHAPE("D256 f16 causal Sk>Sq", 1, 1, 1, 130, 257, 256, 256, FA_F16), .causal = 1},
    {FA_CASE_SHAPE("D40 bf16 window Sq>Sk", 1, 2, 2, 257, 190, 40, 40, FA_BF16), .window = 1, .wl = 17, .wr = 5},
    {FA_CASE_SHAPE("D72/Dv40 GQA softcap", 1, 4, 2, 150, 170, 72, 40, FA_BF16), .softcap = 2.5f},
    {FA_CASE_SHAPE("D64 f16 bias[1,H] alibi", 2, 2, 2, 140, 150, 64, 64, FA_F16), .bias = 1, .alibi = 1},
    {FA_CASE_SHAPE("D128 bf16 segments causal", 2, 1, 1, 160, 160, 128, 128, FA_BF16), .seg = 1, .causal = 1},
    {FA_CASE_SHAPE("D64 causal Sq>Sk (empty rows)", 1, 2, 2, 300, 100, 64, 64, FA_BF16), .causal = 1},
    {FA_CASE_SHAPE("D128 BSHD", 1, 2, 1, 129, 193, 128, 128, FA_BF16), .layout = 1},
    {FA_CASE_SHAPE("D256 MQA window bias[B,1]", 1, 2, 1, 100, 160, 256, 256, FA_BF16), .window = 1, .wl = 40,
     .wr = 0, .bias = 2},
    {FA_CASE_SHAPE("D32 f16 tiny", 1, 1, 1, 7, 9, 32, 32, FA_F16)},
    {FA_CASE_SHAPE("D160 f16 causal", 1, 1, 1, 170, 170, 160, 160, FA_F16), .causal = 1},
    {FA_CASE_SHAPE("D64 column stride 2", 1, 2, 2, 100, 120, 64, 64, FA_BF16), .layout = 2},
    {FA_CASE_SHAPE("D256/Dv128 softcap causal", 1, 2, 2, 140, 140, 256, 128, FA_BF16), .softcap = 5.f, .causal = 1},
    {FA_CASE_SHAPE("D96 f16 everything", 2, 2, 1, 133, 145, 96, 96, FA_F16), .causal = 1, .softcap = 4.f, .bias = 1,
     .alibi = 1, .seg = 1},
    {FA_CASE_SHAPE("D128 f16 long", 1, 1, 1, 320, 320, 128, 128, FA_F16)},
    /* shapes CUDA's Hopper forward takes (D = Dv in {64, 128, 256}): many key tiles
     * through its stage ring, windows, one query row, one key */
    {FA_CASE_SHAPE("D256 bf16 window long", 1, 1, 1, 130, 520, 256, 256, FA_BF16), .window = 1, .wl = 200, .wr = 50},
    {FA_CASE_SHAPE("D128 GQA Sq=1 Sk=1000", 2, 4, 1, 1, 1000, 128, 128, FA_BF16)},
    {FA_CASE_SHAPE("D64 f16 causal 513", 1, 1, 1, 513, 513, 64, 64, FA_F16), .causal = 1},
    {FA_CASE_SHAPE("D128 f16 Sk=1", 1, 2, 2, 150, 1, 128, 128, FA_F16)},
    {FA_CASE_SHAPE("D128 GQA softcap alibi", 1, 2, 1, 150, 180, 128, 128, FA_BF16), .softcap = 3.f, .alibi = 1},
    {FA_CASE_SHAPE("D64 bias_scale 0.5, softcap 1 (saturated)", 1, 2, 2, 150, 170, 64, 64, FA_BF16), .bias = 2,
     .bias_scale = 0.5f, .softcap = 1.0f},
    /* f32, odd sizes, masks aligned elsewhere, scales */
    {FA_CASE_SHAPE("f32 odd sizes GQA 3:1 causal", 2, 3, 1, 37, 129, 40, 24, FA_F32), .causal = 1},
    {FA_CASE_SHAPE("f32 D1 Dv3", 1, 2, 2, 7, 9, 1, 3, FA_F32)},
    {FA_CASE_SHAPE("f32 D8 Sq=1 Sk=300", 2, 2, 2, 1, 300, 8, 8, FA_F32)},
    {FA_CASE_SHAPE("f32 window (0, 0): the diagonal only", 1, 2, 2, 128, 37, 64, 64, FA_F32), .window = 1},
    {FA_CASE_SHAPE("f32 window (-1, 0) Sk>Sq", 1, 1, 1, 37, 129, 80, 80, FA_F32), .window = 1, .wl = -1},
    {FA_CASE_SHAPE("f32 diag 0 (top-left) causal Sq>Sk", 1, 2, 2, 129, 37, 64, 64, FA_F32), .causal = 1,
     .has_diag = 1},
    {FA_CASE_SHAPE("f32 diag -20 window (3, 10) alibi", 1, 2, 1, 50, 70, 40, 40, FA_F32), .has_diag = 1,
     .diag = -20, .window = 1, .wl = 3, .wr = 10, .alibi = 1},
    {FA_CASE_SHAPE("bf16 diag beyond Sk causal", 1, 1, 1, 40, 30, 64, 64, FA_BF16), .causal = 1, .has_diag = 1,
     .diag = 33},
    {FA_CASE_SHAPE("f32 scale -0.2 softcap 8", 1, 2, 2, 65, 70, 64, 64, FA_F32), .scale = -0.2f, .softcap = 8.f},
    {FA_CASE_SHAPE("f32 everything, BSHD", 2, 4, 2, 45, 70, 40, 24, FA_F32), .causal = 1, .window = 1, .wl = 20,
     .wr = -1, .softcap = 6.f, .bias = 1, .bias_scale = 0.75f, .alibi = 1, .seg = 1, .layout = 1, .scale = 0.3f},
    {FA_CASE_SHAPE("f16 Dv256 D8 segments Sq=Sk=1", 3, 2, 2, 1, 1, 8, 256, FA_F16), .seg = 1},
};
#define FA_CASE_COUNT ((int)(sizeof FA_CASES / sizeof FA_CASES[0]))

/* The case's problem, strides left contiguous (the caller sets its layout's). */
static inline fa_problem fa_case_problem(const fa_case *c) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = c->B, p.heads_q = c->Hq, p.heads_kv = c->Hk, p.seq_q = c->Sq, p.seq_k = c->Sk;
    p.head_dim = c->D, p.head_dim_v = c->Dv, p.dtype = c->dt;
    p.causal = c->causal, p.softcap = c->softcap;
    if (c->window) p.window_left = c->wl, p.window_right = c->wr;
    if (c->has_diag) p.has_diag_offset = 1, p.diag_offset = c->diag;
    if (c->scale != 0.0f) p.has_scale = 1, p.scale = c->scale;
    if (c->bias) {
        p.has_bias = 1;
        p.bias_batch = c->bias == 2 ? c->B : 1;
        p.bias_heads = c->bias == 1 ? c->Hq : 1;
    }
    if (c->bias_scale != 0.0f) p.has_bias_scale = 1, p.bias_scale = c->bias_scale;
    p.has_alibi = c->alibi, p.has_segment_ids = c->seg;
    tu_keep_aligned_diag(&p);
    return p;
}

/* The case's segment ids: three runs over each sequence, query row 0 of each batch 7 (no
 * key has it: a row that sees nothing). */
static inline void fa_case_segments(const fa_case *c, int32_t *qseg, int32_t *kseg) {
    for (int64_t i = 0; i < c->B * c->Sq; i++) qseg[i] = (int32_t)((i % c->Sq) * 3 / c->Sq);
    for (int64_t i = 0; i < c->B * c->Sk; i++) kseg[i] = (int32_t)((i % c->Sk) * 3 / c->Sk);
    for (int64_t b = 0; b < c->B; b++) qseg[b * c->Sq] = 7;
}

#endif
