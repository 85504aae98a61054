/* fa_cpu_exp_rate (flashattn.h): the throughput of the chosen kernel set's exp, measured as
 * the forward calls it (rows of 128 scores, one key tile, in L1), for the command line's
 * time model (`flashattn calibrate`, tools/rates_measure.c). It lives here because only the
 * library sees its kernel table. */
#include "isa.h"

#include <omp.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double fa_cpu_exp_rate(int threads) {
    const fa_isa *isa;
    if (threads < 1 || threads > FA_MAX_THREADS || fa_isa_select(&isa) != FA_OK) return 0; /* as plans refuse them */
    threads = fa_threads_after_fork(threads); /* internal.h: a forked child's team is one thread */
    const int n = 128, calls = 20000;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now(), sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
        {
            float x[128];
            for (int j = 0; j < n; j++) x[j] = -0.01f * (float)j;
            /* exp(x - 1) of values in [0, 1] stays in (0, 1]: every call is a normal row */
            for (int c = 0; c < calls; c++) sum += isa->exp_sum(x, n, 1.0f);
        }
        const double t = now() - t0;
        if ((double)threads * calls * n / t > best) best = (double)threads * calls * n / t;
        if (sum == 42.0) best += 1; /* depends on sum: the calls stay */
    }
    return best;
}
