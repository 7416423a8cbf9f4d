// kfa::nn on the suite's space: the multi-head attention block (mha_forward, mha_backward) and
// the FFN against the float64 reference of the whole block (kfa/mha_reference.hpp: plain
// loops for the linears, kfa::reference's attention and layer norm, no code shared with the
// kernels or KokkosBlas), under the project's rule; central finite differences of the
// block's own forward for a few weight gradients; bias gradients bitwise repeatable; argument
// checks.
#include <kfa/mha.hpp>
#include <kfa/mha_reference.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using kfa::reference::Tensor1;
using kfa::reference::Tensor2;

Tensor2 random2(const char* label, int rows, int cols, std::mt19937_64& gen, double mean,
                double amp) {
  Tensor2 t(std::string(label), rows, cols);
  std::uniform_real_distribution<double> dist(mean - amp, mean + amp);
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = dist(gen);
  return t;
}

Tensor1 random1(const char* label, int n, std::mt19937_64& gen, double mean, double amp) {
  Tensor1 t(std::string(label), n);
  std::uniform_real_distribution<double> dist(mean - amp, mean + amp);
  for (int j = 0; j < n; ++j)
    t(j) = dist(gen);
  return t;
}

// Rounds a host tensor to T in place, so that the kernels in T and the references see the
// same inputs.
template <class T, class V>
void round_in_place(const V& t) {
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = double(T(t.data()[e]));
}

struct MhaCase {
  int B = 1, L = 17, d_model = 64;
  kfa::nn::MhaParams p;
};

std::string describe(const MhaCase& c) {
  return "B=" + std::to_string(c.B) + " L=" + std::to_string(c.L) +
         " d_model=" + std::to_string(c.d_model) + " Hq=" + std::to_string(c.p.heads_q) +
         " Hkv=" + std::to_string(c.p.heads_kv) +
         " causal=" + std::to_string(c.p.attention.causal) +
         " dropout=" + std::to_string(c.p.attention.dropout) +
         " ln=" + std::to_string(c.p.residual_layer_norm) +
         " qkv_bias=" + std::to_string(c.p.qkv_bias) + " out_bias=" + std::to_string(c.p.out_bias);
}

// The block's inputs and results as host matrices (kfa/mha_reference.hpp).
using MhaInputs = kfa::reference::MhaTensors;
using MhaOut = kfa::reference::MhaResult;

template <class T>
MhaInputs mha_inputs(const MhaCase& c, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  const int rows = c.B * c.L, d = c.d_model, hd = d / c.p.heads_q;
  const int width = (c.p.heads_q + 2 * c.p.heads_kv) * hd;
  const double amp = 1 / std::sqrt(double(d));  // keeps the projections of order 1
  MhaInputs in;
  in.x = random2("x", rows, d, gen, 0.0, 1.0);
  in.dy = random2("dy", rows, d, gen, 0.0, 1.0);
  in.w_qkv = random2("w_qkv", d, width, gen, 0.0, 2 * amp);
  in.w_o = random2("w_o", c.p.heads_q * hd, d, gen, 0.0, 2 * amp);
  if (c.p.qkv_bias) in.b_qkv = random1("b_qkv", width, gen, 0.0, 0.5);
  if (c.p.out_bias) in.b_o = random1("b_o", d, gen, 0.0, 0.5);
  if (c.p.residual_layer_norm) {
    in.gamma = random1("gamma", d, gen, 1.0, 0.5);
    in.beta = random1("beta", d, gen, 0.0, 0.5);
  }
  for (const Tensor2& t : {in.x, in.dy, in.w_qkv, in.w_o})
    round_in_place<T>(t);
  for (const Tensor1& t : {in.b_qkv, in.b_o, in.gamma, in.beta})
    round_in_place<T>(t);
  return in;
}

kfa::reference::MhaSpec spec_of(const MhaCase& c) {
  kfa::reference::MhaSpec s;
  s.batch = c.B;
  s.seqlen = c.L;
  s.heads_q = c.p.heads_q;
  s.heads_kv = c.p.heads_kv;
  s.attention = c.p.attention;
  s.residual_layer_norm = c.p.residual_layer_norm;
  s.eps = c.p.ln.eps;
  s.unbiased = c.p.ln.unbiased;
  return s;
}

// ---- The block on the suite's space ----

template <class T>
using Weights = kfa::nn::MhaWeights<T, Memory>;
template <class T>
using Rows3 = Kokkos::View<T***, Kokkos::LayoutRight, Device>;

// A host (rows, cols) or (n) tensor copied into a device view of T of the same span.
template <class Dst, class Src>
void upload(const Dst& dst, const Src& src) {
  ASSERT_EQ(dst.span(), src.span());
  auto h = Kokkos::create_mirror_view(dst);
  for (std::size_t e = 0; e < src.span(); ++e)
    h.data()[e] = static_cast<typename Dst::non_const_value_type>(src.data()[e]);
  Kokkos::deep_copy(dst, h);
}

// A device view back as a host double tensor of `rows` x (span / rows) (rank 2) or (n).
template <class HostDouble, class Dev>
HostDouble download(const Dev& dev, std::size_t rows, std::size_t cols = 0) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dev);
  HostDouble out;
  if constexpr (HostDouble::rank == 2)
    out = HostDouble("out", rows, cols);
  else
    out = HostDouble("out", rows);
  for (std::size_t e = 0; e < out.span(); ++e)
    out.data()[e] = static_cast<double>(h.data()[e]);
  return out;
}

template <class T>
Weights<T> upload_weights(const MhaCase& c, const MhaInputs& in) {
  Weights<T> w("w", c.d_model, c.p);
  upload(w.w_qkv, in.w_qkv);
  upload(w.w_o, in.w_o);
  if (c.p.qkv_bias) upload(w.b_qkv, in.b_qkv);
  if (c.p.out_bias) upload(w.b_o, in.b_o);
  if (c.p.residual_layer_norm) {
    upload(w.gamma, in.gamma);
    upload(w.beta, in.beta);
  }
  return w;
}

// The block forward and backward in T, every output poisoned beforehand.
template <class T>
MhaOut mha_run(const MhaCase& c, const MhaInputs& in) {
  const int rows = c.B * c.L, d = c.d_model;
  Rows3<T> x("x", c.B, c.L, d), dy("dy", c.B, c.L, d), y("y", c.B, c.L, d), dx("dx", c.B, c.L, d);
  upload(x, in.x);
  upload(dy, in.dy);
  const Weights<T> w = upload_weights<T>(c, in);
  Weights<T> g("g", d, c.p);
  for (const auto& v : {y, dx})
    Kokkos::deep_copy(v, quiet_nan<T>());
  for (const auto& v : {g.w_qkv, g.w_o})
    Kokkos::deep_copy(v, quiet_nan<T>());
  for (const auto& v : {g.b_qkv, g.b_o, g.gamma, g.beta})
    Kokkos::deep_copy(v, quiet_nan<T>());
  kfa::nn::MhaSaved<T, Memory> saved;
  kfa::nn::mha_forward(Exec(), x, w, y, saved, c.p);
  kfa::nn::mha_backward(Exec(), x, w, saved, dy, dx, g, c.p);
  Kokkos::fence();
  MhaOut r;
  r.y = download<Tensor2>(y, rows, d);
  r.dx = download<Tensor2>(dx, rows, d);
  r.dw_qkv = download<Tensor2>(g.w_qkv, g.w_qkv.extent(0), g.w_qkv.extent(1));
  r.dw_o = download<Tensor2>(g.w_o, g.w_o.extent(0), g.w_o.extent(1));
  if (c.p.qkv_bias) r.db_qkv = download<Tensor1>(g.b_qkv, g.b_qkv.extent(0));
  if (c.p.out_bias) r.db_o = download<Tensor1>(g.b_o, d);
  if (c.p.residual_layer_norm) {
    r.dgamma = download<Tensor1>(g.gamma, d);
    r.dbeta = download<Tensor1>(g.beta, d);
  }
  return r;
}

Keep4 block_keep(const MhaCase& c) {
  Shape s;
  s.batch = c.B;
  s.heads_q = c.p.heads_q;
  s.heads_k = c.p.heads_kv;
  s.seqlen_q = s.seqlen_k = c.L;
  s.head_dim = c.d_model / c.p.heads_q;
  return keep_mask(s, c.p.attention);
}

// The project's rule on y and every gradient; returns the largest err / bound.
template <class T>
double check_mha(const MhaCase& c, std::uint64_t seed) {
  SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
  const MhaInputs in = mha_inputs<T>(c, seed);
  const Keep4 keep = block_keep(c);
  const MhaOut got = mha_run<T>(c, in);
  const auto rules = kfa::reference::mha_check<T>(spec_of(c), in, got, keep);
  EXPECT_EQ(rules.size(), 4u + (c.p.qkv_bias ? 1 : 0) + (c.p.out_bias ? 1 : 0) +
                              (c.p.residual_layer_norm ? 2 : 0));
  double worst = 0;
  for (const auto& [name, r] : rules) {
    EXPECT_TRUE(r.ok()) << name << ": err " << r.err << " naive " << r.naive_err << " bound "
                        << r.bound;
    worst = std::max(worst, r.err / r.bound);
  }
  return worst;
}

// B in {1, 2}, L in {1, 17, 64}, d_model in {64, 128}, (Hq, Hkv) in {(1, 1), (4, 4), (4, 2),
// (4, 1)}, causal on and off, the residual layer norm on and off; the biases off in some
// cases, dropout 0.2 in some.
std::vector<MhaCase> mha_cases() {
  std::vector<MhaCase> out;
  int n = 0;
  for (const int B : {1, 2})
    for (const int L : {1, 17, 64})
      for (const int d : {64, 128})
        for (const auto& [hq, hkv] : {std::pair{1, 1}, {4, 4}, {4, 2}, {4, 1}})
          for (const bool causal : {false, true})
            for (const bool ln : {false, true}) {
              MhaCase c;
              c.B = B;
              c.L = L;
              c.d_model = d;
              c.p.heads_q = hq;
              c.p.heads_kv = hkv;
              c.p.attention.causal = causal;
              c.p.residual_layer_norm = ln;
              c.p.qkv_bias = n % 5 != 1;
              c.p.out_bias = n % 7 != 2;
              if (n % 6 == 3) {
                c.p.attention.dropout = 0.2;
                c.p.attention.seed = 1234 + n;
              }
              ++n;
              out.push_back(c);
            }
  return out;
}

TEST(Mha, AgainstReferenceDouble) {
  std::uint64_t seed = 300;
  double worst = 0;
  for (const MhaCase& c : mha_cases())
    worst = std::max(worst, check_mha<double>(c, seed++));
  std::printf("double: largest error / bound %.3g\n", worst);
}

TEST(Mha, AgainstReferenceFloat) {
  std::uint64_t seed = 600;
  double worst = 0;
  for (const MhaCase& c : mha_cases())
    worst = std::max(worst, check_mha<float>(c, seed++));
  std::printf("float: largest error / bound %.3g\n", worst);
}

// Central differences of the block's own forward, loss = sum(y o dy), against the gradients
// of a few entries of every weight and of x: checks the chain rule independently of the
// reference.
TEST(Mha, GradientsMatchFiniteDifferences) {
  MhaCase c;
  c.B = 2;
  c.L = 9;
  c.d_model = 32;
  c.p.heads_q = 4;
  c.p.heads_kv = 2;
  c.p.attention.causal = true;
  c.p.residual_layer_norm = true;
  MhaInputs in = mha_inputs<double>(c, 77);  // probed in place
  const MhaOut g = mha_run<double>(c, in);
  const auto loss = [&]() {
    const MhaOut r = mha_run<double>(c, in);
    double s = 0;
    for (std::size_t e = 0; e < r.y.span(); ++e)
      s += r.y.data()[e] * in.dy.data()[e];
    return s;
  };
  const double h = 1e-5;
  double worst = 0;
  const auto probe = [&](const char* name, double* param, double grad) {
    const double keep = *param;
    *param = keep + h;
    const double up = loss();
    *param = keep - h;
    const double down = loss();
    *param = keep;
    const double fd = (up - down) / (2 * h), err = std::fabs(fd - grad);
    EXPECT_LE(err, 1e-7 * std::max(1.0, std::fabs(grad)))
        << name << ": fd " << fd << " grad " << grad;
    worst = std::max(worst, err);
  };
  const int width = in.w_qkv.extent(1);
  for (const int col : {0, width / 3, width / 2 + 1, width - 1})  // a q, k and v column
    for (const int row : {0, 17})
      probe("w_qkv", &in.w_qkv(row, col), g.dw_qkv(row, col));
  for (const int row : {1, 30})
    probe("w_o", &in.w_o(row, 5), g.dw_o(row, 5));
  for (const int j : {2, width - 3})
    probe("b_qkv", &in.b_qkv(j), g.db_qkv(j));
  probe("b_o", &in.b_o(7), g.db_o(7));
  probe("gamma", &in.gamma(3), g.dgamma(3));
  probe("beta", &in.beta(11), g.dbeta(11));
  for (const int r : {0, 12})
    probe("x", &in.x(r, 4), g.dx(r, 4));
  std::printf("largest |fd - grad| %.3g\n", worst);
}

// The weight gradients (bias sums included) are bitwise the same run to run with a
// repeatable dQ.
TEST(Mha, GradientsRepeatBitwise) {
  MhaCase c;
  c.B = 2;
  c.L = 33;
  c.d_model = 64;
  c.p.heads_q = 4;
  c.p.heads_kv = 2;
  c.p.residual_layer_norm = true;
  c.p.attention.deterministic = true;
  const MhaInputs in = mha_inputs<float>(c, 91);
  const MhaOut a = mha_run<float>(c, in);
  for (int run = 0; run < 3; ++run) {
    const MhaOut b = mha_run<float>(c, in);
    for (const auto& [x, y] : {std::pair{a.dw_qkv, b.dw_qkv}, {a.dw_o, b.dw_o}, {a.dx, b.dx}})
      EXPECT_EQ(kfa::reference::max_abs_diff(x, y), 0.0);
    for (const auto& [x, y] : {std::pair{a.db_qkv, b.db_qkv},
                               {a.db_o, b.db_o},
                               {a.dgamma, b.dgamma},
                               {a.dbeta, b.dbeta}})
      EXPECT_EQ(kfa::reference::max_abs_diff(x, y), 0.0);
  }
}

// Bad shapes and head counts: kfa::Error naming what is wrong, before any kernel.
TEST(Mha, RejectsBadArguments) {
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const kfa::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto run = [](int d, const kfa::nn::MhaParams& p, const Weights<double>& w) {
    Rows3<double> x("x", 2, 5, d), y("y", 2, 5, d);
    kfa::nn::MhaSaved<double, Memory> saved;
    kfa::nn::mha_forward(Exec(), x, w, y, saved, p);
  };
  kfa::nn::MhaParams p;
  p.heads_q = 3;
  EXPECT_NE(message([&] {
              run(64, p, Weights<double>("w", 63, p));
            }).find("not divisible by heads_q = 3"),
            std::string::npos);
  p.heads_q = 4;
  p.heads_kv = 3;
  EXPECT_NE(message([&] {
              run(64, p, Weights<double>("w", 64, p));
            }).find("not a multiple of heads_kv = 3"),
            std::string::npos);
  // head_dim 512 and dq_mode symmetric with GQA: refused by the block itself, before the QKV
  // gemm (saved is still unallocated), not later by kfa::forward / kfa::backward.
  {
    kfa::nn::MhaParams big;
    const Weights<double> wb("w", 512, big);
    Rows3<double> x("x", 1, 2, 512), y("y", 1, 2, 512);
    kfa::nn::MhaSaved<double, Memory> saved;
    const std::string mb = message([&] { kfa::nn::mha_forward(Exec(), x, wb, y, saved, big); });
    EXPECT_NE(mb.find("head_dim = d_model / heads_q = 512 / 1 = 512"), std::string::npos) << mb;
    EXPECT_EQ(saved.qkv.size(), 0u);
    kfa::nn::MhaParams sym;
    sym.heads_q = 4;
    sym.heads_kv = 2;
    sym.attention.dq_mode = kfa::DqMode::symmetric;
    const std::string ms = message([&] { run(64, sym, Weights<double>("w", 64, sym)); });
    EXPECT_NE(ms.find("dq_mode symmetric needs heads_q == heads_kv"), std::string::npos) << ms;
  }
  p.heads_kv = 2;
  Weights<double> w("w", 64, p);
  w.w_qkv = Weights<double>::matrix("bad", 64, 100);
  const std::string m = message([&] { run(64, p, w); });
  EXPECT_NE(m.find("w_qkv has shape (64, 100)"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 5, 64)"), std::string::npos) << m;
  EXPECT_NE(m.find("(64, 128)"), std::string::npos) << m;
  Weights<double> w2("w", 64, p);
  w2.w_o = Weights<double>::matrix("bad", 64, 32);
  EXPECT_NE(message([&] { run(64, p, w2); }).find("w_o has shape (64, 32)"), std::string::npos);
  Weights<double> w3("w", 64, p);
  w3.gamma = Weights<double>::vector("unused", 64);  // no residual layer norm asked for
  EXPECT_NE(message([&] { run(64, p, w3); }).find("gamma has shape (64) but is not used"),
            std::string::npos);
  // A saved state from other head counts with the same weight shapes (d_model 12: 2 + 2 x 1
  // heads of 6 and 4 + 2 x 2 heads of 3 both give 24 columns) is refused, not read past.
  kfa::nn::MhaParams p21, p42;
  p21.heads_q = 2;
  p21.heads_kv = 1;
  p42.heads_q = 4;
  p42.heads_kv = 2;
  const Weights<double> w21("w", 12, p21);
  Weights<double> g42("g", 12, p42);
  Rows3<double> x("x", 1, 3, 12), y("y", 1, 3, 12), dy("dy", 1, 3, 12), dx("dx", 1, 3, 12);
  kfa::nn::MhaSaved<double, Memory> saved;
  kfa::nn::mha_forward(Exec(), x, w21, y, saved, p21);
  EXPECT_NE(message([&] {
              kfa::nn::mha_backward(Exec(), x, w21, saved, dy, dx, g42, p42);
            }).find("saved holds"),
            std::string::npos);
}

// ---- The FFN ----

using kfa::reference::mha_detail::colsum;
using kfa::reference::mha_detail::matmul;

struct FfnRef {
  Tensor2 y, dx, dw1, dw2;
  Tensor1 db1, db2;
};

template <class T>
FfnRef ffn_reference(const Tensor2& x, const Tensor2& w1, const Tensor1& b1, const Tensor2& w2,
                     const Tensor1& b2, const Tensor2& dy) {
  FfnRef r;
  const Tensor2 h = matmul<T>(x, false, w1, false, b1);
  Tensor2 a("a", h.extent(0), h.extent(1));
  for (std::size_t e = 0; e < h.span(); ++e)
    a.data()[e] = std::max(0.0, h.data()[e]);
  r.y = matmul<T>(a, false, w2, false, b2);
  r.dw2 = matmul<T>(a, true, dy, false);
  r.db2 = colsum<T>(dy);
  Tensor2 da = matmul<T>(dy, false, w2, true);
  for (std::size_t e = 0; e < h.span(); ++e)
    if (!(h.data()[e] > 0)) da.data()[e] = 0;
  r.dw1 = matmul<T>(x, true, da, false);
  r.db1 = colsum<T>(da);
  r.dx = matmul<T>(da, false, w1, true);
  return r;
}

template <class T>
double check_ffn(int rows, int D, std::uint64_t seed) {
  SCOPED_TRACE("rows=" + std::to_string(rows) + " D=" + std::to_string(D));
  const int F = 4 * D;
  std::mt19937_64 gen(seed);
  const double amp = 1 / std::sqrt(double(D));
  Tensor2 x = random2("x", rows, D, gen, 0, 1), dy = random2("dy", rows, D, gen, 0, 1),
          w1 = random2("w1", D, F, gen, 0, 2 * amp), w2 = random2("w2", F, D, gen, 0, amp);
  Tensor1 b1 = random1("b1", F, gen, 0, 0.5), b2 = random1("b2", D, gen, 0, 0.5);
  for (const Tensor2& t : {x, dy, w1, w2})
    round_in_place<T>(t);
  for (const Tensor1& t : {b1, b2})
    round_in_place<T>(t);
  using M = Kokkos::View<T**, Kokkos::LayoutRight, Device>;
  using V = Kokkos::View<T*, Device>;
  M dx_("x", rows, D), ddy("dy", rows, D), dw1_("w1", D, F), dw2_("w2", F, D), y("y", rows, D),
      h("h", rows, F), gx("gx", rows, D), gw1("gw1", D, F), gw2("gw2", F, D);
  V db1_("b1", F), db2_("b2", D), gb1("gb1", F), gb2("gb2", D);
  upload(dx_, x);
  upload(ddy, dy);
  upload(dw1_, w1);
  upload(dw2_, w2);
  upload(db1_, b1);
  upload(db2_, b2);
  for (const auto& v : {y, h, gx, gw1, gw2})
    Kokkos::deep_copy(v, quiet_nan<T>());
  for (const auto& v : {gb1, gb2})
    Kokkos::deep_copy(v, quiet_nan<T>());
  kfa::nn::ffn_forward(Exec(), dx_, dw1_, db1_, dw2_, db2_, y, h);
  kfa::nn::ffn_backward(Exec(), dx_, dw1_, dw2_, h, ddy, gx, gw1, gb1, gw2, gb2);
  Kokkos::fence();
  const FfnRef ref = ffn_reference<double>(x, w1, b1, w2, b2, dy);
  FfnRef naive = ref;
  if (!std::is_same_v<T, double>) naive = ffn_reference<T>(x, w1, b1, w2, b2, dy);
  using kfa::reference::apply_rule;
  const auto rules = {
      std::make_pair("y", apply_rule<T>(download<Tensor2>(y, rows, D), naive.y, ref.y)),
      std::make_pair("dx", apply_rule<T>(download<Tensor2>(gx, rows, D), naive.dx, ref.dx)),
      std::make_pair("dw1", apply_rule<T>(download<Tensor2>(gw1, D, F), naive.dw1, ref.dw1)),
      std::make_pair("dw2", apply_rule<T>(download<Tensor2>(gw2, F, D), naive.dw2, ref.dw2)),
      std::make_pair("db1", apply_rule<T>(download<Tensor1>(gb1, F), naive.db1, ref.db1)),
      std::make_pair("db2", apply_rule<T>(download<Tensor1>(gb2, D), naive.db2, ref.db2))};
  double worst = 0;
  for (const auto& [name, r] : rules) {
    EXPECT_TRUE(r.ok()) << name << ": err " << r.err << " naive " << r.naive_err << " bound "
                        << r.bound;
    worst = std::max(worst, r.err / r.bound);
  }
  return worst;
}

TEST(Ffn, AgainstReference) {
  double worst_d = 0, worst_f = 0;
  std::uint64_t seed = 900;
  for (const auto& [rows, D] : {std::pair{1, 64}, {37, 64}, {5, 512}}) {
    worst_d = std::max(worst_d, check_ffn<double>(rows, D, seed++));
    worst_f = std::max(worst_f, check_ffn<float>(rows, D, seed++));
  }
  std::printf("largest error / bound: double %.3g, float %.3g\n", worst_d, worst_f);
}

TEST(Ffn, RejectsBadShapes) {
  using M = Kokkos::View<double**, Kokkos::LayoutRight, Device>;
  using V = Kokkos::View<double*, Device>;
  M x("x", 3, 8), w1("w1", 8, 32), w2("w2", 32, 7), y("y", 3, 8), h("h", 3, 32);
  V b1("b1", 32), b2("b2", 8);
  try {
    kfa::nn::ffn_forward(Exec(), x, w1, b1, w2, b2, y, h);
    ADD_FAILURE() << "no error";
  } catch (const kfa::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("w2 has shape (32, 7)"), std::string::npos) << m;
    EXPECT_NE(m.find("(3, 8)"), std::string::npos) << m;
  }
}

}  // namespace
