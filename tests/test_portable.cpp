// The kernels with the portable tile products and traits (backends/generic/) instead of the
// host ones. This suite is compiled with KFA_PORTABLE_TILES, so on a host space it runs the
// code path the backends without their own tile products run: threads of a team own rows, team
// barriers between a tile product and its readers, flat staging loops. Built a second time as
// test_portable_key_major, with the forward's key-major score layout (the host's choice) on the
// portable column operations. Checked against the
// float64 reference as test_forward and test_backward do, on a subset of their matrix; on a
// multi-threaded host space (test_portable_openmp, test_portable_threads) with teams of two
// threads it also exercises the barriers.
#include <kfa/backends/generic/tile_shape.hpp>
#include <kfa/backends/traits.hpp>

#include <type_traits>

#include "category.hpp"
#include "portable_traits.hpp"

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

// v with a head dim of its own through the portable tiles: forward (split too) and every
// dQ mode of the backward.
TEST(Portable, ValueHeadDimOfItsOwn) {
  kfa::Params causal;
  causal.causal = true;
  for (const auto& [d, dv] : kValueHeadDims)
    for (kfa::Params p : {kfa::Params{}, causal}) {
      check_case<float>({2, 4, 2, 70, 150, d, dv}, p);
      check_case<double>({1, 2, 1, 113, 203, d, dv}, p);
      p.num_splits = 3;
      check_case<float>({1, 2, 2, 17, 700, d, dv}, p);
      p.num_splits = 0;
      for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass, kfa::DqMode::symmetric}) {
        p.dq_mode = mode;
        const int nk = mode == kfa::DqMode::symmetric ? 97 : 150;
        check_backward_case<float>({1, 2, 2, 97, nk, d, dv}, p);
        check_backward_case<double>({1, 2, 2, 97, nk, d, dv}, p, true);
      }
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

// The one-kernel backward (DqMode::symmetric), with its two tile steps per tile and their
// barriers, on teams of several threads where the space has them.
TEST(Portable, BackwardSymmetric) {
  for (const kfa::Params& mask : masks()) {
    kfa::Params p = mask;
    p.dq_mode = kfa::DqMode::symmetric;
    check_backward_case<float>({1, 2, 2, 113, 113, 64}, p);
    check_backward_case<double>({2, 1, 1, 70, 70, 32}, p, true);
  }
}

TEST(Portable, BackwardDropout) {
  kfa::Params p;
  p.causal = true;
  p.dropout = 0.2;
  p.seed = 7;
  check_backward_case<float>({1, 2, 2, 97, 97, 64}, p);
}

// Tile shapes from the scratch size (backends/generic/tile_shape.hpp). First, its byte counts
// are the kernels' own: the scratch each kernel asks Kokkos for at every head dim of the
// matrix (rows padded by 4 here, as on CUDA).
TEST(TileShape, ByteCountsAreTheKernelsScratch) {
  using View4 = Kokkos::View<const float****, Device>;
  using Out4 = Kokkos::View<float****, Device>;
  using Lse3 = Kokkos::View<float***, Device>;
  using Fwd = kfa::impl::ForwardKernel<Exec, View4, View4, View4, Out4, Lse3>;
  using Views = kfa::impl::BackwardViews<View4, View4, View4, View4, Lse3, Out4, Out4, Out4>;
  using Bwd = kfa::impl::BackwardCommon<Exec, float, Views>;
  using traits = kfa::backends::TileTraits<Exec, float>;
  // Every head dim of the matrix with v's head dim equal, then pairs with Dv != D: the tiles
  // are sized for the larger of the two.
  std::vector<std::pair<int, int>> dims;
  dims.reserve(kHeadDims.size() + 4);
  for (int d : kHeadDims)
    dims.emplace_back(d, d);
  for (auto dd : {std::pair{64, 32}, {32, 128}, {59, 111}, {24, 72}})
    dims.push_back(dd);
  for (auto [d, dv] : dims) {
    const int td = d > dv ? d : dv;
    if constexpr (!Fwd::key_major) {
      EXPECT_EQ(Fwd::scratch_bytes(d, dv),
                kfa::backends::forward_scratch_bytes(traits::block_q(td, 0), traits::block_k(td), d,
                                                     int(sizeof(float)), traits::pad, dv))
          << "head_dim " << d << ", Dv " << dv;
    }
    for (bool with_dkdv : {true, false}) {
      EXPECT_EQ(Bwd::scratch_bytes(d, with_dkdv, dv),
                kfa::backends::backward_scratch_bytes(traits::block_bwd(td), d, int(sizeof(float)),
                                                      traits::pad, with_dkdv, dv))
          << "head_dim " << d << ", Dv " << dv
          << (with_dkdv ? " key-tile kernel" : " query-tile kernel");
    }
  }
}

// At Kokkos' CUDA level-0 limit (40,936 bytes; float tiles, pad 4) the rule gives the table of
// cuda/traits.hpp at its bucket bounds, and inside the buckets the shapes the rule implies.
TEST(TileShape, CudaLimitGivesTheTableAtItsBucketBounds) {
  struct Case {
    int head_dim;
    kfa::backends::TileShape want;
  };
  const Case cases[] = {{32, {64, 32, 16}},  {64, {32, 32, 16}}, {128, {16, 16, 8}},  // the table
                        {16, {128, 16, 32}}, {40, {64, 16, 16}}, {80, {32, 16, 8}},
                        {96, {32, 8, 8}},                        // inside
                        {111, {32, 8, 8}},   {256, {8, 8, 0}}};  // 256: no backward tile in level 0
  for (const Case& c : cases) {
    const auto got = kfa::backends::choose_tiles(40936, c.head_dim, 4, 4);
    EXPECT_EQ(got.br, c.want.br) << "head_dim " << c.head_dim;
    EXPECT_EQ(got.bc, c.want.bc) << "head_dim " << c.head_dim;
    EXPECT_EQ(got.bt, c.want.bt) << "head_dim " << c.head_dim;
  }
  static_assert(kfa::backends::choose_tiles(40936, 64, 4, 4).br == 32, "usable in constexpr");
}

bool power_of_two_at_least_8(int x) {
  return x >= 8 && (x & (x - 1)) == 0;
}

// For every head dim and the scratch of an A100 (40 KiB at launch, 99 KiB opted in) and an
// H100 (227 KiB): the shape fits, and no admissible shape with a larger product (or, for the
// backward, a larger tile) does; Br * D grows with M until Br reaches its cap.
TEST(TileShape, FitsAndNothingLargerFits) {
  using kfa::backends::backward_scratch_bytes;
  using kfa::backends::forward_scratch_bytes;
  const std::size_t sizes[] = {std::size_t(40) << 10, std::size_t(99) << 10,
                               std::size_t(227) << 10};
  for (int d : kHeadDims) {
    int last_br = 0;
    for (std::size_t m : sizes) {
      const auto t = kfa::backends::choose_tiles(m, d, 4, 4);
      SCOPED_TRACE(::testing::Message() << "head_dim " << d << ", M " << m);
      ASSERT_TRUE(power_of_two_at_least_8(t.br) && power_of_two_at_least_8(t.bc));
      EXPECT_TRUE(t.br >= t.bc && t.br <= 128 && t.bc <= d);
      EXPECT_LE(forward_scratch_bytes(t.br, t.bc, d, 4, 4), m);
      for (int br = 8; br <= 128; br *= 2)
        for (int bc = 8; bc <= br && bc <= d; bc *= 2) {
          if (br * bc > t.br * t.bc) {
            EXPECT_GT(forward_scratch_bytes(br, bc, d, 4, 4), m);
          }
        }
      if (t.bt > 0) {
        EXPECT_LE(backward_scratch_bytes(t.bt, d, 4, 4, true), m);
      }
      const int next_bt = t.bt > 0 ? 2 * t.bt : 8;
      if (next_bt <= 128) {
        EXPECT_GT(backward_scratch_bytes(next_bt, d, 4, 4, true), m);
      }
      EXPECT_GE(t.br, last_br) << "a larger scratch must not shrink Br";
      last_br = t.br;
    }
  }
}

}  // namespace
