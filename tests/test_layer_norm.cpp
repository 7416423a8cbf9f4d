// kfa::layer_norm and kfa::layer_norm_backward on the suite's space against the float64
// reference (kfa::reference::layer_norm: two passes and the textbook chain rule), against
// central finite differences of the kernel's own forward, the float rule, the float
// cancellation case, bitwise repeatability and argument checks.
#include <kfa/layer_norm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using kfa::reference::Tensor1;
using kfa::reference::Tensor2;

template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Device>;
template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Device>;  // the host tensors' layout
template <class T>
using Stat = kfa::backends::accum_t<T>;

Tensor2 random2(const char* label, int rows, int D, std::mt19937_64& gen, double mean, double amp) {
  Tensor2 t(std::string(label), rows, D);
  std::uniform_real_distribution<double> dist(mean - amp, mean + amp);
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = dist(gen);
  return t;
}

Tensor1 random1(const char* label, int D, std::mt19937_64& gen, double mean, double amp) {
  Tensor1 t(std::string(label), D);
  std::uniform_real_distribution<double> dist(mean - amp, mean + amp);
  for (int j = 0; j < D; ++j)
    t(j) = dist(gen);
  return t;
}

// Rounds a host tensor to T in place, so that the kernel in T and the references see the same
// inputs.
template <class T, class V>
void round_in_place(const V& t) {
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = double(T(t.data()[e]));
}

template <class T, class V>
auto dev(const V& src) {
  using Out = std::conditional_t<V::rank == 2, View2<T>, View1<T>>;
  Out d(Kokkos::view_alloc(std::string("kfa_test::ln")), src.layout());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t e = 0; e < src.span(); ++e)
    h.data()[e] = static_cast<T>(src.data()[e]);
  Kokkos::deep_copy(d, h);
  return d;
}

struct LnCase {
  int rows = 3, D = 8;
  bool residual = false, unbiased = false;
  double mean = 0, eps = 1e-5;
};

std::string describe(const LnCase& c) {
  return "rows=" + std::to_string(c.rows) + " D=" + std::to_string(c.D) +
         " residual=" + std::to_string(c.residual) + " unbiased=" + std::to_string(c.unbiased) +
         " mean=" + std::to_string(c.mean);
}

struct LnInputs {
  Tensor2 x, res, dy;
  Tensor1 gamma, beta;
};

template <class T>
LnInputs inputs(const LnCase& c, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  LnInputs in;
  in.x = random2("x", c.rows, c.D, gen, c.mean, 1.0);
  if (c.residual) in.res = random2("res", c.rows, c.D, gen, 0.0, 1.0);
  in.dy = random2("dy", c.rows, c.D, gen, 0.0, 1.0);
  in.gamma = random1("gamma", c.D, gen, 1.0, 0.5);
  in.beta = random1("beta", c.D, gen, 0.0, 0.5);
  for (const Tensor2& t : {in.x, in.res, in.dy})
    round_in_place<T>(t);
  for (const Tensor1& t : {in.gamma, in.beta})
    round_in_place<T>(t);
  return in;
}

struct LnOut {
  Tensor2 y, dz;
  Tensor1 mean, rstd, dgamma, dbeta;
};

// Runs the forward and the backward in T with every output poisoned beforehand.
template <class T>
LnOut run(const LnInputs& in, const kfa::LayerNormParams& p) {
  const int rows = in.x.extent(0), D = in.x.extent(1);
  auto x = dev<T>(in.x), dy = dev<T>(in.dy);
  View2<T> res = in.res.span() > 0 ? dev<T>(in.res) : View2<T>();
  auto gamma = dev<T>(in.gamma), beta = dev<T>(in.beta);
  View2<T> y("y", rows, D), dz("dz", rows, D);
  View1<Stat<T>> mean("mean", rows), rstd("rstd", rows);
  View1<T> dgamma("dgamma", D), dbeta("dbeta", D);
  for (const auto& v : {y, dz})
    Kokkos::deep_copy(v, quiet_nan<T>());
  for (const auto& v : {dgamma, dbeta})
    Kokkos::deep_copy(v, quiet_nan<T>());
  for (const auto& v : {mean, rstd})
    Kokkos::deep_copy(v, quiet_nan<Stat<T>>());
  kfa::layer_norm(Exec(), x, res, gamma, beta, y, mean, rstd, p);
  kfa::layer_norm_backward(Exec(), x, res, gamma, mean, rstd, dy, dz, dgamma, dbeta, p);
  Kokkos::fence();
  return {to_host<Tensor2>(y, "y"),           to_host<Tensor2>(dz, "dz"),
          to_host<Tensor1>(mean, "mean"),     to_host<Tensor1>(rstd, "rstd"),
          to_host<Tensor1>(dgamma, "dgamma"), to_host<Tensor1>(dbeta, "dbeta")};
}

// The references in precision T_ (double: the oracle).
template <class T_>
LnOut reference(const LnInputs& in, const kfa::LayerNormParams& p) {
  const int rows = in.x.extent(0), D = in.x.extent(1);
  LnOut r{Tensor2("y", rows, D), Tensor2("dz", rows, D), Tensor1("mean", rows),
          Tensor1("rstd", rows), Tensor1("dgamma", D),   Tensor1("dbeta", D)};
  kfa::reference::layer_norm<T_>(in.x, in.res, in.gamma, in.beta, p.eps, p.unbiased, r.y, r.mean,
                                 r.rstd);
  kfa::reference::layer_norm_backward<T_>(in.x, in.res, in.gamma, p.eps, p.unbiased, in.dy, r.dz,
                                          r.dgamma, r.dbeta);
  return r;
}

// The project's rule on every output: 1e-12 relative in double; float and 16-bit against the
// same naive computation in T (factor 2, the reference's).
template <class T>
double check(const LnCase& c, std::uint64_t seed) {
  SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
  kfa::LayerNormParams p;
  p.eps = c.eps;
  p.unbiased = c.unbiased;
  const LnInputs in = inputs<T>(c, seed);
  const LnOut got = run<T>(in, p), ref = reference<double>(in, p);
  LnOut naive = ref;
  if (!std::is_same_v<T, double>) naive = reference<T>(in, p);
  using kfa::reference::apply_rule;
  const auto rules = {std::make_pair("y", apply_rule<T>(got.y, naive.y, ref.y)),
                      std::make_pair("mean", apply_rule<T>(got.mean, naive.mean, ref.mean)),
                      std::make_pair("rstd", apply_rule<T>(got.rstd, naive.rstd, ref.rstd)),
                      std::make_pair("dz", apply_rule<T>(got.dz, naive.dz, ref.dz)),
                      std::make_pair("dgamma", apply_rule<T>(got.dgamma, naive.dgamma, ref.dgamma)),
                      std::make_pair("dbeta", apply_rule<T>(got.dbeta, naive.dbeta, ref.dbeta))};
  double worst = 0;  // the largest err / bound, printed by the callers
  for (const auto& [name, r] : rules) {
    EXPECT_TRUE(r.ok()) << name << ": err " << r.err << " naive " << r.naive_err << " bound "
                        << r.bound;
    worst = std::max(worst, r.err / r.bound);
  }
  return worst;
}

std::vector<LnCase> cases() {
  std::vector<LnCase> out;
  for (const int D : {2, 64, 512, 768, 1000, 4096})
    for (const bool res : {false, true})
      for (const bool unb : {false, true}) {
        LnCase c;
        c.D = D;
        c.rows = D >= 4096 ? 3 : D >= 512 ? 9 : 37;
        c.residual = res;
        c.unbiased = unb;
        c.mean = D == 64 ? 0.0 : 1e3;
        out.push_back(c);
      }
  return out;
}

TEST(LayerNorm, AgainstReferenceDouble) {
  std::uint64_t seed = 100;
  double worst = 0;
  for (const LnCase& c : cases())
    worst = std::max(worst, check<double>(c, seed++));
  std::printf("double: largest error / bound %.3g\n", worst);
}

TEST(LayerNorm, AgainstReferenceFloat) {
  std::uint64_t seed = 200;
  double worst = 0;
  for (const LnCase& c : cases())
    worst = std::max(worst, check<float>(c, seed++));
  std::printf("float: largest error / bound %.3g\n", worst);
}

TEST(LayerNorm, SixteenBit) {
  LnCase c;
  c.rows = 17;
  c.D = 100;
  c.residual = true;
  std::printf("bf16: largest error / bound %.3g\n", check<kfa::bf16>(c, 300));
  std::printf("half: largest error / bound %.3g\n", check<kfa::half>(c, 301));
}

// dz, dgamma, dbeta (and dL/dresidual = dz) against central differences of
// L = sum(dy o y(x, residual, gamma, beta)) evaluated by the kernel's forward in double.
TEST(LayerNorm, BackwardAgainstFiniteDifferences) {
  for (const bool unbiased : {false, true}) {
    LnCase c;
    c.rows = 3;
    c.D = 6;
    c.residual = true;
    c.unbiased = unbiased;
    c.mean = 2.0;
    SCOPED_TRACE(describe(c));
    kfa::LayerNormParams p;
    p.unbiased = unbiased;
    const LnInputs in = inputs<double>(c, 400 + unsigned(unbiased));
    const LnOut got = run<double>(in, p);
    const auto loss = [&](const LnInputs& v) {
      const LnOut o = run<double>(v, p);
      double l = 0;
      for (std::size_t e = 0; e < o.y.span(); ++e)
        l += v.dy.data()[e] * o.y.data()[e];
      return l;
    };
    const double h = 1e-5;
    // Perturbs element e of one input tensor and returns the central difference.
    const auto fd = [&](auto member, std::size_t e) {
      LnInputs plus = in, minus = in;
      auto tp = Kokkos::create_mirror(in.*member), tm = Kokkos::create_mirror(in.*member);
      Kokkos::deep_copy(tp, in.*member);
      Kokkos::deep_copy(tm, in.*member);
      tp.data()[e] += h;
      tm.data()[e] -= h;
      plus.*member = tp;
      minus.*member = tm;
      return (loss(plus) - loss(minus)) / (2 * h);
    };
    for (std::size_t e = 0; e < in.x.span(); ++e) {
      const double want = got.dz.data()[e];
      EXPECT_NEAR(fd(&LnInputs::x, e), want, 1e-7 * std::max(1.0, std::fabs(want))) << "dx " << e;
      EXPECT_NEAR(fd(&LnInputs::res, e), want, 1e-7 * std::max(1.0, std::fabs(want)))
          << "dresidual " << e;
    }
    for (std::size_t j = 0; j < std::size_t(c.D); ++j) {
      EXPECT_NEAR(fd(&LnInputs::gamma, j), got.dgamma(j),
                  1e-7 * std::max(1.0, std::fabs(got.dgamma(j))))
          << "dgamma " << j;
      EXPECT_NEAR(fd(&LnInputs::beta, j), got.dbeta(j),
                  1e-7 * std::max(1.0, std::fabs(got.dbeta(j))))
          << "dbeta " << j;
    }
  }
}

// Rows of D = 512 floats with mean 1e3 and std 1: the kernel's float rstd stays within 1e-4
// of the double one (Welford; E[z^2] - E[z]^2 in float errs by percents here, test_welford).
TEST(LayerNorm, FloatCancellationStress) {
  const int rows = 16, D = 512;
  std::mt19937_64 gen(500);
  std::normal_distribution<double> dist(1e3, 1.0);
  LnInputs in;
  in.x = Tensor2("x", rows, D);
  for (std::size_t e = 0; e < in.x.span(); ++e)
    in.x.data()[e] = double(float(dist(gen)));
  in.dy = Tensor2("dy", rows, D);
  in.gamma = Tensor1("gamma", D);
  in.beta = Tensor1("beta", D);
  Kokkos::deep_copy(in.gamma, 1.0);
  kfa::LayerNormParams p;
  p.eps = 0;
  const LnOut got = run<float>(in, p), ref = reference<double>(in, p);
  double worst = 0;
  for (int r = 0; r < rows; ++r)
    worst = std::max(worst, std::fabs(got.rstd(r) - ref.rstd(r)) / ref.rstd(r));
  std::printf("float layer norm at mean 1e3, std 1, D = 512: rstd relative error %.3g\n", worst);
  EXPECT_LE(worst, 1e-4);
}

// Two runs of the forward and the backward give bitwise equal outputs (the column sums have a
// fixed order; the row reductions a fixed team shape).
TEST(LayerNorm, BitwiseRepeatable) {
  LnCase c;
  c.rows = 300;
  c.D = 257;
  c.residual = true;
  c.mean = 10;
  const LnInputs in = inputs<float>(c, 600);
  const LnOut a = run<float>(in, {}), b = run<float>(in, {});
  const auto same = [](const auto& u, const auto& v) {
    for (std::size_t e = 0; e < u.span(); ++e)
      if (!(u.data()[e] == v.data()[e])) return false;
    return true;
  };
  EXPECT_TRUE(same(a.y, b.y) && same(a.mean, b.mean) && same(a.rstd, b.rstd));
  EXPECT_TRUE(same(a.dz, b.dz) && same(a.dgamma, b.dgamma) && same(a.dbeta, b.dbeta));
}

// (B, L, D) tensors: the same numbers as the (B L, D) call (to rounding: the compiler may
// contract the two instantiations' products into fused multiply-adds differently).
TEST(LayerNorm, RankThreeEqualsRankTwo) {
  const int B = 2, L = 5, D = 33;
  LnCase c;
  c.rows = B * L;
  c.D = D;
  c.residual = true;
  const LnInputs in = inputs<double>(c, 700);
  const LnOut two = run<double>(in, {});
  using V3 = Kokkos::View<double***, Kokkos::LayoutRight, Device>;
  const auto as3 = [&](const Tensor2& t) {
    V3 v("v3", B, L, D);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t e = 0; e < t.span(); ++e)
      h.data()[e] = t.data()[e];
    Kokkos::deep_copy(v, h);
    return v;
  };
  V3 x = as3(in.x), res = as3(in.res), dy = as3(in.dy), y("y", B, L, D), dz("dz", B, L, D);
  auto gamma = dev<double>(in.gamma), beta = dev<double>(in.beta);
  const std::size_t rows = std::size_t(B) * std::size_t(L);
  View1<double> mean("mean", rows), rstd("rstd", rows), dgamma("dgamma", D), dbeta("dbeta", D);
  kfa::layer_norm(Exec(), x, res, gamma, beta, y, mean, rstd);
  kfa::layer_norm_backward(Exec(), x, res, gamma, mean, rstd, dy, dz, dgamma, dbeta);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto hdz = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dz);
  auto hdg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dgamma);
  for (std::size_t e = 0; e < two.y.span(); ++e) {
    EXPECT_NEAR(hy.data()[e], two.y.data()[e], 1e-14);
    EXPECT_NEAR(hdz.data()[e], two.dz.data()[e], 1e-14);
  }
  for (int j = 0; j < D; ++j)
    EXPECT_NEAR(hdg(j), two.dgamma(j), 1e-13);
}

template <class F>
void expect_error(const F& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no kfa::Error";
  } catch (const kfa::Error& e) {
    for (const auto& s : parts)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << " lacks " << s;
  }
}

TEST(LayerNorm, Validation) {
  const int rows = 4, D = 6;
  View2<float> x("x", rows, D), y("y", rows, D), bad("bad", rows, D + 1), none;
  View1<float> gamma("gamma", D), beta("beta", D), short_beta("beta", D - 1);
  View1<float> mean("mean", rows), rstd("rstd", rows), short_mean("mean", rows - 1);
  expect_error([&] { kfa::layer_norm(Exec(), x, none, gamma, short_beta, y, mean, rstd); },
               {"beta", "(5)", "(4, 6)"});
  expect_error([&] { kfa::layer_norm(Exec(), x, bad, gamma, beta, y, mean, rstd); },
               {"residual", "(4, 7)", "(4, 6)"});
  expect_error([&] { kfa::layer_norm(Exec(), x, none, gamma, beta, bad, mean, rstd); },
               {"y", "(4, 7)", "(4, 6)"});
  expect_error([&] { kfa::layer_norm(Exec(), x, none, gamma, beta, y, short_mean, rstd); },
               {"mean", "(3)", "rows"});
  kfa::LayerNormParams p;
  p.eps = -1;
  expect_error([&] { kfa::layer_norm(Exec(), x, none, gamma, beta, y, mean, rstd, p); }, {"eps"});
  p.eps = std::nan("");
  expect_error([&] { kfa::layer_norm(Exec(), x, none, gamma, beta, y, mean, rstd, p); }, {"eps"});
  View2<float> x1("x1", rows, 1), y1("y1", rows, 1);
  View1<float> g1("g1", 1);
  p = {};
  p.unbiased = true;
  expect_error([&] { kfa::layer_norm(Exec(), x1, none, g1, g1, y1, mean, rstd, p); },
               {"unbiased", "D >= 2"});
  View2<float> x0("x0", rows, 0);
  View1<float> g0("g0", 0);
  expect_error([&] { kfa::layer_norm(Exec(), x0, none, g0, g0, x0, mean, rstd); }, {"D", ">= 1"});
  View2<float> dz("dz", rows, D);
  View1<float> dgamma("dgamma", D), short_dbeta("dbeta", D - 1);
  expect_error(
      [&] {
        kfa::layer_norm_backward(Exec(), x, none, gamma, mean, rstd, bad, dz, dgamma, short_dbeta);
      },
      {"dy", "(4, 7)"});
  expect_error(
      [&] {
        kfa::layer_norm_backward(Exec(), x, none, gamma, mean, rstd, y, dz, dgamma, short_dbeta);
      },
      {"dbeta", "(5)"});
}

}  // namespace
