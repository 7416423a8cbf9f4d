#pragma once
/// \file dropout.hpp
/// kfa::dropout_mask: the keep-mask that forward and backward apply for a given
/// (params.dropout, params.seed, params.offset), materialised for testing and debugging.
///
/// Dropout in kfa never stores its mask: each kernel regenerates it from the element's position
/// with a counter-based generator (Philox4x32-10; the exact scheme is in impl/dropout.hpp), so
/// the mask is the same for every tile shape, split count, backend and sequence partition.
/// The forward multiplies the normalised probabilities by Z (1 / (1 - p) where kept, 0 where
/// dropped) after the row statistics, so LSE does not depend on dropout:
///   O = (softmax(S) * Z) V.
/// The backward regenerates Z and applies it to dP. Use a new offset (or seed) for each call
/// that needs a fresh mask, and the same pair for a forward and its backward.

#include <kfa/impl/dropout.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kfa {

/// Writes the dropout keep-mask of `params` into `keep`: keep(b, h, i, j) = 1 where the
/// probability of query i (query head h, batch b) on key j is kept, 0 where it is dropped.
/// It is exactly the mask kfa::forward and kfa::backward apply with the same params, for any
/// shape; causal and window masks are not part of it (those keys are absent either way).
/// With params.dropout = 0 every element is kept.
///
/// \param space execution space the kernel runs on (asynchronously).
/// \param keep  (batch, heads_q, seqlen_q, seqlen_k), std::uint8_t, any layout.
/// \param params dropout, seed and offset are read; the rest is ignored.
/// \throws kfa::Error when params.dropout is outside [0, 1), or an extent exceeds int.
template <class ExecSpace, class Keep>
void dropout_mask(const ExecSpace& space, const Keep& keep, const Params& params) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::dropout_mask: the first argument must be a Kokkos execution space");
  static_assert(Kokkos::is_view<Keep>::value && Keep::rank == 4 &&
                    std::is_same_v<typename Keep::value_type, std::uint8_t>,
                "kfa::dropout_mask: keep must be a rank-4 View of non-const std::uint8_t "
                "(batch, heads_q, seqlen_q, seqlen_k)");
  impl::static_check_accessible<ExecSpace, Keep>();
  if (!(params.dropout >= 0 && params.dropout < 1))
    impl::fail("dropout_mask", "dropout must be in [0, 1), got ", params.dropout);
  for (int dim = 0; dim < 4; ++dim)
    if (keep.extent(dim) > 2147483647u)
      impl::fail("dropout_mask", "keep.extent(", dim, ") = ", keep.extent(dim),
                 " exceeds the largest int");
  impl::ScopedRegion region("kfa::dropout_mask");
  const std::size_t rows = keep.extent(0) * keep.extent(1) * keep.extent(2);
  if (rows == 0 || keep.extent(3) == 0) return;
  impl::Dropout<float> d = impl::make_dropout<float>(params);  // threshold 0 when p = 0
  Kokkos::parallel_for(
      "kfa::dropout_mask",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::size_t>>(space, 0, rows),
      impl::DropoutMaskKernel<Keep>{keep, d});
}

}  // namespace kfa
