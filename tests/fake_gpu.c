/* A GPU machine as the library's AUTO choice sees one, for machines without a GPU: loaded
 * with LD_PRELOAD before the CLI (which links the shared library, so these definitions take
 * the place of its own), /dev/nvidiactl exists and fa_cuda_available says 1. Nothing runs on
 * it: tests/test_cli_supports.sh only plans, to check which backend AUTO takes. Built where
 * the CUDA backend is (CMakeLists.txt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

int access(const char *path, int mode) {
    if (!strcmp(path, "/dev/nvidiactl")) return 0;
    int (*real)(const char *, int) = (int (*)(const char *, int))dlsym(RTLD_NEXT, "access");
    return real ? real(path, mode) : -1;
}

int fa_cuda_available(void) { return 1; }
