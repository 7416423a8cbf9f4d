// kfa::forward against the double-precision reference over the matrix of docs/testing.md, with the
// tolerance rule of kfa::reference::check_forward.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

// Every head_dim against every odd seqlen pair, no mask, float.
class HeadDimSeqlen : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(HeadDimSeqlen, Float) {
  const auto [d, n] = GetParam();
  check_case<float>({1, 1, 1, n.first, n.second, d}, kfa::Params{});
}

INSTANTIATE_TEST_SUITE_P(Matrix, HeadDimSeqlen,
                         ::testing::Combine(::testing::ValuesIn(kHeadDims),
                                            ::testing::ValuesIn(kSeqlens)));

const std::vector<std::pair<int, int>> kMaskSeqlens = {{1, 1},     {1, 239},   {3, 799},  {17, 17},
                                                       {113, 203}, {203, 113}, {128, 217}};

class Masks : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(Masks, FloatAndDouble) {
  const auto [mi, n] = GetParam();
  const kfa::Params p = masks()[mi];
  const Shape s{2, 3, 3, n.first, n.second, 64};
  check_case<float>(s, p, mi);
  check_case<double>(s, p, mi);
}

INSTANTIATE_TEST_SUITE_P(Matrix, Masks,
                         ::testing::Combine(::testing::Range(0, int(masks().size())),
                                            ::testing::ValuesIn(kMaskSeqlens)));

TEST(Forward, DoubleHeadDims) {
  for (int d : kHeadDims)
    check_case<double>({1, 2, 1, 77, 131, d}, kfa::Params{});
}

TEST(Forward, GroupedAndMultiQuery) {
  for (int hk : {2, 1}) {
    kfa::Params causal;
    causal.causal = true;
    for (const auto& p : {kfa::Params{}, causal}) {
      check_case<float>({2, 4, hk, 70, 150, 32}, p);
      check_case<double>({2, 4, hk, 150, 70, 40}, p);
    }
  }
}

// v with a head dim of its own (Dv != D): every mask, GQA, both precisions.
TEST(Forward, ValueHeadDimOfItsOwn) {
  const auto ms = masks();
  for (const auto& [d, dv] : kValueHeadDims)
    for (int mi = 0; mi < int(ms.size()); ++mi) {
      check_case<float>({2, 4, 2, 70, 131, d, dv}, ms[mi], mi);
      check_case<double>({1, 2, 1, 131, 70, d, dv}, ms[mi], mi);
    }
}

// Every mask at head dims 128 and 96, whose key tiles are wider than head dim 64's on some
// backends (the host's 132 keys with AVX-512): several key tiles, and tiles the masks' edges
// cross, where the host splits P V into groups of query rows, each to the keys it sees (a
// group that sees none skipped).
TEST(Forward, MasksAtWideHeadDims) {
  const auto ms = masks();
  for (int d : {128, 96})
    for (int mi = 0; mi < int(ms.size()); ++mi)
      for (auto [nq, nk] : {std::pair{203, 301}, std::pair{301, 203}})
        check_case<float>({1, 2, 1, nq, nk, d}, ms[mi], mi);
}

// Long key sequences, where a backend may take taller query tiles (TileTraits::block_q; on the
// host 192 rows under host/traits.hpp's long-key rule: a full tile and a short one here),
// without a mask, causal both ways and with a window. 16445 keys at head_dim 128 meet the rule
// with and without AVX-512 (64-key tiles); 8253 at head_dim 64 meet it without AVX-512 only
// (128-key tiles; 64-row tiles on AVX-512).
TEST(Forward, LongKeys) {
  const auto ms = masks();
  for (int mi : {0, 1, 2, 5}) {
    check_case<float>({1, 1, 1, 192 + 37, 16384 + 61, 128}, ms[mi], mi);
    check_case<float>({1, 1, 1, 192 + 37, 8192 + 61, 64}, ms[mi], mi);
  }
}

// Rows that see no key: O = 0 and LSE = -inf exactly, never NaN.
TEST(Forward, FullyMaskedRows) {
  kfa::Params causal;  // bottom-right with seqlen_q > seqlen_k: the first 60 rows see nothing
  causal.causal = true;
  kfa::Params diag;  // top-left diagonal window: rows >= seqlen_k see nothing
  diag.align = kfa::Align::top_left;
  diag.window_left = diag.window_right = 0;
  for (const auto& p : {causal, diag}) {
    Problem pb({1, 2, 1, 100, 40, 32}, 77);
    auto out = run_forward<float>(pb, p);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 100; ++i) {
        bool sees = false;
        for (int j = 0; j < 40; ++j)
          sees = sees || ref::visible(p, i, j, 100, 40);
        if (sees) continue;
        EXPECT_EQ(out.lse(0, h, i), -std::numeric_limits<double>::infinity()) << "row " << i;
        for (int d = 0; d < 32; ++d)
          ASSERT_EQ(out.o(0, h, i, d), 0.0) << "row " << i;
      }
    check_case<float>(pb.shape, p);
  }
}

// Scores whose magnitude reaches ~1e4 in float: no overflow, rule still holds.
TEST(Forward, LargeLogits) {
  for (bool causal : {false, true}) {
    kfa::Params p;
    p.causal = causal;
    const Shape s{1, 2, 2, 97, 300, 64};
    double smax = 0;
    // q and k of amplitude 60: |scale * q.k| reaches the thousands to ten-thousands.
    Problem big(s, 4242, 60.0);
    for (int i = 0; i < 97; ++i)
      for (int j = 0; j < 300; ++j) {
        double dot = 0;
        for (int d = 0; d < 64; ++d)
          dot += big.q(0, 0, i, d) * big.k(0, 0, j, d);
        smax = std::max(smax, std::fabs(dot / 8));
      }
    EXPECT_GT(smax, 5e3);
    check_case<float>(s, p, 0, 60.0);
  }
}

TEST(Forward, BitwiseRepeatable) {
  kfa::Params p;
  p.causal = true;
  Problem pb({2, 2, 1, 150, 260, 64}, 31);
  auto a = run_forward<float>(pb, p);
  auto b = run_forward<float>(pb, p);
  EXPECT_EQ(ref::max_abs_diff(a.o, b.o), 0.0);
  EXPECT_EQ(ref::max_abs_diff(a.lse, b.lse), 0.0);
}

TEST(Forward, DefaultScaleIsInverseSqrtHeadDim) {
  Problem pb({1, 1, 1, 33, 45, 48}, 8);
  kfa::Params explicit_scale;
  explicit_scale.scale = 1.0 / std::sqrt(48.0);
  auto a = run_forward<double>(pb, kfa::Params{});
  auto b = run_forward<double>(pb, explicit_scale);
  EXPECT_EQ(ref::max_abs_diff(a.o, b.o), 0.0);
  kfa::Params other = explicit_scale;
  other.scale = 0.3;
  check_case<double>(pb.shape, other);
}

// (batch, seqlen, heads, head_dim) storage seen through a LayoutStride view, without a copy:
// the result must equal the LayoutRight one bit for bit.
TEST(Forward, StridedLayoutMatchesContiguous) {
  const int B = 2, H = 3, N = 70, D = 32;
  Problem pb({B, H, H, N, N, D}, 12);
  kfa::Params p;
  p.causal = true;
  auto contiguous = run_forward<float>(pb, p);

  using Strided = Kokkos::View<float****, Kokkos::LayoutStride, Device>;
  auto bshd = [&](const Tensor4& t) {
    View4<float> store("bshd", B, N, H, D);
    auto h = Kokkos::create_mirror_view(store);
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int n = 0; n < N; ++n)
          for (int d = 0; d < D; ++d)
            h(b, n, hh, d) = float(t(b, hh, n, d));
    Kokkos::deep_copy(store, h);
    return store;
  };
  auto q = bshd(pb.q), k = bshd(pb.k), v = bshd(pb.v);
  View4<float> ostore("o", B, N, H, D);
  const std::size_t sb = std::size_t(N) * H * D, sn = std::size_t(H) * D;
  const Kokkos::LayoutStride layout(B, sb, H, D, N, sn, D, 1);
  Strided qs(q.data(), layout), ks(k.data(), layout), vs(v.data(), layout),
      os(ostore.data(), layout);
  View3<float> lse("lse", B, H, N);
  kfa::forward(Exec(), qs, ks, vs, os, lse, p);
  Kokkos::fence();
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ostore);
  double diff = 0;
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < H; ++hh)
      for (int n = 0; n < N; ++n)
        for (int d = 0; d < D; ++d)
          diff = std::max(diff, std::fabs(double(oh(b, n, hh, d)) - contiguous.o(b, hh, n, d)));
  EXPECT_EQ(diff, 0.0);
}

// An output view whose elements are proxies (atomic memory traits) is written through the
// view's operator, a plain one through a pointer to each row (ForwardKernel::write_row): both
// must give the same result bit for bit. (Kokkos' atomic views take arithmetic types only.)
template <class T>
void expect_atomic_output_matches_plain() {
  using Atomic =
      Kokkos::View<T****, Kokkos::LayoutRight, Device, Kokkos::MemoryTraits<Kokkos::Atomic>>;
  Problem pb({1, 2, 2, 75, 75, 40}, 13);
  kfa::Params p;
  p.causal = true;
  const auto plain = run_forward<T>(pb, p);
  const auto atomic = run_forward<T, Atomic>(pb, p);
  EXPECT_EQ(ref::max_abs_diff(atomic.o, plain.o), 0.0);
  EXPECT_EQ(ref::max_abs_diff(atomic.lse, plain.lse), 0.0);
}

TEST(Forward, AtomicOutputViewMatchesPlain) {
  expect_atomic_output_matches_plain<float>();
  expect_atomic_output_matches_plain<double>();
}

// seqlen_k = 0: every row is empty.
TEST(Forward, NoKeys) {
  View4<float> q("q", 1, 1, 5, 16), k("k", 1, 1, 0, 16), v("v", 1, 1, 0, 16), o("o", 1, 1, 5, 16);
  View3<float> lse("lse", 1, 1, 5);
  Kokkos::deep_copy(o, std::numeric_limits<float>::quiet_NaN());
  kfa::forward(Exec(), q, k, v, o, lse);
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
  auto lh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lh(0, 0, i), -std::numeric_limits<float>::infinity());
    for (int d = 0; d < 16; ++d)
      EXPECT_EQ(oh(0, 0, i, d), 0.0f);
  }
}

// The softmax examples of the FlashAttention papers' numerics discussion, exactly: D = 3,
// scale 1, one query q = (1, 0, 0), keys k_j = (s_j, 0, 0) and V = I_3, so O = softmax(s) and
// LSE = logsumexp(s). Expected values: the closed form exp(s_j - 100) / sum in float64; never
// NaN; within 64 units of T's roundoff (the exponent's rounding grows with |s_j - max|), and
// an output below T's normal range (3.7e-44 and 1.4e-87 in float) within that range of it, so
// that flushing it to 0 is allowed.
template <class T>
void check_seed_softmax(const double (&s)[3], const double (&want_o)[3], double want_lse) {
  SCOPED_TRACE(::testing::Message()
               << type_name<T>() << " scores " << s[0] << ", " << s[1] << ", " << s[2]);
  Problem pb({1, 1, 1, 1, 3, 3}, 0);
  for (int j = 0; j < 3; ++j)
    for (int d = 0; d < 3; ++d) {
      pb.q(0, 0, 0, d) = d == 0 ? 1.0 : 0.0;
      pb.k(0, 0, j, d) = d == 0 ? s[j] : 0.0;
      pb.v(0, 0, j, d) = j == d ? 1.0 : 0.0;
    }
  kfa::Params p;
  p.scale = 1.0;
  const auto out = run_forward<T>(pb, p);
  const double eps = std::numeric_limits<T>::epsilon(), tiny = std::numeric_limits<T>::min();
  for (int d = 0; d < 3; ++d) {
    const double got = out.o(0, 0, 0, d);
    ASSERT_FALSE(std::isnan(got)) << "O[" << d << "]";
    if (want_o[d] < tiny) {
      EXPECT_LE(std::fabs(got - want_o[d]), tiny) << "O[" << d << "] below the normal range";
    } else {
      EXPECT_LE(std::fabs(got - want_o[d]), 64 * eps * want_o[d]) << "O[" << d << "] = " << got;
    }
  }
  EXPECT_LE(std::fabs(out.lse(0, 0, 0) - want_lse), 4 * eps * std::fabs(want_lse))
      << "LSE = " << out.lse(0, 0, 0);
  const auto c =
      kfa::reference::check_forward<T>(pb.q, pb.k, pb.v, p, out.o, out.lse, keep_mask(pb.shape, p));
  EXPECT_TRUE(c.o.ok()) << "O: err " << c.o.err << " > bound " << c.o.bound;
  EXPECT_TRUE(c.lse.ok()) << "LSE: err " << c.lse.err << " > bound " << c.lse.bound;
}

TEST(Forward, SeedSoftmaxExamples) {
  const double high[3] = {100, 90, 80}, low[3] = {-100, -200, -300};
  const double o_high[3] = {0.999954600070331, 4.539786860886666e-05, 2.061060046209062e-09};
  const double o_low[3] = {1.0, 3.720075976020836e-44, 1.3838965267367376e-87};
  check_seed_softmax<float>(high, o_high, 100.00004540096027);
  check_seed_softmax<double>(high, o_high, 100.00004540096027);
  check_seed_softmax<float>(low, o_low, -100.0);
  check_seed_softmax<double>(low, o_low, -100.0);
}

}  // namespace
