#pragma once
/// \file impl/dropout.hpp
/// Dropout whose keep-mask is a pure function of (seed, offset, batch, head, query, key).
///
/// The generator is Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
/// as easy as 1, 2, 3", SC 2011): a keyed bijection of a 128-bit counter, so any element's
/// random bits are computed from its position alone, with no state carried between elements.
/// That is what lets every kernel (forward tiles, split-KV chunks, both backward kernels, any
/// backend, and ranks that hold different parts of the sequence) regenerate the same mask
/// without storing it.
///
/// The scheme, fixed so that masks are reproducible across kfa versions and backends:
///  - Per-call key: the first two words of Philox4x32-10(counter = {offset_lo, offset_hi, 0, 0},
///    key = {seed_lo, seed_hi}). Deriving the key (rather than adding the offset to a counter)
///    keeps the masks of offsets o and o + 1 unrelated for every head and row.
///  - Element (b, h, i, j) of query head h: word j % 4 of Philox4x32-10(counter = {j / 4, i, h,
///    b}, per-call key), so one Philox call serves four neighbouring keys. b, h, i, j are global
///    positions: query head index (not kv head), query and key indices in the whole sequence.
///  - The element is kept when that word is >= threshold = floor(p * 2^32) (so the keep
///    probability is 1 - p to within 2^-32), and a kept P_ij is scaled by 1 / (1 - p).

#include <kfa/backends/philox.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kfa::impl {

using backends::philox4x32_10;
using backends::PhiloxBlock;

/// The dropout of one pass, as the kernels use it. `Acc` is the accumulation type.
template <class Acc>
struct Dropout {
  bool enabled = false;
  std::uint32_t key0 = 0, key1 = 0;  // per-call key derived from (seed, offset)
  std::uint32_t threshold = 0;       // words below it drop their element
  Acc scale = 1;                     // 1 / (1 - p), the weight of a kept element
  int q_origin = 0, k_origin = 0;    // global index of local query 0 and key 0 (impl::Origin)
  int b_origin = 0;                  // global batch index of local batch 0 (impl::Origin)

  /// Random words of global keys 4g .. 4g+3 of global query row i of query head h in local
  /// batch b.
  KOKKOS_INLINE_FUNCTION PhiloxBlock words(int b, int h, int i, int g) const {
    return philox4x32_10(
        PhiloxBlock{{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(i),
                     static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(b_origin + b)}},
        key0, key1);
  }

  /// Calls f(c, z) for c in [c0, c1) over the vector lanes of a thread, where column c is local
  /// key k0 + c of local query row i and z is its weight: `scale` if kept, 0 if dropped, 1 when
  /// dropout is off. One Philox call per four keys.
  template <class Member, class F>
  KOKKOS_INLINE_FUNCTION void for_each(const Member& member, int b, int h, int i, int k0, int c0,
                                       int c1, const F& f) const {
    if (!enabled) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, c0, c1), [&](int c) { f(c, Acc(1)); });
      return;
    }
    if (c0 >= c1) return;
    const int j0 = k_origin + k0;  // global key of column 0
    const int g0 = (j0 + c0) >> 2, g1 = ((j0 + c1 - 1) >> 2) + 1;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, g0, g1), [&](int g) {
      const PhiloxBlock r = words(b, h, q_origin + i, g);
      for (int e = 0; e < 4; ++e) {
        const int c = 4 * g + e - j0;
        if (c >= c0 && c < c1) f(c, r.w[e] >= threshold ? scale : Acc(0));
      }
    });
  }

  /// Whether a group of four keys of dropout's scheme (one Philox call) starts at local key j.
  KOKKOS_INLINE_FUNCTION bool group_starts(int j) const { return ((k_origin + j) & 3) == 0; }

  /// Whether local keys j .. j + 3 of local query row i are kept (bits 0 .. 3), where
  /// group_starts(j): the four words of one Philox call.
  KOKKOS_INLINE_FUNCTION unsigned kept4(int b, int h, int i, int j) const {
    return keep_bits(words(b, h, q_origin + i, (k_origin + j) >> 2));
  }

  /// Whether local key j of local query row i is kept (one Philox call; the verdicts are bits
  /// picked by a shift, not words by a run-time index, so that a GPU keeps them in registers).
  KOKKOS_INLINE_FUNCTION bool kept(int b, int h, int i, int j) const {
    const int jg = k_origin + j;
    return (keep_bits(words(b, h, q_origin + i, jg >> 2)) >> (jg & 3) & 1u) != 0;
  }

  /// Whether local keys j (bit 0) and j + 1 (bit 1) of local query row i are kept: a lane's
  /// pair of neighbouring columns in a register-resident tile (TileOps::warp_forward). One
  /// Philox call, two where the pair straddles a group of four keys (an odd key origin).
  KOKKOS_INLINE_FUNCTION unsigned kept_pair(int b, int h, int i, int j) const {
    const int jg = k_origin + j, e = jg & 3;
    unsigned pair = keep_bits(words(b, h, q_origin + i, jg >> 2)) >> e & 3u;
    if (e == 3) pair |= (keep_bits(words(b, h, q_origin + i, (jg >> 2) + 1)) & 1u) << 1;
    return pair;
  }

  /// The weights of local query row i for the 64 keys of the aligned run of 64 global keys
  /// that holds local key k0 + c (a tile at k0, column c), by one thread: 16 Philox calls at
  /// once (Ops::philox16) and their words as weights in key order (Ops::weights64), z[q] for
  /// column first + q. Returns first (negative when the run starts before the tile).
  template <class Ops>
  KOKKOS_INLINE_FUNCTION int row_weights64(int b, int h, int i, int k0, int c, Acc (&z)[64]) const {
    const int j0 = k_origin + k0;  // global key of column 0
    const int g0 = ((j0 + c) >> 6) << 4;
    std::uint32_t w[4][16];
    counters16(w, b, h, q_origin + i, 0, g0, 1);  // 16 consecutive g
    Ops::philox16(w, key0, key1);
    Ops::weights64(w, threshold, scale, z);
    return 4 * g0 - j0;
  }

  /// A key-major score tile (TileTraits::key_major_scores) times its weights, by one thread:
  /// s[c * lds + r] *= z for local query q0 + r, r in [0, nr), and local key k0 + c, c in
  /// [cb, ce). 16 query rows per Ops::philox16, one vector of s per key (Ops::weigh16). Every
  /// element of the block is weighted; where a row does not see a key its P is 0 and stays 0.
  template <class Ops>
  KOKKOS_INLINE_FUNCTION void scale_key_major(int b, int h, int q0, int nr, int k0, int cb, int ce,
                                              Acc* s, int lds) const {
    if (!enabled || cb >= ce) return;
    const int j0 = k_origin + k0;
    const int g_begin = (j0 + cb) >> 2, g_end = ((j0 + ce - 1) >> 2) + 1;
    const std::uint32_t t = threshold;
    const Acc z = scale;
    for (int r0 = 0; r0 < nr; r0 += 16) {
      const int n = nr - r0 < 16 ? nr - r0 : 16;
      for (int g = g_begin; g < g_end; ++g) {
        std::uint32_t w[4][16];
        counters16(w, b, h, q_origin + q0 + r0, 1, g, 0);  // 16 consecutive i
        Ops::philox16(w, key0, key1);
        for (int e = 0; e < 4; ++e) {
          const int c = 4 * g + e - j0;
          if (c < cb || c >= ce) continue;
          Ops::weigh16(s + static_cast<std::ptrdiff_t>(c) * lds + r0, n, w[e], t, z);
        }
      }
    }
  }

 private:
  /// Bit e: whether word e of a Philox block keeps its element.
  KOKKOS_INLINE_FUNCTION unsigned keep_bits(const PhiloxBlock& r) const {
    return (r.w[0] >= threshold ? 1u : 0u) | (r.w[1] >= threshold ? 2u : 0u) |
           (r.w[2] >= threshold ? 4u : 0u) | (r.w[3] >= threshold ? 8u : 0u);
  }

  /// The counters {g, i, h, b} of words() for 16 blocks, block l at global query i + l di and
  /// key group g + l dg, in philox16's layout.
  KOKKOS_INLINE_FUNCTION void counters16(std::uint32_t (&w)[4][16], int b, int h, int i, int di,
                                         int g, int dg) const {
    for (int l = 0; l < 16; ++l) {
      w[0][l] = static_cast<std::uint32_t>(g + l * dg);
      w[1][l] = static_cast<std::uint32_t>(i + l * di);
      w[2][l] = static_cast<std::uint32_t>(h);
      w[3][l] = static_cast<std::uint32_t>(b_origin + b);
    }
  }
};

/// The dropout described by p (p.dropout already validated to lie in [0, 1)) for a block at
/// `at` of the global sequence.
template <class Acc>
Dropout<Acc> make_dropout(const Params& p, const Origin& at = {}) {
  Dropout<Acc> d;
  d.enabled = p.dropout > 0;
  d.q_origin = static_cast<int>(at.q);
  d.k_origin = static_cast<int>(at.k);
  d.b_origin = static_cast<int>(at.b);
  if (!d.enabled) return d;
  const PhiloxBlock key =
      philox4x32_10(PhiloxBlock{{static_cast<std::uint32_t>(p.offset),
                                 static_cast<std::uint32_t>(p.offset >> 32), 0u, 0u}},
                    static_cast<std::uint32_t>(p.seed), static_cast<std::uint32_t>(p.seed >> 32));
  d.key0 = key.w[0];
  d.key1 = key.w[1];
  const double t = std::floor(p.dropout * 4294967296.0);
  d.threshold = static_cast<std::uint32_t>(t < 4294967295.0 ? t : 4294967295.0);
  d.scale = static_cast<Acc>(1.0 / (1.0 - p.dropout));
  return d;
}

/// One work item per (batch, head, query) row of the keep-mask.
template <class Keep>
struct DropoutMaskKernel {
  Keep keep;
  Dropout<float> dropout;

  KOKKOS_FUNCTION void operator()(std::size_t row) const {
    const int nq = static_cast<int>(keep.extent(2)), nh = static_cast<int>(keep.extent(1));
    const int nk = static_cast<int>(keep.extent(3));
    const int i = static_cast<int>(row % nq);
    const int h = static_cast<int>(row / nq % nh);
    const int b = static_cast<int>(row / nq / nh);
    for (int g = 0; 4 * g < nk; ++g) {
      const PhiloxBlock r = dropout.words(b, h, i, g);
      for (int e = 0; e < 4 && 4 * g + e < nk; ++e)
        keep(b, h, i, 4 * g + e) = r.w[e] >= dropout.threshold ? 1 : 0;
    }
  }
};

}  // namespace kfa::impl
