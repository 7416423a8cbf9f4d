// The kernels' score transform (impl/score.hpp) against closed forms: the resolved scale,
// softcap's value and its derivative (against a central difference), the seam of the additive
// term (through a test bias policy), and agreement with the reference's own statement of the
// transform (reference::ScoreMap), with which it shares no code.
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/score.hpp>
#include <kfa/params.hpp>
#include <kfa/reference.hpp>

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using HostTeam = Kokkos::TeamPolicy<Host>;

// transform.row on columns [c0, c1) of x, as the kernels call it: by one thread of a team.
template <class Transform, class Acc>
void run_row(const Transform& tr, std::vector<Acc>& x, int b, int h, int i, int k0, int c0,
             int c1) {
  Acc* data = x.data();
  Kokkos::parallel_for(HostTeam(Host(), 1, 1), [=](const HostTeam::member_type& team) {
    tr.row(team, b, h, i, k0, data, c0, c1);
  });
  Host().fence();
}

std::vector<double> random_scores(int n, double amp, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-amp, amp);
  std::vector<double> x(n);
  for (double& v : x)
    v = dist(gen);
  return x;
}

kfa::Params with(double scale, double softcap) {
  kfa::Params p;
  p.scale = scale;
  p.softcap = softcap;
  return p;
}

// An ALiBi-like term that also depends on the batch: any function of (b, h, i, j) will do.
struct TestBias {
  static constexpr bool enabled = true;
  KOKKOS_INLINE_FUNCTION double operator()(int b, int h, int i, int j) const {
    return -0.25 * (h + 1) * std::abs(i - j) + 0.5 * b;
  }
};

TEST(Score, ScaleIsResolvedAsParamsDefinesIt) {
  EXPECT_EQ(kfa::impl::ScoreTransform<float>(with(-1, 0), 64).scale, 0.125f);
  EXPECT_EQ(kfa::impl::ScoreTransform<float>(with(-1, 0), 48).scale,
            static_cast<float>(1 / std::sqrt(48.0)));
  EXPECT_EQ(kfa::impl::ScoreTransform<double>(with(-0.5, 0), 48).scale, 1 / std::sqrt(48.0));
  EXPECT_EQ(kfa::impl::ScoreTransform<float>(with(0.3, 0), 64).scale, 0.3f);
  EXPECT_EQ(kfa::impl::ScoreTransform<double>(with(0, 0), 64).scale, 0.0);
  const kfa::impl::ScoreTransform<float> t(with(-1, 0), 16);
  EXPECT_EQ(t.scaled(3.0f), 0.75f);
}

TEST(Score, CappedAndIdentityFollowSoftcapAndBias) {
  const kfa::impl::ScoreTransform<float> plain(with(-1, 0), 64), capped(with(-1, 30), 64);
  EXPECT_FALSE(plain.capped());
  EXPECT_TRUE(plain.identity());
  EXPECT_EQ(plain.inv_cap, 0.0f);
  EXPECT_TRUE(capped.capped());
  EXPECT_FALSE(capped.identity());
  EXPECT_EQ(capped.inv_cap, 1.0f / 30.0f);
  const kfa::impl::ScoreTransform<double, TestBias> biased(with(-1, 0), 64);
  EXPECT_FALSE(biased.capped());
  EXPECT_FALSE(biased.identity());
}

TEST(Score, WithoutSoftcapTheRowIsUntouched) {
  const std::vector<double> x0 = random_scores(40, 30, 1);
  std::vector<float> x(x0.begin(), x0.end());
  const std::vector<float> before = x;
  run_row(kfa::impl::ScoreTransform<float>(with(-1, 0), 64), x, 0, 0, 5, 0, 0, 40);
  EXPECT_EQ(x, before);
}

TEST(Score, SoftcapIsCapTanhOfXOverCapOnItsColumnsOnly) {
  for (double cap : {0.5, 2.0, 30.0}) {
    const std::vector<double> x0 = random_scores(40, 50, 2);
    std::vector<float> x(x0.begin(), x0.end());
    const std::vector<float> before = x;
    const int c0 = 7, c1 = 31;
    run_row(kfa::impl::ScoreTransform<float>(with(-1, cap), 64), x, 0, 0, 5, 0, c0, c1);
    for (int c = 0; c < 40; ++c) {
      if (c < c0 || c >= c1) {
        EXPECT_EQ(x[c], before[c]) << "column " << c << " is outside [c0, c1)";
        continue;
      }
      const double want = cap * std::tanh(double(before[c]) / cap);
      EXPECT_NEAR(x[c], want, 4 * 1.2e-7 * cap) << "cap " << cap << " x " << before[c];
      EXPECT_LE(std::fabs(x[c]), cap);
    }
  }
}

TEST(Score, ElementAndRowGiveTheSameScoreBitwise) {
  for (double cap : {0.0, 3.0}) {
    const kfa::impl::ScoreTransform<float> t(with(-1, cap), 64);
    const std::vector<double> x0 = random_scores(32, 20, 3);
    std::vector<float> x(x0.begin(), x0.end());
    const std::vector<float> before = x;
    run_row(t, x, 1, 2, 9, 64, 0, 32);
    for (int c = 0; c < 32; ++c) {
      float slope = -1;
      EXPECT_EQ(t.at(before[c], 1, 2, 9, 64 + c, slope), x[c]) << "cap " << cap;
      if (cap == 0) {
        EXPECT_EQ(slope, 1.0f);
      }
    }
  }
}

TEST(Score, SlopeIsTheDerivativeOfTheScore) {
  const double step = 1e-5;
  for (double cap : {0.0, 0.7, 2.5, 50.0}) {
    const kfa::impl::ScoreTransform<double> t(with(-1, cap), 64);
    for (double x = -12; x <= 12; x += 0.37) {
      double slope, ignored;
      t.at(x, 0, 0, 0, 0, slope);
      const double diff =
          (t.at(x + step, 0, 0, 0, 0, ignored) - t.at(x - step, 0, 0, 0, 0, ignored)) / (2 * step);
      EXPECT_NEAR(slope, diff, 1e-8) << "cap " << cap << " x " << x;
      if (cap == 0) {
        EXPECT_EQ(slope, 1.0);
      } else {
        EXPECT_NEAR(slope, 1 - std::pow(std::tanh(x / cap), 2), 1e-15);
      }
    }
  }
}

TEST(Score, TheAdditiveTermComesAfterSoftcapAndLeavesTheSlope) {
  const TestBias bias;
  for (double cap : {0.0, 3.0}) {
    const kfa::impl::ScoreTransform<double, TestBias> t(with(-1, cap), 64);
    const kfa::impl::ScoreTransform<double> unbiased(with(-1, cap), 64);
    const int b = 1, h = 2, i = 40, k0 = 32, c0 = 2, c1 = 30;
    const std::vector<double> before = random_scores(32, 10, 4);
    std::vector<double> x = before;
    run_row(t, x, b, h, i, k0, c0, c1);
    for (int c = 0; c < 32; ++c) {
      if (c < c0 || c >= c1) {
        EXPECT_EQ(x[c], before[c]);
        continue;
      }
      const double capped = cap > 0 ? cap * std::tanh(before[c] / cap) : before[c];
      const double want = capped + bias(b, h, i, k0 + c);
      EXPECT_NEAR(x[c], want, 1e-14 * (1 + std::fabs(want))) << "cap " << cap;
      double slope, slope_unbiased;
      EXPECT_EQ(t.at(before[c], b, h, i, k0 + c, slope), x[c]);
      unbiased.at(before[c], b, h, i, k0 + c, slope_unbiased);
      EXPECT_EQ(slope, slope_unbiased);
    }
  }
}

TEST(Score, AgreesWithTheReferencesOwnTransform) {
  for (double scale : {-1.0, 0.7})
    for (double cap : {0.0, 0.9, 5.0}) {
      const kfa::Params p = with(scale, cap);
      const kfa::impl::ScoreTransform<double> kernel(p, 40);
      const kfa::reference::ScoreMap<double> oracle(p, 40);
      EXPECT_EQ(kernel.scale, oracle.scale);
      for (double dot : random_scores(200, 40, 5)) {
        double slope_kernel, slope_oracle;
        const double s_kernel = kernel.at(kernel.scaled(dot), 0, 0, 0, 0, slope_kernel);
        const double s_oracle = oracle(dot, slope_oracle);
        EXPECT_NEAR(s_kernel, s_oracle, 1e-14 * (1 + std::fabs(s_oracle)))
            << "scale " << scale << " cap " << cap << " dot " << dot;
        EXPECT_NEAR(slope_kernel, slope_oracle, 1e-13)
            << "scale " << scale << " cap " << cap << " dot " << dot;
      }
    }
}

// The register forward's view of the mask (ForwardKernel::WarpScore, the score its CUDA kernel
// calls): tile_visible, tile_inside and each row's score against kfa::reference::visible, the
// mask's definition, over every tile of causal masks in both alignments, windows, and
// seqlen_q != seqlen_k. tile_inside skips the per-score mask test in the kernel; it is exact
// only because lo(i) and hi(i) never decrease, which this checks for each mask in turn.
TEST(Score, RegisterForwardTileVerdictsMatchTheMaskDefinition) {
  using View4 = Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using View3 = Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using FK = kfa::impl::ForwardKernel<Host, View4, View4, View4, View4, View3>;
  using WarpScore = typename FK::template WarpScore<false>;
  using Transform = decltype(std::declval<FK>().score);
  const int rows = 64, keys = 64;
  for (const auto& shape : {std::pair{200, 200}, {130, 300}, {300, 130}})
    for (const kfa::Align align : {kfa::Align::top_left, kfa::Align::bottom_right})
      for (const bool causal : {false, true})
        for (const auto& window : {std::pair{-1, -1}, {70, -1}, {-1, 30}, {5, 90}}) {
          // plain ints: a lambda below captures them (not structured bindings, C++17)
          const int nq = shape.first, nk = shape.second, left = window.first, right = window.second;
          kfa::Params p;
          p.causal = causal;
          p.align = align;
          p.window_left = left;
          p.window_right = right;
          SCOPED_TRACE("nq " + std::to_string(nq) + " nk " + std::to_string(nk) + " causal " +
                       std::to_string(causal) + " align " + std::to_string(int(align)) +
                       " window " + std::to_string(left) + "," + std::to_string(right));
          const WarpScore score{Transform(p, 64), kfa::impl::make_mask(p, nq, nk), {}, 0, 0};
          const auto sees = [&](int i, int j) { return kfa::reference::visible(p, i, j, nq, nk); };
          for (int q0 = 0; q0 < nq; q0 += rows / 2) {  // tiles overlapping, the last partial
            const int n = std::min(rows, nq - q0);
            for (int j0 = 0; j0 < nk; j0 += keys) {
              const int nc = std::min(keys, nk - j0);
              bool any = false, all = true;
              for (int i = q0; i < q0 + n; ++i)
                for (int j = j0; j < j0 + nc; ++j) {
                  any = any || sees(i, j);
                  all = all && sees(i, j);
                }
              ASSERT_EQ(score.tile_visible(q0, n, j0, nc), any) << "q0 " << q0 << " j0 " << j0;
              ASSERT_EQ(score.tile_inside(q0, n, j0, nc), all) << "q0 " << q0 << " j0 " << j0;
            }
          }
          for (int i = 0; i < nq; i += 7) {
            const auto row = score.row(i);
            for (int j = 0; j < nk; ++j) {
              const float dot = 0.25f * float(j % 13) - 1.0f;
              const float want = sees(i, j) ? score.transform.scaled(dot) : -INFINITY;
              ASSERT_EQ(row(j, dot), want) << "i " << i << " j " << j;
              if (sees(i, j)) {
                ASSERT_EQ(row.unmasked(j, dot), want) << "i " << i << " j " << j;
              }
            }
          }
        }
}

}  // namespace
