/* Tests an internal on purpose: the ISA tables (cpu/isa.h).
 * The forward's bf16-pair passes of an ISA table (isa.h: max_row, exp_pairs, gemm_pb_pairs)
 * against the f32-p path they replace, bit for bit: for random rows of products, with
 * extremes mixed in (scores whose exp lands near FLT_MIN, underflows, -inf, NaN, +-0),
 *   max_row(x) * scale        == the max of x[j] * scale (scale > 0)
 *   exp_pairs(x, scale, base) == exp_sum(x * scale, base), the same sum bits
 *   gemm_pb_pairs(pairs, V)   == gemm_pb(round_row(p), V), the same o bits (m up to 45:
 *                              AMX reads whole 16-row, 32-key tiles in place and copies cut ones).
 * It tests an internal interface on purpose (the table of src/cpu that FA_ISA or this CPU
 * selects). Exits 77 where that table has no such passes. */
#include "cpu/isa.h"
#include "check.h"

static uint64_t rng;

/* A product: mostly ordinary, some extreme. */
static float draw(float spread) {
    const int64_t kind = tu_int(&rng, 0, 63);
    switch (kind) {
    case 0: return -INFINITY;
    case 1: return NAN;
    case 2: return 0.0f;
    case 3: return -0.0f;
    case 4: return (float)(-87.3 - 0.2 * tu_uniform(&rng)); /* exp near FLT_MIN (base 0) */
    case 5: return (float)(-86.0 - 3.0 * tu_uniform(&rng));
    case 6: return -200.0f;
    default: return (float)(tu_uniform(&rng) * spread);
    }
}

static void max_case(const fa_isa *isa, int n, float scale) {
    float *x = tu_alloc((size_t)n * sizeof(float));
    for (int j = 0; j < n; j++) x[j] = draw(50.0f);
    float want = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float s = x[j] * scale;
        want = s > want ? s : want;
    }
    const float got = isa->max_row(x, n) * scale;
    if (!(got == want || (isnan(got) && isnan(want)))) {
        fprintf(stderr, "FAIL %s max_row n=%d scale=%g: %a, want %a\n", isa->name, n, (double)scale, (double)got,
                (double)want);
        failures++;
    }
    free(x);
}

/* The pairs exp_pairs wrote (pp) hold round_row's p (y, n values) bit for bit: its high
 * halves, low key first (an odd n pads with 0). */
static void check_pairs(const fa_isa *isa, const uint32_t *pp, const float *y, int n) {
    for (int j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, &y[j], sizeof u);
        const uint32_t got = j % 2 ? pp[j / 2] >> 16 : pp[j / 2] & 0xffffu, want = u >> 16;
        if (got != want || (u & 0xffffu) || (n % 2 && j == n - 1 && pp[j / 2] >> 16)) {
            fprintf(stderr, "FAIL %s exp_pairs n=%d: p[%d] is 0x%04x, round_row gives %a (0x%08x)\n", isa->name, n,
                    j, (unsigned)got, (double)y[j], (unsigned)u);
            failures++;
            return;
        }
    }
}

/* Every float x from ln(FLT_MIN) - 0.25 to -86.5: the exps near FLT_MIN, where the pairs'
 * conversion (subnormals read as 0) would part from round_row if exp returned a subnormal. */
static void underflow_walk(const fa_isa *isa) {
    enum { N = 256 };
    float x[N], y[N];
    for (float x0 = -87.33654f - 0.25f; x0 < -86.5f;) {
        for (int j = 0; j < N; j++, x0 = nextafterf(x0, 0.0f)) x[j] = y[j] = x0;
        const float want = isa->exp_sum(y, N, 0.0f);
        isa->round_row(y, N, FA_BF16);
        const float got = isa->exp_pairs(x, N, 1.0f, 0.0f);
        if (memcmp(&got, &want, sizeof got) != 0) {
            fprintf(stderr, "FAIL %s exp_pairs near FLT_MIN from %a: sum %a, want %a\n", isa->name, (double)x0,
                    (double)got, (double)want);
            failures++;
        }
        check_pairs(isa, (const uint32_t *)x, y, N);
    }
}

/* m rows of n products: p through exp_pairs + gemm_pb_pairs against exp_sum + round_row +
 * gemm_pb, into o of m x cols. */
static void pairs_case(const fa_isa *isa, int m, int n, int cols, float scale) {
    const int ld = n + (int)tu_int(&rng, 0, 3);
    float *x = tu_alloc((size_t)m * ld * sizeof(float)), *y = tu_alloc((size_t)m * ld * sizeof(float));
    float *o1 = tu_alloc((size_t)m * cols * sizeof(float)), *o2 = tu_alloc((size_t)m * cols * sizeof(float));
    uint16_t *v = tu_alloc((size_t)n * cols * sizeof(uint16_t));
    void *vp = tu_alloc((size_t)isa->packed_bytes(n, cols, FA_BF16));
    for (int64_t i = 0; i < (int64_t)n * cols; i++) chk_store(FA_BF16, v, i, (float)tu_uniform(&rng));
    fa_tile_src vs = {v, FA_BF16, cols, 1};
    isa->pack_b(&vs, n, cols, vp);
    for (int64_t i = 0; i < (int64_t)m * cols; i++) o1[i] = o2[i] = (float)tu_uniform(&rng);
    for (int r = 0; r < m; r++) {
        for (int j = 0; j < n; j++) x[r * ld + j] = draw(30.0f);
        for (int j = 0; j < n; j++) y[r * ld + j] = x[r * ld + j] * scale;
        const float base = tu_int(&rng, 0, 3) == 0 ? 0.0f : (float)(10.0 * tu_uniform(&rng));
        const float want = isa->exp_sum(y + r * ld, n, base);
        isa->round_row(y + r * ld, n, FA_BF16);
        const float got = isa->exp_pairs(x + r * ld, n, scale, base);
        if (memcmp(&got, &want, sizeof got) != 0) {
            fprintf(stderr, "FAIL %s exp_pairs n=%d scale=%g base=%g: sum %a, want %a\n", isa->name, n,
                    (double)scale, (double)base, (double)got, (double)want);
            failures++;
        }
        check_pairs(isa, (const uint32_t *)(x + r * ld), y + r * ld, n);
    }
    isa->gemm_pb(m, n, cols, y, ld, vp, o1, cols);
    isa->gemm_pb_pairs(m, n, cols, (const uint32_t *)x, ld, vp, o2, cols);
    for (int64_t i = 0; i < (int64_t)m * cols; i++)
        if (memcmp(&o1[i], &o2[i], sizeof o1[i]) != 0) {
            fprintf(stderr, "FAIL %s gemm_pb_pairs m=%d n=%d cols=%d: o[%lld] %a, want %a\n", isa->name, m, n, cols,
                    (long long)i, (double)o2[i], (double)o1[i]);
            failures++;
            break;
        }
    free(x), free(y), free(o1), free(o2), free(v), free(vp);
}

int main(void) {
    rng = check_seed("test_isa_pairs");
    const fa_isa *isa = NULL;
    if (fa_isa_select(&isa) != FA_OK || !isa->exp_pairs) {
        printf("test_isa_pairs: the %s table has no bf16-pair passes: skipped\n", isa ? isa->name : "selected");
        return 77;
    }
    const int sizes[] = {1, 2, 15, 16, 17, 31, 32, 33, 47, 64, 127, 128, 200, 256};
    const float scales[] = {1.0f, 0.125f, 0.0883883f, 3.0f};
    for (int si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); si++)
        for (int ci = 0; ci < 4; ci++) {
            max_case(isa, sizes[si], scales[ci]);
            const int m = (int)tu_int(&rng, 1, 45), cols = (int)(16 * tu_int(&rng, 1, 9) - tu_int(&rng, 0, 1));
            pairs_case(isa, m, sizes[si], cols, scales[ci]);
        }
    underflow_walk(isa);
    printf("  %s: max_row, exp_pairs, gemm_pb_pairs match the f32-p path\n", isa->name);
    return check_finish("test_isa_pairs");
}
