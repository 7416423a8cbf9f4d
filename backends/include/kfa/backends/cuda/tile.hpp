#pragma once
/// \file cuda/tile.hpp
/// Tile products for Kokkos::Cuda: each warp of the team (one team thread, vector_length 32;
/// cuda/traits.hpp) takes 16 x 16 blocks of C and keeps them in registers for the whole k
/// loop, reading A and B from the float tiles in scratch.
///
/// - Kokkos half_t and bhalf_t inputs (16-bit in a CUDA build): the tensor cores, two
///   mma.sync m16n8k16 per 16-wide k step with float accumulators (cuda/mma.hpp). The
///   operands are rounded to the input type as the fragments are loaded: exact for Q, K, V,
///   dO (they came from that type), one rounding for P and dS, as in FlashAttention-2.
/// - float: FMA units, each lane 8 rows x 1 column of its warp's block in registers (lanes
///   0-15 and 16-31 take alternate rows, so a warp reads two A elements and 16 consecutive B
///   elements per k step: broadcast and conflict-free). With the CMake option KFA_CUDA_TF32
///   float uses the tf32 tensor cores instead (m16n8k8): about 3 significant decimal digits
///   per product instead of 7, outside float's tolerance rule (README). (The register forward
///   of float inputs, warp_forward below under KFA_CUDA_TF32X3, takes three tf32 products per
///   product instead and stays within it: cuda/warp_forward_tf32x3.hpp.)
/// - Other value types (double, narrow types other than Kokkos'): the portable gemm.
///
/// Rows, columns and k need not be multiples of 16: the fragment loads read zeros outside and
/// the stores skip what is outside. Everything else (staging, the row max and exp-sum over a
/// warp's 32 lanes) is PortableTileOps, which with vector_length 32 already spreads a row
/// over a warp.

#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/cuda/traits.hpp>
#include <kfa/backends/cuda/warp_backward.hpp>
#include <kfa/backends/cuda/warp_forward.hpp>
#include <kfa/backends/cuda/warp_forward_tf32x3.hpp>
#include <kfa/backends/float16.hpp>
#include <kfa/backends/generic/tile.hpp>
#include <kfa/config.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kfa::backends {

namespace cuda {

/// Rows of the block of C one warp computes at a time (one mma row block).
inline constexpr int warp_rows = 16;
/// Columns of the block of C one warp computes at a time (two 8-column mma blocks).
inline constexpr int warp_cols = 16;

/// The calling lane's index in its warp: the vector lane, as vector_length is 32.
KOKKOS_INLINE_FUNCTION int lane_id() {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(threadIdx.x);
#else
  return 0;
#endif
}

/// C (+)= A B with operands of A and B in Tag on the tensor cores; arguments as
/// PortableTileOps::gemm. Each task is one 16 x 16 block of C (two 16 x 8 accumulators).
template <class Tag, class Member>
KOKKOS_INLINE_FUNCTION void mma_gemm(const Member& team, int m, int n, int k, const float* a,
                                     int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                                     bool accumulate) {
  constexpr int kstep = MmaShape<Tag>::k, nb = warp_cols / MmaShape<Tag>::n;
  const int mt = (m + warp_rows - 1) / warp_rows, nt = (n + warp_cols - 1) / warp_cols;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, mt * nt), [&](int task) {
#if defined(__CUDA_ARCH__)
    // All 32 lanes of the warp run this body together: mma.sync needs them converged.
    const int lane = lane_id();
    const int i0 = task / nt * warp_rows, j0 = task % nt * warp_cols;
    const int rows = m - i0;
    float* cblk = c + static_cast<std::ptrdiff_t>(i0) * ldc + j0;
    FragC acc[nb];
    for (int t = 0; t < nb; ++t)
      acc[t] = accumulate ? load_c(cblk + t * 8, ldc, rows, n - j0 - t * 8, lane) : zero_c();
    for (int p0 = 0; p0 < k; p0 += kstep) {
      const FragA<Tag> fa = load_a(
          Tag{},
          a + static_cast<std::ptrdiff_t>(i0) * a_rs + static_cast<std::ptrdiff_t>(p0) * a_cs, a_rs,
          a_cs, rows, k - p0, lane);
      const float* bk = b + static_cast<std::ptrdiff_t>(p0) * ldb + j0;
      for (int t = 0; t < nb; ++t) {
        const FragB<Tag> fb = load_b(Tag{}, bk + t * 8, ldb, 1, k - p0, n - j0 - t * 8, lane);
        mma(acc[t], fa, fb);
      }
    }
    for (int t = 0; t < nb; ++t)
      store_c(acc[t], cblk + t * 8, ldc, rows, n - j0 - t * 8, lane);
#else
    (void)task;  // Cuda teams run on the device only
#endif
  });
}

/// C (+)= A B in float on the FMA units; arguments as PortableTileOps::gemm. Each task is one
/// 16 x 16 block of C: lane l owns column l % 16 and rows l / 16, l / 16 + 2, ..., 8 of them.
template <class Member>
KOKKOS_INLINE_FUNCTION void fma_gemm(const Member& team, int m, int n, int k, const float* a,
                                     int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                                     bool accumulate) {
  constexpr int rows_per_lane = warp_rows / 2;
  const int mt = (m + warp_rows - 1) / warp_rows, nt = (n + warp_cols - 1) / warp_cols;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, mt * nt), [&](int task) {
    const int lane = lane_id();
    const int i0 = task / nt * warp_rows + lane / 16, j = task % nt * warp_cols + lane % 16;
    // Rows and the column outside C are clamped for the loads (reading valid data) and not
    // stored: no branch in the k loop.
    const int jc = j < n ? j : n - 1;
    int row[rows_per_lane];
    float acc[rows_per_lane];
    for (int r = 0; r < rows_per_lane; ++r) {
      const int i = i0 + 2 * r;
      row[r] = i < m ? i : m - 1;
      acc[r] = accumulate ? c[static_cast<std::ptrdiff_t>(row[r]) * ldc + jc] : 0.0f;
    }
    for (int p = 0; p < k; ++p) {
      const float bp = b[static_cast<std::ptrdiff_t>(p) * ldb + jc];
      const float* ap = a + static_cast<std::ptrdiff_t>(p) * a_cs;
      for (int r = 0; r < rows_per_lane; ++r)
        acc[r] += ap[static_cast<std::ptrdiff_t>(row[r]) * a_rs] * bp;
    }
    if (j < n)
      for (int r = 0; r < rows_per_lane; ++r)
        if (i0 + 2 * r < m) c[static_cast<std::ptrdiff_t>(i0 + 2 * r) * ldc + j] = acc[r];
  });
}

}  // namespace cuda

/// CUDA tile operations for value type T: the tensor cores for Kokkos' 16-bit types (and for
/// float under KFA_CUDA_TF32), register-blocked FMA for float, the portable gemm otherwise.
template <class T>
struct TileOps<Kokkos::Cuda, T, void> : PortableTileOps<accum_t<T>> {
  using Acc = accum_t<T>;  ///< the element type of the tiles
  static_assert(TileTraits<Kokkos::Cuda, T>::vector_length == 32,
                "CUDA TileOps need one warp per team thread (cuda/traits.hpp)");

  /// C (+)= A B as PortableTileOps::gemm, by the whole team.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm(const Member& team, int m, int n, int k, const Acc* a,
                                          int a_rs, int a_cs, const Acc* b, int ldb, Acc* c,
                                          int ldc, bool accumulate) {
    using Tag = typename cuda::mma_tag<T>::type;
    if (m <= 0 || n <= 0) return;
    if constexpr (!std::is_void_v<Tag>)
      cuda::mma_gemm<Tag>(team, m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    else if constexpr (std::is_same_v<Acc, float>)
      cuda::fma_gemm(team, m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    else
      PortableTileOps<Acc>::gemm(team, m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
  }

  /// Whether warp_forward is the float kernel (3xTF32, cuda/warp_forward_tf32x3.hpp).
  static constexpr bool warp_float = std::is_same_v<T, float>;

  /// Blocks of 16 query rows per warp of warp_forward at head dim d: 2 at 64 (FlashAttention-2's
  /// 128-row tiles; KFA_CUDA_WARP_BLOCKS_D64 overrides it, for measuring), 1 at 128, where two
  /// would need more registers than a lane has. With dropout 1: Philox's registers on top of
  /// two blocks' made the half kernel spill 16 bytes at sm_90 (perf/cuda_report.py). Float: 1
  /// (its Q takes twice the registers, split in two parts at d = 64).
  static constexpr int warp_blocks(int d, bool dropped = false) {
    if (dropped || warp_float) return 1;
#if defined(KFA_CUDA_WARP_BLOCKS_D64)
    return d == 64 ? KFA_CUDA_WARP_BLOCKS_D64 : 1;
#else
    return d == 64 ? 2 : 1;
#endif
  }
  /// Query rows per team of warp_forward at head dim d (4 warps of warp_blocks(d, dropped) x 16
  /// rows).
  static constexpr int warp_rows(int d, bool dropped = false) {
    return 4 * 16 * warp_blocks(d, dropped);
  }
  /// Keys per tile of warp_forward.
  static constexpr int warp_keys = 64;
  /// Whether warp_forward runs on the device of `space`: its copies, loads and products need
  /// sm_80 or newer (16-bit inputs need it on any path; float runs on the FMA units before).
  static bool warp_runs(const Kokkos::Cuda& space) {
    return space.cuda_device_prop().major >= 8;
  }
  /// Whether warp_forward takes head dim d (a compile-time constant of its kernel).
  static constexpr bool warp_head_dim(int d) {
    return d == 64 || d == 128;
  }
  /// Team scratch of warp_forward at head dim d: a K_j and a V_j tile of 16-bit elements, and
  /// 128 bytes to align them (get_shmem_aligned): 16.1 KiB at d = 64, 32.1 KiB at d = 128,
  /// within the about 40 KiB a CUDA team gets (traits.hpp). Float: tiles of 64 keys at d = 64
  /// and 32 at 128 (cuda::WarpForwardTf32x3::keys, which subdivides core's warp_keys), 32.1 KiB.
  static constexpr std::size_t warp_scratch_bytes(int d) {
    if (warp_float) return std::size_t(2) * (d > 64 ? warp_keys / 2 : warp_keys) * d * 4 + 128;
    return std::size_t(2) * warp_keys * d * 2 + 128;
  }

  /// FlashAttention-2's forward of one team with the work in registers
  /// (cuda/warp_forward.hpp, TileTraits::warp_tiles): query rows [q0, q0 + nq) against keys
  /// [k_begin, k_end) at head dim HeadDim (one warp_head_dim takes); rows, score and out as
  /// cuda::WarpForward::run. All lanes of the team call it.
  template <int HeadDim, class Member, class QRow, class KRow, class VRow, class Score, class Out>
  static KOKKOS_INLINE_FUNCTION void warp_forward(const Member& team, int q0, int nq, int k_begin,
                                                  int k_end, const QRow& q_row, const KRow& k_row,
                                                  const VRow& v_row, const Score& score, Out& out) {
#if defined(__CUDA_ARCH__)
    auto* smem = static_cast<std::uint16_t*>(
        team.team_scratch(0).get_shmem_aligned(warp_scratch_bytes(HeadDim) - 128, 128));
    if constexpr (warp_float) {
      using Kernel = cuda::WarpForwardTf32x3<cuda::CudaWarp<cuda::tf32_tag>, HeadDim>;
      static_assert(Kernel::shared_bytes() + 128 == warp_scratch_bytes(HeadDim));
      static_assert(Kernel::rows == warp_rows(HeadDim) && warp_keys % Kernel::keys == 0);
      Kernel::run(smem, q0, nq, k_begin, k_end, q_row, k_row, v_row, score, out);
    } else {
      using Tag = typename cuda::mma_tag<T>::type;
      cuda::WarpForward<cuda::CudaWarp<Tag>, Tag, HeadDim,
                        warp_blocks(HeadDim, Score::dropped)>::run(smem, q0, nq, k_begin, k_end,
                                                                   q_row, k_row, v_row, score, out);
    }
#else
    (void)team, (void)q0, (void)nq, (void)k_begin, (void)k_end, (void)q_row, (void)k_row;
    (void)v_row, (void)score, (void)out;  // Cuda teams run on the device only
#endif
  }

  /// Query rows per tile step of warp_backward at head dim d: 64 at 64, 16 at 128, where the
  /// dK and dV accumulators take twice the registers (32 rows spilled at sm_80). With dropout
  /// 32 at 64: Philox's registers on top of 64 rows' S^T and dP^T spilled 12 bytes at sm_80.
  static constexpr int warp_backward_rows(int d, bool dropped = false) {
    return d <= 64 ? (dropped ? 32 : 64) : 16;
  }
  /// Team scratch of warp_backward at head dim d (cuda::WarpBackward::shared_bytes) and 128
  /// bytes to align it: 32.6 KiB at d = 64 (20.4 KiB with dropout), 26.3 KiB at 128.
  static constexpr std::size_t warp_backward_scratch_bytes(int d, bool dropped = false) {
    const std::size_t qr = warp_backward_rows(d, dropped);
    return std::size_t(2) * (warp_keys * d + 2 * qr * d + warp_keys * qr) + std::size_t(8) * qr +
           128;
  }

  /// FlashAttention-2's backward of one key tile with the work in registers
  /// (cuda/warp_backward.hpp, TileTraits::warp_backward): keys [k0, k0 + nc) against the query
  /// tiles of `heads` query heads, at head dim HeadDim (one warp_head_dim takes); the other
  /// arguments as cuda::WarpBackward::run. All lanes of the team call it.
  template <int HeadDim, class Member, class KRow, class VRow, class QRow, class DoRow, class Stats,
            class Mask, class Grads>
  static KOKKOS_INLINE_FUNCTION void warp_backward(const Member& team, int k0, int nc, int heads,
                                                   int seqlen_q, float scale, const KRow& k_row,
                                                   const VRow& v_row, const QRow& q_row,
                                                   const DoRow& do_row, const Stats& stats,
                                                   const Mask& mask, Grads& grads) {
#if defined(__CUDA_ARCH__)
    using Tag = typename cuda::mma_tag<T>::type;
    constexpr bool dropped = Mask::dropped;
    using Kernel =
        cuda::WarpBackward<cuda::CudaWarp<Tag>, Tag, HeadDim, warp_backward_rows(HeadDim, dropped)>;
    static_assert(Kernel::shared_bytes() + 128 == warp_backward_scratch_bytes(HeadDim, dropped));
    static_assert(Kernel::keys == warp_keys, "core cuts the key tiles by warp_keys");
    auto* smem = static_cast<std::uint16_t*>(
        team.team_scratch(0).get_shmem_aligned(Kernel::shared_bytes(), 128));
    Kernel::run(smem, k0, nc, heads, seqlen_q, scale, k_row, v_row, q_row, do_row, stats, mask,
                grads);
#else
    (void)team, (void)k0, (void)nc, (void)heads, (void)seqlen_q, (void)scale, (void)k_row;
    (void)v_row, (void)q_row, (void)do_row, (void)stats, (void)mask, (void)grads;
#endif
  }
};

}  // namespace kfa::backends
