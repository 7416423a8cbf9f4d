#pragma once
// Helpers for the tests of kfa's value types, the 16-bit ones (kfa::bf16, kfa::half, Kokkos'
// half_t and bhalf_t where they are 16-bit) included.
//
// kfa takes Kokkos' half_t and bhalf_t where they are real 16-bit types, which is only in
// builds with a GPU backend: a host-only Kokkos (Debian's 3.4, or 4.x with OpenMP) defines both
// as float. kfa's own kfa::bf16 and kfa::half (<kfa/float16.hpp>) are 16-bit on every build, so
// the converting path (float tiles from 16-bit inputs, one rounding on store, the float dQ
// accumulator, the 16-bit naive reference) is tested everywhere with them.

#include <kfa/backends/portability.hpp>
#include <kfa/float16.hpp>

#include <Kokkos_Core.hpp>

#include <limits>
#include <type_traits>

namespace kfa_test {

using kfa::bf16;
using kfa::half;

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
    return "kfa::bf16";
  else if constexpr (std::is_same_v<T, half>)
    return "kfa::half";
  else
    return "Kokkos 16-bit type";
}

}  // namespace kfa_test
