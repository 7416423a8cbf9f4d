#pragma once
/// \file traits.hpp
/// The one dispatch header: includes the portable tile code and the specialisations of the
/// backends this Kokkos build enables. core/ includes only this file from backends/.

#include <kfa/backends/generic/tile.hpp>
// KFA_PORTABLE_TILES leaves out the host specialisations, so that a test can run on the host
// the portable path the other backends use (tests/test_portable.cpp). Not for applications.
#ifndef KFA_PORTABLE_TILES
#include <kfa/backends/host/tile.hpp>
#include <kfa/backends/host/traits.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <kfa/backends/cuda/tile.hpp>
#include <kfa/backends/cuda/traits.hpp>
#endif
#endif
