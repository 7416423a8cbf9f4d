#pragma once
/// \file backward.hpp
/// kfa::backward: gradients of exact attention by recomputation (FlashAttention-2).

#include <kfa/float16.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/masks.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace kfa {

/// FlashAttention-2 backward pass on `space`: the gradients of a loss L with respect to q, k
/// and v, given dout = dL/dO (and, in the overload below, dlse = dL/dLSE).
///
/// \param space execution space the kernels run on (asynchronously; fence before reading).
/// \param q     (batch, heads_q, seqlen_q, head_dim), as given to kfa::forward.
/// \param k     (batch, heads_k, seqlen_k, head_dim), as given to kfa::forward.
/// \param v     (batch, heads_k, seqlen_k, head_dim_v), as given to kfa::forward.
/// \param o     the forward's output for these q, k, v and params.
/// \param lse   the forward's LSE (batch, heads_q, seqlen_q).
/// \param dout  gradient with respect to o, shaped like o.
/// \param dq    output: gradient with respect to q, shaped like q.
/// \param dk    output: gradient with respect to k, summed over the query heads of each group.
/// \param dv    output: gradient with respect to v (shaped like v), summed over the query heads
///              of each group.
/// \param params the forward's params (scale, masks, softcap), plus `deterministic`.
/// All tensors: any layout with unit head_dim stride; one value type (float, double or a
/// narrow float type, as for kfa::forward; narrow types accumulate in float, dq too).
/// Nothing but o and lse is kept from the forward: P is recomputed as exp(S - LSE).
/// params.dq_mode chooses how dQ is computed (kfa::DqMode: atomic adds from the key-tile
/// teams, a query-outer recomputation pass, or the one-kernel symmetric pass for
/// self-attention); the default picks atomics where they are cheap, and the query pass when
/// params.deterministic asks for dq, dk and dv bitwise identical run to run.
/// Rows that saw no key (LSE = -inf) contribute nothing: all gradients stay finite.
/// \throws kfa::Error on the host, before any launch, for arguments forward would reject or
///         gradients whose shapes differ from their tensors'.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, std::enable_if_t<impl::is_view_of_rank<DQ, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params = {}) {
  impl::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv,
                 params);
}

/// As above, with the gradient through the LSE as well. Its contribution is dS += P * dlse,
/// for losses that use the LSE (z-loss, log-partition terms, merging partial attention).
/// \param space, q, k, v, o, lse, dout, dq, dk, dv, params as in the overload above.
/// \param dlse  gradient with respect to lse, (batch, heads_q, seqlen_q), floating point.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV,
          std::enable_if_t<impl::is_view_of_rank<DLse, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params = {}) {
  impl::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, params);
}

/// The two overloads above with a term of the score (kfa/masks.hpp), the one the forward was
/// given: kfa::masks::Alibi{slopes}, kfa::masks::Dense{mask}, kfa::masks::KeyPadding{lengths}
/// (hidden keys get no gradient), or kfa::masks::Bias{bias, dbias}, whose dbias
/// (when not empty) receives dL/dbias summed over the broadcast dimensions of bias, computed
/// without atomics (bitwise repeatable for any dQ mode) from a (batch, heads_q, seqlen_q,
/// seqlen_k) buffer in the accumulation type that the call allocates.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK,
    class DV, class Extra,
    std::enable_if_t<impl::is_view_of_rank<DQ, 4>::value && impl::is_term<Extra>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params, const Extra& extra) {
  impl::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv, params,
                 impl::Origin{}, extra);
}
/// As the overload above, with the gradient through the LSE (dlse) as well.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse, class DQ,
    class DK, class DV, class Extra,
    std::enable_if_t<impl::is_view_of_rank<DLse, 3>::value && impl::is_term<Extra>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const Extra& extra) {
  impl::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, params, impl::Origin{}, extra);
}

}  // namespace kfa
