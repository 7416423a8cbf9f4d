#pragma once
/// \file impl/score.hpp
/// The score transform: how the dot product q.k of a query and a key becomes the score S the
/// softmax takes, and the derivative the backward needs, for every kernel in one place:
///
///   S = softcap(x) + bias(b, h, i, j),  x = scale q.k,  softcap(x) = cap tanh(x / cap)
///   (x itself when cap = 0), dS/dx = 1 - tanh^2(x / cap) (1 when cap = 0).
///
/// The kernels fold the scale into Q as they stage it (`scaled`), so their tile product is x
/// itself; the forward then turns a row of x into S (`row`), the backward an element into S
/// and dS/dx (`at`). The backward's dS = dL/dS is the gradient of the additive term; times
/// dS/dx it is dL/dx, which reaches Q and K through the same scale (dQ = scale dS K applied by
/// `scaled`, dK = dS^T (scale Q) by the staged Q).
///
/// Contract with the oracle: kfa::reference (reference.hpp) writes the same transform from
/// the definitions in kfa::Params, once, in reference::ScoreMap, and shares no code with this
/// file, so that a mistake here fails the tests instead of being mirrored by them. A new term
/// of the score (an additive bias tensor and its gradient, ALiBi slopes, another mask) is one
/// change here and one in reference::ScoreMap; the kernels call only this interface.
///
/// The seam for the additive term is the Bias policy (NoBias below is the interface): its
/// term is added after softcap, in `row` and in `at`, and compiled away when the policy says
/// it is disabled, so today's kernels pay nothing for it.

#include <kfa/backends/portability.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <type_traits>
#include <utility>

namespace kfa::impl {

/// The additive term of the score when there is none, and the interface of one: a policy
/// has `enabled` and the call operator below, and is copied into the kernels by value (it
/// holds Views, not host data). A policy whose term depends on global positions maps the
/// local indices it is given with the pass's impl::Origin, as Dropout does.
template <class Acc>
struct NoBias {
  /// Whether the term exists; false compiles every use of it away.
  static constexpr bool enabled = false;
  /// Whether the backward hands it dL/dS (a term with a gradient, impl/bias.hpp).
  static constexpr bool has_gradient = false;
  /// The term of local query row i and local key j of query head h in batch b.
  KOKKOS_INLINE_FUNCTION Acc operator()(int /*b*/, int /*h*/, int /*i*/, int /*j*/) const {
    return Acc(0);
  }
};

/// A policy's term for one (batch, head) as a function of (i, j): the policy's `line(b, h)`
/// where it has one (its per-head values loaded once, before the loops over a tile, which
/// then hold nothing the stores to the tile could alias), else its call operator.
template <class Bias, class = void>
struct has_line : std::false_type {};
template <class Bias>
struct has_line<Bias, std::void_t<decltype(std::declval<const Bias&>().line(0, 0))>>
    : std::true_type {};
template <class Bias>
struct CallLine {
  Bias bias;
  int b, h;
  KOKKOS_INLINE_FUNCTION auto operator()(int i, int j) const { return bias(b, h, i, j); }
};
template <class Bias>
KOKKOS_INLINE_FUNCTION auto line_of(const Bias& bias, int b, int h) {
  if constexpr (has_line<Bias>::value)
    return bias.line(b, h);
  else
    return CallLine<Bias>{bias, b, h};
}

/// Whether a policy's term is a dense (seqlen_q, seqlen_k) plane per (batch, head) whose rows
/// its line gives (`line(b, h).row(i)`: local query i's row, at local key 0, unit stride), with
/// the conversion of its elements to the term (`convert`, backends::Widen or Visibility): the
/// key-major forward then reads a tile of it a query row at a time and adds it transposed
/// (TileOps::stage_transposed) instead of reading it down a key's column, seqlen_k apart.
template <class Bias, class = void>
struct has_rows : std::false_type {};
template <class Bias>
struct has_rows<Bias, std::void_t<typename Bias::convert>> : std::true_type {};

/// The end of the keys a term leaves visible to batch b, as a local key index clamped to
/// [0, seqlen_k]: the policy's `key_limit(b)` where it has one (key padding), else seqlen_k.
/// Key tiles at or past it hold no finite score, so the kernels do not visit them.
template <class Bias, class = void>
struct has_key_limit : std::false_type {};
template <class Bias>
struct has_key_limit<Bias, std::void_t<decltype(std::declval<const Bias&>().key_limit(0))>>
    : std::true_type {};
template <class Bias>
KOKKOS_INLINE_FUNCTION int key_limit_of(const Bias& bias, int b, int seqlen_k) {
  if constexpr (has_key_limit<Bias>::value) {
    const int e = bias.key_limit(b);
    return e < 0 ? 0 : (e < seqlen_k ? e : seqlen_k);
  } else {
    (void)bias;
    (void)b;
    return seqlen_k;
  }
}

/// The score transform of one pass in the accumulation type Acc, made once on the host from
/// Params and head_dim and copied into the kernels.
template <class Acc, class Bias = NoBias<Acc>>
struct ScoreTransform {
  Acc scale = 1;    ///< Params::scale resolved: 1 / sqrt(head_dim) where it is negative
  Acc cap = 0;      ///< Params::softcap; 0 is off
  Acc inv_cap = 0;  ///< 1 / cap, or 0 when off: the kernels multiply instead of dividing
  Bias bias{};      ///< the additive term, after softcap

  ScoreTransform() = default;
  /// The transform of `p` (validated) for heads of `head_dim`, with the additive term `b`.
  ScoreTransform(const Params& p, int head_dim, const Bias& b = Bias{})
      : scale(static_cast<Acc>(p.scale < 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim))
                                           : p.scale)),
        cap(static_cast<Acc>(p.softcap)),
        inv_cap(cap > Acc(0) ? Acc(1) / cap : Acc(0)),
        bias(b) {}

  /// Whether softcap is on.
  KOKKOS_INLINE_FUNCTION bool capped() const { return cap > Acc(0); }
  /// Whether S = x (no softcap, no additive term): the kernels then skip the transform and
  /// keep their vectorised path.
  KOKKOS_INLINE_FUNCTION bool identity() const { return !Bias::enabled && !capped(); }

  /// scale * x: Q as it is staged, so that the tile product is x; and, for the same reason,
  /// the last step of dQ = scale dS K.
  KOKKOS_INLINE_FUNCTION Acc scaled(Acc x) const { return scale * x; }

  /// Forward: turns x into S in place on columns [c0, c1) of srow, the row of local query i
  /// of head (b, h) against the key tile at local key k0. Called by one thread; its vector
  /// lanes share the columns.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void row(const Member& member, int b, int h, int i, int k0, Acc* srow,
                                  int c0, int c1) const {
    if (capped())
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, c0, c1),
                           [&](int c) { srow[c] = cap * backends::tanh(srow[c] * inv_cap); });
    if constexpr (Bias::enabled) {
      const auto line = line_of(bias, b, h);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, c0, c1),
                           [&](int c) { srow[c] += line(i, k0 + c); });
    }
  }

  /// Forward, key-major: turns x into S in place on the first nr elements of scol, the column
  /// of local key j against the query rows from local query q0 (a row of S^T). Called by one
  /// thread; its vector lanes share the rows.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void column(const Member& member, int b, int h, int q0, int nr, int j,
                                     Acc* scol) const {
    softcap_column(member, nr, scol);
    if constexpr (Bias::enabled) {
      const auto line = line_of(bias, b, h);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, nr),
                           [&](int r) { scol[r] += line(q0 + r, j); });
    }
  }

  /// Forward, key-major: softcap alone on the first nr elements of scol (a row of S^T), for a
  /// pass that adds its term to the whole tile at once (has_rows).
  template <class Member>
  KOKKOS_INLINE_FUNCTION void softcap_column(const Member& member, int nr, Acc* scol) const {
    if (capped())
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, nr),
                           [&](int r) { scol[r] = cap * backends::tanh(scol[r] * inv_cap); });
  }

  /// Forward, one element: S of x for local query i and local key j of head (b, h), as `row`
  /// and `column` make it.
  KOKKOS_INLINE_FUNCTION Acc value(Acc x, int b, int h, int i, int j) const {
    Acc s = capped() ? cap * backends::tanh(x * inv_cap) : x;
    if constexpr (Bias::enabled) s += bias(b, h, i, j);
    return s;
  }

  /// Backward: S of x for local query i and local key j of head (b, h), and dS/dx in `slope`.
  /// The slope comes from the tanh just computed rather than from S / cap, which the
  /// additive term would shift.
  KOKKOS_INLINE_FUNCTION Acc at(Acc x, int b, int h, int i, int j, Acc& slope) const {
    Acc s = x;
    slope = Acc(1);
    if (capped()) {
      const Acc th = backends::tanh(x * inv_cap);
      s = cap * th;
      slope = Acc(1) - th * th;
    }
    if constexpr (Bias::enabled) s += bias(b, h, i, j);
    return s;
  }
};

}  // namespace kfa::impl
