#pragma once
// The execution space a test suite runs on. tests/CMakeLists.txt compiles each suite whose
// result depends on the space once per backend the Kokkos build enables (test_forward_serial,
// test_forward_openmp, ...), defining KFA_TEST_SPACE_<BACKEND> for that copy, so that one source
// is tested on every backend rather than on Kokkos' default alone. A suite compiled without
// such a macro (one that does not depend on the space) runs on the default space.

#include <Kokkos_Core.hpp>

namespace kfa_test {

#if defined(KFA_TEST_SPACE_SERIAL)
using Exec = Kokkos::Serial;
#elif defined(KFA_TEST_SPACE_OPENMP)
using Exec = Kokkos::OpenMP;
#elif defined(KFA_TEST_SPACE_THREADS)
using Exec = Kokkos::Threads;
#elif defined(KFA_TEST_SPACE_CUDA)
using Exec = Kokkos::Cuda;
#elif defined(KFA_TEST_SPACE_HIP) || defined(KFA_TEST_SPACE_SYCL)
// Reached through the default: these classes left Kokkos::Experimental during Kokkos 4, and a
// device backend, when enabled, is always the default space (Kokkos enables at most one).
using Exec = Kokkos::DefaultExecutionSpace;
static_assert(!Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible,
              "KFA_TEST_SPACE_HIP/SYCL: the default execution space is not the device");
#else
using Exec = Kokkos::DefaultExecutionSpace;
#endif

/// The memory the suite's views live in.
using Memory = Exec::memory_space;
/// The device type of the suite's views: allocated in Memory, and initialised, filled and
/// copied by Exec, so that a suite for one space launches nothing on another host space.
using Device = Kokkos::Device<Exec, Memory>;
/// Whether the host reads Exec's memory directly (every host backend); device spaces need the
/// inputs created on the host and deep-copied.
inline constexpr bool host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible;

}  // namespace kfa_test
