// The kernels with the portable tile products and traits (backends/generic/) instead of the
// host ones. This executable is compiled with KFA_PORTABLE_TILES, so on the host it runs the
// code path every other backend (CUDA included) runs: threads of a team own rows, team
// barriers between a tile product and its readers, flat staging loops. Checked against the
// float64 reference as test_forward and test_backward do, on a subset of their matrix; on a
// multi-threaded host space with teams of several threads it also exercises the barriers.
#include <kfa/backends/traits.hpp>

#include <type_traits>

// Teams of two threads wherever the space has threads (with OpenMP, run with at least two),
// so that a missing team barrier in the kernels shows as a race; Serial keeps one. Rows of
// the scratch tiles padded as on CUDA, so that a kernel indexing a tile by its width instead
// of its row stride fails here. The primary template is reached through Enable = int, which
// this specialisation does not match.
namespace kfa::backends {
constexpr int portable_test_team_size() {
#ifdef KOKKOS_ENABLE_SERIAL
  if (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>) return 1;
#endif
  return 2;
}
template <class T>
struct TileTraits<Kokkos::DefaultExecutionSpace, T, void>
    : TileTraits<Kokkos::DefaultExecutionSpace, T, int> {
  static constexpr int team_size = portable_test_team_size();
  static constexpr int pad = 4;
};
}  // namespace kfa::backends

#include "problem.hpp"

namespace {

using namespace kfa_test;

static_assert(
    std::is_base_of_v<kfa::backends::PortableTileOps<float>, kfa::backends::TileOps<Exec, float>>,
    "KFA_PORTABLE_TILES must select the portable tile products");

const Shape kShapes[] = {{1, 2, 1, 113, 203, 64}, {2, 4, 2, 70, 150, 32}, {1, 1, 1, 3, 799, 59}};

TEST(Portable, ForwardEveryMask) {
  for (const Shape& s : kShapes)
    for (const kfa::Params& p : masks()) {
      check_case<float>(s, p);
      check_case<double>(s, p);
    }
}

TEST(Portable, ForwardSplitKV) {
  kfa::Params p;
  p.num_splits = 3;
  check_case<float>({1, 2, 2, 17, 1000, 64}, p);
  p.causal = true;
  check_case<float>({1, 2, 2, 130, 700, 40}, p);
}

TEST(Portable, BackwardEveryMask) {
  for (const kfa::Params& mask : masks())
    for (bool deterministic : {false, true}) {
      kfa::Params p = mask;
      p.deterministic = deterministic;
      check_backward_case<float>({1, 2, 1, 113, 203, 64}, p, deterministic);
      check_backward_case<double>({2, 4, 2, 70, 150, 32}, p);
    }
}

TEST(Portable, BackwardDropout) {
  kfa::Params p;
  p.causal = true;
  p.dropout = 0.2;
  p.seed = 7;
  check_backward_case<float>({1, 2, 2, 97, 97, 64}, p);
}

}  // namespace
