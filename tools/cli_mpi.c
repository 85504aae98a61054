/* `flashattn run|grad|bench --seq-parallel ring|ulysses [--zigzag]` under mpirun: every rank
 * reads its own rows of the .npy inputs (docs/mpi.md gives the layout), the ranks run
 * fa_mpi_forward / fa_mpi_backward together, and rank 0 gathers the outputs and writes them
 * (temporaries renamed into place only when all succeed). Every rank ends with the same exit
 * code: after each phase the ranks agree on the worst one, so none waits for a peer that
 * stopped. Built without MPI, these commands say so and exit 1. */
#include "cli.h"

#ifdef FA_HAVE_MPI
#include "flashattn_mpi.h"

#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int P, R;

static int agree_rc(int rc) {
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return rc;
}

static fa_mpi_layout layout_of(const cli_args *a) { return a->zigzag ? FA_MPI_ZIGZAG : FA_MPI_CONTIGUOUS; }
static fa_mpi_method method_of(const cli_args *a) {
    return a->seq_parallel == CLI_SP_ULYSSES ? FA_MPI_ULYSSES : FA_MPI_RING;
}

/* Flags of features sequence parallel does not run with (a bias, the inference shapes):
 * the library's backend table refuses them (exit 2, naming both), asked with a problem
 * that has them before any file is read as a dense tensor; only their presence matters. */
static int refuse_features(const cli_args *a) {
    static const int32_t mark[1] = {0}; /* never read: the refusal comes first */
    fa_problem p;
    fa_problem_init(&p);
    p.batch = p.heads_q = p.seq_q = p.seq_k = p.head_dim = 1;
    p.has_bias = a->bias != NULL;
    p.cu_seqlens_q = a->cu_seqlens_q ? mark : NULL;
    p.cu_seqlens_k = a->cu_seqlens_k ? mark : NULL;
    p.cache_seqlens = a->cache_seqlens ? mark : NULL;
    p.has_new_kv = a->k_new || a->v_new || a->update_cache;
    p.page_size = a->block_table ? 16 : 0;
    if (!p.has_bias && !p.cu_seqlens_q && !p.cu_seqlens_k && !p.cache_seqlens && !p.has_new_kv && !p.page_size)
        return 0;
    fa_mpi_plan *pl = NULL;
    fa_status st = fa_mpi_plan_create(&p, NULL, method_of(a), layout_of(a), P, R, &pl);
    fa_mpi_plan_destroy(pl);
    return st != FA_OK ? cli_fail_status(st, "--seq-parallel") : 0;
}

/* This rank's rows of a [B, H, S, D] .npy (header h checked) in dtype t: runs of consecutive
 * rows read straight from the file, never the whole tensor. */
static int read_rows(const char *flag, const char *path, const npy_header *h, fa_dtype t,
                     fa_mpi_layout lay, void **out) {
    const int64_t B = h->shape[0], H = h->shape[1], S = h->shape[2], D = h->shape[3], L = S / P;
    const int64_t runs = lay == FA_MPI_ZIGZAG ? 2 : 1, len = L / runs;
    size_t es = fa_dtype_size(t), isz = h->itemsize;
    char *x = malloc((size_t)(B * H * L * D) * es + 1), *tmp = malloc((size_t)(len * D) * isz + 1);
    FILE *f = fopen(path, "rb");
    int rc = 0;
    if (!x || !tmp) rc = cli_fail(1, "%s %s: out of memory", flag, path);
    else if (!f) rc = cli_fail(2, "%s %s: cannot open", flag, path);
    for (int64_t bh = 0; !rc && bh < B * H; bh++)
        for (int64_t r = 0; !rc && r < runs; r++) {
            int64_t g0 = fa_mpi_layout_row(lay, P, R, S, r * len), n = len * D;
            if (fseeko(f, (off_t)(h->data_offset + (int64_t)isz * ((bh * S + g0) * D)), SEEK_SET) != 0 ||
                fread(tmp, isz, (size_t)n, f) != (size_t)n) {
                rc = cli_fail(2, "%s %s: cannot read rows %" PRId64 "..%" PRId64, flag, path, g0, g0 + len);
                break;
            }
            int64_t at = (bh * L + r * len) * D;
            /* .npy is little-endian, as x86 */
            fa_convert(h->kind == NPY_F32 ? FA_F32 : FA_F16, tmp, t, x + (size_t)at * es, (size_t)n);
        }
    if (f) fclose(f);
    free(tmp);
    if (rc) free(x);
    else *out = x;
    return rc;
}

/* This rank's rows of [B, S] segment ids (whole array ids). */
static int32_t *slice_ids(const int32_t *ids, int64_t B, int64_t S, fa_mpi_layout lay) {
    int64_t L = S / P;
    int32_t *x = malloc((size_t)(B * L) * 4 + 1);
    if (!x) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L; t++) x[b * L + t] = ids[b * S + fa_mpi_layout_row(lay, P, R, S, t)];
    return x;
}

typedef struct {
    const char *flag, *path;
    int ndim;
    int64_t shape[4]; /* [B, H, S, D] (lse: D = 1, written 3-D) */
    int which;        /* q-like (0) or k-like (1) rows */
    int whole;        /* not rows: the same on every rank, written from rank 0's (dsink [Hq]) */
    void *local;      /* this rank's rows, in dtype (lse: f32) */
    int is_f32;
    npy_out file;
} output;

/* Every rank's rows of an output to rank 0, which writes the whole tensor's temporary. */
static int gather_write(output *o, fa_dtype t, fa_mpi_layout lay, int rc) {
    if (o->whole) {
        char err[NPY_ERR_LEN];
        if (!rc && R == 0 && npy_out_write(&o->file, o->ndim, o->shape, o->local, err, sizeof err))
            rc = cli_fail(1, "%s %s", o->flag, err);
        return agree_rc(rc);
    }
    int64_t B = o->shape[0], H = o->shape[1], S = o->shape[2], D = o->ndim == 4 ? o->shape[3] : 1;
    int64_t L = S / P, n = B * H * L * D;
    float *loc = o->is_f32 ? o->local : cli_to_f32(t, o->local, n);
    float *all = R == 0 ? malloc((size_t)(n * P) * 4 + 1) : NULL, *full = R == 0 ? malloc((size_t)(n * P) * 4 + 1) : NULL;
    int mine = (!loc || (R == 0 && (!all || !full))) ? cli_fail(1, "%s: out of memory", o->flag) : 0;
    if (B * H * L > INT32_MAX && !mine) mine = cli_fail(1, "%s: too many rows to gather", o->flag);
    rc = agree_rc(rc > mine ? rc : mine);
    if (!rc) {
        MPI_Datatype row;
        MPI_Type_contiguous((int)D, MPI_FLOAT, &row);
        MPI_Type_commit(&row);
        MPI_Gather(loc, (int)(B * H * L), row, all, (int)(B * H * L), row, 0, MPI_COMM_WORLD);
        MPI_Type_free(&row);
        if (R == 0) {
            for (int s = 0; s < P; s++)
                for (int64_t bh = 0; bh < B * H; bh++)
                    for (int64_t i = 0; i < L; i++)
                        memcpy(full + (bh * S + fa_mpi_layout_row(lay, P, s, S, i)) * D,
                               all + ((s * B * H + bh) * L + i) * D, (size_t)D * 4);
            char err[NPY_ERR_LEN];
            if (npy_out_write(&o->file, o->ndim, o->shape, full, err, sizeof err))
                rc = cli_fail(1, "%s %s", o->flag, err);
        }
    }
    if (loc != o->local) free(loc);
    free(all), free(full);
    return rc;
}

/* Each rank's line, flushed before any output is written: 1 where this rank's stdout
 * failed (the ranks agree on it with the writing, so nothing is then committed). */
static int print_counts(const fa_mpi_stats *s) {
    int rc = 0;
    for (int r = 0; r < P; r++) { /* in rank order, as far as mpirun's forwarding keeps it */
        MPI_Barrier(MPI_COMM_WORLD);
        if (r != R) continue;
        printf("{\"rank\": %d, \"flops\": %" PRId64 ", \"transcendentals\": %" PRId64
               ", \"bytes_sent\": %" PRId64 ", \"bytes_received\": %" PRId64 "}\n",
               R, s->counts.flops, s->counts.transcendentals, s->bytes_sent, s->bytes_received);
        rc = cli_flush_stdout();
    }
    return rc;
}

/* Rank 0 shows the progress a single process would (cli_progress_wanted): with --progress,
 * or by itself for a forward over 500 GFLOP in all, the ranks' shares summed (every rank
 * calls this: a collective; rank 0's share times P missed a contiguous causal ring, whose
 * rank 0 has the least work). */
static int progress_wanted(const cli_args *a, const fa_mpi_plan *pl) {
    fa_mpi_cost c;
    double flops = fa_mpi_plan_cost(pl, FA_FORWARD, &c) == FA_OK ? (double)c.flops : 0.0;
    MPI_Allreduce(MPI_IN_PLACE, &flops, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return R == 0 && (a->progress || flops > 5e11);
}

static int run_body(const cli_args *a) {
    const int grad = a->cmd == CMD_GRAD;
    const fa_mpi_layout lay = layout_of(a);
    npy_header hq, hk, hv, hdo;
    fa_problem p;
    fa_options opt;
    cli_extras x = {0};
    fa_mpi_plan *pl = NULL;
    output outs[6];
    int nout = 0, opened = 0, dq_at = -1; /* dq, dk, dv: outs[dq_at..] (grad) */
    void *in[4] = {0};
    int32_t *ids[2] = {0};
    int rc = refuse_features(a);
    if (!rc) rc = cli_run_problem(a, &hq, &hk, &hv, &hdo, &p, &opt);
    if (!rc) rc = cli_extras_load(a, &p, 0, &x);
    if (!rc) {
        fa_status st = fa_mpi_plan_create(&p, &opt, method_of(a), lay, P, R, &pl);
        if (st != FA_OK) rc = cli_fail_status(st, "invalid problem");
    }
    if (!rc) {
        const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv;
        const struct { const char *flag, *path; int ndim, which, f32; int64_t s[4]; } want[6] = {
            {"--out", a->out, 4, 0, 0, {B, Hq, p.seq_q, p.head_dim_v}},
            {"--lse", a->lse, 3, 0, 1, {B, Hq, p.seq_q, 1}},
            {"--dq", a->dq, 4, 0, 0, {B, Hq, p.seq_q, p.head_dim}},
            {"--dk", a->dk, 4, 1, 0, {B, Hk, p.seq_k, p.head_dim}},
            {"--dv", a->dv, 4, 1, 0, {B, Hk, p.seq_k, p.head_dim_v}},
            {"--dsink", a->dsink, 1, 0, 1, {Hq, 1, 1, 1}}};
        for (int i = 0; i < 6 && !rc; i++) {
            if (!want[i].path) continue;
            for (int j = 0; j < nout && !rc; j++)
                if (npy_same_file(outs[j].path, want[i].path))
                    rc = cli_fail(2, "%s and %s name the same file %s", outs[j].flag, want[i].flag, want[i].path);
            output *o = &outs[nout++];
            memset(o, 0, sizeof *o);
            o->flag = want[i].flag, o->path = want[i].path, o->ndim = want[i].ndim;
            o->which = want[i].which, o->is_f32 = want[i].f32, o->whole = i == 5;
            memcpy(o->shape, want[i].s, sizeof o->shape);
            if (i == 2) dq_at = nout - 1;
            int64_t n = o->whole ? o->shape[0] : o->shape[0] * o->shape[1] * o->shape[2] / P * o->shape[3];
            o->local = malloc((size_t)n * (o->is_f32 ? 4 : fa_dtype_size(p.dtype)) + 1);
            if (!o->local) rc = cli_fail(1, "out of memory");
        }
        char err[NPY_ERR_LEN];
        for (; R == 0 && !rc && opened < nout; opened++)
            if ((rc = npy_out_open(&outs[opened].file, outs[opened].path, err, sizeof err)))
                cli_fail(rc, "%s %s", outs[opened].flag, err);
    }
    if ((rc = agree_rc(rc))) goto done;
    /* the data: this rank's rows only (option files are small and read whole) */
    rc = read_rows("--q", a->q, &hq, p.dtype, lay, &in[0]);
    if (!rc) rc = read_rows("--k", a->k, &hk, p.dtype, lay, &in[1]);
    if (!rc) rc = read_rows("--v", a->v, &hv, p.dtype, lay, &in[2]);
    if (!rc && grad) rc = read_rows("--do", a->d_o, &hdo, p.dtype, lay, &in[3]);
    if (!rc) rc = cli_extras_load(a, &p, 1, &x);
    if (!rc && x.q_seg) {
        ids[0] = slice_ids(x.q_seg, p.batch, p.seq_q, lay), ids[1] = slice_ids(x.kv_seg, p.batch, p.seq_k, lay);
        if (!ids[0] || !ids[1]) rc = cli_fail(1, "out of memory");
    }
    if ((rc = agree_rc(rc))) goto done;

    /* o and lse are the forward's (grad needs them even when not written) */
    size_t es = fa_dtype_size(p.dtype);
    int64_t lrows = p.batch * p.heads_q * (p.seq_q / P);
    void *o = a->out ? outs[0].local : malloc((size_t)(lrows * p.head_dim_v) * es + 1);
    float *lse = a->lse ? outs[a->out ? 1 : 0].local : malloc((size_t)lrows * 4 + 1);
    fa_mpi_stats fs, bs;
    fa_status st = FA_ERR_NO_MEMORY;
    /* ring: steps of the ring; Ulysses: the local call's tiles */
    const char *unit = method_of(a) == FA_MPI_RING ? "ring steps" : NULL;
    const int show = progress_wanted(a, pl);
    cli_progress ps = {"forward", -1, unit}, pb = {"backward", -1, unit};
    if (o && lse) {
        fa_mpi_forward_args fw = {in[0], in[1], in[2], o, lse, x.slopes, ids[0], ids[1], &fs, x.sinks, NULL, NULL};
        if (show) fw.progress = cli_progress_report, fw.progress_ctx = &ps;
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &fw);
        if (st != FA_OK) rc = cli_fail_status(st, "forward");
    } else {
        fa_mpi_forward_args none = {0};
        st = fa_mpi_forward(MPI_COMM_WORLD, pl, &none); /* joins, so that every rank fails */
        rc = cli_fail(1, "out of memory");
    }
    if (!rc && grad) {
        output *g = &outs[dq_at];
        fa_mpi_backward_args bw = {in[0], in[1], in[2], o, in[3], lse, g[0].local, g[1].local,
                                   g[2].local, x.slopes, ids[0], ids[1], &bs, x.sinks, x.dsink, NULL, NULL};
        if (show) bw.progress = cli_progress_report, bw.progress_ctx = &pb;
        st = fa_mpi_backward(MPI_COMM_WORLD, pl, &bw);
        if (st != FA_OK) rc = cli_fail_status(st, "backward");
        if (!rc && a->dsink) /* every rank holds the whole sum: rank 0 writes it (gather_write) */
            memcpy(outs[nout - 1].local, x.dsink, (size_t)p.heads_q * sizeof(float));
    }
    if (!a->out) free(o);
    if (!a->lse) free(lse);
    if ((rc = agree_rc(rc))) goto done;
    if (a->count) rc = print_counts(grad ? &bs : &fs); /* agreed on by gather_write, before any commit */
    for (int i = 0; i < nout; i++) rc = gather_write(&outs[i], p.dtype, lay, rc);
    if (!rc && R == 0) {
        char err[NPY_ERR_LEN];
        for (int i = 0; i < nout && !rc; i++) /* every temporary named first: a failure replaces no target */
            if (npy_out_prepare(&outs[i].file, err, sizeof err)) rc = cli_fail(1, "%s %s", outs[i].flag, err);
        for (int i = 0; i < nout && !rc; i++)
            if (npy_out_commit(&outs[i].file, err, sizeof err)) rc = cli_fail(1, "%s %s", outs[i].flag, err);
    }
    rc = agree_rc(rc);
done:
    for (int i = 0; i < opened; i++) npy_out_abort(&outs[i].file);
    for (int i = 0; i < nout; i++) free(outs[i].local);
    for (int i = 0; i < 4; i++) free(in[i]);
    free(ids[0]), free(ids[1]);
    cli_extras_free(&x);
    fa_mpi_plan_destroy(pl);
    return rc;
}

/* FNV-1a of n bytes, from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* What decides the phases a rank runs (the command, the outputs it writes, --count, --json,
 * the passes, --iters): the ranks agree on it before anything else, so that none waits in a
 * phase its peers skip (--lse on one rank only once hung every rank). The problem and the
 * per-head values are the library's agreement's. */
static uint64_t phases_digest(const cli_args *a) {
    const char *const outs[] = {a->out, a->lse, a->dq, a->dk, a->dv, a->dbias, a->dsink};
    const int64_t f[] = {a->cmd, a->count, a->json, a->pass, a->iters, a->progress, a->seq_parallel, a->zigzag};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) h = (h ^ (uint64_t)f[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) h = (h ^ (outs[i] != NULL)) * 0x100000001b3ull;
    return h;
}

/* The output flags, whose paths every rank must give alike: only rank 0 writes, so another
 * path on another rank would be silently ignored (docs/mpi.md). Compared as strings. */
#define N_OUT_FLAGS 7
static void output_flags(const cli_args *a, const char *flag[N_OUT_FLAGS], const char *path[N_OUT_FLAGS]) {
    const char *const f[N_OUT_FLAGS] = {"--out", "--lse", "--dq", "--dk", "--dv", "--dbias", "--dsink"};
    const char *const p[N_OUT_FLAGS] = {a->out, a->lse, a->dq, a->dk, a->dv, a->dbias, a->dsink};
    for (int i = 0; i < N_OUT_FLAGS; i++) flag[i] = f[i], path[i] = p[i];
}

int cli_mpi_with(const cli_args *a, int (*body)(const cli_args *, int P, int R)) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init && MPI_Init(NULL, NULL) != MPI_SUCCESS) return cli_fail(1, "MPI_Init failed");
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    /* one agreement: the phases' digest, then each output path's (d and -d under MAX: equal
     * on every rank exactly when the maximum of -d is minus the maximum of d) */
    const char *flag[N_OUT_FLAGS], *path[N_OUT_FLAGS];
    output_flags(a, flag, path);
    int64_t v[2 * (1 + N_OUT_FLAGS)];
    for (int i = 0; i <= N_OUT_FLAGS; i++) {
        const uint64_t h = i == 0 ? phases_digest(a)
                           : path[i - 1] ? fnv1a(0xcbf29ce484222325ull, path[i - 1], strlen(path[i - 1]) + 1)
                                         : 0;
        v[2 * i] = (int64_t)(h >> 1), v[2 * i + 1] = -(int64_t)(h >> 1);
    }
    MPI_Allreduce(MPI_IN_PLACE, v, 2 * (1 + N_OUT_FLAGS), MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    int rc = 0;
    if (v[0] != -v[1])
        rc = cli_fail(2, "--seq-parallel: the ranks were started with different commands or flags "
                         "(run or grad, --out, --lse, --count, --pass, ...): give every rank the same");
    for (int i = 1; !rc && i <= N_OUT_FLAGS; i++)
        if (v[2 * i] != -v[2 * i + 1])
            rc = cli_fail(2, "--seq-parallel: %s %s: the ranks were given different %s paths (rank 0 writes every "
                             "output): give every rank the same",
                          flag[i - 1], path[i - 1], flag[i - 1]);
    if (!rc) rc = body(a, P, R);
    fflush(stdout);
    MPI_Finalize();
    return rc;
}

static int run_ranks(const cli_args *a, int np, int rank) {
    (void)np, (void)rank; /* already in P and R */
    return run_body(a);
}

int cli_mpi_run(const cli_args *a) { return cli_mpi_with(a, run_ranks); }

#else /* no MPI in this build */

int cli_mpi_run(const cli_args *a) {
    (void)a;
    return cli_fail(1, "--seq-parallel: this build has no MPI (install libopenmpi-dev and rebuild)");
}
#endif
