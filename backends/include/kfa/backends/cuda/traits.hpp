#pragma once
/// \file cuda/traits.hpp
/// Tile traits for Kokkos::Cuda, chosen for sm_80 (A100) and sm_90 (H100, H200).
///
/// A team is 4 warps: team_size 4 with vector_length 32, so each team "thread" is one warp
/// and its vector lanes are the warp's lanes (cuda/tile.hpp gives each warp 16 x 16 blocks of
/// a tile product, on the tensor cores for 16-bit inputs).
///
/// The tiles are float in team scratch and must fit the level-0 scratch Kokkos offers a team
/// on CUDA: the 48 KiB of shared memory a launch gets without the opt-in, less the 8 KiB Kokkos
/// reserves (TeamPolicy::scratch_size_max(0), about 40 KiB on both architectures). Larger
/// tiles would spill to level-1 scratch (global memory), which the kernels do only where
/// nothing fits: head_dim above 128. The shapes below are the largest Br x Bc (and Bt) that
/// fit, with rows padded by `pad` (bytes for the largest head_dim of each line):
///
///   head_dim      forward Br x Bc   bytes     backward Bt   bytes
///   <= 32         64 x 32           37.4 K    16            21.6 K
///   <= 64         32 x 32           40.2 K    16            39.0 K
///   <= 128        16 x 16           37.0 K    8             38.5 K
///   <= 256        16 x 16 (level 1) 71.8 K    8 (level 1)   75.3 K
///
/// sm_80 and sm_90 share these shapes: the limit is Kokkos' per-launch one, not the SM's
/// (164 KiB on A100, 228 KiB on H100), which sets how many teams an SM holds instead
/// (concurrent_teams). Tiles in 16-bit for 16-bit inputs, and O and S in registers, would
/// allow 64 x 64 tiles within the same 40 KiB; see README (CUDA backend) for what is measured
/// and what is left. generic/tile_shape.hpp computes shapes from the scratch size and gives
/// this table at the bucket bounds (32, 64, 128) and other shapes inside the buckets, to be
/// ranked on a GPU before they replace it.

#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/float16.hpp>
#include <kfa/backends/generic/tile.hpp>
#include <kfa/config.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace kfa::backends {

namespace cuda {

/// Whether float inputs take the register-resident forward by 3xTF32 (KFA_CUDA_TF32X3).
#if defined(KFA_CUDA_TF32X3)
inline constexpr bool tf32x3 = true;
#else
inline constexpr bool tf32x3 = false;
#endif

/// The tensor-core operand type of value type T: f16_tag for half_t, bf16_tag for bhalf_t
/// where they are 16-bit types; void (no tensor-core path) otherwise.
template <class T>
struct mma_tag {
  using type = void;  ///< the operand tag, or void
};
#if defined(KOKKOS_HALF_T_IS_FLOAT) && !KOKKOS_HALF_T_IS_FLOAT
template <>
struct mma_tag<Kokkos::Experimental::half_t> {
  using type = f16_tag;  ///< binary16 operands
};
#endif
#if defined(KOKKOS_BHALF_T_IS_FLOAT) && !KOKKOS_BHALF_T_IS_FLOAT
template <>
struct mma_tag<Kokkos::Experimental::bhalf_t> {
  using type = bf16_tag;  ///< bfloat16 operands
};
#endif
/// kfa::bf16 (float16.hpp): the encoding of Kokkos' bhalf_t on CUDA, the same operands.
template <>
struct mma_tag<bf16> {
  using type = bf16_tag;  ///< bfloat16 operands
};
/// kfa::half (float16.hpp): the encoding of Kokkos' half_t on CUDA, the same operands.
template <>
struct mma_tag<half> {
  using type = f16_tag;  ///< binary16 operands
};
#if defined(KFA_CUDA_TF32)
template <>
struct mma_tag<float> {
  using type = tf32_tag;  ///< tf32 operands (KFA_CUDA_TF32)
};
#endif

}  // namespace cuda

/// CUDA tile traits: 4 warps per team, one warp per team thread, float tiles in level-0
/// scratch (see the table in this file's description).
template <class T>
struct TileTraits<Kokkos::Cuda, T, void> {
  /// Br: 64 rows for head_dim <= 32, 32 up to 64, 16 beyond.
  static constexpr int block_q(int head_dim, int /*seqlen_k*/) {
    return head_dim <= 32 ? 64 : head_dim <= 64 ? 32 : 16;
  }
  /// Bc: 32 keys up to head_dim 64, 16 beyond.
  static constexpr int block_k(int head_dim) { return head_dim <= 64 ? 32 : 16; }
  /// Backward Br = Bc: 16 up to head_dim 64, 8 beyond.
  static constexpr int block_bwd(int head_dim) { return head_dim <= 64 ? 16 : 8; }
  static constexpr int team_size = 4;       ///< warps per team
  static constexpr int vector_length = 32;  ///< one warp per team thread
  /// Row strides of width + 4 (4 mod 8 words, as every width here is a multiple of 8): the
  /// tensor-core fragment loads (cuda/mma.hpp) read row-major A two-way and row-major B
  /// conflict-free, and the FMA path's two A rows per step fall on different banks. With
  /// strides that are multiples of 32 words the A loads were eight-way conflicts.
  static constexpr int pad = 4;
  /// Query-major scores: warps own query rows (TileTraits::key_major_scores).
  static constexpr bool key_major_scores = false;
  static constexpr bool bf16x2_products = false;  ///< key-major only
#if defined(KFA_CUDA_WARP_TILES)
  /// 16-bit inputs (a tensor-core tag other than tf32) run the forward with the work in
  /// registers (TileOps::warp_forward, cuda/warp_forward.hpp) where the head dim allows, and
  /// float inputs too under KFA_CUDA_TF32X3 (cuda/warp_forward_tf32x3.hpp).
  static constexpr bool warp_tiles =
      std::is_same_v<typename cuda::mma_tag<T>::type, cuda::bf16_tag> ||
      std::is_same_v<typename cuda::mma_tag<T>::type, cuda::f16_tag> ||
      (cuda::tf32x3 && std::is_same_v<T, float>);
#else
  static constexpr bool warp_tiles = false;     ///< KFA_CUDA_WARP_TILES is off
#endif
#if defined(KFA_CUDA_WARP_BACKWARD)
  /// 16-bit inputs run the backward's key-tile kernel with the work in registers
  /// (TileOps::warp_backward, cuda/warp_backward.hpp) where the head dim allows.
  static constexpr bool warp_backward =
      std::is_same_v<typename cuda::mma_tag<T>::type, cuda::bf16_tag> ||
      std::is_same_v<typename cuda::mma_tag<T>::type, cuda::f16_tag>;
#else
  static constexpr bool warp_backward = false;  ///< KFA_CUDA_WARP_BACKWARD is off
#endif
  /// Teams the GPU runs at once: per SM, as many as its shared memory holds at about 40 KiB
  /// each (4 on an A100, 5 on an H100), at most 16 (2048 threads of 128).
  static int concurrent_teams(const Kokkos::Cuda& space) {
    const auto& prop = space.cuda_device_prop();
    int per_sm = static_cast<int>(prop.sharedMemPerMultiprocessor / (41 * 1024));
    per_sm = per_sm < 1 ? 1 : per_sm > 16 ? 16 : per_sm;
    return prop.multiProcessorCount * per_sm;
  }
};

}  // namespace kfa::backends
