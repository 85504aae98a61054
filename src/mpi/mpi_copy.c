/* Moving rows between the caller's strided tensors and the contiguous buffers that MPI
 * transfers and the local kernels read. */
#include "mpi_internal.h"

#include <string.h>

void fa_mpi_gather_rows(void *dst, const void *src, const fa_strides *st, int64_t B, int64_t H,
                        int64_t t0, int64_t L, int64_t D, size_t es) {
    char *d = dst;
    const char *s = src;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < L; t++, d += (size_t)D * es) {
                const char *row = s + (size_t)fa_offset(st, b, h, t0 + t, 0) * es;
                if (st->s[3] == 1) {
                    memcpy(d, row, (size_t)D * es);
                    continue;
                }
                for (int64_t x = 0; x < D; x++) memcpy(d + (size_t)x * es, row + (size_t)(x * st->s[3]) * es, es);
            }
}

void fa_mpi_scatter_rows(void *dst, const fa_strides *st, const void *src, int64_t B, int64_t H,
                         int64_t t0, int64_t L, int64_t D, size_t es) {
    char *d = dst;
    const char *s = src;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < L; t++, s += (size_t)D * es) {
                char *row = d + (size_t)fa_offset(st, b, h, t0 + t, 0) * es;
                if (st->s[3] == 1) {
                    memcpy(row, s, (size_t)D * es);
                    continue;
                }
                for (int64_t x = 0; x < D; x++) memcpy(row + (size_t)(x * st->s[3]) * es, s + (size_t)x * es, es);
            }
}

void fa_mpi_store_f32(fa_dtype t, void *dst, const fa_strides *st, const float *src, int64_t B,
                      int64_t H, int64_t L, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++, src += D)
                for (int64_t x = 0; x < D; x++) fa_store(t, dst, fa_offset(st, b, h, i, x), src[x]);
}
