#pragma once
/// \file generic/tile.hpp
/// Portable tile traits and tile products. Correct on every Kokkos backend; the host and
/// CUDA backends specialise the traits (and may replace the products) where they know better.
///
/// Names follow the FlashAttention-2 paper: Br query rows and Bc keys per tile; a team owns one
/// query tile Q_i and walks the key/value tiles K_j, V_j staged in team scratch.

#include <kfa/backends/portability.hpp>

#include <cstddef>

namespace kfa::backends {

/// Tile shapes and launch shape of the attention kernels on ExecSpace for value type T.
/// The primary template is the portable choice; see host/traits.hpp for the host one.
template <class ExecSpace, class T, class Enable = void>
struct TileTraits {
  /// Query rows per team (Br) for a given head_dim.
  static constexpr int block_q(int /*head_dim*/) { return 64; }
  /// Keys per staged tile (Bc) for a given head_dim.
  static constexpr int block_k(int head_dim) { return head_dim <= 128 ? 64 : 32; }
  /// Backward tile (Br = Bc): the backward keeps K_j, K_j^T, V_j^T, dK_j and dV_j on chip
  /// next to Q_i, dO_i and dQ_i, so its tiles halve sooner than the forward's.
  static constexpr int block_bwd(int head_dim) { return head_dim <= 128 ? 64 : 32; }
  /// Team size; 0 lets Kokkos choose (Kokkos::AUTO).
  static constexpr int team_size = 0;
  /// Vector lanes per thread; each thread owns query rows, its lanes share the keys or head_dim.
  static constexpr int vector_length = 1;
  /// Teams the space runs at once, for the split-KV heuristic. The portable guess: teams of
  /// about 256 threads, so a GPU reporting 2048 resident threads per SM holds 8 teams per SM.
  static int concurrent_teams(const ExecSpace& space) {
    const int n = space.concurrency() / 256;
    return n > 1 ? n : 1;
  }
};

/// s[c] = sum_d q[d] * kt[d * ldk + c] for c in [c0, c1): one row of S = Q_i K_j^T, with the
/// key tile stored transposed (kt is head_dim x Bc) so the inner loop is unit stride in c.
template <class Member, class Acc>
KOKKOS_INLINE_FUNCTION void row_scores(const Member& member, const Acc* q, const Acc* kt, int ldk,
                                       int head_dim, int c0, int c1, Acc* s) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, c0, c1), [&](int c) { s[c] = Acc(0); });
  for (int d = 0; d < head_dim; ++d) {
    const Acc qd = q[d];
    const Acc* kd = kt + static_cast<std::ptrdiff_t>(d) * ldk;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, c0, c1),
                         [&](int c) { s[c] += qd * kd[c]; });
  }
}

/// o[d] += sum_{r in [r0, r1)} w[r * w_stride] * x[r * ldx + d] for d in [0, n): a weighted
/// sum of rows of x. With w a row of P and x = V_j it is one row of O += P V_j; with w a column
/// of P (w_stride = Bc) and x = dO_i it is one row of dV_j += P^T dO_i.
template <class Member, class Acc>
KOKKOS_INLINE_FUNCTION void accumulate_rows(const Member& member, const Acc* w, int w_stride,
                                            const Acc* x, int ldx, int n, int r0, int r1, Acc* o) {
  for (int r = r0; r < r1; ++r) {
    const Acc wr = w[static_cast<std::ptrdiff_t>(r) * w_stride];
    const Acc* xr = x + static_cast<std::ptrdiff_t>(r) * ldx;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int d) { o[d] += wr * xr[d]; });
  }
}

/// o[d] += sum_{c in [c0, c1)} p[c] * v[c * ldv + d]: one row of O += P_ij V_j.
template <class Member, class Acc>
KOKKOS_INLINE_FUNCTION void row_pv(const Member& member, const Acc* p, const Acc* v, int ldv,
                                   int head_dim, int c0, int c1, Acc* o) {
  accumulate_rows(member, p, 1, v, ldv, head_dim, c0, c1, o);
}

}  // namespace kfa::backends
