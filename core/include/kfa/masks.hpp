#pragma once
/// \file masks.hpp
/// Terms of the score beyond kfa::Params: ALiBi slopes, a dense bias tensor, a boolean
/// visibility mask and per-batch key lengths (key padding).
///
/// They are passed to kfa::forward and kfa::backward as one more argument after the Params
/// (the "mask object"), not as fields of Params, because they hold Kokkos Views: Params is a
/// plain host struct of numbers that the programs print, the C API mirrors and kfa::mpi
/// compares across ranks, while a View has a type (value, layout, memory space) that the
/// kernels must know at compile time. As a separate typed object each term is a compile-time
/// policy of the kernels (impl/bias.hpp), so a pass without one compiles to the kernels it
/// had before and pays nothing, and a further kind of mask or term is one more such type.
///
/// With either term the score is
///   S_ij = softcap(scale q_i . k_j) + bias_ij,
/// added after the softcap and before the masks of Params (a key they hide stays hidden: its
/// bias is never read).
///
/// Dense and KeyPadding hide keys on top of the masks of Params (causal, windows): a key one
/// of them hides is excluded exactly (P = 0, dS = 0), as if the score were -inf, and a query
/// row left with no visible key gets O = 0, LSE = -inf and no gradient. One call takes one
/// term: a combination (a boolean mask with a bias, say) is not expressed by this API yet.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <vector>

namespace kfa::masks {

/// ALiBi: bias_ij = -slopes(h) |i + shift - j| for query head h, where shift is the diagonal
/// of the causal and window masks (Params::align: seqlen_k - seqlen_q for bottom_right, 0 for
/// top_left), so that the bias is 0 on that diagonal and grows with the distance from it.
/// `slopes` is a rank-1 View of heads_q floating-point values accessible from the execution
/// space. No gradient is taken for the slopes.
template <class Slopes>
struct Alibi {
  Slopes slopes;  ///< One slope per query head (heads_q), floating point.
};

/// Deduction guide, so that `kfa::masks::Alibi{view}` names the type.
template <class Slopes>
Alibi(Slopes) -> Alibi<Slopes>;

/// A dense additive bias: bias_ij = bias(b, h, i, j), a rank-4 floating-point View of extents
/// (batch or 1, heads_q or 1, seqlen_q, seqlen_k); an extent of 1 broadcasts over that
/// dimension. `dbias`, read by kfa::backward only, receives dL/dbias = dL/dS summed over the
/// broadcast dimensions when it is not empty (same extents as bias); it is written, not added
/// to, and deterministically (a fixed summation order, no atomics). kfa::forward ignores it.
template <class BiasView, class DBiasView = typename BiasView::non_const_type>
struct Bias {
  BiasView bias;      ///< The bias, (batch or 1, heads_q or 1, seqlen_q, seqlen_k).
  DBiasView dbias{};  ///< Its gradient, shaped like bias; empty: not computed.
};

/// Deduction guide: `kfa::masks::Bias{bias}` (no gradient).
template <class BiasView>
Bias(BiasView) -> Bias<BiasView>;
/// Deduction guide: `kfa::masks::Bias{bias, dbias}`.
template <class BiasView, class DBiasView>
Bias(BiasView, DBiasView) -> Bias<BiasView, DBiasView>;

/// A boolean visibility mask: key j is visible to query i of head h in batch b iff
/// mask(b, h, i, j) != 0, a rank-4 View of std::uint8_t (or another integral type) of extents
/// (batch or 1, heads_q or 1, seqlen_q, seqlen_k) with unit stride in seqlen_k; an extent of 1
/// broadcasts over that dimension.
template <class MaskView>
struct Dense {
  MaskView mask;  ///< Nonzero: visible; (batch or 1, heads_q or 1, seqlen_q, seqlen_k).
};

/// Deduction guide, so that `kfa::masks::Dense{view}` names the type.
template <class MaskView>
Dense(MaskView) -> Dense<MaskView>;

/// Key padding: key j of batch b is visible iff j < lengths(b), for every query and head.
/// `lengths` is a rank-1 View of batch integers (std::int32_t) in [0, seqlen_k], read on the
/// host for validation (it is copied there once) and in the kernels; whole key tiles at or
/// past a batch's length are skipped.
template <class Lengths>
struct KeyPadding {
  Lengths lengths;  ///< Keys each batch sees, (batch), each in [0, seqlen_k].
};

/// Deduction guide, so that `kfa::masks::KeyPadding{view}` names the type.
template <class Lengths>
KeyPadding(Lengths) -> KeyPadding<Lengths>;

/// The standard ALiBi slopes of `heads` heads (Press et al.): head h (from 0) gets
/// 2^(-8 (h + 1) / heads), the geometric sequence the paper defines for any head count.
inline std::vector<double> alibi_slopes(int heads) {
  std::vector<double> s(heads > 0 ? static_cast<std::size_t>(heads) : 0);
  for (int h = 0; h < heads; ++h)
    s[static_cast<std::size_t>(h)] = std::exp2(-8.0 * (h + 1) / heads);
  return s;
}

}  // namespace kfa::masks
