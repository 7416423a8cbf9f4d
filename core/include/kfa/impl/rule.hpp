#pragma once
/// \file impl/rule.hpp
/// The row rule of the attention kernels: what a row does with its scores, as a compile-time
/// policy of ForwardKernel, SplitMerge and the backward kernels. Everything else (the tile
/// loop, the staging, the tile products, the causal/window tile skipping, split-KV, the
/// backward's key-outer and query-outer passes) is shared.
///
///   SoftmaxRule (the default): online softmax, row statistics (m, l) merged by kfa::combine,
///     LSE saved; P = exp(S - LSE) in the backward.
///   MultiScaleRule: S = x M[h, i, j] with x = scale q.k, row statistic r = sum |S| merged by
///     kfa::msa::combine (a sum), O = O~ / max(r, 1) and r saved; in the backward
///     P = S / d and dL/dx = M (dP / d - c sign(S)) with c from the preprocessing
///     (kfa/multiscale.hpp has the derivation).
/// A rule's statistic travels where LSE does (the lse view, SplitPartials' ml, the backward's
/// staged row value), so a further rule is one more small type and its branches.

#include <Kokkos_Core.hpp>

namespace kfa::impl {

/// Softmax attention: the kernels' original rule.
struct SoftmaxRule {
  /// Whether this is softmax (the branches of the kernels test it at compile time).
  static constexpr bool softmax = true;
};

/// Multi-scale attention with the mask tensor `MaskView` (heads_q, seqlen_q, seqlen_k), read at
/// local positions; has_mask = false means M = 1 (the view is then empty).
template <class Acc, class MaskView>
struct MultiScaleRule {
  static constexpr bool softmax = false;
  MaskView m;
  bool has_mask = false;
  Acc scale = 1;  // replaces ScoreTransform's (which would read a negative scale as a default)

  /// M[h, i, j] in Acc.
  KOKKOS_INLINE_FUNCTION Acc weight(int h, int i, int j) const {
    return has_mask ? static_cast<Acc>(m(h, i, j)) : Acc(1);
  }
};

}  // namespace kfa::impl
