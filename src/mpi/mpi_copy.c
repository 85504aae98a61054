/* Moving rows between the caller's strided tensors and the contiguous buffers that MPI
 * transfers and the local kernels read. */
#include "mpi_internal.h"

#include <string.h>

/* Rows [t0, t0 + L) of every (b, h) of a strided tensor, D elements of es bytes each, and a
 * contiguous buffer of them: gather copies tensor to buffer, else buffer to tensor. */
static void move_rows(char *buf, char *tensor, const fa_strides *st, int64_t B, int64_t H, int64_t t0, int64_t L,
                      int64_t D, size_t es, int gather) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < L; t++, buf += (size_t)D * es) {
                char *row = tensor + (size_t)fa_offset(st, b, h, t0 + t, 0) * es;
                const int64_t step = st->s[3] == 1 ? D : 1, elems = st->s[3] == 1 ? 1 : D;
                for (int64_t x = 0; x < elems; x++) { /* one run of D when the row is contiguous */
                    char *e = row + (size_t)(x * st->s[3]) * es, *c = buf + (size_t)x * es;
                    if (gather) memcpy(c, e, (size_t)step * es);
                    else memcpy(e, c, (size_t)step * es);
                }
            }
}

void fa_mpi_gather_rows(void *dst, const void *src, const fa_strides *st, int64_t B, int64_t H,
                        int64_t t0, int64_t L, int64_t D, size_t es) {
    move_rows(dst, (char *)src, st, B, H, t0, L, D, es, 1); /* src is only read */
}

void fa_mpi_scatter_rows(void *dst, const fa_strides *st, const void *src, int64_t B, int64_t H,
                         int64_t t0, int64_t L, int64_t D, size_t es) {
    move_rows((char *)src, dst, st, B, H, t0, L, D, es, 0); /* src is only read */
}

void fa_mpi_store_f32(fa_dtype t, void *dst, const fa_strides *st, const float *src, int64_t B,
                      int64_t H, int64_t L, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++, src += D)
                for (int64_t x = 0; x < D; x++) fa_store(t, dst, fa_offset(st, b, h, i, x), src[x]);
}
