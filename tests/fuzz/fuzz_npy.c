/* Fuzzes the .npy reader (tools/npy.c) on arbitrary file contents. The reader takes a path
 * and insists on a regular file, so each input is written to a scratch file first.
 * Invariants checked: a failure returns 1 or 2 with a one-line message and no data; a
 * success gives a header consistent with the bytes (count = product of shape, data size =
 * file size - data offset) and data that survives a write + read round trip unchanged. */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char in_path[64], out_path[64];

static void remove_scratch(void) {
    unlink(in_path);
    unlink(out_path);
}

static void scratch_names(void) {
    if (in_path[0]) return;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(in_path, sizeof in_path, "%s/fa_fuzz_npy_%ld.npy", dir, (long)getpid());
    snprintf(out_path, sizeof out_path, "%s/fa_fuzz_npy_out_%ld.npy", dir, (long)getpid());
    atexit(remove_scratch);
}

static void check_message(int rc, const char *err) {
    if (rc != 1 && rc != 2) {
        fprintf(stderr, "npy: return code %d is not 0, 1 or 2\n", rc);
        abort();
    }
    if (!err[0] || strchr(err, '\n')) {
        fprintf(stderr, "npy: failure without a one-line message: '%s'\n", err);
        abort();
    }
}

static void check_header(const npy_header *h, long file_size) {
    int64_t count = 1;
    for (int i = 0; i < h->ndim; i++) count *= h->shape[i];
    const size_t want_size = h->kind == NPY_F16 ? 2 : 4;
    if (h->ndim < 0 || h->ndim > NPY_MAX_DIMS || count != h->count || h->itemsize != want_size ||
        h->data_offset + h->count * (int64_t)h->itemsize != file_size) {
        fprintf(stderr, "npy: inconsistent header: ndim %d count %lld itemsize %zu offset %lld, file %ld bytes\n",
                h->ndim, (long long)h->count, h->itemsize, (long long)h->data_offset, file_size);
        abort();
    }
}

/* A float32 array read back after writing must be the same shape and bits. */
static void round_trip(const npy_header *h, const void *data) {
    char err[NPY_ERR_LEN] = "";
    int rc = npy_write_f32(out_path, h->ndim, h->shape, data, err, sizeof err);
    if (rc) {
        fprintf(stderr, "npy: writing back a valid array failed: %s\n", err);
        abort();
    }
    npy_header h2;
    void *back = NULL;
    rc = npy_read(out_path, NPY_F32, &h2, &back, err, sizeof err);
    if (rc || h2.ndim != h->ndim || h2.count != h->count ||
        memcmp(h2.shape, h->shape, sizeof(int64_t) * (size_t)h->ndim) != 0 ||
        memcmp(back, data, (size_t)h->count * 4) != 0) {
        fprintf(stderr, "npy: round trip changed the array (rc %d: %s)\n", rc, err);
        abort();
    }
    free(back);
    unlink(out_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    scratch_names();
    FILE *f = fopen(in_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "npy: cannot write the scratch file %s\n", in_path);
        abort();
    }
    /* every subset of accepted kinds a caller uses */
    static const int accepted[] = {NPY_F32, NPY_F32 | NPY_F16, NPY_I32, NPY_F32 | NPY_F16 | NPY_I32};
    for (size_t a = 0; a < sizeof accepted / sizeof accepted[0]; a++) {
        npy_header h, hh;
        void *buf = (void *)1;
        char err[NPY_ERR_LEN] = "";
        int rc = npy_read(in_path, accepted[a], &h, &buf, err, sizeof err);
        char err2[NPY_ERR_LEN] = "";
        int rc2 = npy_read_header(in_path, accepted[a], &hh, err2, sizeof err2);
        if (rc != rc2 || (rc == 0 && memcmp(&h, &hh, sizeof h) != 0)) {
            fprintf(stderr, "npy: npy_read (%d) and npy_read_header (%d) disagree\n", rc, rc2);
            abort();
        }
        if (rc) {
            check_message(rc, err);
            if (buf) {
                fprintf(stderr, "npy: failure left data behind\n");
                abort();
            }
            continue;
        }
        if (!(h.kind & accepted[a])) {
            fprintf(stderr, "npy: kind %d was not asked for (%d)\n", h.kind, accepted[a]);
            abort();
        }
        check_header(&h, (long)size);
        if (h.kind == NPY_F32) round_trip(&h, buf);
        free(buf);
    }
    return 0;
}
