/* .npy files: a strict reader (header validated before any data is trusted) and a writer
 * that never leaves a partial file (it writes a temporary beside the target, then renames).
 *
 * Every function returns 0 on success, 2 when the file or the caller's request is bad
 * input (missing, unreadable or malformed file; an output path that cannot be created),
 * 1 on other failures (out of memory, a failed write); err then holds one line naming the
 * file and the problem. These are the command line's exit codes. */
#ifndef FA_TOOLS_NPY_H
#define FA_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8
#define NPY_ERR_LEN 512

/* Element types a caller may accept, as a bit mask. */
enum { NPY_F32 = 1, NPY_F16 = 2, NPY_I32 = 4, NPY_I64 = 8, NPY_BOOL = 16 };

typedef struct {
    int kind;        /* one of NPY_F32, NPY_F16, NPY_I32, NPY_I64, NPY_BOOL */
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;   /* product of shape */
    size_t itemsize;
    int64_t data_offset; /* where the data starts in the file */
} npy_header;

/* Reads and validates the header of path only; accepted is a mask of NPY_* kinds. */
int npy_read_header(const char *path, int accepted, npy_header *h, char *err, size_t errlen);

/* Reads header and data; *data is malloc'ed (count * itemsize bytes, host byte order). */
int npy_read(const char *path, int accepted, npy_header *h, void **data, char *err,
             size_t errlen);

/* Formats a shape as "(2, 3, 4)" into buf. */
const char *npy_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

/* A float32 output in progress, which appears under its name only when complete:
 * npy_out_open checks the target and (on Linux) opens an unnamed file in its directory
 * (O_TMPFILE), npy_out_write fills it, npy_out_commit links it as PATH.tmp-XXXXXX and renames
 * that onto the target at once. Where the file system has no unnamed files, npy_out_write
 * creates the named temporary. A run killed before the commit leaves neither a partial
 * output nor a temporary; npy_out_abort removes what exists (safe at any point, and after
 * commit it does nothing). */
typedef struct {
    char *path;
    char *tmp;
    FILE *f;
    int written;
    int unnamed; /* f is an O_TMPFILE file */
    int named;   /* tmp exists on disk */
} npy_out;

int npy_out_open(npy_out *o, const char *path, char *err, size_t errlen);
int npy_out_write(npy_out *o, int ndim, const int64_t *shape, const float *data, char *err,
                  size_t errlen);
/* The same for any file's bytes (the rates cache, tools/rates.c): written whole, once. */
int npy_out_write_bytes(npy_out *o, const void *data, size_t len, char *err, size_t errlen);
int npy_out_commit(npy_out *o, char *err, size_t errlen);
/* The part of npy_out_commit that can fail for want of room (a name for an unnamed file
 * needs an inode): a command with several outputs prepares them all before it commits any,
 * so that a failure leaves every target untouched (renames then only replace names). */
int npy_out_prepare(npy_out *o, char *err, size_t errlen);
void npy_out_abort(npy_out *o);

/* Whether two output paths name one file, however spelled ("out/o.npy", "./out/o.npy", a
 * link): commits rename onto each path in turn, so of two such outputs only the last would
 * survive. The same file where both exist (st_dev, st_ino), else the same directory entry
 * (the directory's realpath plus the base name), else (a directory that cannot be resolved,
 * which npy_out_open then refuses) the same string. */
int npy_same_file(const char *a, const char *b);

/* open + write + commit, for a single output. */
int npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                  char *err, size_t errlen);

#endif
