#pragma once
/// \file impl/packed.hpp
/// How a pass's league of query tiles maps onto its sequences.
///
/// A padded batch (PaddedBatch) has B sequences of the views' lengths, each q_tiles query tiles:
/// the league index gives (batch, head, tile) by division. Packed sequences (kfa::varlen,
/// PackedSequences) have lengths of their own, so they have tile counts of their own: a small
/// array of each sequence's first tile (the prefix sums of its tile counts, built on the host
/// from cu_seqlens) maps a tile to its sequence by binary search, and the sequence's row
/// offsets and lengths place it. One launch covers every (sequence, head, tile); a sequence
/// without queries has no tile. The padded batch is the special case of equal lengths; it keeps
/// its division (PaddedBatch compiles to nothing), so its kernels are those it had before.

#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kfa::impl {

/// The sequences of a padded batch: the views' batch dimension.
struct PaddedBatch {
  static constexpr bool packed = false;
};

/// Packed sequences: sequence s has the query rows [cu_q(s), cu_q(s + 1)) and key rows
/// [cu_k(s), cu_k(s + 1)) of batch 0 of the views, the query tiles [tiles(s), tiles(s + 1)) of
/// the pass (per head) and the key tiles [key_tiles(s), key_tiles(s + 1)) (the backward's
/// key-tile kernel).
template <class MemorySpace>
struct PackedSequences {
  static constexpr bool packed = true;
  Kokkos::View<int*, MemorySpace> tiles, key_tiles, cu_q, cu_k;  // count + 1 entries each
  int count = 0;                                                 // sequences
  int total_tiles = 0;       // query tiles of all sequences, per head
  int total_key_tiles = 0;   // key tiles of all sequences, per head
  bool bottom_right = true;  // Params::align: where each sequence's diagonal lies

  /// A tile's sequence: its index s, first query and key rows, lengths, and the tile's index
  /// within the sequence.
  struct Seq {
    int s, q_begin, k_begin, nq, nk, tile;
  };
  /// The sequence of query tile t (0 <= t < total_tiles), or of key tile t (`keys`, t <
  /// total_key_tiles): the last s whose first tile is at most t, which skips the sequences
  /// without tiles.
  KOKKOS_INLINE_FUNCTION Seq locate(int t, bool keys = false) const {
    const auto& first = keys ? key_tiles : tiles;
    int lo = 0, hi = count;  // first(lo) <= t < first(hi)
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      if (first(mid) <= t)
        lo = mid;
      else
        hi = mid;
    }
    return {lo,           cu_q(lo), cu_k(lo), cu_q(lo + 1) - cu_q(lo), cu_k(lo + 1) - cu_k(lo),
            t - first(lo)};
  }
  /// Index of key 0's diagonal for query 0 of a sequence of these lengths (Mask::shift).
  KOKKOS_INLINE_FUNCTION long long shift(int nq, int nk) const {
    return bottom_right ? static_cast<long long>(nk) - nq : 0;
  }
};

/// The packed sequences of the checked host offsets cq and ck for tiles of `rows` rows.
template <class MemorySpace>
PackedSequences<MemorySpace> packed_sequences(const std::vector<std::int32_t>& cq,
                                              const std::vector<std::int32_t>& ck, int rows,
                                              const Params& p) {
  PackedSequences<MemorySpace> seqs;
  const std::size_t n = cq.size();
  seqs.count = static_cast<int>(n) - 1;
  seqs.bottom_right = p.align == Align::bottom_right;
  using View = Kokkos::View<int*, MemorySpace>;
  seqs.tiles = View(std::string("kfa::varlen::tiles"), n);
  seqs.key_tiles = View(std::string("kfa::varlen::key_tiles"), n);
  seqs.cu_q = View(std::string("kfa::varlen::cu_q"), n);
  seqs.cu_k = View(std::string("kfa::varlen::cu_k"), n);
  const auto t = Kokkos::create_mirror_view(seqs.tiles),
             kt = Kokkos::create_mirror_view(seqs.key_tiles),
             q = Kokkos::create_mirror_view(seqs.cu_q), k = Kokkos::create_mirror_view(seqs.cu_k);
  long long total = 0, total_k = 0;  // at most total_q and total_k, int32 values
  for (std::size_t s = 0; s < n; ++s) {
    t(s) = static_cast<int>(total);
    kt(s) = static_cast<int>(total_k);
    q(s) = cq[s];
    k(s) = ck[s];
    if (s + 1 < n) {
      total += (static_cast<long long>(cq[s + 1]) - cq[s] + rows - 1) / rows;
      total_k += (static_cast<long long>(ck[s + 1]) - ck[s] + rows - 1) / rows;
    }
  }
  seqs.total_tiles = static_cast<int>(total);
  seqs.total_key_tiles = static_cast<int>(total_k);
  Kokkos::deep_copy(seqs.tiles, t);
  Kokkos::deep_copy(seqs.key_tiles, kt);
  Kokkos::deep_copy(seqs.cu_q, q);
  Kokkos::deep_copy(seqs.cu_k, k);
  return seqs;
}

}  // namespace kfa::impl
