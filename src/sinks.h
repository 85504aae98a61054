/* Attention sinks (docs/semantics.md, "Attention sinks"): a per-head logit that joins each
 * row's softmax denominator once, at the end, after every key (and every split-KV chunk or
 * rank) has been folded in, and adds nothing to o. */
#ifndef FA_SINKS_H
#define FA_SINKS_H

#include <math.h>

/* Folds the sink into a row's final softmax state: m, the max of its scores (-inf if it saw
 * none), and l, the sum of exp(s - m); the row's accumulator sum p v is relative to m too.
 * Afterwards m = max(m, sink) and l includes exp(sink - m); returns the factor that brings
 * the accumulator to the new m (1 unless the sink is the new max). One exp either way (the
 * kernels count it). A row without keys (m = -inf, l = 0) leaves with m = sink, l = 1, so
 * o = 0 and lse = sink; a NaN l stays NaN. */
static inline float fa_sink_fold(float sink, float *m, float *l) {
    if (sink > *m) {
        const float alpha = expf(*m - sink);
        *l = *l * alpha + 1.0f;
        *m = sink;
        return alpha;
    }
    *l += expf(sink - *m);
    return 1.0f;
}

#endif
