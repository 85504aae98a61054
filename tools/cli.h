/* The flashattn command line: what the subcommands share (parsed flags, the problem built
 * from them, error reporting, tensors loaded from .npy files). Contract: docs/cli.md.
 *
 * Exit codes everywhere: 0 success, 2 bad input (one line on stderr naming the problem),
 * 1 any other failure. A function that fails prints its one line and returns the code;
 * callers only pass it up. */
#ifndef FA_TOOLS_CLI_H
#define FA_TOOLS_CLI_H

#include "flashattn.h"
#include "npy.h"

#include <stddef.h>
#include <stdint.h>

enum { CMD_PLAN = 1, CMD_RUN = 2, CMD_GRAD = 4, CMD_BENCH = 8, CMD_CALIBRATE = 16 };

typedef struct {
    int cmd;           /* one CMD_* */
    const char *name;  /* "plan", "run", ... */
    int help;

    /* shape flags (0: not given) */
    int64_t batch, heads, kv_heads, seq, seq_q, seq_k, head_dim, v_head_dim;
    int has_dtype;
    fa_dtype dtype;

    /* option flags */
    int causal;
    int has_window;
    int64_t window_left, window_right;
    int has_softcap, has_scale;
    float softcap, scale;
    const char *alibi, *bias, *q_segments, *kv_segments;
    fa_backend backend;
    int threads;               /* 0: not given */
    int64_t block_q, block_k;  /* 0: not given */

    /* subcommand flags */
    int json, count;
    int no_cache; /* calibrate: measure and print only */
    int has_budget;
    int64_t budget;
    int iters;                 /* 0: not given */
    int pass;                  /* bench: 0 both, 1 forward only, 2 backward only */
    const char *q, *k, *v, *out, *lse, *d_o, *dq, *dk, *dv;

    /* bias scale, mask alignment, dbias (grad) */
    int has_bias_scale;
    float bias_scale;
    int has_diag_offset;       /* --diag-offset N, or --top-left (N = 0) */
    int64_t diag_offset;
    const char *dbias;

    int seq_parallel;          /* 0: one process; CLI_SP_RING or CLI_SP_ULYSSES (cli_mpi.c) */
    int zigzag;

    /* inference shapes (docs/cli.md; cli_inference.c, cli_bench_inference.c) */
    const char *cu_seqlens_q, *cu_seqlens_k, *cache_seqlens, *block_table, *k_new, *v_new;
    int update_cache;
    int lengths_per_call;         /* --lengths-per-call: a plan from capacities, the lengths with the call */
    int64_t page_size, num_pages; /* plan and bench of paged caches (0: not given) */
    int decode;                   /* bench --decode */
    int64_t cache_len;            /* bench --cache-len */
    const char *varlen_lens;      /* bench --varlen 128,4096,... */
    int huge_pages;               /* bench --decode --huge-pages: caches on 2 MiB pages */
    int64_t layers;               /* bench --decode --layers: sets of caches, one per call in turn (0: 1) */
    int progress;                 /* run, grad --progress: progress on stderr whatever the size */

    const char *sinks, *dsink;    /* attention sinks float32 [Hq]; grad: their gradient out */
    const char *k_prefix, *v_prefix; /* a shared prefix [P, Hk, D] (plan reads its header) */
    int has_dropout;              /* --dropout P [--seed S] (every subcommand) */
    float dropout;
    int has_seed;
    uint64_t seed;
    /* block-sparse masks (docs/masks.md; cli_mask.c), ANDed together and with the others */
    int64_t mask_chunk;           /* --mask-chunk C (0: not given) */
    const char *prefix_len;       /* --prefix-len N or lens.npy */
    const char *documents;        /* --documents lens.npy */
    const char *mask;             /* --mask mask.npy (bool) */
    int has_cache_dtype;          /* plan, bench --decode --cache-dtype int8|fp8: a quantized cache */
    fa_dtype cache_dtype;
} cli_args;

enum { CLI_SP_RING = 1, CLI_SP_ULYSSES = 2 };

/* Prints "flashattn: <message>" as one line on stderr and returns code. */
int cli_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Maps a library status to an exit code (2 for the caller's mistakes, 1 otherwise) and
 * prints fa_last_error() with the given context. */
int cli_fail_status(fa_status st, const char *context);
/* Flushes stdout: 0, or 1 after its one line ("cannot write to stdout: ..."). Commands that
 * write files print and flush everything for stdout before the files are moved into place,
 * so that a stdout that cannot be written leaves no output (docs/cli.md, exit codes). */
int cli_flush_stdout(void);

/* cli_args.c: parses argv after the subcommand; prints help for --help. */
int cli_parse(int cmd, const char *name, int argc, char **argv, cli_args *a);
/* Fills in the shape from the flags (plan and bench, which need them all). */
int cli_shape_from_flags(const cli_args *a, fa_problem *p);
/* Copies the option flags (masks, softcap, scale) into p and o. */
void cli_apply_options(const cli_args *a, fa_problem *p, fa_options *o);

/* cli_inputs.c: the option files (bias, slopes, segment ids). Checks their headers against
 * the problem and sets its has_* fields; with load, also reads their data. */
typedef struct {
    float *bias, *slopes;
    int32_t *q_seg, *kv_seg;
    float *sinks, *dsink; /* with --sinks (loaded): the sinks, and room for their gradient [Hq] */
} cli_extras;
int cli_extras_load(const cli_args *a, fa_problem *p, int load, cli_extras *x);
/* Asks fa_plan_create whether the option files' features (bias, segment ids, slopes, sinks, a
 * mask) combine with p and o, before cli_extras_load checks the files against p's shape: a
 * combination the library refuses is its one message naming both features (exit 2 for
 * FA_ERR_INVALID), never a shape the file could not take anyway. 0: they combine. */
int cli_extras_supported(const cli_args *a, const fa_problem *p, const fa_options *o);
/* cli_mask.c: the mask flags' block-sparse mask, built once (a plan input: its files are read
 * whole even by plan) and set as p->mask; the command line keeps it until exit. */
int cli_mask_apply(const cli_args *a, fa_problem *p);
void cli_extras_free(cli_extras *x);

/* Reads the data of a q/k/v/do file whose header was already checked (expect; it must still
 * match), converted to dtype t: malloc'ed, count elements of fa_dtype_size(t) bytes. */
int cli_read_tensor(const char *flag, const char *path, fa_dtype t, const npy_header *expect,
                    void **out);

/* Converts n elements of dtype t to a new float32 buffer. */
float *cli_to_f32(fa_dtype t, const void *x, int64_t n);

/* Parses "24G"-style sizes (K, M, G, T, P, E powers of 1024; plain bytes up to INT64_MAX;
 * no hex or exponents; a fraction only where it gives whole bytes). Returns 0 on success,
 * -2 for a fraction of a byte, -1 for anything else refused. */
int cli_parse_bytes(const char *s, int64_t *out);
/* Whether s is a decimal integer as the flags take them: [+-]digits, nothing else (no
 * spaces, no hex); docs/cli.md, "Numbers". */
int cli_is_decimal_int(const char *s);

/* Creates the plan; on failure prints and returns the exit code. */
int cli_plan_create(const fa_problem *p, const fa_options *o, fa_plan **plan);

/* Human units for the plan and bench output: "1.50 GiB", "158.33 T". */
const char *cli_human_bytes(double bytes, char *buf, size_t len);
const char *cli_human_count(double x, char *buf, size_t len);

/* cli_device.c: tensors live where the plan's backend runs. For the CPU, put returns the
 * host buffer itself and get does nothing; for CUDA, put allocates a device buffer (copying
 * the host data over when copy is set) and get copies it back. */
typedef struct {
    int device;
} cli_mem;
int cli_mem_init(cli_mem *m, const fa_plan *plan); /* 1 if the device cannot be used */
int cli_mem_put(cli_mem *m, const void *host, size_t bytes, int copy, void **where);
int cli_mem_get(cli_mem *m, void *host, const void *where, size_t bytes);
int cli_mem_sync(cli_mem *m);
void cli_mem_free(cli_mem *m, const void *host, void *where);

/* cli_inference.c: packed varlen and kv-cache shapes. Any of their flags given? */
int cli_inference_wanted(const cli_args *a);
/* The problem of `plan` from the shape flags and the length files (read: they are plan
 * inputs); *lens holds the arrays p points into (free it after the plan is made). */
int cli_inference_problem(const cli_args *a, fa_problem *p, int32_t **lens);
int cli_run_inference(const cli_args *a);
int cli_bench_inference(const cli_args *a);
/* bench's flags that the benchmark chosen (dense, --decode or --varlen) does not read,
 * refused by name (exit 2) rather than ignored; 0 where every flag given is read. */
int cli_bench_unread_flags(const cli_args *a);

/* Subcommands. */
int cli_plan(const cli_args *a);
int cli_run(const cli_args *a);  /* run and grad */
int cli_bench(const cli_args *a);
int cli_calibrate(const cli_args *a); /* cli_calibrate.c: --threads, --no-cache, --json */
void cli_calibrate_usage(void);

/* cli_run.c: progress of a long CPU call on stderr, every 10%, "flashattn: forward 40%
 * (1200/3000 tiles)" (fa_forward_args.progress with a cli_progress as its ctx), shown where
 * cli_progress_wanted: the CPU backend and a forward over 500 GFLOP (seconds even on many
 * cores), or --progress, for dense and packed runs alike. */
typedef struct {
    const char *pass;   /* "forward", "backward" */
    int64_t last_tenth; /* -1 at the start */
    const char *unit;   /* what the library counts: NULL "tiles"; decoding's "work items" */
} cli_progress;
void cli_progress_report(void *ctx, int64_t done, int64_t total);
int cli_progress_wanted(const cli_args *a, const fa_plan *plan);

/* cli_run.c: the input and output files run (q, k, v, --out) or grad (also do, dq, dk, dv)
 * needs; prints the first one missing and returns 2. */
int cli_need_files(const cli_args *a);
/* cli_run.c: the problem of run/grad from the input files' headers (nothing read yet):
 * checks every header (do's too for grad) and applies the option flags. */
int cli_run_problem(const cli_args *a, npy_header *hq, npy_header *hk, npy_header *hv,
                    npy_header *hdo, fa_problem *p, fa_options *opt);

/* cli_mpi.c: run, grad and bench with --seq-parallel, under mpirun (docs/mpi.md). */
int cli_mpi_run(const cli_args *a);
int cli_mpi_bench(const cli_args *a);
/* With MPI built: initializes MPI, runs body(a, P, rank), finalizes; returns body's code. */
int cli_mpi_with(const cli_args *a, int (*body)(const cli_args *, int P, int R));

/* Help text for a subcommand (NULL: the overview). */
void cli_usage(const char *name);

#endif
