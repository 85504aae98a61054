/* Internals of the sequence-parallel component: the per-rank plan, the shard layout, and
 * the helpers the ring and the all-to-all share (agreement, chunked transfers, timing). */
#ifndef FA_MPI_INTERNAL_H
#define FA_MPI_INTERNAL_H

#include "flashattn_mpi.h"
#include "backend.h"

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

/* A run of consecutive global rows held by one rank: global rows [gstart, gstart + len)
 * sit at local rows [lstart, lstart + len). A shard is one (contiguous) or two (zigzag). */
typedef struct {
    int64_t gstart, len, lstart;
} fa_mpi_seg;
typedef struct {
    int n;
    fa_mpi_seg s[2];
} fa_mpi_shard;

struct fa_mpi_plan {
    fa_problem g;        /* the global problem as given */
    fa_options opt;      /* backend forced to CPU */
    fa_mpi_method method;
    fa_mpi_layout layout;
    int P, rank;
    int64_t goff;        /* the global diagonal offset (diag_offset or Sk - Sq) */
    int64_t lq, lk;      /* local rows of q-like and k-like tensors */
    fa_mpi_cost fwd, bwd;
    uint64_t digest;     /* of everything ranks must agree on */
};

/* Rows of rank j: which = 0 for q-like tensors (Sq), 1 for k-like (Sk). */
void fa_mpi_shard_of(const fa_mpi_plan *pl, int which, int j, fa_mpi_shard *out);

/* The local problem of q rows qs against k rows ks (a plain problem whose masks align at the
 * global diagonal), with the given local strides. */
void fa_mpi_pair_problem(const fa_mpi_plan *pl, const fa_mpi_seg *qs, const fa_mpi_seg *ks,
                         fa_problem *out);
/* The head-sharded problem of Ulysses: Hq/P and Hk/P heads, full sequences, contiguous. */
void fa_mpi_heads_problem(const fa_mpi_plan *pl, fa_problem *out);

/* Contiguous strides of a [b, h, s, d] tensor. */
fa_strides fa_mpi_contiguous(int64_t b, int64_t h, int64_t s, int64_t d);
/* The problem's stride of a local tensor (all zero: contiguous over the local rows). */
fa_strides fa_mpi_local_stride(const fa_strides *given, int64_t b, int64_t h, int64_t s, int64_t d);
/* Elements a strided [b, h, s, d] tensor spans (largest offset + 1). */
int64_t fa_mpi_span(const fa_strides *st, int64_t b, int64_t h, int64_t s, int64_t d);

/* Byte sizes the ring and Ulysses allocate, shared by the plan (peak_bytes) and the runs. */
int64_t fa_mpi_kv_block_bytes(const fa_mpi_plan *pl);   /* k, v (and kv segment ids) */
int64_t fa_mpi_acc_block_bytes(const fa_mpi_plan *pl);  /* f32 dk, dv accumulators */

/* ---- running ------------------------------------------------------------------------ */

double fa_mpi_now(void);

/* A call's communicator (a duplicate of the caller's with MPI_ERRORS_RETURN), its status
 * and its measured figures. */
typedef struct {
    MPI_Comm comm;
    const fa_mpi_plan *pl;
    int rank;            /* this rank in the communicator (the plan's until it is known) */
    fa_status st;        /* first local failure (FA_OK while none) */
    fa_mpi_stats stats;
} fa_mpi_call;

/* Duplicates comm, checks its size and rank against the plan, then agrees with every rank
 * on the problem digest and on local_status (an earlier local failure) before any traffic.
 * Returns the status every rank returns. */
fa_status fa_mpi_begin(fa_mpi_call *c, MPI_Comm comm, const fa_mpi_plan *pl, fa_pass pass,
                       fa_status local_status);
/* Agrees on the final status (any rank's failure fails every rank), copies the stats out,
 * frees the communicator. */
fa_status fa_mpi_end(fa_mpi_call *c, fa_mpi_stats *out);
/* Records a local failure (keeps the first) and returns it. */
fa_status fa_mpi_fail(fa_mpi_call *c, fa_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Checks an MPI return code; records FA_ERR_BACKEND with MPI's message on failure. */
int fa_mpi_ok(fa_mpi_call *c, int mpi_rc, const char *what);

/* Point-to-point transfers of any size (split into pieces of at most 1 GiB). */
#define FA_MPI_MAX_REQ 256
typedef struct {
    MPI_Request req[FA_MPI_MAX_REQ];
    int recv[FA_MPI_MAX_REQ];
    int n;
} fa_mpi_xfer;
void fa_mpi_isend(fa_mpi_call *c, fa_mpi_xfer *x, const void *buf, int64_t bytes, int dest, int tag);
void fa_mpi_irecv(fa_mpi_call *c, fa_mpi_xfer *x, void *buf, int64_t bytes, int src, int tag);
/* Waits for every request of x (time counted as comm wait; received bytes as MPI reports). */
void fa_mpi_wait(fa_mpi_call *c, fa_mpi_xfer *x);

/* Exact merge of a partial result into a running one, row by row (log-sum-exp):
 * acc_o [rows, dv] f32 and acc_lse [rows] with part_o (dtype t, row stride part_rs) and
 * part_lse. A row whose partial lse is -inf (no visible key) leaves acc unchanged. */
void fa_mpi_merge_rows(int64_t rows, int64_t dv, float *acc_o, float *acc_lse, fa_dtype t,
                       const void *part_o, int64_t part_rs, const float *part_lse);

/* Rows [t0, t0 + L) of a strided [B, H, *, D] tensor (elements of es bytes) to or from a
 * contiguous [B, H, L, D] buffer. */
void fa_mpi_gather_rows(void *dst, const void *src, const fa_strides *st, int64_t B, int64_t H,
                        int64_t t0, int64_t L, int64_t D, size_t es);
void fa_mpi_scatter_rows(void *dst, const fa_strides *st, const void *src, int64_t B, int64_t H,
                         int64_t t0, int64_t L, int64_t D, size_t es);
/* A contiguous f32 [B, H, L, D] buffer stored into a strided tensor of dtype t. */
void fa_mpi_store_f32(fa_dtype t, void *dst, const fa_strides *st, const float *src, int64_t B,
                      int64_t H, int64_t L, int64_t D);

/* Test hooks (internal on purpose; -1: none): the rank whose allocations fail, and the rank
 * whose local kernel fails in mid-call (ring step min(1, P-1), or the Ulysses kernel). */
extern int fa_mpi_test_fail_alloc_rank;
extern int fa_mpi_test_fail_kernel_rank;
void *fa_mpi_alloc(const fa_mpi_plan *pl, int64_t bytes);

/* The two methods. Each allocates first, then calls fa_mpi_begin with local (the argument
 * checks' status, or its own allocation failure), so that every rank learns of a failure
 * before any traffic. */
fa_status fa_mpi_ring_forward(MPI_Comm comm, const fa_mpi_plan *pl, const fa_mpi_forward_args *a,
                              fa_status local);
fa_status fa_mpi_ring_backward(MPI_Comm comm, const fa_mpi_plan *pl,
                               const fa_mpi_backward_args *a, fa_status local);
fa_status fa_mpi_ulysses_forward(MPI_Comm comm, const fa_mpi_plan *pl,
                                 const fa_mpi_forward_args *a, fa_status local);
fa_status fa_mpi_ulysses_backward(MPI_Comm comm, const fa_mpi_plan *pl,
                                  const fa_mpi_backward_args *a, fa_status local);

#endif
