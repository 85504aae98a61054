/* Where the kernels read and write: host memory for the CPU backend, device memory for
 * CUDA (run, grad and bench copy their tensors over and back with flashattn.h's fa_cuda_*). */
#include "cli.h"

#include <string.h>

int cli_mem_init(cli_mem *m, const fa_plan *plan) {
    memset(m, 0, sizeof *m);
    m->device = fa_plan_backend(plan) == FA_BACKEND_CUDA;
    if (m->device && !fa_cuda_available())
        return cli_fail(1, "--backend cuda: no CUDA device is available to this build");
    return 0;
}

int cli_mem_put(cli_mem *m, const void *host, size_t bytes, int copy, void **where) {
    if (!m->device) {
        *where = (void *)host;
        return 0;
    }
    *where = NULL;
    fa_status st = fa_cuda_malloc(where, bytes ? bytes : 1);
    if (st != FA_OK) {
        *where = NULL;
        return cli_fail_status(st == FA_ERR_NO_MEMORY ? st : FA_ERR_BACKEND, "device memory");
    }
    if (copy && bytes && (st = fa_cuda_memcpy_to_device(*where, host, bytes)) != FA_OK) {
        fa_cuda_free(*where);
        *where = NULL;
        return cli_fail_status(FA_ERR_BACKEND, "copy to the device");
    }
    return 0;
}

int cli_mem_get(cli_mem *m, void *host, const void *where, size_t bytes) {
    if (!m->device || host == where || !bytes) return 0;
    if (fa_cuda_memcpy_to_host(host, where, bytes) != FA_OK)
        return cli_fail_status(FA_ERR_BACKEND, "copy from the device");
    return 0;
}

int cli_mem_sync(cli_mem *m) {
    if (!m->device) return 0;
    if (fa_cuda_synchronize() != FA_OK) return cli_fail_status(FA_ERR_BACKEND, "device");
    return 0;
}

void cli_mem_free(cli_mem *m, const void *host, void *where) {
    if (!m->device || !where || where == host) return;
    fa_cuda_free(where);
}
