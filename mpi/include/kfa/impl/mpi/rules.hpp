#pragma once
/// \file impl/mpi/rules.hpp
/// The attention rules kfa::mpi runs, as the modes see them: what a rank's partial result of a
/// row is, how two of them join, which kernels compute a block, and what the ranks must agree
/// on. The modes (ring.hpp, tree.hpp) and blocks.hpp are written once against this interface;
/// a further rule is one more small type here and its public passes in distributed.hpp.
///
/// Results travel as the kernels write them, normalised: rows (o, s) with s the rule's row
/// statistic. A join of rows over disjoint keys is o = (w_a o_a + w_b o_b) inv, s = s(a, b):
///  - SoftmaxRows: s = LSE; the combiner of kfa/combine.hpp on partials {m = LSE, l = 1, O};
///    identity (O = 0, LSE = -inf).
///  - MultiScaleRows: s = r, the unclamped row sum; w = max(r, 1) recovers each side's
///    O~ = sum S v, the partials (r, O~) add (kfa::msa::combine_into), and inv = 1 / max(r_a +
///    r_b, 1) normalises the sum; identity (O = 0, r = 0). Clamped d's are never added.
///
/// Interface of a rule R (besides the joins, which are static so that an MPI_Op can call them):
///   masks(): the kfa::Params whose causal/window masks and dQ mode the blocks use;
///   validate<T>(name, q, sp): the rule's own checks of a rank's arguments (params, mask);
///   with_term<Acc, ExecSpace>(name, extra, dims, grad): the rule the blocks run, with a score
///     term of kfa/masks.hpp checked against the whole problem's dims and bound (softmax only);
///   agreed(): the Params every rank must pass alike; has_mask(): whether a mask is given;
///   forward(space, block, q, k, v, o, stat), backward(space, block, ...): a block's kernels;
///   delta(space, delta, dout, o, stat, dlse, dq): the backward's row term from final rows.

#include <kfa/backends/portability.hpp>
#include <kfa/combine.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/bias.hpp>
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/rule.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/multiscale.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <Kokkos_Core.hpp>

#include <utility>

namespace kfa::mpi::impl {

/// A block of query rows against key rows: where they are in the tensors a rank passes to the
/// kernels, and where the block sits in the whole problem.
struct Block {
  Segment q;  // the queries' rows in the query tensors
  Segment k;  // the keys' rows in the key tensors
  kfa::impl::Origin at;
};

/// Rows s of a (B, H, rows[, D]) view.
template <class View>
auto rows_of(const View& v, const Segment& s) {
  const auto r = std::make_pair(s.begin, s.begin + s.size);
  if constexpr (View::rank == 3)
    return Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, r);
  else
    return Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, r, Kokkos::ALL);
}

/// The factors of a join of two normalised rows: o = (wa o_a + wb o_b) inv, statistic stat.
template <class A>
struct Join {
  A wa, wb, inv, stat;
};

/// Softmax attention (kfa::mpi::forward, kfa::mpi::backward) under the kernels' row rule
/// `Rule`: SoftmaxRule, or BiasedSoftmaxRule carrying a score term of kfa/masks.hpp
/// (impl/bias.hpp). Every rank holds the whole term; the kernels place it at each block's
/// origin, so a block reads it (and writes its part of the dbias buffer) at global positions.
template <class Rule = kfa::impl::SoftmaxRule>
struct SoftmaxRows {
  Params params;
  Rule rule{};

  /// What kfa::mpi::forward takes and writes beside o.
  static constexpr const char* stat_name = "lse";
  static constexpr const char* name = "softmax";

  template <class A>
  KOKKOS_INLINE_FUNCTION static A empty() {
    return -backends::infinity<A>();
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION static Join<A> join(A lse_a, A lse_b) {
    const Rescale<A> r = rescale(lse_a, lse_b);
    const A l = r.alpha + r.beta;
    return {r.alpha, r.beta, l > A(0) ? A(1) / l : A(0), kfa::lse(Partial<A>{r.m, l})};
  }

  const Params& masks() const { return params; }
  const Params& agreed() const { return params; }
  bool has_mask() const { return false; }
  template <class T, class Q>
  void validate(const char* name, const Q&, const SeqPar&) const {
    kfa::impl::validate_params<T>(name, params);
  }
  /// These rows with the score term `extra` (NoTerm: none) checked against the whole problem
  /// `n` and bound: with a dense bias and `grad`, a zeroed dL/dS buffer of the whole problem.
  template <class Acc, class ExecSpace, class Extra>
  auto with_term(const char* name, const Extra& extra, const kfa::impl::Dims& n, bool grad) const {
    auto bound = kfa::impl::term_rule<Acc, ExecSpace>(name, extra, n, grad);
    return SoftmaxRows<decltype(bound)>{params, bound};
  }

  template <class ExecSpace, class Q, class K, class V, class O, class L>
  void forward(const ExecSpace& space, const Block& b, const Q& q, const K& k, const V& v,
               const O& o, const L& lse) const {
    kfa::impl::forward(space, q, k, v, o, lse, params, b.at, rule);
  }
  template <class ExecSpace, class Q, class K, class V, class DO, class L, class Delta, class DQ,
            class DK, class DV>
  void backward(const ExecSpace& space, const Block& b, const Q& q, const K& k, const V& v,
                const DO& dout, const L& lse, const Delta& delta, const DQ& dq, const DK& dk,
                const DV& dv) const {
    kfa::impl::backward_add(space, q, k, v, dout, lse, delta, dq, dk, dv, params, b.at, rule);
  }
  /// delta = rowsum(dO * O) - dLSE (dlse may be nullptr), zeroing dq.
  template <class ExecSpace, class Delta, class DO, class O, class L, class DLse, class DQ>
  void delta(const ExecSpace& space, const Delta& delta, const DO& dout, const O& o, const L&,
             const DLse* dlse, const DQ& dq) const {
    kfa::impl::backward_delta(space, delta, dout, o, dlse, dq, /*zero_dq=*/true);
  }
};

/// Multi-scale attention (kfa::mpi::msa) with the whole mask tensor `Mask` (heads_q, seqlen_q,
/// seqlen_k) at global positions on every rank, or none (M = 1). Each block reads the mask's
/// rows and columns at the block's global position.
template <class Mask>
struct MultiScaleRows {
  kfa::msa::Params params;
  Mask mask;
  bool given = false;

  static constexpr const char* stat_name = "rsum";
  static constexpr const char* name = "msa";

  template <class A>
  KOKKOS_INLINE_FUNCTION static A empty() {
    return A(0);
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION static Join<A> join(A r_a, A r_b) {
    const kfa::msa::Partial<A> a{r_a}, b{r_b}, ab = kfa::msa::combine(a, b);
    return {kfa::msa::denominator(a), kfa::msa::denominator(b), A(1) / kfa::msa::denominator(ab),
            ab.r};
  }

  Params masks() const { return masks_of(params); }
  /// The masks with the multi-scale scale: the values the ranks compare.
  Params agreed() const {
    Params p = masks_of(params);
    p.scale = params.scale;
    return p;
  }
  bool has_mask() const { return given; }
  template <class T, class Q>
  void validate(const char* name, const Q& q, const SeqPar& sp) const {
    kfa::impl::msa_validate<T>(name, params);
    if (given && (static_cast<long long>(mask.extent(0)) != static_cast<long long>(q.extent(1)) ||
                  static_cast<long long>(mask.extent(1)) != sp.seqlen_q ||
                  static_cast<long long>(mask.extent(2)) != sp.seqlen_k))
      kfa::impl::fail(name, "mask has shape (", mask.extent(0), ", ", mask.extent(1), ", ",
                      mask.extent(2), ") but must be the whole (heads_q, seqlen_q, seqlen_k) = (",
                      q.extent(1), ", ", sp.seqlen_q, ", ", sp.seqlen_k,
                      ") on every rank (from q and SeqPar)");
  }
  /// No score term here: kfa::mpi::msa's public passes take none.
  template <class Acc, class ExecSpace>
  const MultiScaleRows& with_term(const char*, const kfa::impl::NoTerm&, const kfa::impl::Dims&,
                                  bool) const {
    return *this;
  }

  /// The kernels' rule for block b: the mask cut to the block's global rows and columns.
  template <class Q>
  auto rule(const Block& b) const {
    const auto rows = given ? std::make_pair(b.at.q, b.at.q + b.q.size) : std::make_pair(0LL, 0LL);
    const auto cols = given ? std::make_pair(b.at.k, b.at.k + b.k.size) : std::make_pair(0LL, 0LL);
    using Acc = backends::accum_t<typename Q::non_const_value_type>;
    const auto m = Kokkos::subview(mask, Kokkos::ALL, rows, cols);
    return kfa::impl::MultiScaleRule<Acc, decltype(m)>{m, given, static_cast<Acc>(params.scale)};
  }

  template <class ExecSpace, class Q, class K, class V, class O, class L>
  void forward(const ExecSpace& space, const Block& b, const Q& q, const K& k, const V& v,
               const O& o, const L& rsum) const {
    kfa::impl::forward(space, q, k, v, o, rsum, masks(), b.at, rule<Q>(b));
  }
  template <class ExecSpace, class Q, class K, class V, class DO, class L, class Delta, class DQ,
            class DK, class DV>
  void backward(const ExecSpace& space, const Block& b, const Q& q, const K& k, const V& v,
                const DO& dout, const L& rsum, const Delta& c, const DQ& dq, const DK& dk,
                const DV& dv) const {
    kfa::impl::backward_add(space, q, k, v, dout, rsum, c, dq, dk, dv, masks(), b.at, rule<Q>(b));
  }
  /// c = [r >= 1] rowsum(dO * O) / max(r, 1) from the final rows, zeroing dq.
  template <class ExecSpace, class Delta, class DO, class O, class L, class DLse, class DQ>
  void delta(const ExecSpace& space, const Delta& c, const DO& dout, const O& o, const L& rsum,
             const DLse*, const DQ& dq) const {
    kfa::impl::backward_delta(space, c, dout, o, &rsum, dq, /*zero_dq=*/true, /*rsum=*/true);
  }
};

}  // namespace kfa::mpi::impl
