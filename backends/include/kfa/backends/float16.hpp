#pragma once
/// \file float16.hpp
/// kfa's own 16-bit storage types, bf16 (bfloat16) and half (IEEE 754 binary16), for every
/// Kokkos build. Kokkos' half_t and bhalf_t are 16-bit types only in builds with a GPU backend:
/// a host-only Kokkos (3.4, or 4.x with Serial/OpenMP/Threads) defines both as float. These two
/// are 16 bits everywhere, so a host program can keep its tensors in 16 bits and run kfa's
/// narrow path on them (float tiles loaded from 16-bit inputs, float accumulation, one rounding
/// when the result is stored).
///
/// Both are storage types: trivially copyable, two bytes, usable as the value type of a
/// Kokkos::View on any backend, with explicit conversions from and to float and double and no
/// arithmetic. Conversion from float rounds to nearest, ties to even (from double: first to
/// float, then to the type); NaN stays NaN (made quiet), infinity stays infinity, and half
/// overflows to infinity and keeps subnormals. Conversion to float is exact (a NaN comes back
/// quiet). Both are opted in to kfa through is_narrow_float (portability.hpp).

#include <kfa/backends/bf16x2.hpp>
#include <kfa/backends/portability.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

// F16C's conversions give the results of the portable ones below, bit for bit (the tests
// compare them), and are used in host code where the compiler targets it.
#if defined(__F16C__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#include <immintrin.h>
#define KFA_FLOAT16_F16C 1
#endif

namespace kfa::backends {

namespace float16_impl {

KOKKOS_INLINE_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

KOKKOS_INLINE_FUNCTION float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace float16_impl

/// bfloat16: the upper 16 bits of a float (sign, 8 exponent bits, 7 mantissa bits), as
/// Kokkos' bhalf_t, CUDA's __nv_bfloat16 and the AVX-512 BF16 instructions hold it.
struct bf16 {
  std::uint16_t bits = 0;  ///< the encoding

  bf16() = default;
  KOKKOS_INLINE_FUNCTION explicit bf16(float x) : bits(bf16_round(x)) {}
  KOKKOS_INLINE_FUNCTION explicit bf16(double x) : bits(bf16_round(static_cast<float>(x))) {}
  KOKKOS_INLINE_FUNCTION explicit operator float() const { return bf16_widen(bits); }
  KOKKOS_INLINE_FUNCTION explicit operator double() const {
    return static_cast<double>(bf16_widen(bits));
  }
  /// The value whose encoding is b.
  KOKKOS_INLINE_FUNCTION static bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

/// IEEE 754 binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits; largest finite value
/// 65504, smallest normal 2^-14, smallest subnormal 2^-24.
struct half {
  std::uint16_t bits = 0;  ///< the encoding

  half() = default;
  KOKKOS_INLINE_FUNCTION explicit half(float x) : bits(float16_impl::half_bits(x)) {}
  KOKKOS_INLINE_FUNCTION explicit half(double x)
      : bits(float16_impl::half_bits(static_cast<float>(x))) {}
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    return float16_impl::half_to_float(bits);
  }
  KOKKOS_INLINE_FUNCTION explicit operator double() const {
    return static_cast<double>(float16_impl::half_to_float(bits));
  }
  /// The value whose encoding is b.
  KOKKOS_INLINE_FUNCTION static half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);

template <>
struct is_narrow_float<bf16> : std::true_type {};
/// bf16's one member is the bfloat16's bits: the pair products (bf16x2.hpp) read them as they are.
template <>
struct is_bfloat16<bf16> : std::true_type {};
template <>
struct is_narrow_float<half> : std::true_type {};

}  // namespace kfa::backends
