/* Tests an internal on purpose: the allocation counter of the allocation-failure hook
 * (src/alloc.h). A caller's workspace of exactly the plan's workspace_bytes is all a call
 * needs (docs/semantics.md, "workspace_bytes"): with it, the call allocates nothing.
 * Three calls once allocated beside it: a decode with a shared prefix (each sequence's
 * mask view), a packed backward with sinks (one sequence's dsink) and a paged decode with
 * appends (the check of the written rows). Each must also succeed with the library
 * allocating the workspace itself. Random inputs, seeded (FA_TEST_SEED). */
#include "alloc.h"
#include "check.h"

enum { B = 3, H = 2, D = 16, PAGE = 16, PAGES = 2, PREFIX = 16, QROWS = 32 /* query rows of q and o at most */ };

/* Runs the pass with a caller's workspace of workspace_bytes and counts the allocations. */
static void no_allocation(const char *what, const fa_problem *p, fa_pass pass, void *args) {
    fa_options opt = {FA_BACKEND_CPU, 2, 0, 0};
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(p, &opt, &pl) == FA_OK, "%s: plan: %s", what, fa_last_error());
    if (!pl) return;
    fa_cost c;
    CHECK(fa_plan_cost(pl, pass, &c) == FA_OK, "%s: cost: %s", what, fa_last_error());
    void *ws = tu_alloc((size_t)c.workspace_bytes + 1);
    fa_status st;
    fa_alloc_fail_at(0); /* counts from here */
    if (pass == FA_FORWARD) {
        fa_forward_args *a = args;
        a->workspace = ws, a->workspace_size = (size_t)c.workspace_bytes;
        st = fa_forward(pl, a);
        a->workspace = NULL, a->workspace_size = 0;
    } else {
        fa_backward_args *a = args;
        a->workspace = ws, a->workspace_size = (size_t)c.workspace_bytes;
        st = fa_backward(pl, a);
        a->workspace = NULL, a->workspace_size = 0;
    }
    const int64_t n = fa_alloc_count();
    CHECK(st == FA_OK && n == 0, "%s: with a workspace of workspace_bytes (%lld): %s, %lld allocations", what,
          (long long)c.workspace_bytes, fa_status_string(st), (long long)n);
    st = pass == FA_FORWARD ? fa_forward(pl, args) : fa_backward(pl, args); /* the library's own workspace */
    CHECK(st == FA_OK, "%s: without a workspace: %s", what, fa_last_error());
    free(ws);
    fa_plan_destroy(pl);
}

int main(void) {
    seed = check_seed("test_alloc_workspace");
    uint64_t s = seed;
    const int64_t cap = PAGE * PAGES, n = B * cap * H * D;
    float *q = tu_alloc(4 * (size_t)(QROWS * H * D)), *o = tu_alloc(4 * (size_t)(QROWS * H * D));
    float *kc = tu_alloc(4 * (size_t)n), *vc = tu_alloc(4 * (size_t)n), *kn = tu_alloc(4 * (size_t)(B * H * D));
    float *vn = tu_alloc(4 * (size_t)(B * H * D)), *kp = tu_alloc(4 * (size_t)(PREFIX * H * D));
    float *vp = tu_alloc(4 * (size_t)(PREFIX * H * D));
    tu_fill(&s, FA_F32, q, QROWS * H * D, 1.0), tu_fill(&s, FA_F32, kc, n, 1.0), tu_fill(&s, FA_F32, vc, n, 1.0);
    tu_fill(&s, FA_F32, kn, B * H * D, 1.0), tu_fill(&s, FA_F32, vn, B * H * D, 1.0);
    tu_fill(&s, FA_F32, kp, PREFIX * H * D, 1.0), tu_fill(&s, FA_F32, vp, PREFIX * H * D, 1.0);
    int32_t lens[B] = {5, 0, 17}, table[B * PAGES] = {4, 0, 2, 5, 1, 3};
    /* a dense cache, a shared prefix */
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = p.heads_kv = H, p.head_dim = D, p.seq_q = 1, p.seq_k = cap, p.cache_seqlens = lens;
    p.shared_prefix_len = PREFIX;
    fa_forward_args f = {.q = q, .k = kc, .v = vc, .o = o, .k_prefix = kp, .v_prefix = vp};
    no_allocation("decode with a shared prefix", &p, FA_FORWARD, &f);
    /* paged caches with appends */
    fa_problem_init(&p);
    p.batch = B, p.heads_q = p.heads_kv = H, p.head_dim = D, p.seq_q = 1, p.seq_k = cap, p.cache_seqlens = lens;
    p.page_size = PAGE, p.num_pages = B * PAGES, p.max_pages = PAGES, p.has_new_kv = 1;
    fa_forward_args g = {.q = q, .k = kc, .v = vc, .o = o, .k_new = kn, .v_new = vn, .block_table = table};
    no_allocation("paged decode with appends", &p, FA_FORWARD, &g);
    /* a packed backward with sinks: sequences of 7 and 9 rows against 10 and 22 keys */
    static const int32_t cq[B] = {0, 7, 16}, ck[B] = {0, 10, 32};
    float sinks[H] = {0.5f, -1.0f}, dsink[H], *lse = tu_alloc(4 * (size_t)(16 * H));
    float *dq = tu_alloc(4 * (size_t)n), *dk = tu_alloc(4 * (size_t)n), *dv = tu_alloc(4 * (size_t)n);
    fa_problem_init(&p);
    p.batch = 2, p.heads_q = p.heads_kv = H, p.head_dim = D, p.seq_q = 16, p.seq_k = 32, p.causal = 1;
    p.cu_seqlens_q = cq, p.cu_seqlens_k = ck, p.has_sinks = 1;
    fa_forward_args vf = {.q = q, .k = kc, .v = vc, .o = o, .lse = lse, .sinks = sinks};
    fa_options opt = {FA_BACKEND_CPU, 2, 0, 0};
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(&p, &opt, &pl) == FA_OK && fa_forward(pl, &vf) == FA_OK, "packed forward: %s",
          fa_last_error());
    fa_plan_destroy(pl);
    float *dob = tu_alloc(4 * (size_t)(QROWS * H * D));
    tu_fill(&s, FA_F32, dob, QROWS * H * D, 1.0);
    fa_backward_args vb = {.q = q, .k = kc, .v = vc, .o = o, .d_o = dob, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                           .sinks = sinks, .dsink = dsink};
    no_allocation("packed backward with sinks", &p, FA_BACKWARD, &vb);
    free(q), free(o), free(kc), free(vc), free(kn), free(vn), free(kp), free(vp), free(lse), free(dq), free(dk), free(dv);
    free(dob);
    if (!failures) printf("PASS a caller's workspace of workspace_bytes: no allocation (prefix, paged appends, packed dsink)\n");
    return check_finish("test_alloc_workspace");
}
