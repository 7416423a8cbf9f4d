#pragma once
/// \file float16.hpp
/// kfa::bf16 and kfa::half, 16-bit value types for kfa's tensors on every Kokkos build.
///
/// kfa also takes Kokkos' half_t and bhalf_t, but those are 16-bit types only in builds with a
/// GPU backend: a host-only Kokkos (3.4, or 4.x with Serial, OpenMP or Threads) defines both as
/// float, which leaves a host program no 16-bit tensors. kfa::bf16 (bfloat16) and kfa::half
/// (IEEE binary16) are two bytes on every backend. They are storage types with explicit
/// conversions from and to float and double (round to nearest even; see
/// <kfa/backends/float16.hpp>) and no arithmetic: kfa::forward and kfa::backward load them into
/// float tiles, accumulate in float and round each output once, on store; lse stays float.
///
///   Kokkos::View<kfa::bf16****> q("q", B, H, N, D);   // and k, v, o alike
///   Kokkos::View<float***> lse("lse", B, H, N);
///   kfa::forward(Kokkos::DefaultExecutionSpace(), q, k, v, o, lse);

#include <kfa/backends/float16.hpp>

namespace kfa {

using backends::bf16;
using backends::half;

}  // namespace kfa
