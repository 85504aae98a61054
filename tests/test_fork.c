/* A process forked after the parent ran multi-threaded calls completes its own calls
 * (src/fork.c): the child runs the parent's plan and a new 2-thread plan, forward and
 * backward, and must reproduce the parent's outputs bit for bit, and measures the exp rate
 * on 2 threads. Before that, a parent whose only multi-threaded call was fa_cpu_exp_rate
 * (no plan made yet: the fork handler was once registered with the first plan) forks a
 * child that makes and runs a 2-thread plan. A child that hangs (GCC's OpenMP runtime
 * after fork) is killed by its alarm and the test fails. Random inputs, seeded
 * (FA_TEST_SEED replays). */
#include "check.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

enum { B = 2, H = 4, S = 300, D = 64 };
#define N ((int64_t)B * H * S * D)

static float q[N], k[N], v[N], o[N], o2[N], d_o[N], dq[N], dk[N], dv[N], dq2[N], dk2[N], dv2[N], lse[B * H * S];

static fa_plan *make_plan(void) {
    fa_problem p;
    fa_problem_init(&p);
    p.batch = B, p.heads_q = H, p.seq_q = S, p.seq_k = S, p.head_dim = D, p.causal = 1;
    fa_options opt = {.threads = 2};
    fa_plan *pl = NULL;
    CHECK(fa_plan_create(&p, &opt, &pl) == FA_OK, "plan: %s", fa_last_error());
    return pl;
}

/* Forward then backward on plan pl into out_o and the three gradients. */
static int run(const fa_plan *pl, float *out_o, float *gq, float *gk, float *gv) {
    fa_forward_args f = {.q = q, .k = k, .v = v, .o = out_o, .lse = lse};
    if (fa_forward(pl, &f) != FA_OK) return 0;
    fa_backward_args b = {.q = q, .k = k, .v = v, .o = out_o, .d_o = d_o, .lse = lse, .dq = gq, .dk = gk, .dv = gv};
    return fa_backward(pl, &b) == FA_OK;
}

static int same(const float *a, const float *b) { return memcmp(a, b, sizeof(float) * (size_t)N) == 0; }

/* The child's end: not killed (a hang meets its alarm), exit status 0. */
static void wait_child(pid_t child, const char *what) {
    CHECK(child > 0, "%s: fork failed", what);
    if (child <= 0) return;
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child, "%s: waitpid failed", what);
    CHECK(!WIFSIGNALED(status), "%s: the forked child was killed by signal %d (%s): it hung in a call", what,
          WTERMSIG(status), WTERMSIG(status) == SIGALRM ? "its 60 s alarm" : "another signal");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the forked child's outputs differ (or a call failed)",
          what);
}

int main(void) {
    seed = check_seed("test_fork");
    uint64_t s = seed;
    tu_fill(&s, FA_F32, q, N, 1.0);
    tu_fill(&s, FA_F32, k, N, 1.0);
    tu_fill(&s, FA_F32, v, N, 1.0);
    tu_fill(&s, FA_F32, d_o, N, 1.0);
    CHECK(fa_cpu_exp_rate(2) > 0, "parent: the exp rate on 2 threads"); /* libgomp's pool, no plan yet */
    CHECK(fa_cpu_exp_rate(FA_MAX_THREADS + 1) == 0 && fa_cpu_exp_rate(0) == 0, /* a team of INT_MAX killed the process */
          "the exp rate of a thread count plans refuse is not 0");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(60); /* a hang ends the child with SIGALRM */
        fa_plan *fresh = make_plan();
        const int ok = fresh && run(fresh, o2, dq2, dk2, dv2);
        fa_plan_destroy(fresh);
        _exit(ok ? 0 : 1);
    }
    wait_child(child, "after the exp rate alone");
    fa_plan *pl = make_plan();
    if (!pl) return check_finish("test_fork");
    CHECK(run(pl, o, dq, dk, dv), "parent: %s", fa_last_error());
    fa_cost before; /* a plan's figures do not depend on the process (the backward's workspace once did) */
    CHECK(fa_plan_cost(pl, FA_BACKWARD, &before) == FA_OK, "parent: cost: %s", fa_last_error());
    fflush(stdout);
    child = fork();
    if (child == 0) {
        alarm(60);
        fa_cost after;
        int ok = fa_plan_cost(pl, FA_BACKWARD, &after) == FA_OK && after.workspace_bytes == before.workspace_bytes &&
                 after.peak_bytes == before.peak_bytes;
        ok = ok && run(pl, o2, dq2, dk2, dv2) && same(o, o2) && same(dq, dq2) && same(dk, dk2) && same(dv, dv2);
        fa_plan *fresh = make_plan();
        ok = ok && fresh && run(fresh, o2, dq2, dk2, dv2) && same(o, o2) && same(dq, dq2);
        fa_plan_destroy(fresh);
        ok = ok && fa_cpu_exp_rate(2) > 0;
        _exit(ok ? 0 : 1);
    }
    wait_child(child, "after a plan's calls");
    fa_plan_destroy(pl);
    if (!failures)
        printf("PASS forked children ran the parent's and new 2-thread plans (same bits) and the exp rate, after a "
               "plan's calls and after the exp rate alone\n");
    return check_finish("test_fork");
}
