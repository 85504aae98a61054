// flashattn.h from C++ (tests/test_install.sh): one causal forward on 7 rows, checked against
// attention computed here in double precision. Exit 0 on success.
#include <flashattn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    const int S = 7, D = 8;
    std::vector<float> q(S * D), k(S * D), v(S * D), o(S * D, NAN);
    unsigned x = 2024u;
    for (int i = 0; i < S * D; i++) {
        x = x * 1103515245u + 12345u, q[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
        x = x * 1103515245u + 12345u, k[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
        x = x * 1103515245u + 12345u, v[i] = (float)((x >> 8) % 2000) / 1000.0f - 1.0f;
    }
    fa_problem p;
    fa_problem_init(&p);
    p.batch = 1, p.heads_q = 1, p.seq_q = p.seq_k = S, p.head_dim = D, p.causal = 1;
    fa_options opt = {};
    opt.backend = FA_BACKEND_CPU;
    fa_plan *plan = nullptr;
    if (fa_plan_create(&p, &opt, &plan) != FA_OK) return std::fprintf(stderr, "plan: %s\n", fa_last_error()), 1;
    fa_forward_args a = {};
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data();
    if (fa_forward(plan, &a) != FA_OK) return std::fprintf(stderr, "forward: %s\n", fa_last_error()), 1;
    fa_plan_destroy(plan);
    double worst = 0;
    for (int i = 0; i < S; i++) {
        std::vector<double> s(i + 1);
        double m = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
            for (int d = 0; d < D; d++) s[j] += (double)q[i * D + d] * k[j * D + d];
            s[j] /= std::sqrt((double)D);
            m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j <= i; j++) sum += std::exp(s[j] - m);
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int j = 0; j <= i; j++) acc += std::exp(s[j] - m) / sum * v[j * D + d];
            const double err = std::fabs(acc - o[i * D + d]);
            worst = err > worst || err != err ? err : worst;
        }
    }
    if (!(worst < 1e-5)) return std::fprintf(stderr, "consumer_cxx: max error %g\n", worst), 1;
    std::printf("consumer_cxx: ok (max error %.2g)\n", worst);
    return 0;
}
