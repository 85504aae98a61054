/* The CUDA backend's entry in the backend table (backend.h), in plain C so plans need no
 * device: what its kernels run (every CUDA limit is stated here, once), its block sizes
 * (the tiles compiled into the kernels, cuda_config.h) and the workspace its calls take.
 * The passes themselves are cuda_api.cu's (cuda_none.c where nvcc was not found). */
#include "../backend.h"
#include "cuda_config.h"

#include <unistd.h>

/* A stat of the device node: plans stay cheap and need no device context (cudaGetDeviceCount
 * alone costs ~150 ms); a missing driver is reported by fa_forward. */
static int cuda_present(void) { return access("/dev/nvidiactl", F_OK) == 0; }

static fa_status cuda_supports(const fa_problem *p, fa_pass pass, unsigned uses) {
    fa_status s = fa_supports_common(p, pass, uses);
    if (s) return s;
    if (uses & FA_USE_SEQ_PARALLEL)
        return fa_error(FA_ERR_UNSUPPORTED, "sequence parallel runs on the CPU backend (host memory), not on cuda");
    if (p->shared_prefix_len)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no kernels for a shared prefix (shared_prefix_len) "
                                            "yet; use backend cpu");
    if (p->lengths_per_call)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no kernels for lengths per call (lengths_per_call) yet "
                                            "(no device here to check them); use backend cpu");
    if (fa_dtype_quantized(fa_cache_dtype(p)))
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no kernels for quantized kv caches (cache_dtype %s) "
                                            "with kv-cache decoding yet; use backend cpu", fa_dtype_name(p->cache_dtype));
    const char *shape = fa_inference_feature(p);
    if (shape) return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no kernels for %s yet; use backend cpu", shape);
    if (fa_problem_empty(p))
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend does not run zero sizes (batch, heads_q, seq_q or seq_k 0); "
                                            "use backend cpu with host memory");
    if (p->bias_grad)
        return fa_error(FA_ERR_UNSUPPORTED,
                        "the cuda backend does not compute dbias (bias_grad); plan it on the cpu backend");
    if (p->has_sinks)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no attention sinks (has_sinks) yet: no device to "
                                            "check them on; plan it on the cpu backend");
    if (p->dropout_p > 0.0f)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no dropout (dropout_p > 0) yet; use backend cpu");
    if (p->mask)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend has no kernels for a block-sparse mask (mask) yet; "
                                            "plan it on the cpu backend");
    if (!fa_cuda_hd_class(p->head_dim, p->head_dim_v) || p->head_dim % 8 || p->head_dim_v % 8)
        return fa_error(FA_ERR_UNSUPPORTED,
                        "the cuda backend needs head dims <= 256 and multiples of 8, got D=%lld Dv=%lld",
                        (long long)p->head_dim, (long long)p->head_dim_v);
    if (!(uses & FA_USE_RUN)) return FA_OK; /* the rest limits the kernels, not what a plan describes */
    if (p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend runs f16 and bf16 only; dtype %s needs the cpu backend",
                        fa_dtype_name(p->dtype));
    if (p->heads_q > 65535 || p->batch > 65535)
        return fa_error(FA_ERR_UNSUPPORTED, "the cuda backend launches at most 65535 heads and batches, got %lld and %lld",
                        (long long)p->heads_q, (long long)p->batch);
    /* a cuda plan's figures need no device; running it does (said here, once, rather than
     * as cudart's first failing call, "driver version is insufficient", on an argument) */
    if (!fa_cuda_available())
        return fa_error(FA_ERR_BACKEND, "no CUDA device is available to this process: a cuda plan gives its cost "
                                        "figures without one, but runs only on a device (use backend cpu)");
    return FA_OK;
}

static void default_blocks(const fa_problem *p, fa_pass pass, int64_t *bq, int64_t *bk) {
    const int hd = fa_cuda_hd_class(p->head_dim, p->head_dim_v); /* supports checked it */
    *bq = pass == FA_BACKWARD ? FA_CUDA_BWD_BQ : FA_CUDA_FWD_BQ;
    *bk = pass == FA_BACKWARD ? fa_cuda_bwd_bk(hd) : fa_cuda_fwd_bk(hd);
}

/* Tiles are compiled in, so the defaults are the only sizes it runs (p: supports accepted it).
 * Block sizes set both passes' tiles (as on the CPU), so each is taken only where both passes
 * run it (block_q never: 128 forward, 64 backward; block_k 64 at head dims over 128), else
 * refused, naming both passes' tiles, rather than taken for the forward alone. */
static fa_status cuda_takes_blocks(const fa_problem *p, const fa_options *o) {
    int64_t fq, fk, bq, bk;
    default_blocks(p, FA_FORWARD, &fq, &fk);
    default_blocks(p, FA_BACKWARD, &bq, &bk);
    const int q_ok = !o->block_q || (o->block_q == fq && o->block_q == bq);
    const int k_ok = !o->block_k || (o->block_k == fk && o->block_k == bk);
    if (!q_ok || !k_ok)
        return fa_error(FA_ERR_UNSUPPORTED,
                        "the cuda backend runs compiled tiles for this head dim, %lldx%lld forward and %lldx%lld "
                        "backward; block sizes %lldx%lld (block_q, block_k; 0: the backend's) cannot set them",
                        (long long)fq, (long long)fk, (long long)bq, (long long)bk, (long long)o->block_q,
                        (long long)o->block_k);
    return FA_OK;
}

static fa_status cuda_choose_blocks(fa_plan *pl, const fa_options *o) {
    (void)o; /* cuda_takes_blocks accepted its block sizes: the defaults */
    pl->threads = 1;
    default_blocks(&pl->p, FA_FORWARD, &pl->fwd_bq, &pl->fwd_bk);
    default_blocks(&pl->p, FA_BACKWARD, &pl->bwd_bq, &pl->bwd_bk);
    return FA_OK;
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

/* id, name, present, supports, takes_blocks, choose_blocks, workspace_bytes, forward, backward */
const fa_backend_entry fa_backend_cuda_entry = {FA_BACKEND_CUDA,    "cuda",           cuda_present, cuda_supports,
                                                cuda_takes_blocks,  cuda_choose_blocks, fa_cuda_workspace_bytes,
                                                fa_cuda_forward,    fa_cuda_backward};
