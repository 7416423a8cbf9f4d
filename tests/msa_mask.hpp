// The mask tensors of the multi-scale suites (test_multiscale, the MPI suite): a case, its
// mask (none, dense over both regimes of the clamp, decay), and the mask on the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "problem.hpp"

namespace kfa_test::msa {

using kfa::reference::Mask3;

// How a case's mask tensor is made.
enum class MaskKind {
  none,   // M = 1 (the overloads without a mask)
  dense,  // uniform entries with a per-row factor, scaled so that the median row has r = 1
  decay,  // gamma_h^(i - j) for j <= i, 0 above the diagonal (with causal)
};

struct Case {
  Shape shape;
  kfa::msa::Params p;
  MaskKind kind = MaskKind::dense;
  std::vector<double> gammas{};  // decay: one per head, cycled
  int zero_rows = 0;             // rows of M set to 0 (dense)
};

std::string describe(const Case& c) {
  std::string s = c.p.causal ? "causal" : "no-causal";
  s += c.p.align == kfa::Align::bottom_right ? "/bottom-right" : "/top-left";
  s += " window=(" + std::to_string(c.p.window_left) + "," + std::to_string(c.p.window_right) +
       ") scale=" + std::to_string(c.p.scale) + " splits=" + std::to_string(c.p.num_splits);
  s += c.kind == MaskKind::none ? " no mask" : c.kind == MaskKind::dense ? " dense" : " decay";
  return s;
}

// The mask of case c for problem pb, rounded to T (the kernel and the reference see the same).
template <class T>
Mask3 make_mask(const Case& c, const Problem& pb, std::uint64_t seed) {
  const Shape& s = c.shape;
  if (c.kind == MaskKind::none) return {};
  Mask3 m(std::string("mask"), s.heads_q, s.seqlen_q, s.seqlen_k);
  if (c.kind == MaskKind::decay) {
    for (int h = 0; h < s.heads_q; ++h) {
      const double g = c.gammas[h % c.gammas.size()];
      for (int i = 0; i < s.seqlen_q; ++i)
        for (int j = 0; j < s.seqlen_k; ++j)
          m(h, i, j) = j <= i ? std::pow(g, i - j) : 0.0;
    }
  } else {
    std::mt19937_64 gen(seed ^ 0x5bd1e995);
    std::uniform_real_distribution<double> u(0, 1), e(-1, 1);
    for (int h = 0; h < s.heads_q; ++h)
      for (int i = 0; i < s.seqlen_q; ++i) {
        const double f = std::pow(4.0, e(gen));  // rows spread over a factor 16
        for (int j = 0; j < s.seqlen_k; ++j)
          m(h, i, j) = u(gen) * f;
      }
    // Scale so that the median row sum is 1.07: about half the rows on each side of the clamp,
    // and none at its kink (the median row at exactly 1 would be, and rounding would decide
    // which side its gradient takes).
    Tensor4 o(std::string("o"), s.batch, s.heads_q, s.seqlen_q, s.head_dim);
    Tensor3 r(std::string("r"), s.batch, s.heads_q, s.seqlen_q);
    kfa::reference::msa_forward<double>(pb.q, pb.k, pb.v, m, c.p, o, r);
    std::vector<double> rs(r.data(), r.data() + r.span());
    std::nth_element(rs.begin(), rs.begin() + rs.size() / 2, rs.end());
    const double median = rs[rs.size() / 2] > 0 ? rs[rs.size() / 2] : 1.0;
    for (std::size_t e2 = 0; e2 < m.span(); ++e2)
      m.data()[e2] *= 1.07 / median;
    for (int z = 0; z < c.zero_rows; ++z) {
      const int h = z % s.heads_q, i = (z * 7) % s.seqlen_q;
      for (int j = 0; j < s.seqlen_k; ++j)
        m(h, i, j) = 0;
    }
  }
  if constexpr (kfa::backends::is_narrow_float<T>::value || std::is_same_v<T, float>)
    for (std::size_t e = 0; e < m.span(); ++e)
      m.data()[e] = static_cast<double>(T(m.data()[e]));
  return m;
}

template <class T>
using Mask3Dev = Kokkos::View<T***, Kokkos::LayoutRight, Device>;

template <class T>
Mask3Dev<T> mask_to_device(const Mask3& m) {
  Mask3Dev<T> d("mask", m.extent(0), m.extent(1), m.extent(2));
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t e = 0; e < m.span(); ++e)
    h.data()[e] = static_cast<T>(m.data()[e]);
  Kokkos::deep_copy(d, h);
  return d;
}

}  // namespace kfa_test::msa
