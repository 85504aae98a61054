/* What combines with what: every pair of features is planned (and, for the backward pass,
 * run up to its argument check), and the answer must be the backend table's (backend.h):
 * a combination no backend runs is FA_ERR_INVALID, a limit of the CUDA backend
 * FA_ERR_UNSUPPORTED (docs/semantics.md), each with a message naming both features; every
 * other pair plans. Deterministic: no random data. */
#include "check.h"

enum {
    BIAS, SEGMENTS, ALIBI, SOFTCAP, CAUSAL, WINDOW, DIAG, VARLEN, DECODE, NEW_KV, PAGED, BIAS_GRAD, SINKS, BACKWARD,
    CUDA, NF
};

static const struct {
    const char *name;
    const char *word, *alt; /* the message must name one of them (alt: a feature it implies) */
} feature[NF] = {
    [BIAS] = {"bias", "bias", NULL},
    [SEGMENTS] = {"segment ids", "segment", NULL},
    [ALIBI] = {"alibi", "alibi", NULL},
    [SOFTCAP] = {"softcap", "softcap", NULL},
    [CAUSAL] = {"causal", "causal", NULL},
    [WINDOW] = {"window", "window", NULL},
    [DIAG] = {"diag offset", "diag", NULL},
    [VARLEN] = {"varlen", "cu_seqlens", NULL},
    [DECODE] = {"decode", "cache_seqlens", NULL},
    [NEW_KV] = {"new kv", "has_new_kv", "cache_seqlens"},
    [PAGED] = {"paged", "page", "cache_seqlens"},
    [BIAS_GRAD] = {"bias_grad", "bias", NULL},
    [SINKS] = {"sinks", "sinks", NULL},
    [BACKWARD] = {"backward pass", "backward", NULL},
    [CUDA] = {"cuda backend", "cuda", NULL},
};

static int32_t cu_q[3] = {0, 3, 8}, cu_k[3] = {0, 20, 32}, cache[2] = {5, 9};

/* The base problem (bf16, head dim 64: what every backend runs) with features a and b,
 * and what a feature needs (new kv and pages a cache, dbias a bias) unless the pair is the
 * packed shape, which must be refused for the feature itself. */
static void build(int a, int b, fa_problem *p, fa_options *o) {
    fa_problem_init(p);
    memset(o, 0, sizeof *o);
    p->batch = 2, p->heads_q = 4, p->heads_kv = 2, p->seq_q = 8, p->seq_k = 32, p->head_dim = 64;
    p->dtype = FA_BF16;
    const int packed = a == VARLEN || b == VARLEN;
    for (int i = 0; i < 2; i++) {
        switch (i ? b : a) {
        case BIAS: p->has_bias = 1; break;
        case SEGMENTS: p->has_segment_ids = 1; break;
        case ALIBI: p->has_alibi = 1; break;
        case SOFTCAP: p->softcap = 5; break;
        case CAUSAL: p->causal = 1; break;
        case WINDOW: p->window_left = 4, p->window_right = 2; break;
        case DIAG: p->has_diag_offset = 1, p->diag_offset = 3, p->causal = 1; break; /* (something to place) */
        case VARLEN: p->cu_seqlens_q = cu_q, p->cu_seqlens_k = cu_k; break;
        case DECODE: p->cache_seqlens = cache; break;
        case NEW_KV:
            p->has_new_kv = 1;
            if (!packed) p->cache_seqlens = cache;
            break;
        case PAGED:
            p->page_size = 16, p->num_pages = 4, p->max_pages = 2;
            if (!packed) p->cache_seqlens = cache;
            break;
        case BIAS_GRAD: p->has_bias = 1, p->bias_grad = 1; break;
        case SINKS: p->has_sinks = 1; break;
        case CUDA: o->backend = FA_BACKEND_CUDA; break;
        default: break; /* BACKWARD: the pass, not the problem */
        }
    }
}

/* The expected answer for features a and b, in that order (expected() tries both). */
static fa_status expected_ordered(int a, int b) {
    const int shaped[NF] = {[VARLEN] = 1, [DECODE] = 1, [NEW_KV] = 1, [PAGED] = 1};
    const int cache_like[NF] = {[DECODE] = 1, [NEW_KV] = 1, [PAGED] = 1};
    if (b == CUDA) {
        if (a == BIAS_GRAD || a == SINKS || shaped[a]) return FA_ERR_UNSUPPORTED;
        return FA_OK;
    }
    if ((a == BIAS || a == SEGMENTS || a == BIAS_GRAD) && shaped[b]) return FA_ERR_INVALID;
    if (a == VARLEN && cache_like[b]) return FA_ERR_INVALID;
    if (cache_like[a] && b == BACKWARD) return FA_ERR_INVALID;
    return FA_OK;
}

static fa_status expected(int a, int b) {
    const fa_status s = expected_ordered(a, b);
    return s ? s : expected_ordered(b, a);
}

static int names(const char *msg, int f) {
    return strstr(msg, feature[f].word) || (feature[f].alt && strstr(msg, feature[f].alt));
}

int main(void) {
    int failures = 0, refused = 0, planned = 0;
    for (int a = 0; a < NF; a++)
        for (int b = a + 1; b < NF; b++) {
            fa_problem p;
            fa_options o;
            build(a, b, &p, &o);
            fa_plan *pl = NULL;
            fa_status st = fa_plan_create(&p, &o, &pl);
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fa_last_error());
            if (!st && (a == BACKWARD || b == BACKWARD)) { /* the pass's own refusal comes before its arguments */
                fa_backward_args none;
                memset(&none, 0, sizeof none);
                st = fa_backward(pl, &none);
                snprintf(msg, sizeof msg, "%s", fa_last_error());
                if (st == FA_ERR_NULL) st = FA_OK; /* accepted: it went on to check the pointers */
                /* accepted too: a cuda plan's run where no device is (the last thing its supports says) */
                if (st == FA_ERR_BACKEND && !fa_cuda_available() && strstr(msg, "no CUDA device")) st = FA_OK;
            }
            fa_plan_destroy(pl);
            const fa_status want = expected(a, b);
            CHECK(st == want, "%s + %s: got %s (%s), want %s", feature[a].name, feature[b].name,
                     fa_status_string(st), msg, fa_status_string(want));
            if (want != FA_OK) {
                refused++;
                CHECK(names(msg, a) && names(msg, b), "%s + %s: the message does not name both: %s",
                         feature[a].name, feature[b].name, msg);
            } else {
                planned++;
            }
        }
    /* decoding's parts without decoding: the same refusal on every backend (fa_supports_common) */
    for (int be = 0; be < 2; be++)
        for (int part = 0; part < 3; part++) {
            fa_problem p;
            fa_options o;
            build(CAUSAL, CAUSAL, &p, &o);
            o.backend = be ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
            if (part == 0) p.has_new_kv = 1;
            else if (part == 1) p.page_size = 16, p.num_pages = 4, p.max_pages = 2;
            else p.shared_prefix_len = 4;
            fa_plan *pl = NULL;
            const fa_status st = fa_plan_create(&p, &o, &pl);
            const char *word = part == 0 ? "has_new_kv" : part == 1 ? "page_size" : "shared_prefix_len";
            CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), word) && strstr(fa_last_error(), "cache_seqlens"),
                  "%s without cache_seqlens on %s: got %s (%s), want FA_ERR_INVALID naming both", word,
                  be ? "cuda" : "cpu", fa_status_string(st), fa_last_error());
            fa_plan_destroy(pl);
            refused++;
        }
    /* a plan from capacities (lengths_per_call, no length arrays): its refusals name
     * lengths_per_call, not the arrays it leaves NULL */
    for (int lpc = FA_LENGTHS_CACHE; lpc <= FA_LENGTHS_PACKED; lpc++)
        for (int part = 0; part < 3; part++) {
            fa_problem p;
            fa_options o;
            build(CAUSAL, CAUSAL, &p, &o);
            p.lengths_per_call = lpc;
            if (part == 0) p.has_bias = 1;
            else if (part == 1) p.has_segment_ids = 1;
            fa_plan *pl = NULL;
            fa_status st = fa_plan_create(&p, &o, &pl);
            if (part == 2 && st == FA_OK) { /* the backward pass */
                fa_backward_args none;
                memset(&none, 0, sizeof none);
                st = fa_backward(pl, &none);
            }
            CHECK(st == FA_ERR_INVALID && strstr(fa_last_error(), "lengths_per_call") &&
                      (part == 2 || (!strstr(fa_last_error(), "cache_seqlens)") && !strstr(fa_last_error(), "cu_seqlens)"))),
                  "lengths_per_call %d with %s: got %s (%s), want a message naming lengths_per_call", lpc,
                  part == 0 ? "a bias" : part == 1 ? "segment ids" : "the backward", fa_status_string(st),
                  fa_last_error());
            fa_plan_destroy(pl);
            refused++;
        }
    printf("test_supports: %d pairs refused naming both features, %d pairs planned%s\n", refused, planned,
           failures ? "" : ": ok");
    if (failures) printf("test_supports: %d FAILED\n", failures);
    return failures ? 1 : 0;
}
