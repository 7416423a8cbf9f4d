#pragma once
/// \file portability.hpp
/// The few Kokkos spellings that changed between 3.4 (Debian's) and 4.x, in one place.

#include <Kokkos_Core.hpp>

namespace kfa::backends {

#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::log;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::tanh;
#endif

/// +infinity of T, usable in device code without relaxed constexpr.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return Kokkos::Experimental::infinity<T>::value;
}

/// Accumulation type: float for float and narrower types, double for double.
template <class T>
using accum_t = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, double>, double, float>;

}  // namespace kfa::backends
