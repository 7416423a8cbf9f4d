// kfa::backward against the double-precision reference gradients (themselves checked against
// finite differences in test_reference) over the matrix of docs/testing.md; the gradient through
// the LSE; determinism of the deterministic mode and agreement of the atomic one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

kfa::Params deterministic(kfa::Params p) {
  p.deterministic = true;
  return p;
}

// Every head_dim against every odd seqlen pair, no mask, float, both dQ strategies (the long
// pairs with the default one only, to keep the suite short).
class BackwardHeadDimSeqlen
    : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(BackwardHeadDimSeqlen, Float) {
  const auto [d, n] = GetParam();
  check_backward_case<float>({1, 1, 1, n.first, n.second, d}, kfa::Params{});
  if (n.first < 1000)
    check_backward_case<float>({1, 1, 1, n.first, n.second, d}, deterministic({}));
}

INSTANTIATE_TEST_SUITE_P(Matrix, BackwardHeadDimSeqlen,
                         ::testing::Combine(::testing::ValuesIn(kHeadDims),
                                            ::testing::ValuesIn(kSeqlens)));

const std::vector<std::pair<int, int>> kMaskSeqlens = {{1, 1},     {3, 799},   {17, 17},
                                                       {113, 203}, {203, 113}, {128, 217}};

class BackwardMasks : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(BackwardMasks, FloatAndDouble) {
  const auto [mi, n] = GetParam();
  const kfa::Params p = masks()[mi];
  const Shape s{2, 2, 2, n.first, n.second, 64};
  check_backward_case<float>(s, p, false, mi);
  check_backward_case<float>(s, deterministic(p), false, mi);
  check_backward_case<double>(s, p, false, mi);
  check_backward_case<double>(s, deterministic(p), true, mi);
}

INSTANTIATE_TEST_SUITE_P(Matrix, BackwardMasks,
                         ::testing::Combine(::testing::Range(0, int(masks().size())),
                                            ::testing::ValuesIn(kMaskSeqlens)));

// dK and dV of a kv head are summed over its group of query heads.
TEST(Backward, GroupedAndMultiQuery) {
  for (int hk : {2, 1}) {
    kfa::Params causal;
    causal.causal = true;
    for (const auto& p : {kfa::Params{}, causal, deterministic(causal)}) {
      check_backward_case<float>({2, 4, hk, 70, 150, 32}, p);
      check_backward_case<double>({2, 4, hk, 150, 70, 40}, p, true);
    }
  }
}

// The LSE gradient: dS gains P * dlse.
TEST(Backward, WithLseGradient) {
  kfa::Params causal;
  causal.causal = true;
  for (const auto& p : {kfa::Params{}, causal, deterministic(causal)})
    for (const Shape& s : {Shape{1, 2, 1, 100, 130, 64}, Shape{1, 1, 1, 1, 300, 128}}) {
      check_backward_case<float>(s, p, true);
      check_backward_case<double>(s, p, true);
    }
}

// Only the LSE in the loss (dO = 0): dQ_i = scale dlse_i (E_P[K] ...) is nonzero, so the dlse
// path is exercised on its own; and a dlse of zeros equals the overload without it, bitwise.
TEST(Backward, LseGradientAlone) {
  const Shape s{1, 2, 2, 40, 90, 32};
  Problem pb(s, 5);
  Tensor4 zero_do(std::string("dout"), 1, 2, 40, 32);
  Tensor3 dlse(std::string("dlse"), 1, 2, 40);
  std::mt19937_64 gen(6);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (std::size_t e = 0; e < dlse.span(); ++e)
    dlse.data()[e] = dist(gen);
  const auto g = run_backward<double>(pb, {}, zero_do, dlse);
  const auto c = ref::check_backward<double>(pb.q, pb.k, pb.v, {}, zero_do, dlse, g.dq, g.dk, g.dv);
  EXPECT_TRUE(c.ok()) << c.dq.err << " " << c.dk.err << " " << c.dv.err;
  EXPECT_GT(ref::max_abs_diff(g.dq, zero_do), 1e-3);  // not trivially zero
  EXPECT_EQ(ref::max_abs_diff(g.dv, Tensor4(std::string("z"), 1, 2, 90, 32)), 0.0);

  std::mt19937_64 gen2(7);
  const Tensor4 dout = random_tensor("dout", 1, 2, 40, 32, gen2);
  Tensor3 zeros(std::string("zeros"), 1, 2, 40);
  const auto a = run_backward<float>(pb, deterministic({}), dout);
  const auto b = run_backward<float>(pb, deterministic({}), dout, zeros);
  EXPECT_EQ(ref::max_abs_diff(a.dq, b.dq), 0.0);
  EXPECT_EQ(ref::max_abs_diff(a.dk, b.dk), 0.0);
  EXPECT_EQ(ref::max_abs_diff(a.dv, b.dv), 0.0);
}

// Rows that see no key: every gradient finite, and zero where nothing is seen.
TEST(Backward, FullyMaskedRows) {
  kfa::Params causal;  // bottom-right with seqlen_q > seqlen_k: the first 60 rows see nothing
  causal.causal = true;
  kfa::Params diag;  // top-left diagonal window: rows >= seqlen_k see nothing
  diag.align = kfa::Align::top_left;
  diag.window_left = diag.window_right = 0;
  for (const auto& p : {causal, diag, deterministic(causal)}) {
    const Shape s{1, 2, 1, 100, 40, 32};
    Problem pb(s, 77);
    std::mt19937_64 gen(78);
    const Tensor4 dout = random_tensor("dout", 1, 2, 100, 32, gen);
    Tensor3 dlse(std::string("dlse"), 1, 2, 100);
    for (std::size_t e = 0; e < dlse.span(); ++e)
      dlse.data()[e] = 0.5;
    const auto g = run_backward<float>(pb, p, dout, dlse);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 100; ++i) {
        bool sees = false;
        for (int j = 0; j < 40; ++j)
          sees = sees || ref::visible(p, i, j, 100, 40);
        if (sees) continue;
        for (int d = 0; d < 32; ++d)
          ASSERT_EQ(g.dq(0, h, i, d), 0.0) << "row " << i;
      }
    for (const auto* t : {&g.dq, &g.dk, &g.dv})
      for (std::size_t e = 0; e < t->span(); ++e)
        ASSERT_TRUE(std::isfinite(t->data()[e]));
    check_backward_case<float>(s, p, true);
  }
}

// Scores reaching ~1e4 in float: no overflow, rule still holds.
TEST(Backward, LargeLogits) {
  for (bool causal : {false, true}) {
    kfa::Params p;
    p.causal = causal;
    check_backward_case<float>({1, 2, 2, 97, 300, 64}, p, false, 0, 60.0);
  }
}

// Runs the backward 50 times; every run's gradients must equal the first's bit for bit.
// Returns the first.
Gradients<float> expect_bitwise_repeatable(const Problem& pb, const kfa::Params& p,
                                           const Tensor4& dout) {
  auto first = run_backward<float>(pb, p, dout);
  for (int rep = 1; rep < 50; ++rep) {
    const auto g = run_backward<float>(pb, p, dout);
    EXPECT_EQ(ref::max_abs_diff(g.dq, first.dq), 0.0) << "repeat " << rep;
    EXPECT_EQ(ref::max_abs_diff(g.dk, first.dk), 0.0) << "repeat " << rep;
    EXPECT_EQ(ref::max_abs_diff(g.dv, first.dv), 0.0) << "repeat " << rep;
  }
  return first;
}

// Deterministic mode: 50 runs bitwise identical. Atomic mode: within rounding of it.
TEST(Backward, DeterministicIsBitwiseRepeatable) {
  kfa::Params p;
  p.causal = true;
  const Shape s{1, 4, 2, 150, 260, 64};
  Problem pb(s, 31);
  std::mt19937_64 gen(32);
  const Tensor4 dout = random_tensor("dout", 1, 4, 150, 64, gen);
  const auto first = expect_bitwise_repeatable(pb, deterministic(p), dout);
  // Same products, dQ summed in another order (per key tile into dq): rounding only, bounded
  // like the tolerance floor, relative to the largest dQ.
  const auto atomic = run_backward<float>(pb, p, dout);
  double dq_max = 1;
  for (std::size_t e = 0; e < first.dq.span(); ++e)
    dq_max = std::max(dq_max, std::fabs(first.dq.data()[e]));
  EXPECT_LE(ref::max_abs_diff(atomic.dq, first.dq),
            64 * std::numeric_limits<float>::epsilon() * dq_max);
  EXPECT_EQ(ref::max_abs_diff(atomic.dk, first.dk), 0.0);  // same kernel, same order
  EXPECT_EQ(ref::max_abs_diff(atomic.dv, first.dv), 0.0);
}

// (batch, seqlen, heads, head_dim) storage through LayoutStride gives the same gradients.
TEST(Backward, StridedLayoutMatchesContiguous) {
  const int B = 2, H = 2, N = 70, D = 32;
  const Shape s{B, H, H, N, N, D};
  Problem pb(s, 12);
  std::mt19937_64 gen(13);
  const Tensor4 dout = random_tensor("dout", B, H, N, D, gen);
  const kfa::Params p = deterministic({});
  const auto contiguous = run_backward<float>(pb, p, dout);

  using Strided = Kokkos::View<float****, Kokkos::LayoutStride, Device>;
  using Bshd = View4<float>;  // (B, N, H, D) storage
  const Kokkos::LayoutStride layout(B, std::size_t(N) * H * D, H, D, N, std::size_t(H) * D, D, 1);
  auto make = [&](const Tensor4* src, const char* label) {
    Bshd store(std::string(label), B, N, H, D);
    auto h = Kokkos::create_mirror_view(store);
    if (src)
      for (int b = 0; b < B; ++b)
        for (int hh = 0; hh < H; ++hh)
          for (int n = 0; n < N; ++n)
            for (int d = 0; d < D; ++d)
              h(b, n, hh, d) = static_cast<float>((*src)(b, hh, n, d));
    Kokkos::deep_copy(store, h);
    return std::pair{store, Strided(store.data(), layout)};
  };
  auto [qs, q] = make(&pb.q, "q");
  auto [ks, k] = make(&pb.k, "k");
  auto [vs, v] = make(&pb.v, "v");
  auto [dos, dov] = make(&dout, "dout");
  auto [os, o] = make(nullptr, "o");
  auto [dqs, dq] = make(nullptr, "dq");
  auto [dks, dk] = make(nullptr, "dk");
  auto [dvs, dv] = make(nullptr, "dv");
  View3<float> lse("lse", B, H, N);
  kfa::forward(Exec(), q, k, v, o, lse, p);
  kfa::backward(Exec(), q, k, v, o, lse, dov, dq, dk, dv, p);
  Kokkos::fence();
  for (const auto& [store, want] :
       {std::pair{dqs, &contiguous.dq}, {dks, &contiguous.dk}, {dvs, &contiguous.dv}}) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), store);
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int n = 0; n < N; ++n)
          for (int d = 0; d < D; ++d)
            ASSERT_EQ(double(h(b, n, hh, d)), (*want)(b, hh, n, d));
  }
}

// ---- DqMode::symmetric: one kernel for self-attention --------------------------------------

kfa::Params symmetric(kfa::Params p) {
  p.dq_mode = kfa::DqMode::symmetric;
  return p;
}

// Every mask, float and double, with and without the LSE gradient, on self-attention shapes
// that are and are not multiples of the tile.
TEST(BackwardSymmetric, EveryMask) {
  const Shape shapes[] = {
      {1, 2, 2, 113, 113, 64}, {2, 3, 3, 17, 17, 32}, {1, 1, 1, 1, 1, 16}, {1, 2, 2, 200, 200, 59}};
  for (const Shape& s : shapes)
    for (int mi = 0; mi < int(masks().size()); ++mi) {
      const kfa::Params p = symmetric(masks()[mi]);
      check_backward_case<float>(s, p, false, mi);
      check_backward_case<double>(s, p, true, mi);
    }
}

TEST(BackwardSymmetric, HeadDimsAndDropout) {
  for (int d : kHeadDims)
    check_backward_case<float>({1, 1, 1, 130, 130, d}, symmetric({}));
  kfa::Params drop;
  drop.causal = true;
  drop.dropout = 0.2;
  drop.seed = 7;
  check_backward_case<float>({1, 2, 2, 150, 150, 64}, symmetric(drop));
  check_backward_case<double>({2, 2, 2, 97, 97, 32}, symmetric(drop), true);
  drop.deterministic = true;  // symmetric is repeatable: no contradiction
  check_backward_case<float>({1, 2, 2, 70, 70, 64}, symmetric(drop));
}

// v, dout and dv with a head dim of their own (Dv != D): every mask in each dQ mode (the
// symmetric one on self-attention), GQA in the two-kernel modes, the LSE gradient, dropout.
TEST(Backward, ValueHeadDimOfItsOwn) {
  const auto ms = masks();
  for (const auto& [d, dv] : kValueHeadDims) {
    for (int mi = 0; mi < int(ms.size()); ++mi) {
      kfa::Params a = ms[mi], qp = ms[mi];
      a.dq_mode = kfa::DqMode::atomic;
      qp.dq_mode = kfa::DqMode::query_pass;
      check_backward_case<float>({2, 4, 2, 70, 101, d, dv}, a, false, mi);
      check_backward_case<double>({1, 4, 2, 101, 70, d, dv}, qp, true, mi);
      check_backward_case<double>({1, 2, 2, 90, 90, d, dv}, symmetric(ms[mi]), mi % 2 == 0, mi);
    }
    kfa::Params drop;
    drop.causal = true;
    drop.dropout = 0.2;
    drop.seed = 11;
    for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass, kfa::DqMode::symmetric}) {
      drop.dq_mode = mode;
      check_backward_case<double>({1, 2, 2, 80, 80, d, dv}, drop, true);
      check_backward_case<float>({1, 2, 2, 80, 80, d, dv}, drop);
    }
  }
}

/// Units in the last place between two floats (0 when bitwise equal).
long long ulp_distance(float a, float b) {
  auto key = [](float x) {  // monotone integer image of the float line
    std::int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? static_cast<long long>(std::numeric_limits<std::int32_t>::min()) - i
                 : static_cast<long long>(i);
  };
  return std::llabs(key(a) - key(b));
}

// 50 runs bitwise identical, and within 64 ulp of the query pass element by element (the same
// products summed in the same order: in practice equal).
TEST(BackwardSymmetric, RepeatableAndWithin64UlpOfTheQueryPass) {
  kfa::Params p;
  p.causal = true;
  const Shape s{1, 2, 2, 150, 150, 64};
  Problem pb(s, 41);
  std::mt19937_64 gen(42);
  const Tensor4 dout = random_tensor("dout", 1, 2, 150, 64, gen);
  const auto first = expect_bitwise_repeatable(pb, symmetric(p), dout);
  kfa::Params qp = p;
  qp.dq_mode = kfa::DqMode::query_pass;
  const auto pass = run_backward<float>(pb, qp, dout);
  const std::pair<const Tensor4*, const Tensor4*> pairs[] = {
      {&first.dq, &pass.dq}, {&first.dk, &pass.dk}, {&first.dv, &pass.dv}};
  for (const auto& [a, b] : pairs) {
    long long worst = 0;
    for (std::size_t e = 0; e < a->span(); ++e)
      worst = std::max(
          worst, ulp_distance(static_cast<float>(a->data()[e]), static_cast<float>(b->data()[e])));
    EXPECT_LE(worst, 64) << a->label();
  }
}

// What symmetric cannot do is refused before any launch, naming the extents.
TEST(BackwardSymmetric, RefusesCrossAttentionAndGroupedHeads) {
  const std::pair<Shape, const char*> cases[] = {{{1, 2, 2, 64, 80, 32}, "seqlen_q == seqlen_k"},
                                                 {{1, 4, 2, 64, 64, 32}, "heads_q == heads_k"}};
  for (const auto& [s, what] : cases) {
    Problem pb(s, 5);
    std::mt19937_64 gen(6);
    const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
    try {
      run_backward<float>(pb, symmetric({}), dout);
      ADD_FAILURE() << "no error for " << s;
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  kfa::Params contradiction;
  contradiction.deterministic = true;
  contradiction.dq_mode = kfa::DqMode::atomic;
  Problem pb({1, 1, 1, 8, 8, 16}, 5);
  const Tensor4 dout = pb.q;
  EXPECT_THROW(run_backward<float>(pb, contradiction, dout), kfa::Error);
}

}  // namespace
