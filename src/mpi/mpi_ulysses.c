/* All-to-all attention (DeepSpeed Ulysses). Every tensor goes from sequence shards (each rank
 * holds some rows of every head) to head shards (each rank holds every row of Hq/P query
 * heads and of the Hk/P kv heads they read), the local kernel runs on full sequences, and
 * the outputs come back the same way. The kernel call is the single-process one on a head
 * slice, so results match one process's (same block sizes) bit for bit. Collectives run in the same order on
 * every rank even after a local failure, so no rank is left waiting. */
#include "mpi_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fa_mpi_call *c;
    const fa_mpi_plan *pl;
    int P;
    int64_t B;
    char *send, *recv; /* P blocks each, the largest tensor's local bytes */
} ulysses;

/* One block of bytes as an MPI datatype (in rows, so that counts fit an int). */
static int block_type(fa_mpi_call *c, int64_t rows, int64_t row_bytes, MPI_Datatype *t) {
    MPI_Datatype row;
    if (rows > INT_MAX || row_bytes > INT_MAX) {
        fa_mpi_fail(c, FA_ERR_UNSUPPORTED, "an all-to-all block of %lld rows is too large",
                    (long long)rows);
        rows = 1, row_bytes = 1; /* still take part in the collective */
    }
    if (!fa_mpi_ok(c, MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row), "MPI_Type_contiguous"))
        return 0;
    int ok = fa_mpi_ok(c, MPI_Type_contiguous((int)rows, row, t), "MPI_Type_contiguous") &&
             fa_mpi_ok(c, MPI_Type_commit(t), "MPI_Type_commit");
    MPI_Type_free(&row);
    return ok;
}

/* Equal blocks of `bytes` from every rank to every rank, counted as sent and received. */
static void alltoall(ulysses *U, int64_t rows, int64_t row_bytes) {
    MPI_Datatype t;
    if (!block_type(U->c, rows, row_bytes, &t)) return;
    double t0 = fa_mpi_now();
    int rc = MPI_Alltoall(U->send, 1, t, U->recv, 1, t, U->c->comm);
    U->c->stats.comm_wait_s += fa_mpi_now() - t0;
    if (fa_mpi_ok(U->c, rc, "MPI_Alltoall")) {
        U->c->stats.bytes_sent += (U->P - 1) * rows * row_bytes;
        U->c->stats.bytes_received += (U->P - 1) * rows * row_bytes;
    }
    MPI_Type_free(&t);
}

/* x: this rank's rows (L of them, strided st) of a [B, H, S, Dx] tensor -> full: every row
 * of heads [rank*H/P, (rank+1)*H/P), contiguous [B, H/P, S, Dx]. which: q-like or k-like. */
static void to_heads(ulysses *U, const void *x, const fa_strides *st, int which, int64_t H,
                     int64_t Dx, size_t es, char *full) {
    const fa_mpi_plan *pl = U->pl;
    int64_t Hp = H / U->P, L = fa_mpi_local_rows(pl, which), S = L * U->P;
    int64_t rowb = Dx * (int64_t)es, blk = U->B * Hp * L * rowb;
    double t0 = fa_mpi_now();
    for (int p = 0; p < U->P; p++)
        fa_mpi_gather_rows(U->send + p * blk, (const char *)x + (size_t)(p * Hp * st->s[1]) * es, st,
                           U->B, Hp, 0, L, Dx, es);
    U->c->stats.merge_s += fa_mpi_now() - t0;
    alltoall(U, U->B * Hp * L, rowb);
    t0 = fa_mpi_now();
    for (int s = 0; s < U->P; s++) {
        fa_mpi_shard sh;
        fa_mpi_shard_of(pl, which, s, &sh);
        for (int g = 0; g < sh.n; g++)
            for (int64_t bh = 0; bh < U->B * Hp; bh++)
                memcpy(full + (bh * S + sh.s[g].gstart) * rowb,
                       U->recv + s * blk + (bh * L + sh.s[g].lstart) * rowb,
                       (size_t)(sh.s[g].len * rowb));
    }
    U->c->stats.merge_s += fa_mpi_now() - t0;
}

/* The reverse: full [B, H/P, S, Dx] of this rank's heads -> this rank's rows of every head
 * in x (strided st; NULL: the collective is still joined, the result dropped). */
static void from_heads(ulysses *U, const char *full, int which, int64_t H, int64_t Dx,
                       size_t es, void *x, const fa_strides *st) {
    const fa_mpi_plan *pl = U->pl;
    int64_t Hp = H / U->P, L = fa_mpi_local_rows(pl, which), S = L * U->P;
    int64_t rowb = Dx * (int64_t)es, blk = U->B * Hp * L * rowb;
    double t0 = fa_mpi_now();
    for (int p = 0; p < U->P; p++) {
        fa_mpi_shard sh;
        fa_mpi_shard_of(pl, which, p, &sh);
        for (int g = 0; g < sh.n; g++)
            for (int64_t bh = 0; bh < U->B * Hp; bh++)
                memcpy(U->send + p * blk + (bh * L + sh.s[g].lstart) * rowb,
                       full + (bh * S + sh.s[g].gstart) * rowb, (size_t)(sh.s[g].len * rowb));
    }
    U->c->stats.merge_s += fa_mpi_now() - t0;
    alltoall(U, U->B * Hp * L, rowb);
    t0 = fa_mpi_now();
    if (U->c->st == FA_OK && x)
        for (int s = 0; s < U->P; s++)
            fa_mpi_scatter_rows((char *)x + (size_t)(s * Hp * st->s[1]) * es, st, U->recv + s * blk,
                                U->B, Hp, 0, L, Dx, es);
    U->c->stats.merge_s += fa_mpi_now() - t0;
}

/* Segment ids of every row: this rank's [B, L] gathered from all ranks into [B, S]. */
static void gather_ids(ulysses *U, const int32_t *mine, int which, int32_t *all) {
    int64_t L = fa_mpi_local_rows(U->pl, which), S = L * U->P;
    MPI_Datatype t;
    if (!block_type(U->c, U->B, L * 4, &t)) return;
    double t0 = fa_mpi_now();
    int rc = MPI_Allgather(mine, 1, t, U->recv, 1, t, U->c->comm);
    U->c->stats.comm_wait_s += fa_mpi_now() - t0;
    MPI_Type_free(&t);
    if (!fa_mpi_ok(U->c, rc, "MPI_Allgather")) return;
    U->c->stats.bytes_sent += (U->P - 1) * U->B * L * 4;
    U->c->stats.bytes_received += (U->P - 1) * U->B * L * 4;
    const int32_t *r = (const int32_t *)U->recv;
    for (int s = 0; s < U->P; s++) {
        fa_mpi_shard sh;
        fa_mpi_shard_of(U->pl, which, s, &sh);
        for (int g = 0; g < sh.n; g++)
            for (int64_t b = 0; b < U->B; b++)
                memcpy(all + b * S + sh.s[g].gstart, r + (s * U->B + b) * L + sh.s[g].lstart,
                       (size_t)sh.s[g].len * 4);
    }
}

/* dsink [Hq]: each rank wrote its Hp heads' in place; every rank gets all of them (the
 * collective joined even after a local failure). */
static void gather_dsink(ulysses *U, float *dsink, int64_t Hp) {
    double t0 = fa_mpi_now();
    int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dsink, (int)Hp, MPI_FLOAT, U->c->comm);
    U->c->stats.comm_wait_s += fa_mpi_now() - t0;
    if (!fa_mpi_ok(U->c, rc, "MPI_Allgather")) return;
    U->c->stats.bytes_sent += (U->P - 1) * Hp * 4;
    U->c->stats.bytes_received += (U->P - 1) * Hp * 4;
}

/* Sizes of the head-sharded tensors: q-like and o-like rows, k-like and v-like rows. */
typedef struct {
    fa_problem hp;
    fa_strides qst, kst, vst, ost, lst;
    int64_t nq, nk, nv, no, nl, big;
    size_t es;
} shapes;

static void shapes_of(const fa_mpi_plan *pl, shapes *z) {
    const fa_problem *g = &pl->g;
    fa_mpi_heads_problem(pl, &z->hp);
    z->es = fa_dtype_size(g->dtype);
    int64_t B = g->batch, Hq = g->heads_q, Hk = g->heads_kv, P = pl->P;
    z->qst = fa_mpi_local_stride(&g->q_stride, B, Hq, pl->lq, g->head_dim);
    z->kst = fa_mpi_local_stride(&g->k_stride, B, Hk, pl->lk, g->head_dim);
    z->vst = fa_mpi_local_stride(&g->v_stride, B, Hk, pl->lk, g->head_dim_v);
    z->ost = fa_mpi_local_stride(&g->o_stride, B, Hq, pl->lq, g->head_dim_v);
    z->lst = fa_mpi_contiguous(B, Hq, pl->lq, 1);
    z->nq = B * Hq / P * g->seq_q * g->head_dim * (int64_t)z->es;
    z->nk = B * Hk / P * g->seq_k * g->head_dim * (int64_t)z->es;
    z->nv = B * Hk / P * g->seq_k * g->head_dim_v * (int64_t)z->es;
    z->no = B * Hq / P * g->seq_q * g->head_dim_v * (int64_t)z->es;
    z->nl = B * Hq / P * g->seq_q * 4;
    /* the all-to-all buffers hold any one tensor, or every rank's segment ids */
    int64_t ids = g->has_segment_ids ? B * (g->seq_q > g->seq_k ? g->seq_q : g->seq_k) * 4 : 0;
    int64_t all[5] = {z->nq, z->nk, z->nv, z->no, z->nl};
    z->big = ids;
    for (int i = 0; i < 5; i++)
        if (all[i] > z->big) z->big = all[i];
}

/* Head-sharded buffers (q k v o lse do dq dk dv, as many as n) and the full-length segment
 * ids; returns 0 if an allocation failed. */
static int alloc_all(const fa_mpi_plan *pl, const shapes *z, ulysses *U, char **h, int n,
                     int32_t **ids) {
    int64_t sz[9] = {z->nq, z->nk, z->nv, z->no, z->nl, z->no, z->nq, z->nk, z->nv};
    int ok = 1;
    U->send = fa_mpi_alloc(pl, z->big);
    U->recv = fa_mpi_alloc(pl, z->big);
    ok = U->send && U->recv;
    for (int i = 0; i < n; i++) ok &= (h[i] = fa_mpi_alloc(pl, sz[i])) != NULL;
    ids[0] = ids[1] = NULL;
    if (pl->g.has_segment_ids) {
        ok &= (ids[0] = fa_mpi_alloc(pl, pl->g.batch * pl->g.seq_q * 4)) != NULL;
        ok &= (ids[1] = fa_mpi_alloc(pl, pl->g.batch * pl->g.seq_k * 4)) != NULL;
    }
    return ok;
}

static void free_all(ulysses *U, char **h, int n, int32_t **ids) {
    fa_free(U->send), fa_free(U->recv), fa_free(ids[0]), fa_free(ids[1]);
    for (int i = 0; i < n; i++) fa_free(h[i]);
}

static void run_kernel(fa_mpi_call *c, const shapes *z, int backward, void *args) {
    fa_plan *lp = NULL;
    fa_status st = fa_plan_create(&z->hp, &c->pl->opt, &lp);
    if (st != FA_OK) {
        fa_mpi_fail(c, st, "local plan: %s", fa_last_error());
        return;
    }
    double t0 = fa_mpi_now();
    st = backward ? fa_backward(lp, args) : fa_forward(lp, args);
    if (c->pl->rank == fa_mpi_test_fail_kernel_rank)
        st = fa_error(FA_ERR_BACKEND, "test hook: the kernel fails");
    c->stats.compute_s += fa_mpi_now() - t0;
    fa_plan_destroy(lp);
    if (st != FA_OK) {
        /* fa_mpi_fail formats the message before it sets the new one */
        fa_mpi_fail(c, st, "local %s: %s", backward ? "backward" : "forward", fa_last_error());
    }
}

/* One call of either pass: shapes, the all-to-all buffers, n head-sharded tensors (q k v o
 * lse do dq dk dv; the forward's first 5), the full-length segment ids, the call. */
typedef struct {
    shapes z;
    ulysses U;
    char *h[9];
    int n;
    int32_t *ids[2];
    fa_mpi_call c;
} run;

/* What both passes start with: the buffers, the agreement on the local status, then q, k,
 * v (qkv) and the segment ids moved to the head layout. On a failure the buffers are freed
 * and every rank returns it. */
static fa_status start(run *r, MPI_Comm comm, const fa_mpi_plan *pl, fa_pass pass, fa_status local,
                       const void *const qkv[3], const int32_t *qseg, const int32_t *kvseg) {
    const fa_problem *g = &pl->g;
    memset(r, 0, sizeof *r);
    r->n = pass == FA_BACKWARD ? 9 : 5;
    shapes_of(pl, &r->z);
    if (!alloc_all(pl, &r->z, &r->U, r->h, r->n, r->ids) && local == FA_OK)
        local = fa_error(FA_ERR_NO_MEMORY, "rank %d: out of memory (all-to-all buffers)", pl->rank);
    fa_status st = fa_mpi_begin(&r->c, comm, pl, pass, local);
    if (st != FA_OK) {
        free_all(&r->U, r->h, r->n, r->ids);
        return st;
    }
    ulysses *U = &r->U;
    const shapes *z = &r->z;
    U->c = &r->c, U->pl = pl, U->P = pl->P, U->B = g->batch;
    to_heads(U, qkv[0], &z->qst, 0, g->heads_q, g->head_dim, z->es, r->h[0]);
    to_heads(U, qkv[1], &z->kst, 1, g->heads_kv, g->head_dim, z->es, r->h[1]);
    to_heads(U, qkv[2], &z->vst, 1, g->heads_kv, g->head_dim_v, z->es, r->h[2]);
    if (g->has_segment_ids) {
        gather_ids(U, qseg, 0, r->ids[0]);
        gather_ids(U, kvseg, 1, r->ids[1]);
    }
    return FA_OK;
}

/* Both passes end: every rank agrees on the status, the stats go out, the buffers are freed. */
static fa_status finish(run *r, fa_mpi_stats *stats) {
    fa_status st = fa_mpi_end(&r->c, stats);
    free_all(&r->U, r->h, r->n, r->ids);
    return st;
}

fa_status fa_mpi_ulysses_forward(MPI_Comm comm, const fa_mpi_plan *pl,
                                 const fa_mpi_forward_args *a, fa_status local) {
    const fa_problem *g = &pl->g;
    run r;
    const void *qkv[3] = {a->q, a->k, a->v};
    fa_status st = start(&r, comm, pl, FA_FORWARD, local, qkv, a->q_segment_ids, a->kv_segment_ids);
    if (st != FA_OK) return st;
    const int64_t Hq = g->heads_q, Hp = Hq / pl->P;
    if (r.c.st == FA_OK) {
        fa_counts n = {0, 0};
        fa_forward_args fw;
        memset(&fw, 0, sizeof fw);
        fw.q = r.h[0], fw.k = r.h[1], fw.v = r.h[2], fw.o = r.h[3], fw.lse = (float *)r.h[4];
        fw.alibi_slopes = g->has_alibi ? a->alibi_slopes + pl->rank * Hp : NULL;
        fw.q_segment_ids = r.ids[0], fw.kv_segment_ids = r.ids[1];
        fw.sinks = g->has_sinks ? a->sinks + pl->rank * Hp : NULL; /* this rank's heads' */
        fw.counts = &n;
        fw.progress = a->progress, fw.progress_ctx = a->progress_ctx;
        run_kernel(&r.c, &r.z, 0, &fw);
        r.c.stats.counts = n;
    }
    from_heads(&r.U, r.h[3], 0, Hq, g->head_dim_v, r.z.es, a->o, &r.z.ost);
    from_heads(&r.U, r.h[4], 0, Hq, 1, 4, a->lse, &r.z.lst); /* lse NULL: taken part in, dropped */
    return finish(&r, a->stats);
}

fa_status fa_mpi_ulysses_backward(MPI_Comm comm, const fa_mpi_plan *pl,
                                  const fa_mpi_backward_args *a, fa_status local) {
    const fa_problem *g = &pl->g;
    run r;
    const void *qkv[3] = {a->q, a->k, a->v};
    fa_status st = start(&r, comm, pl, FA_BACKWARD, local, qkv, a->q_segment_ids, a->kv_segment_ids);
    if (st != FA_OK) return st;
    const int64_t Hq = g->heads_q, Hk = g->heads_kv, Hp = Hq / pl->P;
    to_heads(&r.U, a->o, &r.z.ost, 0, Hq, g->head_dim_v, r.z.es, r.h[3]);
    to_heads(&r.U, a->lse, &r.z.lst, 0, Hq, 1, 4, r.h[4]);
    to_heads(&r.U, a->d_o, &r.z.ost, 0, Hq, g->head_dim_v, r.z.es, r.h[5]);
    if (r.c.st == FA_OK) {
        fa_counts n = {0, 0};
        fa_backward_args bw;
        memset(&bw, 0, sizeof bw);
        bw.q = r.h[0], bw.k = r.h[1], bw.v = r.h[2], bw.o = r.h[3], bw.lse = (const float *)r.h[4];
        bw.d_o = r.h[5], bw.dq = r.h[6], bw.dk = r.h[7], bw.dv = r.h[8];
        bw.alibi_slopes = g->has_alibi ? a->alibi_slopes + pl->rank * Hp : NULL;
        bw.q_segment_ids = r.ids[0], bw.kv_segment_ids = r.ids[1];
        /* this rank's heads' sinks; their dsink in place, gathered below */
        bw.sinks = g->has_sinks ? a->sinks + pl->rank * Hp : NULL;
        bw.dsink = g->has_sinks ? a->dsink + pl->rank * Hp : NULL;
        bw.counts = &n;
        bw.progress = a->progress, bw.progress_ctx = a->progress_ctx;
        run_kernel(&r.c, &r.z, 1, &bw);
        r.c.stats.counts = n;
    }
    if (g->has_sinks) gather_dsink(&r.U, a->dsink, Hp);
    from_heads(&r.U, r.h[6], 0, Hq, g->head_dim, r.z.es, a->dq, &r.z.qst);
    from_heads(&r.U, r.h[7], 1, Hk, g->head_dim, r.z.es, a->dk, &r.z.kst);
    from_heads(&r.U, r.h[8], 1, Hk, g->head_dim_v, r.z.es, a->dv, &r.z.vst);
    return finish(&r, a->stats);
}
