/* Sizes of the public structs as compiled, for bindings that mirror them (python/). */
#include "internal.h"

size_t fa_struct_size(int which) {
    switch (which) {
    case FA_STRUCT_PROBLEM: return sizeof(fa_problem);
    case FA_STRUCT_OPTIONS: return sizeof(fa_options);
    case FA_STRUCT_COST: return sizeof(fa_cost);
    case FA_STRUCT_COUNTS: return sizeof(fa_counts);
    case FA_STRUCT_FORWARD_ARGS: return sizeof(fa_forward_args);
    case FA_STRUCT_BACKWARD_ARGS: return sizeof(fa_backward_args);
    }
    return 0;
}
