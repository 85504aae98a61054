/* What every timing program of the tree shares (the CLI's bench and calibrate, the programs
 * in bench/): one monotonic clock, one median of repeated timings, one stream of
 * reproducible inputs and one flag parser. Public API only (flashattn.h). */
#ifndef FA_TOOLS_MEASURE_H
#define FA_TOOLS_MEASURE_H

#include "flashattn.h"

#include <stdint.h>

/* Seconds on CLOCK_MONOTONIC. */
double measure_now(void);
/* CPU seconds of the whole process, all threads (CLOCK_PROCESS_CPUTIME_ID): on a shared
 * machine, how much of the wall a run got. */
double measure_cpu_now(void);

/* The median of t[0..n) (sorts t in place); 0 for n = 0. */
double measure_median(double *t, int n);

/* n values uniform in [-1, 1) from the splitmix64 stream *state (advanced), converted to
 * dtype t as the library rounds (fa_convert): the same values for the same seed. */
void measure_fill(uint64_t *state, fa_dtype t, void *x, int64_t n);

/* One flag of a timing program: an integer option (value set) or a switch (on set to 1). */
typedef struct {
    const char *name; /* "--batch" */
    int64_t *value;
    int *on;
} measure_opt;

/* Parses argv[1..argc) against opts (a {NULL} entry ends them) and, when dtype is not NULL,
 * --dtype f32|f16|bf16. An unknown flag, a missing value or one that is not an integer is
 * named on stderr as "prog: ..." and returns 2; else 0. */
int measure_parse(const char *prog, int argc, char **argv, const measure_opt *opts, fa_dtype *dtype);

#endif
