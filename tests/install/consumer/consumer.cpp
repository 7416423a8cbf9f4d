// Calls kfa::forward on its own Views and checks one row against a hand-computed softmax.
#include <kfa/kfa.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  const int N = 5, D = 8;
  Kokkos::View<double****, Kokkos::HostSpace> q("q", 1, 1, N, D), k("k", 1, 1, N, D),
      v("v", 1, 1, N, D), o("o", 1, 1, N, D);
  Kokkos::View<double***, Kokkos::HostSpace> lse("lse", 1, 1, N);
  for (int i = 0; i < N; ++i)
    for (int d = 0; d < D; ++d) {
      q(0, 0, i, d) = std::sin(1.0 + i + 3 * d);
      k(0, 0, i, d) = std::cos(2.0 * i - d);
      v(0, 0, i, d) = 0.1 * i - 0.05 * d;
    }
  kfa::Params p;
  p.causal = true;
  kfa::forward(Kokkos::DefaultHostExecutionSpace(), q, k, v, o, lse, p);
  Kokkos::fence();
  // Last row sees every key (bottom-right causal, N = N).
  double w[N], sum = 0;
  for (int j = 0; j < N; ++j) {
    double s = 0;
    for (int d = 0; d < D; ++d)
      s += q(0, 0, N - 1, d) * k(0, 0, j, d);
    w[j] = std::exp(s / std::sqrt(double(D)));
    sum += w[j];
  }
  double err = std::fabs(lse(0, 0, N - 1) - std::log(sum));
  for (int d = 0; d < D; ++d) {
    double ref = 0;
    for (int j = 0; j < N; ++j)
      ref += w[j] / sum * v(0, 0, j, d);
    err = std::fmax(err, std::fabs(o(0, 0, N - 1, d) - ref));
  }
  std::printf("consumer: max error %.3g\n", err);
  return err < 1e-12 ? 0 : 1;
}
