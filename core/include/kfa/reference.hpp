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
///
/// Multi-scale attention (msa_forward, msa_backward) is written out from its definition too.
/// Its dS is the complete derivative, dS_ij = (dO_i . v_j) / d_i - c_i sign(S_ij): the design
/// this library was planned from gives (its eq. 8) only the second term, the path through the
/// normaliser d_i, and drops the direct one; that formula is wrong (test_reference shows that it
/// disagrees with finite differences), so do not "fix" the reference back to it.
///
/// Layer norm (layer_norm, layer_norm_backward) is written out from its definition too: two
/// passes over each row for the moments, and the backward by the chain rule through the
/// variance and the mean, where the kernels use Welford's one pass and a folded formula.
///
/// Dropout: the reference does not generate masks. With params.dropout > 0 it must be given
/// the keep-mask (for instance from kfa::dropout_mask) and applies it from the definition:
/// O = (softmax(S) * Z) V with Z = keep / (1 - p), LSE unaffected.

#include <kfa/backends/portability.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace kfa::reference {

/// Host tensor of the reference, (batch, heads, seqlen, head_dim).
using Tensor4 = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace>;
/// Host tensor of the reference, (batch, heads, seqlen): the LSE.
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;
/// Host dropout keep-mask, (batch, heads_q, seqlen_q, seqlen_k): 1 kept, 0 dropped.
using Keep4 = Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// The dropout weight of each element as a function of its keep flag, in precision T.
template <class T>
struct DropoutWeight {
  bool on = false;  ///< whether dropout is on (p.dropout > 0)
  T kept = 1;       ///< the weight of a kept element, 1 / (1 - p)
  Keep4 keep;       ///< the keep-mask, read when on

  /// Checks keep against params and the problem's shape; throws kfa::Error when p.dropout > 0
  /// and no mask (or a misshaped one) is given.
  DropoutWeight(const Params& p, const Keep4& keep_, std::size_t batch, std::size_t heads_q,
                std::size_t seqlen_q, std::size_t seqlen_k)
      : on(p.dropout > 0), keep(keep_) {
    if (!on) return;
    kept = static_cast<T>(1.0 / (1.0 - p.dropout));
    const std::size_t want[] = {batch, heads_q, seqlen_q, seqlen_k};
    for (int d = 0; d < 4; ++d)
      if (keep.extent(d) != want[d])
        throw Error(
            "reference: dropout > 0 needs the keep-mask (batch, heads_q, seqlen_q, "
            "seqlen_k); keep.extent(" +
            std::to_string(d) + ") = " + std::to_string(keep.extent(d)) + ", expected " +
            std::to_string(want[d]));
  }
  /// Z of element (b, h, i, j): 1 without dropout, else kept or 0.
  T operator()(int b, int h, int i, int j) const {
    return !on ? T(1) : keep(b, h, i, j) ? kept : T(0);
  }
};

/// The arithmetic type of the naive algorithm "in precision T": T itself, or float for a narrow
/// type (backends::is_narrow_float), which is computed as the usual unfused 16-bit attention
/// is (PyTorch's): products accumulated in float, and each materialised matrix (S, P, O, dP,
/// dS, the gradients) rounded to T.
template <class T>
using compute_t = std::conditional_t<backends::is_narrow_float<T>::value, float, T>;

/// x rounded to T and back, for a narrow T; x itself otherwise.
template <class T>
compute_t<T> round_to(compute_t<T> x) {
  if constexpr (backends::is_narrow_float<T>::value)
    return static_cast<float>(T(x));
  else
    return x;
}

/// Machine epsilon of a value type kfa takes; for a narrow type measured by rounding 1 + 2^-k.
template <class T>
double epsilon() {
  if constexpr (backends::is_narrow_float<T>::value) {
    double eps = 1;
    while (static_cast<float>(T(1.0f + static_cast<float>(eps / 2))) != 1.0f)
      eps /= 2;
    return eps;
  } else {
    return std::numeric_limits<T>::epsilon();
  }
}

/// Whether query i sees key j, straight from the definition in kfa::Params.
inline bool visible(const Params& p, long long i, long long j, long long seqlen_q,
                    long long seqlen_k) {
  const long long d = j - i - (p.align == Align::bottom_right ? seqlen_k - seqlen_q : 0);
  if (p.causal && d > 0) return false;
  if (p.window_left >= 0 && d < -static_cast<long long>(p.window_left)) return false;
  if (p.window_right >= 0 && d > p.window_right) return false;
  return true;
}

/// The additive terms of the score (kfa/masks.hpp) for the reference, as host data: ALiBi
/// slopes and a dense bias, either, both or neither. Both are read from their definitions:
///   ALiBi: -alibi[h] |j - i - shift|, shift = seqlen_k - seqlen_q (bottom_right) or 0;
///   bias:  bias(b or 0, h or 0, i, j), an extent of 1 broadcasting.
/// `dbias`, when allocated (shaped like bias), receives dL/dbias from reference::backward.
/// Visibility (kfa::masks::Dense, kfa::masks::KeyPadding) is not a term here but a test, `sees`,
/// that removes the pair as the masks of Params do:
///   mask:        key j visible to (b, h, i) iff mask(b or 0, h or 0, i, j) != 0;
///   key_lengths: key j of batch b visible iff j < key_lengths[b].
struct Terms {
  std::vector<double> alibi;     ///< heads_q slopes; empty: no ALiBi
  Tensor4 bias;                  ///< (batch or 1, heads_q or 1, seqlen_q, seqlen_k); empty: none
  Tensor4 dbias;                 ///< output of backward, shaped like bias; empty: not computed
  Keep4 mask;                    ///< (batch or 1, heads_q or 1, seqlen_q, seqlen_k); empty: none
  std::vector<int> key_lengths;  ///< batch lengths; empty: no key padding

  /// Whether the visibility terms leave key j visible to query i of head h in batch b.
  bool sees(int b, int h, long long i, long long j) const {
    if (!key_lengths.empty() && j >= key_lengths.at(static_cast<std::size_t>(b))) return false;
    if (mask.span() > 0 && !mask(mask.extent(0) == 1 ? 0 : b, mask.extent(1) == 1 ? 0 : h, i, j))
      return false;
    return true;
  }

  /// The sum of the terms for query i, key j of head h in batch b.
  double operator()(const Params& p, int b, int h, long long i, long long j, long long seqlen_q,
                    long long seqlen_k) const {
    double t = 0;
    if (!alibi.empty()) {
      const long long shift = p.align == Align::bottom_right ? seqlen_k - seqlen_q : 0;
      t -= alibi.at(static_cast<std::size_t>(h)) * static_cast<double>(std::llabs(j - i - shift));
    }
    if (bias.span() > 0) t += bias(bias.extent(0) == 1 ? 0 : b, bias.extent(1) == 1 ? 0 : h, i, j);
    return t;
  }
};

/// The score of a query-key pair from its dot product q.k, in precision T, as kfa::Params
/// defines it, and its derivative: the reference's one statement of the transform, which
/// every pass below uses. The kernels have their own (impl/score.hpp); the two share no code,
/// so that the tests compare two implementations of the definition. A new term of the score
/// is written here and there.
///   S = softcap(x), x = scale q.k, softcap(x) = cap tanh(x / cap) (x itself when cap = 0),
/// S rounded to T_ as an unfused implementation stores it, and dS/dx = 1 - (S / cap)^2 taken
/// from the stored S, as an unfused backward takes tanh's derivative from its output. The
/// additive term (Terms) is added after the softcap and the slope, and the sum rounded to T_.
template <class T_>
struct ScoreMap {
  using T = compute_t<T_>;  ///< the arithmetic type
  T scale;                  ///< Params::scale, or 1 / sqrt(head_dim) where it is negative
  T cap;                    ///< Params::softcap; 0 is off

  /// The transform of p for heads of head_dim.
  ScoreMap(const Params& p, int head_dim)
      : scale(static_cast<T>(p.scale < 0 ? 1.0 / std::sqrt(double(head_dim)) : p.scale)),
        cap(static_cast<T>(p.softcap)) {}

  /// S of a pair whose dot product is `dot` with the additive term `term`, and dS/dx in
  /// `slope`.
  T operator()(T dot, T& slope, T term = 0) const {
    T s = scale * dot;
    if (cap > 0) s = cap * std::tanh(s / cap);
    s = round_to<T_>(s);
    slope = cap > 0 ? T(1) - (s / cap) * (s / cap) : T(1);
    return term != T(0) ? round_to<T_>(s + term) : s;
  }
};

/// Row i of the scores of head h (kv head hk) in precision T, into s[j] for the visible keys
/// j, with dS/dx into slope[j]; returns their maximum (-inf when none is visible).
template <class T_, class T = compute_t<T_>>
T scores_row(const Tensor4& q, const Tensor4& k, const Params& p, int b, int h, int hk, int i,
             const ScoreMap<T_>& score, const Terms& terms, std::vector<T>& s,
             std::vector<T>& slope) {
  const int Nq = q.extent(2), Nk = k.extent(2), D = q.extent(3);
  T mx = -std::numeric_limits<T>::infinity();
  for (int j = 0; j < Nk; ++j) {
    if (!visible(p, i, j, Nq, Nk) || !terms.sees(b, h, i, j)) continue;
    T dot = 0;
    for (int d = 0; d < D; ++d)
      dot += static_cast<T>(q(b, h, i, d)) * static_cast<T>(k(b, hk, j, d));
    s[j] = score(dot, slope[j], static_cast<T>(terms(p, b, h, i, j, Nq, Nk)));
    mx = std::max(mx, s[j]);
  }
  return mx;
}

/// Naive forward computed in precision T from double inputs; results stored as double.
/// o and lse must be allocated as (batch, heads_q, seqlen_q, v's head dim Dv, which may differ
/// from q's and k's D) and (batch, heads_q, seqlen_q); keep is
/// the dropout keep-mask, needed only when p.dropout > 0; terms the additive terms, if any.
template <class T_>
void forward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
             const Tensor4& o, const Tensor3& lse, const Keep4& keep = {},
             const Terms& terms = {}) {
  using T = compute_t<T_>;
  constexpr bool narrow = backends::is_narrow_float<T_>::value;
  const int B = q.extent(0), Hq = q.extent(1), Nq = q.extent(2), D = q.extent(3);
  const int Hk = k.extent(1), Nk = k.extent(2), Dv = v.extent(3);
  const DropoutWeight<T> z(p, keep, B, Hq, Nq, Nk);
  const ScoreMap<T_> score(p, D);
  std::vector<T> s(Nk), slope(Nk), acc(Dv);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      const auto seen = [&](int i, int j) {
        return visible(p, i, j, Nq, Nk) && terms.sees(b, h, i, j);
      };
      for (int i = 0; i < Nq; ++i) {
        const T mx = scores_row<T_>(q, k, p, b, h, hk, i, score, terms, s, slope);
        T sum = 0;
        std::fill(acc.begin(), acc.end(), T(0));
        for (int j = 0; j < Nk; ++j)
          if (seen(i, j)) sum += s[j] = std::exp(s[j] - mx);
        for (int j = 0; j < Nk; ++j) {
          if (!seen(i, j)) continue;
          // A narrow type's P is normalised and rounded before P V, as an unfused one is.
          const T pz = (narrow ? round_to<T_>(s[j] / sum) : s[j]) * z(b, h, i, j);
          for (int d = 0; d < Dv; ++d)
            acc[d] += pz * static_cast<T>(v(b, hk, j, d));
        }
        for (int d = 0; d < Dv; ++d)
          o(b, h, i, d) = sum > 0 ? double(round_to<T_>(narrow ? acc[d] : acc[d] / sum)) : 0.0;
        lse(b, h, i) =
            sum > 0 ? double(mx + std::log(sum)) : -std::numeric_limits<double>::infinity();
      }
    }
}

/// Naive gradients computed in precision T from double inputs, stored as double: with
/// P = softmax(S) recomputed per row, Z the dropout weights (1 without dropout),
/// O_i = sum_j P_ij Z_ij V_j and D_i = dO_i . O_i,
///   dV_j = sum_i P_ij Z_ij dO_i,  dS_ij = P_ij (Z_ij dO_i . V_j - D_i + dlse_i) times
///   dS/dx of ScoreMap (1 - tanh^2 under softcap),  dQ_i = scale sum_j dS_ij K_j,
///   dK_j = scale sum_i dS_ij Q_i,
/// dK and dV summed over the query heads sharing a kv head. dlse may be an empty view (no LSE
/// gradient); keep is the dropout keep-mask, needed only when p.dropout > 0. Outputs must be
/// allocated with the shapes of q, k and v; v, dout and dv have their own head dim Dv. With terms,
/// the scores have them added, and terms.dbias (when allocated) receives dL/dbias_ij = P_ij (Z_ij
/// dO_i . V_j - D_i + dlse_i), dS before the softcap's slope, summed over the broadcast dimensions
/// of terms.bias.
template <class T_>
void backward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
              const Tensor4& dout, const Tensor3& dlse, const Tensor4& dq, const Tensor4& dk,
              const Tensor4& dv, const Keep4& keep = {}, const Terms& terms = {}) {
  using T = compute_t<T_>;
  const int B = q.extent(0), Hq = q.extent(1), Nq = q.extent(2), D = q.extent(3);
  const int Hk = k.extent(1), Nk = k.extent(2), Dv = v.extent(3);
  const DropoutWeight<T> z(p, keep, B, Hq, Nq, Nk);
  const ScoreMap<T_> score(p, D);
  const bool has_dlse = dlse.span() > 0;
  const bool want_dbias = terms.dbias.span() > 0;
  if (want_dbias) Kokkos::deep_copy(terms.dbias, 0.0);
  std::vector<T> s(Nk), slope(Nk), pr(Nk), o(Dv), gq(D), gk(std::size_t(Hk) * Nk * D),
      gv(std::size_t(Hk) * Nk * Dv);
  for (int b = 0; b < B; ++b) {
    std::fill(gk.begin(), gk.end(), T(0));
    std::fill(gv.begin(), gv.end(), T(0));
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      const auto seen = [&](int i, int j) {
        return visible(p, i, j, Nq, Nk) && terms.sees(b, h, i, j);
      };
      for (int i = 0; i < Nq; ++i) {
        const T mx = scores_row<T_>(q, k, p, b, h, hk, i, score, terms, s, slope);
        T sum = 0;
        for (int j = 0; j < Nk; ++j)
          if (seen(i, j)) sum += pr[j] = std::exp(s[j] - mx);
        std::fill(o.begin(), o.end(), T(0));
        for (int j = 0; j < Nk; ++j) {
          if (!seen(i, j)) continue;
          pr[j] = round_to<T_>(pr[j] / sum);
          const T pz = pr[j] * z(b, h, i, j);
          for (int d = 0; d < Dv; ++d)
            o[d] += pz * static_cast<T>(v(b, hk, j, d));
        }
        T di = 0;
        for (int d = 0; d < Dv; ++d)
          di += static_cast<T>(dout(b, h, i, d)) * round_to<T_>(o[d]);
        const T gl = has_dlse ? static_cast<T>(dlse(b, h, i)) : T(0);
        std::fill(gq.begin(), gq.end(), T(0));
        for (int j = 0; j < Nk; ++j) {
          if (!seen(i, j)) continue;
          T dp = 0;
          for (int d = 0; d < Dv; ++d)
            dp += static_cast<T>(dout(b, h, i, d)) * static_cast<T>(v(b, hk, j, d));
          dp = round_to<T_>(dp);
          const T zj = z(b, h, i, j);
          const T g = pr[j] * (zj * dp - di + gl);
          if (want_dbias)
            terms.dbias(terms.dbias.extent(0) == 1 ? 0 : b, terms.dbias.extent(1) == 1 ? 0 : h, i,
                        j) += double(round_to<T_>(g));
          const T ds = round_to<T_>(g * slope[j]);
          T* gkj = &gk[(std::size_t(hk) * Nk + j) * D];
          T* gvj = &gv[(std::size_t(hk) * Nk + j) * Dv];
          const T pz = pr[j] * zj;
          for (int d = 0; d < D; ++d) {
            gq[d] += score.scale * ds * static_cast<T>(k(b, hk, j, d));
            gkj[d] += score.scale * ds * static_cast<T>(q(b, h, i, d));
          }
          for (int d = 0; d < Dv; ++d)
            gvj[d] += pz * static_cast<T>(dout(b, h, i, d));
        }
        for (int d = 0; d < D; ++d)
          dq(b, h, i, d) = double(round_to<T_>(gq[d]));
      }
    }
    for (int hk = 0; hk < Hk; ++hk)
      for (int j = 0; j < Nk; ++j) {
        for (int d = 0; d < D; ++d)
          dk(b, hk, j, d) = double(round_to<T_>(gk[(std::size_t(hk) * Nk + j) * D + d]));
        for (int d = 0; d < Dv; ++d)
          dv(b, hk, j, d) = double(round_to<T_>(gv[(std::size_t(hk) * Nk + j) * Dv + d]));
      }
  }
}

/// Multi-scale attention's mask tensor for the reference, (heads_q, seqlen_q, seqlen_k); an
/// empty view means all ones.
using Mask3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// Row i of head h (kv head hk) of multi-scale attention in precision T, from the definition:
/// t[j] = scale (q_i . k_j) M[h, i, j] for the keys j the causal/window masks leave visible,
/// 0 for the others, each rounded to T as an unfused implementation stores it. Returns
/// r_i = sum_j |t_j|.
template <class T_, class T = compute_t<T_>>
T msa_row(const Tensor4& q, const Tensor4& k, const Mask3& mask, const msa::Params& mp, int b,
          int h, int hk, int i, std::vector<T>& t) {
  const int Nq = q.extent(2), Nk = k.extent(2), D = q.extent(3);
  const Params p = masks_of(mp);
  T r = 0;
  for (int j = 0; j < Nk; ++j) {
    t[j] = 0;
    if (!visible(p, i, j, Nq, Nk)) continue;
    T dot = 0;
    for (int d = 0; d < D; ++d)
      dot += static_cast<T>(q(b, h, i, d)) * static_cast<T>(k(b, hk, j, d));
    const T m = mask.span() > 0 ? static_cast<T>(mask(h, i, j)) : T(1);
    t[j] = round_to<T_>(static_cast<T>(mp.scale) * dot * m);
    r += std::fabs(t[j]);
  }
  return round_to<T_>(r);
}

/// Naive multi-scale forward in precision T from double inputs, stored as double:
///   S_ij = scale (q_i . k_j) M[h, i, j] (0 where a causal/window mask hides key j),
///   r_i = sum_j |S_ij|, d_i = max(r_i, 1), O_i = (1 / d_i) sum_j S_ij v_j,
/// with mask empty meaning M = 1. o is shaped like q, rsum (batch, heads_q, seqlen_q) gets r.
/// A narrow type's S / d is rounded before the product with V, as the unfused
/// (S / d) @ V is.
template <class T_>
void msa_forward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Mask3& mask,
                 const msa::Params& p, const Tensor4& o, const Tensor3& rsum) {
  using T = compute_t<T_>;
  const int B = q.extent(0), Hq = q.extent(1), Nq = q.extent(2), D = q.extent(3);
  const int Hk = k.extent(1), Nk = k.extent(2);
  std::vector<T> t(Nk), acc(D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      for (int i = 0; i < Nq; ++i) {
        const T r = msa_row<T_>(q, k, mask, p, b, h, hk, i, t);
        const T dn = std::max(r, T(1));
        std::fill(acc.begin(), acc.end(), T(0));
        for (int j = 0; j < Nk; ++j) {
          const T w = round_to<T_>(t[j] / dn);
          for (int d = 0; d < D; ++d)
            acc[d] += w * static_cast<T>(v(b, hk, j, d));
        }
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) = double(round_to<T_>(acc[d]));
        rsum(b, h, i) = double(r);
      }
    }
}

/// Naive multi-scale gradients in precision T from double inputs, stored as double, with S,
/// r, d and O recomputed per row as msa_forward makes them:
///   g_i = 1 if r_i >= 1 else 0 (the clamp's derivative, PyTorch's convention at r = 1),
///   c_i = g_i (dO_i . O_i) / d_i,
///   dS_ij = (dO_i . v_j) / d_i - c_i sign(S_ij)   (sign(0) = 0),
///   G_ij = scale M[h, i, j] dS_ij (0 for hidden keys),
///   dV_j = sum_i (S_ij / d_i) dO_i,  dK_j = sum_i G_ij q_i,  dQ_i = sum_j G_ij k_j,
/// dK and dV summed over the query heads sharing a kv head. Outputs must be allocated with the
/// shapes of q, k and v.
template <class T_>
void msa_backward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Mask3& mask,
                  const msa::Params& p, const Tensor4& dout, const Tensor4& dq, const Tensor4& dk,
                  const Tensor4& dv) {
  using T = compute_t<T_>;
  const int B = q.extent(0), Hq = q.extent(1), Nq = q.extent(2), D = q.extent(3);
  const int Hk = k.extent(1), Nk = k.extent(2);
  std::vector<T> t(Nk), o(D), gq(D), gk(std::size_t(Hk) * Nk * D), gv(gk.size());
  for (int b = 0; b < B; ++b) {
    std::fill(gk.begin(), gk.end(), T(0));
    std::fill(gv.begin(), gv.end(), T(0));
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      for (int i = 0; i < Nq; ++i) {
        const T r = msa_row<T_>(q, k, mask, p, b, h, hk, i, t);
        const T dn = std::max(r, T(1));
        std::fill(o.begin(), o.end(), T(0));
        for (int j = 0; j < Nk; ++j)
          for (int d = 0; d < D; ++d)
            o[d] += round_to<T_>(t[j] / dn) * static_cast<T>(v(b, hk, j, d));
        T c = 0;
        if (r >= T(1)) {
          for (int d = 0; d < D; ++d)
            c += static_cast<T>(dout(b, h, i, d)) * round_to<T_>(o[d]);
          c = round_to<T_>(c / dn);
        }
        std::fill(gq.begin(), gq.end(), T(0));
        for (int j = 0; j < Nk; ++j) {
          if (!visible(masks_of(p), i, j, Nq, Nk)) continue;
          T dp = 0;
          for (int d = 0; d < D; ++d)
            dp += static_cast<T>(dout(b, h, i, d)) * static_cast<T>(v(b, hk, j, d));
          const T sgn = t[j] > 0 ? T(1) : t[j] < 0 ? T(-1) : T(0);
          const T m = mask.span() > 0 ? static_cast<T>(mask(h, i, j)) : T(1);
          const T g = round_to<T_>(static_cast<T>(p.scale) * m * (round_to<T_>(dp) / dn - c * sgn));
          const T w = round_to<T_>(t[j] / dn);
          T* gkj = &gk[(std::size_t(hk) * Nk + j) * D];
          T* gvj = &gv[(std::size_t(hk) * Nk + j) * D];
          for (int d = 0; d < D; ++d) {
            gq[d] += g * static_cast<T>(k(b, hk, j, d));
            gkj[d] += g * static_cast<T>(q(b, h, i, d));
            gvj[d] += w * static_cast<T>(dout(b, h, i, d));
          }
        }
        for (int d = 0; d < D; ++d)
          dq(b, h, i, d) = double(round_to<T_>(gq[d]));
      }
    }
    for (int hk = 0; hk < Hk; ++hk)
      for (int j = 0; j < Nk; ++j)
        for (int d = 0; d < D; ++d) {
          dk(b, hk, j, d) = double(round_to<T_>(gk[(std::size_t(hk) * Nk + j) * D + d]));
          dv(b, hk, j, d) = double(round_to<T_>(gv[(std::size_t(hk) * Nk + j) * D + d]));
        }
  }
}

/// Host matrix of the reference, (rows, D): layer norm's rows.
using Tensor2 = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
/// Host vector of the reference: gamma, beta, a row statistic.
using Tensor1 = Kokkos::View<double*, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// The arithmetic of the layer-norm reference in precision T_: as compute_t, but long double
/// for double, so that the float64 oracle is more accurate than a double computation: layer
/// norm's condition number grows with |mean| / std, and at mean 1e3 two correct double
/// computations already differ by about 1e-12.
template <class T_>
using ln_compute_t = std::conditional_t<std::is_same_v<T_, double>, long double, compute_t<T_>>;

/// z = x + residual of row r in precision T (residual empty: none), rounded to T as an
/// unfused implementation stores the sum.
template <class T_, class T = ln_compute_t<T_>>
std::vector<T> ln_row(const Tensor2& x, const Tensor2& residual, int r) {
  const int D = x.extent(1);
  std::vector<T> z(D);
  for (int j = 0; j < D; ++j)
    z[j] = round_to<T_>(static_cast<T>(x(r, j)) +
                        (residual.span() > 0 ? static_cast<T>(residual(r, j)) : T(0)));
  return z;
}

/// Naive layer norm in precision T (double: long double, ln_compute_t) from double inputs, stored
/// as double: per row, two passes
/// over z = x + residual (residual empty: none): mu = sum z / D, then
/// var = sum (z - mu)^2 / n_var with n_var = D, or D - 1 when unbiased;
/// rstd = 1 / sqrt(var + eps), y = (z - mu) rstd gamma + beta. y like x, mean and rstd (rows).
template <class T_>
void layer_norm(const Tensor2& x, const Tensor2& residual, const Tensor1& gamma,
                const Tensor1& beta, double eps, bool unbiased, const Tensor2& y,
                const Tensor1& mean, const Tensor1& rstd) {
  using T = ln_compute_t<T_>;
  const int rows = x.extent(0), D = x.extent(1);
  for (int r = 0; r < rows; ++r) {
    const std::vector<T> z = ln_row<T_>(x, residual, r);
    T mu = 0, var = 0;
    for (const T v : z)
      mu += v;
    mu /= T(D);
    for (const T v : z)
      var += (v - mu) * (v - mu);
    var /= T(unbiased ? D - 1 : D);
    const T rs = T(1) / std::sqrt(var + static_cast<T>(eps));
    for (int j = 0; j < D; ++j)
      y(r, j) = double(
          round_to<T_>((z[j] - mu) * rs * static_cast<T>(gamma(j)) + static_cast<T>(beta(j))));
    mean(r) = double(mu);
    rstd(r) = double(rs);
  }
}

/// Naive layer-norm gradients in precision T by the textbook chain rule through the variance
/// and the mean (recomputed as layer_norm does), stored as double:
///   dxhat = dy gamma, dvar = sum dxhat (z - mu) (-1/2) (var + eps)^(-3/2),
///   dmu = -rstd sum dxhat + dvar (-2 / n_var) sum (z - mu),
///   dz = dxhat rstd + dvar 2 (z - mu) / n_var + dmu / D,
///   dgamma = sum_rows dy (z - mu) rstd, dbeta = sum_rows dy.
/// dz like x; dgamma, dbeta (D).
template <class T_>
void layer_norm_backward(const Tensor2& x, const Tensor2& residual, const Tensor1& gamma,
                         double eps, bool unbiased, const Tensor2& dy, const Tensor2& dz,
                         const Tensor1& dgamma, const Tensor1& dbeta) {
  using T = ln_compute_t<T_>;
  const int rows = x.extent(0), D = x.extent(1);
  const T n_var = T(unbiased ? D - 1 : D);
  std::vector<T> dg(D, T(0)), db(D, T(0));
  for (int r = 0; r < rows; ++r) {
    const std::vector<T> z = ln_row<T_>(x, residual, r);
    T mu = 0, var = 0;
    for (const T v : z)
      mu += v;
    mu /= T(D);
    for (const T v : z)
      var += (v - mu) * (v - mu);
    var /= n_var;
    const T ve = var + static_cast<T>(eps), rs = T(1) / std::sqrt(ve);
    T dvar = 0, sum_dxhat = 0, sum_dev = 0;
    for (int j = 0; j < D; ++j) {
      const T dxhat = static_cast<T>(dy(r, j)) * static_cast<T>(gamma(j));
      dvar += dxhat * (z[j] - mu);
      sum_dxhat += dxhat;
      sum_dev += z[j] - mu;
    }
    dvar *= T(-0.5) / (ve * std::sqrt(ve));
    const T dmu = -rs * sum_dxhat + dvar * T(-2) * sum_dev / n_var;
    for (int j = 0; j < D; ++j) {
      const T dxhat = static_cast<T>(dy(r, j)) * static_cast<T>(gamma(j));
      dz(r, j) = double(round_to<T_>(dxhat * rs + dvar * T(2) * (z[j] - mu) / n_var + dmu / T(D)));
      dg[j] += static_cast<T>(dy(r, j)) * (z[j] - mu) * rs;
      db[j] += static_cast<T>(dy(r, j));
    }
  }
  for (int j = 0; j < D; ++j) {
    dgamma(j) = double(round_to<T_>(dg[j]));
    dbeta(j) = double(round_to<T_>(db[j]));
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
  /// Whether the rule holds. A rule whose error or bound is not finite cannot judge the result
  /// (an overflow in the tested code, or in the naive same-precision run where float64 stays
  /// finite), so it fails.
  bool ok() const { return std::isfinite(err) && std::isfinite(bound) && err <= bound; }
};

/// Result of check_forward: the rule applied to O and to LSE.
struct ForwardCheck {
  Check o;    ///< the rule on O
  Check lse;  ///< the rule on LSE
  /// Whether the rule holds on both.
  bool ok() const { return o.ok() && lse.ok(); }
};

/// The tolerance rule (docs/testing.md) on one output computed in precision T: `tested` and `naive`
/// (the naive algorithm in T) against `ref` (the naive algorithm in double).
///   float:  err <= factor * naive_err + floor, floor = 8 * eps(T) * max(1, max|ref|);
///   double: err <= 1e-12 * max(1, max|ref|).
template <class T, class A, class N, class R>
Check apply_rule(const A& tested, const N& naive, const R& ref, double factor = 2) {
  // A narrow type's floor scales with the largest |ref| itself (its ulp is coarse enough that
  // max(1, .) would hide errors in outputs much smaller than 1).
  double ref_max = backends::is_narrow_float<T>::value ? 0 : 1;
  for (std::size_t e = 0; e < ref.span(); ++e)
    if (std::isfinite(ref.data()[e])) ref_max = std::max(ref_max, std::fabs(ref.data()[e]));
  Check c;
  c.err = max_abs_diff(tested, ref);
  if (std::is_same_v<T, double>) {
    c.bound = 1e-12 * ref_max;
  } else {
    c.naive_err = max_abs_diff(naive, ref);
    // The floor: 8 ulps of float; 2 of a narrow type, whose ulp is already coarse (bf16: 2^-7).
    const double floor_ulps = backends::is_narrow_float<T>::value ? 2 : 8;
    c.bound = factor * c.naive_err + floor_ulps * epsilon<T>() * ref_max;
  }
  return c;
}

/// Applies the tolerance rule (docs/testing.md) to (o, lse) computed in precision T by the code
/// under test:
///   float:  err <= 2 * naive_err + floor, floor = 8 * eps(T) * max(1, max|ref64|);
///   double: err <= 1e-12 * max(1, max|ref64|).
/// The floor covers outputs where naive_err happens to be 0 (for instance O of a row with a
/// single visible key) while a fused kernel still rounds once more. keep: the dropout
/// keep-mask the tested run used, needed only when p.dropout > 0; terms: its additive terms.
template <class T>
ForwardCheck check_forward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
                           const Tensor4& o, const Tensor3& lse, const Keep4& keep = {},
                           const Terms& terms = {}) {
  Tensor4 o64("kfa::ref::o64", q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  Tensor3 lse64("kfa::ref::lse64", q.extent(0), q.extent(1), q.extent(2));
  forward<double>(q, k, v, p, o64, lse64, keep, terms);
  Tensor4 oT("kfa::ref::oT", q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  Tensor3 lseT("kfa::ref::lseT", q.extent(0), q.extent(1), q.extent(2));
  if (!std::is_same_v<T, double>) forward<T>(q, k, v, p, oT, lseT, keep, terms);
  return {apply_rule<T>(o, oT, o64), apply_rule<T>(lse, lseT, lse64)};
}

/// Result of check_backward: the rule applied to dQ, dK and dV.
struct BackwardCheck {
  Check dq;  ///< the rule on dQ
  Check dk;  ///< the rule on dK
  Check dv;  ///< the rule on dV
  /// Whether the rule holds on all three.
  bool ok() const { return dq.ok() && dk.ok() && dv.ok(); }
};

/// Applies the rule to gradients (dq, dk, dv) computed in precision T by the code under test
/// from (q, k, v, dout, dlse); dlse may be empty; keep and terms as for backward (terms.dbias
/// is not read: the rule on a tested dbias is check_dbias). Same rule as check_forward with the
/// factor 2: the fused backward rounds the same products as the naive one, in another order.
template <class T>
BackwardCheck check_backward(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
                             const Tensor4& dout, const Tensor3& dlse, const Tensor4& dq,
                             const Tensor4& dk, const Tensor4& dv, const Keep4& keep = {},
                             Terms terms = {}) {
  terms.dbias = Tensor4();
  auto like = [](const char* label, const Tensor4& t) {
    return Tensor4(std::string(label), t.extent(0), t.extent(1), t.extent(2), t.extent(3));
  };
  Tensor4 dq64 = like("kfa::ref::dq64", q), dk64 = like("kfa::ref::dk64", k),
          dv64 = like("kfa::ref::dv64", v);
  backward<double>(q, k, v, p, dout, dlse, dq64, dk64, dv64, keep, terms);
  Tensor4 dqT = like("kfa::ref::dqT", q), dkT = like("kfa::ref::dkT", k),
          dvT = like("kfa::ref::dvT", v);
  if (!std::is_same_v<T, double>) backward<T>(q, k, v, p, dout, dlse, dqT, dkT, dvT, keep, terms);
  return {apply_rule<T>(dq, dqT, dq64), apply_rule<T>(dk, dkT, dk64), apply_rule<T>(dv, dvT, dv64)};
}

/// The rule on a dbias computed in precision T by the code under test, for the problem of
/// check_backward with terms.bias (terms.dbias is not read).
template <class T>
Check check_dbias(const Tensor4& q, const Tensor4& k, const Tensor4& v, const Params& p,
                  const Tensor4& dout, const Tensor3& dlse, const Tensor4& dbias,
                  const Keep4& keep = {}, Terms terms = {}) {
  auto like = [](const char* label, const Tensor4& t) {
    return Tensor4(std::string(label), t.extent(0), t.extent(1), t.extent(2), t.extent(3));
  };
  Tensor4 dq = like("kfa::ref::dq", q), dk = like("kfa::ref::dk", k), dv = like("kfa::ref::dv", v);
  terms.dbias = like("kfa::ref::dbias64", terms.bias);
  backward<double>(q, k, v, p, dout, dlse, dq, dk, dv, keep, terms);
  const Tensor4 db64 = terms.dbias;
  Tensor4 dbT = like("kfa::ref::dbiasT", terms.bias);
  if (!std::is_same_v<T, double>) {
    terms.dbias = dbT;
    backward<T>(q, k, v, p, dout, dlse, dq, dk, dv, keep, terms);
  }
  return apply_rule<T>(dbias, dbT, db64);
}

/// The tolerance rule on a multi-scale forward (o, rsum) computed in precision T, against
/// msa_forward in double and in T (the result's `lse` field holds rsum's check).
template <class T>
ForwardCheck msa_check_forward(const Tensor4& q, const Tensor4& k, const Tensor4& v,
                               const Mask3& mask, const msa::Params& p, const Tensor4& o,
                               const Tensor3& rsum) {
  Tensor4 o64("kfa::ref::o64", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Tensor3 r64("kfa::ref::r64", q.extent(0), q.extent(1), q.extent(2));
  msa_forward<double>(q, k, v, mask, p, o64, r64);
  Tensor4 oT("kfa::ref::oT", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Tensor3 rT("kfa::ref::rT", q.extent(0), q.extent(1), q.extent(2));
  if (!std::is_same_v<T, double>) msa_forward<T>(q, k, v, mask, p, oT, rT);
  return {apply_rule<T>(o, oT, o64), apply_rule<T>(rsum, rT, r64)};
}

/// The tolerance rule on multi-scale gradients computed in precision T, against msa_backward
/// in double and in T.
template <class T>
BackwardCheck msa_check_backward(const Tensor4& q, const Tensor4& k, const Tensor4& v,
                                 const Mask3& mask, const msa::Params& p, const Tensor4& dout,
                                 const Tensor4& dq, const Tensor4& dk, const Tensor4& dv) {
  auto like = [](const char* label, const Tensor4& t) {
    return Tensor4(std::string(label), t.extent(0), t.extent(1), t.extent(2), t.extent(3));
  };
  Tensor4 dq64 = like("kfa::ref::dq64", q), dk64 = like("kfa::ref::dk64", k),
          dv64 = like("kfa::ref::dv64", v);
  msa_backward<double>(q, k, v, mask, p, dout, dq64, dk64, dv64);
  Tensor4 dqT = like("kfa::ref::dqT", q), dkT = like("kfa::ref::dkT", k),
          dvT = like("kfa::ref::dvT", v);
  if (!std::is_same_v<T, double>) msa_backward<T>(q, k, v, mask, p, dout, dqT, dkT, dvT);
  return {apply_rule<T>(dq, dqT, dq64), apply_rule<T>(dk, dkT, dk64), apply_rule<T>(dv, dvT, dv64)};
}

/// Host packed tensor of the varlen reference, (total, heads, head_dim).
using Packed3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// Packed variable-length attention (kfa::varlen) as a loop over sequences: sequence s is the
/// reference on the query rows [cu_q[s], cu_q[s+1]) and key rows [cu_k[s], cu_k[s+1]), as a
/// batch of one copied out of and back into the packed arrays.
namespace varlen {

/// Rows [begin, begin + n) of x as a (1, heads, n, head_dim) tensor (a copy).
inline Tensor4 unpack(const Packed3& x, int begin, int n) {
  Tensor4 t("kfa::ref::varlen::seq", 1, x.extent(1), n, x.extent(2));
  for (int i = 0; i < n; ++i)
    for (std::size_t h = 0; h < x.extent(1); ++h)
      for (std::size_t d = 0; d < x.extent(2); ++d)
        t(0, h, i, d) = x(begin + i, h, d);
  return t;
}

/// Writes the (1, heads, n, head_dim) tensor t into rows [begin, begin + n) of x.
inline void pack(const Tensor4& t, const Packed3& x, int begin) {
  for (std::size_t i = 0; i < t.extent(2); ++i)
    for (std::size_t h = 0; h < t.extent(1); ++h)
      for (std::size_t d = 0; d < t.extent(3); ++d)
        x(begin + i, h, d) = t(0, h, i, d);
}

/// Batch element s of the padded batch's keep-mask, cut to nq x nk (empty without dropout).
inline Keep4 keep_of(const Keep4& keep, int s, int nq, int nk) {
  if (keep.span() == 0) return {};
  Keep4 t("kfa::ref::varlen::keep", 1, keep.extent(1), nq, nk);
  for (std::size_t h = 0; h < keep.extent(1); ++h)
    for (int i = 0; i < nq; ++i)
      for (int j = 0; j < nk; ++j)
        t(0, h, i, j) = keep(s, h, i, j);
  return t;
}

/// The naive forward in precision T of every sequence; o like q, lse (heads_q, total_q). keep:
/// the keep-mask of the padded batch (batch, heads_q, >= max seqlen_q, >= max seqlen_k), as
/// kfa::dropout_mask gives it, needed only when p.dropout > 0. alibi: heads_q ALiBi slopes
/// (empty: none), each sequence's bias taken from its own positions and lengths.
template <class T_>
void forward(const Packed3& q, const Packed3& k, const Packed3& v, const std::vector<int>& cu_q,
             const std::vector<int>& cu_k, const Params& p, const Packed3& o, const Tensor2& lse,
             const Keep4& keep = {}, const std::vector<double>& alibi = {}) {
  Terms terms;
  terms.alibi = alibi;
  for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const int nq = cu_q[s + 1] - cu_q[s], nk = cu_k[s + 1] - cu_k[s];
    const Tensor4 qs = unpack(q, cu_q[s], nq), os = unpack(o, cu_q[s], nq);
    Tensor3 ls("kfa::ref::varlen::lse", 1, q.extent(1), nq);
    reference::forward<T_>(qs, unpack(k, cu_k[s], nk), unpack(v, cu_k[s], nk), p, os, ls,
                           keep_of(keep, static_cast<int>(s), nq, nk), terms);
    pack(os, o, cu_q[s]);
    for (std::size_t h = 0; h < q.extent(1); ++h)
      for (int i = 0; i < nq; ++i)
        lse(h, cu_q[s] + i) = ls(0, h, i);
  }
}

/// The naive gradients in precision T of every sequence; dlse (heads_q, total_q) may be empty;
/// keep and alibi as for forward.
template <class T_>
void backward(const Packed3& q, const Packed3& k, const Packed3& v, const std::vector<int>& cu_q,
              const std::vector<int>& cu_k, const Params& p, const Packed3& dout,
              const Tensor2& dlse, const Packed3& dq, const Packed3& dk, const Packed3& dv,
              const Keep4& keep = {}, const std::vector<double>& alibi = {}) {
  Terms terms;
  terms.alibi = alibi;
  for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const int nq = cu_q[s + 1] - cu_q[s], nk = cu_k[s + 1] - cu_k[s];
    Tensor3 dls;
    if (dlse.span() > 0) {
      dls = Tensor3("kfa::ref::varlen::dlse", 1, q.extent(1), nq);
      for (std::size_t h = 0; h < q.extent(1); ++h)
        for (int i = 0; i < nq; ++i)
          dls(0, h, i) = dlse(h, cu_q[s] + i);
    }
    const Tensor4 dqs = unpack(dq, cu_q[s], nq), dks = unpack(dk, cu_k[s], nk),
                  dvs = unpack(dv, cu_k[s], nk);
    reference::backward<T_>(unpack(q, cu_q[s], nq), unpack(k, cu_k[s], nk), unpack(v, cu_k[s], nk),
                            p, unpack(dout, cu_q[s], nq), dls, dqs, dks, dvs,
                            keep_of(keep, static_cast<int>(s), nq, nk), terms);
    pack(dqs, dq, cu_q[s]);
    pack(dks, dk, cu_k[s]);
    pack(dvs, dv, cu_k[s]);
  }
}

/// The tolerance rule (as check_forward) on a packed forward's (o, lse) computed in precision T;
/// keep and alibi as for forward.
template <class T>
ForwardCheck check_forward(const Packed3& q, const Packed3& k, const Packed3& v,
                           const std::vector<int>& cu_q, const std::vector<int>& cu_k,
                           const Params& p, const Packed3& o, const Tensor2& lse,
                           const Keep4& keep = {}, const std::vector<double>& alibi = {}) {
  auto like = [](const Packed3& t) {
    return Packed3("kfa::ref::varlen::o", t.extent(0), t.extent(1), t.extent(2));
  };
  auto lse_like = [](const Tensor2& t) {
    return Tensor2("kfa::ref::varlen::lse", t.extent(0), t.extent(1));
  };
  const Packed3 o64 = like(o), oT = like(o);
  const Tensor2 lse64 = lse_like(lse), lseT = lse_like(lse);
  forward<double>(q, k, v, cu_q, cu_k, p, o64, lse64, keep, alibi);
  if (!std::is_same_v<T, double>) forward<T>(q, k, v, cu_q, cu_k, p, oT, lseT, keep, alibi);
  return {apply_rule<T>(o, oT, o64), apply_rule<T>(lse, lseT, lse64)};
}

/// The tolerance rule (as check_backward) on packed gradients computed in precision T; keep and
/// alibi as for forward.
template <class T>
BackwardCheck check_backward(const Packed3& q, const Packed3& k, const Packed3& v,
                             const std::vector<int>& cu_q, const std::vector<int>& cu_k,
                             const Params& p, const Packed3& dout, const Tensor2& dlse,
                             const Packed3& dq, const Packed3& dk, const Packed3& dv,
                             const Keep4& keep = {}, const std::vector<double>& alibi = {}) {
  auto like = [](const Packed3& t) {
    return Packed3("kfa::ref::varlen::grad", t.extent(0), t.extent(1), t.extent(2));
  };
  const Packed3 dq64 = like(q), dk64 = like(k), dv64 = like(v);
  const Packed3 dqT = like(q), dkT = like(k), dvT = like(v);
  backward<double>(q, k, v, cu_q, cu_k, p, dout, dlse, dq64, dk64, dv64, keep, alibi);
  if (!std::is_same_v<T, double>)
    backward<T>(q, k, v, cu_q, cu_k, p, dout, dlse, dqT, dkT, dvT, keep, alibi);
  return {apply_rule<T>(dq, dqT, dq64), apply_rule<T>(dk, dkT, dk64), apply_rule<T>(dv, dvT, dv64)};
}

}  // namespace varlen

}  // namespace kfa::reference
