/* flashattn_mpi: sequence-parallel attention over MPI (an optional component, built where
 * CMake finds MPI). The sequence is split across the ranks of a communicator; every rank
 * passes its own rows of q, k, v (and of o, lse, do in the backward) and gets its own rows
 * of the outputs. Two methods:
 *   FA_MPI_RING     K/V blocks travel around the ring while each rank works on the block it
 *                   holds (non-blocking, double-buffered); partial (o, lse) merged exactly;
 *                   in the backward dq stays local and dk/dv accumulators travel home.
 *   FA_MPI_ULYSSES  all-to-all from sequence shards to head shards, the local kernel on full
 *                   sequences, all-to-all back. Needs Hk divisible by the number of ranks.
 * Layouts (of every sequence-sharded tensor, q-like rows with Sq, k-like rows with Sk):
 *   FA_MPI_CONTIGUOUS  rank r holds rows [r*S/P, (r+1)*S/P)              (S divisible by P)
 *   FA_MPI_ZIGZAG      rank r holds chunks r and 2P-1-r of 2P equal chunks, in that order
 *                      (S divisible by 2P); balances causal work across ranks.
 * Local tensors are [B, H, S/P, D] with the strides given in the problem (all zero:
 * contiguous); lse and segment ids are contiguous [B, Hq, Sq/P] and [B, S/P].
 * Errors: every rank returns the same status. Ranks check before any traffic that they agree
 * on the problem; a rank that fails locally (NULL tensor, allocation failure) makes every
 * rank return an error. Open MPI 4.1 has no fault tolerance: a rank that dies outright ends
 * the whole job through mpirun. Details and the per-rank plan: docs/mpi.md. */
#ifndef FLASHATTN_MPI_H
#define FLASHATTN_MPI_H

#include "flashattn.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FA_MPI_RING = 0, FA_MPI_ULYSSES = 1 } fa_mpi_method;
typedef enum { FA_MPI_CONTIGUOUS = 0, FA_MPI_ZIGZAG = 1 } fa_mpi_layout;

/* ---- plan: one rank's share of a global problem, from shapes alone (no communicator) --- */

typedef struct fa_mpi_plan fa_mpi_plan;

/* global: the whole problem (every rank passes the same); nranks P and this rank. A bias,
 * the inference shapes, dropout and block-sparse masks are refused (FA_ERR_INVALID, naming
 * both features; docs/mpi.md). */
FA_API fa_status fa_mpi_plan_create(const fa_problem *global, const fa_options *opt,
                                    fa_mpi_method method, fa_mpi_layout layout, int nranks,
                                    int rank, fa_mpi_plan **out);
FA_API void fa_mpi_plan_destroy(fa_mpi_plan *plan);

/* Rows this rank holds of q-like (which = 0) or k-like (which = 1) tensors, and the global
 * row of local row t (-1 for a NULL plan, another which, or t not a local row). */
FA_API int64_t fa_mpi_local_rows(const fa_mpi_plan *plan, int which);
FA_API int64_t fa_mpi_global_row(const fa_mpi_plan *plan, int which, int64_t t);
/* The same without a plan: global row of local row t of `rank`, S rows in all (-1 if t is
 * not a local row, S does not divide as the layout needs, or the layout or rank is bad). */
FA_API int64_t fa_mpi_layout_row(fa_mpi_layout layout, int nranks, int rank, int64_t S, int64_t t);

/* What one pass costs this rank. flops and transcendentals are those of the local kernel
 * calls (the merge's few element-wise operations per row are not counted); bytes are what
 * this rank hands to MPI for other ranks and receives from them. */
typedef struct {
    int64_t flops;
    int64_t transcendentals;
    int64_t bytes_sent;
    int64_t bytes_received;
    int64_t steps;          /* ring steps (P) or all-to-all rounds */
    int64_t peak_bytes;     /* local inputs + outputs + communication buffers + workspace */
    int64_t max_step_flops; /* the ring step with the most work (Ulysses: the whole call) */
    int64_t max_step_bytes; /* the largest transfer overlapping one step */
} fa_mpi_cost;
FA_API fa_status fa_mpi_plan_cost(const fa_mpi_plan *plan, fa_pass pass, fa_mpi_cost *out);

/* A paper model of one pass on this rank, given a sustained compute rate (flop/s) and a link
 * bandwidth per direction (bytes/s). Ring: each step takes max(compute, transfer of the next
 * block); Ulysses: compute plus its all-to-alls (nothing overlaps). */
typedef struct {
    double compute_s;   /* flops / rate */
    double comm_s;      /* bytes / bandwidth (the larger of sent and received) */
    double predicted_s; /* with overlap as the method allows */
    int comm_hidden;    /* 1 when every transfer hides behind the compute of its step */
} fa_mpi_prediction;
FA_API fa_status fa_mpi_predict(const fa_mpi_plan *plan, fa_pass pass, double flops_per_s,
                                double bytes_per_s, fa_mpi_prediction *out);
/* 1 when communication hides behind compute for this plan's P at this rate and bandwidth. */
FA_API int fa_mpi_comm_hides(const fa_mpi_plan *plan, fa_pass pass, double flops_per_s,
                             double bytes_per_s);

/* ---- run ---------------------------------------------------------------------------- */

/* What one call did on this rank, measured where it happens (zeroed first). */
typedef struct {
    fa_counts counts;        /* summed over the local kernel calls */
    int64_t bytes_sent, bytes_received;
    double compute_s;        /* in local kernel calls */
    double comm_wait_s;      /* blocked on communication (waits, collectives, agreement) */
    double merge_s;          /* merging partial results, packing, unpacking, local plans */
} fa_mpi_stats;

typedef struct {
    const void *q, *k, *v;       /* local rows */
    void *o;
    float *lse;                  /* [B, Hq, Sq/P] or NULL */
    const float *alibi_slopes;   /* [Hq], when has_alibi */
    const int32_t *q_segment_ids, *kv_segment_ids; /* local rows, when has_segment_ids */
    fa_mpi_stats *stats;         /* optional */
    const float *sinks;          /* [Hq], when has_sinks (every rank the same) */
    /* optional: this rank's progress (fa_progress_fn, flashattn.h): ring steps done out of P
     * under FA_MPI_RING, the local call's tiles under FA_MPI_ULYSSES */
    fa_progress_fn progress;
    void *progress_ctx;
} fa_mpi_forward_args;

typedef struct {
    const void *q, *k, *v, *o, *d_o;
    const float *lse;            /* the forward's, required */
    void *dq, *dk, *dv;
    const float *alibi_slopes;
    const int32_t *q_segment_ids, *kv_segment_ids;
    fa_mpi_stats *stats;
    const float *sinks;          /* [Hq], when has_sinks */
    float *dsink;                /* [Hq], when has_sinks: the whole sum, the same on every rank */
    fa_progress_fn progress;     /* optional, as in fa_mpi_forward_args */
    void *progress_ctx;
} fa_mpi_backward_args;

/* Collective over comm (whose size and rank must be the plan's). */
FA_API fa_status fa_mpi_forward(MPI_Comm comm, const fa_mpi_plan *plan,
                                const fa_mpi_forward_args *args);
FA_API fa_status fa_mpi_backward(MPI_Comm comm, const fa_mpi_plan *plan,
                                 const fa_mpi_backward_args *args);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_MPI_H */
