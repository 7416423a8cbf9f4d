// Welford moments (kfa/welford.hpp) against a two-pass computation in double: the identity,
// random merge trees of 1..64 chunks with empty ones, MomentsReducer in parallel_reduce over a
// range and nested in teams on the suite's space, and the float case where E[x^2] - E[x]^2
// cancels (asserted to fail) while Welford holds.
#include <kfa/welford.hpp>

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "category.hpp"

namespace {

using namespace kfa_test;

struct TwoPass {
  double mean = 0, m2 = 0;
};

// Mean, then the sum of squared deviations from it, in double.
TwoPass two_pass(const std::vector<double>& x, std::size_t i0, std::size_t i1) {
  TwoPass r;
  if (i0 >= i1) return r;
  for (std::size_t i = i0; i < i1; ++i)
    r.mean += x[i];
  r.mean /= double(i1 - i0);
  for (std::size_t i = i0; i < i1; ++i)
    r.m2 += (x[i] - r.mean) * (x[i] - r.mean);
  return r;
}

template <class T>
kfa::Moments<T> pushed(const std::vector<double>& x, std::size_t i0, std::size_t i1) {
  kfa::Moments<T> a;
  for (std::size_t i = i0; i < i1; ++i)
    kfa::push(a, T(x[i]));
  return a;
}

double rel(double got, double want) {
  return std::fabs(got - want) / std::fabs(want);
}

TEST(Welford, EmptyIsAnExactIdentity) {
  const std::vector<double> x = {3.5, -1.25, 7.0, 1e3 + 0.1};
  const auto a = pushed<float>(x, 0, x.size());
  const kfa::Moments<float> e;
  for (const auto& r : {kfa::combine(a, e), kfa::combine(e, a)}) {
    EXPECT_EQ(r.n, a.n);
    EXPECT_EQ(r.mean, a.mean);
    EXPECT_EQ(r.m2, a.m2);
  }
  const auto ee = kfa::combine(e, e);
  EXPECT_EQ(ee.n, 0.0f);
  EXPECT_EQ(ee.mean, 0.0f);
  EXPECT_EQ(ee.m2, 0.0f);
  EXPECT_EQ(kfa::combiners::Welford<float>::identity().n, 0.0f);
}

TEST(Welford, VarianceBiasedAndUnbiased) {
  const std::vector<double> x = {1, 2, 3, 4, 10};
  const auto a = pushed<double>(x, 0, x.size());
  const TwoPass t = two_pass(x, 0, x.size());
  EXPECT_NEAR(kfa::variance(a, false), t.m2 / 5, 1e-15 * t.m2);
  EXPECT_NEAR(kfa::variance(a, true), t.m2 / 4, 1e-15 * t.m2);
}

// Splits n elements into k chunks at random cut points (equal cuts make empty chunks), pushes
// each chunk, then merges random neighbours until one partial is left: every grouping of an
// in-order reduction can occur.
template <class T>
void random_trees(double tol_mean, double tol_m2) {
  std::mt19937_64 gen(23);
  for (int trial = 0; trial < 200; ++trial) {
    const int k = 1 + int(gen() % 64);
    const std::size_t n = std::size_t(gen() % 300);
    std::normal_distribution<double> dist(trial % 2 ? 100.0 : -3.0, trial % 3 + 0.5);
    std::vector<double> x(n);
    for (auto& v : x)
      v = dist(gen);
    std::vector<std::size_t> cut(std::size_t(k) + 1, 0);
    for (int c = 1; c < k; ++c)
      cut[std::size_t(c)] = n ? gen() % (n + 1) : 0;
    cut[std::size_t(k)] = n;
    std::sort(cut.begin(), cut.end());
    std::vector<kfa::Moments<T>> parts;
    parts.reserve(std::size_t(k));
    for (int c = 0; c < k; ++c)
      parts.push_back(pushed<T>(x, cut[std::size_t(c)], cut[std::size_t(c) + 1]));
    while (parts.size() > 1) {
      const std::size_t i = gen() % (parts.size() - 1);
      kfa::combiners::Welford<T>::join(parts[i], parts[i + 1]);
      parts.erase(parts.begin() + std::ptrdiff_t(i) + 1);
    }
    const TwoPass t = two_pass(x, 0, n);
    const auto& r = parts[0];
    SCOPED_TRACE("trial " + std::to_string(trial) + " k=" + std::to_string(k) +
                 " n=" + std::to_string(n));
    ASSERT_EQ(double(r.n), double(n));
    if (n == 0) {
      EXPECT_EQ(r.mean, T(0));
      EXPECT_EQ(r.m2, T(0));
      continue;
    }
    EXPECT_LE(std::fabs(double(r.mean) - t.mean), tol_mean * std::max(1.0, std::fabs(t.mean)));
    if (n > 1) {
      EXPECT_LE(rel(double(r.m2), t.m2), tol_m2);
    }
  }
}

TEST(Welford, RandomTreesDouble) {
  random_trees<double>(1e-14, 1e-12);
}
TEST(Welford, RandomTreesFloat) {
  random_trees<float>(1e-6, 1e-4);
}

std::vector<double> normal(std::size_t n, double mean, double sd, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(mean, sd);
  std::vector<double> x(n);
  for (auto& v : x)
    v = dist(gen);
  return x;
}

// Rows of D = 512 floats with mean 1e3 and std 1 (20 seeds): E[x^2] - E[x]^2 in float loses the
// variance to cancellation (its median relative error over the seeds is asserted above 1e-2);
// Welford keeps every row within 1e-4 (1e-3 at mean 1e4, where float's ulp of the mean is 10
// times larger). In double: 1e-12 at mean 1e3, and the error grows with mean / std like float's.
TEST(Welford, FloatCancellationStress) {
  const std::size_t D = 512;
  for (const double mean : {1e3, 1e4}) {
    SCOPED_TRACE("mean " + std::to_string(mean));
    std::vector<double> naive_err;
    double worst = 0, worst64 = 0;
    for (unsigned seed = 0; seed < 20; ++seed) {
      std::vector<double> x = normal(D, mean, 1.0, seed);
      for (auto& v : x)
        v = double(float(v));  // the float row, exactly
      const double var = two_pass(x, 0, D).m2 / double(D);
      float s = 0, s2 = 0;
      for (const double v : x) {
        s += float(v);
        s2 += float(v) * float(v);
      }
      const float naive = s2 / float(D) - (s / float(D)) * (s / float(D));
      naive_err.push_back(rel(naive, var));
      worst = std::max(worst, rel(kfa::variance(pushed<float>(x, 0, D), false), var));
      worst64 = std::max(worst64, rel(kfa::variance(pushed<double>(x, 0, D), false), var));
    }
    std::sort(naive_err.begin(), naive_err.end());
    const double naive_median = naive_err[naive_err.size() / 2];
    std::printf("mean %g: naive float median rel err %.3g; Welford float max %.3g, double %.3g\n",
                mean, naive_median, worst, worst64);
    EXPECT_GT(naive_median, 1e-2);  // the case does stress cancellation
    EXPECT_LE(worst, mean < 5e3 ? 1e-4 : 1e-3);
    EXPECT_LE(worst64, mean < 5e3 ? 1e-12 : 1e-11);
  }
}

using Range = Kokkos::RangePolicy<Exec>;
using Team = Kokkos::TeamPolicy<Exec>;

Kokkos::View<float*, Device> to_space(const std::vector<double>& x) {
  Kokkos::View<float*, Device> v("x", x.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i)
    h(i) = float(x[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<double> as_float(std::vector<double> x) {
  for (auto& v : x)
    v = double(float(v));
  return x;
}

// The kernels of the reducer tests, outside the TEST bodies: nvcc refuses an extended device
// lambda in a function with private access (GoogleTest's TestBody).
kfa::Moments<double> reduce_range(const Kokkos::View<float*, Device>& v) {
  kfa::Moments<double> a;
  Kokkos::parallel_reduce(
      "kfa::test::welford_range", Range(0, v.extent(0)),
      KOKKOS_LAMBDA(std::size_t i, kfa::Moments<double> & acc) { kfa::push(acc, double(v(i))); },
      kfa::MomentsReducer<double>(a));
  return a;
}

void reduce_rows(const Kokkos::View<float*, Device>& v, int rows, int D,
                 const Kokkos::View<double* [3], Device>& team_out,
                 const Kokkos::View<double* [3], Device>& vector_out) {
  // Teams of two threads where the host space has them, so that the reducer joins across
  // threads; the device's own choice elsewhere.
  const Team team_policy =
      host_accessible ? Team(rows, std::min(2, Exec().concurrency())) : Team(rows, Kokkos::AUTO);
  Kokkos::parallel_for(
      "kfa::test::welford_team", team_policy, KOKKOS_LAMBDA(const Team::member_type& t) {
        const int r = t.league_rank();
        kfa::Moments<double> m;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(t, D),
            [&](int j, kfa::Moments<double>& acc) {
              kfa::push(acc, double(v(std::size_t(r) * D + std::size_t(j))));
            },
            kfa::MomentsReducer<double>(m));
        Kokkos::single(Kokkos::PerTeam(t), [&]() {
          team_out(r, 0) = m.n;
          team_out(r, 1) = m.mean;
          team_out(r, 2) = m.m2;
        });
      });
  Kokkos::parallel_for(
      "kfa::test::welford_vector", Team(rows, 1, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team::member_type& t) {
        const int r = t.league_rank();
        kfa::Moments<double> m;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(t, D),
            [&](int j, kfa::Moments<double>& acc) {
              kfa::push(acc, double(v(std::size_t(r) * D + std::size_t(j))));
            },
            kfa::MomentsReducer<double>(m));
        Kokkos::single(Kokkos::PerThread(t), [&]() {
          vector_out(r, 0) = m.n;
          vector_out(r, 1) = m.mean;
          vector_out(r, 2) = m.m2;
        });
      });
}

// A parallel_reduce over 1e6 float elements (mean 1e3), accumulated in double so that the bound
// tests the reducer's joins rather than float's rounding.
TEST(Welford, ReducerOverARange) {
  const std::size_t n = 1000000;
  const std::vector<double> x = as_float(normal(n, 1e3, 2.0, 7));
  const kfa::Moments<double> a = reduce_range(to_space(x));
  const TwoPass t = two_pass(x, 0, n);
  EXPECT_EQ(double(a.n), double(n));
  EXPECT_LE(rel(a.mean, t.mean), 1e-13);
  EXPECT_LE(rel(a.m2, t.m2), 1e-10);
}

// One row per team, reduced across the team's threads (TeamThreadRange), and one row per thread
// reduced across its vector lanes (ThreadVectorRange); each row's moments written out.
TEST(Welford, ReducerNestedInTeams) {
  const int rows = 37, D = 513;
  const std::vector<double> x = as_float(normal(std::size_t(rows) * D, -50.0, 3.0, 11));
  Kokkos::View<double*[3], Device> team_out("team_out", rows), vector_out("vector_out", rows);
  reduce_rows(to_space(x), rows, D, team_out, vector_out);
  auto ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), team_out);
  auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), vector_out);
  for (int r = 0; r < rows; ++r) {
    const TwoPass t = two_pass(x, std::size_t(r) * D, std::size_t(r + 1) * D);
    for (const auto& h : {ht, hv}) {
      EXPECT_EQ(h(r, 0), double(D));
      EXPECT_LE(rel(h(r, 1), t.mean), 1e-14) << "row " << r;
      EXPECT_LE(rel(h(r, 2), t.m2), 1e-12) << "row " << r;
    }
  }
}

}  // namespace
