/* An external program using an installed flashattn's MPI part (flashattn_mpi.h,
 * libflashattn_mpi): a causal forward over the ring on every rank of MPI_COMM_WORLD,
 * compared with the single-process forward of each rank's rows. Prints "ok" on rank 0. */
#include <flashattn.h>
#include <flashattn_mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int P, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int64_t S = 16 * P, H = 2, D = 8;
    fa_problem g;
    fa_problem_init(&g);
    g.batch = 1, g.heads_q = H, g.seq_q = g.seq_k = S, g.head_dim = D, g.causal = 1;
    fa_mpi_plan *mp = NULL;
    fa_plan *pl = NULL;
    if (fa_mpi_plan_create(&g, NULL, FA_MPI_RING, FA_MPI_CONTIGUOUS, P, rank, &mp) || fa_plan_create(&g, NULL, &pl)) {
        fprintf(stderr, "consumer_mpi: plan: %s\n", fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* the whole problem on every rank ([B, H, S, D], contiguous), this rank's rows sliced out */
    const int64_t L = fa_mpi_local_rows(mp, 0), n = H * S * D, nl = H * L * D;
    float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
    float *o = malloc(sizeof(float) * n), *lq = malloc(sizeof(float) * nl), *lk = malloc(sizeof(float) * nl);
    float *lv = malloc(sizeof(float) * nl), *lo = malloc(sizeof(float) * nl);
    for (int64_t i = 0; i < n; i++) q[i] = sinf(0.37f * i), k[i] = cosf(0.11f * i), v[i] = sinf(0.05f * i + 1);
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t d = 0; d < D; d++) {
                const int64_t at = (h * S + fa_mpi_global_row(mp, 0, t)) * D + d, here = (h * L + t) * D + d;
                lq[here] = q[at], lk[here] = k[at], lv[here] = v[at];
            }
    fa_mpi_forward_args a = {0};
    a.q = lq, a.k = lk, a.v = lv, a.o = lo;
    fa_forward_args f = {0};
    f.q = q, f.k = k, f.v = v, f.o = o;
    if (fa_mpi_forward(MPI_COMM_WORLD, mp, &a) || fa_forward(pl, &f)) {
        fprintf(stderr, "consumer_mpi: forward: %s\n", fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double worst = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < L; t++)
            for (int64_t d = 0; d < D; d++) {
                const double e = fabs(lo[(h * L + t) * D + d] - o[(h * S + fa_mpi_global_row(mp, 0, t)) * D + d]);
                worst = e > worst ? e : worst;
            }
    double all;
    MPI_Reduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("consumer_mpi: %d ranks, max |ring - single| = %.2g: %s\n", P, all, all < 1e-5 ? "ok" : "FAIL");
    fa_mpi_plan_destroy(mp), fa_plan_destroy(pl);
    free(q), free(k), free(v), free(o), free(lq), free(lk), free(lv), free(lo);
    MPI_Finalize();
    return rank == 0 && !(all < 1e-5);
}
