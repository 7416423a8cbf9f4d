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

/// \cond kfa_internal
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

/// binary16 bits of x by integer arithmetic alone: round to nearest even, subnormals below
/// 2^-14, infinity from 65520 (halfway between the largest half, 65504, and 2^16) up; a NaN
/// keeps its sign and the upper 10 bits of its payload and is made quiet.
KOKKOS_INLINE_FUNCTION std::uint16_t half_bits_portable(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a >= 0x38800000u) {  // >= 2^-14: a normal half
    // Rebias the exponent (127 -> 15), then round the 23-bit mantissa to 10 bits; a carry out
    // of the mantissa steps the exponent, as it should.
    std::uint32_t m = a - 0x38000000u;
    m += 0xfffu + ((m >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (m >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: zero (2^-25 itself is the tie, to even 0)
  // A subnormal half k 2^-24: k = mantissa (with its leading 1) >> shift, rounded to even.
  // k may round up to 1024, the smallest normal, which is its encoding too.
  const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(a >> 23);  // 14..24
  const std::uint32_t half_ulp = 1u << (shift - 1), rest = mant & ((1u << shift) - 1u);
  std::uint32_t k = mant >> shift;
  if (rest > half_ulp || (rest == half_ulp && (k & 1u))) ++k;
  return static_cast<std::uint16_t>(sign | k);
}

/// The float value of binary16 bits h by integer arithmetic alone; exact, a NaN made quiet.
KOKKOS_INLINE_FUNCTION float half_to_float_portable(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return float_of(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));
  // Zero or subnormal, m 2^-24: exact in float.
  return float_of(sign | bits_of(static_cast<float>(m) * 5.9604644775390625e-8f));
}

KOKKOS_INLINE_FUNCTION std::uint16_t half_bits(float x) {
#if defined(KFA_FLOAT16_F16C)
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
  return half_bits_portable(x);
#endif
}

KOKKOS_INLINE_FUNCTION float half_to_float(std::uint16_t h) {
#if defined(KFA_FLOAT16_F16C)
  return _cvtsh_ss(h);
#else
  return half_to_float_portable(h);
#endif
}

}  // namespace float16_impl
/// \endcond

/// bfloat16: the upper 16 bits of a float (sign, 8 exponent bits, 7 mantissa bits), as
/// Kokkos' bhalf_t, CUDA's __nv_bfloat16 and the AVX-512 BF16 instructions hold it.
struct bf16 {
  std::uint16_t bits = 0;  ///< the encoding

  bf16() = default;  ///< zero
  /// The bfloat16 nearest to x (ties to even; NaN stays NaN, made quiet).
  KOKKOS_INLINE_FUNCTION explicit bf16(float x) : bits(bf16_round(x)) {}
  /// Through float: rounded twice.
  KOKKOS_INLINE_FUNCTION explicit bf16(double x) : bits(bf16_round(static_cast<float>(x))) {}
  /// The value, exactly.
  KOKKOS_INLINE_FUNCTION explicit operator float() const { return bf16_widen(bits); }
  /// The value, exactly.
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

  half() = default;  ///< zero
  /// The binary16 nearest to x (ties to even; subnormals kept, overflow to infinity, NaN made
  /// quiet).
  KOKKOS_INLINE_FUNCTION explicit half(float x) : bits(float16_impl::half_bits(x)) {}
  /// Through float: rounded twice.
  KOKKOS_INLINE_FUNCTION explicit half(double x)
      : bits(float16_impl::half_bits(static_cast<float>(x))) {}
  /// The value, exactly (a NaN comes back quiet).
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    return float16_impl::half_to_float(bits);
  }
  /// The value, exactly (a NaN comes back quiet).
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
