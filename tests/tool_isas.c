/* Prints the CPU instruction sets this build has and this machine runs, best first, so
 * the test runner can run the suite once per ISA. */
#include "flashattn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    const char *names[] = {"amx", "avx512bf16", "avx512", "avx2", "scalar"};
    int first = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        setenv("FA_ISA", names[i], 1);
        if (strcmp(fa_cpu_isa(), names[i]) == 0) {
            printf("%s%s", first ? "" : " ", names[i]);
            first = 0;
        }
    }
    printf("\n");
    return 0;
}
