#pragma once
/// \file cuda/warp_forward.hpp
/// FlashAttention-2's forward for one team of 4 warps, the work in registers (16-bit inputs;
/// float's, by 3xTF32, is cuda/warp_forward_tf32x3.hpp, which shares stage_tile, softmax_tile
/// and write_rows below): each warp owns
/// 16 or 32 of the team's 64 or 128 query rows and keeps their Q fragments, S / P and the O~
/// accumulator in registers; K_j and V_j (64 keys) pass through swizzled 16-bit shared memory,
/// staged by 16-byte asynchronous copies and read by ldmatrix (.trans for V); P goes register
/// to register into P V (a_from_c); the online softmax is cuda/warp_softmax.hpp's.
///
/// The code is written against a warp policy W (the warp's primitives: lane and warp ids,
/// the team barrier, ldmatrix, cp.async, mma.sync, the quad shuffles) so that one source
/// runs on the device (CudaWarp below, inside a Kokkos team whose vector lanes are a warp's
/// lanes) and on the host in tests/test_mma.cpp, where a simulator runs the 128 lanes as
/// threads and emulates every collective from the PTX ISA. What core knows stays in core:
/// the caller passes the rows of Q, K, V (16-bit, 16-byte aligned), the score transform with
/// the mask, and where O and the LSE go.
///
/// Shared memory: one K_j and one V_j tile of 64 x D 16-bit elements (16 KiB at D = 64, 32 KiB
/// at D = 128); Q_i is staged through them once and kept in registers. The copies
/// overlap the products as in FlashAttention-2, without a second buffer: V_j loads while
/// S = Q_i K_j^T and the softmax run, K_{j+1} while O~ += P V_j; each buffer is refilled only
/// after the barrier that follows the last read of it.

#include <kfa/backends/cuda/ldmatrix.hpp>
#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/cuda/warp_softmax.hpp>

#include <cstddef>
#include <cstdint>

namespace kfa::backends::cuda {

/// Stages rows [r0, r0 + n) of an array (row(r) points at row r, 16-byte aligned, counted in
/// 16-bit units: a float row of d elements is 2 d units) into a swizzled tile of Rows rows of
/// RowUnits 16-bit units (cuda/ldmatrix.hpp's swizzled), zero-filling rows past n, by 16-byte
/// copies of a team's 4 warps; the caller commits them (W::cp_async_commit), waits for them
/// (W::cp_async_wait_all) and then for the team barrier.
template <class W, int Rows, int RowUnits, class Row>
KFA_MMA_FUNCTION void stage_tile(std::uint16_t* tile, int r0, int n, const Row& row) {
  constexpr int chunks = RowUnits / chunk_elements;  // 16-byte chunks per row
  const int t = W::warp() * 32 + W::lane();
  for (int c = t; c < Rows * chunks; c += 4 * 32) {
    const int r = c / chunks, k = c % chunks;
    const bool valid = r < n;
    const std::uint16_t* src = row(valid ? r0 + r : r0) + (valid ? k : 0) * chunk_elements;
    W::cp_async_16(tile + swizzled(r, k * chunk_elements, RowUnits), src, valid);
  }
}

/// The key tiles of a team's forward loop: Keys keys each from a start up to k_end (the last
/// may be partial), skipping those no row of [q0, q0 + nq) sees (`score.tile_visible`, the same
/// verdict in every lane).
template <int Keys, class Score>
struct KeyTiles {
  const Score& score;  ///< tile_visible(q0, nq, j0, nc)
  int q0;              ///< the team's first query row
  int nq;              ///< and its rows
  int k_end;           ///< the end of its keys
  /// Keys in the tile at j.
  KFA_MMA_FUNCTION int size(int j) const { return k_end - j < Keys ? k_end - j : Keys; }
  /// The first tile from j on that some row sees, or k_end and beyond when none does.
  KFA_MMA_FUNCTION int next(int j) const {
    while (j < k_end && !score.tile_visible(q0, nq, j, size(j)))
      j += Keys;
    return j;
  }
};

/// One key tile's softmax step on a warp's R blocks of 16 query rows, S = Q K_j^T in the
/// accumulators `s` (NB fragments of 8 keys from j0, nc of them in the tile; any product type,
/// as every mma shape lays C out alike): the scores (scale, softcap and mask by `score`, as
/// WarpForward::run describes; `inside`: every row sees every key, no mask test), the quad's row
/// maxima, P = exp2(S - m) in place of S with the rows' (m, l) in `state`, O~ in `o` rescaled,
/// and with dropout (Score::dropped) each P weighed by its verdict after l took it. row0[r]:
/// the lane's first row of block r (it also holds row0[r] + 8).
template <class W, int R, int NB, int DB, class Score>
KFA_MMA_FUNCTION void softmax_tile(FragC (&s)[R][NB], FragC (&o)[R][DB], RowState (&state)[R],
                                   const int (&row0)[R], bool inside, int j0, int nc,
                                   const Score& score) {
  const int lane = W::lane();
  KFA_UNROLL
  for (int r = 0; r < R; ++r) {
    // The rows' scores, made per tile rather than kept: with two blocks a warp, registers
    // held across the key loop are the scarce resource.
    const auto score_row = [&](int h) { return score.row(row0[r] + 8 * h); };
    const auto row_g = score_row(0), row_g8 = score_row(1);
    if (inside) {  // every row sees every key: no mask test per score
      KFA_UNROLL
      for (int n = 0; n < NB; ++n) {
        KFA_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + 8 * n + c_coord(lane, e).col;
          s[r][n].x[e] = (e < 2 ? row_g : row_g8).unmasked(j, s[r][n].x[e]) * log2e;
        }
      }
    } else {
      KFA_UNROLL
      for (int n = 0; n < NB; ++n) {
        KFA_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + 8 * n + c_coord(lane, e).col;  // keys past the tile: zero rows
          const float x = (e < 2 ? row_g : row_g8)(j, s[r][n].x[e]);
          s[r][n].x[e] = j < j0 + nc ? x * log2e : -INFINITY;
        }
      }
    }

    // The online softmax: the quad's row maxima, P, alpha, O~ rescaled.
    float m[2], alpha[2];
    tile_row_max(s[r], m);
    m[0] = W::quad_max(m[0]);
    m[1] = W::quad_max(m[1]);
    softmax_update(s[r], state[r], m, alpha);
    rescale(o[r], alpha);
    if constexpr (Score::dropped) {  // after l took the sums: dropout weighs P V alone
      // The verdicts first, bit 4 n + e for s[r][n].x[e], by loops not unrolled: one
      // Philox chain at a time (unrolled, the scheduler interleaves them and their
      // registers made the 255-register kernels spill).
      std::uint32_t kept = 0;
      if (score.group_starts(j0)) {
        // Lanes 2u and 2u + 1 hold one group of four keys of each n8 block (words 0, 1 and
        // 2, 3 of its Philox call) in rows g and g + 8: the even lane draws row g's four
        // verdicts, the odd lane row g + 8's, and one exchange gives each its half of the
        // other's: one call per lane and block instead of two.
        const bool odd = lane & 1;
        const auto row = score.row(row0[r] + (odd ? 8 : 0));
        std::uint32_t mine = 0;  // nibble n: the four keys' verdicts in the lane's row
        KFA_NO_UNROLL
        for (int n = 0; n < NB; ++n)
          mine |= row.kept4(j0 + 8 * n + 4 * (thread_in_group(lane) >> 1)) << (4 * n);
        const std::uint32_t theirs = W::lane_xor_bits(mine, 1);
        kept = odd ? (theirs >> 2 & 0x33333333u) | (mine & 0xCCCCCCCCu)
                   : (mine & 0x33333333u) | (theirs & 0x33333333u) << 2;
      } else {  // groups off the blocks (a key origin not a multiple of four): a call a pair
        KFA_NO_UNROLL
        for (int n = 0; n < NB; ++n) {
          const int j = j0 + 8 * n + c_coord(lane, 0).col;  // and j + 1
          kept |= (row_g.kept_pair(j) | row_g8.kept_pair(j) << 2) << (4 * n);
        }
      }
      const float z = score.keep_scale();
      KFA_UNROLL
      for (int n = 0; n < NB; ++n) {
        KFA_UNROLL
        for (int e = 0; e < 4; ++e)
          s[r][n].x[e] = kept >> (4 * n + e) & 1u ? s[r][n].x[e] * z : 0.0f;
      }
    }
  }
}

/// After the last key tile: O = O~ / l of a warp's R blocks of 16 rows (row0 as softmax_tile)
/// to `out.o(i, c, value)` and their LSE to `out.lse(i, value)`, rows below q0 + nq only.
template <class W, int R, int DB, class Out>
KFA_MMA_FUNCTION void write_rows(FragC (&o)[R][DB], const RowState (&state)[R],
                                 const int (&row0)[R], int q0, int nq, Out& out) {
  const int lane = W::lane();
  KFA_UNROLL
  for (int r = 0; r < R; ++r) {
    const float sum[2] = {W::quad_sum(state[r].l[0]), W::quad_sum(state[r].l[1])};
    float lse[2];
    finish_rows(o[r], state[r], sum, lse);
    KFA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int i = row0[r] + 8 * h;
      if (i >= q0 + nq) continue;
      KFA_UNROLL
      for (int n = 0; n < DB; ++n) {
        KFA_UNROLL
        for (int e = 2 * h; e < 2 * h + 2; ++e)
          out.o(i, 8 * n + c_coord(lane, e).col, o[r][n].x[e]);
      }
      if (thread_in_group(lane) == 0) out.lse(i, lse[h]);
    }
  }
}

/// One team's forward on the warps' registers: query rows [q0, q0 + nq) (nq <= rows) against
/// keys [k_begin, k_end), head dim D (a multiple of 16, at most 128), 16-bit operands of type
/// Tag. Each warp owns R blocks of 16 rows (FlashAttention-2 gives a warp 32 rows of its
/// 128 x 128 tiles at head dim 64): a K or V fragment read by ldmatrix feeds R products, so R = 2
/// halves the shared-memory reads per product, at R times the accumulator registers (R = 2 at
/// D = 128 would need about 330 registers a lane, past the 255 there are).
template <class W, class Tag, int D, int R = 1>
struct WarpForward {
  static constexpr int warps = 4;              ///< warps per team
  static constexpr int rows = 16 * R * warps;  ///< Br: query rows per team
  static constexpr int keys = 64;              ///< Bc: keys per tile
  static constexpr int nb = keys / 8;          ///< S accumulator fragments per block
  static constexpr int db = D / 8;             ///< O~ accumulator fragments per block
  static constexpr int kd = D / 16;            ///< k steps of S = Q K^T
  static_assert(D % 16 == 0 && D <= 128, "head dims 16..128, multiples of 16");
  static_assert(rows <= 2 * keys, "Q_i is staged through the K and V buffers");

  /// Shared memory a team needs, in bytes: the K and V tiles.
  static constexpr int shared_bytes() { return 2 * keys * D * 2; }

  /// Stages rows [r0, r0 + n) of a 16-bit array into a swizzled tile of Rows rows
  /// (stage_tile).
  template <int Rows = keys, class Row>
  KFA_MMA_FUNCTION static void stage(std::uint16_t* tile, int r0, int n, const Row& row) {
    stage_tile<W, Rows, D>(tile, r0, n, row);
  }

  /// The team's forward. `q_row(i)`, `k_row(j)`, `v_row(j)`: the 16-bit rows; `score`:
  /// `score.tile_visible(q0, nq, j0, nc)` (can any of the rows see any of the keys),
  /// `score.tile_inside(q0, nq, j0, nc)` (does every row see every key) and `score.row(i)`,
  /// made per row and key tile, whose `(j, dot)` is the score of q_i . k_j (scale
  /// and softcap included, -inf where the mask hides it; called for keys below k_end only),
  /// whose `unmasked(j, dot)` is the same for a key the row sees and, where the constant
  /// `Score::dropped` is true, whose `kept_pair(j)` says whether dropout keeps keys j (bit 0)
  /// and j + 1 (bit 1) and, where `score.group_starts(j)` (a group of four keys of dropout's
  /// scheme starts at j), `kept4(j)` keys j .. j + 3 (keys past the tile may be asked, their P
  /// is 0), a kept P being multiplied by `score.keep_scale()` after the row sums took it;
  /// `out.o(i, c, value)` and
  /// `out.lse(i, value)` (natural units) receive the results, rows below q0 + nq only. `smem` holds
  /// shared_bytes(); run ends without a barrier, so a caller that reuses smem puts one first.
  template <class QRow, class KRow, class VRow, class Score, class Out>
  KFA_MMA_FUNCTION static void run(std::uint16_t* smem, int q0, int nq, int k_begin, int k_end,
                                   const QRow& q_row, const KRow& k_row, const VRow& v_row,
                                   const Score& score, Out& out) {
    std::uint16_t* ks = smem;
    std::uint16_t* vs = smem + static_cast<std::ptrdiff_t>(keys) * D;
    const int lane = W::lane(), warp = W::warp();

    const KeyTiles<keys, Score> tiles{score, q0, nq, k_end};
    // Q_i into registers through shared memory: with 64 rows through the V buffer, K of the
    // first tile loading beside it; with 128 through both buffers (contiguous, and the swizzle
    // depends on the row alone), K after the fragments are read.
    int j0 = tiles.next(k_begin);
    if constexpr (rows <= keys) {
      stage(vs, q0, nq, q_row);
      if (j0 < k_end) stage(ks, j0, tiles.size(j0), k_row);
    } else {
      stage<rows>(ks, q0, nq, q_row);
    }
    W::cp_async_commit();
    W::cp_async_wait_all();
    W::barrier();
    const std::uint16_t* qs = rows <= keys ? vs : ks;
    FragA<Tag> q[R][kd];
    KFA_UNROLL
    for (int r = 0; r < R; ++r) {
      KFA_UNROLL
      for (int kk = 0; kk < kd; ++kk) {
        const Coord a = a_source(lane);
        W::ldmatrix_x4(q[r][kk].x, qs + swizzled(16 * (R * warp + r) + a.row, 16 * kk + a.col, D));
      }
    }
    if constexpr (rows > keys) {
      W::barrier();  // every warp has its Q fragments: K may overwrite them
      if (j0 < k_end) {
        stage(ks, j0, tiles.size(j0), k_row);
        W::cp_async_commit();
      }
    }

    RowState state[R];
    FragC o[R][db];
    int row0[R];  // this lane's rows of block r: row0[r] and row0[r] + 8
    KFA_UNROLL
    for (int r = 0; r < R; ++r) {
      state[r] = initial_rows();
      KFA_UNROLL
      for (int i = 0; i < db; ++i)
        o[r][i] = zero_c();
      row0[r] = q0 + 16 * (R * warp + r) + group_id(lane);
    }

    while (j0 < k_end) {
      const int nc = tiles.size(j0);
      W::cp_async_wait_all();  // K_j (the only copies in flight)
      W::barrier();  // K_j seen by all; every warp is past P V_{j-1} (or Q's fragments): V free
      stage(vs, j0, nc, v_row);
      W::cp_async_commit();

      // S = Q_i K_j^T: ldmatrix.x4 of K gives the B fragments of 16 keys, for every block.
      FragC s[R][nb];
      KFA_UNROLL
      for (int r = 0; r < R; ++r) {
        KFA_UNROLL
        for (int i = 0; i < nb; ++i)
          s[r][i] = zero_c();
      }
      KFA_UNROLL
      for (int kk = 0; kk < kd; ++kk) {
        KFA_UNROLL
        for (int n0 = 0; n0 < keys; n0 += 16) {
          std::uint32_t b[4];
          const Coord src = b_source(lane);
          W::ldmatrix_x4(b, ks + swizzled(n0 + src.row, 16 * kk + src.col, D));
          KFA_UNROLL
          for (int r = 0; r < R; ++r) {
            W::mma(s[r][n0 / 8], q[r][kk], FragB<Tag>{{b[0], b[1]}});
            W::mma(s[r][n0 / 8 + 1], q[r][kk], FragB<Tag>{{b[2], b[3]}});
          }
        }
      }
      const bool inside = nc == keys && score.tile_inside(q0, nq, j0, nc);  // team-wide
      softmax_tile<W>(s, o, state, row0, inside, j0, nc, score);

      W::cp_async_wait_all();  // V_j
      W::barrier();            // V_j seen by all; every warp is past S = Q K_j^T: K is free
      const int j1 = tiles.next(j0 + keys);
      if (j1 < k_end) {
        stage(ks, j1, tiles.size(j1), k_row);
        W::cp_async_commit();
      }

      // O~ += P V_j: P from the accumulators, 16 keys per step; ldmatrix.x4.trans of V.
      KFA_UNROLL
      for (int kk = 0; kk < keys / 16; ++kk) {
        FragA<Tag> p[R];  // S columns 16 kk .. 16 kk + 15: two accumulators
        KFA_UNROLL
        for (int r = 0; r < R; ++r)
          p[r] = a_from_c_finite(Tag{}, s[r][2 * kk], s[r][2 * kk + 1]);
        KFA_UNROLL
        for (int n0 = 0; n0 < D; n0 += 16) {
          std::uint32_t b[4];
          const Coord src = bt_source(lane);
          W::ldmatrix_x4_trans(b, vs + swizzled(16 * kk + src.row, n0 + src.col, D));
          KFA_UNROLL
          for (int r = 0; r < R; ++r) {
            W::mma(o[r][n0 / 8], p[r], FragB<Tag>{{b[0], b[1]}});
            W::mma(o[r][n0 / 8 + 1], p[r], FragB<Tag>{{b[2], b[3]}});
          }
        }
      }
      j0 = j1;
    }

    write_rows<W>(o, state, row0, q0, nq, out);
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
/// Device pass for sm_90 or newer by a compiler with PTX ISA 8.1 (CUDA 12.1): CudaWarp::sm90.
#define KFA_CUDA_SM90_FORMS
#endif

#if defined(__CUDACC__)
/// The warp policy on the device: a Kokkos CUDA team with vector length 32 is the block
/// dim3(32, team_size), so the lane is threadIdx.x and the warp threadIdx.y; the team
/// barrier is __syncthreads().
template <class Tag>
struct CudaWarp {
  /// This thread's lane in its warp.
  __device__ static int lane() { return static_cast<int>(threadIdx.x); }
  /// This thread's warp in its team.
  __device__ static int warp() { return static_cast<int>(threadIdx.y); }
  /// Every lane of the team waits for every other.
  __device__ static void barrier() { __syncthreads(); }
  /// ldmatrix.x4 (cuda/ldmatrix.hpp).
  __device__ static void ldmatrix_x4(std::uint32_t (&r)[4], const std::uint16_t* row) {
    cuda::ldmatrix_x4(r, row);
  }
  /// ldmatrix.x4.trans (cuda/ldmatrix.hpp).
  __device__ static void ldmatrix_x4_trans(std::uint32_t (&r)[4], const std::uint16_t* row) {
    cuda::ldmatrix_x4_trans(r, row);
  }
  /// A 16-byte asynchronous copy, or 16 zero bytes when !valid.
  __device__ static void cp_async_16(std::uint16_t* dst, const std::uint16_t* src, bool valid) {
    cuda::cp_async_16(dst, src, valid);
  }
  /// Closes the group of this lane's copies issued since the last commit.
  __device__ static void cp_async_commit() { cuda::cp_async_commit(); }
  /// Waits for all of this lane's committed copies.
  __device__ static void cp_async_wait_all() { cp_async_wait<0>(); }
  /// d += a b on the tensor cores.
  __device__ static void mma(FragC& d, const FragA<Tag>& a, const FragB<Tag>& b) {
    cuda::mma(d, a, b);
  }
  /// The quad's maximum.
  __device__ static float quad_max(float v) { return cuda::quad_max(v); }
  /// The quad's sum.
  __device__ static float quad_sum(float v) { return cuda::quad_sum(v); }
  /// v of the lane whose id differs from this lane's in bit 0.
  __device__ static float lane_pair(float v) { return __shfl_xor_sync(0xffffffffu, v, 1); }
  /// v of the lane whose id is this lane's xor m (a word of bits).
  __device__ static std::uint32_t lane_xor_bits(std::uint32_t v, int m) {
    return __shfl_xor_sync(0xffffffffu, v, m);
  }
  /// *p += x in global memory, atomically.
  __device__ static void add(float* p, float x) { atomicAdd(p, x); }
#if defined(KFA_CUDA_SM90_FORMS)
  /// Whether the code runs on sm_90 or newer, compiled by CUDA 12.1 or newer (the device pass
  /// decides; the host pass, which never runs it, says false): add4 is one instruction there
  /// (vector red needs PTX ISA 8.1), and the kernels' choices that were measured on an H100
  /// but spill at sm_80 key on it.
  static constexpr bool sm90 = true;
#else
  static constexpr bool sm90 = false;
#endif
  /// p[0..3] += x[0..3] in global memory, atomically per element; p on 16 bytes. One
  /// red.global.add.v4.f32 where sm90, four atomicAdd elsewhere.
  __device__ static void add4(float* p, const float (&x)[4]) {
#if defined(KFA_CUDA_SM90_FORMS)
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)),
                 "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3])
                 : "memory");
#else
    for (int e = 0; e < 4; ++e)
      atomicAdd(p + e, x[e]);
#endif
  }
};
#endif  // __CUDACC__

}  // namespace kfa::backends::cuda
