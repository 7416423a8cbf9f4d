#pragma once
/// \file generic/tile_shape.hpp
/// Tile shapes computed from the team-scratch size instead of read from a table.
///
/// FlashAttention's analysis (Dao et al. 2022, Theorem 2) takes the key tile as
/// B_c = Theta(M / d) and the query tile as B_r = Theta(min(M / d, d)) for an on-chip memory
/// of M bytes and head dim d: the largest tiles that fit, because the bytes a forward moves
/// from global memory fall as 1 / B_r. choose_tiles applies that rule to the exact scratch
/// layouts of the query-major kernels (the layouts of every backend but the host's key-major
/// one), so that a backend with M bytes of fast team scratch can compute its shapes for any
/// head dim. At Kokkos' CUDA level-0 limit (40,936 bytes, float tiles, rows padded by 4) it
/// gives, at the bucket bounds 32, 64 and 128, exactly the table of cuda/traits.hpp (under the
/// byte counts of Kokkos 3.4 and of Kokkos 4, whose scratch carves align differently); inside
/// the buckets it picks other shapes (tests/test_portable.cpp lists them), which only a GPU
/// measurement can rank, so cuda/traits.hpp keeps its table for now.

#include <Kokkos_Macros.hpp>

#include <cstddef>

namespace kfa::backends {

/// Forward Br x Bc and backward Bt x Bt tiles; 0 where nothing admissible fits.
struct TileShape {
  int br;  ///< query rows of a forward tile
  int bc;  ///< keys of a forward tile
  int bt;  ///< rows (= keys) of a backward tile
};

namespace tile_shape_detail {
/// Bytes of a team-scratch array of n elements of `elem` bytes as Kokkos' View::shmem_size(n)
/// counts them: the elements plus room to align the carve, one element before Kokkos 4, the
/// larger of an element and the scratch alignment (8 bytes) since.
constexpr std::size_t array_bytes(std::size_t n, std::size_t elem) {
#if KOKKOS_VERSION >= 40000
  return n * elem + (elem > 8 ? elem : 8);
#else
  return (n + 1) * elem;
#endif
}
}  // namespace tile_shape_detail

/// Team scratch of the query-major forward (impl/forward_kernel.hpp, ForwardKernel::
/// scratch_bytes): Q_i (Br x ldd), O~_i (Br x ldv), K_j^T (D x ldc), V_j (Bc x ldv), S_ij
/// (Br x ldc), m and l (Br), with ldd = D + pad, ldv = Dv + pad, ldc = Bc + pad and elements
/// of `elem` bytes; head_dim_v is v's head dim Dv (0: head_dim).
constexpr std::size_t forward_scratch_bytes(int br, int bc, int head_dim, int elem, int pad,
                                            int head_dim_v = 0) {
  using tile_shape_detail::array_bytes;
  const std::size_t r = br, c = bc, d = head_dim, dv = head_dim_v > 0 ? head_dim_v : head_dim,
                    e = elem, ldd = d + pad, ldv = dv + pad, ldc = c + pad;
  return array_bytes(r * ldd, e) + array_bytes(r * ldv, e) + array_bytes(d * ldc, e) +
         array_bytes(c * ldv, e) + array_bytes(r * ldc, e) + 2 * array_bytes(r, e);
}

/// Team scratch of the backward's key-tile kernel (`with_dkdv`) or query-tile kernel
/// (impl/backward_kernel.hpp, BackwardCommon::scratch_bytes) with Bt x Bt tiles: K, Q and dQ
/// (+ dK) Bt x D, dO (+ dV) Bt x Dv, K^T D x Bt, V^T Dv x Bt; head_dim_v 0: head_dim.
constexpr std::size_t backward_scratch_bytes(int bt, int head_dim, int elem, int pad,
                                             bool with_dkdv, int head_dim_v = 0) {
  using tile_shape_detail::array_bytes;
  const std::size_t t = bt, d = head_dim, dv = head_dim_v > 0 ? head_dim_v : head_dim, e = elem,
                    ldd = d + pad, ldv = dv + pad, ldt = t + pad;
  const std::size_t tiles_d = with_dkdv ? 4 : 3, tiles_v = with_dkdv ? 2 : 1;
  return tiles_d * array_bytes(t * ldd, e) + tiles_v * array_bytes(t * ldv, e) +
         array_bytes(d * ldt, e) + array_bytes(dv * ldt, e) + 2 * array_bytes(t * ldt, e) +
         2 * array_bytes(t, e);
}

/// The largest tiles whose team scratch fits `scratch` bytes at head_dim (and v's head dim
/// head_dim_v, 0: head_dim): among powers of two >= 8 with Br >= Bc, Br <= 128 and Bc <= the
/// larger head dim (B_c = Theta(min(M / d, d))), the forward pair with the largest Br * Bc
/// (ties: the longer Br), and the largest power of two 8 <= Bt <= 128 whose key-tile backward
/// (the larger of the two backward kernels) fits. A member is 0 where no admissible shape
/// fits: the kernel then needs level-1 scratch.
constexpr TileShape choose_tiles(std::size_t scratch, int head_dim, int elem, int pad,
                                 int head_dim_v = 0) {
  TileShape best{0, 0, 0};
  const int widest = head_dim_v > head_dim ? head_dim_v : head_dim;
  for (int br = 8; br <= 128; br *= 2)
    for (int bc = 8; bc <= br && bc <= widest; bc *= 2) {
      if (forward_scratch_bytes(br, bc, head_dim, elem, pad, head_dim_v) > scratch) continue;
      const long long area = static_cast<long long>(br) * bc,
                      best_area = static_cast<long long>(best.br) * best.bc;
      if (area > best_area || (area == best_area && br > best.br)) {
        best.br = br;
        best.bc = bc;
      }
    }
  for (int bt = 8; bt <= 128; bt *= 2)
    if (backward_scratch_bytes(bt, head_dim, elem, pad, true, head_dim_v) <= scratch) best.bt = bt;
  return best;
}

}  // namespace kfa::backends
