// Checks the oracle itself, on tiny sizes, against things it did not compute: central finite
// differences of its LSE, closed forms, and the mask definitions written out by hand.
#include <kfa/dropout.hpp>
#include <kfa/flops.hpp>
#include <kfa/reference.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

// d LSE_i / d q_i = scale * sum_j P_ij k_j, which is the reference's own O computed with V := K.
// A finite-difference derivative of its LSE therefore checks its softmax weights and its P V.
TEST(Reference, LseGradientMatchesFiniteDifferences) {
  for (bool causal : {false, true}) {
    kfa::Params p;
    p.causal = causal;
    p.softcap = 0;
    Problem pb({1, 2, 1, 5, 7, 6}, 1234);
    const double scale = 1.0 / std::sqrt(6.0);
    Tensor4 o("o", 1, 2, 5, 6);
    Tensor3 lse("lse", 1, 2, 5);
    ref::forward<double>(pb.q, pb.k, pb.k, p, o, lse);  // O with V = K
    const double h = 1e-5;
    for (int hq = 0; hq < 2; ++hq)
      for (int i = 0; i < 5; ++i)
        for (int d = 0; d < 6; ++d) {
          Tensor4 o2("o2", 1, 2, 5, 6);
          Tensor3 lp("lp", 1, 2, 5), lm("lm", 1, 2, 5);
          const double q0 = pb.q(0, hq, i, d);
          pb.q(0, hq, i, d) = q0 + h;
          ref::forward<double>(pb.q, pb.k, pb.v, p, o2, lp);
          pb.q(0, hq, i, d) = q0 - h;
          ref::forward<double>(pb.q, pb.k, pb.v, p, o2, lm);
          pb.q(0, hq, i, d) = q0;
          const double fd = (lp(0, hq, i) - lm(0, hq, i)) / (2 * h);
          EXPECT_NEAR(fd, scale * o(0, hq, i, d), 1e-8) << "causal=" << causal << " i=" << i;
        }
  }
}

// The reference gradients against central finite differences of the scalar loss
// L = sum(O * G) + sum(LSE * g), for every element of q, k and v, with masks, softcap and a
// shared kv head (so dK and dV sum over the group).
TEST(Reference, GradientsMatchFiniteDifferences) {
  std::vector<kfa::Params> cases(4);
  cases[1].causal = true;
  cases[1].window_left = 2;
  cases[2].softcap = 0.7;  // tight cap: tanh far from linear
  cases[2].align = kfa::Align::top_left;
  cases[2].causal = true;
  // Dropout: the gradient of O = (softmax(S) * Z) V with Z = keep / (1 - p) for a fixed mask,
  // against differences of the forward with that mask (which shares no code with the
  // backward's dropout terms).
  cases[3].dropout = 0.3;
  cases[3].seed = 5;
  cases[3].offset = 2;
  cases[3].causal = true;
  for (const auto& p : cases) {
    const int B = 1, Hq = 2, Hk = 1, Nq = 4, Nk = 6, D = 3;
    Keep4 keep;
    if (p.dropout > 0) {
      Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Kokkos::HostSpace> mask("keep", B, Hq, Nq,
                                                                                  Nk);
      kfa::dropout_mask(Kokkos::DefaultHostExecutionSpace(), mask, p);
      Kokkos::fence();
      keep = mask;
      int dropped = 0;
      for (std::size_t e = 0; e < mask.span(); ++e)
        dropped += mask.data()[e] == 0;
      ASSERT_GT(dropped, 0) << "a mask that drops nothing checks nothing";
    }
    Problem pb({B, Hq, Hk, Nq, Nk, D}, 99, 2.0);
    std::mt19937_64 gen(100);
    const Tensor4 G = random_tensor("G", B, Hq, Nq, D, gen);
    Tensor3 g(std::string("g"), B, Hq, Nq);
    std::uniform_real_distribution<double> dist(-1, 1);
    for (std::size_t e = 0; e < g.span(); ++e)
      g.data()[e] = dist(gen);
    auto loss = [&]() {
      Tensor4 o(std::string("o"), B, Hq, Nq, D);
      Tensor3 lse(std::string("lse"), B, Hq, Nq);
      ref::forward<double>(pb.q, pb.k, pb.v, p, o, lse, keep);
      double l = 0;
      for (std::size_t e = 0; e < o.span(); ++e)
        l += o.data()[e] * G.data()[e];
      for (std::size_t e = 0; e < lse.span(); ++e)
        l += lse.data()[e] * g.data()[e];
      return l;
    };
    Tensor4 dq(std::string("dq"), B, Hq, Nq, D), dk(std::string("dk"), B, Hk, Nk, D),
        dv(std::string("dv"), B, Hk, Nk, D);
    ref::backward<double>(pb.q, pb.k, pb.v, p, G, g, dq, dk, dv, keep);
    const double h = 1e-6;
    for (const auto& [x, grad] : {std::pair{pb.q, dq}, std::pair{pb.k, dk}, std::pair{pb.v, dv}})
      for (std::size_t e = 0; e < x.span(); ++e) {
        const double x0 = x.data()[e];
        x.data()[e] = x0 + h;
        const double lp = loss();
        x.data()[e] = x0 - h;
        const double lm = loss();
        x.data()[e] = x0;
        EXPECT_NEAR(grad.data()[e], (lp - lm) / (2 * h), 1e-7)
            << x.label() << " element " << e << " " << describe(p);
      }
  }
}

// A multi-scale problem for the finite-difference checks: mask entries in [0, 0.05) on head 0
// (rows with r < 1, the clamp inactive) and in [0, 1) on head 1 (r > 1, clamped), no mask entry
// or score near 0 and no r near 1, so that the loss is smooth within the step.
struct MsaFixture {
  static constexpr int B = 1, Hq = 2, Hk = 1, Nq = 4, Nk = 6, D = 3;
  Problem pb{{B, Hq, Hk, Nq, Nk, D}, 7, 2.0};
  ref::Mask3 mask{std::string("mask"), Hq, Nq, Nk};
  Tensor4 G;
  explicit MsaFixture(std::uint64_t seed = 8) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> dist(0.05, 1);
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < Nq; ++i)
        for (int j = 0; j < Nk; ++j)
          mask(h, i, j) = dist(gen) * (h == 0 ? 0.05 : 1.0);
    G = random_tensor("G", B, Hq, Nq, D, gen);
  }
  // sum(G * O): its gradient is the backward's with dO = G.
  double loss(const kfa::msa::Params& p) const {
    Tensor4 o(std::string("o"), B, Hq, Nq, D);
    Tensor3 r(std::string("r"), B, Hq, Nq);
    ref::msa_forward<double>(pb.q, pb.k, pb.v, mask, p, o, r);
    double l = 0;
    for (std::size_t e = 0; e < o.span(); ++e)
      l += o.data()[e] * G.data()[e];
    return l;
  }
};

TEST(Reference, MultiScaleGradientsMatchFiniteDifferences) {
  std::vector<kfa::msa::Params> cases(3);
  cases[1].causal = true;
  cases[1].scale = 0.7;
  cases[2].causal = true;
  cases[2].window_left = 1;
  cases[2].align = kfa::Align::top_left;
  for (const auto& p : cases) {
    MsaFixture f;
    // The fixture's premises: both regimes of the clamp present, nothing near a kink.
    Tensor4 o(std::string("o"), f.B, f.Hq, f.Nq, f.D);
    Tensor3 r(std::string("r"), f.B, f.Hq, f.Nq);
    ref::msa_forward<double>(f.pb.q, f.pb.k, f.pb.v, f.mask, p, o, r);
    int below = 0, above = 0;
    for (std::size_t e = 0; e < r.span(); ++e) {
      EXPECT_GT(std::fabs(r.data()[e] - 1), 1e-3);
      (r.data()[e] < 1 ? below : above)++;
    }
    EXPECT_GT(below, 0);
    EXPECT_GT(above, 0);
    Tensor4 dq(std::string("dq"), f.B, f.Hq, f.Nq, f.D),
        dk(std::string("dk"), f.B, f.Hk, f.Nk, f.D), dv(std::string("dv"), f.B, f.Hk, f.Nk, f.D);
    ref::msa_backward<double>(f.pb.q, f.pb.k, f.pb.v, f.mask, p, f.G, dq, dk, dv);
    const double h = 1e-6;
    for (const auto& [x, grad] :
         {std::pair{f.pb.q, dq}, std::pair{f.pb.k, dk}, std::pair{f.pb.v, dv}})
      for (std::size_t e = 0; e < x.span(); ++e) {
        const double x0 = x.data()[e];
        x.data()[e] = x0 + h;
        const double lp = f.loss(p);
        x.data()[e] = x0 - h;
        const double lm = f.loss(p);
        x.data()[e] = x0;
        EXPECT_NEAR(grad.data()[e], (lp - lm) / (2 * h), 1e-7) << x.label() << " element " << e;
      }
  }
}

// The multi-scale dS of the design the library was planned from (its eq. 8) keeps only the
// term through the normaliser, dS_ij = -c_i sign(S_ij), and drops the direct term
// (dO_i . v_j) / d_i. Its dQ, written out here, misses finite differences by far more than
// rounding: this test documents the deviation, so that nobody puts the formula back.
TEST(Reference, MultiScaleTruncatedDsIsWrong) {
  MsaFixture f;
  const kfa::msa::Params p;
  const int Nk = f.Nk, D = f.D;
  double worst = 0;
  for (int h = 0; h < f.Hq; ++h)
    for (int i = 0; i < f.Nq; ++i) {
      std::vector<double> t(Nk);
      const double r = ref::msa_row<double>(f.pb.q, f.pb.k, f.mask, p, 0, h, 0, i, t);
      const double dn = std::max(r, 1.0);
      std::vector<double> o(D, 0.0);
      for (int j = 0; j < Nk; ++j)
        for (int d = 0; d < D; ++d)
          o[d] += t[j] / dn * f.pb.v(0, 0, j, d);
      double c = 0;
      for (int d = 0; d < D; ++d)
        c += r >= 1 ? f.G(0, h, i, d) * o[d] / dn : 0.0;
      for (int d = 0; d < D; ++d) {
        double truncated = 0;  // dQ_id = sum_j scale M_ij (-c sign(S_ij)) k_jd
        for (int j = 0; j < Nk; ++j)
          truncated += f.mask(h, i, j) * (-c * (t[j] > 0 ? 1.0 : -1.0)) * f.pb.k(0, 0, j, d);
        const double x0 = f.pb.q(0, h, i, d), step = 1e-6;
        f.pb.q(0, h, i, d) = x0 + step;
        const double lp = f.loss(p);
        f.pb.q(0, h, i, d) = x0 - step;
        const double lm = f.loss(p);
        f.pb.q(0, h, i, d) = x0;
        worst = std::max(worst, std::fabs(truncated - (lp - lm) / (2 * step)));
      }
    }
  EXPECT_GT(worst, 1e-3);
}

// With q = 0 every visible score is 0: O is the mean of the visible values, LSE = log(count).
TEST(Reference, ZeroQueryGivesMeanOfVisibleValues) {
  kfa::Params p;
  p.window_left = 2;
  p.window_right = 1;
  Problem pb({1, 1, 1, 6, 9, 4}, 99);
  Kokkos::deep_copy(pb.q, 0.0);
  Tensor4 o("o", 1, 1, 6, 4);
  Tensor3 lse("lse", 1, 1, 6);
  ref::forward<double>(pb.q, pb.k, pb.v, p, o, lse);
  for (int i = 0; i < 6; ++i) {
    const int lo = std::max(0, i + 3 - 2), hi = std::min(8, i + 3 + 1);  // shift = 9 - 6
    for (int d = 0; d < 4; ++d) {
      double mean = 0;
      for (int j = lo; j <= hi; ++j)
        mean += pb.v(0, 0, j, d);
      EXPECT_NEAR(o(0, 0, i, d), mean / (hi - lo + 1), 1e-14);
    }
    EXPECT_NEAR(lse(0, 0, i), std::log(hi - lo + 1.0), 1e-14);
  }
}

// The score terms from their definitions: a zero query with ALiBi gives weights
// exp(-slope |j - i - shift|) over the visible keys; a bias that is constant along each row
// (broadcast over the batch) leaves O and shifts LSE by the constant, and its gradient sums
// to dlse_i along the row (softmax's invariance: sum_j dL/dbias_ij = dL/dc_i = dlse_i).
TEST(Reference, TermsFollowTheirDefinitions) {
  kfa::Params p;
  p.causal = true;
  Problem pb({2, 2, 1, 5, 8, 4}, 31);
  Tensor4 zq("zq", 2, 2, 5, 4);
  ref::Terms alibi;
  alibi.alibi = {0.75, 0.3};
  Tensor4 o("o", 2, 2, 5, 4), o0("o0", 2, 2, 5, 4);
  Tensor3 lse("lse", 2, 2, 5), lse0("lse0", 2, 2, 5);
  ref::forward<double>(zq, pb.k, pb.v, p, o, lse, {}, alibi);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 5; ++i) {
      double sum = 0, num = 0;
      for (int j = 0; j <= i + 3; ++j) {  // shift = 8 - 5
        const double w = std::exp(-alibi.alibi[h] * std::abs(j - i - 3));
        sum += w;
        num += w * pb.v(1, 0, j, 2);
      }
      EXPECT_NEAR(lse(1, h, i), std::log(sum), 1e-14);
      EXPECT_NEAR(o(1, h, i, 2), num / sum, 1e-14);
    }
  ref::Terms rows;
  rows.bias = Tensor4("bias", 1, 2, 5, 8);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 8; ++j)
        rows.bias(0, h, i, j) = 0.5 * h - 0.25 * i;
  ref::forward<double>(pb.q, pb.k, pb.v, p, o, lse, {}, rows);
  ref::forward<double>(pb.q, pb.k, pb.v, p, o0, lse0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 5; ++i) {
        EXPECT_NEAR(lse(b, h, i), lse0(b, h, i) + 0.5 * h - 0.25 * i, 1e-13);
        for (int d = 0; d < 4; ++d)
          EXPECT_NEAR(o(b, h, i, d), o0(b, h, i, d), 1e-14);
      }
  std::mt19937_64 gen(4);
  const Tensor4 dout = random_tensor("dout", 2, 2, 5, 4, gen);
  const Tensor3 dlse = random_dlse({2, 2, 1, 5, 8, 4}, gen);
  Tensor4 dq("dq", 2, 2, 5, 4), dk("dk", 2, 1, 8, 4), dv("dv", 2, 1, 8, 4);
  rows.dbias = Tensor4("dbias", 1, 2, 5, 8);
  ref::backward<double>(pb.q, pb.k, pb.v, p, dout, dlse, dq, dk, dv, {}, rows);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 5; ++i) {
      double sum = 0;
      for (int j = 0; j < 8; ++j)
        sum += rows.dbias(0, h, i, j);
      EXPECT_NEAR(sum, dlse(0, h, i) + dlse(1, h, i), 1e-13);
    }
}

// A single key: O = v_0 and LSE is the (soft-capped) score itself.
TEST(Reference, SingleKeyClosedForm) {
  kfa::Params p;
  p.softcap = 3.0;
  p.scale = 2.5;
  Problem pb({1, 1, 1, 3, 1, 5}, 7, 2.0);
  Tensor4 o("o", 1, 1, 3, 5);
  Tensor3 lse("lse", 1, 1, 3);
  ref::forward<double>(pb.q, pb.k, pb.v, p, o, lse);
  for (int i = 0; i < 3; ++i) {
    double dot = 0;
    for (int d = 0; d < 5; ++d)
      dot += pb.q(0, 0, i, d) * pb.k(0, 0, 0, d);
    EXPECT_NEAR(lse(0, 0, i), 3.0 * std::tanh(2.5 * dot / 3.0), 1e-14);
    for (int d = 0; d < 5; ++d)
      EXPECT_EQ(o(0, 0, i, d), pb.v(0, 0, 0, d));
  }
}

// The mask conventions, spelled out for seqlen_q = 2, seqlen_k = 4.
TEST(Reference, MaskConventions) {
  kfa::Params br;
  br.causal = true;  // bottom-right: row 0 sees keys 0..2, row 1 sees 0..3
  EXPECT_TRUE(ref::visible(br, 0, 2, 2, 4));
  EXPECT_FALSE(ref::visible(br, 0, 3, 2, 4));
  EXPECT_TRUE(ref::visible(br, 1, 3, 2, 4));
  kfa::Params tl = br;
  tl.align = kfa::Align::top_left;  // row 0 sees key 0, row 1 sees 0..1
  EXPECT_TRUE(ref::visible(tl, 0, 0, 2, 4));
  EXPECT_FALSE(ref::visible(tl, 0, 1, 2, 4));
  EXPECT_TRUE(ref::visible(tl, 1, 1, 2, 4));
  EXPECT_FALSE(ref::visible(tl, 1, 2, 2, 4));
  kfa::Params w;
  w.window_left = 1;
  w.window_right = 0;  // bottom-right window: row 1 sees keys 2..3
  EXPECT_FALSE(ref::visible(w, 1, 1, 2, 4));
  EXPECT_TRUE(ref::visible(w, 1, 2, 2, 4));
  EXPECT_TRUE(ref::visible(w, 1, 3, 2, 4));
  // seqlen_q > seqlen_k, bottom-right causal: the first rows see nothing.
  EXPECT_FALSE(ref::visible(br, 0, 0, 4, 2));
  EXPECT_FALSE(ref::visible(br, 1, 0, 4, 2));
  EXPECT_TRUE(ref::visible(br, 2, 0, 4, 2));
}

// The tolerance rule must fail a wrong answer: perturb one element of a correct result.
TEST(Reference, ToleranceRuleRejectsAPerturbedResult) {
  Problem pb({1, 1, 1, 9, 11, 8}, 5);
  kfa::Params p;
  Tensor4 o("o", 1, 1, 9, 8);
  Tensor3 lse("lse", 1, 1, 9);
  ref::forward<float>(pb.q, pb.k, pb.v, p, o, lse);
  EXPECT_TRUE(ref::check_forward<float>(pb.q, pb.k, pb.v, p, o, lse).ok());
  o(0, 0, 4, 3) += 1e-3;
  EXPECT_FALSE(ref::check_forward<float>(pb.q, pb.k, pb.v, p, o, lse).ok());
}

// A rule that cannot judge fails: an infinite error (NaN in the result), and a naive
// same-precision result that overflowed where float64 did not (an infinite bound).
TEST(Reference, ToleranceRuleFailsWhenItCannotJudge) {
  Tensor3 ref64("ref64", 1, 1, 3), naive("naive", 1, 1, 3), tested("tested", 1, 1, 3);
  for (int i = 0; i < 3; ++i)
    ref64(0, 0, i) = naive(0, 0, i) = tested(0, 0, i) = 0.25 * i;
  EXPECT_TRUE(ref::apply_rule<float>(tested, naive, ref64).ok());
  tested(0, 0, 1) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(ref::apply_rule<float>(tested, naive, ref64).ok());
  tested(0, 0, 1) = 0.25;
  naive(0, 0, 2) = std::numeric_limits<double>::infinity();
  const ref::Check c = ref::apply_rule<float>(tested, naive, ref64);
  EXPECT_EQ(c.err, 0);  // kfa agrees with float64 exactly, yet the rule has no finite bound
  EXPECT_FALSE(c.ok());
  // Equal infinities are equal: a fully masked row's LSE = -inf in all three passes.
  for (auto* t : {&ref64, &naive, &tested})
    (*t)(0, 0, 2) = -std::numeric_limits<double>::infinity();
  EXPECT_TRUE(ref::apply_rule<float>(tested, naive, ref64).ok());
}

}  // namespace

namespace {

// kfa::visible_pairs (used for FLOP counts) against a pair-by-pair count of the definition.
TEST(Reference, VisiblePairsMatchesDefinition) {
  for (auto [nq, nk] : {std::pair{1, 1}, {7, 19}, {19, 7}, {64, 64}}) {
    for (int variant = 0; variant < 6; ++variant) {
      kfa::Params p;
      p.causal = variant % 2 == 1;
      p.align = variant / 2 == 1 ? kfa::Align::top_left : kfa::Align::bottom_right;
      if (variant >= 4) {
        p.window_left = 3;
        p.window_right = 1;
      }
      double count = 0;
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j)
          count += kfa::reference::visible(p, i, j, nq, nk);
      EXPECT_EQ(kfa::visible_pairs(p, nq, nk), count) << nq << "x" << nk << " variant " << variant;
    }
  }
  EXPECT_EQ(kfa::forward_flops(2, 3, 5, 7, 8), 4.0 * 2 * 3 * 35 * 8);
}

}  // namespace
