#pragma once
/// \file impl/profiling.hpp
/// A Kokkos profiling region that is popped even when validation throws.
/// (Kokkos::Profiling::ScopedRegion exists only from Kokkos 4.)

#include <Kokkos_Core.hpp>

#include <string>

namespace kfa::impl {

class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

}  // namespace kfa::impl
