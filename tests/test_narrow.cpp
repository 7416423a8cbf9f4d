// 16-bit value types: kfa::forward and kfa::backward with inputs and outputs in a narrow type,
// computed in float, against the double reference under the rule of docs/testing.md, whose "naive
// in the same precision" is the unfused 16-bit attention (products in float, S, P, O, dP, dS and
// the gradients rounded to the type; kfa::reference::compute_t).
//
// Runs with kfa::bf16 and kfa::half on every build, and with Kokkos' half_t and bhalf_t where
// the Kokkos build makes them 16-bit types (GPU backends), on the suite's execution space. Inputs
// are rounded to the type first, so kernel and reference see the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "problem.hpp"

namespace {

using namespace kfa_test;

template <class... Ts>
struct List {};
template <class L, class T, bool add>
struct Append;
template <class... Ts, class T>
struct Append<List<Ts...>, T, true> {
  using type = List<Ts..., T>;
};
template <class... Ts, class T>
struct Append<List<Ts...>, T, false> {
  using type = List<Ts...>;
};
template <class L>
struct ToTypes;
template <class... Ts>
struct ToTypes<List<Ts...>> {
  using type = ::testing::Types<Ts...>;
};
template <class L, class T>
using append_if_narrow = typename Append<L, T, kfa::backends::is_narrow_float<T>::value>::type;

// kfa::bf16 and kfa::half always; Kokkos' types when they are narrow (otherwise they are float,
// tested elsewhere). No bhalf_t before Kokkos 3.6: float stands in, and float is never narrow.
#if defined(KOKKOS_BHALF_T_IS_FLOAT)
using KokkosBhalf = Kokkos::Experimental::bhalf_t;
#else
using KokkosBhalf = float;
#endif
using Narrow = typename ToTypes<append_if_narrow<
    append_if_narrow<List<kfa::bf16, kfa::half>, Kokkos::Experimental::half_t>, KokkosBhalf>>::type;

template <class T>
class NarrowTest : public ::testing::Test {};
TYPED_TEST_SUITE(NarrowTest, Narrow);

kfa::Params deterministic(kfa::Params p) {
  p.deterministic = true;
  return p;
}

// Head dims against seqlens that are not multiples of any tile, no mask.
TYPED_TEST(NarrowTest, ForwardHeadDimsAndSeqlens) {
  using T = TypeParam;
  for (int d : {16, 59, 64, 128})
    for (auto [nq, nk] : {std::pair{1, 239}, std::pair{113, 203}, std::pair{128, 217}})
      check_case<T>({1, 2, 1, nq, nk, d}, kfa::Params{});
  check_case<T>({1, 1, 1, 1023, 1024, 64}, kfa::Params{});
}

// Every mask of the matrix, with GQA, forward and both backward strategies.
TYPED_TEST(NarrowTest, MasksForwardBackward) {
  using T = TypeParam;
  const auto all = masks();
  for (int mi = 0; mi < static_cast<int>(all.size()); ++mi)
    for (auto [nq, nk] : {std::pair{17, 17}, std::pair{113, 203}, std::pair{203, 113}}) {
      const Shape s{2, 2, 1, nq, nk, 64};
      check_case<T>(s, all[mi], mi);
      check_backward_case<T>(s, all[mi], false, mi);
      check_backward_case<T>(s, deterministic(all[mi]), true, mi);
    }
}

// Every mask's forward at head dim 128 (wider key tiles on some backends, test_forward.cpp's
// MasksAtWideHeadDims).
TYPED_TEST(NarrowTest, MasksForwardWideHeadDim) {
  using T = TypeParam;
  const auto all = masks();
  for (int mi = 0; mi < static_cast<int>(all.size()); ++mi)
    for (auto [nq, nk] : {std::pair{113, 301}, std::pair{301, 113}})
      check_case<T>({1, 2, 1, nq, nk, 128}, all[mi], mi);
}

// Head dims and a long pair in the backward: the float dQ accumulator of the atomic path
// sums over many key tiles.
TYPED_TEST(NarrowTest, BackwardHeadDims) {
  using T = TypeParam;
  for (int d : {16, 59, 128})
    check_backward_case<T>({1, 2, 2, 128, 217, d}, kfa::Params{});
  check_backward_case<T>({1, 1, 1, 1023, 1024, 64}, kfa::Params{});
  check_backward_case<T>({1, 1, 1, 1023, 1024, 64}, deterministic({}));
}

// The shapes of the register-resident backward (CUDA, 16-bit, head dims 64 and 128, atomic dQ)
// with GQA, causal and not, small enough for compute-sanitizer's racecheck; elsewhere the tile
// kernels run them.
TYPED_TEST(NarrowTest, BackwardRegisterShapes) {
  using T = TypeParam;
  kfa::Params causal;
  causal.causal = true;
  for (int d : {64, 128}) {
    check_backward_case<T>({1, 2, 1, 100, 150, d}, kfa::Params{});
    check_backward_case<T>({1, 2, 1, 150, 100, d}, causal);
  }
}

// Split-KV and dropout go through the same conversions. Dropout at head dims 64 and 128, causal
// and split too: on CUDA the register-resident kernels' dropout forms (their Philox draws).
TYPED_TEST(NarrowTest, SplitsAndDropout) {
  using T = TypeParam;
  kfa::Params split;
  split.num_splits = 3;
  check_case<T>({1, 2, 2, 5, 700, 64}, split);
  kfa::Params drop;
  drop.dropout = 0.2;
  drop.seed = 7;
  kfa::Params drop_causal = drop;
  drop_causal.causal = true;
  drop_causal.num_splits = 2;
  for (int d : {64, 128}) {  // two batches: the mask's batch index
    check_case<T>({2, 2, 2, 113, 203, d}, drop);
    check_backward_case<T>({2, 2, 2, 113, 203, d}, drop);
    check_case<T>({2, 2, 1, 150, 100, d}, drop_causal);
    check_backward_case<T>({2, 2, 1, 150, 100, d}, drop_causal);
  }
}

// v with a head dim of its own, forward and both backward strategies.
TYPED_TEST(NarrowTest, ValueHeadDimOfItsOwn) {
  using T = TypeParam;
  kfa::Params causal;
  causal.causal = true;
  for (const auto& [d, dv] : kValueHeadDims) {
    const Shape s{1, 2, 1, 113, 203, d, dv};
    check_case<T>(s, causal);
    check_backward_case<T>(s, causal);
    check_backward_case<T>(s, deterministic(causal), true);
  }
}

// The one-kernel backward writes 16-bit dQ once, from its float accumulator.
TYPED_TEST(NarrowTest, BackwardSymmetric) {
  using T = TypeParam;
  kfa::Params p;
  p.causal = true;
  p.dq_mode = kfa::DqMode::symmetric;
  check_backward_case<T>({1, 2, 2, 130, 130, 64}, p);
  p.causal = false;
  p.window_left = 30;
  check_backward_case<T>({1, 1, 1, 77, 77, 32}, p);
}

// Scores reaching 1e4: the float accumulation keeps them finite, as for float inputs.
TYPED_TEST(NarrowTest, LargeLogits) {
  using T = TypeParam;
  check_case<T>({1, 1, 1, 64, 200, 64}, kfa::Params{}, 0, 12.5);
}

// Scores of 20 and 12, whose exponentials (4.9e8, 1.6e5) overflow binary16 (max 65504, so
// exp(s) overflows above s = 11.09): the softmax runs in float on shifted scores, so O and LSE
// stay finite and within the rule. q = e_0, k_j = s_j e_0, V = I, so O = softmax(s).
TYPED_TEST(NarrowTest, ScoresAboveTheHalfOverflow) {
  using T = TypeParam;
  const double scores[4] = {20, 12, 0, -5};
  Problem pb({1, 1, 1, 1, 4, 4}, 0);
  for (int j = 0; j < 4; ++j)
    for (int d = 0; d < 4; ++d) {
      pb.q(0, 0, 0, d) = d == 0 ? 1.0 : 0.0;
      pb.k(0, 0, j, d) = d == 0 ? scores[j] : 0.0;
      pb.v(0, 0, j, d) = j == d ? 1.0 : 0.0;
    }
  pb.rounded<T>();
  kfa::Params p;
  p.scale = 1.0;
  const auto out = run_forward<T>(pb, p);
  for (int d = 0; d < 4; ++d)
    ASSERT_TRUE(std::isfinite(out.o(0, 0, 0, d))) << "O[" << d << "] = " << out.o(0, 0, 0, d);
  ASSERT_TRUE(std::isfinite(out.lse(0, 0, 0))) << "LSE = " << out.lse(0, 0, 0);
  const auto c =
      kfa::reference::check_forward<T>(pb.q, pb.k, pb.v, p, out.o, out.lse, keep_mask(pb.shape, p));
  EXPECT_TRUE(c.o.ok()) << "O: err " << c.o.err << " > bound " << c.o.bound;
  EXPECT_TRUE(c.lse.ok()) << "LSE: err " << c.lse.err << " > bound " << c.lse.bound;
}

// Fully masked rows: O = 0 and LSE = -inf in the narrow output as well.
TYPED_TEST(NarrowTest, FullyMaskedRows) {
  using T = TypeParam;
  kfa::Params p;
  p.causal = true;
  p.align = kfa::Align::bottom_right;
  const Shape s{1, 1, 1, 40, 16, 32};  // rows 0..23 see no key
  Problem pb(s, seed_of(s, 3));
  pb.rounded<T>();
  const auto out = run_forward<T>(pb, p);
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(out.lse(0, 0, i), -std::numeric_limits<double>::infinity()) << "row " << i;
    for (int d = 0; d < 32; ++d)
      ASSERT_EQ(out.o(0, 0, i, d), 0.0) << "row " << i << " d " << d;
  }
  check_backward_case<T>(s, p);
}

// bfloat16 inputs on the host's pair products (TileTraits::bf16x2_products, VDPBF16PS) against
// kfa's float forward on the same values: they differ only by P rounded to bfloat16 (relative
// 2^-9 per element) and the output's rounding (2^-9), so with scores spread wide enough
// (amplitude 3: scores of a few units) an error in the scale, a stride or a packing shows well
// above the bound. Runs wherever the suite runs; without the pair products it compares the
// widened path with float, which must then agree as closely.
TEST(NarrowPairs, Bf16MatchesFloatOnTheSameValues) {
  // (D, Dv): equal, and v's head dim of its own (an odd one leaves the pair products).
  // Masks: none, causal, and windows of 37 and 38 keys to the left, one of which puts the first
  // key a query tile sees on an odd key (such tiles interleave V_j themselves; the others read
  // V's pair words made once per call).
  for (auto [d, dv] : {std::pair{64, 64}, {128, 128}, {40, 40}, {64, 32}, {32, 96}, {64, 41}})
    for (int mode : {0, 1, 2, 3}) {
      const Shape s{1, 2, 1, 150, 203, d, dv};
      SCOPED_TRACE(::testing::Message() << s << " mask " << mode);
      Problem pb(s, 99, 3.0);
      pb.rounded<bf16>();
      kfa::Params p;
      p.causal = mode == 1;
      if (mode >= 2) p.window_left = 35 + mode;
      const auto narrow = run_forward<bf16>(pb, p);
      const auto wide = run_forward<float>(pb, p);
      double vmax = 0;
      for (std::size_t e = 0; e < pb.v.span(); ++e)
        vmax = std::max(vmax, std::abs(pb.v.data()[e]));
      double worst = 0;
      for (std::size_t e = 0; e < wide.o.span(); ++e)
        worst = std::max(worst, std::abs(narrow.o.data()[e] - wide.o.data()[e]));
      EXPECT_LE(worst, 3 * std::ldexp(vmax, -9));
    }
}

// Keys that no query sees may hold anything, NaN included (a cache's unwritten rows): the
// output is the same bits as with zeros there. The pair products pair keys two by two, so a key
// no row sees next to one a row sees must not enter a pair (P is 0 there, but 0 x NaN is NaN):
// the hidden keys end at an odd key (a window: keys 0..14 hidden, the first tile's first
// visible key odd) or start at one (top-left causal over 151 queries: keys 151.. hidden).
TEST(NarrowPairs, KeysNoQuerySeesMayHoldNaN) {
  for (int mode : {0, 1}) {
    const Shape s{1, 2, 1, 151, 203, 64};
    SCOPED_TRACE(::testing::Message() << s << (mode ? " top-left causal" : " window 37"));
    kfa::Params p;
    if (mode == 0) p.window_left = 37;  // bottom-right: query i sees keys i + 15 .. i + 52
    if (mode == 1) {
      p.causal = true;
      p.align = kfa::Align::top_left;  // query i sees keys 0 .. i
    }
    const auto hidden = [&](int j) { return mode == 0 ? j < 15 : j >= 151; };
    Problem with_nan(s, 21), with_zero(s, 21);
    with_nan.rounded<bf16>();
    with_zero.rounded<bf16>();
    for (int h = 0; h < s.heads_k; ++h)
      for (int j = 0; j < s.seqlen_k; ++j)
        for (int d = 0; d < s.head_dim; ++d)
          if (hidden(j)) {
            with_nan.k(0, h, j, d) = with_nan.v(0, h, j, d) = std::nan("");
            with_zero.k(0, h, j, d) = with_zero.v(0, h, j, d) = 0.0;
          }
    const auto a = run_forward<bf16>(with_nan, p), b = run_forward<bf16>(with_zero, p);
    int differ = 0;
    for (std::size_t e = 0; e < a.o.span(); ++e)
      differ += !(a.o.data()[e] == b.o.data()[e]);  // NaN counts as different
    EXPECT_EQ(differ, 0);
  }
}

// The environment's choice of the bf16 path (KFA_HOST_BF16_PAIRS, host::bf16x2_pays) is the
// one taken: ctest runs this suite with it forced both ways, and a forcing that were ignored
// would leave one path untested while every case passed.
TEST(NarrowPairs, ForcedPathIsTaken) {
  using Ops = kfa::backends::TileOps<Exec, bf16>;
  const char* force = std::getenv("KFA_HOST_BF16_PAIRS");
  if (!kfa::backends::TileTraits<Exec, bf16>::bf16x2_products ||
      !Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible)
    GTEST_SKIP() << "no pair products in this build";
  if (!force || (std::string(force) != "0" && std::string(force) != "1"))
    GTEST_SKIP() << "KFA_HOST_BF16_PAIRS not set: the probe decides";
  EXPECT_EQ(Ops::bf16x2_pays(), std::string(force) == "1");
}

// The AMX tiles are taken where the CPU lists them (/proc/cpuinfo's amx_bf16 and amx_tile,
// read here, not by the code under test) and the kernel grants the tile state (asked here
// too), unless KFA_HOST_AMX=0 says not to; and a bf16 forward then runs its products on them
// (host::amx::products counts the calls on the calling thread, which runs teams of the
// forward on Serial and as OpenMP's thread 0). ctest runs the pair cases both ways, so a tiles
// path never entered, or one the variable did not switch off, shows.
TEST(NarrowPairs, TilesWhereTheCpuHasThem) {
  using Ops = kfa::backends::TileOps<Exec, bf16>;
  if (!Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible)
    GTEST_SKIP() << "not a host space";
#ifndef KFA_HOST_AMX
  EXPECT_FALSE(Ops::bf16x2_tiles());
  GTEST_SKIP() << "this build has no AMX tile products (it does not target AMX-BF16)";
#else
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool listed = false;
  while (!listed && std::getline(cpuinfo, line))
    listed = line.rfind("flags", 0) == 0 && (line + " ").find(" amx_bf16 ") != std::string::npos &&
             (line + " ").find(" amx_tile ") != std::string::npos;
  if (listed && syscall(SYS_arch_prctl, 0x1023, 18) != 0)  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    GTEST_SKIP() << "the kernel does not grant the AMX tile state to this process";
  const char* off = std::getenv("KFA_HOST_AMX");
  const bool want = listed && !(off && std::string(off) == "0");
  EXPECT_EQ(Ops::bf16x2_tiles(), want);
  const char* pairs = std::getenv("KFA_HOST_BF16_PAIRS");
  if (!Ops::bf16x2_pays() || (pairs && std::string(pairs) == "0")) return;
  Problem pb(Shape{1, 2, 1, 300, 300, 64, 64}, 5, 1.0);
  pb.rounded<bf16>();
  const long before = kfa::backends::host::amx::products;
  run_forward<bf16>(pb, kfa::Params{});
  EXPECT_EQ(kfa::backends::host::amx::products > before, want);
#endif
}

}  // namespace
