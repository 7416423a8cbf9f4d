#pragma once
/// \file impl/mask.hpp
/// Causal and sliding-window masks as a visible key interval per query row.
///
/// Every mask kfa supports leaves each query row i a contiguous interval of keys
/// [lo(i), hi(i)], and both ends grow with i. A query tile therefore sees the keys
/// [lo(first row), hi(last row)], so key tiles outside that range are skipped, and inside a
/// tile each row only tests its two ends.

#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>

namespace kfa::impl {

struct Mask {
  int seqlen_k = 0;
  long long shift = 0;   // key index on the diagonal of query 0
  long long left = -1;   // keys visible left of the diagonal, -1 = unbounded
  long long right = -1;  // keys visible right of the diagonal, -1 = unbounded

  /// First visible key of query i (may exceed hi(i): nothing visible).
  KOKKOS_INLINE_FUNCTION int lo(int i) const {
    if (left < 0) return 0;
    const long long l = i + shift - left;
    return l < 0 ? 0 : (l > seqlen_k ? seqlen_k : static_cast<int>(l));
  }
  /// Last visible key of query i (may be below lo(i), or -1).
  KOKKOS_INLINE_FUNCTION int hi(int i) const {
    if (right < 0) return seqlen_k - 1;
    const long long h = i + shift + right;
    return h < -1 ? -1 : (h > seqlen_k - 1 ? seqlen_k - 1 : static_cast<int>(h));
  }
  /// Whether query i sees key j.
  KOKKOS_INLINE_FUNCTION bool visible(int i, int j) const { return lo(i) <= j && j <= hi(i); }
  /// Whether any row of the query tile at q0 (n rows) sees any key of the tile at k0 (nc keys):
  /// the first row's lo and the last row's hi bound what the tile sees.
  KOKKOS_INLINE_FUNCTION bool tile_visible(int q0, int n, int k0, int nc) const {
    const int l = lo(q0), h = hi(q0 + n - 1);
    return l <= h && l <= k0 + nc - 1 && h >= k0;
  }
  /// Whether every row of the query tile at q0 (n rows) sees every key of the tile at k0 (nc
  /// keys): the last row's lo and the first row's hi decide.
  KOKKOS_INLINE_FUNCTION bool tile_inside(int q0, int n, int k0, int nc) const {
    return lo(q0 + n - 1) <= k0 && hi(q0) >= k0 + nc - 1;
  }
  /// Columns [cb, ce) of the key tile at k0 (nc keys) that some row of the query tile at q0
  /// (nr rows) sees, relative to k0; cb >= ce when none does.
  KOKKOS_INLINE_FUNCTION void tile_columns(int q0, int nr, int k0, int nc, int& cb, int& ce) const {
    const int l = lo(q0) - k0, h = hi(q0 + nr - 1) + 1 - k0;
    cb = l > 0 ? l : 0;
    ce = h < nc ? h : nc;
  }
};

/// Where a pass's queries and keys sit in a longer sequence: the global index of local query 0
/// and of local key 0, and the global lengths the masks align to (-1: the local ones). The
/// MPI layer runs the kernels on blocks of a sharded sequence; masks and dropout must see
/// global positions there. A plain call uses the default: the block is the whole sequence.
/// `b` is the batch index of local batch 0 as dropout sees it: a packed variable-length call
/// (kfa::varlen) runs sequence s as a batch of one at b = s, so that its keep-mask is batch
/// element s's of the padded batch.
struct Origin {
  long long q = 0, k = 0;
  long long seqlen_q = -1, seqlen_k = -1;
  long long b = 0;
};

inline Mask make_mask(const Params& p, int seqlen_q, int seqlen_k, const Origin& at = {}) {
  Mask m;
  m.seqlen_k = seqlen_k;
  const long long nq = at.seqlen_q < 0 ? seqlen_q : at.seqlen_q;
  const long long nk = at.seqlen_k < 0 ? seqlen_k : at.seqlen_k;
  // Query i, key j (local) are global i + at.q, j + at.k: the diagonal moves by at.q - at.k.
  m.shift = (p.align == Align::bottom_right ? nk - nq : 0) + at.q - at.k;
  m.left = p.window_left;
  m.right = p.window_right;
  if (p.causal) m.right = m.right < 0 ? 0 : std::min<long long>(m.right, 0);
  return m;
}

}  // namespace kfa::impl
