#pragma once
/// \file multiscale.hpp
/// kfa::msa: multi-scale attention (retention-style: no softmax; a per-head, per-position mask
/// tensor and a clamped absolute row sum), forward and backward.
///
/// Per batch b, query head h, query row i, with x_ij = scale (q_i . k_j):
///   S_ij = x_ij M[h, i, j]  (0 for a key the causal/window masks of msa::Params hide),
///   r_i = sum_j |S_ij|,  d_i = max(r_i, 1),  O_i = (1 / d_i) sum_j S_ij v_j.
/// The forward saves r_i (unclamped), the one row statistic the backward needs (as softmax
/// saves LSE). Gradients, given dO = dL/dO, with g_i = 1 if r_i >= 1 else 0 (the clamp's
/// derivative, PyTorch's convention at r = 1) and sign(0) = 0:
///   c_i = g_i (dO_i . O_i) / d_i,
///   dS_ij = (dO_i . v_j) / d_i - c_i sign(S_ij),   G_ij = scale M[h, i, j] dS_ij,
///   dV_j = sum_i (S_ij / d_i) dO_i,  dK_j = sum_i G_ij q_i,  dQ_i = sum_j G_ij k_j.
/// (O_i = P_i sum_j S_ij v_j with P_i = 1 / d_i: dL/dS_ij = P_i (dO_i . v_j) +
/// (dL/dP_i)(dP_i/dr_i) sign(S_ij), dL/dP_i = (dO_i . O_i) / P_i, dP_i/dr_i = -g_i P_i^2.)
/// The design this library was planned from states dS with the second term only (its eq. 8);
/// that is wrong, as test_reference shows against finite differences.
///
/// The kernels are kfa::forward's and kfa::backward's under another row rule (impl/rule.hpp):
/// the tile loop, the causal/window tile skipping, split-KV and both dQ modes are shared. Across
/// key tiles, split-KV chunks and ranks, partial rows (r, O~ = sum S_ij v_j) merge by
/// kfa::msa::combine_into (kfa/combine.hpp): addition, never of clamped d's.
///
/// The design's K layout [N, H, E, L] is a storage choice; kfa takes k as (batch, heads_k,
/// seqlen_k, head_dim) with unit head_dim stride, so a pre-transposed K needs a copy.

#include <kfa/combine.hpp>
#include <kfa/float16.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/rule.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <type_traits>

namespace kfa::impl {

/// Compile-time checks of the mask tensor: a rank-3 View of a floating-point or narrow type,
/// accessible from ExecSpace.
template <class ExecSpace, class M>
constexpr void static_check_mask() {
  static_assert(is_view_of_rank<M, 3>::value,
                "kfa::msa: mask must be a rank-3 View (heads_q, seqlen_q, seqlen_k)");
  using T = typename M::non_const_value_type;
  static_assert(std::is_floating_point_v<T> || backends::is_narrow_float<T>::value,
                "kfa::msa: mask must hold a floating-point or 16-bit float type");
  static_check_accessible<ExecSpace, M>();
}

/// Params checks, then the scale as the kernels hold it (in Acc).
template <class T>
void msa_validate(const char* pass, const msa::Params& p) {
  if (!std::isfinite(p.scale)) fail(pass, "scale must be finite, got ", p.scale);
  validate_params(pass, masks_of(p));
  using Acc = backends::accum_t<T>;
  if (!std::isfinite(static_cast<Acc>(p.scale)))
    fail(pass, "scale = ", p.scale, " is outside what the accumulation type holds");
}

/// mask extents against (heads_q, seqlen_q, seqlen_k) of q and k, both shapes named.
template <class Q, class K, class M>
void msa_validate_mask(const char* pass, const Q& q, const K& k, const M& mask) {
  if (mask.extent(0) != q.extent(1) || mask.extent(1) != q.extent(2) ||
      mask.extent(2) != k.extent(2))
    fail(pass, "mask has shape (", mask.extent(0), ", ", mask.extent(1), ", ", mask.extent(2),
         ") but must be (heads_q, seqlen_q, seqlen_k) = (", q.extent(1), ", ", q.extent(2), ", ",
         k.extent(2), ") from q and k");
}

/// Multi-scale attention keeps v's head dim equal to q's and k's (its reference and the
/// kfa::mpi blocks assume it): v with a head dim of its own is refused, both shapes named.
template <class Q, class V>
void msa_validate_value_head_dim(const char* pass, const Q& q, const V& v) {
  if (v.extent(3) != q.extent(3))
    fail(pass, "v is ", shape_of(v), " but q is ", shape_of(q),
         ": multi-scale attention needs v's head_dim equal to q's (a head dim of its own, Dv = ",
         v.extent(3), " != D = ", q.extent(3), ", is supported by kfa::forward only)");
}

/// The row rule of a call: the mask view (or none) and the scale.
template <class ExecSpace, class Q, class M>
auto msa_rule(const M& mask, bool has_mask, const msa::Params& p) {
  using Acc = backends::accum_t<typename Q::non_const_value_type>;
  return MultiScaleRule<Acc, M>{mask, has_mask, static_cast<Acc>(p.scale)};
}

/// The stand-in mask type of the calls without one (never read).
template <class ExecSpace>
using MsaNoMask =
    Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

template <class ExecSpace, class Q, class K, class V, class M, class O, class R>
void msa_forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask,
                 bool has_mask, const O& o, const R& rsum, const msa::Params& params) {
  static_check_pass<ExecSpace, true, R>(Inputs<Q, K, V>{}, Outputs<O>{});
  static_check_mask<ExecSpace, M>();
  ScopedRegion region("kfa::msa::forward");
  msa_validate<typename Q::non_const_value_type>("msa::forward", params);
  validate_forward("msa::forward", q, k, v, o, rsum, "rsum");
  msa_validate_value_head_dim("msa::forward", q, v);
  if (has_mask) msa_validate_mask("msa::forward", q, k, mask);
  const auto rule = msa_rule<ExecSpace, Q>(mask, has_mask, params);
  ForwardKernel<ExecSpace, Q, K, V, O, R, decltype(rule)>(space, q, k, v, o, rsum, masks_of(params),
                                                          Origin{}, rule)
      .launch(space);
}

template <class ExecSpace, class Q, class K, class V, class M, class O, class R, class DO, class DQ,
          class DK, class DV>
void msa_backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask,
                  bool has_mask, const O& o, const R& rsum, const DO& dout, const DQ& dq,
                  const DK& dk, const DV& dv, const msa::Params& params) {
  static_check_pass<ExecSpace, false, R>(Inputs<Q, K, V, O, DO>{}, Outputs<DQ, DK, DV>{});
  static_check_mask<ExecSpace, M>();
  ScopedRegion region("kfa::msa::backward");
  msa_validate<typename Q::non_const_value_type>("msa::backward", params);
  validate_backward("msa::backward", q, k, v, o, rsum, dout, static_cast<const R*>(nullptr), dq, dk,
                    dv, "rsum");
  msa_validate_value_head_dim("msa::backward", q, v);
  if (has_mask) msa_validate_mask("msa::backward", q, k, mask);
  backward_validated(space, q, k, v, o, rsum, dout, static_cast<const R*>(nullptr), dq, dk, dv,
                     masks_of(params), Origin{}, msa_rule<ExecSpace, Q>(mask, has_mask, params));
}

}  // namespace kfa::impl

namespace kfa::msa {

/// Multi-scale forward on `space` (see the file comment for the definition).
///
/// \param space execution space the kernels run on (asynchronously; fence before reading).
/// \param q     (batch, heads_q, seqlen_q, head_dim)
/// \param k, v  (batch, heads_k, seqlen_k, head_dim); heads_q a multiple of heads_k (GQA/MQA:
///              query head h uses kv head h / (heads_q / heads_k)).
/// \param mask  M, (heads_q, seqlen_q, seqlen_k), any layout, float, double or a 16-bit type;
///              the overload without it takes M = 1.
/// \param o     output like q.
/// \param rsum  output (batch, heads_q, seqlen_q), float or wider: r_i, unclamped.
/// \param params scale (default 1), causal/window masks, split-KV (kfa::msa::Params).
/// Value types and accumulation as kfa::forward. A row that sees no key, or whose mask row is
/// 0, gets O = 0 and r = 0.
/// \throws kfa::Error on the host, before any launch: what kfa::forward rejects, a mask whose
///         shape is not (heads_q, seqlen_q, seqlen_k) (both shapes named), a non-finite scale.
template <class ExecSpace, class Q, class K, class V, class M, class O, class R,
          std::enable_if_t<kfa::impl::is_view_of_rank<M, 3>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask, const O& o,
             const R& rsum, const Params& params = {}) {
  kfa::impl::msa_forward(space, q, k, v, mask, true, o, rsum, params);
}

/// As above with M = 1 (no mask tensor).
/// \param space, q, k, v, o, rsum, params as in the overload with a mask.
template <class ExecSpace, class Q, class K, class V, class O, class R,
          std::enable_if_t<kfa::impl::is_view_of_rank<O, 4>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const R& rsum,
             const Params& params = {}) {
  kfa::impl::msa_forward(space, q, k, v, kfa::impl::MsaNoMask<ExecSpace>(), false, o, rsum, params);
}

/// Multi-scale backward on `space`: dq, dk, dv of a loss given dout = dL/dO (formulas in the
/// file comment), recomputing S tile by tile from q, k and the mask.
///
/// \param space, q, k, v, mask, params as given to kfa::msa::forward (params.deterministic
///              chooses the dQ mode as in kfa::backward).
/// \param o     the forward's output; \param rsum the forward's r.
/// \param dout  gradient with respect to o, shaped like q.
/// \param dq    output like q; \param dk, dv outputs like k, v, summed over each GQA group.
/// \throws kfa::Error as kfa::msa::forward, and for gradients whose shapes differ from their
///         tensors'.
template <class ExecSpace, class Q, class K, class V, class M, class O, class R, class DO, class DQ,
          class DK, class DV, std::enable_if_t<kfa::impl::is_view_of_rank<M, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask, const O& o,
              const R& rsum, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params = {}) {
  kfa::impl::msa_backward(space, q, k, v, mask, true, o, rsum, dout, dq, dk, dv, params);
}

/// As above with M = 1 (no mask tensor).
/// \param space, q, k, v, o, rsum, dout, dq, dk, dv, params as in the overload with a mask.
template <class ExecSpace, class Q, class K, class V, class O, class R, class DO, class DQ,
          class DK, class DV, std::enable_if_t<kfa::impl::is_view_of_rank<O, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const R& rsum,
              const DO& dout, const DQ& dq, const DK& dk, const DV& dv, const Params& params = {}) {
  kfa::impl::msa_backward(space, q, k, v, kfa::impl::MsaNoMask<ExecSpace>(), false, o, rsum, dout,
                          dq, dk, dv, params);
}

}  // namespace kfa::msa
