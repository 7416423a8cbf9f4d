#pragma once
/// \file impl/bias.hpp
/// The terms of kfa/masks.hpp as policies of the score transform (impl/score.hpp), and the
/// softmax rule that carries one into the kernels.
///
/// The visibility terms (a boolean mask, key padding) are additive terms too: 0 where the key
/// is visible, -inf where it is not. The kernels already take -inf scores (the interval masks
/// write them at their edges) and give a row with no finite score O = 0, LSE = -inf and no
/// gradient; P = exp(-inf - LSE) = 0 and dS = P (...) = 0 exclude a hidden key exactly. Key
/// padding also bounds the key tiles a batch visits (key_limit, see impl/score.hpp).
///
/// A policy has `enabled`, `has_gradient` and the call operator (b, h, i, j) -> term at local
/// positions; `placed` binds it to a pass (the diagonal of the masks, the block's origin). A
/// policy with a gradient also has `gradient(b, h, i, j, g)`, which the backward's key-tile
/// pass calls once per visible element with g = dL/dS; that pass computes every element of a
/// (batch, query head) exactly once, so it writes without atomics, into a full-size
/// (batch, heads_q, seqlen_q, seqlen_k) buffer that reduce_gradient then sums over the
/// broadcast dimensions of the bias in a fixed order.
///
/// The rule: BiasedSoftmaxRule<Policy> is SoftmaxRule with the policy as its payload, so the
/// kernels, which already take their rule as a template parameter, get the term through it
/// (bias_of) and the kernels of a pass without one are the ones instantiated before.

#include <kfa/backends/traits.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/rule.hpp>
#include <kfa/impl/score.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/masks.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kfa::impl {

/// Softmax with the additive term `Policy` on the scores.
template <class Policy>
struct BiasedSoftmaxRule : SoftmaxRule {
  Policy bias;
};

/// The score transform's additive term under Rule, and how a pass makes it: none, except
/// under BiasedSoftmaxRule.
template <class Rule, class Acc>
struct bias_of {
  using type = NoBias<Acc>;
  static type make(const Rule&, const Mask&, const Origin&) { return {}; }
};
template <class Policy, class Acc>
struct bias_of<BiasedSoftmaxRule<Policy>, Acc> {
  using type = Policy;
  static type make(const BiasedSoftmaxRule<Policy>& r, const Mask& m, const Origin& at) {
    return r.bias.placed(m, at);
  }
};

/// ALiBi: -slopes(h) |i + shift - j|, shift the masks' diagonal (Mask::shift, which also
/// carries the block's origin), so local indices give the global distance.
template <class Acc, class Slopes>
struct AlibiBias {
  static constexpr bool enabled = true;
  static constexpr bool has_gradient = false;
  Slopes slopes;
  long long shift = 0;

  AlibiBias placed(const Mask& m, const Origin&) const {
    AlibiBias a = *this;
    a.shift = m.shift;
    return a;
  }
  KOKKOS_INLINE_FUNCTION Acc operator()(int /*b*/, int h, int i, int j) const {
    const long long d = i + shift - j;
    return -static_cast<Acc>(slopes(h)) * static_cast<Acc>(d < 0 ? -d : d);
  }
  /// The term of head h with its slope in a register and the distance in int (local indices
  /// and the diagonal of an int-sized problem fit), so that a tile's loop vectorises.
  struct Line {
    Acc slope;
    int shift;
    KOKKOS_INLINE_FUNCTION Acc operator()(int i, int j) const {
      const int d = i + shift - j;
      return -slope * static_cast<Acc>(d < 0 ? -d : d);
    }
  };
  KOKKOS_INLINE_FUNCTION Line line(int /*b*/, int h) const {
    return {static_cast<Acc>(slopes(h)), static_cast<int>(shift)};
  }
};

/// A dense bias (B or 1, Hq or 1, seqlen_q, seqlen_k): broadcast dimensions are read at index
/// 0 by multiplying the index by 0 (no branch in the inner loop). `grad` is the full-size
/// dL/dS buffer when the gradient is wanted, else empty.
template <class Acc, class BiasView, class MemorySpace>
struct DenseBias {
  static constexpr bool enabled = true;
  static constexpr bool has_gradient = true;
  using grad_view = Kokkos::View<Acc****, Kokkos::LayoutRight, MemorySpace>;
  using convert = backends::Widen;  // the plane holds the term itself (has_rows)
  BiasView bias;
  grad_view grad;
  int per_b = 1, per_h = 1;  // 0 where the dimension broadcasts
  int oq = 0, ok = 0;        // the block's origin: the bias is indexed by global position

  DenseBias placed(const Mask&, const Origin& at) const {
    DenseBias d = *this;
    d.oq = static_cast<int>(at.q);
    d.ok = static_cast<int>(at.k);
    return d;
  }
  KOKKOS_INLINE_FUNCTION Acc operator()(int b, int h, int i, int j) const {
    return static_cast<Acc>(bias(b * per_b, h * per_h, i + oq, j + ok));
  }
  /// The (b, h) plane of the bias as a pointer and row stride (unit stride along keys is
  /// checked on the host), so that a tile's loop reads it without the View's index arithmetic.
  struct Line {
    const typename BiasView::value_type* plane;
    std::ptrdiff_t row_stride;
    int oq, ok;
    KOKKOS_INLINE_FUNCTION Acc operator()(int i, int j) const {
      return static_cast<Acc>(*(row(i) + j));
    }
    /// Local query i's row of the plane, at local key 0.
    KOKKOS_INLINE_FUNCTION const typename BiasView::value_type* row(int i) const {
      return plane + static_cast<std::ptrdiff_t>(i + oq) * row_stride + ok;
    }
  };
  KOKKOS_INLINE_FUNCTION Line line(int b, int h) const {
    return {bias.data() + static_cast<std::ptrdiff_t>(b) * per_b * bias.stride(0) +
                static_cast<std::ptrdiff_t>(h) * per_h * bias.stride(1),
            static_cast<std::ptrdiff_t>(bias.stride(2)), oq, ok};
  }
  KOKKOS_INLINE_FUNCTION bool wants_gradient() const { return grad.data() != nullptr; }
  /// At the global position, like the bias: a block of a larger problem (kfa::mpi) writes its
  /// own part of the whole problem's buffer.
  KOKKOS_INLINE_FUNCTION void gradient(int b, int h, int i, int j, Acc g) const {
    grad(b, h, i + oq, j + ok) = g;
  }
};

/// A boolean visibility mask (B or 1, Hq or 1, seqlen_q, seqlen_k) as the term 0 (visible) or
/// -inf (hidden), broadcast as DenseBias does. No gradient.
template <class Acc, class MaskView>
struct DenseVisibility {
  static constexpr bool enabled = true;
  static constexpr bool has_gradient = false;
  using convert = backends::Visibility;  // a byte of the plane to 0 or -inf (has_rows)
  MaskView mask;
  int per_b = 1, per_h = 1;  // 0 where the dimension broadcasts
  int oq = 0, ok = 0;        // the block's origin: the mask is indexed by global position

  DenseVisibility placed(const Mask&, const Origin& at) const {
    DenseVisibility d = *this;
    d.oq = static_cast<int>(at.q);
    d.ok = static_cast<int>(at.k);
    return d;
  }
  KOKKOS_INLINE_FUNCTION Acc operator()(int b, int h, int i, int j) const {
    return mask(b * per_b, h * per_h, i + oq, j + ok) ? Acc(0) : -backends::infinity<Acc>();
  }
  /// The (b, h) plane of the mask as a pointer and row stride (unit stride along keys is
  /// checked on the host): a select per element, which vectorises.
  struct Line {
    const typename MaskView::value_type* plane;
    std::ptrdiff_t row_stride;
    int oq, ok;
    KOKKOS_INLINE_FUNCTION Acc operator()(int i, int j) const {
      return *(row(i) + j) ? Acc(0) : -backends::infinity<Acc>();
    }
    /// Local query i's row of the plane, at local key 0.
    KOKKOS_INLINE_FUNCTION const typename MaskView::value_type* row(int i) const {
      return plane + static_cast<std::ptrdiff_t>(i + oq) * row_stride + ok;
    }
  };
  KOKKOS_INLINE_FUNCTION Line line(int b, int h) const {
    return {mask.data() + static_cast<std::ptrdiff_t>(b) * per_b * mask.stride(0) +
                static_cast<std::ptrdiff_t>(h) * per_h * mask.stride(1),
            static_cast<std::ptrdiff_t>(mask.stride(2)), oq, ok};
  }
};

/// Whether a term with rows (has_rows) is a boolean mask (its rows convert by Visibility).
template <class Bias, class = void>
struct is_visibility : std::false_type {};
template <class Bias>
struct is_visibility<Bias, std::void_t<typename Bias::convert>>
    : std::is_same<typename Bias::convert, backends::Visibility> {};

/// Whether the plane of a boolean mask (a DenseVisibility::Line) leaves visible any pair of
/// query rows [q0, q0 + nr) and keys [k0, k0 + nc) that the interval masks `mask` leave, by
/// the whole team: each row's bytes within its visible interval, until one is nonzero. The
/// kernels skip a tile pair it finds hidden, as they skip those the interval masks hide; it
/// reads the tile's bytes once, about 1 / head_dim of the pair's work.
template <class Member, class Line>
KOKKOS_INLINE_FUNCTION bool mask_sees_tile(const Member& team, const Line& line, const Mask& mask,
                                           int q0, int nr, int k0, int nc) {
  int any = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, nr),
      [&](int r, int& seen) {
        const int i = q0 + r, lo = mask.lo(i), hi = mask.hi(i);
        const int first = lo > k0 ? lo : k0, last = hi < k0 + nc - 1 ? hi : k0 + nc - 1;
        const auto* row = line.row(i);
        for (int j = first; j <= last && !seen; ++j)
          seen = row[j] != 0 ? 1 : 0;
      },
      Kokkos::BOr<int>(any));
  return any != 0;
}

/// Key padding: the term is 0 for global key j + ok < lengths(b), else -inf; key_limit(b) is
/// the local end of batch b's keys, where the kernels stop visiting key tiles.
template <class Acc, class Lengths>
struct KeyLengths {
  static constexpr bool enabled = true;
  static constexpr bool has_gradient = false;
  Lengths lengths;
  int ok = 0;  // the block's first key

  KeyLengths placed(const Mask&, const Origin& at) const {
    KeyLengths k = *this;
    k.ok = static_cast<int>(at.k);
    return k;
  }
  KOKKOS_INLINE_FUNCTION int key_limit(int b) const { return static_cast<int>(lengths(b)) - ok; }
  KOKKOS_INLINE_FUNCTION Acc operator()(int b, int /*h*/, int /*i*/, int j) const {
    return j < key_limit(b) ? Acc(0) : -backends::infinity<Acc>();
  }
  /// Batch b's limit in a register: a compare and select per element.
  struct Line {
    int limit;
    KOKKOS_INLINE_FUNCTION Acc operator()(int /*i*/, int j) const {
      return j < limit ? Acc(0) : -backends::infinity<Acc>();
    }
  };
  KOKKOS_INLINE_FUNCTION Line line(int b, int /*h*/) const { return {key_limit(b)}; }
};

/// The sizes a term is checked against.
struct Dims {
  std::size_t batch, heads_q, seqlen_q, seqlen_k;
};
template <class Q, class K>
Dims dims_of(const Q& q, const K& k) {
  return {q.extent(0), q.extent(1), q.extent(2), k.extent(2)};
}

/// Compile-time checks of a term's View: floating point, accessible from the execution space.
template <class ExecSpace, class View>
constexpr void static_check_term_view() {
  static_assert(Kokkos::is_view<View>::value, "kfa: mask object fields must be Kokkos::View");
  using T = typename View::non_const_value_type;
  static_assert(std::is_floating_point_v<T> || backends::is_narrow_float<T>::value,
                "kfa: ALiBi slopes and bias tensors must hold floating-point values");
  static_check_accessible<ExecSpace, View>();
}

/// Whether Extra is a term of kfa/masks.hpp (selects the public overloads that take one).
template <class Extra>
struct is_term : std::false_type {};
template <class S>
struct is_term<masks::Alibi<S>> : std::true_type {};
template <class B, class D>
struct is_term<masks::Bias<B, D>> : std::true_type {};
template <class M>
struct is_term<masks::Dense<M>> : std::true_type {};
template <class L>
struct is_term<masks::KeyPadding<L>> : std::true_type {};

/// No additive term: the plain softmax rule.
struct NoTerm {};
template <class Acc, class ExecSpace>
SoftmaxRule term_rule(const char*, const NoTerm&, const Dims&, bool) {
  return {};
}

/// A row rule given as it is (kfa::mpi's multi-scale blocks pass MultiScaleRule): no term.
template <class Acc, class ExecSpace, class Rule,
          std::enable_if_t<std::is_same_v<decltype(Rule::softmax), const bool>, int> = 0>
const Rule& term_rule(const char*, const Rule& rule, const Dims&, bool) {
  return rule;
}

/// The rule of a pass with ALiBi: checks the slopes (heads_q values) and binds them.
template <class Acc, class ExecSpace, class Slopes>
BiasedSoftmaxRule<AlibiBias<Acc, Slopes>> term_rule(const char* pass, const masks::Alibi<Slopes>& a,
                                                    const Dims& n, bool /*want_grad*/) {
  static_check_term_view<ExecSpace, Slopes>();
  static_assert(Slopes::rank == 1, "kfa: ALiBi slopes must be a rank-1 View (heads_q)");
  if (a.slopes.extent(0) != n.heads_q)
    fail(pass, "alibi slopes has shape ", shape_of(a.slopes), " but q has heads_q = ", n.heads_q,
         ": one slope per query head is needed");
  return {SoftmaxRule{}, AlibiBias<Acc, Slopes>{a.slopes, 0}};
}

/// The rule of a pass with a dense bias: checks bias (and dbias when the gradient is wanted and
/// given) and, for the gradient, allocates the zeroed dL/dS buffer.
template <class Acc, class ExecSpace, class BiasView, class DBiasView>
BiasedSoftmaxRule<DenseBias<Acc, BiasView, typename ExecSpace::memory_space>> term_rule(
    const char* pass, const masks::Bias<BiasView, DBiasView>& m, const Dims& n, bool want_grad) {
  static_check_term_view<ExecSpace, BiasView>();
  static_assert(BiasView::rank == 4,
                "kfa: a bias must be a rank-4 View (batch or 1, heads_q or 1, seqlen_q, seqlen_k)");
  const auto& x = m.bias;
  const std::string want = "(" + std::to_string(n.batch) + " or 1, " + std::to_string(n.heads_q) +
                           " or 1, " + std::to_string(n.seqlen_q) + ", " +
                           std::to_string(n.seqlen_k) + ")";
  if ((x.extent(0) != n.batch && x.extent(0) != 1) ||
      (x.extent(1) != n.heads_q && x.extent(1) != 1) || x.extent(2) != n.seqlen_q ||
      x.extent(3) != n.seqlen_k)
    fail(pass, "bias has shape ", shape_of(x), " but q, k need ", want,
         " (batch, heads_q, seqlen_q, seqlen_k)");
  if (x.extent(3) > 1 && x.stride(3) != 1)
    fail(pass, "bias must have unit stride in seqlen_k (dimension 3), got stride ", x.stride(3));
  using Policy = DenseBias<Acc, BiasView, typename ExecSpace::memory_space>;
  Policy p;
  p.bias = x;
  p.per_b = x.extent(0) == 1 ? 0 : 1;
  p.per_h = x.extent(1) == 1 ? 0 : 1;
  if (want_grad && m.dbias.data() != nullptr) {
    static_check_term_view<ExecSpace, DBiasView>();
    static_assert(DBiasView::rank == 4 && std::is_same_v<typename DBiasView::value_type,
                                                         typename DBiasView::non_const_value_type>,
                  "kfa: dbias must be a non-const rank-4 View shaped like bias");
    for (int d = 0; d < 4; ++d)
      if (m.dbias.extent(d) != x.extent(d))
        fail(pass, "dbias has shape ", shape_of(m.dbias), " but bias has shape ", shape_of(x));
    p.grad = typename Policy::grad_view("kfa::backward::dscores", n.batch, n.heads_q, n.seqlen_q,
                                        n.seqlen_k);
  }
  return {SoftmaxRule{}, p};
}

/// The rule of a pass with a boolean visibility mask: checks its type, shape and key stride.
template <class Acc, class ExecSpace, class MaskView>
BiasedSoftmaxRule<DenseVisibility<Acc, MaskView>> term_rule(const char* pass,
                                                            const masks::Dense<MaskView>& m,
                                                            const Dims& n, bool /*want_grad*/) {
  static_assert(Kokkos::is_view<MaskView>::value, "kfa: a dense mask must be a Kokkos::View");
  static_assert(std::is_integral_v<typename MaskView::non_const_value_type>,
                "kfa: a dense mask must hold integers (std::uint8_t: 0 hidden, else visible)");
  static_assert(MaskView::rank == 4,
                "kfa: a dense mask must be a rank-4 View (batch or 1, "
                "heads_q or 1, seqlen_q, seqlen_k)");
  static_check_accessible<ExecSpace, MaskView>();
  const auto& x = m.mask;
  if ((x.extent(0) != n.batch && x.extent(0) != 1) ||
      (x.extent(1) != n.heads_q && x.extent(1) != 1) || x.extent(2) != n.seqlen_q ||
      x.extent(3) != n.seqlen_k)
    fail(pass, "mask has shape ", shape_of(x), " but q, k need (", n.batch, " or 1, ", n.heads_q,
         " or 1, ", n.seqlen_q, ", ", n.seqlen_k, ") (batch, heads_q, seqlen_q, seqlen_k)");
  if (x.extent(3) > 1 && x.stride(3) != 1)
    fail(pass, "mask must have unit stride in seqlen_k (dimension 3), got stride ", x.stride(3));
  DenseVisibility<Acc, MaskView> p;
  p.mask = x;
  p.per_b = x.extent(0) == 1 ? 0 : 1;
  p.per_h = x.extent(1) == 1 ? 0 : 1;
  return {SoftmaxRule{}, p};
}

/// The rule of a pass with key padding: checks the lengths (batch values, each in
/// [0, seqlen_k], read through a host copy).
template <class Acc, class ExecSpace, class Lengths>
BiasedSoftmaxRule<KeyLengths<Acc, Lengths>> term_rule(const char* pass,
                                                      const masks::KeyPadding<Lengths>& m,
                                                      const Dims& n, bool /*want_grad*/) {
  static_assert(Kokkos::is_view<Lengths>::value, "kfa: key lengths must be a Kokkos::View");
  static_assert(std::is_integral_v<typename Lengths::non_const_value_type>,
                "kfa: key lengths must be integers (std::int32_t)");
  static_assert(Lengths::rank == 1, "kfa: key lengths must be a rank-1 View (batch)");
  static_check_accessible<ExecSpace, Lengths>();
  if (m.lengths.extent(0) != n.batch)
    fail(pass, "key_lengths has shape ", shape_of(m.lengths), " but q has batch = ", n.batch,
         ": one length per batch is needed");
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.lengths);
  for (std::size_t b = 0; b < n.batch; ++b)
    if (host(b) < 0 || static_cast<std::size_t>(host(b)) > n.seqlen_k)
      fail(pass, "key_lengths(", b, ") = ", static_cast<long long>(host(b)),
           " is outside [0, seqlen_k = ", n.seqlen_k, "]");
  return {SoftmaxRule{}, KeyLengths<Acc, Lengths>{m.lengths, 0}};
}

/// After the backward's kernels: dbias = the dL/dS buffer summed over the broadcast dimensions,
/// batch-major then head, in that fixed order. Nothing for terms without a gradient.
template <class ExecSpace, class Rule, class Extra>
void store_gradient(const ExecSpace&, const Rule&, const Extra&) {}
template <class ExecSpace, class Acc, class BiasView, class DBiasView>
void store_gradient(
    const ExecSpace& space,
    const BiasedSoftmaxRule<DenseBias<Acc, BiasView, typename ExecSpace::memory_space>>& rule,
    const masks::Bias<BiasView, DBiasView>& m) {
  const auto g = rule.bias.grad;
  if (g.data() == nullptr) return;
  const auto dbias = m.dbias;
  using out_t = typename DBiasView::non_const_value_type;
  const int nb = rule.bias.per_b ? 1 : static_cast<int>(g.extent(0));
  const int nh = rule.bias.per_h ? 1 : static_cast<int>(g.extent(1));
  Kokkos::parallel_for(
      "kfa::backward::dbias",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0},
          {static_cast<std::int64_t>(dbias.extent(0)), static_cast<std::int64_t>(dbias.extent(1)),
           static_cast<std::int64_t>(dbias.extent(2)), static_cast<std::int64_t>(dbias.extent(3))}),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
        Acc sum = 0;
        for (int bb = 0; bb < nb; ++bb)
          for (int hh = 0; hh < nh; ++hh)
            sum += g(b + bb, h + hh, i, j);
        dbias(b, h, i, j) = static_cast<out_t>(sum);
      });
}

}  // namespace kfa::impl
