// The unfused baseline of the benchmarks (perf/unfused.hpp: gemm, softmax, gemm) against the
// double-precision reference, forward and backward, with the tolerance rule of kfa's own
// tests: the speed ratios in perf/results/ are only worth quoting if the baseline is right.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>

#include "problem.hpp"
#include "unfused.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

template <class T>
void check_unfused(const Shape& s, bool causal) {
  kfa::Params p;  // bottom-right causal, as the baseline's mask
  p.causal = causal;
  const std::uint64_t seed = seed_of(s, causal ? 7 : 3);
  SCOPED_TRACE(::testing::Message() << s << " " << describe(p) << " seed=" << seed
                                    << (std::is_same_v<T, float> ? " float" : " double"));
  Problem pb(s, seed);
  std::mt19937_64 gen(seed + 1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  auto q = to_device<T>(pb.q);
  auto k = to_device<T>(pb.k);
  auto v = to_device<T>(pb.v);
  auto dodev = to_device<T>(dout);
  auto poisoned = [](const Tensor4& like) {
    auto t = to_device<T>(like);
    Kokkos::deep_copy(t, std::numeric_limits<T>::quiet_NaN());
    return t;
  };
  auto o = poisoned(pb.q), dq = poisoned(pb.q), dk = poisoned(pb.k), dv = poisoned(pb.v);
  View3<T> lse("lse", s.batch, s.heads_q, s.seqlen_q);
  Kokkos::deep_copy(lse, std::numeric_limits<T>::quiet_NaN());

  kfa_bench::unfused::Attention<T, Exec> attention(s.batch, s.heads_q, s.seqlen_q, s.seqlen_k,
                                                   s.head_dim, causal);
  attention.forward(q, k, v, o, lse);
  attention.backward(q, k, v, o, dodev, dq, dk, dv);
  Kokkos::fence();

  const auto oh = to_host<Tensor4>(o, "o");
  const auto lseh = to_host<Tensor3>(lse, "lse");
  ASSERT_TRUE(all_written(oh) && all_written(lseh)) << "unwritten (NaN) forward output";
  const auto f = ref::check_forward<T>(pb.q, pb.k, pb.v, p, oh, lseh);
  EXPECT_TRUE(f.o.ok()) << "O: err " << f.o.err << " > bound " << f.o.bound << " (naive "
                        << f.o.naive_err << ")";
  EXPECT_TRUE(f.lse.ok()) << "LSE: err " << f.lse.err << " > bound " << f.lse.bound << " (naive "
                          << f.lse.naive_err << ")";

  const auto dqh = to_host<Tensor4>(dq, "dq"), dkh = to_host<Tensor4>(dk, "dk"),
             dvh = to_host<Tensor4>(dv, "dv");
  ASSERT_TRUE(all_written(dqh) && all_written(dkh) && all_written(dvh))
      << "unwritten (NaN) gradient";
  const auto g = ref::check_backward<T>(pb.q, pb.k, pb.v, p, dout, {}, dqh, dkh, dvh);
  for (const auto& [name, r] : {std::pair{"dQ", g.dq}, {"dK", g.dk}, {"dV", g.dv}})
    EXPECT_TRUE(r.ok()) << name << ": err " << r.err << " > bound " << r.bound << " (naive "
                        << r.naive_err << ")";
}

// Seqlens that are not multiples of anything, square (the benchmarks' case) and not (the
// causal offset, and with Nq > Nk rows that see no key: O = 0, LSE = -inf, zero gradients).
class Unfused : public ::testing::TestWithParam<std::tuple<std::pair<int, int>, int, bool>> {};

TEST_P(Unfused, FloatAndDouble) {
  const auto [n, d, causal] = GetParam();
  const Shape s{1, 2, 2, n.first, n.second, d};
  check_unfused<float>(s, causal);
  check_unfused<double>(s, causal);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Unfused,
    ::testing::Combine(::testing::Values(std::pair{37, 37}, std::pair{130, 130}, std::pair{64, 130},
                                         std::pair{130, 37}),
                       ::testing::Values(16, 64), ::testing::Bool()));

// The probabilities it keeps for the backward are those of the reference: rows sum to 1 over
// the visible keys and are exactly 0 under the mask.
TEST(Unfused, KeepsMaskedProbabilities) {
  const Shape s{1, 1, 1, 50, 50, 16};
  Problem pb(s, 11);
  auto q = to_device<double>(pb.q), k = to_device<double>(pb.k), v = to_device<double>(pb.v);
  auto o = to_device<double>(pb.q);
  View3<double> lse("lse", 1, 1, 50);
  kfa_bench::unfused::Attention<double, Exec> attention(1, 1, 50, 50, 16, true);
  attention.forward(q, k, v, o, lse);
  const auto p = to_host<Tensor4>(attention.probabilities(), "p");
  for (int i = 0; i < 50; ++i) {
    double sum = 0;
    for (int j = 0; j < 50; ++j) {
      if (j > i) {
        ASSERT_EQ(p(0, 0, i, j), 0.0) << i << " " << j;
      }
      sum += p(0, 0, i, j);
    }
    EXPECT_NEAR(sum, 1.0, 1e-13) << "row " << i;
  }
}

}  // namespace
