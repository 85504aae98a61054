/* The public face of dropout's keep rule (philox.h): its exact keep rate and the mask
 * itself, computed by the same code the kernels run. */
#include "internal.h"
#include "philox.h"

static int dropout_p_valid(float p) { return p >= 0.0f && p < 1.0f; } /* NaN fails both */

double fa_dropout_keep_rate(float dropout_p) {
    if (!dropout_p_valid(dropout_p)) return -1.0;
    return fa_dropout_threshold(dropout_p) / 256.0;
}

fa_status fa_dropout_keep_mask(float dropout_p, uint64_t seed, uint64_t offset, int64_t b, int64_t h,
                               int64_t i0, int64_t n_rows, int64_t j0, int64_t n_cols, uint8_t *out) {
    if (!dropout_p_valid(dropout_p))
        return fa_error(FA_ERR_INVALID, "fa_dropout_keep_mask: dropout_p must be in [0, 1), got %g", (double)dropout_p);
    if (b < 0 || h < 0 || i0 < 0 || j0 < 0 || n_rows < 0 || n_cols < 0 || n_cols > INT32_MAX)
        return fa_error(FA_ERR_INVALID,
                        "fa_dropout_keep_mask: indices and counts must be >= 0 (n_cols <= %d), got b %lld, h %lld, "
                        "i0 %lld, n_rows %lld, j0 %lld, n_cols %lld",
                        INT32_MAX, (long long)b, (long long)h, (long long)i0, (long long)n_rows, (long long)j0,
                        (long long)n_cols);
    int64_t end, bytes;
    if (__builtin_add_overflow(i0, n_rows, &end) || __builtin_add_overflow(j0, n_cols, &end) ||
        __builtin_mul_overflow(n_rows, n_cols, &bytes)) /* the last row's and column's indices, the mask's bytes */
        return fa_error(FA_ERR_OVERFLOW, "fa_dropout_keep_mask: i0 + n_rows, j0 + n_cols or n_rows x n_cols "
                                         "overflows int64 (i0 %lld, n_rows %lld, j0 %lld, n_cols %lld)",
                        (long long)i0, (long long)n_rows, (long long)j0, (long long)n_cols);
    if (n_rows && n_cols && !out) return fa_error(FA_ERR_NULL, "fa_dropout_keep_mask: out is NULL");
    fa_dropout d = fa_dropout_make(dropout_p, seed, offset);
    for (int64_t r = 0; r < n_rows; r++) fa_dropout_row(&d, b, h, i0 + r, j0, (int)n_cols, out + r * n_cols);
    return FA_OK;
}
