// The combiner's properties (identity, empty+empty, associativity and commutativity over random
// trees, far-apart maxima) checked against partials computed directly in double, and the
// forward over key chunks merged with it against the unsplit reference; the log-softmax member
// of the combiner family (kfa/combiners.hpp) and kfa::Reducer in a host parallel_reduce.
#include <kfa/combine.hpp>
#include <kfa/combiners.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
constexpr std::size_t D = 7;

template <class T>
struct Part {
  kfa::Partial<T> s;
  std::vector<T> o = std::vector<T>(D, T(0));
};

// The partial of keys [j0, j1) with scores and values given, computed directly in T.
template <class T>
Part<T> direct(const std::vector<double>& score, const std::vector<double>& val, int j0, int j1) {
  Part<T> p;
  if (j0 >= j1) return p;
  T m = T(score[j0]);
  for (int j = j0; j < j1; ++j)
    m = std::max(m, T(score[j]));
  p.s.m = m;
  for (int j = j0; j < j1; ++j) {
    const T w = std::exp(T(score[j]) - m);
    p.s.l += w;
    for (std::size_t d = 0; d < D; ++d)
      p.o[d] += w * T(val[j * D + d]);
  }
  return p;
}

template <class T>
Part<T> merged(Part<T> a, const Part<T>& b) {
  kfa::combine_into(a.s, a.o.data(), b.s, b.o.data(), int(D));
  return a;
}

TEST(Combine, EmptyIsAnExactIdentity) {
  std::mt19937_64 gen(3);
  std::normal_distribution<double> n(0, 50);
  std::vector<double> s(9), v(9 * D);
  for (auto& x : s)
    x = n(gen);
  for (auto& x : v)
    x = n(gen);
  const Part<float> x = direct<float>(s, v, 0, 9), e;
  for (const auto& r : {merged(e, x), merged(x, e)}) {
    EXPECT_EQ(r.s.m, x.s.m);
    EXPECT_EQ(r.s.l, x.s.l);
    for (std::size_t d = 0; d < D; ++d)
      EXPECT_EQ(r.o[d], x.o[d]);
  }
  const auto stats = kfa::combine(e.s, x.s);
  EXPECT_EQ(stats.m, x.s.m);
  EXPECT_EQ(stats.l, x.s.l);
}

TEST(Combine, EmptyWithEmptyStaysEmptyAndFinite) {
  const Part<double> e;
  const Part<double> r = merged(e, e);
  EXPECT_EQ(r.s.m, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.s.l, 0.0);
  for (double x : r.o)
    EXPECT_EQ(x, 0.0);
  EXPECT_EQ(kfa::lse(r.s), -std::numeric_limits<double>::infinity());
  const auto f = kfa::rescale(-std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f.alpha, 0.0f);
  EXPECT_EQ(f.beta, 0.0f);
}

// Random binary trees over 1..64 chunk partials (some empty), scores in blocks whose maxima are
// hundreds apart: any merge order gives the direct partial of all keys, within rounding.
template <class T>
void random_trees(double tol) {
  std::mt19937_64 gen(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int chunks = 1 + trial % 64;
    std::vector<int> bounds = {0};
    std::uniform_int_distribution<int> len(0, 4);  // 0: an empty partial
    for (int c = 0; c < chunks; ++c)
      bounds.push_back(bounds.back() + len(gen));
    const int n = bounds.back();
    std::vector<double> s(n), v(n * D);
    std::normal_distribution<double> nd(0, 3);
    std::uniform_int_distribution<int> shift(-3, 3);
    for (int c = 0; c < chunks; ++c) {
      const double offset = 150.0 * shift(gen);  // maxima up to ~900 apart
      for (int j = bounds[c]; j < bounds[c + 1]; ++j)
        s[j] = offset + nd(gen);
    }
    for (auto& x : v)
      x = nd(gen);
    // Inputs representable in T, so the double reference sees the same numbers and the
    // comparison measures the arithmetic, not the rounding of scores near 900.
    for (auto& x : s)
      x = double(T(x));
    for (auto& x : v)
      x = double(T(x));
    std::vector<Part<T>> parts;
    parts.reserve(chunks);
    for (int c = 0; c < chunks; ++c)
      parts.push_back(direct<T>(s, v, bounds[c], bounds[c + 1]));
    while (parts.size() > 1) {  // merge two random partials, in random order
      std::uniform_int_distribution<std::size_t> pick(0, parts.size() - 1);
      std::size_t a = pick(gen), b = pick(gen);
      if (a == b) b = (b + 1) % parts.size();
      parts[a] = merged(parts[a], parts[b]);
      parts.erase(parts.begin() + b);
    }
    const Part<double> ref = direct<double>(s, v, 0, n);
    const Part<T>& got = parts.front();
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " chunks " << chunks << " keys " << n);
    if (n == 0) {
      EXPECT_EQ(got.s.l, T(0));
      continue;
    }
    ASSERT_TRUE(std::isfinite(got.s.m) && std::isfinite(got.s.l));
    EXPECT_EQ(double(got.s.m), double(T(ref.s.m)));  // the max is exact
    EXPECT_NEAR(double(kfa::lse(got.s)), kfa::lse(ref.s), tol * std::fabs(kfa::lse(ref.s)) + tol);
    for (std::size_t d = 0; d < D; ++d)
      EXPECT_NEAR(double(got.o[d] / got.s.l), ref.o[d] / ref.s.l, tol * 10);
  }
}

TEST(Combine, RandomTreesFloat) {
  random_trees<float>(4e-6);
}
TEST(Combine, RandomTreesDouble) {
  random_trees<double>(1e-13);
}

// kfa::forward on k key chunks, merged with the combiner in (lse, O) form (m = lse, l = 1,
// O~ = O), equals the unsplit forward within the tolerance rule, for k = 1..17.
TEST(Combine, SplitKeysEqualsUnsplit) {
  const Shape s{1, 2, 1, 19, 203, 32};
  Problem pb(s, 555);
  for (int k = 1; k <= 17; ++k) {
    SCOPED_TRACE(::testing::Message() << k << " chunks");
    Tensor4 o("o", 1, 2, 19, 32);
    Tensor3 lse("lse", 1, 2, 19);
    constexpr std::size_t rows = std::size_t{2} * 19, dim = 32;
    std::vector<kfa::Partial<float>> stats(rows);
    std::vector<float> acc(rows * dim, 0.0f);
    for (int c = 0; c < k; ++c) {
      const int j0 = s.seqlen_k * c / k, j1 = s.seqlen_k * (c + 1) / k;
      Problem chunk = pb;
      chunk.k = Tensor4("k", 1, 1, j1 - j0, 32);
      chunk.v = Tensor4("v", 1, 1, j1 - j0, 32);
      for (int j = j0; j < j1; ++j)
        for (int d = 0; d < 32; ++d) {
          chunk.k(0, 0, j - j0, d) = pb.k(0, 0, j, d);
          chunk.v(0, 0, j - j0, d) = pb.v(0, 0, j, d);
        }
      chunk.shape.seqlen_k = j1 - j0;
      const auto out = run_forward<float>(chunk, kfa::Params{});
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 19; ++i) {
          const std::size_t row = std::size_t(h) * 19 + i;
          float oc[32];
          for (int d = 0; d < 32; ++d)
            oc[d] = float(out.o(0, h, i, d));
          const float lse_c = float(out.lse(0, h, i));
          const kfa::Partial<float> part{lse_c, std::isinf(lse_c) ? 0.0f : 1.0f};
          kfa::combine_into(stats[row], acc.data() + row * dim, part, oc, 32);
        }
    }
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 19; ++i) {
        const std::size_t row = std::size_t(h) * 19 + i;
        lse(0, h, i) = kfa::lse(stats[row]);
        for (int d = 0; d < 32; ++d)
          o(0, h, i, d) = acc[row * 32 + d] / stats[row].l;
      }
    const auto c = kfa::reference::check_forward<float>(pb.q, pb.k, pb.v, kfa::Params{}, o, lse);
    EXPECT_TRUE(c.o.ok()) << "O err " << c.o.err << " bound " << c.o.bound;
    EXPECT_TRUE(c.lse.ok()) << "LSE err " << c.lse.err << " bound " << c.lse.bound;
  }
}

// The log-softmax combiner (kfa/combiners.hpp): partials of sum_j logsoftmax(x)_j y_j over random
// chunks of elements (empty ones included, scores up to ~900 apart) merged by random trees,
// against the closed form sum_j (x_j - LSE) y_j computed directly in double.
constexpr int LD = 3;

template <class T>
using LogSm = kfa::combiners::LogSoftmax<T, LD>;

struct LogSoftmaxDirect {
  double lse = 0;
  double o[LD] = {};
};

LogSoftmaxDirect log_softmax_direct(const std::vector<double>& x, const std::vector<double>& y) {
  LogSoftmaxDirect r;
  const double m = *std::max_element(x.begin(), x.end());
  double d = 0;
  for (const double v : x)
    d += std::exp(v - m);
  r.lse = m + std::log(d);
  for (std::size_t j = 0; j < x.size(); ++j)
    for (int k = 0; k < LD; ++k)
      r.o[k] += (x[j] - r.lse) * y[j * LD + std::size_t(k)];
  return r;
}

template <class T>
typename LogSm<T>::state_type log_softmax_chunk(const std::vector<double>& x,
                                                const std::vector<double>& y, std::size_t j0,
                                                std::size_t j1) {
  auto p = LogSm<T>::identity();
  for (std::size_t j = j0; j < j1; ++j) {
    T yj[LD];
    for (int k = 0; k < LD; ++k)
      yj[k] = T(y[j * LD + std::size_t(k)]);
    LogSm<T>::join(p, LogSm<T>::single(T(x[j]), yj));
  }
  return p;
}

template <class T>
void log_softmax_trees(double tol) {
  std::mt19937_64 gen(31);
  double worst = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int k = 1 + int(gen() % 64);
    const std::size_t n = 1 + std::size_t(gen() % 200);
    std::uniform_real_distribution<double> score(trial % 2 ? -900.0 : -5.0, 5.0), val(-1, 1);
    std::vector<double> x(n), y(n * LD);
    for (auto& v : x)
      v = double(T(score(gen)));
    for (auto& v : y)
      v = double(T(val(gen)));
    std::vector<std::size_t> cut(std::size_t(k) + 1, 0);
    for (int c = 1; c < k; ++c)
      cut[std::size_t(c)] = gen() % (n + 1);
    cut[std::size_t(k)] = n;
    std::sort(cut.begin(), cut.end());
    std::vector<typename LogSm<T>::state_type> parts;
    parts.reserve(std::size_t(k));
    for (int c = 0; c < k; ++c)
      parts.push_back(log_softmax_chunk<T>(x, y, cut[std::size_t(c)], cut[std::size_t(c) + 1]));
    while (parts.size() > 1) {
      const std::size_t i = gen() % (parts.size() - 1);
      // join in either order: the merge is commutative as well
      if (gen() % 2) {
        LogSm<T>::join(parts[i], parts[i + 1]);
      } else {
        auto b = parts[i + 1];
        LogSm<T>::join(b, parts[i]);
        parts[i] = b;
      }
      parts.erase(parts.begin() + std::ptrdiff_t(i) + 1);
    }
    const LogSoftmaxDirect want = log_softmax_direct(x, y);
    double scale = 1;
    for (const double v : want.o)
      scale = std::max(scale, std::fabs(v));
    SCOPED_TRACE("trial " + std::to_string(trial) + " k=" + std::to_string(k));
    EXPECT_LE(std::fabs(double(LogSm<T>::lse(parts[0])) - want.lse),
              tol * std::max(1.0, std::fabs(want.lse)));
    for (int c = 0; c < LD; ++c) {
      const double err = std::fabs(double(parts[0].o[c]) - want.o[c]) / scale;
      worst = std::max(worst, err);
      EXPECT_LE(err, tol) << "o[" << c << "]";
    }
  }
  std::printf("log-softmax trees: worst relative error %.3g\n", worst);
}

TEST(LogSoftmaxCombiner, RandomTreesDouble) {
  log_softmax_trees<double>(1e-13);
}
TEST(LogSoftmaxCombiner, RandomTreesFloat) {
  log_softmax_trees<float>(4e-6);
}

TEST(LogSoftmaxCombiner, EmptyIsAnExactIdentity) {
  const std::vector<double> x = {1.5, -2, 0.25}, y = {1, 2, 3, -1, 0.5, 4, 0, 0, 1};
  const auto a = log_softmax_chunk<double>(x, y, 0, 3);
  for (const bool left : {true, false}) {
    auto r = LogSm<double>::identity();
    if (left) {
      LogSm<double>::join(r, a);
    } else {
      r = a;
      LogSm<double>::join(r, LogSm<double>::identity());
    }
    EXPECT_EQ(r.s.m, a.s.m);
    EXPECT_EQ(r.s.d, a.s.d);
    for (int k = 0; k < LD; ++k) {
      EXPECT_EQ(r.o[k], a.o[k]);
      EXPECT_EQ(r.ysum[k], a.ysum[k]);
    }
  }
  auto e = LogSm<double>::identity();
  LogSm<double>::join(e, LogSm<double>::identity());
  EXPECT_EQ(e.s.d, 0.0);
  EXPECT_EQ(LogSm<double>::lse(e), -std::numeric_limits<double>::infinity());
}

// kfa::Reducer over any combiner in a parallel_reduce on the host: log-softmax and softmax (its
// (m, l) merged with O~ by kfa::combine_into) against the direct double computation.
TEST(CombinerReducer, ParallelReduceEqualsDirect) {
  const int n = 5000;
  std::mt19937_64 gen(37);
  std::uniform_real_distribution<double> score(-300, 20), val(-1, 1);
  std::vector<double> x(n), y(std::size_t(n) * LD);
  for (auto& v : x)
    v = score(gen);
  for (auto& v : y)
    v = val(gen);
  using Host = Kokkos::DefaultHostExecutionSpace;
  LogSm<double>::state_type got;
  Kokkos::parallel_reduce(
      "kfa::test::log_softmax_reduce", Kokkos::RangePolicy<Host>(0, n),
      [&](int j, LogSm<double>::state_type& acc) {
        LogSm<double>::join(acc, LogSm<double>::single(x[std::size_t(j)], &y[std::size_t(j) * LD]));
      },
      kfa::Reducer<LogSm<double>>(got));
  const LogSoftmaxDirect want = log_softmax_direct(x, y);
  EXPECT_NEAR(LogSm<double>::lse(got), want.lse, 1e-13 * std::fabs(want.lse));
  for (int k = 0; k < LD; ++k)
    EXPECT_NEAR(got.o[k], want.o[k], 1e-12 * std::max(1.0, std::fabs(want.o[k])));

  using Sm = kfa::combiners::Softmax<double, LD>;
  Sm::state_type sm;
  Kokkos::parallel_reduce(
      "kfa::test::softmax_reduce", Kokkos::RangePolicy<Host>(0, n),
      [&](int j, Sm::state_type& acc) {
        Sm::state_type p;
        p.s = {x[std::size_t(j)], 1.0};
        for (int k = 0; k < LD; ++k)
          p.o[k] = y[std::size_t(j) * LD + std::size_t(k)];
        Sm::join(acc, p);
      },
      kfa::Reducer<Sm>(sm));
  EXPECT_NEAR(kfa::lse(sm.s), want.lse, 1e-13 * std::fabs(want.lse));
  const double m = *std::max_element(x.begin(), x.end());
  for (int k = 0; k < LD; ++k) {
    double ok = 0;  // sum_j exp(x_j - m) y_j, directly
    for (int j = 0; j < n; ++j)
      ok += std::exp(x[std::size_t(j)] - m) * y[std::size_t(j) * LD + std::size_t(k)];
    EXPECT_NEAR(sm.o[k] * std::exp(sm.s.m - m), ok, 1e-12 * std::max(1.0, std::fabs(ok)));
  }
}

}  // namespace
