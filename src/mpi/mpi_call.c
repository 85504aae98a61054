/* What every sequence-parallel call shares: argument checks, agreement between ranks before
 * any traffic (so a rank that fails locally fails every rank instead of leaving them
 * waiting), chunked non-blocking transfers with byte counts, the exact merge of partial
 * results, and the entry points. */
#include "mpi_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int fa_mpi_test_fail_alloc_rank = -1;
int fa_mpi_test_fail_kernel_rank = -1;

double fa_mpi_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *fa_mpi_alloc(const fa_mpi_plan *pl, int64_t bytes) {
    if (pl->rank == fa_mpi_test_fail_alloc_rank) return NULL;
    if (bytes < 0 || (uint64_t)bytes > SIZE_MAX) return NULL;
    return fa_malloc(bytes ? (size_t)bytes : 1);
}

fa_status fa_mpi_fail(fa_mpi_call *c, fa_status st, const char *fmt, ...) {
    if (c->st != FA_OK) return c->st;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = fa_error(st, "rank %d: %s", c->rank, msg);
    return c->st;
}

int fa_mpi_ok(fa_mpi_call *c, int mpi_rc, const char *what) {
    if (mpi_rc == MPI_SUCCESS) return 1;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(mpi_rc, msg, &len);
    fa_mpi_fail(c, FA_ERR_BACKEND, "%s failed: %.*s", what, len, msg);
    return 0;
}

/* One allreduce (MAX) of {digest, -digest, failing rank + 1, status}: equal digests mean
 * the ranks agree; the largest failing rank and status are known to all. A rank's failure
 * comes first: its digest (a rank without a plan or arguments has none) says nothing then.
 * The digest keeps 62 bits, so that its negation fits; what it mixes in must reach them. */
#define DISAGREE (-1)
static int agree(fa_mpi_call *c, uint64_t dig, fa_status local, int *failed_rank) {
    int64_t d = (int64_t)(dig >> 2), v[4] = {d, -d, local != FA_OK ? c->rank + 1 : 0, local};
    double t0 = fa_mpi_now();
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_INT64_T, MPI_MAX, c->comm);
    c->stats.comm_wait_s += fa_mpi_now() - t0;
    if (!fa_mpi_ok(c, rc, "MPI_Allreduce (agreement)")) return (int)c->st;
    *failed_rank = (int)v[2] - 1;
    if (v[3] != FA_OK) return (int)v[3];
    return v[0] != -v[1] ? DISAGREE : FA_OK;
}

/* The values of the call's per-head arrays (ALiBi slopes, sinks), which every rank must
 * pass alike: set by the entries for fa_mpi_begin's agreement (0: none, or a failed check). */
static _Thread_local uint64_t call_values;

static uint64_t values_digest(int64_t heads, const float *slopes, const float *sinks) {
    uint64_t h = 0x84222325cbf29ce4ull;
    const float *arr[2] = {slopes, sinks};
    for (int x = 0; x < 2; x++)
        for (int64_t i = 0; arr[x] && i < heads; i++) {
            uint32_t u;
            memcpy(&u, &arr[x][i], sizeof u);
            h = (h ^ (u + (uint64_t)x)) * 0x100000001b3ull;
        }
    return h * 0x9E3779B97F4A7C15ull; /* spread into the bits the agreement keeps */
}

fa_status fa_mpi_begin(fa_mpi_call *c, MPI_Comm comm, const fa_mpi_plan *pl, fa_pass pass,
                       fa_status local) {
    memset(c, 0, sizeof *c);
    c->pl = pl;
    c->comm = MPI_COMM_NULL;
    c->rank = pl->rank;
    int size = 0, rank = 0, init = 0, done = 0;
    /* before any call on comm, which MPI's default error handler would abort on */
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init || MPI_Finalized(&done) != MPI_SUCCESS || done)
        return fa_error(FA_ERR_INVALID, "MPI is %s: call MPI_Init before the sequence-parallel calls",
                        init ? "finalized" : "not initialized");
    if (comm == MPI_COMM_NULL) return fa_error(FA_ERR_INVALID, "the communicator is MPI_COMM_NULL");
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return fa_error(FA_ERR_INVALID, "not a valid communicator");
    c->rank = rank; /* the communicator's: what the messages and the failed-rank field name */
    double t0 = fa_mpi_now();
    int rc = MPI_Comm_dup(comm, &c->comm);
    c->stats.comm_wait_s += fa_mpi_now() - t0;
    if (!fa_mpi_ok(c, rc, "MPI_Comm_dup")) return c->st;
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    /* a plan for another P or rank is this rank's failure, but it still joins the agreement:
     * ranks whose plans do match would otherwise wait for it */
    c->st = local;
    if (local == FA_OK && size != pl->P)
        fa_mpi_fail(c, FA_ERR_INVALID, "the plan is for %d ranks but the communicator has %d",
                    pl->P, size);
    if (c->st == FA_OK && rank != pl->rank)
        fa_mpi_fail(c, FA_ERR_INVALID, "the plan is for rank %d but this is rank %d", pl->rank, rank);
    int failed = -1;
    /* the pass and the per-head values into the digest's kept bits: ranks in another pass or
     * with other slopes or sinks disagree (the pass once reached only the dropped low bits) */
    int all = agree(c, pl->digest ^ ((uint64_t)(pass + 1) * 0xC2B2AE3D27D4EB4Full) ^ call_values, c->st, &failed);
    if (all == FA_OK) return FA_OK;
    MPI_Comm_free(&c->comm);
    if (c->st != FA_OK) return c->st; /* this rank's own failure, its message set */
    if (all == DISAGREE)
        return fa_error(FA_ERR_INVALID, "ranks disagree on the problem (shapes, options, method, layout, the pass "
                        "or the ALiBi slopes or sinks differ between ranks; seen by rank %d)", rank);
    return fa_error((fa_status)all, "rank %d failed before any traffic (%s); every rank stops",
                    failed, fa_status_string((fa_status)all));
}

fa_status fa_mpi_end(fa_mpi_call *c, fa_mpi_stats *out) {
    int failed = -1;
    fa_status mine = c->st;
    int all = agree(c, c->pl->digest, mine, &failed);
    if (out) *out = c->stats;
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    if (mine != FA_OK) return mine; /* its message is already set */
    if (all != FA_OK) {
        fa_status st = all == DISAGREE ? FA_ERR_INTERNAL : (fa_status)all;
        return fa_error(st, "rank %d failed during the call (%s); every rank stops", failed,
                        fa_status_string(st));
    }
    return FA_OK;
}

#define PIECE ((int64_t)1 << 30)

static void post(fa_mpi_call *c, fa_mpi_xfer *x, void *buf, int64_t bytes, int peer, int tag,
                 int recv) {
    if (c->st != FA_OK && c->comm == MPI_COMM_NULL) return;
    for (int64_t off = 0; off < bytes; off += PIECE) {
        int n = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        if (x->n == FA_MPI_MAX_REQ) {
            fa_mpi_fail(c, FA_ERR_UNSUPPORTED, "a transfer of %lld bytes is too large",
                        (long long)bytes);
            return;
        }
        int rc = recv ? MPI_Irecv((char *)buf + off, n, MPI_BYTE, peer, tag, c->comm, &x->req[x->n])
                      : MPI_Isend((char *)buf + off, n, MPI_BYTE, peer, tag, c->comm, &x->req[x->n]);
        if (!fa_mpi_ok(c, rc, recv ? "MPI_Irecv" : "MPI_Isend")) return;
        x->recv[x->n++] = recv;
        if (!recv) c->stats.bytes_sent += n;
    }
}

void fa_mpi_isend(fa_mpi_call *c, fa_mpi_xfer *x, const void *buf, int64_t bytes, int dest, int tag) {
    post(c, x, (void *)buf, bytes, dest, tag, 0);
}
void fa_mpi_irecv(fa_mpi_call *c, fa_mpi_xfer *x, void *buf, int64_t bytes, int src, int tag) {
    post(c, x, buf, bytes, src, tag, 1);
}

void fa_mpi_wait(fa_mpi_call *c, fa_mpi_xfer *x) {
    if (x->n == 0) return;
    MPI_Status st[FA_MPI_MAX_REQ];
    double t0 = fa_mpi_now();
    int rc = MPI_Waitall(x->n, x->req, st);
    c->stats.comm_wait_s += fa_mpi_now() - t0;
    if (fa_mpi_ok(c, rc, "MPI_Waitall"))
        for (int i = 0; i < x->n; i++)
            if (x->recv[i]) {
                int got = 0;
                MPI_Get_count(&st[i], MPI_BYTE, &got);
                c->stats.bytes_received += got;
            }
    x->n = 0;
}

void fa_mpi_merge_rows(int64_t rows, int64_t dv, float *acc_o, float *acc_lse, fa_dtype t,
                       const void *part_o, int64_t part_rs, const float *part_lse) {
    for (int64_t i = 0; i < rows; i++) {
        float lp = part_lse[i], la = acc_lse[i];
        if (lp == -INFINITY) continue;
        float *ao = acc_o + i * dv;
        if (la == -INFINITY) {
            for (int64_t d = 0; d < dv; d++) ao[d] = fa_load(t, part_o, i * part_rs + d);
            acc_lse[i] = lp;
            continue;
        }
        float m = la > lp ? la : lp;
        float wa = expf(la - m), wp = expf(lp - m), sum = wa + wp;
        float ca = wa / sum, cp = wp / sum;
        for (int64_t d = 0; d < dv; d++) ao[d] = ca * ao[d] + cp * fa_load(t, part_o, i * part_rs + d);
        acc_lse[i] = m + logf(sum);
    }
}

/* ---- entry points ------------------------------------------------------------------- */

/* The public entries' one argument check (args.c), on this rank's tensors seen as the
 * single-process arguments they are (no workspace: the ring and Ulysses allocate their own). */
static fa_status check_forward(const fa_problem *g, const fa_mpi_forward_args *a) {
    fa_forward_args v = {0};
    if (a) {
        v.q = a->q, v.k = a->k, v.v = a->v, v.o = a->o, v.alibi_slopes = a->alibi_slopes;
        v.q_segment_ids = a->q_segment_ids, v.kv_segment_ids = a->kv_segment_ids, v.sinks = a->sinks;
    }
    return fa_check_forward_args(g, a ? &v : NULL, 0, 1, "fa_mpi_forward");
}

static fa_status check_backward(const fa_problem *g, const fa_mpi_backward_args *a) {
    fa_backward_args v = {0};
    if (a) {
        v.q = a->q, v.k = a->k, v.v = a->v, v.o = a->o, v.d_o = a->d_o, v.lse = a->lse;
        v.dq = a->dq, v.dk = a->dk, v.dv = a->dv, v.alibi_slopes = a->alibi_slopes;
        v.q_segment_ids = a->q_segment_ids, v.kv_segment_ids = a->kv_segment_ids;
        v.sinks = a->sinks, v.dsink = a->dsink;
    }
    return fa_check_backward_args(g, a ? &v : NULL, 0, 1, "fa_mpi_backward");
}

/* Both entries: the plan there, the stats zeroed. */
static fa_status enter(const fa_mpi_plan *plan, fa_mpi_stats *stats, const char *fn) {
    if (stats) memset(stats, 0, sizeof *stats);
    return plan ? FA_OK : fa_error(FA_ERR_NULL, "%s: plan is NULL", fn);
}

/* A rank without a plan (NULL: its fa_mpi_plan_create failed, say) still joins the first
 * agreement of fa_mpi_begin as a failed rank, on a duplicate of comm as its peers do: they
 * then return "rank r failed" instead of waiting for it. Its digest is unknown: it sends
 * the MAX's identity, which leaves theirs as it is. */
static fa_status join_without_plan(MPI_Comm comm, fa_status st) {
    int rank = 0, init = 0, done = 0;
    MPI_Comm dup;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init || MPI_Finalized(&done) != MPI_SUCCESS || done ||
        comm == MPI_COMM_NULL) /* nothing to join: as fa_mpi_begin says */
        return st;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_dup(comm, &dup) != MPI_SUCCESS) return st;
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    int64_t v[4] = {INT64_MIN, INT64_MIN, rank + 1, st};
    MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_INT64_T, MPI_MAX, dup);
    MPI_Comm_free(&dup);
    return st;
}

/* A local mistake still joins the agreement, so that no peer waits for this rank. */
fa_status fa_mpi_forward(MPI_Comm comm, const fa_mpi_plan *plan, const fa_mpi_forward_args *a) {
    static const fa_mpi_forward_args none;
    fa_status st = enter(plan, a ? a->stats : NULL, "fa_mpi_forward");
    if (st) return join_without_plan(comm, st);
    st = check_forward(&plan->g, a);
    call_values = st || !a ? 0 : values_digest(plan->g.heads_q, plan->g.has_alibi ? a->alibi_slopes : NULL,
                                               plan->g.has_sinks ? a->sinks : NULL);
    return (plan->method == FA_MPI_RING ? fa_mpi_ring_forward : fa_mpi_ulysses_forward)(comm, plan, a ? a : &none, st);
}

fa_status fa_mpi_backward(MPI_Comm comm, const fa_mpi_plan *plan, const fa_mpi_backward_args *a) {
    static const fa_mpi_backward_args none;
    fa_status st = enter(plan, a ? a->stats : NULL, "fa_mpi_backward");
    if (st) return join_without_plan(comm, st);
    st = check_backward(&plan->g, a);
    call_values = st || !a ? 0 : values_digest(plan->g.heads_q, plan->g.has_alibi ? a->alibi_slopes : NULL,
                                               plan->g.has_sinks ? a->sinks : NULL);
    return (plan->method == FA_MPI_RING ? fa_mpi_ring_backward : fa_mpi_ulysses_backward)(comm, plan, a ? a : &none,
                                                                                         st);
}
