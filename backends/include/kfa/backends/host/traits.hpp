#pragma once
/// \file host/traits.hpp
/// Tile traits for execution spaces that run on the host (Serial, OpenMP, Threads): those
/// that can access HostSpace.
/// One thread per team and no vector lanes: the host tile products (host/tile.hpp) do a whole
/// tile on one thread in vector registers. Tiles are sized to stay in L2 for head_dim <= 128
/// (Q_i, O_i, K_j, V_j and S_ij: 144 KiB in float at Br = Bc = 64 and head_dim 128, 184 KiB
/// at Br = 96; with AVX-512's 132-key tiles about 230 KiB at Br = 64 and 420 KiB at 192; the
/// cores measured have 512 KiB of L2 or more, those with AVX-512 1 MiB or more).

#include <kfa/backends/generic/tile.hpp>

// Defined where the host tile code may use AVX-512 BF16 (VDPBF16PS, VCVTNE2PS2BF16) with the
// AVX-512 BW word permutes: GCC or Clang compiling for the host with those extensions (build
// with -march=native, the KFA_NATIVE option, on such a CPU).
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__GNUC__) && \
    !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(__SYCL_DEVICE_ONLY__)
#define KFA_HOST_AVX512_BF16 1
#endif

namespace kfa::backends {

namespace host {
/// Rows of the host's query tiles (TileTraits::block_q, and block_bwd up to head_dim 128): 64
/// where the products' micro-kernel is 6 x 4 vector registers (AVX-512, host::wide_blocks),
/// 96 on 16-register ISAs (AVX2 and below, 6 x 2 blocks): P V's 96 rows are 16 blocks of 6
/// with no 4-row block left over, and each K_j, V_j streamed from memory serves 96 queries
/// instead of 64. On a Zen 3 core it took float forwards at N = 16384 up by as much as 13 %,
/// level at N <= 4096 (-2 to +3 %), where 128 lost up to 13 % at N = 1024; backwards 4-9 %
/// faster at N >= 4096, D = 128 without a mask, -8 to +18 % elsewhere in a noisy run, the
/// median case +4 % (perf/results/2026-11-29-host-query-tile.md). On AVX-512 on a Zen 5, 96
/// rows everywhere did not gain (float 0.98-1.03x, bf16 0.95-1.00x at N = 1024 and 4096;
/// perf/results/2026-12-07-zen5-long-keys.md).
#if defined(__AVX512F__)
inline constexpr int query_tile_rows = 64;
#else
inline constexpr int query_tile_rows = 96;
#endif

/// The forward's long-key rule (TileTraits::block_q): from long_keys keys, at head dims
/// long_min_head_dim to 128, query tiles of long_query_tile_rows = 192 rows (32 blocks of the
/// 6-row micro-kernel; the tiles about 304 KiB in float at head_dim 128, within L2). There one
/// head's K and V (4 MiB and more in float) come from L3 or memory for every query tile, and
/// taller tiles read them less often. Below the rule the short tiles stay: a causal diagonal
/// tile wastes more the taller it is.
///  - Without AVX-512 (query_tile_rows 96): from 8192 keys at head dims 64 to 128; 0.95-1.25x
///    the 96-row forward at N = 8192 and 16384 on a Zen 3, 192 mixed at N <= 2048
///    (perf/results/2026-11-29-long-keys.md).
///  - AVX-512 (query_tile_rows 64): from 16384 keys at head dims above 64 (measured at 128); on
///    a Zen 5 the float forward at N = 16384, D = 128 ran 1.17-1.24x the 64-row one (bf16
///    1.08-1.12x), causal 1.06-1.17x (bf16 1.01-1.06x); at 8192 keys the two runs disagreed
///    (0.95-1.11x), at D = 64 192 rows lost up to 6 % in float and bf16, and 288 rows ran
///    1.10-1.11x the 192 in float (bf16 1.00-1.04x) in one run, 0.97-0.99x and 1.00-1.04x in
///    two more (perf/results/2026-12-07-zen5-long-keys.md).
#if defined(__AVX512F__)
inline constexpr int long_keys = 16384;
inline constexpr int long_min_head_dim = 65;  ///< The rule's smallest head dim.
#else
inline constexpr int long_keys = 8192;
inline constexpr int long_min_head_dim = 64;  ///< The rule's smallest head dim.
#endif
inline constexpr int long_query_tile_rows = 192;  ///< The rule's query-tile rows.

/// Keys of the forward's key tiles at head dims 65 to 128 (TileTraits::block_k). With
/// AVX-512, 132: S^T = K_j Q_i^T is then 22 blocks of the 6-row micro-kernel with no short
/// block left over, and P V is 132 deep, so each call's fixed cost (zeroing, storing and
/// reloading its accumulators) weighs half as much. On a Zen 5, alternated with 64 one
/// benchmark at a time: float 1.01-1.04x at N = 1024 and 4096 (causal and not), 1.05-1.07x at
/// N = 16384 without a mask; bf16 1.00-1.03x. 128 keys gained less (1.01-1.04x), 66 little
/// (0.99-1.02x), 198 lost up to 8 %; at head dim 64 none of 126, 132, 192 and 198 keys gained
/// on its 128 (0.96-1.02x; perf/results/2026-12-07-zen5-key-tiles.md). Without AVX-512 64, as
/// measured on a Zen 3 (the 132-key tiles are not measured there).
#if defined(__AVX512F__)
inline constexpr int wide_head_key_tile = 132;
#else
inline constexpr int wide_head_key_tile = 64;
#endif
}  // namespace host

/// Host tile traits: one thread per team, Br = 64 with AVX-512 and 96 without (192 under the
/// long-key rule above), Bc = 128 up to head_dim 64, host::wide_head_key_tile (132 with
/// AVX-512, else 64) up to 128, 32 above.
template <class ExecSpace, class T>
struct TileTraits<
    ExecSpace, T,
    std::enable_if_t<Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible>> {
  /// Br: host::query_tile_rows, or host::long_query_tile_rows under the long-key rule above (not
  /// above head_dim 128: at 256 the taller tiles would fill about 470 KiB of a 512 KiB L2).
  static constexpr int block_q(int head_dim, int seqlen_k) {
    return seqlen_k >= host::long_keys && head_dim >= host::long_min_head_dim && head_dim <= 128
               ? host::long_query_tile_rows
               : host::query_tile_rows;
  }
  /// Bc: K_j^T and V_j stay in L2 next to Q_i and O_i. 128 keys up to head_dim 64: there the
  /// products' depth (head_dim for S^T, Bc for P V) is short and each micro-kernel call's fixed
  /// cost (zeroing, storing its accumulators) weighs; the longer P V took 3.0-3.5 % off float
  /// and bf16 forwards at head_dim 64 without a mask, 0.8-2.3 % causal at N = 4096, within the
  /// noise at N = 1024 (perf/results/2026-11-26-key-tile-128.md). Above 64, see
  /// host::wide_head_key_tile.
  static constexpr int block_k(int head_dim) {
    return head_dim <= 64 ? 128 : head_dim <= 128 ? host::wide_head_key_tile : 32;
  }
  /// Backward Br = Bc: about 290 KiB of float tiles at head_dim 128 and 64 rows, 457 KiB at
  /// 96 (host::query_tile_rows), within the 512 KiB of L2 of the cores measured.
  static constexpr int block_bwd(int head_dim) {
    return head_dim <= 128 ? host::query_tile_rows : 32;
  }
  static constexpr int team_size = 1;      ///< host teams are one thread
  static constexpr int vector_length = 1;  ///< the compiler vectorises instead
  static constexpr int pad = 0;            ///< rows packed: no banks to spread
  /// S^T = K_j Q_i^T: no transpose of K_j per tile, softmax vectorised across queries.
  static constexpr bool key_major_scores = true;
  /// bfloat16 inputs multiplied in pairs on VDPBF16PS where the CPU has it; elsewhere they are
  /// widened to float tiles once and take the float products.
#ifdef KFA_HOST_AVX512_BF16
  static constexpr bool bf16x2_products = true;
#else
  static constexpr bool bf16x2_products = false;
#endif
  static constexpr bool warp_tiles = false;     ///< no warps on the host
  static constexpr bool warp_backward = false;  ///< no warps on the host
  /// Teams running at once: one per host thread.
  static int concurrent_teams(const ExecSpace& space) {
    return space.concurrency();
  }
};

}  // namespace kfa::backends
