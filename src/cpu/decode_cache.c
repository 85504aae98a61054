/* Decode tile kernels for caches of f16, bf16, int8 or fp8 e4m3 elements in portable C: the
 * ISAs without decode_cache_avx512.c's kernels take these, as do strided rows and tiles
 * that need the guarded product (decode_kernels.h, fa_decode_cache_tile). A row is
 * converted once into f32 (codes exactly; the scale applies to the row's dot product, or
 * to p before the value row, so one multiply per key instead of one per element). */
#include "decode_kernels.h"

#include "../internal.h"

/* Row j of a tile (d elements, col apart) as f32 codes (f16, bf16: the value). */
static void row_f32(fa_dtype t, const void *base, int64_t j, int64_t stride, int64_t col, int d, float *restrict x) {
    if (t == FA_F16 || t == FA_BF16) {
        const uint16_t *r = (const uint16_t *)base + j * stride;
        for (int c = 0; c < d; c++) x[c] = t == FA_F16 ? fa_f16_to_f32(r[c * col]) : fa_bf16_to_f32(r[c * col]);
    } else {
        const uint8_t *r = (const uint8_t *)base + j * stride;
        for (int c = 0; c < d; c++) x[c] = fa_code_to_f32(t, r, c * col);
    }
}

void fa_decode_cache_qk(const fa_decode_cache_tile *t, float *s, int lds) {
    float x[512];
    for (int j = 0; j < t->n; j++) {
        const float sc = t->kscale ? t->kscale[j * t->sstride] : 1.0f;
        for (int c0 = 0; c0 < t->d; c0 += 512) { /* head dims in pieces of at most 512 */
            const int w = t->d - c0 < 512 ? t->d - c0 : 512;
            row_f32(t->t, (const char *)t->k + c0 * t->kcol * (int64_t)fa_dtype_size(t->t), j, t->kstride, t->kcol, w, x);
            for (int r = 0; r < t->m; r++) {
                const float *q = t->q + (int64_t)r * t->d + c0;
                float dot = 0.0f;
                for (int c = 0; c < w; c++) dot += q[c] * x[c];
                s[(int64_t)r * lds + j] = c0 ? s[(int64_t)r * lds + j] + dot : dot;
            }
        }
        for (int r = 0; r < t->m; r++) s[(int64_t)r * lds + j] *= sc;
    }
}

void fa_decode_cache_pv(const fa_decode_cache_tile *t, const float *p, int ldp, float *o, int ldo, int guarded) {
    float x[512];
    const size_t es = fa_dtype_size(t->t);
    for (int j = 0; j < t->n; j++) {
        const float sc = t->vscale ? t->vscale[j * t->sstride] : 1.0f;
        for (int c0 = 0; c0 < t->dv; c0 += 512) {
            const int w = t->dv - c0 < 512 ? t->dv - c0 : 512;
            row_f32(t->t, (const char *)t->v + c0 * t->vcol * (int64_t)es, j, t->vstride, t->vcol, w, x);
            for (int r = 0; r < t->m; r++) {
                const float pj = p[(int64_t)r * ldp + j];
                if (guarded && pj == 0.0f) continue; /* a hidden key's row adds nothing, NaN or not */
                const float wgt = pj * sc;
                float *orow = o + (int64_t)r * ldo + c0;
                for (int c = 0; c < w; c++) orow[c] += wgt * x[c];
            }
        }
    }
}
