#pragma once
/// \file traits.hpp
/// The one dispatch header: includes the portable tile code and the specialisations of the
/// backends this Kokkos build enables. core/ includes only this file from backends/.

#include <kfa/backends/generic/tile.hpp>
#include <kfa/backends/host/tile.hpp>
#include <kfa/backends/host/traits.hpp>
