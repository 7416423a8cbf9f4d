#pragma once
/// \file flops.hpp
/// FLOP counts in flash-attn's convention, so kfa's figures line up with published ones:
/// the forward does two matrix products, 4 * head_dim FLOPs per visible (query, key) pair;
/// the backward counts 2.5 times the forward.

#include <kfa/impl/mask.hpp>
#include <kfa/params.hpp>

namespace kfa {

/// Number of (query, key) pairs of one head that the masks in `params` leave visible.
inline double visible_pairs(const Params& params, int seqlen_q, int seqlen_k) {
  const impl::Mask mask = impl::make_mask(params, seqlen_q, seqlen_k);
  double pairs = 0;
  for (int i = 0; i < seqlen_q; ++i) {
    const int n = mask.hi(i) - mask.lo(i) + 1;
    pairs += n > 0 ? n : 0;
  }
  return pairs;
}

/// FLOPs of one forward pass: 4 * batch * heads_q * visible_pairs * head_dim.
inline double forward_flops(int batch, int heads_q, int seqlen_q, int seqlen_k, int head_dim,
                            const Params& params = {}) {
  return 4.0 * batch * heads_q * visible_pairs(params, seqlen_q, seqlen_k) * head_dim;
}

/// FLOPs of one backward pass: 2.5 times the forward's (flash-attn's convention: five matrix
/// products against the forward's two).
inline double backward_flops(int batch, int heads_q, int seqlen_q, int seqlen_k, int head_dim,
                             const Params& params = {}) {
  return 2.5 * forward_flops(batch, heads_q, seqlen_q, seqlen_k, head_dim, params);
}

}  // namespace kfa
