/* The backend table: each backend answers for itself what it runs, which tiles it takes,
 * the workspace it needs, and runs the passes (as ggml's supports_op, CUTLASS's
 * can_implement / get_workspace_size / run). The plan asks; it knows no backend's limits.
 *
 * Refusals: a combination of features no backend runs (bias with cu_seqlens, sequence
 * parallel with any inference shape, ...) is FA_ERR_INVALID, in words that name both
 * features (fa_supports_common, called first by every entry's supports); a limit of one
 * backend, build or device (f32 on CUDA, no CUDA built) is FA_ERR_UNSUPPORTED, as
 * docs/semantics.md says, and a run where no device is at all FA_ERR_BACKEND (the cuda
 * entry's supports, last). Nowhere else refuses a combination. */
#ifndef FA_BACKEND_H
#define FA_BACKEND_H

#include "internal.h"

/* What a caller asks of a backend besides the problem and the pass: whether the problem
 * is one rank's part of a sequence-parallel run (src/mpi/), and whether it is to run now
 * (a call, or AUTO's choice) rather than be planned: a plan named for a backend may state
 * the cost of what that build or device cannot run (f32 on CUDA), the call then refuses. */
enum { FA_USE_SEQ_PARALLEL = 1, FA_USE_RUN = 2 };

typedef struct fa_backend_entry {
    fa_backend id;
    const char *name;
    /* AUTO may pick it: a cheap check that the device is there (NULL: always). */
    int (*present)(void);
    /* FA_OK if this backend runs problem p (defaults of heads_kv and head_dim_v resolved)
     * for pass; else the status and fa_error's message. uses: FA_USE_* bits. */
    fa_status (*supports)(const fa_problem *p, fa_pass pass, unsigned uses);
    /* FA_OK if it runs the options' block sizes (block_q, block_k; 0 = its own) for p; else
     * FA_ERR_UNSUPPORTED and why (NULL: it runs any). Asked with supports, so that AUTO passes
     * over a backend that would refuse them rather than fail. */
    fa_status (*takes_blocks)(const fa_problem *p, const fa_options *o);
    /* Threads, ISA and tiles of both passes into pl (the options' block sizes where given,
     * which takes_blocks accepted). */
    fa_status (*choose_blocks)(struct fa_plan *pl, const fa_options *o);
    /* Scratch of a pass (bytes, -1 if it overflows int64): what the pass allocates when the
     * caller passes none, and the cost model's workspace_bytes. */
    int64_t (*workspace_bytes)(const struct fa_plan *pl, fa_pass pass);
    /* The passes; the arguments are checked (args.c) before they are called. */
    fa_status (*forward)(const struct fa_plan *pl, const fa_forward_args *a);
    fa_status (*backward)(const struct fa_plan *pl, const fa_backward_args *a);
} fa_backend_entry;

extern const fa_backend_entry fa_backend_cpu_entry;  /* cpu/backend_cpu.c */
extern const fa_backend_entry fa_backend_cuda_entry; /* cuda/cuda_plan.c */

/* The entry of backend b (CPU or CUDA; NULL for AUTO or an unknown value). */
const fa_backend_entry *fa_backend_of(fa_backend b);
/* AUTO's order: the backends to try, best first (the CPU last: it runs everything that
 * combines). *n receives the count. */
const fa_backend_entry *const *fa_backend_order(int *n);

/* The combinations no backend runs (FA_ERR_INVALID naming both features), and what every
 * pass needs (decode has no backward). */
fa_status fa_supports_common(const fa_problem *p, fa_pass pass, unsigned uses);
/* The inference shape p asks for, in words ("packed variable-length batches (cu_seqlens)"),
 * or NULL for a dense problem. */
const char *fa_inference_feature(const fa_problem *p);
/* Whether p is a packed batch (cu_seqlens or FA_LENGTHS_PACKED) or kv-cache decoding
 * (cache_seqlens or FA_LENGTHS_CACHE), whether its lengths come with the plan or per call. */
int fa_problem_varlen(const fa_problem *p);
int fa_problem_decode(const fa_problem *p);

/* The public entries' argument checks (args.c): every pointer problem p needs (decode's
 * new rows and block table too), the caller's workspace against workspace bytes (when it
 * passes one), and the ALiBi slopes finite where host is set (CUDA's are device memory:
 * its entry checks them). fn names the entry in the message ("fa_forward: q is NULL"). */
fa_status fa_check_forward_args(const fa_problem *p, const fa_forward_args *a, int64_t workspace, int host,
                                const char *fn);
fa_status fa_check_backward_args(const fa_problem *p, const fa_backward_args *a, int64_t workspace, int host,
                                 const char *fn);
/* FA_ERR_INVALID where an output shares memory with an input, two outputs are one buffer,
 * or an output's zero stride would write several elements to one address (args.c; the
 * rule: flashattn.h, fa_forward_args). p: the plan's resolved problem, whose shapes and
 * strides are the tensors' own; the MPI entries' global problem is not (each rank's local
 * passes check theirs). After the fa_check_*_args above. */
fa_status fa_check_forward_overlaps(const fa_problem *p, const fa_forward_args *a, const char *fn);
fa_status fa_check_backward_overlaps(const fa_problem *p, const fa_backward_args *a, const char *fn);

#endif /* FA_BACKEND_H */
