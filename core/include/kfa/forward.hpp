#pragma once
/// \file forward.hpp
/// kfa::forward: exact attention O = softmax(scale * Q K^T + mask) V and its log-sum-exp.

#include <kfa/float16.hpp>
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/masks.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

namespace kfa {

/// FlashAttention-2 forward pass on `space`.
///
/// \param space execution space the kernel runs on (asynchronously; fence before reading o, lse).
/// \param q     (batch, heads_q, seqlen_q, head_dim)
/// \param k     (batch, heads_k, seqlen_k, head_dim); heads_q must be a multiple of heads_k
///              (grouped-query attention: query head h uses key/value head h / (heads_q/heads_k)).
/// \param v     (batch, heads_k, seqlen_k, head_dim_v): v's head dim Dv may differ from the
///              head_dim D of q and k (both in [1, 256]).
/// \param o     output (batch, heads_q, seqlen_q, head_dim_v). Any layout whose head_dim stride
///              is 1.
/// \param lse   output (batch, heads_q, seqlen_q): natural log of the softmax denominator of the
///              scaled, masked scores; -inf (with o = 0) for a query that sees no key.
/// \param params scale, masks, softcap (see kfa::Params).
/// q, k, v share one value type: float, double, or a narrow float type: kfa::bf16 or kfa::half
/// (<kfa/float16.hpp>, 16-bit on every build), Kokkos' half_t and bhalf_t where the Kokkos
/// build makes them 16-bit types, or another type opted in through backends::is_narrow_float;
/// o has the same type; lse is float or wider.
/// Accumulation is in double for double inputs and in float otherwise; a narrow type's inputs
/// are converted to float on load and o is rounded once, on store.
/// \throws kfa::Error on the host, before any launch, for shapes that disagree, D or Dv outside
///         [1, 256], a non-unit head_dim stride or invalid params.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params = {}) {
  impl::static_check_pass<ExecSpace, true, Lse>(impl::Inputs<Q, K, V>{}, impl::Outputs<O>{});
  impl::forward(space, q, k, v, o, lse, params, impl::Origin{});
}

/// As above with a term of the score (kfa/masks.hpp): an additive one, S = softcap(scale Q K^T)
/// + bias, kfa::masks::Alibi{slopes} or kfa::masks::Bias{bias}; or a visibility one that hides
/// keys besides the masks of params, kfa::masks::Dense{mask} or kfa::masks::KeyPadding{lengths}
/// (a row left with no key gets o = 0, lse = -inf). Passes with a term take the tile kernels
/// on every backend (not the register-resident CUDA forward).
/// \throws kfa::Error as above, and for a term whose shape does not fit q and k or key lengths
///         outside [0, seqlen_k].
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Extra,
          std::enable_if_t<impl::is_term<Extra>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params, const Extra& extra) {
  impl::static_check_pass<ExecSpace, true, Lse>(impl::Inputs<Q, K, V>{}, impl::Outputs<O>{});
  impl::forward(space, q, k, v, o, lse, params, impl::Origin{}, extra);
}

}  // namespace kfa
