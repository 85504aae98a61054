/* The CUDA backend's entry points: check what the plan and the arguments ask for, lay out
 * the workspace (counters, then Delta rows), fill the kernels' parameters and launch them
 * on the caller's stream. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../internal.h"
#include "cuda_config.h"
#include "cuda_mem.h"
}
#include "cuda_kernels.h"

static fa_status cuda_fail(cudaError_t e, const char *what) {
    return fa_error(FA_ERR_BACKEND, "CUDA error in %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Can rows of this tensor move as 16-byte chunks? (unit column stride, aligned rows) */
static int rows_vectorizable(const void *ptr, const fa_strides *st) {
    return st->s[3] == 1 && st->s[0] % 8 == 0 && st->s[1] % 8 == 0 && st->s[2] % 8 == 0 &&
           ((uintptr_t)ptr & 15u) == 0;
}

static void copy_strides(int64_t dst[4], const fa_strides *st) {
    for (int i = 0; i < 4; i++) dst[i] = st->s[i];
}

/* The head-dim class the launchers dispatch on. What the kernels run (dtype, head dims,
 * grid limits) is the backend entry's supports (cuda_plan.c), checked at plan time; the
 * plan's tiles are the compiled ones (its choose_blocks), so only that invariant is
 * asserted here. */
static fa_status check_plan(const fa_plan *pl, fa_pass pass, int *hd) {
    const fa_problem *p = &pl->p;
    *hd = fa_cuda_hd_class(p->head_dim, p->head_dim_v);
    const int64_t bq = pass == FA_FORWARD ? FA_CUDA_FWD_BQ : FA_CUDA_BWD_BQ;
    const int64_t bk = pass == FA_FORWARD ? fa_cuda_fwd_bk(*hd) : fa_cuda_bwd_bk(*hd);
    const int64_t pbq = pass == FA_FORWARD ? pl->fwd_bq : pl->bwd_bq;
    const int64_t pbk = pass == FA_FORWARD ? pl->fwd_bk : pl->bwd_bk;
    if (pl->backend != FA_BACKEND_CUDA || !*hd || pbq != bq || pbk != bk)
        return fa_error(FA_ERR_INTERNAL, "the cuda %s was given a plan it did not make (tiles %lldx%lld)",
                        pass == FA_FORWARD ? "forward" : "backward", (long long)pbq, (long long)pbk);
    return FA_OK;
}

static void fill_params(const fa_plan *pl, fa_cuda_params *k) {
    const fa_problem *p = &pl->p;
    memset(k, 0, sizeof *k);
    copy_strides(k->qs, &p->q_stride);
    copy_strides(k->ks, &p->k_stride);
    copy_strides(k->vs, &p->v_stride);
    copy_strides(k->os, &p->o_stride);
    copy_strides(k->bs, &p->bias_stride);
    if (p->bias_batch == 1) k->bs[0] = 0;
    if (p->bias_heads == 1) k->bs[1] = 0;
    if (p->bias_seq_q == 1) k->bs[2] = 0; /* one row for every query row: a stride-0 view, as before bias_seq_q */
    k->B = (int)p->batch;
    k->Hq = (int)p->heads_q;
    k->Hk = (int)p->heads_kv;
    k->G = (int)(p->heads_q / p->heads_kv);
    k->Sq = (int)p->seq_q;
    k->Sk = (int)p->seq_k;
    k->D = (int)p->head_dim;
    k->Dv = (int)p->head_dim_v;
    k->off = pl->off;
    k->wl = p->window_left; /* any int64 window: schedule.h does not overflow */
    k->wr = p->window_right;
    k->causal = p->causal;
    k->scale = pl->scale;
    k->scale_log2 = pl->scale * FA_LOG2E;
    k->softcap = p->softcap;
    k->inv_softcap = p->softcap > 0 ? 1.0f / p->softcap : 0.0f;
    k->has_bias = p->has_bias;
    k->bias_scale = p->has_bias_scale ? p->bias_scale : 1.0f;
    k->has_alibi = p->has_alibi;
    k->has_seg = p->has_segment_ids;
    k->has_mods = p->softcap > 0 || p->has_bias || p->has_alibi;
}

/* The caller's workspace, or one of workspace_bytes from the stream-ordered allocator. */
static fa_status get_workspace(const fa_plan *pl, fa_pass pass, void *given, size_t given_size, cudaStream_t st,
                               char **ws, int *owned) {
    const int64_t need = fa_cuda_workspace_bytes(pl, pass);
    *owned = 0;
    if (given) {
        (void)given_size; /* checked against need at the entry (args.c) */
        if ((uintptr_t)given & 15u) return fa_error(FA_ERR_INVALID, "the workspace must be 16-byte aligned");
        *ws = (char *)given;
        return FA_OK;
    }
    void *mem = NULL;
    cudaError_t e = cudaMallocAsync(&mem, (size_t)need, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorMemoryAllocation)
            return fa_error(FA_ERR_NO_MEMORY, "cannot allocate %lld bytes of CUDA workspace", (long long)need);
        return cuda_fail(e, "cudaMallocAsync (workspace)");
    }
    *ws = (char *)mem;
    *owned = 1;
    return FA_OK;
}

/* Runs launch() between the counters' reset and their copy back; frees what it took. */
static fa_status run_pass(const fa_plan *pl, fa_pass pass, fa_cuda_params *k, int hd, void *workspace,
                          size_t workspace_size, void *stream, fa_counts *counts) {
    cudaStream_t st = (cudaStream_t)stream;
    char *ws = NULL;
    int owned = 0;
    fa_status s = get_workspace(pl, pass, workspace, workspace_size, st, &ws, &owned);
    if (s) return s;
    cudaError_t e = cudaSuccess;
    const char *what = "";
    k->counts = counts ? (unsigned long long *)ws : NULL;
    if (pass == FA_BACKWARD) k->delta = (float *)(ws + FA_CUDA_COUNTER_BYTES);
    if (counts && (e = cudaMemsetAsync(ws, 0, 2 * sizeof(unsigned long long), st)) != cudaSuccess)
        what = "cudaMemsetAsync (counters)";
    const int bf16 = pl->p.dtype == FA_BF16;
    if (e == cudaSuccess) {
        if (pass == FA_FORWARD)
            e = bf16 ? fa_cuda_launch_forward_bf16(k, hd, st) : fa_cuda_launch_forward_f16(k, hd, st);
        else
            e = bf16 ? fa_cuda_launch_backward_bf16(k, hd, st) : fa_cuda_launch_backward_f16(k, hd, st);
        what = pass == FA_FORWARD ? "the forward kernel launch" : "the backward kernel launches";
    }
    unsigned long long host[2] = {0, 0};
    if (e == cudaSuccess && counts) {
        if ((e = cudaMemcpyAsync(host, ws, sizeof host, cudaMemcpyDeviceToHost, st)) != cudaSuccess)
            what = "cudaMemcpyAsync (counters)";
        else if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
            what = pass == FA_FORWARD ? "the forward kernel" : "the backward kernels";
    }
    if (owned) {
        cudaError_t f = cudaFreeAsync(ws, st);
        if (e == cudaSuccess && f != cudaSuccess) {
            e = f;
            what = "cudaFreeAsync (workspace)";
        }
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(e, what);
    }
    if (counts) {
        counts->flops = (int64_t)host[0];
        counts->transcendentals = (int64_t)host[1];
    }
    return FA_OK;
}

static fa_status check_device_slopes(const fa_problem *p, const float *slopes, void *stream, const char *fn);

extern "C" fa_status fa_cuda_forward(const struct fa_plan *pl, const fa_forward_args *a) {
    int hd = 0;
    fa_status s = check_plan(pl, FA_FORWARD, &hd);
    if (s) return s;
    const fa_problem *p = &pl->p; /* pointers and workspace size checked at the entry (args.c) */
    if ((s = check_device_slopes(p, a->alibi_slopes, a->stream, "fa_forward"))) return s;
    fa_cuda_params k;
    fill_params(pl, &k);
    k.q = a->q;
    k.k = a->k;
    k.v = a->v;
    k.o = a->o;
    k.lse = a->lse;
    k.bias = a->bias;
    k.slopes = a->alibi_slopes;
    k.q_seg = a->q_segment_ids;
    k.kv_seg = a->kv_segment_ids;
    k.vec_q = rows_vectorizable(a->q, &p->q_stride);
    k.vec_k = rows_vectorizable(a->k, &p->k_stride);
    k.vec_v = rows_vectorizable(a->v, &p->v_stride);
    k.vec_o = rows_vectorizable(a->o, &p->o_stride);
    return run_pass(pl, FA_FORWARD, &k, hd, a->workspace, a->workspace_size, a->stream, a->counts);
}

extern "C" fa_status fa_cuda_backward(const struct fa_plan *pl, const fa_backward_args *a) {
    int hd = 0;
    fa_status s = check_plan(pl, FA_BACKWARD, &hd);
    if (s) return s;
    const fa_problem *p = &pl->p; /* pointers and workspace size checked at the entry (args.c) */
    if ((s = check_device_slopes(p, a->alibi_slopes, a->stream, "fa_backward"))) return s;
    fa_cuda_params k;
    fill_params(pl, &k);
    k.q = a->q;
    k.k = a->k;
    k.v = a->v;
    k.o_in = a->o;
    k.d_o = a->d_o;
    k.lse_in = a->lse;
    k.dq = a->dq;
    k.dk = a->dk;
    k.dv = a->dv;
    k.bias = a->bias;
    k.slopes = a->alibi_slopes;
    k.q_seg = a->q_segment_ids;
    k.kv_seg = a->kv_segment_ids;
    /* q's strides serve q and dq, k's k and dk, v's v and dv, o's o and dO: all must agree */
    k.vec_q = rows_vectorizable(a->q, &p->q_stride) && rows_vectorizable(a->dq, &p->q_stride);
    k.vec_k = rows_vectorizable(a->k, &p->k_stride) && rows_vectorizable(a->dk, &p->k_stride);
    k.vec_v = rows_vectorizable(a->v, &p->v_stride) && rows_vectorizable(a->dv, &p->v_stride);
    k.vec_o = rows_vectorizable(a->o, &p->o_stride) && rows_vectorizable(a->d_o, &p->o_stride);
    return run_pass(pl, FA_BACKWARD, &k, hd, a->workspace, a->workspace_size, a->stream, a->counts);
}

/* The slopes live on the device: copied back (Hq floats, on the caller's stream) so that
 * a non-finite one is refused like on the CPU (fa_check_slopes). */
static fa_status check_device_slopes(const fa_problem *p, const float *slopes, void *stream, const char *fn) {
    if (!p->has_alibi) return FA_OK;
    float *host = (float *)malloc(sizeof(float) * (size_t)p->heads_q);
    if (!host) return fa_error(FA_ERR_NO_MEMORY, "%s: cannot allocate %lld slopes", fn, (long long)p->heads_q);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = cudaMemcpyAsync(host, slopes, sizeof(float) * (size_t)p->heads_q, cudaMemcpyDefault, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    fa_status s = e == cudaSuccess ? fa_check_slopes(p, host, fn)
                                   : fa_error(FA_ERR_BACKEND, "%s: reading alibi_slopes: %s", fn, cudaGetErrorString(e));
    free(host);
    return s;
}

/* ---- availability ------------------------------------------------------------------ */

extern "C" FA_API int fa_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}
