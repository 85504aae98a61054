/* dlopen, a forward on 2 threads, dlclose, three times over, for each shared library named
 * on the command line (libflashattn.so, libflashattn_mpi.so). A plugin host that loads and
 * unloads the library must keep running: libgomp came into the process with the library
 * alone, so dlclose unmapped it while its idle worker threads still ran in it (SIGSEGV).
 * The libraries are linked with -z nodelete (CMakeLists.txt), which keeps them, and so their
 * OpenMP runtime, mapped. Built without the library or OpenMP (they must come only from
 * dlopen), so it is registered on its own rather than as a tests/test_*.c. */
#define _GNU_SOURCE
#include "flashattn.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SYM(h, type, name) ((type)dlsym(h, name))

static int cycle(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return fprintf(stderr, "dlopen %s: %s\n", path, dlerror()), 1;
    void (*init)(fa_problem *) = SYM(h, void (*)(fa_problem *), "fa_problem_init");
    fa_status (*create)(const fa_problem *, const fa_options *, fa_plan **) =
        SYM(h, fa_status(*)(const fa_problem *, const fa_options *, fa_plan **), "fa_plan_create");
    fa_status (*forward)(const fa_plan *, const fa_forward_args *) =
        SYM(h, fa_status(*)(const fa_plan *, const fa_forward_args *), "fa_forward");
    void (*destroy)(fa_plan *) = SYM(h, void (*)(fa_plan *), "fa_plan_destroy");
    if (!init || !create || !forward || !destroy) return fprintf(stderr, "%s: missing symbols\n", path), 1;
    fa_problem p;
    init(&p);
    p.batch = 1, p.heads_q = 4, p.seq_q = p.seq_k = 256, p.head_dim = 32;
    fa_options o;
    memset(&o, 0, sizeof o);
    o.backend = FA_BACKEND_CPU, o.threads = 2;
    fa_plan *pl = NULL;
    if (create(&p, &o, &pl)) return fprintf(stderr, "%s: plan failed\n", path), 1;
    const size_t n = 4 * 256 * 32;
    float *x = malloc(n * sizeof *x), *out = malloc(n * sizeof *out);
    if (!x || !out) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    fa_forward_args a;
    memset(&a, 0, sizeof a);
    a.q = a.k = a.v = x, a.o = out;
    const fa_status st = forward(pl, &a);
    destroy(pl);
    free(x), free(out);
    if (st) return fprintf(stderr, "%s: forward failed (%d)\n", path, (int)st), 1;
    if (dlclose(h)) return fprintf(stderr, "dlclose %s: %s\n", path, dlerror()), 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: dlclose_check LIB.so...\n"), 2;
    for (int i = 1; i < argc; i++)
        for (int c = 0; c < 3; c++)
            if (cycle(argv[i])) return 1;
    const struct timespec wait = {0, 200 * 1000 * 1000}; /* the runtime's idle workers wake meanwhile */
    nanosleep(&wait, NULL);
    printf("dlclose_check: %d libraries loaded, run on 2 threads and unloaded 3 times each\n", argc - 1);
    return 0;
}
