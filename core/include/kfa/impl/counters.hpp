#pragma once
/// \file impl/counters.hpp
/// Test-only tile counters. Built with KFA_TEST_COUNTERS, the team kernels add one to a
/// counter in their execution space's memory for every tile they stage inside their tile loop,
/// and the tile's rows to a second counter (for the I/O model of kfa/flops.hpp):
/// the forward per key tile, the backward's key-tile kernel per query tile, its query-tile
/// kernel per key tile, its symmetric kernel per tile i it pairs with its own (and apart, per
/// tile i it stages in the query role and in the key role). A test then asserts
/// the tile skipping the masks promise (a causal square problem stages about half the tiles)
/// against a count made on the host from the float64 reference's visibility rule. Without the macro
/// TileCount is empty and its add() compiles to nothing; applications never define it.

#include <Kokkos_Core.hpp>

namespace kfa::impl {

/// Which kernel's loop a count belongs to.
enum class TileCounter : int {
  forward = 0,
  key_value = 1,
  query = 2,
  symmetric = 3,
  symmetric_query = 4,  ///< the symmetric kernel's tiles i staged as queries (Q, dO, LSE, delta)
  symmetric_key = 5     ///< and as keys (K, V)
};

/// How many TileCounter values there are: tiles of kernel k count at k, their rows at
/// tile_counters + k.
inline constexpr int tile_counters = 6;
/// The slots: tiles and rows of each.
inline constexpr int tile_counter_slots = 2 * tile_counters;

#ifdef KFA_TEST_COUNTERS
/// The counters' storage in MemorySpace.
template <class MemorySpace>
using TileCounts = Kokkos::View<unsigned long long[tile_counter_slots], MemorySpace>;

/// The counters of MemorySpace, allocated on first use and released by Kokkos::finalize.
template <class MemorySpace>
TileCounts<MemorySpace>& test_tile_counters() {
  static TileCounts<MemorySpace> counts;
  if (!counts.data()) {
    counts = TileCounts<MemorySpace>("kfa::impl::test_tile_counters");
    Kokkos::push_finalize_hook([] { test_tile_counters<MemorySpace>() = {}; });
  }
  return counts;
}

/// What a kernel holds: the counters, taken when the kernel is built on the host.
template <class MemorySpace>
struct TileCount {
  TileCounts<MemorySpace> counts = test_tile_counters<MemorySpace>();
  /// One staged tile of `rows` rows in the loop of `which`, counted once per team.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void add(const Member& team, TileCounter which, int rows) const {
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      Kokkos::atomic_add(&counts(static_cast<int>(which)), 1ULL);
      Kokkos::atomic_add(&counts(tile_counters + static_cast<int>(which)),
                         static_cast<unsigned long long>(rows));
    });
  }
};
#else
/// Without KFA_TEST_COUNTERS: nothing.
template <class MemorySpace>
struct TileCount {
  /// Nothing to count.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void add(const Member& /*team*/, TileCounter /*which*/,
                                  int /*rows*/) const {}
};
#endif

}  // namespace kfa::impl
