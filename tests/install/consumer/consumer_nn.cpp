// Links the installed kfa::nn and runs its FFN with identity weights: y = max(0, x).
#include <kfa/mha.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  const int rows = 3, D = 4;
  using M = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using V = Kokkos::View<double*, Kokkos::HostSpace>;
  M x("x", rows, D), w1("w1", D, D), w2("w2", D, D), y("y", rows, D), h("h", rows, D);
  V b1("b1", D), b2("b2", D);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < D; ++j)
      x(i, j) = std::sin(1.0 + 3 * i + j);
  for (int j = 0; j < D; ++j)
    w1(j, j) = w2(j, j) = 1;
  kfa::nn::ffn_forward(Kokkos::DefaultHostExecutionSpace(), x, w1, b1, w2, b2, y, h);
  Kokkos::fence();
  double err = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < D; ++j)
      err = std::fmax(err, std::fabs(y(i, j) - std::fmax(0.0, x(i, j))));
  std::printf("consumer_nn: max error %.3g\n", err);
  return err < 1e-15 ? 0 : 1;
}
