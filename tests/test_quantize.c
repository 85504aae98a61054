/* The quantization rule of int8 and fp8 kv caches (docs/caches.md) against an independent
 * quantizer (quant_ref.h): fa_quantize_rows code for code and scale for scale from f32, bf16
 * and f16 rows (ties, zero rows, saturation), non-finite input refused with nothing written;
 * fa_convert to and from the codes with scale 1; unknown dtypes and NULL buffers refused
 * with nothing written. Decoding such caches: test_decode_quant.c. */
#include "check.h"
#include "quant_ref.h"

static uint64_t rng;

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* The rule under flush-to-zero and denormals-are-zero (XLA sets both on the threads that run
 * its custom calls): the same codes and scales as without them, rows of subnormals and rows
 * whose amax / max is subnormal included (such a row once got scale 1 and zero codes). */
static void under_flush_modes(void) {
    enum { ROWS = 6, W = 40 };
    static const fa_dtype kinds[2] = {FA_INT8, FA_FP8_E4M3};
    float x[ROWS * W];
    for (int i = 0; i < ROWS * W; i++) {
        const double mag[ROWS] = {1e-40, 2.7e-43, 1e-38, 60.0 * FLT_MIN, 3.0, 1e-45};
        x[i] = (float)((tu_uniform(&rng) * 2 - 1) * mag[i / W]);
    }
    x[W + 3] = -2.66e-43f, x[4 * W + 1] = 1e-41f; /* a subnormal element in a row of normal scale */
    for (int k = 0; k < 2; k++) {
        uint8_t want[ROWS * W], got[ROWS * W];
        float ws[ROWS], gs[ROWS];
        CHECK(fa_quantize_rows(kinds[k], FA_F32, x, ROWS, W, want, ws) == FA_OK, "quantize: %s", fa_last_error());
        const unsigned saved = _mm_getcsr();
        _mm_setcsr(saved | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6) */
        const fa_status st = fa_quantize_rows(kinds[k], FA_F32, x, ROWS, W, got, gs);
        _mm_setcsr(saved);
        CHECK(st == FA_OK && !memcmp(want, got, sizeof got) && !memcmp(ws, gs, sizeof gs),
              "quantize %s under flush-to-zero and denormals-are-zero: codes or scales differ (row 0 scale %g, "
              "without the modes %g)", fa_dtype_name(kinds[k]), gs[0], ws[0]);
        uint8_t ind[W];
        for (int r = 0; r < ROWS; r++) /* and both are the independent rule's */
            CHECK(ind_quant(kinds[k], x + r * W, W, ind) == ws[r] && !memcmp(ind, want + r * W, W),
                  "quantize %s row %d: not the independent rule's", fa_dtype_name(kinds[k]), r);
    }
}
#else
static void under_flush_modes(void) {}
#endif

static void quantizer(void) {
    static const fa_dtype kinds[2] = {FA_INT8, FA_FP8_E4M3}, from[3] = {FA_F32, FA_BF16, FA_F16};
    enum { ROWS = 40, W = 48 };
    for (int k = 0; k < 2; k++)
        for (int f = 0; f < 3; f++) {
            const fa_dtype t = kinds[k], ft = from[f];
            float x[ROWS * W];
            for (int i = 0; i < ROWS * W; i++) x[i] = (float)(tu_uniform(&rng) * ldexp(1.0, (int)tu_int(&rng, -12, 6)));
            for (int i = 0; i < W; i++) x[i] = 0.0f;                  /* a zero row: scale 1, codes 0 */
            for (int i = 0; i < W; i++) x[W + i] = (float)(i - 24) + 0.5f; /* ties at scale 1 (amax below) */
            x[W] = t == FA_INT8 ? 127.0f : 448.0f;
            for (int i = 0; i < W; i++) /* e4m3 ties: midpoints of neighbours, normal and subnormal */
                x[2 * W + i] = (float)(i % 2 ? (e4m3_magnitude(i + 1) + e4m3_magnitude(i + 2)) / 2
                                              : -(e4m3_magnitude(i) + e4m3_magnitude(i + 1)) / 2);
            x[2 * W + W - 1] = 448.0f;
            for (int i = 0; i < W; i++) { /* amax / max subnormal: 2.7e-43 (scale 2^-126, codes at */
                x[3 * W + i] = (float)(tu_uniform(&rng) * 2.6e-43); /* the clamp before), 60 FLT_MIN */
                x[4 * W + i] = (float)(tu_uniform(&rng) * 60.0) * FLT_MIN;
            }
            x[3 * W + 5] = -2.66e-43f;
            char src[ROWS * W * 4];
            float xr[ROWS * W]; /* the values as the source dtype holds them */
            for (int i = 0; i < ROWS * W; i++) chk_store(ft, src, i, x[i]), xr[i] = chk_load(ft, src, i);
            uint8_t got[ROWS * W], want[ROWS * W];
            float gs[ROWS], ws[ROWS];
            fa_status st = fa_quantize_rows(t, ft, src, ROWS, W, got, gs);
            CHECK(st == FA_OK, "quantize %s from %s: %s", fa_dtype_name(t), fa_dtype_name(ft), fa_last_error());
            int bad = 0;
            for (int r = 0; r < ROWS; r++) {
                ws[r] = ind_quant(t, xr + r * W, W, want + r * W);
                bad += memcmp(&gs[r], &ws[r], 4) != 0;
            }
            for (int i = 0; i < ROWS * W; i++) bad += got[i] != want[i];
            CHECK(!bad, "quantize %s from %s: %d codes or scales differ from the independent rule", fa_dtype_name(t),
                  fa_dtype_name(ft), bad);
            CHECK(gs[0] == 1.0f && !got[0], "quantize %s: a zero row gave scale %g", fa_dtype_name(t), gs[0]);
            /* the error bound of docs/caches.md, every row: int8 scale / 2 (plus x / scale's f32
             * rounding: 2^-24 |x|, doubled for slack), fp8 2^-4 |x| + 2^-10 scale */
            bad = 0;
            for (int i = 0; i < ROWS * W; i++) {
                const double sc = gs[i / W], back = ind_value(t, got[i]) * sc, err = fabs(back - xr[i]);
                bad += err > (t == FA_INT8 ? sc / 2 + ldexp(fabs(xr[i]), -23) : ldexp(fabs(xr[i]), -4) + ldexp(sc, -10));
            }
            CHECK(!bad, "quantize %s from %s: %d elements past the error bound", fa_dtype_name(t), fa_dtype_name(ft), bad);
            /* fa_convert: codes with scale 1, and back */
            uint8_t conv[W];
            fa_convert(FA_F32, x + W, t, conv, W);
            bad = 0;
            for (int i = 0; i < W; i++) {
                bad += conv[i] != (t == FA_INT8 ? (uint8_t)ind_int8(x[W + i]) : ind_e4m3(x[W + i]));
                float back;
                fa_convert(t, &conv[i], FA_F32, &back, 1);
                bad += back != (float)ind_value(t, conv[i]);
            }
            CHECK(!bad, "fa_convert to and from %s: %d elements differ", fa_dtype_name(t), bad);
            /* a non-finite element: refused, nothing written */
            chk_store(ft, src, 5 * W + 7, k ? INFINITY : NAN);
            memset(got, 0x5a, sizeof got);
            for (int r = 0; r < ROWS; r++) gs[r] = -3.0f;
            st = fa_quantize_rows(t, ft, src, ROWS, W, got, gs);
            int touched = gs[0] != -3.0f || gs[ROWS - 1] != -3.0f;
            for (int i = 0; i < ROWS * W; i++) touched |= got[i] != 0x5a;
            CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "not finite") && !touched,
                  "quantize a non-finite row: %s (%s), written %d", fa_status_string(st), fa_last_error(), touched);
        }
    CHECK(fa_quantize_rows(FA_BF16, FA_F32, NULL, 1, 1, NULL, NULL) == FA_ERR_INVALID, "quantize to bf16 accepted");
    CHECK(fa_dtype_size(FA_INT8) == 1 && fa_dtype_size(FA_FP8_E4M3) == 1 && !strcmp(fa_dtype_name(FA_FP8_E4M3), "fp8_e4m3"),
          "int8 / fp8 sizes or names");
    /* a dtype outside fa_dtype has no size, and fa_convert refuses it (it once read and
     * wrote it as f16) and NULL buffers (it crashed), writing nothing, its message in
     * fa_last_error (which a good call leaves alone) */
    CHECK(fa_dtype_size((fa_dtype)9) == 0 && fa_dtype_size((fa_dtype)-1) == 0, "an unknown dtype's size: %zu",
          fa_dtype_size((fa_dtype)9));
    const float f[2] = {1.5f, -2.0f};
    float out[2] = {-7.0f, -7.0f};
    uint16_t h[2] = {0x5a5a, 0x5a5a};
    fa_convert((fa_dtype)9, f, FA_F32, out, 2);
    CHECK(out[0] == -7.0f && out[1] == -7.0f && strstr(fa_last_error(), "source dtype 9"),
          "fa_convert from dtype 9: wrote %g %g, \"%s\"", (double)out[0], (double)out[1], fa_last_error());
    fa_convert(FA_F32, f, (fa_dtype)9, h, 2);
    CHECK(h[0] == 0x5a5a && h[1] == 0x5a5a && strstr(fa_last_error(), "destination dtype 9"),
          "fa_convert to dtype 9: wrote %04x %04x, \"%s\"", h[0], h[1], fa_last_error());
    fa_convert(FA_F32, NULL, FA_F16, h, 2);
    CHECK(h[0] == 0x5a5a && strstr(fa_last_error(), "src is NULL"), "fa_convert from NULL: \"%s\"", fa_last_error());
    fa_convert(FA_F32, f, FA_F16, NULL, 2);
    CHECK(strstr(fa_last_error(), "dst is NULL"), "fa_convert to NULL: \"%s\"", fa_last_error());
    fa_convert(FA_F32, NULL, FA_F16, NULL, 0); /* nothing to convert: fine, no new message */
    CHECK(strstr(fa_last_error(), "dst is NULL"), "fa_convert of 0 elements: \"%s\"", fa_last_error());
    fa_convert(FA_F32, f, FA_F16, h, 2);
    CHECK(h[0] == 0x3e00 && h[1] == 0xc000 && strstr(fa_last_error(), "dst is NULL"),
          "fa_convert f32 -> f16: %04x %04x \"%s\"", h[0], h[1], fa_last_error());
    /* buffers over each other: codes written over rows not yet read gave wrong codes with
     * FA_OK (8 of 32 in the auditor's case); refused, nothing written */
    union {
        float f[4 * 8];
        uint8_t b[4 * 8 * 4];
    } buf;
    for (int i = 0; i < 32; i++) buf.f[i] = 0.25f * (float)(i % 7) - 0.6f;
    uint8_t keep[sizeof buf];
    memcpy(keep, &buf, sizeof buf);
    float sc[4];
    const struct {
        const char *what, *said;
        void *codes;
        float *scales;
    } over[] = {{"codes over src", "codes and src", buf.b + 32, sc},
                {"scales over src", "scales and src", keep, buf.f + 30},
                {"codes over scales", "codes and scales", buf.b + 200, (float *)(void *)(buf.b + 216)}};
    uint8_t other[256];
    for (int i = 0; i < 3; i++) {
        void *codes = over[i].codes == keep ? other : over[i].codes;
        const float *src = i == 2 ? (const float *)(void *)other : buf.f;
        if (i == 2) memset(other, 0, sizeof other);
        memcpy(&buf, keep, sizeof buf);
        const fa_status st = fa_quantize_rows(FA_INT8, FA_F32, src, 4, 8, codes, over[i].scales);
        CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), over[i].said) && !memcmp(&buf, keep, sizeof buf),
              "quantize with %s: %s (%s)", over[i].what, fa_status_string(st), fa_last_error());
    }
    /* 2^62 elements fit int64, their 2^64 bytes do not: a size error, nothing read (it said
     * "codes and scales share memory", from wrapped address ranges) */
    const fa_status big = fa_quantize_rows(FA_INT8, FA_F32, buf.f, (int64_t)1 << 60, 4, other, sc);
    CHECK(big == FA_ERR_OVERFLOW && strstr(fa_last_error(), "overflow int64 bytes"), "quantize 2^60 x 4 f32: %s (%s)",
          fa_status_string(big), fa_last_error());
    float conv[4] = {1, 2, 3, 4};
    fa_convert(FA_F32, conv, FA_F16, (char *)conv + 2, 3);
    CHECK(conv[0] == 1 && conv[3] == 4 && strstr(fa_last_error(), "share memory"), "fa_convert over itself: \"%s\"",
          fa_last_error());
}

int main(void) {
    rng = check_seed("test_quantize");
    quantizer();
    under_flush_modes();
    return check_finish("test_quantize");
}
