#pragma once
/// \file reference.hpp
/// The naive attention kfa is checked against, and the tolerance rule it is checked with.
///
/// Host only, O(seqlen_q * seqlen_k) work per row and no tiling: it materialises each row of
/// S, takes the softmax with the row maximum subtracted, and multiplies by V. It is written
/// from the definitions in kfa::Params, sharing no code with the kernels, so that comparing
/// with it tests something the kernels did not compute. Run in double it is the oracle; run
/// in the kernel's own precision it measures how much rounding that precision costs, which
/// sets the tolerance (flash-attn's rule, see check_forward).

#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kfa::reference {

/// Host tensor of the reference, (batch, heads, seqlen, head_dim).
using Tensor4 = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace>;
/// Host tensor of the reference, (batch, heads, seqlen): the LSE.
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// Whether query i sees key j, straight from the definition in kfa::Params.
inline bool visible(const Params& p, long long i, long long j, long long seqlen_q,
                    long long seqlen_k) {
  const long long d = j - i - (p.align == Align::bottom_right ? seqlen_k - seqlen_q : 0);
  if (p.causal && d > 0) return false;
  if (p.window_left >= 0 && d < -static_cast<long long>(p.window_left)) return false;
  if (p.window_right >= 0 && d > p.window_right) return false;
  return true;
}

/// Naive forward computed in precision T from double inputs; results stored as double.
/// o and lse must be allocated with the shapes of q and (batch, heads_q, seqlen_q).
template <class T>
void forward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
             const Tensor4& o, const Tensor3& lse) {
  const int B = q.extent(0), Hq = q.extent(1), Nq = q.extent(2), D = q.extent(3);
  const int Hk = k.extent(1), Nk = k.extent(2);
  const T scale = static_cast<T>(p.scale < 0 ? 1.0 / std::sqrt(double(D)) : p.scale);
  const T cap = static_cast<T>(p.softcap);
  std::vector<T> s(Nk), acc(D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      for (int i = 0; i < Nq; ++i) {
        T mx = -std::numeric_limits<T>::infinity();
        for (int j = 0; j < Nk; ++j) {
          if (!visible(p, i, j, Nq, Nk)) continue;
          T dot = 0;
          for (int d = 0; d < D; ++d)
            dot += static_cast<T>(q(b, h, i, d)) * static_cast<T>(k(b, hk, j, d));
          T sj = scale * dot;
          if (cap > 0) sj = cap * std::tanh(sj / cap);
          s[j] = sj;
          mx = std::max(mx, sj);
        }
        T sum = 0;
        std::fill(acc.begin(), acc.end(), T(0));
        for (int j = 0; j < Nk; ++j) {
          if (!visible(p, i, j, Nq, Nk)) continue;
          const T pj = std::exp(s[j] - mx);
          sum += pj;
          for (int d = 0; d < D; ++d)
            acc[d] += pj * static_cast<T>(v(b, hk, j, d));
        }
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) = sum > 0 ? double(acc[d] / sum) : 0.0;
        lse(b, h, i) =
            sum > 0 ? double(mx + std::log(sum)) : -std::numeric_limits<double>::infinity();
      }
    }
}

/// max |a - b| over all elements, where equal infinities differ by 0 and a NaN on either
/// side (or an infinity against a finite value) counts as an infinite difference.
template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  double err = 0;
  const std::size_t n = a.span();
  for (std::size_t e = 0; e < n; ++e) {
    const double x = a.data()[e], y = b.data()[e];
    if (x == y) continue;  // also equal infinities
    const double diff = std::fabs(x - y);
    err = std::isnan(diff) || std::isinf(diff) ? std::numeric_limits<double>::infinity()
                                               : std::max(err, diff);
  }
  return err;
}

/// Outcome of the tolerance rule on one output.
struct Check {
  double err = 0;        ///< max |tested - ref64|
  double naive_err = 0;  ///< max |naive in the tested precision - ref64| (0 for double)
  double bound = 0;      ///< what err may reach
  /// Whether the rule holds.
  bool ok() const { return err <= bound; }
};

/// Result of check_forward: the rule applied to O and to LSE.
struct ForwardCheck {
  Check o;    ///< the rule on O
  Check lse;  ///< the rule on LSE
  /// Whether the rule holds on both.
  bool ok() const { return o.ok() && lse.ok(); }
};

/// Applies TESTING.md's rule to (o, lse) computed in precision T by the code under test:
///   float:  err <= 2 * naive_err + floor, floor = 8 * eps(T) * max(1, max|ref64|);
///   double: err <= 1e-12 * max(1, max|ref64|).
/// The floor covers outputs where naive_err happens to be 0 (for instance O of a row with a
/// single visible key) while a fused kernel still rounds once more.
template <class T>
ForwardCheck check_forward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
                           const Tensor4& o, const Tensor3& lse) {
  Tensor4 o64("kfa::ref::o64", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Tensor3 lse64("kfa::ref::lse64", q.extent(0), q.extent(1), q.extent(2));
  forward<double>(q, k, v, p, o64, lse64);
  Tensor4 oT("kfa::ref::oT", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Tensor3 lseT("kfa::ref::lseT", q.extent(0), q.extent(1), q.extent(2));
  const bool is_double = std::is_same_v<T, double>;
  if (!is_double) forward<T>(q, k, v, p, oT, lseT);
  auto rule = [&](const auto& tested, const auto& naive, const auto& ref) {
    double ref_max = 1;
    for (std::size_t e = 0; e < ref.span(); ++e)
      if (std::isfinite(ref.data()[e])) ref_max = std::max(ref_max, std::fabs(ref.data()[e]));
    Check c;
    c.err = max_abs_diff(tested, ref);
    if (is_double) {
      c.bound = 1e-12 * ref_max;
    } else {
      c.naive_err = max_abs_diff(naive, ref);
      c.bound = 2 * c.naive_err + 8 * std::numeric_limits<T>::epsilon() * ref_max;
    }
    return c;
  };
  return {rule(o, oT, o64), rule(lse, lseT, lse64)};
}

}  // namespace kfa::reference
