// The kernels with the portable tile products and traits (backends/generic/) instead of the
// host ones. This suite is compiled with KFA_PORTABLE_TILES, so on a host space it runs the
// code path the backends without their own tile products run: threads of a team own rows, team
// barriers between a tile product and its readers, flat staging loops. Built a second time as
// test_portable_key_major, with the forward's key-major score layout (the host's choice) on the
// portable column operations. Checked against the
// float64 reference as test_forward and test_backward do, on a subset of their matrix; on a
// multi-threaded host space (test_portable_openmp, test_portable_threads) with teams of two
// threads it also exercises the barriers.
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

#include "problem.hpp"

namespace {

using namespace kfa_test;

static_assert(
    std::is_base_of_v<kfa::backends::PortableTileOps<float>, kfa::backends::TileOps<Exec, float>>,
    "KFA_PORTABLE_TILES must select the portable tile products");
#ifdef KFA_TEST_KEY_MAJOR_SCORES
static_assert(kfa::backends::TileTraits<Exec, float>::key_major_scores,
              "test_portable_key_major must run the key-major forward");
#else
static_assert(!kfa::backends::TileTraits<Exec, float>::key_major_scores,
              "test_portable must run the query-major forward, the layout of the device backends");
#endif

// The size of a team of `want` threads as its members see it. Outside the TEST body: nvcc takes
// no device lambda in a private member function.
int team_size_seen(int want) {
  using Member = Kokkos::TeamPolicy<Exec>::member_type;
  int size = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamPolicy<Exec>(1, want),
      KOKKOS_LAMBDA(const Member& team, int& s) { s = team.team_size(); }, Kokkos::Max<int>(size));
  return size;
}

// The premise of the suite on a threaded host space: the kernels' teams have two threads.
TEST(Portable, TeamsHaveTheThreadsTheTraitsAskFor) {
  constexpr int want = kfa::backends::TileTraits<Exec, float>::team_size;
  if (want == 0) GTEST_SKIP() << "Kokkos chooses the team size on " << Exec::name();
  ASSERT_GE(Exec().concurrency(), want)
      << "this suite needs " << want << " threads: run it with KOKKOS_NUM_THREADS=" << want;
  EXPECT_EQ(team_size_seen(want), want);
}

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

// The score transform and dropout, each with a mask whose edge crosses tiles.
TEST(Portable, ForwardSoftcapAndDropout) {
  kfa::Params capped;
  capped.causal = true;
  capped.softcap = 2.5;
  check_case<float>({1, 2, 1, 113, 203, 64}, capped, 0, 4.0);
  kfa::Params dropped;
  dropped.window_left = 40;
  dropped.window_right = 7;
  dropped.dropout = 0.3;
  dropped.seed = 11;
  check_case<float>({1, 2, 2, 97, 150, 32}, dropped);
  check_case<double>({1, 2, 2, 97, 150, 32}, dropped);
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
