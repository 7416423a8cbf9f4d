#pragma once
/// \file bf16x2.hpp
/// bfloat16 pairs: the operands of the pair products (TileOps::gemm_bf16x2), which multiply
/// bfloat16 inputs two at a time with float accumulation, as AVX-512's VDPBF16PS does.
///
/// A bfloat16 is the upper half of a float's bits. A pair word (32 bits) holds two of them
/// that are consecutive along a product's reduction: the element at reduction index 2p in its
/// low half, 2p + 1 in its high half. A row of bfloat16 values with unit stride is therefore
/// already a row of pair words; a tile whose reduction runs down its rows (P V, reduced over
/// keys) is interleaved into pair words two rows at a time.
///
/// Pair words live in memory that may hold other types (a view of bfloat16 values, float
/// scratch): every access goes through memcpy or a vector load, never a typed dereference.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace kfa::backends {

/// The bfloat16 nearest to x (ties to even); a NaN keeps its sign and upper payload and is
/// made quiet. kfa::bf16 (float16.hpp) converts with it.
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_round(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// The float a bfloat16 stands for (exact).
KOKKOS_INLINE_FUNCTION float bf16_widen(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// The pair word of `lo` (reduction index 2p) and `hi` (2p + 1).
KOKKOS_INLINE_FUNCTION std::uint32_t bf16x2_pack(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

/// The pair word at word index `i` of p (any storage).
KOKKOS_INLINE_FUNCTION std::uint32_t bf16x2_load(const void* p, std::ptrdiff_t i) {
  std::uint32_t w;
  std::memcpy(&w, static_cast<const unsigned char*>(p) + 4 * i, sizeof w);
  return w;
}

/// Stores pair word w at word index `i` of p (any storage).
KOKKOS_INLINE_FUNCTION void bf16x2_store(void* p, std::ptrdiff_t i, std::uint32_t w) {
  std::memcpy(static_cast<unsigned char*>(p) + 4 * i, &w, sizeof w);
}

/// The bfloat16 at element index `i` of p (any storage).
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_load(const void* p, std::ptrdiff_t i) {
  std::uint16_t h;
  std::memcpy(&h, static_cast<const unsigned char*>(p) + 2 * i, sizeof h);
  return h;
}

/// lo * lo' + hi * hi' of two pair words, in float.
KOKKOS_INLINE_FUNCTION float bf16x2_dot(std::uint32_t a, std::uint32_t b) {
  return bf16_widen(static_cast<std::uint16_t>(a)) * bf16_widen(static_cast<std::uint16_t>(b)) +
         bf16_widen(static_cast<std::uint16_t>(a >> 16)) *
             bf16_widen(static_cast<std::uint16_t>(b >> 16));
}

}  // namespace kfa::backends
