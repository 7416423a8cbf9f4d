#pragma once
/// \file kfa.hpp
/// Umbrella header of kfa, exact FlashAttention-2 attention on Kokkos.

#include <kfa/backward.hpp>
#include <kfa/combine.hpp>
#include <kfa/combiners.hpp>
#include <kfa/config.hpp>
#include <kfa/dropout.hpp>
#include <kfa/float16.hpp>
#include <kfa/flops.hpp>
#include <kfa/forward.hpp>
#include <kfa/layer_norm.hpp>
#include <kfa/masks.hpp>
#include <kfa/multiscale.hpp>
#include <kfa/params.hpp>
#include <kfa/varlen.hpp>
#include <kfa/welford.hpp>
#include <kfa/workspace.hpp>
