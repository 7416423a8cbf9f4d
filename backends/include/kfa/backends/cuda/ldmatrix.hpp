#pragma once
/// \file cuda/ldmatrix.hpp
/// Loading tensor-core fragments from 16-bit tiles in shared memory: which row address each
/// lane gives `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16` so that the four registers
/// it returns are exactly the FragA / FragB of cuda/mma.hpp, the XOR swizzle of 16-byte
/// chunks that makes those loads (and the 16-byte stores that fill the tile) free of bank
/// conflicts, and device wrappers for ldmatrix and the asynchronous global-to-shared copy
/// (cp.async, sm_80 and newer).
///
/// The three fragments FlashAttention-2's tile step needs, for m16n8k16 (cuda/mma.hpp):
/// - A, a 16 x 16 block of a row-major tile (Q in S = Q K^T): `a_source`, no .trans.
/// - B = K^T for S = Q K^T, read from row-major K (keys x head dim), two n8 blocks at once:
///   `b_source` (no .trans). Registers 0, 1 are the FragB of keys n0..n0+7, 2, 3 of n0+8..15.
/// - B = V for O += P V, read from row-major V (keys x head dim) with .trans, two n8 blocks
///   (head-dim columns) at once: `bt_source`. Registers as for `b_source`.
/// Each returns, for a lane, the (row, col) of the tile element at which its 16-byte row
/// starts, relative to the block's origin; `swizzled` turns that into the element offset in
/// the swizzled tile.
///
/// Everything but the device wrappers is host and device code: tests/test_mma.cpp emulates
/// ldmatrix from the PTX ISA's description and checks these choices against mma.hpp's
/// fragment tables, and the swizzle against shared memory's banks.

#include <kfa/backends/cuda/mma.hpp>

namespace kfa::backends::cuda {

/// Lane's row address for an A fragment (16 x 16, row-major tile) by ldmatrix.x4: lanes 8m..8m+7
/// give the rows of 8 x 8 matrix m, and the matrices are ordered (rows 0-7, cols 0-7),
/// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15): a0..a7's order.
KFA_MMA_FUNCTION constexpr Coord a_source(int lane) {
  return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)};
}

/// Lane's row address for two B fragments of K^T (keys n0..n0+15, head dims k0..k0+15) from a
/// row-major K tile by ldmatrix.x4 (no .trans): matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15),
/// (keys 8-15, k 0-7), (keys 8-15, k 8-15). The returned row is the key, the column the head
/// dim.
KFA_MMA_FUNCTION constexpr Coord b_source(int lane) {
  return {(lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)};
}

/// Lane's row address for two B fragments of V (keys k0..k0+15, head dims n0..n0+15) from a
/// row-major V tile by ldmatrix.x4.trans: matrices (keys 0-7, n 0-7), (keys 8-15, n 0-7),
/// (keys 0-7, n 8-15), (keys 8-15, n 8-15). The returned row is the key, the column the head
/// dim.
KFA_MMA_FUNCTION constexpr Coord bt_source(int lane) {
  return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)};
}

/// Elements of a 16-bit tile per 16-byte chunk (the unit of ldmatrix rows and cp.async).
inline constexpr int chunk_elements = 8;

/// The physical chunk of logical 16-byte chunk `chunk` in row `row` of a tile whose rows hold
/// `chunks_per_row` chunks (a power of two; rows of 32, 64, 128 16-bit elements: 4, 8, 16).
/// Shared memory has 32 banks of 4 bytes, so a 16-byte chunk sits in one of 8 bank groups,
/// (byte offset / 16) mod 8. ldmatrix reads 8 rows per phase at the same logical chunk, and
/// unswizzled rows of 128 bytes put all 8 in one group (an 8-way conflict). XOR-ing the chunk
/// index with the row's position among the 8 rows that share a 128-byte span makes the 8
/// groups distinct; within one row it is a permutation of the chunks, so a warp's 16-byte
/// stores of whole rows stay conflict-free too. Rows shorter than 128 bytes share a span:
/// the row index is divided by the rows per span first.
KFA_MMA_FUNCTION constexpr int swizzle_chunk(int row, int chunk, int chunks_per_row) {
  const int rows_per_span = chunks_per_row >= 8 ? 1 : 8 / chunks_per_row;
  const int mask = (chunks_per_row >= 8 ? 8 : chunks_per_row) - 1;
  return chunk ^ ((row / rows_per_span) & mask);
}

/// Element offset of (row, col) in a swizzled 16-bit tile of `row_elements` per row (a
/// multiple of chunk_elements whose chunk count is a power of two); col's place within its
/// chunk is kept, so 16-byte accesses at chunk starts stay whole.
KFA_MMA_FUNCTION constexpr int swizzled(int row, int col, int row_elements) {
  const int chunks = row_elements / chunk_elements;
  const int chunk = swizzle_chunk(row, col / chunk_elements, chunks);
  return row * row_elements + chunk * chunk_elements + col % chunk_elements;
}

#if defined(__CUDACC__)
/// \cond kfa_internal
namespace detail {
__device__ inline unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
}  // namespace detail
/// \endcond

/// ldmatrix.x4: four 8 x 8 matrices of 16-bit elements; `row` is this lane's row address in
/// shared memory (16 bytes, 16-byte aligned; see a_source, b_source). Register j receives
/// matrix j's elements (lane / 4, 2 (lane % 4) + {0, 1}). All 32 lanes, converged.
__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::shared_address(row)));
#else
  (void)r, (void)row;
  detail::mma_unsupported();
#endif
}

/// ldmatrix.x4.trans: as ldmatrix_x4 with each matrix transposed: register j receives matrix
/// j's elements (2 (lane % 4) + {0, 1}, lane / 4) (see bt_source).
__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::shared_address(row)));
#else
  (void)r, (void)row;
  detail::mma_unsupported();
#endif
}

/// Starts a 16-byte copy from global to shared memory that bypasses L1 and the registers
/// (cp.async.cg, sm_80 and newer); both addresses 16-byte aligned. With valid false nothing
/// is read and the 16 bytes are zero-filled (the source size 0; the address must still be a
/// valid one). Complete it with cp_async_commit and cp_async_wait, then a barrier, before
/// other lanes read it.
__device__ inline void cp_async_16(void* shared, const void* global, bool valid = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(detail::shared_address(shared)),
      "l"(global), "r"(valid ? 16 : 0));
#else
  (void)shared, (void)global, (void)valid;
  detail::mma_unsupported();
#endif
}

/// Closes the group of this lane's cp.async copies issued since the last commit.
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/// Waits until at most `Pending` of this lane's committed groups are still in flight (0: all
/// done): the double buffer of a tile loop waits with 1 while the next tile loads.
template <int Pending>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}
#endif  // __CUDACC__

}  // namespace kfa::backends::cuda
