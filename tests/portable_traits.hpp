#pragma once
// The test tile traits of the suites built with KFA_PORTABLE_TILES that stand for a device
// backend on the host (test_portable, test_portable_key_major,
// test_multiscale_portable_key_major). Include before problem.hpp, so that the kernels see it.
#include <kfa/backends/traits.hpp>

#include <type_traits>

#include "category.hpp"

// Teams of two threads on the host spaces that have threads, so that a missing team barrier in
// the kernels shows as a race (ctest runs those suites with two threads; Serial keeps teams of
// one); on a device space the portable choice (Kokkos picks the team size). Rows of the scratch
// tiles padded as on CUDA, so that a kernel indexing a tile by its width instead of its row
// stride fails here. The primary template is reached through Enable = int, which this
// specialisation does not match.
namespace kfa::backends {
constexpr int portable_test_team_size() {
#ifdef KOKKOS_ENABLE_SERIAL
  if (std::is_same_v<kfa_test::Exec, Kokkos::Serial>) return 1;
#endif
  return kfa_test::host_accessible ? 2 : TileTraits<kfa_test::Exec, float, int>::team_size;
}
template <class T>
struct TileTraits<kfa_test::Exec, T, void> : TileTraits<kfa_test::Exec, T, int> {
  static constexpr int team_size = portable_test_team_size();
  static constexpr int pad = 4;
#ifdef KFA_TEST_KEY_MAJOR_SCORES
  static constexpr bool key_major_scores = true;  // test_portable_key_major
#endif
};
}  // namespace kfa::backends
