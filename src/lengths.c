/* Lengths per call (docs/semantics.md, "Lengths per call"): a plan made from capacities
 * (fa_problem.lengths_per_call) runs each call with the lengths that call passes, through
 * a view of the plan that holds them (cost, workspace and drivers read the lengths from
 * the plan, so they all see the call's); a plan made with lengths runs only with its own.
 * The view is O(1) to make plus the cost model's O(batch) walk, so the exact cost of given
 * lengths is one cheap call away (fa_plan_cost_lengths). */
#include "backend.h"

#include <string.h>

/* The first entry where a call's lengths differ from the plan's, as an error. */
static fa_status same_lengths(const char *fn, const char *name, const int32_t *given, const int32_t *own, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (given[i] != own[i])
            return fa_error(FA_ERR_INVALID,
                            "%s: %s[%lld] = %d but the plan was made with %d; make the plan with lengths_per_call "
                            "to pass other lengths with each call",
                            fn, name, (long long)i, given[i], own[i]);
    return FA_OK;
}

static fa_status wrong_kind(const char *fn, const char *given, const char *kind) {
    return fa_error(FA_ERR_INVALID, "%s: %s given, but this plan is %s", fn, given, kind);
}

/* A call's bad lengths, judged by the plan's own checks (which name no function): their
 * message under the call's name, as the call's other errors are. */
fa_status fa_call_plan(const fa_plan *pl, const int32_t *cache, const int32_t *cu_q, const int32_t *cu_k,
                       const char *fn, fa_plan *view, const fa_plan **use) {
    const fa_problem *p = &pl->p;
    const int decode = pl->shape == FA_SHAPE_DECODE, varlen = pl->shape == FA_SHAPE_VARLEN;
    *use = pl;
    if (cache && !decode) return wrong_kind(fn, "cache_seqlens", varlen ? "a packed batch" : "dense");
    if ((cu_q || cu_k) && !varlen) return wrong_kind(fn, "cu_seqlens", decode ? "kv-cache decoding" : "dense");
    if (!p->lengths_per_call) {
        fa_status s = FA_OK;
        if (cache) s = same_lengths(fn, "cache_seqlens", cache, pl->lens, p->batch);
        if (!s && cu_q) s = same_lengths(fn, "cu_seqlens_q", cu_q, pl->lens, p->batch + 1);
        if (!s && cu_k) s = same_lengths(fn, "cu_seqlens_k", cu_k, pl->lens + p->batch + 1, p->batch + 1);
        return s;
    }
    fa_status s;
    *view = *pl;
    view->capacity = 0; /* the call's own lengths: exact figures */
    if (decode) {
        if (!cache)
            return fa_error(FA_ERR_NULL, "%s: cache_seqlens is NULL, but this plan takes its lengths with each call "
                                         "(lengths_per_call)", fn);
        if ((s = fa_check_cache_seqlens(p, cache))) return fa_error_in(s, fn);
        view->lens = (int32_t *)cache; /* read only: the view's drivers never write lengths */
        view->p.cache_seqlens = cache;
    } else {
        if (!cu_q || !cu_k)
            return fa_error(FA_ERR_NULL, "%s: %s is NULL, but this plan takes its lengths with each call "
                                         "(lengths_per_call)", fn, cu_q ? "cu_seqlens_k" : "cu_seqlens_q");
        if ((s = fa_check_cu_seqlens(p, cu_q, cu_k, 0))) return fa_error_in(s, fn);
        view->lens = NULL;
        view->p.cu_seqlens_q = cu_q;
        view->p.cu_seqlens_k = cu_k;
    }
    if ((s = fa_cost_compute(view))) return s;
    *use = view;
    return FA_OK;
}

fa_status fa_plan_cost_lengths(const fa_plan *plan, fa_pass pass, const int32_t *cache_seqlens,
                               const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, fa_cost *out) {
    fa_clear_error();
    if (!plan || !out) return fa_error(FA_ERR_NULL, "fa_plan_cost_lengths: %s is NULL", plan ? "out" : "plan");
    if (pass != FA_FORWARD && pass != FA_BACKWARD)
        return fa_error(FA_ERR_INVALID, "fa_plan_cost_lengths: pass %d is not FA_FORWARD or FA_BACKWARD", (int)pass);
    fa_plan view;
    const fa_plan *use;
    fa_status s = fa_call_plan(plan, cache_seqlens, cu_seqlens_q, cu_seqlens_k, "fa_plan_cost_lengths", &view, &use);
    return s ? s : fa_plan_cost(use, pass, out);
}
