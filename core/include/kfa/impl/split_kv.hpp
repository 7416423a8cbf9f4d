#pragma once
/// \file impl/split_kv.hpp
/// Split-KV forward: how many splits, where the per-split partials live, and the kernel that
/// merges them.
///
/// When a problem has few query tiles (decoding: a handful of queries against a long cache)
/// the unsplit forward launches fewer teams than the execution space runs at once. The
/// visible key tiles of each query tile are then cut into `splits` contiguous chunks, one
/// team per (query tile, chunk); each team writes its unnormalised partial (m, l, O~) to a
/// workspace, and a second kernel merges the chunks of every row with kfa::combine_into in
/// chunk order, so the result is bitwise repeatable for a given split count.

#include <kfa/combine.hpp>
#include <kfa/impl/rule.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kfa::impl {

/// Fewest key tiles worth a team of their own: below this the partial's write-out and merge
/// cost more than the keys it covers.
inline constexpr int min_tiles_per_split = 4;
/// Most splits the heuristic picks (FlashAttention-2 caps at 128 too); a forced count may
/// exceed it.
inline constexpr int max_auto_splits = 128;

/// The heuristic split count: 1 while the unsplit launch (`teams` teams) already fills the
/// `slots` teams the space runs at once, else enough splits to fill them, keeping at least
/// min_tiles_per_split of the `key_tiles` tiles per split and at most max_auto_splits.
inline int choose_splits(long long teams, int key_tiles, int slots) {
  if (teams <= 0 || teams >= slots) return 1;
  long long s = (slots + teams - 1) / teams;
  const long long by_work = key_tiles / min_tiles_per_split;
  if (s > by_work) s = by_work;
  if (s > max_auto_splits) s = max_auto_splits;
  return s > 1 ? static_cast<int>(s) : 1;
}

/// First key tile and number of key tiles of chunk `split` when `tiles` tiles starting at
/// tile `first` are cut into `splits` near-equal contiguous chunks (the first tiles % splits
/// chunks get one more). A chunk may be empty when splits > tiles.
KOKKOS_INLINE_FUNCTION void split_range(int first, int tiles, int splits, int split, int& begin,
                                        int& count) {
  const int per = tiles / splits, extra = tiles % splits;
  begin = first + split * per + (split < extra ? split : extra);
  count = per + (split < extra ? 1 : 0);
}

/// Per-split partials of a forward pass, rows ordered (split, batch, head, query). The views
/// are the launch's temporaries (impl/workspace.hpp; ForwardKernel::launch lends them).
template <class Acc, class MemorySpace>
struct SplitPartials {
  using rows_view = Kokkos::View<Acc**, Kokkos::LayoutRight, MemorySpace>;  ///< of o and ml
  rows_view o;   ///< O~ rows (rows(), head_dim)
  rows_view ml;  ///< (rows(), 2): m and l
  int splits = 1, batch = 0, heads = 0, seqlen_q = 0;

  /// Rows of the partials: one per (split, batch, head, query).
  std::size_t rows() const { return std::size_t(splits) * batch * heads * seqlen_q; }

  KOKKOS_INLINE_FUNCTION std::size_t row(int split, int b, int h, int i) const {
    return ((std::size_t(split) * batch + b) * heads + h) * seqlen_q + i;
  }
};

/// Merges the partials of every (batch, head, query, d) over the splits in split order and
/// writes O = O~ / l and LSE = m + log l (O = 0, LSE = -inf where no split saw a key); under
/// MultiScaleRule the partials are (r, O~) (r in ml's first column) merged by
/// kfa::msa::combine_into (r in ml's second column, where the forward keeps it in l's place),
/// and it writes O = O~ / max(r, 1) and r.
/// One work item per output element: the (m, l) merge is repeated per d, which is cheaper
/// than a barrier, and each item is exactly the combiner on one element.
template <class ExecSpace, class Acc, class O, class Lse, class Rule = SoftmaxRule>
struct SplitMerge {
  SplitPartials<Acc, typename ExecSpace::memory_space> part;
  O o;
  Lse lse;
  int head_dim;

  void launch(const ExecSpace& space) const {
    const std::size_t n = std::size_t(part.batch) * part.heads * part.seqlen_q * head_dim;
    if (n == 0) return;
    Kokkos::parallel_for(
        "kfa::forward::split_merge",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::size_t>>(space, 0, n), *this);
  }

  KOKKOS_FUNCTION void operator()(std::size_t idx) const {
    const int d = static_cast<int>(idx % head_dim);
    std::size_t rest = idx / head_dim;
    const int i = static_cast<int>(rest % part.seqlen_q);
    rest /= part.seqlen_q;
    const int h = static_cast<int>(rest % part.heads);
    const int b = static_cast<int>(rest / part.heads);
    if constexpr (!Rule::softmax) {
      msa::Partial<Acc> acc;  // the identity
      Acc out = Acc(0);
      for (int s = 0; s < part.splits; ++s) {
        const std::size_t r = part.row(s, b, h, i);
        msa::combine_into(acc, &out, msa::Partial<Acc>{part.ml(r, 1)}, &part.o(r, d), 1);
      }
      o(b, h, i, d) = typename O::value_type(out / msa::denominator(acc));
      if (d == 0) lse(b, h, i) = acc.r;
      return;
    }
    Partial<Acc> acc;  // empty: the combiner's identity
    Acc out = Acc(0);
    for (int s = 0; s < part.splits; ++s) {
      const std::size_t r = part.row(s, b, h, i);
      combine_into(acc, &out, Partial<Acc>{part.ml(r, 0), part.ml(r, 1)}, &part.o(r, d), 1);
    }
    o(b, h, i, d) = typename O::value_type(acc.l > Acc(0) ? out / acc.l : Acc(0));
    if (d == 0) lse(b, h, i) = kfa::lse(acc);
  }
};

}  // namespace kfa::impl
