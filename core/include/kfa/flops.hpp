#pragma once
/// \file flops.hpp
/// FLOP counts in flash-attn's convention, so kfa's figures line up with published ones:
/// the forward does two matrix products, 2 * (head_dim + head_dim_v) FLOPs per visible (query,
/// key) pair (4 * head_dim when v's head dim is q's);
/// the backward 2 * (3 head_dim + 2 head_dim_v), 2.5 times the forward at equal head dims. And
/// the I/O model: the bytes each pass moves
/// between global memory and the chip, tile by tile, as kfa's kernels move them.

#include <kfa/impl/mask.hpp>
#include <kfa/params.hpp>

#include <string>

namespace kfa {

/// v's head dim Dv: head_dim_v, or head_dim where it is 0 (the default of every count below).
inline int value_head_dim(int head_dim, int head_dim_v) {
  return head_dim_v > 0 ? head_dim_v : head_dim;
}

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

/// FLOPs of one forward pass: 2 * batch * heads_q * visible_pairs * (head_dim + head_dim_v),
/// S = Q K^T over head_dim and P V over v's head dim head_dim_v (0: head_dim, the common case,
/// where this is 4 * ... * head_dim).
inline double forward_flops(int batch, int heads_q, int seqlen_q, int seqlen_k, int head_dim,
                            const Params& params = {}, int head_dim_v = 0) {
  const int dv = value_head_dim(head_dim, head_dim_v);
  return 2.0 * batch * heads_q * visible_pairs(params, seqlen_q, seqlen_k) * (head_dim + dv);
}

/// FLOPs of one backward pass: its five matrix products per visible pair, S = Q K^T, dQ = dS K
/// and dK = dS^T Q over head_dim, dP = dO V^T and dV = P^T dO over head_dim_v:
/// 2 * batch * heads_q * visible_pairs * (3 head_dim + 2 head_dim_v), head_dim_v as for
/// forward_flops; 2.5 times the forward's when they are equal (flash-attn's convention).
inline double backward_flops(int batch, int heads_q, int seqlen_q, int seqlen_k, int head_dim,
                             const Params& params = {}, int head_dim_v = 0) {
  const int dv = value_head_dim(head_dim, head_dim_v);
  return 2.0 * batch * heads_q * visible_pairs(params, seqlen_q, seqlen_k) *
         (3.0 * head_dim + 2.0 * dv);
}

/// Bytes a pass reads from and writes to global memory.
struct Traffic {
  double read = 0;     ///< bytes read
  double written = 0;  ///< bytes written
  /// read + written
  double total() const { return read + written; }
};

/// Visits the (query tile, key tile) pairs of one head that hold a visible pair, with tiles of
/// `rows` queries and `cols` keys: f(q0, nr, k0, nc) with the tiles' first rows and sizes.
/// The masks' visible keys form an interval per query whose ends grow with the query, so the
/// key tiles a query tile meets are those between its first row's first visible key and its
/// last row's last one.
template <class F>
void for_each_meeting_tile(const Params& params, int seqlen_q, int seqlen_k, int rows, int cols,
                           F&& f) {
  const impl::Mask mask = impl::make_mask(params, seqlen_q, seqlen_k);
  for (int q0 = 0; q0 < seqlen_q; q0 += rows) {
    const int nr = seqlen_q - q0 < rows ? seqlen_q - q0 : rows;
    const int lo = mask.lo(q0), hi = mask.hi(q0 + nr - 1);
    if (lo > hi) continue;
    for (int k0 = lo / cols * cols; k0 <= hi && k0 < seqlen_k; k0 += cols)
      f(q0, nr, k0, seqlen_k - k0 < cols ? seqlen_k - k0 : cols);
  }
}

/// The forward's traffic without split-KV (FlashAttention's Theorem 2 and Algorithm 1): per
/// (batch, query head, query tile of block_q rows) Q_i is read once and K_j, V_j once for every
/// key tile of block_k keys it meets; O and the LSE are written once. elem_bytes: the size of
/// q, k, v and o's values; lse_bytes: the LSE's; head_dim_v: v's and o's head dim Dv (0:
/// head_dim). Unmasked: e B Hq ((D + Dv) Nq + (D + Dv) T_r Nk) + lse B Hq Nq with T_r =
/// ceil(Nq / block_q), Theta(N^2 D / block_q) = Theta(N^2 D^2 / M) for tiles sized from an
/// on-chip memory of M bytes. Split-KV adds its partials' round trip (n x B x Hq x Nq x
/// (Dv + 2) accumulators written and read), not counted here.
inline Traffic forward_traffic(int batch, int heads_q, int seqlen_q, int seqlen_k, int head_dim,
                               int elem_bytes, int lse_bytes, const Params& params, int block_q,
                               int block_k, int head_dim_v = 0) {
  const double heads = double(batch) * heads_q, e = elem_bytes, d = head_dim,
               dv = value_head_dim(head_dim, head_dim_v);
  double kv_rows = 0;
  for_each_meeting_tile(params, seqlen_q, seqlen_k, block_q, block_k,
                        [&](int, int, int, int nc) { kv_rows += nc; });
  Traffic t;
  t.read = heads * (double(seqlen_q) * d * e + kv_rows * (d + dv) * e);
  t.written = heads * double(seqlen_q) * (dv * e + lse_bytes);
  return t;
}

/// The backward's traffic in dQ mode `mode` (DqMode::automatic is not a strategy: resolve it
/// first), with Bt x Bt tiles (block). All modes: the preprocessing reads dO and O and writes
/// delta (acc_bytes per row; with atomics it also zeroes dQ). Atomic and query pass: the
/// key-tile kernel reads K_j and V_j once per team (B x Hk x key tiles) and, for each query
/// head of the group and each query tile it meets, Q_i, dO_i, the LSE and delta, plus with
/// atomics a read and a write of dQ_i (acc-sized where dq is); it writes dK and dV once. The
/// query pass first transposes K and V into acc-typed copies, then per query tile reads Q_i,
/// dO_i, LSE and delta once and for each key tile it meets K_j and the two transposed tiles, and
/// writes dQ once. Symmetric (heads_q = heads_k, seqlen_q = seqlen_k): per team (b, h, tile j)
/// tile j's K, V, Q, dO, LSE and delta once; per tile i, Q_i, dO_i, LSE_i, delta_i when query
/// tile i meets key tile j and K_i, V_i when query tile j meets key tile i; dQ, dK, dV written
/// once. elem_bytes: q, k, v, o, dout and the gradients' values (float or double: a 16-bit dQ
/// with atomics goes through a float copy, not modelled); lse_bytes and acc_bytes: the LSE's
/// and the accumulation type's sizes; head_dim_v: Dv, the head dim of v, o, dO and dV (0:
/// head_dim), Q, K, dQ and dK rows being head_dim wide.
inline Traffic backward_traffic(int batch, int heads_q, int heads_k, int seqlen_q, int seqlen_k,
                                int head_dim, int elem_bytes, int lse_bytes, int acc_bytes,
                                const Params& params, int block, DqMode mode, int head_dim_v = 0) {
  if (mode == DqMode::automatic)
    throw Error("backward_traffic: mode is DqMode::automatic; pass the mode the backward runs");
  if (mode == DqMode::symmetric && (heads_q != heads_k || seqlen_q != seqlen_k))
    throw Error(
        "backward_traffic: DqMode::symmetric models self-attention (heads_q = heads_k, "
        "seqlen_q = seqlen_k), got heads " +
        std::to_string(heads_q) + " / " + std::to_string(heads_k) + ", seqlens " +
        std::to_string(seqlen_q) + " / " + std::to_string(seqlen_k));
  const double b = batch, e = elem_bytes, d = head_dim, dv = value_head_dim(head_dim, head_dim_v),
               nq = seqlen_q, nk = seqlen_k;
  double rows_q = 0, rows_k = 0;  // summed over meeting (query tile, key tile) pairs
  for_each_meeting_tile(params, seqlen_q, seqlen_k, block, block, [&](int, int nr, int, int nc) {
    rows_q += nr;
    rows_k += nc;
  });
  const double per_q_row = (d + dv) * e + lse_bytes + acc_bytes;  // Q, dO, LSE, delta
  const double per_k_row = (d + dv) * e;                          // K, V
  Traffic t;
  // Preprocessing: delta = rowsum(dO * O) (- dLSE, not counted), dQ zeroed for atomics.
  t.read += b * heads_q * nq * dv * 2 * e;
  t.written +=
      b * heads_q * nq * acc_bytes + (mode == DqMode::atomic ? b * heads_q * nq * d * e : 0);
  if (mode == DqMode::symmetric) {
    t.read +=
        b * heads_q * (nq * (per_q_row + per_k_row) + rows_q * per_q_row + rows_k * per_k_row);
    t.written += b * heads_q * nq * (2 * d + dv) * e;  // dQ, dK, dV
    return t;
  }
  // Key-tile kernel: K_j, V_j per team; per meeting query tile of each query head Q_i, dO_i,
  // LSE_i, delta_i (and dQ_i's read-modify-write with atomics); dK, dV written once.
  t.read += b * heads_k * nk * per_k_row + b * heads_q * rows_q * per_q_row;
  t.written += b * heads_k * nk * per_k_row;
  if (mode == DqMode::atomic) {
    t.read += b * heads_q * rows_q * d * e;
    t.written += b * heads_q * rows_q * d * e;
    return t;
  }
  // Query pass: K and V transposed once into acc_t copies; per query tile Q_i, dO_i, LSE_i,
  // delta_i once; per meeting key tile K_j and the transposed K_j^T, V_j^T; dQ written once.
  t.read += b * heads_k * nk * per_k_row + b * heads_q * nq * per_q_row +
            b * heads_q * rows_k * (d * e + (d + dv) * acc_bytes);
  t.written += b * heads_k * nk * (d + dv) * acc_bytes + b * heads_q * nq * d * e;
  return t;
}

}  // namespace kfa
