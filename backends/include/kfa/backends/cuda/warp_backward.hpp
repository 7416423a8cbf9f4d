#pragma once
/// \file cuda/warp_backward.hpp
/// FlashAttention-2's backward (its Algorithm 2, dQ by atomic adds) for one team of 4 warps,
/// the work in registers: the team owns 64 keys K_j, V_j; each warp owns 16 of them and keeps
/// their dK_j and dV_j accumulators in registers for the team's whole life, V_j's (and at head
/// dim 64 K_j's) A fragments too. For every query tile i of QR rows that sees the keys (every
/// head of the kv head's group), a warp forms the transposed tiles
///   S^T = K_w Q_i^T, dP^T = V_w dO_i^T          (16 keys x QR queries, in registers)
///   P^T = exp2(S^T scale log2 e - LSE log2 e),  dS^T = P^T (dP^T - delta)
///   dV_w += P^T dO_i,  dK_w += dS^T Q_i         (P^T, dS^T register to register, a_from_c)
/// then writes dS^T to a 16-bit shared tile from which the team forms dQ_i = dS K_j (each warp
/// a part of it) and adds it into the float dq by atomics. The softmax parts are
/// cuda/warp_softmax.hpp's (probabilities, score_gradients); LSE and delta are the forward's
/// and the backward's preprocessing's.
///
/// Shared memory (16-bit, swizzled, cuda/ldmatrix.hpp): K_j (64 x D) for the whole team's life;
/// Q_i and dO_i (QR x D each), through which V_j is staged at the start (2 QR keys at a time);
/// dS^T (64 x QR); and the tile's LSE (base 2) and delta (QR floats each): 32.5 KiB at D = 64,
/// QR = 64, within the about 40 KiB a Kokkos team gets on CUDA without the opt-in
/// (cuda/traits.hpp), which is why K_j stays in shared memory and V_j in registers, and why
/// Q_i and dO_i have one buffer each: the next tile's copies overlap the dQ products only. The
/// device runs QR = 16 at D = 128 (26.1 KiB; TileOps::warp_backward_rows): with QR = 32 the
/// accumulators, S^T and dP^T did not fit 255 registers (56-60 bytes spilled at sm_80).
///
/// As cuda/warp_forward.hpp the code is written against a warp policy W (CudaWarp on the device,
/// tests/test_mma.cpp's simulator on the host). Only softmax attention with an interval mask and
/// optionally dropout (no softcap or additive term) comes here; core sends the rest to the tile
/// kernels.

#include <kfa/backends/cuda/ldmatrix.hpp>
#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/cuda/warp_forward.hpp>
#include <kfa/backends/cuda/warp_softmax.hpp>

#include <cstddef>
#include <cstdint>

namespace kfa::backends::cuda {

/// One team's backward on the warps' registers: keys [k0, k0 + nc) (nc <= 64) of one kv head
/// against the query tiles of QR rows of `heads` query heads, head dim D (64 or 128), 16-bit
/// operands of type Tag.
template <class W, class Tag, int D, int QR>
struct WarpBackward {
  static constexpr int warps = 4;          ///< warps per team
  static constexpr int keys = 16 * warps;  ///< Bc: keys per team
  static constexpr int rows = QR;          ///< Br: query rows per tile step
  static constexpr int qb = QR / 8;        ///< S^T accumulator fragments (n-blocks of queries)
  static constexpr int db = D / 8;         ///< dK, dV accumulator fragments
  static constexpr int kd = D / 16;        ///< k steps of S^T = K Q^T
  /// K's A fragments in registers as well as in shared memory (where dQ reads them) when they
  /// fit: at D = 128 the 32 registers a lane they take are what the accumulators need.
  static constexpr bool k_in_registers = D <= 64;
  /// dQ_i (QR x D) is split over the warps: QR / 16 blocks of 16 rows,
  static constexpr int row_blocks = QR / 16;
  /// each in this many ranges of columns,
  static constexpr int parts = warps / row_blocks;
  /// of this many columns.
  static constexpr int part_cols = D / parts;
  static_assert(D % 16 == 0 && D <= 128, "head dims 16..128, multiples of 16");
  static_assert(QR == 16 || QR == 32 || QR == 64, "query tiles of 16, 32 or 64 rows");
  /// Keys of V_j staged at a time through the Q_i and dO_i buffers (2 QR rows).
  static constexpr int v_rows = 2 * QR < keys ? 2 * QR : keys;
  static_assert(part_cols % 16 == 0, "a warp's dQ columns are pairs of n8 blocks");

  using Stager = WarpForward<W, Tag, D>;  ///< the 16-byte copies of rows into swizzled tiles

  /// dQ added four columns of a row a lane (W::add4, one red.global.add.v4.f32 on sm_90): 1.11-
  /// 1.19x on an H100 from N = 4096 on (1.03-1.12x at 1024). Before sm_90 add4 is four
  /// atomics, and gathering the columns costs shuffles and registers for nothing (at sm_80 the
  /// kernel spilled with it): there each lane adds its own elements (W::add).
  static constexpr bool dq_by_fours = W::sm90;
  /// LSE and delta loaded into registers with the tile's copies and stored to shared memory at
  /// the next step's top, their latency hidden behind the dQ products (on an H100, with P by
  /// fast_exp2: 1.02-1.16x); at sm_80 the two registers held across the loop made the kernel
  /// spill (12 bytes at D = 64), so there they are stored as they arrive.
  static constexpr bool stats_held = W::sm90;
  /// P by fast_exp2 (one ex2.approx.ftz) on sm_90 and newer; by exp2f before, where the
  /// instructions fast_exp2 saves would cost a spill (12 bytes at D = 64 on sm_80).
  static constexpr bool fast_p = W::sm90;
  /// Dropout's draws shared by the four lanes that hold a Philox call's keys (see run), where
  /// the registers allow: at sm_80 and D = 128 the exchange made the kernel spill (4 bytes,
  /// bf16), so there each lane draws its own elements.
  static constexpr bool shared_draws = W::sm90 || D <= 64;

  /// Offsets (16-bit elements) in shared memory: K_j,
  static constexpr int k_at = 0;
  /// Q_i,
  static constexpr int q_at = keys * D;
  /// dO_i,
  static constexpr int do_at = q_at + QR * D;
  /// dS^T,
  static constexpr int dst_at = do_at + QR * D;
  /// then the floats: the tile's LSE (base 2) and delta.
  static constexpr int stats_at = dst_at + keys * QR;
  /// Shared memory a team needs, in bytes.
  static constexpr int shared_bytes() { return 2 * stats_at + 2 * QR * 4; }

  /// The team's backward. `k_row(j)`, `v_row(j)`: key j's 16-bit rows (16-byte aligned);
  /// `q_row(h, i)`, `do_row(h, i)`: query i's of head h (h in [0, heads)); `stats.lse(h, i)`
  /// (natural units, -inf for a row that saw no key) and `stats.delta(h, i)` (rowsum(dO O));
  /// `mask.tile_visible(q0, n, k0, nc)`, `mask.tile_inside(q0, n, k0, nc)` (every row sees every
  /// key) and `mask.visible(i, j)`, the same for every head; where the constant `Mask::dropped`
  /// is true, `mask.kept(h, i, j)`, whether dropout keeps query i of head h against key j,
  /// `mask.group_starts(j)`, whether one of dropout's groups of four keys starts at key j, and
  /// then `mask.kept4(h, i, j)`, the verdicts on keys j .. j + 3 (bits 0 .. 3; queries past
  /// seqlen_q and keys past the tile may be asked), and `mask.keep_scale()`, the
  /// weight of a kept element: the weights Z weigh P in dV and dP in dS (delta holds
  /// rowsum(dO O) of the dropped O); `grads.dq_row(h, i)`: query i's
  /// float dQ row, 16-byte aligned, which the team adds to by W::add4 or W::add (atomically:
  /// other teams add to the same rows), `grads.dk(j, c, x)` and
  /// `grads.dv(j, c, x)` receive the team's sums over its heads, keys below k0 + nc only.
  /// Scores are scale q.k. `smem` holds shared_bytes(); run ends without a barrier.
  template <class KRow, class VRow, class QRow, class DoRow, class Stats, class Mask, class Grads>
  KFA_MMA_FUNCTION static void run(std::uint16_t* smem, int k0, int nc, int heads, int seqlen_q,
                                   float scale, const KRow& k_row, const VRow& v_row,
                                   const QRow& q_row, const DoRow& do_row, const Stats& stats,
                                   const Mask& mask, Grads& grads) {
    std::uint16_t* ks = smem + k_at;
    std::uint16_t* qs = smem + q_at;
    std::uint16_t* dos = smem + do_at;
    std::uint16_t* dst = smem + dst_at;
    float* lse_s = reinterpret_cast<float*>(smem + stats_at);
    float* delta_s = lse_s + QR;
    const int lane = W::lane(), warp = W::warp(), t = warp * 32 + lane;
    const int q_tiles = (seqlen_q + QR - 1) / QR;
    const float scale2 = scale * log2e;

    // The query tiles as steps s = h q_tiles + tile; the next one the keys can be seen from.
    const auto tile_rows = [&](int q0) { return seqlen_q - q0 < QR ? seqlen_q - q0 : QR; };
    const auto next_step = [&](int s) {
      for (; s < heads * q_tiles; ++s) {
        const int q0 = s % q_tiles * QR;
        if (mask.tile_visible(q0, tile_rows(q0), k0, nc)) break;
      }
      return s;
    };
    // Q_i, dO_i by copies (committed by the caller) and LSE, delta by loads (thread t < QR:
    // row t's LSE in base 2, -inf past the rows so that P = 0 there; 64 <= t < 64 + QR: row
    // t - 64's delta), stored in shared memory at once or, stats_held, by put_stats at the top
    // of the step.
    const int stat_row = t < 64 ? t : t - 64;
    const bool stat_thread = stat_row < QR;
    bool stat_valid = false;
    float stat = 0.0f;
    const auto put_stats = [&] {
      if (stat_thread && t < 64) lse_s[stat_row] = stat_valid ? stat * log2e : -INFINITY;
      if (stat_thread && t >= 64) delta_s[stat_row] = stat_valid ? stat : 0.0f;
    };
    const auto stage_step = [&](int s) {
      const int h = s / q_tiles, q0 = s % q_tiles * QR, nq = tile_rows(q0);
      Stager::template stage<QR>(qs, q0, nq, [&](int i) { return q_row(h, i); });
      Stager::template stage<QR>(dos, q0, nq, [&](int i) { return do_row(h, i); });
      if constexpr (stats_held) {
        stat_valid = stat_thread && stat_row < nq;
        if (stat_valid) stat = t < 64 ? stats.lse(h, q0 + stat_row) : stats.delta(h, q0 + stat_row);
      } else if (t < QR) {
        lse_s[t] = t < nq ? stats.lse(h, q0 + t) * log2e : -INFINITY;
      } else if (t >= 64 && t - 64 < QR) {
        delta_s[t - 64] = t - 64 < nq ? stats.delta(h, q0 + t - 64) : 0.0f;
      }
    };

    // K_j, and V_j through the Q and dO buffers, v_rows keys at a time; this warp's A
    // fragments of them.
    Stager::template stage<keys>(ks, k0, nc, k_row);
    FragA<Tag> vf[kd];
    FragA<Tag> kf[k_in_registers ? kd : 1];
    KFA_UNROLL
    for (int r0 = 0; r0 < keys; r0 += v_rows) {
      const int n = nc - r0 > 0 ? nc - r0 : 0;  // none: zeros, from a row that exists
      Stager::template stage<v_rows>(qs, n > 0 ? k0 + r0 : k0, n, v_row);
      W::cp_async_commit();
      W::cp_async_wait_all();
      W::barrier();
      const Coord a = a_source(lane);
      if (16 * warp >= r0 && 16 * warp < r0 + v_rows) {
        KFA_UNROLL
        for (int kk = 0; kk < kd; ++kk)
          W::ldmatrix_x4(vf[kk].x, qs + swizzled(16 * warp - r0 + a.row, 16 * kk + a.col, D));
      }
      if constexpr (k_in_registers) {
        if (r0 == 0) {
          KFA_UNROLL
          for (int kk = 0; kk < kd; ++kk)
            W::ldmatrix_x4(kf[kk].x, ks + swizzled(16 * warp + a.row, 16 * kk + a.col, D));
        }
      }
      W::barrier();  // the V fragments read: the buffers may be refilled
    }

    FragC dk[db], dv[db];
    KFA_UNROLL
    for (int n = 0; n < db; ++n)
      dk[n] = dv[n] = zero_c();

    int s = next_step(0);
    if (s < heads * q_tiles) {
      stage_step(s);
      W::cp_async_commit();
    }
    while (s < heads * q_tiles) {
      const int h = s / q_tiles, q0 = s % q_tiles * QR, nq = tile_rows(q0);
      if constexpr (stats_held) put_stats();
      W::cp_async_wait_all();  // Q_i, dO_i
      W::barrier();            // ... seen by all, with LSE and delta; dS^T of the last step read

      // Dropout's verdicts on this lane's elements, bit 4 n + e for st[n].x[e], drawn before
      // the products, where their accumulators are not yet live (drawn after them, Philox's
      // registers made the 255-register kernel spill), by loops not unrolled: one Philox chain
      // at a time (unrolled, the scheduler interleaves them, and their registers made the
      // D = 128 kernel spill at sm_80).
      const int key0 = k0 + 16 * warp + group_id(lane);  // this lane's keys: key0, key0 + 8
      std::uint32_t kept = 0;
      if constexpr (Mask::dropped) {
        static_assert(4 * qb <= 32, "a bit an element in one word");
        if (shared_draws && mask.group_starts(k0)) {
          // The tiles are transposed: the four keys of a Philox call (one query) sit in the
          // four lanes 16 a + 4 v + t, v = 0..3, which hold the same four (query, key group)
          // pairs of every n8 block, as their elements e = 0..3. Lane v draws the group of
          // element e = v (one call a block instead of four), and a 4 x 4 transpose of the
          // verdict bits across the four lanes (two shuffles) gives each its own key's.
          const int v = group_id(lane) & 3;
          const int i = q0 + 2 * thread_in_group(lane) + (v & 1);
          const int j = k0 + 16 * warp + 4 * (group_id(lane) >> 2) + 8 * (v >> 1);
          KFA_NO_UNROLL
          for (int n = 0; n < qb; ++n)
            kept |= mask.kept4(h, i + 8 * n, j) << (4 * n);
          std::uint32_t y = W::lane_xor_bits(kept, 8);  // lane v ^ 2: swap bit 1 of e and v
          kept = v & 2 ? (kept & 0xCCCCCCCCu) | (y & 0xCCCCCCCCu) >> 2
                       : (kept & 0x33333333u) | (y & 0x33333333u) << 2;
          y = W::lane_xor_bits(kept, 4);  // lane v ^ 1: swap bit 0
          kept = v & 1 ? (kept & 0xAAAAAAAAu) | (y & 0xAAAAAAAAu) >> 1
                       : (kept & 0x55555555u) | (y & 0x55555555u) << 1;
        } else {  // groups off the tiles (a key origin not a multiple of four): a call each
          KFA_NO_UNROLL
          for (int u = 0; u < 4 * qb; ++u) {
            const int n = u >> 2, e = u & 3;
            const int i = q0 + 8 * n + c_coord(lane, e).col, j = key0 + 8 * (e >> 1);
            kept |= (mask.kept(h, i, j) ? 1u : 0u) << u;
          }
        }
      }

      // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: B fragments of 16 queries by ldmatrix.x4.
      FragC st[qb], dpt[qb];
      KFA_UNROLL
      for (int n = 0; n < qb; ++n)
        st[n] = dpt[n] = zero_c();
      KFA_UNROLL
      for (int kk = 0; kk < kd; ++kk) {
        FragA<Tag> ka;
        if constexpr (k_in_registers) {
          ka = kf[kk];
        } else {
          const Coord a = a_source(lane);
          W::ldmatrix_x4(ka.x, ks + swizzled(16 * warp + a.row, 16 * kk + a.col, D));
        }
        KFA_UNROLL
        for (int n0 = 0; n0 < QR; n0 += 16) {
          const Coord src = b_source(lane);
          std::uint32_t b[4];
          W::ldmatrix_x4(b, qs + swizzled(n0 + src.row, 16 * kk + src.col, D));
          W::mma(st[n0 / 8], ka, FragB<Tag>{{b[0], b[1]}});
          W::mma(st[n0 / 8 + 1], ka, FragB<Tag>{{b[2], b[3]}});
          W::ldmatrix_x4(b, dos + swizzled(n0 + src.row, 16 * kk + src.col, D));
          W::mma(dpt[n0 / 8], vf[kk], FragB<Tag>{{b[0], b[1]}});
          W::mma(dpt[n0 / 8 + 1], vf[kk], FragB<Tag>{{b[2], b[3]}});
        }
      }

      // Scores in base 2 with the mask (keys past the tile hidden too), P^T, dS^T.
      const bool inside = nc == keys && mask.tile_inside(q0, nq, k0, nc);  // team-wide
      float lse[qb][2], delta[qb][2];
      KFA_UNROLL
      for (int n = 0; n < qb; ++n) {
        KFA_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * n + c_coord(lane, e).col;
          lse[n][e] = lse_s[c];
          delta[n][e] = delta_s[c];
        }
        KFA_UNROLL
        for (int e = 0; e < 4; ++e) {
          const float x = st[n].x[e] * scale2;
          if (inside) {
            st[n].x[e] = x;
          } else {
            const int i = q0 + 8 * n + c_coord(lane, e).col, j = key0 + 8 * (e >> 1);
            st[n].x[e] = j < k0 + nc && mask.visible(i, j) ? x : -INFINITY;
          }
        }
      }
      probabilities<fast_p>(st, lse);
      if constexpr (Mask::dropped) {
        // With Z the weights and O = (P Z) V / l: dV takes P Z, dS = P (Z dP - delta).
        const float zs = mask.keep_scale();
        KFA_UNROLL
        for (int n = 0; n < qb; ++n) {
          KFA_UNROLL
          for (int e = 0; e < 4; ++e) {
            const float z = kept >> (4 * n + e) & 1u ? zs : 0.0f;
            dpt[n].x[e] = st[n].x[e] * (z * dpt[n].x[e] - delta[n][e & 1]);
            st[n].x[e] *= z;
          }
        }
      } else {
        score_gradients(dpt, st, delta);
      }

      // dV_w += P^T dO_i and dK_w += dS^T Q_i: 16 queries a step, B by ldmatrix.x4.trans.
      KFA_UNROLL
      for (int kk = 0; kk < QR / 16; ++kk) {
        const FragA<Tag> pa = a_from_c_finite(Tag{}, st[2 * kk], st[2 * kk + 1]);
        const FragA<Tag> da = a_from_c_finite(Tag{}, dpt[2 * kk], dpt[2 * kk + 1]);
        KFA_UNROLL
        for (int n0 = 0; n0 < D; n0 += 16) {
          const Coord src = bt_source(lane);
          std::uint32_t b[4];
          W::ldmatrix_x4_trans(b, dos + swizzled(16 * kk + src.row, n0 + src.col, D));
          W::mma(dv[n0 / 8], pa, FragB<Tag>{{b[0], b[1]}});
          W::mma(dv[n0 / 8 + 1], pa, FragB<Tag>{{b[2], b[3]}});
          W::ldmatrix_x4_trans(b, qs + swizzled(16 * kk + src.row, n0 + src.col, D));
          W::mma(dk[n0 / 8], da, FragB<Tag>{{b[0], b[1]}});
          W::mma(dk[n0 / 8 + 1], da, FragB<Tag>{{b[2], b[3]}});
        }
      }

      // dS^T to shared memory (rows: keys, columns: queries), two columns a 32-bit store.
      KFA_UNROLL
      for (int n = 0; n < qb; ++n) {
        KFA_UNROLL
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = 16 * warp + group_id(lane) + 8 * h2, c = 8 * n + c_coord(lane, 0).col;
          const std::uint32_t pair = pack2_finite(Tag{}, dpt[n].x[2 * h2], dpt[n].x[2 * h2 + 1]);
          *reinterpret_cast<std::uint32_t*>(dst + swizzled(r, c, QR)) = pair;
        }
      }
      W::barrier();  // dS^T whole; every warp is past its reads of Q_i, dO_i, LSE and delta

      const int s1 = next_step(s + 1);
      if (s1 < heads * q_tiles) {  // the next tile's copies overlap the dQ products
        stage_step(s1);
        W::cp_async_commit();
      }

      // dQ_i += scale dS K_j: this warp's row block and columns; A = dS from dS^T by
      // ldmatrix.x4.trans at b_source's addresses, B = K_j by .trans.
      const int rb = warp % row_blocks, c0 = warp / row_blocks * part_cols;
      FragC dq[part_cols / 8];
      KFA_UNROLL
      for (int n = 0; n < part_cols / 8; ++n)
        dq[n] = zero_c();
      KFA_UNROLL
      for (int kk = 0; kk < keys / 16; ++kk) {
        FragA<Tag> a;
        const Coord as = b_source(lane);
        W::ldmatrix_x4_trans(a.x, dst + swizzled(16 * kk + as.row, 16 * rb + as.col, QR));
        KFA_UNROLL
        for (int n0 = 0; n0 < part_cols; n0 += 16) {
          const Coord src = bt_source(lane);
          std::uint32_t b[4];
          W::ldmatrix_x4_trans(b, ks + swizzled(16 * kk + src.row, c0 + n0 + src.col, D));
          W::mma(dq[n0 / 8], a, FragB<Tag>{{b[0], b[1]}});
          W::mma(dq[n0 / 8 + 1], a, FragB<Tag>{{b[2], b[3]}});
        }
      }
      if constexpr (dq_by_fours) {
        // Four columns of one row a lane, added by one W::add4: lanes 2u and 2u + 1 swap half
        // their fragment, the even lane taking row g's columns 4u..4u+3 of the n8 block and
        // the odd lane row g + 8's.
        const bool odd = lane & 1;
        const int i = q0 + 16 * rb + group_id(lane) + (odd ? 8 : 0);
        const int col = c0 + 4 * (thread_in_group(lane) >> 1);
        float* const dq_row = i < q0 + nq ? grads.dq_row(h, i) : nullptr;
        KFA_UNROLL
        for (int n = 0; n < part_cols / 8; ++n) {
          const float* x = dq[n].x;
          const float r0 = W::lane_pair(odd ? x[0] : x[2]), r1 = W::lane_pair(odd ? x[1] : x[3]);
          const float sum[4] = {scale * (odd ? r0 : x[0]), scale * (odd ? r1 : x[1]),
                                scale * (odd ? x[2] : r0), scale * (odd ? x[3] : r1)};
          if (dq_row) W::add4(dq_row + (col + 8 * n), sum);
        }
      } else {
        KFA_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + 16 * rb + c_coord(lane, e).row;
          if (i >= q0 + nq) continue;
          KFA_UNROLL
          for (int n = 0; n < part_cols / 8; ++n)
            W::add(&grads.dq_row(h, i)[c0 + 8 * n + c_coord(lane, e).col], scale * dq[n].x[e]);
        }
      }
      s = s1;
    }

    // The team's sums over its heads and query tiles: this warp's 16 keys.
    KFA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int j = k0 + 16 * warp + c_coord(lane, e).row;
      if (j >= k0 + nc) continue;
      KFA_UNROLL
      for (int n = 0; n < db; ++n) {
        const int c = 8 * n + c_coord(lane, e).col;
        grads.dk(j, c, scale * dk[n].x[e]);
        grads.dv(j, c, dv[n].x[e]);
      }
    }
  }
};

}  // namespace kfa::backends::cuda
