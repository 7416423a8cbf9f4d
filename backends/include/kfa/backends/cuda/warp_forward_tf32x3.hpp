#pragma once
/// \file cuda/warp_forward_tf32x3.hpp
/// The register-resident forward (cuda/warp_forward.hpp) for float inputs, its products on the
/// tf32 tensor cores by 3xTF32: each float operand is split into hi + lo, both tf32
/// (split_tf32), and a b is taken as a_lo b_hi + a_hi b_lo + a_hi b_hi, three
/// mma.sync.m16n8k8.tf32, small terms first. The dropped a_lo b_lo and the rounding of lo leave
/// about 2^-21 of |a b| per product where float's own rounding is 2^-24. The tensor cores round
/// their sums toward zero (measured on an A100: Fasi, Higham, Mikaitis, Pranesh, PeerJ Comput.
/// Sci. 2021), up to an ulp of the accumulator per instruction, a bias that grows with the
/// instructions accumulated in place; so the products of a P V step (and of four k steps of
/// S) start from zero and their sum is added to O~ (S) on the FMA units, rounded to nearest
/// (add_partial). tests/test_mma.cpp holds the kernel to float's tolerance rule against the
/// naive float attention on a simulator whose tf32 sums round toward zero; float on the FMA
/// units (the tile path) reached 4-6 % of an H100's FP32 peak (perf/results).
///
/// The same team of 4 warps, 16 query rows a warp (64 a team), the same online softmax, masks,
/// dropout and outputs as the 16-bit kernel (softmax_tile, write_rows), with these differences:
/// - K_j and V_j are float in shared memory (swizzled by 16-byte chunks of 4 floats, staged by
///   cp.async as the 16-bit tiles are): 64 keys a tile at D = 64 and 32 at D = 128, 32 KiB for
///   both tiles at either dim.
/// - K's B fragments (and Q's A fragments at D = 64) come from ldmatrix.x4 (no .trans): it
///   moves 16-bit pairs, and a float is one pair, so an 8 x 8 b16 matrix is 8 rows x 4 floats
///   and lane l receives float (l / 4, l % 4): the tf32 A layout (a0..a3 = rows g, g + 8 x
///   columns t, t + 4) and B = K^T's (b0, b1 = head dims t, t + 4 of key g), from row-major
///   tiles.
/// - P goes from the accumulators into P V without a shuffle by renaming its columns: the C
///   layout holds keys 2t and 2t + 1 of rows g and g + 8 (c0..c3), and the tf32 A layout wants
///   columns t and t + 4 (a0..a3). Taking a0 = c0, a1 = c2, a2 = c1, a3 = c3 makes A's column t
///   key 2t and column t + 4 key 2t + 1; V's B fragment follows (b0 = V[2t][g], b1 =
///   V[2t + 1][g]), read by 32-bit shared loads (ldmatrix.trans would split the floats), which
///   the swizzle keeps conflict-free (tests/test_mma.cpp checks the banks).
/// - Q stays in registers as hi and lo at D = 64. At D = 128, where O~ alone takes 64
///   registers a lane, Q is read from global memory (L1) and split at each use: held as floats
///   or split it made the kernel spill (perf/results/2026-11-27-cuda-report-tf32x3.md).
/// - Loops the 16-bit kernel unrolls are rolled here (S's groups of 16 keys at D = 64, P V's
///   steps of 8 keys, Q's k steps by fours at D = 128, where a group is the whole 32-key tile),
///   with a group's accumulators moved by selects: unrolled, the compiler issued the loads of
///   every step ahead and spilled 60-420 bytes.

#include <kfa/backends/cuda/ldmatrix.hpp>
#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/cuda/warp_forward.hpp>
#include <kfa/backends/cuda/warp_softmax.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kfa::backends::cuda {

/// An A fragment split for 3xTF32: the high and low tf32 parts of each element.
struct SplitA {
  FragA<tf32_tag> hi;  ///< the elements rounded to tf32
  FragA<tf32_tag> lo;  ///< the rests, element - hi, rounded to tf32
};

/// The A fragment of four float elements a0..a3 split into tf32 hi and lo.
KFA_MMA_FUNCTION SplitA split_a(const float (&x)[4]) {
  SplitA f;
  KFA_UNROLL
  for (int i = 0; i < 4; ++i)
    split_tf32(x[i], f.hi.x[i], f.lo.x[i]);
  return f;
}

/// split_a of four floats given by their bits (as ldmatrix returns them).
KFA_MMA_FUNCTION SplitA split_a(const std::uint32_t (&bits)[4]) {
  float x[4];
  std::memcpy(x, bits, sizeof x);
  return split_a(x);
}

/// d += a b by 3xTF32 (three tf32 products, small terms first), b given as float elements
/// b0, b1 (split here).
template <class W>
KFA_MMA_FUNCTION void mma_tf32x3(FragC& d, const SplitA& a, float b0, float b1) {
  FragB<tf32_tag> hi, lo;
  split_tf32(b0, hi.x[0], lo.x[0]);
  split_tf32(b1, hi.x[1], lo.x[1]);
  W::mma(d, a.lo, hi);
  W::mma(d, a.hi, lo);
  W::mma(d, a.hi, hi);
}

/// d += t on the FMA units (round to nearest), t a partial sum of the tensor cores (begun at
/// zero: its rounding toward zero is an ulp of t, not of d).
KFA_MMA_FUNCTION void add_partial(FragC& d, const FragC& t) {
  KFA_UNROLL
  for (int e = 0; e < 4; ++e)
    d.x[e] += t.x[e];
}

/// One team's float forward on the warps' registers by 3xTF32: query rows [q0, q0 + nq)
/// (nq <= rows) against keys [k_begin, k_end) at head dim D (64 or 128). Rows, score and out
/// as WarpForward::run, with the rows float (their pointers as 16-bit units, 16-byte aligned).
template <class W, int D>
struct WarpForwardTf32x3 {
  static constexpr int warps = 4;                ///< warps per team
  static constexpr int rows = 16 * warps;        ///< Br: query rows per team, 16 a warp
  static constexpr int keys = D > 64 ? 32 : 64;  ///< Bc: keys per tile (32 KiB of K and V)
  static constexpr int nb = keys / 8;            ///< S accumulator fragments
  static constexpr int db = D / 8;               ///< O~ accumulator fragments
  static constexpr int kd = D / 8;               ///< k steps of S = Q K^T
  static constexpr int units = 2 * D;            ///< 16-bit units per float row
  static constexpr bool q_split = D <= 64;       ///< Q kept as hi and lo (else split per use)
  static constexpr int partial = 4;              ///< k steps per partial sum of S (see add_partial)
  static constexpr int group = q_split ? 16 : keys;  ///< keys per group of S's product
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static_assert(!q_split || rows <= keys, "Q_i is staged through the V buffer");

  /// Shared memory a team needs, in bytes: the K and V tiles.
  static constexpr int shared_bytes() { return 2 * keys * D * 4; }

  /// Offset in 16-bit units of float (row, col) in a swizzled float tile of D columns.
  KFA_MMA_FUNCTION static int at(int row, int col) { return swizzled(row, 2 * col, units); }

  /// Lane's row address (row, float column) for the A fragment of a 16 x 8 block of a float
  /// tile by ldmatrix.x4: lanes 8m..8m+7 give the rows of 8 x 4-float matrix m, ordered rows
  /// 0-7 and 8-15 at columns 0-3, then at 4-7 (a0..a3).
  KFA_MMA_FUNCTION static constexpr Coord a_source(int lane) {
    return {(lane & 7) + 8 * ((lane >> 3) & 1), 4 * (lane >> 4)};
  }
  /// Lane's row address (key, float column) for the B fragments of K^T (16 keys x 8 head dims:
  /// two n8 blocks) from a row-major float K tile by ldmatrix.x4: matrices (keys 0-7, dims 0-3),
  /// (keys 0-7, dims 4-7), (keys 8-15, dims 0-3), (keys 8-15, dims 4-7), so that registers 0, 1
  /// are b0, b1 of keys 0-7 and 2, 3 of keys 8-15.
  KFA_MMA_FUNCTION static constexpr Coord b_source(int lane) {
    return {(lane & 7) + 8 * (lane >> 4), 4 * ((lane >> 3) & 1)};
  }
  /// (key, head dim) in an 8-key, 8-dim block of V of lane's element i (0, 1) of P V's B
  /// fragment, with P's columns renamed (the file's description): keys 2t + i, dim g.
  KFA_MMA_FUNCTION static constexpr Coord v_source(int lane, int i) {
    return {2 * thread_in_group(lane) + i, group_id(lane)};
  }

  /// The float at a 16-bit offset (even) of a float tile: one 32-bit shared load on the device
  /// (a memcpy from a 16-bit pointer became four byte loads there), a memcpy on the host.
  KFA_MMA_FUNCTION static float load(const std::uint16_t* tile, int offset) {
#if defined(__CUDA_ARCH__)
    return reinterpret_cast<const float*>(tile)[offset >> 1];
#else
    float v;
    std::memcpy(&v, tile + offset, sizeof v);
    return v;
#endif
  }

  /// The team's forward; arguments as WarpForward::run.
  template <class QRow, class KRow, class VRow, class Score, class Out>
  KFA_MMA_FUNCTION static void run(std::uint16_t* smem, int q0, int nq, int k_begin, int k_end,
                                   const QRow& q_row, const KRow& k_row, const VRow& v_row,
                                   const Score& score, Out& out) {
    std::uint16_t* ks = smem;
    std::uint16_t* vs = smem + static_cast<std::ptrdiff_t>(keys) * units;
    const int lane = W::lane(), warp = W::warp();
    const int g = group_id(lane);

    const KeyTiles<keys, Score> tiles{score, q0, nq, k_end};
    // D = 64: Q_i into registers (split) through the V buffer, K of the first tile beside it.
    // D = 128: Q is read where it lies at each use (a lane's two rows; a row past nq reads the
    // last row, whose results are not written): 64 more registers did not fit beside O~.
    int j0 = tiles.next(k_begin);
    if constexpr (q_split) stage_tile<W, keys, units>(vs, q0, nq, q_row);
    if (j0 < k_end) stage_tile<W, keys, units>(ks, j0, tiles.size(j0), k_row);
    W::cp_async_commit();
    SplitA qh[q_split ? kd : 1];
    if constexpr (q_split) {
      W::cp_async_wait_all();
      W::barrier();
      const Coord a = a_source(lane);
      KFA_UNROLL
      for (int kk = 0; kk < kd; ++kk) {
        std::uint32_t x[4];
        W::ldmatrix_x4(x, vs + at(16 * warp + a.row, 8 * kk + a.col));
        qh[kk] = split_a(x);
      }
    }
    const int last = q0 + nq - 1, r = q0 + 16 * warp + g;
    const std::uint16_t* const q_rows[2] = {q_row(r < last ? r : last),
                                            q_row(r + 8 < last ? r + 8 : last)};
    // Q's A fragment of k step kk (columns 8 kk .. 8 kk + 7): held, or read and split.
    const auto q_fragment = [&](int kk) {
      if constexpr (q_split) {
        return qh[kk];
      } else {
        const int c = 8 * kk + thread_in_group(lane);
        const float x[4] = {load(q_rows[0], 2 * c), load(q_rows[1], 2 * c),
                            load(q_rows[0], 2 * c + 8), load(q_rows[1], 2 * c + 8)};
        return split_a(x);
      }
    };

    RowState state[1] = {initial_rows()};
    FragC o[1][db];
    KFA_UNROLL
    for (int i = 0; i < db; ++i)
      o[0][i] = zero_c();
    const int row0[1] = {q0 + 16 * warp + g};
    // The lane's tile offsets, with the swizzle's runtime part taken once: the XOR touches only
    // the low three bits of a row's chunk index, so 4 column blocks apart (32 floats, 64 units)
    // the offsets differ by a constant. K at (n0 + b.row, 8 kk + b.col) is k_at[kk % 4] +
    // n0 units + 64 (kk / 4); V at (8 kk + 2t + i, 8 n + g) is v_at[i][n % 4] + 8 kk units +
    // 64 (n / 4).
    const Coord b = b_source(lane);
    int k_at[4], v_at[2][4];
    KFA_UNROLL
    for (int r = 0; r < 4; ++r) {
      k_at[r] = at(b.row, 8 * r + b.col);
      KFA_UNROLL
      for (int i = 0; i < 2; ++i)
        v_at[i][r] = at(v_source(lane, i).row, 8 * r + v_source(lane, i).col);
    }

    while (j0 < k_end) {
      const int nc = tiles.size(j0);
      W::cp_async_wait_all();  // K_j (the only copies in flight)
      W::barrier();  // K_j seen by all; every warp is past P V_{j-1} (or Q's fragments): V free
      stage_tile<W, keys, units>(vs, j0, nc, v_row);
      W::cp_async_commit();

      // S = Q K_j^T by groups of `group` keys in a rolled loop, a group's accumulators moved
      // into s by selects; with Q read at each use, its k steps by fours (the file's
      // description says why) and a group the whole tile (each Q fragment read and split once
      // a tile).
      FragC s[1][nb];
      KFA_NO_UNROLL
      for (int n0 = 0; n0 < keys; n0 += group) {
        FragC acc[group / 8];
        KFA_UNROLL
        for (int a = 0; a < group / 8; ++a)
          acc[a] = zero_c();
        constexpr int ksteps = q_split ? kd : 4;
        KFA_NO_UNROLL
        for (int k0 = 0; k0 < kd; k0 += ksteps) {
          KFA_UNROLL
          for (int i = 0; i < ksteps; i += partial) {  // k steps a partial sum
            FragC t[group / 8];
            KFA_UNROLL
            for (int a = 0; a < group / 8; ++a)
              t[a] = zero_c();
            KFA_UNROLL
            for (int h = 0; h < partial; ++h) {
              const int kk = k0 + i + h;
              const SplitA qa = q_fragment(kk);
              KFA_UNROLL
              for (int m = 0; m < group / 16; ++m) {  // 16 keys a K load
                std::uint32_t kb[4];
                W::ldmatrix_x4(kb, ks + (k_at[kk % 4] + (n0 + 16 * m) * units + 64 * (kk / 4)));
                float f[4];
                std::memcpy(f, kb, sizeof f);
                mma_tf32x3<W>(t[2 * m], qa, f[0], f[1]);
                mma_tf32x3<W>(t[2 * m + 1], qa, f[2], f[3]);
              }
            }
            KFA_UNROLL
            for (int a = 0; a < group / 8; ++a)
              add_partial(acc[a], t[a]);
          }
        }
        KFA_UNROLL
        for (int i = 0; i < nb; i += group / 8)
          if (n0 == 8 * i) {
            KFA_UNROLL
            for (int a = 0; a < group / 8; ++a)
              s[0][i + a] = acc[a];
          }
      }
      const bool inside = nc == keys && score.tile_inside(q0, nq, j0, nc);  // team-wide
      softmax_tile<W>(s, o, state, row0, inside, j0, nc, score);

      W::cp_async_wait_all();  // V_j
      W::barrier();            // V_j seen by all; every warp is past S = Q K_j^T: K is free
      const int j1 = tiles.next(j0 + keys);
      if (j1 < k_end) {
        stage_tile<W, keys, units>(ks, j1, tiles.size(j1), k_row);
        W::cp_async_commit();
      }

      // O~ += P V_j, 8 keys a step (rolled; the step's P picked by selects): A = P with its
      // columns renamed (the file's description), B = V rows 2t, 2t + 1 at head dim g of each
      // n8 block.
      KFA_NO_UNROLL
      for (int kk = 0; kk < nb; ++kk) {
        FragC c = s[0][0];
        KFA_UNROLL
        for (int i = 1; i < nb; ++i)
          if (kk == i) c = s[0][i];
        const float renamed[4] = {c.x[0], c.x[2], c.x[1], c.x[3]};
        const SplitA p = split_a(renamed);
        KFA_UNROLL
        for (int n = 0; n < db; ++n) {
          FragC t = zero_c();
          const int v = 8 * kk * units + 64 * (n / 4);
          mma_tf32x3<W>(t, p, load(vs, v_at[0][n % 4] + v), load(vs, v_at[1][n % 4] + v));
          add_partial(o[0][n], t);
        }
      }
      j0 = j1;
    }

    write_rows<W>(o, state, row0, q0, nq, out);
  }
};

}  // namespace kfa::backends::cuda
