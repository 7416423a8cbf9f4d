#pragma once
// A 16-bit storage type for the tests of kfa's narrow-float path on every Kokkos build.
//
// kfa takes Kokkos' half_t and bhalf_t where they are real 16-bit types, which is only in
// builds with a GPU backend: a host-only Kokkos (Debian's 3.4, or 4.x with OpenMP) defines both
// as float. So that the converting path (float tiles from 16-bit inputs, one rounding on
// store, the float dQ accumulator, the 16-bit naive reference) is tested on every build, the
// tests also run it with this bfloat16: 8 exponent bits, 7 stored mantissa bits, converted
// from float by round-to-nearest-even as the hardware and Kokkos' bhalf_t do. It is opted in
// through kfa::backends::is_narrow_float, the customisation point the library documents.

#include <kfa/backends/portability.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kfa_test {

struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  KOKKOS_INLINE_FUNCTION explicit bf16(float x) : bits(round(x)) {}
  KOKKOS_INLINE_FUNCTION explicit bf16(double x) : bits(round(static_cast<float>(x))) {}
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  }
  KOKKOS_INLINE_FUNCTION explicit operator double() const {
    return static_cast<double>(static_cast<float>(*this));
  }

 private:
  // The upper half of the float's bits, rounded to nearest even; NaN stays a (quiet) NaN.
  KOKKOS_INLINE_FUNCTION static std::uint16_t round(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

/// A NaN of value type T, to poison outputs with.
template <class T>
T quiet_nan() {
  if constexpr (kfa::backends::is_narrow_float<T>::value)
    return T(std::numeric_limits<float>::quiet_NaN());
  else
    return std::numeric_limits<T>::quiet_NaN();
}

/// The type a pass writes its LSE in for value type T: float or wider.
template <class T>
using lse_t = kfa::backends::accum_t<T>;

/// Name of a value type, for failure messages.
template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, double>)
    return "double";
  else if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, bf16>)
    return "bf16 (test type)";
  else
    return "Kokkos 16-bit type";
}

}  // namespace kfa_test

template <>
struct kfa::backends::is_narrow_float<kfa_test::bf16> : std::true_type {};
// Its one member is the bfloat16's bits: the host's pair products may take it as it is.
template <>
struct kfa::backends::is_bfloat16<kfa_test::bf16> : std::true_type {};
