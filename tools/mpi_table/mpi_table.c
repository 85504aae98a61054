/* Prints the per-rank plan of sequence-parallel attention for the seed problem (B=18, H=32,
 * D=256, bf16) at long sequence lengths on 8..512 ranks, as a markdown table (docs/mpi.md).
 * A paper model: the time assumes the given sustained rate per rank and link bandwidth.
 * Usage: mpi_table [TFLOP/s per rank] [GB/s per link direction]   (defaults 400, 50) */
#include "flashattn_mpi.h"

#include <stdio.h>
#include <stdlib.h>

static const char *human(double b, char *buf) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, 32, "%.1f %s", b, u[i]);
    return buf;
}

static const char *secs(double s, char *buf) {
    if (s < 1) snprintf(buf, 32, "%.0f ms", s * 1e3);
    else snprintf(buf, 32, "%.2f s", s);
    return buf;
}

int main(int argc, char **argv) {
    double rate = (argc > 1 ? atof(argv[1]) : 400) * 1e12, bw = (argc > 2 ? atof(argv[2]) : 50) * 1e9;
    const int64_t lens[] = {131072, 1048576};
    const struct {
        const char *name;
        fa_mpi_method m;
        fa_mpi_layout l;
        int causal;
    } kinds[] = {{"ring", FA_MPI_RING, FA_MPI_CONTIGUOUS, 0},
                 {"ring zigzag, causal", FA_MPI_RING, FA_MPI_ZIGZAG, 1},
                 {"ulysses, causal", FA_MPI_ULYSSES, FA_MPI_CONTIGUOUS, 1}};
    printf("Assumed: %.0f TFLOP/s sustained per rank, %.0f GB/s per link direction.\n\n", rate / 1e12, bw / 1e9);
    printf("| S | P | method | fwd TFLOP/rank | fwd sent/rank | fwd time | hidden | bwd sent/rank | bwd time | hidden | peak mem/rank (bwd) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < 2; si++)
        for (int P = 8; P <= 512; P *= 2)
            for (int ki = 0; ki < 3; ki++) {
                fa_problem p;
                fa_problem_init(&p);
                p.batch = 18, p.heads_q = 32, p.seq_q = p.seq_k = lens[si], p.head_dim = 256;
                p.dtype = FA_BF16, p.causal = kinds[ki].causal;
                fa_options o = {FA_BACKEND_CPU, 1, 0, 0};
                /* the slowest of the first and last rank (zigzag and non-causal: all equal) */
                fa_mpi_cost cf = {0}, cb = {0};
                fa_mpi_prediction pf = {0}, pb = {0};
                int ok = 1;
                for (int r = 0; r < P && ok; r += P - 1) {
                    fa_mpi_plan *pl = NULL;
                    if (fa_mpi_plan_create(&p, &o, kinds[ki].m, kinds[ki].l, P, r, &pl) != FA_OK) {
                        ok = 0;
                        break;
                    }
                    fa_mpi_cost a, b;
                    fa_mpi_prediction x, y;
                    fa_mpi_plan_cost(pl, FA_FORWARD, &a);
                    fa_mpi_plan_cost(pl, FA_BACKWARD, &b);
                    fa_mpi_predict(pl, FA_FORWARD, rate, bw, &x);
                    fa_mpi_predict(pl, FA_BACKWARD, rate, bw, &y);
                    if (x.predicted_s >= pf.predicted_s) pf = x, cf = a;
                    if (y.predicted_s >= pb.predicted_s) pb = y, cb = b;
                    fa_mpi_plan_destroy(pl);
                }
                char b1[32], b2[32], b3[32], b4[32], b5[32];
                if (!ok) {
                    printf("| %lld | %d | %s | (Hk=32 not divisible by P) ||||||||\n", (long long)lens[si], P, kinds[ki].name);
                    continue;
                }
                printf("| %lld | %d | %s | %.1f | %s | %s | %s | %s | %s | %s | %s |\n", (long long)lens[si], P,
                       kinds[ki].name, (double)cf.flops / 1e12, human((double)cf.bytes_sent, b1),
                       secs(pf.predicted_s, b2), pf.comm_hidden ? "yes" : "no",
                       human((double)cb.bytes_sent, b3), secs(pb.predicted_s, b4),
                       pb.comm_hidden ? "yes" : "no", human((double)cb.peak_bytes, b5));
            }
    return 0;
}
