/* Fuzzes the command line's flag parser (tools/cli_args.c): parsing only, nothing runs.
 * The input is a subcommand (first byte) and an argument vector (the rest, split at NUL
 * bytes). Whatever the arguments, the parser returns 0 or 2 (1 would be its internal
 * error), and what it accepted is within each flag's documented range; the shape and
 * options built from an accepted vector hold the same values. --memory-budget's size
 * parser is also run on every argument. */
#include "cli.h"
#define FUZZ_HARNESS "cli_args"
#include "fuzz_bytes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 48

static void check_accepted(const cli_args *a) {
    FUZZ_CHECK(a->batch >= 0 && a->heads >= 0 && a->kv_heads >= 0 && a->seq >= 0 && a->seq_q >= 0 && a->seq_k >= 0 &&
                   a->head_dim >= 0 && a->v_head_dim >= 0,
               "a negative shape flag was accepted");
    FUZZ_CHECK(a->window_left >= -1 && a->window_right >= -1, "window %lld %lld", (long long)a->window_left,
               (long long)a->window_right);
    FUZZ_CHECK(!a->has_softcap || (isfinite(a->softcap) && a->softcap >= 0), "softcap %g", (double)a->softcap);
    FUZZ_CHECK(!a->has_scale || isfinite(a->scale), "scale %g", (double)a->scale);
    FUZZ_CHECK(a->threads >= 0 && a->iters >= 0 && a->block_q >= 0 && a->block_k >= 0, "counts");
    FUZZ_CHECK(!a->has_budget || a->budget >= 0, "budget %lld", (long long)a->budget);
    FUZZ_CHECK(a->pass >= 0 && a->pass <= 2, "pass %d", a->pass);
    FUZZ_CHECK(a->dtype == FA_F32 || a->dtype == FA_F16 || a->dtype == FA_BF16, "dtype %d", (int)a->dtype);
    FUZZ_CHECK(a->backend == FA_BACKEND_AUTO || a->backend == FA_BACKEND_CPU || a->backend == FA_BACKEND_CUDA,
               "backend %d", (int)a->backend);
    const char *files[] = {a->alibi, a->bias, a->q_segments, a->kv_segments, a->q, a->k, a->v,
                           a->out, a->lse, a->d_o, a->dq, a->dk, a->dv};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        FUZZ_CHECK(!files[i] || files[i][0], "an empty file name was accepted (flag %zu)", i);
    FUZZ_CHECK(!!a->q_segments == !!a->kv_segments, "one segment file without the other");
}

static void check_problem(const cli_args *a) {
    fa_problem p;
    if (cli_shape_from_flags(a, &p) != 0) return;
    FUZZ_CHECK(p.batch == a->batch && p.heads_q == a->heads && p.head_dim == a->head_dim, "shape copied wrong");
    FUZZ_CHECK(p.seq_q > 0 && p.seq_k > 0 && p.heads_kv > 0 && p.heads_q % p.heads_kv == 0, "shape");
    fa_options o;
    cli_apply_options(a, &p, &o);
    FUZZ_CHECK(p.window_left == a->window_left && p.window_right == a->window_right && p.causal == a->causal &&
                   o.threads == a->threads && o.block_q == a->block_q && o.backend == a->backend,
               "options copied wrong");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const struct {
        int cmd;
        const char *name;
    } CMDS[] = {{CMD_PLAN, "plan"}, {CMD_RUN, "run"}, {CMD_GRAD, "grad"}, {CMD_BENCH, "bench"}};
    if (size < 1) return 0;
    const int c = data[0] % 4;
    /* the rest as NUL-separated strings; a final string without its NUL gets one */
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    for (size_t i = 0; i < size - 1 && argc < MAX_ARGS; i += strlen(text + i) + 1) argv[argc++] = text + i;
    argv[argc] = NULL;

    cli_args a;
    int rc = cli_parse(CMDS[c].cmd, CMDS[c].name, argc, argv, &a);
    FUZZ_CHECK(rc == 0 || rc == 2, "cli_parse returned %d", rc);
    if (rc == 0) {
        FUZZ_CHECK(a.cmd == CMDS[c].cmd && a.name == CMDS[c].name, "cmd");
        if (!a.help) {
            check_accepted(&a);
            check_problem(&a);
        }
    }
    for (int i = 0; i < argc; i++) {
        int64_t bytes = -1;
        if (cli_parse_bytes(argv[i], &bytes) == 0) FUZZ_CHECK(bytes >= 0, "'%s' parsed as %lld bytes", argv[i], (long long)bytes);
    }
    free(text);
    return 0;
}
