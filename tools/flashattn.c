/* flashattn: the command line (docs/cli.md). Picks the subcommand; the rest lives in
 * cli_args.c (flags), cli_plan.c, cli_run.c (run and grad) and cli_bench.c. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char shape_help[] =
    "shape:   --batch B --heads Hq [--kv-heads Hk] --seq S | (--seq-q Sq --seq-k Sk)\n"
    "         --head-dim D [--v-head-dim Dv] [--dtype f32|f16|bf16]\n";
static const char options_help[] =
    "options: [--causal] [--window L R] [--softcap C] [--scale X]\n"
    "         [--alibi slopes.npy] [--bias b.npy] [--q-segments a.npy --kv-segments b.npy]\n"
    "         [--backend auto|cpu|cuda] [--threads N] [--block-q N] [--block-k N]\n"
    "         [--seq-parallel ring|ulysses [--zigzag]]  (run, grad, bench; under mpirun)\n"
    "  --threads N    CPU threads, 1..1024 (default: OpenMP's, OMP_NUM_THREADS)\n"
    "  --window L R   keys i+off-L .. i+off+R are visible (off = Sk - Sq); -1: unbounded\n"
    "  --alibi        float32 [Hq];  --bias float32 [B or 1, Hq or 1, Sq or 1, Sk]\n"
    "  --q-segments   int32 [B, Sq] with --kv-segments int32 [B, Sk]\n"
    "  --sinks s.npy  float32 [Hq] attention sinks (grad: --dsink ds.npy writes their gradient)\n"
    "  --bias-scale X scores get X * bias (default 1; the Pallas kernel's is --scale's)\n"
    "  --diag-offset N  masks and ALiBi align query i with key i + N (default Sk - Sq,\n"
    "                 bottom-right); --top-left is --diag-offset 0\n"
    "  --progress     run, grad: progress on stderr every 10% (by itself over 500 GFLOP)\n"
    "  --dropout P [--seed S]  dropout of the attention weights, P in [0, 1), Philox seed S\n"
    "                 (default 0); docs/semantics.md, \"Dropout\"\n"
    "  block-sparse masks (docs/masks.md), ANDed together and with the above:\n"
    "  --mask-chunk C   chunked causal: j <= i+off and j/C == (i+off)/C\n"
    "  --prefix-len N|p.npy  prefix-LM: j < N (or int [B]) or j <= i+off\n"
    "  --documents d.npy  int [n] (every batch item) or [B, n] (0-padded) document lengths\n"
    "  --mask m.npy     bool [Sq, Sk] or [B or 1, Hq or 1, Sq, Sk]; True = attend\n";

static const char inference_help[] =
    "\ninference shapes (docs/cli.md; plan takes the same files):\n"
    "  --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy   int32 [B+1]; q [total_q,Hq,D], k/v [total_k,Hk,D]\n"
    "  --cache-seqlens lens.npy   int32 [B]; q [B,Sq_new,Hq,D], --k/--v caches [B,S_cache_max,Hk,D]\n"
    "  --block-table bt.npy       int32 [B,max_pages]; caches [num_pages,page_size,Hk,D]\n"
    "                             (plan: with --page-size P --num-pages N)\n"
    "  --k-new kn.npy --v-new vn.npy [--update-cache]   append [B,Sq_new,Hk,D] at lens[b];\n"
    "                             --update-cache rewrites the cache files (float32) on success\n"
    "  --k-prefix kp.npy --v-prefix vp.npy   a shared prefix [P,Hk,D] every sequence attends to\n"
    "                             first (read once per call; plan reads its header)\n"
    "  --cache-dtype int8|fp8     a quantized kv cache (plan, bench --decode; docs/caches.md)\n"
    "  --lengths-per-call         plan from capacities (caches, packed rows), the lengths passed\n"
    "                             with the call (run; plan: the capacity plan's figures)\n";

void cli_usage(const char *name) {
    if (!name) {
        printf("usage: flashattn <command> [flags]   (flashattn <command> --help for more)\n\n"
               "  plan    the plan of a problem: block sizes, cost of both passes, memory fit\n"
               "  run     attention forward on .npy tensors: o (and lse)\n"
               "  grad    forward then backward on .npy tensors: dq, dk, dv\n"
               "  bench   time forward and backward on random data\n"
               "  calibrate  measure this machine's rates, so plan and bench predict seconds\n\n"
               "exit codes: 0 ok, 2 bad input (one line on stderr), 1 other failures\n");
        return;
    }
    if (strcmp(name, "calibrate") == 0) {
        cli_calibrate_usage();
    } else if (strcmp(name, "plan") == 0) {
        printf("usage: flashattn plan SHAPE OPTIONS [--memory-budget SIZE] [--json]\n\n%s%s"
               "  --memory-budget  bytes, or e.g. 24G, 1.5T (K, M, G, T, P, E are powers of 1024;\n"
               "                   at most 2^63-1; whole bytes only); default: this machine's memory\n"
               "  --json           one JSON object: backend, forward{...}, backward{...} (null: no\n"
               "                   backward), exact, fits, fits_backward, naive_fits, predicted_seconds\n"
               "option files are read for their headers only (their sizes checked against them).\n%s",
               shape_help, options_help, inference_help);
    } else if (strcmp(name, "run") == 0) {
        printf("usage: flashattn run --q q.npy --k k.npy --v v.npy OPTIONS --out o.npy\n"
               "                     [--lse lse.npy] [--dtype f32|f16|bf16] [--count]\n\n%s"
               "q [B,Hq,Sq,D], k [B,Hk,Sk,D], v [B,Hk,Sk,Dv]: float32 or float16 .npy, cast to\n"
               "--dtype (default: the files'). Outputs are float32 .npy. --count prints\n"
               "{\"flops\": N, \"transcendentals\": N} as counted by the kernels.\n%s",
               options_help, inference_help);
    } else if (strcmp(name, "grad") == 0) {
        printf("usage: flashattn grad --q q.npy --k k.npy --v v.npy --do do.npy OPTIONS\n"
               "                      --dq dq.npy --dk dk.npy --dv dv.npy [--out o.npy]\n"
               "                      [--lse lse.npy] [--dbias dbias.npy] [--dtype f32|f16|bf16] [--count]\n\n%s"
               "Runs the forward, then the backward; gradients are written as float32 .npy.\n"
               "--dbias (with --bias): the bias's gradient, its shape, summed over broadcast dims.\n"
               "--count reports the backward pass's counts.\n"
               "--cu-seqlens-q cq.npy --cu-seqlens-k ck.npy: packed batches (int32 [B+1]); q [total_q,Hq,D],\n"
               "do [total_q,Hq,Dv], k/v [total_k,Hk,D]; dq, dk, dv packed like q, k, v; lse [Hq,total_q].\n",
               options_help);
    } else {
        printf("usage: flashattn bench SHAPE OPTIONS [--iters N] [--pass both|forward|backward]\n"
               "                       [--json]\n\n%s%s"
               "  --iters N  timed calls per pass after one warm-up (default 3); median reported\n"
               "  --pass P   time only the forward or only the backward (default both)\n"
               "  --json     last stdout line: {\"forward\": {\"seconds\": s, \"gflops\": g, \"flops\": f,\n"
               "             \"predicted_seconds\": p or null}, \"backward\": {...}, \"peak_rss_bytes\": N,\n"
               "             \"iters\": N}\n",
               shape_help, options_help);
        printf("\ninference shapes: flashattn bench --decode --batch B --heads Hq [--kv-heads Hk] --head-dim D\n"
               "                    --cache-len N [--seq-q Sq_new] [--page-size P] [--cache-dtype int8|fp8]\n"
               "                    [--huge-pages] [--layers L] (bf16 by default; --huge-pages: the caches on 2 MiB\n"
               "                    pages; --layers: L sets of caches, one call on each in turn, as a model's layers)\n"
               "                  flashattn bench --varlen 128,4096,... --heads H --head-dim D [--causal]\n");
    }
}

/* A standard stream closed by the caller (`2>&-`) would be the number the next open file
 * takes, an output's temporary, and progress or --count text would land in that file:
 * each closed one is opened on /dev/null, read-only, so writing to it fails as a closed
 * stream should (stdout: exit 1, "cannot write to stdout"). A closed pipe is a write
 * error too (EPIPE, exit 1), not a silent death by SIGPIPE. */
static void standard_streams(void) {
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            const int got = open("/dev/null", O_RDONLY);
            if (got >= 0 && got != fd) close(got); /* a lower one was free: cannot happen in order */
        }
    signal(SIGPIPE, SIG_IGN);
}

int main(int argc, char **argv) {
    standard_streams();
    static const struct {
        const char *name;
        int cmd;
    } cmds[] = {{"plan", CMD_PLAN},
                {"run", CMD_RUN},
                {"grad", CMD_GRAD},
                {"bench", CMD_BENCH},
                {"calibrate", CMD_CALIBRATE}};
    if (argc < 2) /* bad input: one line on stderr, nothing on stdout */
        return cli_fail(2, "missing command (plan, run, grad, bench or calibrate; flashattn --help lists them)");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        /* flashattn help [command]: the command's help, as `flashattn <command> --help` */
        const char *of = NULL;
        for (size_t i = 0; argc >= 3 && i < sizeof cmds / sizeof cmds[0]; i++)
            if (strcmp(argv[2], cmds[i].name) == 0) of = cmds[i].name;
        if (argc > 3 || (argc == 3 && !of)) /* names the first word it does not take */
            return cli_fail(2, "%s takes at most a command's name (plan, run, grad, bench or calibrate), not '%s'",
                            argv[1], argv[of ? 3 : 2]);
        cli_usage(of);
        return cli_flush_stdout();
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        cli_args a;
        int rc = cli_parse(cmds[i].cmd, cmds[i].name, argc - 2, argv + 2, &a);
        if (rc) return rc;
        if (a.help) {
            cli_usage(cmds[i].name);
            return cli_flush_stdout();
        }
        switch (cmds[i].cmd) {
        case CMD_PLAN: rc = cli_plan(&a); break;
        case CMD_CALIBRATE: rc = cli_calibrate(&a); break;
        case CMD_BENCH: rc = a.seq_parallel ? cli_mpi_bench(&a) : cli_bench(&a); break;
        default: rc = a.seq_parallel ? cli_mpi_run(&a) : cli_run(&a); break;
        }
        if (rc == 0) rc = cli_flush_stdout();
        else fflush(stdout);
        return rc;
    }
    return cli_fail(2, "unknown command '%.40s' (plan, run, grad, bench or calibrate)", argv[1]);
}
