# Finds kfa's dependencies and sets the KFA_ENABLE_* options. Each optional part defaults to ON
# when what it needs is found; asking for a part whose dependency is missing is an error.

find_package(Kokkos REQUIRED)
include(kfaKokkosFixups)

find_package(KokkosKernels QUIET)
include(kfaKokkosFixups)
# kfa::nn (the transformer block: projections through KokkosBlas::gemm) needs Kokkos Kernels.
set(_kfa_have_kk OFF)
if(TARGET Kokkos::kokkoskernels)
  set(_kfa_have_kk ON)
endif()
option(KFA_ENABLE_NN "Build the transformer block kfa::nn (needs Kokkos Kernels)" ${_kfa_have_kk})
if(KFA_ENABLE_NN AND NOT _kfa_have_kk)
  message(FATAL_ERROR "KFA_ENABLE_NN needs Kokkos Kernels (Debian: libtrilinos-kokkos-kernels-dev; "
                      "or -DKokkosKernels_ROOT=...)")
endif()

find_package(MPI QUIET COMPONENTS CXX)
option(KFA_ENABLE_MPI "Build the MPI sequence-parallel layer (kfa::mpi)" ${MPI_FOUND})
if(KFA_ENABLE_MPI)
  find_package(MPI REQUIRED COMPONENTS C CXX)
endif()

# HDF5's C API is used by the apps (tensor files) and by the CLI tests.
find_package(HDF5 QUIET COMPONENTS C)
option(KFA_ENABLE_APPS "Build the kfa command-line program (needs HDF5)" ${HDF5_FOUND})
if(KFA_ENABLE_APPS)
  find_package(HDF5 REQUIRED COMPONENTS C)
  if(HDF5_IS_PARALLEL)
    # Debian's HDF5 is the Open MPI build: its headers include mpi.h.
    find_package(MPI REQUIRED COMPONENTS C)
  endif()
endif()

find_package(GTest QUIET)
option(KFA_ENABLE_TESTS "Build the GoogleTest suites" ${GTest_FOUND})
if(KFA_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()

find_package(benchmark QUIET)
option(KFA_ENABLE_BENCHMARKS "Build the Google Benchmark suites in perf/" ${benchmark_FOUND})
if(KFA_ENABLE_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# The Fortran module (fortran/) over the C interface, when a Fortran compiler is found.
include(CheckLanguage)
check_language(Fortran)
set(_kfa_have_fortran OFF)
if(CMAKE_Fortran_COMPILER)
  set(_kfa_have_fortran ON)
endif()
option(KFA_ENABLE_FORTRAN "Build the Fortran 2008 module kfa (kfa::fortran)" ${_kfa_have_fortran})
if(KFA_ENABLE_FORTRAN)
  enable_language(Fortran)
endif()
