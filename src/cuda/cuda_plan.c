/* The CUDA backend's side of a plan, in plain C so plans need no device: its block sizes
 * (the tiles compiled into the kernels, cuda_config.h) and the workspace its calls take. */
#include "../internal.h"
#include "cuda_config.h"

void fa_cuda_default_blocks(const fa_problem *p, fa_pass pass, int64_t *bq, int64_t *bk) {
    int hd = fa_cuda_hd_class(p->head_dim, p->head_dim_v);
    if (!hd) hd = 256; /* not runnable; plan.c rejects such head dims for cuda */
    if (pass == FA_BACKWARD) {
        *bq = FA_CUDA_BWD_BQ;
        *bk = fa_cuda_bwd_bk(hd);
    } else {
        *bq = FA_CUDA_FWD_BQ;
        *bk = fa_cuda_fwd_bk(hd);
    }
}

/* Forward: the kernels' two int64 counters (a 256-byte slot). Backward: the same slot, then
 * Delta = rowsum(dO o), one f32 per (b, hq, query row), rounded up to 256 bytes. The
 * kernels allocate exactly this when the caller passes no workspace. */
int64_t fa_cuda_workspace_bytes(const struct fa_plan *plan, fa_pass pass) {
    if (pass == FA_FORWARD) return FA_CUDA_COUNTER_BYTES;
    const fa_problem *p = &plan->p;
    const int64_t rows = p->batch * p->heads_q * p->seq_q * 4;
    return FA_CUDA_COUNTER_BYTES + (rows + 255) / 256 * 256;
}
