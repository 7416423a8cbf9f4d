#pragma once
/// \file cuda/warp_softmax.hpp
/// The softmax parts of FlashAttention-2's tile steps on a warp's registers, forward and
/// backward (the products are cuda/mma.hpp's, their operands cuda/ldmatrix.hpp's). Forward: a warp
/// owns 16 query rows of S = Q K_j^T (NB accumulator fragments of 16 x 8, cuda/mma.hpp) and of the
/// output accumulator O~ (DB fragments); lane holds rows g = lane / 4 and g + 8 (c_coord), in
/// elements 0, 1 and 2, 3 of every fragment, and keeps its own (m, l) for both. The four lanes
/// of a quad (lanes 4g..4g+3) share those rows: a row's maximum and sum are the quad's,
/// reduced with two butterfly shuffles (lane ^ 1, lane ^ 2).
///
/// The step is split at the shuffles into per-lane functions, host and device code, so that
/// tests/test_mma.cpp runs them for 32 lanes with the shuffles emulated (a warp simulated on
/// the host) and the device kernel calls the same functions with quad_max / quad_sum between.
/// Scores come in already scaled, with invisible ones at -infinity. Exponentials are base 2
/// with log2(e) folded into the scores (FlashAttention-2's choice: ex2 is one instruction).
///
/// Per key tile: tile_row_max(s) -> quad_max -> softmax_update(s, m, l, alpha) -> rescale(o,
/// alpha) -> O~ += P V (P from s by a_from_c). At the end: quad_sum(l) -> finish_rows.

#include <kfa/backends/cuda/mma.hpp>

#include <cmath>

namespace kfa::backends::cuda {

/// log2(e): scores are multiplied by it once so that exp(x - m) = exp2(x' - m').
inline constexpr float log2e = 1.4426950408889634f;

/// 2^x. On the device one ex2.approx.ftz.f32 (MUFU.EX2: about 2 ulp, results below 2^-126
/// flushed to zero, exp2(-inf) = 0), where exp2f adds a range test and two multiplies to each
/// call for subnormal results, which P (rounded to 16 bits next, or split into tf32 parts of
/// about 21 bits) does not need; std::exp2 on
/// the host, whose simulator checks layouts and indices against double, not this rounding.
KFA_MMA_FUNCTION float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

/// Two finite floats rounded to bfloat16 in one register, lo in the low half: the rounding
/// of pack2 (nearest, ties to even), by one cvt.rn.bf16x2.f32 on sm_80 and newer instead of
/// integer arithmetic. The two differ only in the payload of a NaN.
KFA_MMA_FUNCTION std::uint32_t pack2_finite(bf16_tag tag, float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  (void)tag;
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack2(tag, lo, hi);
#endif
}

/// Two finite floats rounded to binary16 in one register, lo in the low half (cvt.rn.f16x2.f32
/// on sm_80 and newer; pack2 elsewhere).
KFA_MMA_FUNCTION std::uint32_t pack2_finite(f16_tag tag, float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  (void)tag;
  std::uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack2(tag, lo, hi);
#endif
}

/// a_from_c (cuda/mma.hpp) for finite values, P and dS: the A fragment of the 16 x 16 block
/// held in the accumulators `left` (columns 0-7) and `right` (8-15), by pack2_finite.
template <class Tag>
KFA_MMA_FUNCTION FragA<Tag> a_from_c_finite(Tag tag, const FragC& left, const FragC& right) {
  return FragA<Tag>{
      {pack2_finite(tag, left.x[0], left.x[1]), pack2_finite(tag, left.x[2], left.x[3]),
       pack2_finite(tag, right.x[0], right.x[1]), pack2_finite(tag, right.x[2], right.x[3])}};
}

/// A lane's running row state for its two rows (g, g + 8): maximum m (in base-2 units, -inf
/// before any visible key) and the lane's partial sum l of exp2(s - m) over its own columns.
struct RowState {
  float m[2];  ///< running maximum of rows g and g + 8
  float l[2];  ///< this lane's part of their sums (reduced over the quad at the end)
};

/// The state before the first key tile: m = -inf, l = 0.
KFA_MMA_FUNCTION RowState initial_rows() {
  return {{-INFINITY, -INFINITY}, {0.0f, 0.0f}};
}

/// The maximum of this lane's elements of rows g (out[0]) and g + 8 (out[1]) in S.
template <int NB>
KFA_MMA_FUNCTION void tile_row_max(const FragC (&s)[NB], float (&out)[2]) {
  KFA_UNROLL
  for (int h = 0; h < 2; ++h) {
    float m = -INFINITY;
    KFA_UNROLL
    for (int nb = 0; nb < NB; ++nb)
      m = fmaxf(m, fmaxf(s[nb].x[2 * h], s[nb].x[2 * h + 1]));
    out[h] = m;
  }
}

/// With `tile_max` the quad's row maxima of this tile: the new running maxima, S replaced by
/// P = exp2(S - m_new), this lane's l rescaled and increased by its row sums of P, and alpha =
/// exp2(m_old - m_new), the factor O~ must be rescaled by. A row that has seen no visible key
/// keeps m = -inf; its P and alpha are 0 (its O~ and l are still 0): the exponent base is 0
/// then, not -inf, so that -inf - -inf never makes a NaN.
template <int NB>
KFA_MMA_FUNCTION void softmax_update(FragC (&s)[NB], RowState& rows, const float (&tile_max)[2],
                                     float (&alpha)[2]) {
  KFA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(rows.m[h], tile_max[h]);
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = fast_exp2(rows.m[h] - base);
    float sum = 0.0f;
    KFA_UNROLL
    for (int nb = 0; nb < NB; ++nb) {
      KFA_UNROLL
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        s[nb].x[e] = fast_exp2(s[nb].x[e] - base);
        sum += s[nb].x[e];
      }
    }
    rows.l[h] = rows.l[h] * alpha[h] + sum;
    rows.m[h] = m_new;
  }
}

/// O~ *= alpha per row (elements 0, 1: row g; 2, 3: row g + 8).
template <int DB>
KFA_MMA_FUNCTION void rescale(FragC (&o)[DB], const float (&alpha)[2]) {
  KFA_UNROLL
  for (int db = 0; db < DB; ++db) {
    KFA_UNROLL
    for (int e = 0; e < 4; ++e)
      o[db].x[e] *= alpha[e >> 1];
  }
}

/// After the last key tile, with `row_sum` the quad's sums of l: O = O~ / l in place and each
/// row's log-sum-exp in natural units (lse[h] = (m + log2 l) / log2 e). A row that saw no key
/// gets O = 0 and LSE = -inf.
template <int DB>
KFA_MMA_FUNCTION void finish_rows(FragC (&o)[DB], const RowState& rows, const float (&row_sum)[2],
                                  float (&lse)[2]) {
  KFA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const bool empty = row_sum[h] == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / row_sum[h];
    KFA_UNROLL
    for (int db = 0; db < DB; ++db) {
      KFA_UNROLL
      for (int e = 2 * h; e < 2 * h + 2; ++e)
        o[db].x[e] *= inv;
    }
    lse[h] = empty ? -INFINITY : (rows.m[h] + log2f(row_sum[h])) / log2e;
  }
}

// The backward's tile step, FlashAttention-2's layout: a warp owns 16 keys and computes the
// transposed tiles S^T = K_j Q_i^T and dP^T = V_j dO_i^T in registers (rows: its keys, columns:
// the tile's queries), so that P^T and dS^T are the A operands of dV_j += P^T dO_i and dK_j +=
// dS^T Q_i straight from the accumulators (a_from_c). A lane's columns in n-block nb are the
// queries 8 nb + 2 (lane % 4) + {0, 1}; the per-query LSE and delta it needs are passed for
// those two columns of every n-block.

/// P^T = exp2(S^T - lse) in place, with S^T scaled by scale * log2(e) and masked (-inf) and
/// `lse` the columns' log-sum-exp in the same base-2 units. A query row with no visible key
/// (LSE = -inf) gets P = 0. Fast: exp2 by fast_exp2, else by exp2f.
template <bool Fast, int NB>
KFA_MMA_FUNCTION void probabilities(FragC (&st)[NB], const float (&lse)[NB][2]) {
  KFA_UNROLL
  for (int nb = 0; nb < NB; ++nb) {
    KFA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float l = lse[nb][e & 1], x = st[nb].x[e] - l;
      st[nb].x[e] = l == -INFINITY ? 0.0f : Fast ? fast_exp2(x) : exp2f(x);
    }
  }
}

/// dS^T = P^T (dP^T - delta) in place of dP^T, delta = rowsum(dO O) (minus dLSE) of the
/// columns' queries.
template <int NB>
KFA_MMA_FUNCTION void score_gradients(FragC (&dpt)[NB], const FragC (&pt)[NB],
                                      const float (&delta)[NB][2]) {
  KFA_UNROLL
  for (int nb = 0; nb < NB; ++nb) {
    KFA_UNROLL
    for (int e = 0; e < 4; ++e)
      dpt[nb].x[e] = pt[nb].x[e] * (dpt[nb].x[e] - delta[nb][e & 1]);
  }
}

#if defined(__CUDACC__)
/// The maximum of v over the four lanes of this lane's quad (all 32 lanes, converged).
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
/// The sum of v over the four lanes of this lane's quad (all 32 lanes, converged).
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
#endif  // __CUDACC__

}  // namespace kfa::backends::cuda
