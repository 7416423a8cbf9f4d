#pragma once
/// \file philox.hpp
/// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
/// SC 2011), the counter-based generator of kfa's dropout (core's impl/dropout.hpp says how
/// counters and keys are formed from positions). One block here; TileOps::philox16 runs 16
/// blocks at once (vectorised on the host).

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kfa::backends {

/// Four 32-bit words: a Philox counter or its output.
struct PhiloxBlock {
  std::uint32_t w[4];  ///< in Random123's order: w[0] and w[2] enter each round's products
};

/// Philox4x32-10 of `counter` under the key (k0, k1).
KOKKOS_INLINE_FUNCTION PhiloxBlock philox4x32_10(PhiloxBlock c, std::uint32_t k0,
                                                 std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;  // round multipliers
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;  // key schedule (Weyl) increments
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t(m0) * c.w[0], p1 = std::uint64_t(m1) * c.w[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = PhiloxBlock{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

/// 16 Philox4x32-10 blocks in place, stored by word: block l's counter is (w[0][l], w[1][l],
/// w[2][l], w[3][l]) on entry and its output on return. The portable form of TileOps::philox16.
KOKKOS_INLINE_FUNCTION void philox4x32_10_x16(std::uint32_t (&w)[4][16], std::uint32_t k0,
                                              std::uint32_t k1) {
  for (int l = 0; l < 16; ++l) {
    const PhiloxBlock r = philox4x32_10(PhiloxBlock{{w[0][l], w[1][l], w[2][l], w[3][l]}}, k0, k1);
    for (int e = 0; e < 4; ++e)
      w[e][l] = r.w[e];
  }
}

}  // namespace kfa::backends
