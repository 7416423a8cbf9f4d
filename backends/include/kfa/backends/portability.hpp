#pragma once
/// \file portability.hpp
/// The few Kokkos spellings that changed between 3.4 (Debian's) and 4.x, in one place.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <type_traits>

namespace kfa::backends {

#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

/// a * b + c rounded once, whatever form the compiler gives the loop around it. A plain
/// `s += a * b` may be fused in one instantiation and vectorised as a rounded product then an
/// add in another (GCC does so for unit-stride views on some -march targets and not for
/// strided ones), and results that must not depend on a view's layout would then differ in
/// their last bits. Kokkos::fma arrived in Kokkos 4.0.
#if KOKKOS_VERSION >= 40000
using Kokkos::fma;
#else
template <class T>
KOKKOS_INLINE_FUNCTION T fma(T a, T b, T c) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
#endif

/// +infinity of T, usable in device code without relaxed constexpr.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return Kokkos::Experimental::infinity<T>::value;
}

/// |x| for float and double, in device code on every Kokkos version (Kokkos::abs for floating
/// point arrived in 3.7).
template <class T>
KOKKOS_INLINE_FUNCTION T abs(T x) {
  return x < T(0) ? -x : x;
}

/// Value types stored narrower than float and computed in float: loaded into float tiles,
/// accumulated in float, rounded once when the result is stored. True for Kokkos' half_t and
/// bhalf_t where they are real 16-bit types (builds with CUDA, HIP or SYCL; a host-only Kokkos
/// defines both as float, and bhalf_t exists from Kokkos 3.6). Specialise it for another
/// storage type that converts explicitly from and to float.
template <class T>
struct is_narrow_float : std::false_type {};
#if defined(KOKKOS_HALF_T_IS_FLOAT) && !KOKKOS_HALF_T_IS_FLOAT
template <>
struct is_narrow_float<Kokkos::Experimental::half_t> : std::true_type {};
#endif
#if defined(KOKKOS_BHALF_T_IS_FLOAT) && !KOKKOS_BHALF_T_IS_FLOAT
template <>
struct is_narrow_float<Kokkos::Experimental::bhalf_t> : std::true_type {};
#endif

/// Value types that store a bfloat16 (the upper 16 bits of a float) as their only member, so
/// that a backend may read their bits directly as the pair words of its bfloat16 products
/// (bf16x2.hpp). Implies is_narrow_float. Specialise it with is_narrow_float for another such
/// type.
template <class T>
struct is_bfloat16 : std::false_type {};

/// Whether kfa takes T as the value type of its tensors: float, double or a narrow float.
template <class T>
inline constexpr bool is_value_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || is_narrow_float<T>::value;

/// Accumulation type: double for double, float for float and the narrow types.
template <class T>
using accum_t = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, double>, double, float>;

}  // namespace kfa::backends
