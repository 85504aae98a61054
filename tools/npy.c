/* .npy reader and writer (format versions 1.0, 2.0 and 3.0; little-endian arrays only). */
#define _GNU_SOURCE /* O_TMPFILE (Linux) */
#include "npy.h"
#include "flashattn.h" /* fa_malloc, fa_free: the allocation-failure tests reach these too */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAX_HEADER 65536 /* numpy itself refuses far smaller headers by default */

static int fail(int code, char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int fail(int code, char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *c = err; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    return code;
}

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Reverses every item of n items of size sz in place (for big-endian hosts). */
static void swap_items(void *data, int64_t n, size_t sz) {
    unsigned char *p = data;
    for (int64_t i = 0; i < n; i++, p += sz)
        for (size_t a = 0, b = sz - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

const char *npy_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "(");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    snprintf(buf + n, n < len ? len - n : 0, ndim == 1 ? ",)" : ")");
    return buf;
}

/* ---- the header dictionary ----------------------------------------------------------
 * A Python literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } with the
 * keys in any order, either quote, and whitespace anywhere between tokens. */

typedef struct {
    const char *s, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
        c->s++;
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return 1;
    }
    return 0;
}

/* A quoted string into out (at most outlen - 1 characters). */
static int parse_string(cursor *c, char *out, size_t outlen) {
    skip_ws(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"')) return 0;
    char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        /* no escapes, and no control characters: '<f4\0' is not '<f4' */
        if (*c->s == '\\' || (unsigned char)*c->s < 0x20 || *c->s == 0x7f || n + 1 >= outlen) return 0;
        out[n++] = *c->s++;
    }
    if (c->s >= c->end) return 0;
    c->s++;
    out[n] = 0;
    return 1;
}

static int parse_word(cursor *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->s) < n || memcmp(c->s, w, n) != 0) return 0;
    c->s += n;
    return 1;
}

/* Returns 1 ok, 0 malformed, -1 overflow. */
static int parse_dim(cursor *c, int64_t *v) {
    skip_ws(c);
    if (c->s >= c->end || *c->s < '0' || *c->s > '9') return 0;
    int64_t x = 0;
    while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
        int d = *c->s++ - '0';
        if (x > (INT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    if (c->s < c->end && *c->s == 'L') c->s++; /* Python 2 longs */
    *v = x;
    return 1;
}

static int parse_header_dict(const char *path, const char *text, size_t len, int accepted,
                             npy_header *h, char *err, size_t errlen) {
    cursor c = {text, text + len};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char descr[32] = "";
    if (!eat(&c, '{'))
        return fail(2, err, errlen, "%s: malformed .npy header (no '{')", path);
    while (!eat(&c, '}')) {
        char key[32];
        if (!parse_string(&c, key, sizeof key) || !eat(&c, ':'))
            return fail(2, err, errlen, "%s: malformed .npy header (expected 'key': value)",
                        path);
        if (strcmp(key, "descr") == 0 && !have_descr) {
            have_descr = 1;
            skip_ws(&c);
            if (c.s < c.end && *c.s == '[')
                return fail(2, err, errlen, "%s: structured dtypes are not supported", path);
            if (!parse_string(&c, descr, sizeof descr))
                return fail(2, err, errlen, "%s: malformed .npy header (bad 'descr')", path);
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            have_order = 1;
            if (parse_word(&c, "True")) fortran = 1;
            else if (!parse_word(&c, "False"))
                return fail(2, err, errlen, "%s: malformed .npy header (bad 'fortran_order')",
                            path);
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            if (!eat(&c, '('))
                return fail(2, err, errlen, "%s: malformed .npy header (shape is not a tuple)",
                            path);
            h->ndim = 0;
            while (!eat(&c, ')')) {
                if (h->ndim == NPY_MAX_DIMS)
                    return fail(2, err, errlen, "%s: more than %d dimensions", path,
                                NPY_MAX_DIMS);
                int r = parse_dim(&c, &h->shape[h->ndim]);
                if (r < 0) return fail(2, err, errlen, "%s: a shape entry overflows int64", path);
                if (r == 0)
                    return fail(2, err, errlen, "%s: malformed .npy header (bad shape entry)",
                                path);
                h->ndim++;
                if (eat(&c, ',')) continue;
                skip_ws(&c);
                if (c.s >= c.end || *c.s != ')')
                    return fail(2, err, errlen, "%s: malformed .npy header (bad shape tuple)",
                                path);
            }
        } else {
            return fail(2, err, errlen, "%s: .npy header has an unexpected or repeated key '%s'",
                        path, key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}'))
                return fail(2, err, errlen, "%s: malformed .npy header (expected ',' or '}')",
                            path);
            break;
        }
    }
    skip_ws(&c);
    if (c.s != c.end)
        return fail(2, err, errlen, "%s: malformed .npy header (text after the dictionary)",
                    path);
    if (!have_descr || !have_order || !have_shape)
        return fail(2, err, errlen, "%s: .npy header lacks '%s'", path,
                    !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    if (fortran)
        return fail(2, err, errlen,
                    "%s: fortran_order is True; only C-order arrays are supported", path);

    static const struct {
        const char *descr;
        int kind;
        size_t size;
        const char *name;
    } kinds[] = {{"<f4", NPY_F32, 4, "float32 '<f4'"},
                 {"<f2", NPY_F16, 2, "float16 '<f2'"},
                 {"<i4", NPY_I32, 4, "int32 '<i4'"},
                 {"<i8", NPY_I64, 8, "int64 '<i8'"},
                 {"|b1", NPY_BOOL, 1, "bool '|b1'"}};
    h->kind = 0;
    char want[160] = "";
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (accepted & kinds[i].kind) {
            size_t n = strlen(want);
            snprintf(want + n, sizeof want - n, "%s%s", n ? " or " : "", kinds[i].name);
        }
        if (strcmp(descr, kinds[i].descr) == 0 && (accepted & kinds[i].kind)) {
            h->kind = kinds[i].kind;
            h->itemsize = kinds[i].size;
        }
    }
    if (!h->kind)
        return fail(2, err, errlen, "%s: dtype '%s' is not supported here (want %s)", path,
                    descr, want);

    h->count = 1;
    for (int i = 0; i < h->ndim; i++) {
        if (h->shape[i] != 0 && h->count > INT64_MAX / h->shape[i])
            return fail(2, err, errlen, "%s: shape has more elements than int64 can count", path);
        h->count *= h->shape[i];
    }
    if (h->count > INT64_MAX / (int64_t)h->itemsize)
        return fail(2, err, errlen, "%s: shape's byte size overflows int64", path);
    return 0;
}

/* Validates the preamble and header of an open file; leaves the position at the data. */
static int read_header_fp(const char *path, FILE *f, int accepted, npy_header *h, char *err,
                          size_t errlen) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        return fail(2, err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail(2, err, errlen, "%s: not a regular file", path);
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, f);
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
        return fail(2, err, errlen, "%s: not a .npy file (bad magic or too short)", path);
    if (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
        return fail(2, err, errlen, "%s: unsupported .npy format version %u.%u", path, pre[6],
                    pre[7]);
    uint32_t hlen;
    int64_t start = 10;
    if (pre[6] == 1) {
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
    } else {
        if (fread(pre + 10, 1, 2, f) != 2)
            return fail(2, err, errlen, "%s: truncated .npy preamble", path);
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
        start = 12;
    }
    if (hlen == 0 || hlen > NPY_MAX_HEADER)
        return fail(2, err, errlen, "%s: implausible .npy header length %u", path, hlen);
    if ((int64_t)st.st_size < start + (int64_t)hlen)
        return fail(2, err, errlen, "%s: truncated: header length %u runs past the end (%lld bytes)",
                    path, hlen, (long long)st.st_size);
    char *text = fa_malloc(hlen);
    if (!text) return fail(1, err, errlen, "%s: out of memory reading the header", path);
    if (fread(text, 1, hlen, f) != hlen) {
        fa_free(text);
        return fail(2, err, errlen, "%s: cannot read the .npy header", path);
    }
    memset(h, 0, sizeof *h);
    int rc = parse_header_dict(path, text, hlen, accepted, h, err, errlen);
    fa_free(text);
    if (rc) return rc;
    h->data_offset = start + hlen;
    int64_t need = h->count * (int64_t)h->itemsize, have = (int64_t)st.st_size - h->data_offset;
    char sh[256];
    npy_shape_str(h->ndim, h->shape, sh, sizeof sh);
    if (have < need)
        return fail(2, err, errlen, "%s: truncated: shape %s needs %lld data bytes but the file has %lld",
                    path, sh, (long long)need, (long long)have);
    if (have > need)
        return fail(2, err, errlen, "%s: %lld bytes beyond the data of shape %s (wrong header?)",
                    path, (long long)(have - need), sh);
    return 0;
}

/* An input that cannot be opened is bad input (exit 2), unless the system failed rather
 * than the path (out of memory, out of descriptors, an I/O error: exit 1, docs/cli.md). */
static FILE *open_input(const char *path, char *err, size_t errlen, int *rc) {
    /* O_NONBLOCK: opening a FIFO with no writer would block until one came (the CLI hung);
     * such a path is refused as not a regular file before anything is read */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    FILE *f = NULL;
    if (fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        *rc = fail(2, err, errlen, "%s: not a regular file", path);
        return NULL;
    }
    if (fd >= 0 && !(f = fdopen(fd, "rb"))) close(fd);
    if (!f) {
        const int e = errno, system = e == ENOMEM || e == EMFILE || e == ENFILE || e == EIO || e == EINTR;
        *rc = fail(system ? 1 : 2, err, errlen, "%s: cannot open: %s", path, strerror(e));
    }
    return f;
}

int npy_read_header(const char *path, int accepted, npy_header *h, char *err, size_t errlen) {
    int rc = 0;
    FILE *f = open_input(path, err, errlen, &rc);
    if (!f) return rc;
    rc = read_header_fp(path, f, accepted, h, err, errlen);
    fclose(f);
    return rc;
}

int npy_read(const char *path, int accepted, npy_header *h, void **data, char *err,
             size_t errlen) {
    *data = NULL;
    int rc = 0;
    FILE *f = open_input(path, err, errlen, &rc);
    if (!f) return rc;
    rc = read_header_fp(path, f, accepted, h, err, errlen);
    if (rc) {
        fclose(f);
        return rc;
    }
    size_t bytes = (size_t)h->count * h->itemsize;
    void *buf = fa_malloc(bytes ? bytes : 1);
    if (!buf) {
        fclose(f);
        return fail(1, err, errlen, "%s: out of memory (%zu bytes)", path, bytes);
    }
    if (fread(buf, 1, bytes, f) != bytes) {
        fclose(f);
        fa_free(buf);
        return fail(2, err, errlen, "%s: cannot read the data", path);
    }
    fclose(f);
    if (!host_is_little_endian()) swap_items(buf, h->count, h->itemsize);
    *data = buf;
    return 0;
}

/* ---- writing -------------------------------------------------------------------------- */

/* Temporaries not yet renamed or removed: an interrupting signal removes them too. */
#define NPY_MAX_LIVE 16
static char *volatile live[NPY_MAX_LIVE];

static void on_signal(int sig) {
    for (int i = 0; i < NPY_MAX_LIVE; i++)
        if (live[i]) unlink(live[i]);
    raise(sig); /* SA_RESETHAND restored the default action */
}

static void track(char *tmp, int add) {
    static int installed;
    if (add && !installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        const int sigs[] = {SIGINT, SIGTERM, SIGHUP}; /* SIGPIPE: ignored (flashattn.c's main) */
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
        installed = 1;
    }
    for (int i = 0; i < NPY_MAX_LIVE; i++)
        if (add ? !live[i] : live[i] == tmp) {
            live[i] = add ? tmp : NULL;
            return;
        }
}

/* The directory part of path ("." if none), into buf. */
static const char *dir_of(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ".";
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= len) n = len - 1;
    memcpy(buf, path, n);
    buf[n] = 0;
    return buf;
}

int npy_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    /* not both there yet (or dangling links): compare where each would be created */
    char da[4096], db[4096];
    char *ra = realpath(dir_of(a, da, sizeof da), NULL), *rb = realpath(dir_of(b, db, sizeof db), NULL);
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    int same = ra && rb ? !strcmp(ra, rb) && !strcmp(ba ? ba + 1 : a, bb ? bb + 1 : b) : !strcmp(a, b);
    free(ra);
    free(rb);
    return same;
}

/* A named temporary beside the target (same directory, so rename is atomic), tracked for
 * the signal handler, with the usual mode (mkstemp makes it 0600). */
static int make_named_tmp(npy_out *o) {
    int fd = mkstemp(o->tmp);
    if (fd < 0) return -1;
    track(o->tmp, 1);
    mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    return fd;
}

int npy_out_open(npy_out *o, const char *path, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    struct stat st; /* lstat: a symbolic link is replaced, never followed (docs/cli.md) */
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        return fail(2, err, errlen, "%s: output path exists and is not a regular file", path);
    size_t n = strlen(path);
    o->path = fa_malloc(n + 1);
    o->tmp = fa_malloc(n + 16);
    if (!o->path || !o->tmp) {
        npy_out_abort(o);
        return fail(1, err, errlen, "%s: out of memory", path);
    }
    memcpy(o->path, path, n + 1);
    char dbuf[4096];
    const char *dir = dir_of(path, dbuf, sizeof dbuf);
    /* The name is checked now, not when the finished data is moved into place: a name too
     * long fails at once, and one that fits but leaves no room for the temporary's suffix
     * gets a temporary of a short name of its own in the same directory. */
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    long name_max = pathconf(dir, _PC_NAME_MAX);
    if (name_max <= 0) name_max = 255;
    if ((long)strlen(base) > name_max) {
        npy_out_abort(o);
        return fail(2, err, errlen, "%s: file name too long (%zu bytes; this directory takes %ld)", path,
                    strlen(base), name_max);
    }
    if ((long)strlen(base) + 11 <= name_max)
        snprintf(o->tmp, n + 16, "%s.tmp-XXXXXX", path);
    else
        snprintf(o->tmp, n + 16, "%.*s.fa-XXXXXX", (int)(base - path), path);
    /* An unnamed file in the target's directory (Linux O_TMPFILE): a run killed before the
     * commit leaves nothing behind. Where the file system has none, the named temporary is
     * made only when the data is ready (npy_out_write); the directory is checked now. */
    int fd = -1;
#ifdef O_TMPFILE
    if (access("/proc/self/fd", X_OK) == 0) /* the commit links it through /proc */
        fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
#endif
    if (fd < 0 && access(dir, W_OK) != 0) {
        int e = errno;
        npy_out_abort(o);
        return fail(2, err, errlen, "%s: cannot create output: %s", path, strerror(e));
    }
    if (fd >= 0) {
        o->unnamed = 1;
        if (!(o->f = fdopen(fd, "wb"))) {
            close(fd);
            npy_out_abort(o);
            return fail(1, err, errlen, "%s: cannot open the temporary output", path);
        }
    }
    return 0;
}

/* Makes the named temporary where there is no unnamed file (now that the data is ready). */
static int ensure_file(npy_out *o, char *err, size_t errlen) {
    if (o->f) return 0;
    int fd = make_named_tmp(o);
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fail(2, err, errlen, "%s: cannot create output: %s", o->path, strerror(e));
    }
    o->named = 1;
    return 0;
}

/* Ends the writing: an unnamed file is flushed and stays open (its fd is what commit links),
 * a named one is closed. ok: whether every write succeeded; e: the errno of a failed one. */
static int finish_write(npy_out *o, int ok, int e, char *err, size_t errlen) {
    if (o->unnamed) ok = fflush(o->f) == 0 && ok;
    else {
        ok = (fclose(o->f) == 0) && ok;
        o->f = NULL;
    }
    if (!ok && !e) e = errno;
    if (!ok) return fail(1, err, errlen, "%s: writing failed: %s", o->path, strerror(e));
    o->written = 1;
    return 0;
}

int npy_out_write(npy_out *o, int ndim, const int64_t *shape, const float *data, char *err,
                  size_t errlen) {
    char sh[256], dict[400];
    npy_shape_str(ndim, shape, sh, sizeof sh);
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", sh);
    if (len < 0 || (size_t)len + 1 >= sizeof dict - 64)
        return fail(2, err, errlen, "%s: shape too long for a header", o->path);
    /* Pad with spaces so the data starts at a multiple of 64, then end with a newline. */
    size_t total = 10 + (size_t)len + 1;
    size_t pad = (64 - total % 64) % 64;
    memset(dict + len, ' ', pad);
    dict[len + pad] = '\n';
    size_t hlen = (size_t)len + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= shape[i];
    int rc = ensure_file(o, err, errlen);
    if (rc) return rc;
    errno = 0;
    int ok = fwrite(pre, 1, 10, o->f) == 10 && fwrite(dict, 1, hlen, o->f) == hlen;
    if (host_is_little_endian()) {
        ok = ok && fwrite(data, sizeof(float), (size_t)count, o->f) == (size_t)count;
    } else {
        for (int64_t i = 0; ok && i < count; i++) {
            float x = data[i];
            swap_items(&x, 1, sizeof x);
            ok = fwrite(&x, sizeof x, 1, o->f) == 1;
        }
    }
    return finish_write(o, ok, ok ? 0 : errno, err, errlen);
}

int npy_out_write_bytes(npy_out *o, const void *data, size_t len, char *err, size_t errlen) {
    int rc = ensure_file(o, err, errlen);
    if (rc) return rc;
    errno = 0;
    const int ok = fwrite(data, 1, len, o->f) == len;
    return finish_write(o, ok, ok ? 0 : errno, err, errlen);
}

/* Gives the unnamed file the temporary's name (linkat cannot replace a target; rename then
 * can), so the name exists only for the instant before the rename. */
static int link_unnamed(npy_out *o) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fileno(o->f));
    for (int tries = 0; tries < 100; tries++) {
        int fd = make_named_tmp(o); /* reserves a fresh name ... */
        if (fd < 0) return -1;
        close(fd);
        unlink(o->tmp); /* ... which linkat then takes */
        if (linkat(AT_FDCWD, proc, AT_FDCWD, o->tmp, AT_SYMLINK_FOLLOW) == 0) {
            o->named = 1;
            return 0;
        }
        track(o->tmp, 0);
        if (errno != EEXIST) return -1;
        memcpy(o->tmp + strlen(o->tmp) - 6, "XXXXXX", 6);
    }
    return -1;
}

int npy_out_prepare(npy_out *o, char *err, size_t errlen) {
    if (!o->written || (o->unnamed && !o->named && link_unnamed(o) != 0)) {
        int e = errno;
        int rc = fail(1, err, errlen, "%s: cannot move the output into place: %s", o->path,
                      o->written ? strerror(e) : "nothing written");
        npy_out_abort(o);
        return rc;
    }
    return 0;
}

int npy_out_commit(npy_out *o, char *err, size_t errlen) {
    if (!o->written || (o->unnamed && !o->named && link_unnamed(o) != 0) || rename(o->tmp, o->path) != 0) {
        int e = errno;
        int rc = fail(1, err, errlen, "%s: cannot move the output into place: %s", o->path,
                      o->written ? strerror(e) : "nothing written");
        npy_out_abort(o);
        return rc;
    }
    track(o->tmp, 0);
    fa_free(o->tmp);
    o->tmp = NULL;
    npy_out_abort(o);
    return 0;
}

void npy_out_abort(npy_out *o) {
    if (o->f) fclose(o->f);
    if (o->tmp && o->named) {
        unlink(o->tmp);
        track(o->tmp, 0);
    }
    fa_free(o->tmp);
    fa_free(o->path);
    memset(o, 0, sizeof *o);
}

int npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                  char *err, size_t errlen) {
    npy_out o;
    int rc = npy_out_open(&o, path, err, errlen);
    if (!rc) rc = npy_out_write(&o, ndim, shape, data, err, errlen);
    if (!rc) rc = npy_out_commit(&o, err, errlen);
    npy_out_abort(&o);
    return rc;
}
