#pragma once
/// \file generic/tile.hpp
/// Portable tile traits and tile products. Correct on every Kokkos backend; the host backend
/// (host/) specialises both for host spaces, and other backends may do the same.
///
/// Names follow the FlashAttention-2 paper: Br query rows and Bc keys per tile; a team owns one
/// query tile Q_i and walks the key/value tiles K_j, V_j staged in team scratch.

#include <kfa/backends/bf16x2.hpp>
#include <kfa/backends/philox.hpp>
#include <kfa/backends/portability.hpp>

#include <cstddef>
#include <cstdint>

namespace kfa::backends {

/// Tile shapes and launch shape of the attention kernels on ExecSpace for value type T.
/// The primary template is the portable choice; see host/traits.hpp for the host one.
template <class ExecSpace, class T, class Enable = void>
struct TileTraits {
  /// Query rows per team (Br) for a forward with head_dim and seqlen_k keys (a backend may take
  /// taller tiles for long key sequences, as the host's do; packed sequences pass 0).
  static constexpr int block_q(int /*head_dim*/, int /*seqlen_k*/) { return 64; }
  /// Keys per staged tile (Bc) for a given head_dim.
  static constexpr int block_k(int head_dim) { return head_dim <= 128 ? 64 : 32; }
  /// Backward tile (Br = Bc): the backward keeps K_j, K_j^T, V_j^T, dK_j and dV_j on chip
  /// next to Q_i, dO_i and dQ_i, so its tiles halve sooner than the forward's.
  static constexpr int block_bwd(int head_dim) { return head_dim <= 128 ? 64 : 32; }
  /// Team size; 0 lets Kokkos choose (Kokkos::AUTO).
  static constexpr int team_size = 0;
  /// Vector lanes per thread; each thread owns query rows, its lanes share the keys or head_dim.
  static constexpr int vector_length = 1;
  /// Elements added to each row of a scratch tile (row stride = width + pad), to move rows
  /// that a warp reads together onto different shared-memory banks.
  static constexpr int pad = 0;
  /// Layout of the forward's score tile. false: S_ij = Q_i K_j^T, query rows by key columns,
  /// the softmax along rows (threads own rows: the layout of thread-per-row and warp
  /// backends). true: S_ij^T = K_j Q_i^T, key rows by query columns: Q_i is staged transposed
  /// once per query tile, K_j and V_j are plain row copies, both products read their operands
  /// where they lie, and the softmax runs down the columns, vectorised across queries (the
  /// layout of one-thread host teams, which would otherwise transpose every K_j).
  static constexpr bool key_major_scores = false;
  /// Key-major forward with bfloat16 inputs (is_bfloat16): whether the products take the
  /// inputs as they are, in pairs (TileOps::gemm_bf16x2, P rounded to bfloat16 once, as
  /// FlashAttention-2 rounds P to 16 bits), instead of widening them into float tiles.
  static constexpr bool bf16x2_products = false;
  /// Whether TileOps::warp_forward runs the forward of a whole team with the work in
  /// registers (FlashAttention-2's warp layout), for the head dims warp_head_dim accepts.
  static constexpr bool warp_tiles = false;
  /// Whether TileOps::warp_backward runs the backward's key-tile kernel (dQ by atomics) of a
  /// whole team with the work in registers, for the head dims warp_head_dim accepts.
  static constexpr bool warp_backward = false;
  /// Teams the space runs at once, for the split-KV heuristic. The portable guess: teams of
  /// about 256 threads, so a GPU reporting 2048 resident threads per SM holds 8 teams per SM.
  static int concurrent_teams(const ExecSpace& space) {
    const int n = space.concurrency() / 256;
    return n > 1 ? n : 1;
  }
};

/// A conversion of TileOps::stage_transposed: an element to Acc as it is.
struct Widen {
  /// x as an Acc.
  template <class Acc, class T>
  KOKKOS_INLINE_FUNCTION Acc to(T x) const {
    return static_cast<Acc>(x);
  }
};
/// A conversion of TileOps::stage_transposed: an element of a boolean visibility mask to the
/// additive score term it stands for, 0 where it is nonzero (visible) and -inf where it is 0
/// (hidden).
struct Visibility {
  /// 0 for a visible x, -inf for a hidden one.
  template <class Acc, class T>
  KOKKOS_INLINE_FUNCTION Acc to(T x) const {
    return x ? Acc(0) : -infinity<Acc>();
  }
};

/// Portable tile products and row operations for accumulation type Acc: threads of the team
/// own rows of the result, vector lanes its columns. Correct on every backend; TileOps uses it
/// unless a backend specialises TileOps.
///
/// gemm is called by the whole team; row_max and row_exp_sum by one thread (inside a
/// TeamThreadRange), its vector lanes sharing the row. Callers put the team barriers between
/// a product and its readers.
template <class Acc>
struct PortableTileOps {
  /// 16 Philox4x32-10 blocks in place (philox4x32_10_x16), by one thread.
  static KOKKOS_INLINE_FUNCTION void philox16(std::uint32_t (&w)[4][16], std::uint32_t k0,
                                              std::uint32_t k1) {
    philox4x32_10_x16(w, k0, k1);
  }

  /// x[l] *= (w[l] >= threshold ? scale : 0) for l < n <= 16, by one thread: dropout's weights
  /// from 16 Philox words (impl/dropout.hpp).
  static KOKKOS_INLINE_FUNCTION void weigh16(Acc* x, int n, const std::uint32_t (&w)[16],
                                             std::uint32_t threshold, Acc scale) {
    for (int l = 0; l < n; ++l)
      x[l] *= w[l] >= threshold ? scale : Acc(0);
  }

  /// Dropout's weights of 64 keys in key order from the words of 16 Philox blocks (philox16's
  /// layout): z[4 l + e] = (w[e][l] >= threshold ? scale : 0), by one thread.
  static KOKKOS_INLINE_FUNCTION void weights64(const std::uint32_t (&w)[4][16],
                                               std::uint32_t threshold, Acc scale, Acc (&z)[64]) {
    for (int l = 0; l < 16; ++l)
      for (int e = 0; e < 4; ++e)
        z[4 * l + e] = w[e][l] >= threshold ? scale : Acc(0);
  }

  /// f(r, c) for every element of a rows x cols tile, by the whole team: one flat range over
  /// the team's threads and lanes, so consecutive lanes take consecutive columns.
  template <class Member, class F>
  static KOKKOS_INLINE_FUNCTION void for_each_element(const Member& team, int rows, int cols,
                                                      const F& f) {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, rows * cols),
                         [&](int idx) { f(idx / cols, idx % cols); });
  }

  /// C = A B, or C += A B with `accumulate`, for C m x n (row stride ldc), B k x n (row stride
  /// ldb, unit column stride) and A m x k with element (i, p) at a[i * a_rs + p * a_cs], so
  /// that a transposed operand (P^T, dS^T) is read in place.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm(const Member& team, int m, int n, int k, const Acc* a,
                                          int a_rs, int a_cs, const Acc* b, int ldb, Acc* c,
                                          int ldc, bool accumulate) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](int i) {
      Acc* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
      if (!accumulate)
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](int j) { ci[j] = Acc(0); });
      for (int p = 0; p < k; ++p) {
        const Acc ai =
            a[static_cast<std::ptrdiff_t>(i) * a_rs + static_cast<std::ptrdiff_t>(p) * a_cs];
        const Acc* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                             [&](int j) { ci[j] += ai * bp[j]; });
      }
    });
  }

  /// max of x[c0, c1), for c0 < c1.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION Acc row_max(const Member& member, const Acc* x, int c0, int c1) {
    Acc mx;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(member, c0, c1), [&](int c, Acc& m) { m = x[c] > m ? x[c] : m; },
        Kokkos::Max<Acc>(mx));
    return mx;
  }

  /// x[c] = exp(x[c] - shift) on [c0, c1); returns their sum.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION Acc row_exp_sum(const Member& member, Acc* x, int c0, int c1,
                                                Acc shift) {
    Acc sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(member, c0, c1),
        [&](int c, Acc& s) {
          const Acc p = backends::exp(x[c] - shift);
          x[c] = p;
          s += p;
        },
        sum);
    return sum;
  }

  /// The online-softmax step of a key-major score tile (TileTraits::key_major_scores), by the
  /// whole team: rows [j0, j1) of s (keys, lds apart) and its first n columns (queries). For
  /// each column c, the partial (m[c], l[c]) of the keys before takes in the tile's by the
  /// combiner's rule (kfa/combine.hpp, rescale): m' = max(m[c], max_j s[j][c]),
  /// alpha[c] = e^(m[c] - m'), s[j][c] = e^(s[j][c] - m'), l[c] = alpha[c] l[c] + sum_j s[j][c],
  /// m[c] = m'. A column whose m' is -inf (no key seen yet; masked keys are -inf) gets
  /// alpha = 0 and P = 0, so its l stays 0. The caller scales its O~ rows by alpha.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_softmax(const Member& team, Acc* s, int lds, int j0,
                                                 int j1, int n, Acc* m, Acc* l, Acc* alpha) {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, n), [&](int c) {
      Acc top = m[c];
      for (int j = j0; j < j1; ++j) {
        const Acc x = s[static_cast<std::ptrdiff_t>(j) * lds + c];
        top = x > top ? x : top;
      }
      const Acc shift = top == -infinity<Acc>() ? Acc(0) : top;
      Acc sum = 0;
      for (int j = j0; j < j1; ++j) {
        Acc& x = s[static_cast<std::ptrdiff_t>(j) * lds + c];
        x = backends::exp(x - shift);
        sum += x;
      }
      alpha[c] = backends::exp(m[c] - shift);
      l[c] = alpha[c] * l[c] + sum;
      m[c] = top;
    });
  }

  /// The multi-scale step of a key-major score tile, by the whole team: rows [j0, j1) of s
  /// (keys, lds apart) and its first n columns (queries). With a weight tile w (same layout;
  /// nullptr: all ones) s[j][c] *= w[j][c] first; then each column's partial l[c] takes in the
  /// tile's sum of |s[j][c]| by addition (the multi-scale combiner). No exp, no rescaling.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_abs_sum(const Member& team, Acc* s, int lds, const Acc* w,
                                                 int j0, int j1, int n, Acc* l) {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, n), [&](int c) {
      Acc sum = 0;
      for (int j = j0; j < j1; ++j) {
        const std::ptrdiff_t e = static_cast<std::ptrdiff_t>(j) * lds + c;
        if (w) s[e] *= w[e];
        sum += backends::abs(s[e]);
      }
      l[c] += sum;
    });
  }

  /// dst[c * ldd + r] = convert(src_r[c]) for r < rows and c in [c0, c1), or += with
  /// `accumulate`, by the whole team: rows of a source with unit stride (row(r) points at
  /// element 0 of row r; any element type) written transposed into a tile. convert is Widen
  /// (the value in Acc) or Visibility (a byte of a boolean mask as the additive term 0 or -inf).
  template <class Member, class Row, class Convert = Widen>
  static KOKKOS_INLINE_FUNCTION void stage_transposed(const Member& team, int rows, int c0, int c1,
                                                      const Row& row, Acc* dst, int ldd,
                                                      Convert convert = {},
                                                      bool accumulate = false) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      const auto* src = row(r);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) {
        Acc& x = dst[static_cast<std::ptrdiff_t>(c) * ldd + r];
        x = accumulate ? x + convert.template to<Acc>(src[c]) : convert.template to<Acc>(src[c]);
      });
    });
  }

  /// A hint that the rows' elements [c0, c1) (stage_transposed's rows) are read soon; nothing
  /// here.
  template <class Row>
  static KOKKOS_INLINE_FUNCTION void prefetch_rows(int /*rows*/, int /*c0*/, int /*c1*/,
                                                   const Row& /*row*/) {}

  /// Pair products (bf16x2.hpp), by the whole team: C = scale (A B), or C += scale (A B) with
  /// `accumulate`, for float C (m x n, row stride ldc) and bfloat16 A (m x 2 k2) and B
  /// (2 k2 x n) as pair words: word (i, p) of A at word index i * a_rs + p * a_cs of a, row p
  /// of B the n words at word index p * ldb of b. Acc must be float.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm_bf16x2(const Member& team, int m, int n, int k2,
                                                 const void* a, int a_rs, int a_cs, const void* b,
                                                 int ldb, float* c, int ldc, float scale,
                                                 bool accumulate) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](int i) {
      float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](int j) {
        float sum = 0;
        for (int p = 0; p < k2; ++p)
          sum += bf16x2_dot(bf16x2_load(a, static_cast<std::ptrdiff_t>(i) * a_rs +
                                               static_cast<std::ptrdiff_t>(p) * a_cs),
                            bf16x2_load(b, static_cast<std::ptrdiff_t>(p) * ldb + j));
        ci[j] = accumulate ? ci[j] + scale * sum : scale * sum;
      });
    });
  }

  /// Rows of a float tile rounded to bfloat16 and interleaved two by two into pair words, by
  /// the whole team: word (r, c) of out (row stride ldo words) packs s[2r][c] (low) and
  /// s[2r + 1][c] (high) of s (row stride lds), for 2r < rows and c < n. When rows is odd the
  /// high halves of the last word row are 0.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void pack_bf16x2_rows(const Member& team, const float* s, int lds,
                                                      int rows, int n, void* out, int ldo) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (rows + 1) / 2), [&](int r) {
      const float* s0 = s + static_cast<std::ptrdiff_t>(2 * r) * lds;
      const bool pair = 2 * r + 1 < rows;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](int c) {
        const std::uint16_t hi = pair ? bf16_round(s0[lds + c]) : std::uint16_t(0);
        bf16x2_store(out, static_cast<std::ptrdiff_t>(r) * ldo + c,
                     bf16x2_pack(bf16_round(s0[c]), hi));
      });
    });
  }

  /// pack_bf16x2_rows with out transposed, by the whole team: word (c, r) of out (row stride
  /// ldo words) packs s[2r][c] (low) and s[2r + 1][c] (high), for 2r < rows and c < n; the
  /// high halves of word r = rows / 2 are 0 when rows is odd. A of a product reduced over s's
  /// rows (P V from S^T) with unit column stride, as products on tiles that load A by rows want
  /// it (bf16x2_tiles).
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void pack_bf16x2_columns(const Member& team, const float* s,
                                                         int lds, int rows, int n, void* out,
                                                         int ldo) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int c) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, (rows + 1) / 2), [&](int r) {
        const float* s0 = s + static_cast<std::ptrdiff_t>(2 * r) * lds + c;
        const std::uint16_t hi = 2 * r + 1 < rows ? bf16_round(s0[lds]) : std::uint16_t(0);
        bf16x2_store(out, static_cast<std::ptrdiff_t>(c) * ldo + r,
                     bf16x2_pack(bf16_round(s0[0]), hi));
      });
    });
  }

  /// Whether a key-major forward with TileTraits::bf16x2_products takes the pair products
  /// (gemm_bf16x2) on this machine; the portable ones are taken wherever the traits ask.
  static bool bf16x2_pays() { return true; }

  /// Whether gemm_bf16x2 wants A with unit column stride (pack_bf16x2_columns); the portable
  /// loops take either.
  static bool bf16x2_tiles() { return false; }

  /// Opened around a run of gemm_bf16x2 calls on one thread (a query tile's sweep), for
  /// products that need the thread set up first (the host's AMX tiles); nothing here.
  struct PairScope {
    /// Sets up when `wanted`; here nothing.
    KOKKOS_INLINE_FUNCTION explicit PairScope(bool /*wanted*/) {}
  };

  /// pack_bf16x2_rows for rows of bfloat16 values (element row stride ldv of v, any storage),
  /// which need no rounding: word (r, c) of out packs v[2r][c] and v[2r + 1][c].
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void interleave_bf16x2_rows(const Member& team, const void* v,
                                                            std::ptrdiff_t ldv, int rows, int n,
                                                            void* out, int ldo) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (rows + 1) / 2), [&](int r) {
      const std::ptrdiff_t row0 = static_cast<std::ptrdiff_t>(2 * r) * ldv;
      const bool pair = 2 * r + 1 < rows;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](int c) {
        const std::uint16_t hi = pair ? bf16_load(v, row0 + ldv + c) : std::uint16_t(0);
        bf16x2_store(out, static_cast<std::ptrdiff_t>(r) * ldo + c,
                     bf16x2_pack(bf16_load(v, row0 + c), hi));
      });
    });
  }
};

/// Tile products and row operations of the kernels on ExecSpace for value type T, on tiles of
/// accum_t<T> (the interface of PortableTileOps). host/tile.hpp specialises it for host
/// spaces, cuda/tile.hpp for Kokkos::Cuda; the value type lets a backend pick a hardware path
/// (tensor cores for 16-bit inputs).
template <class ExecSpace, class T, class Enable = void>
struct TileOps : PortableTileOps<accum_t<T>> {};

}  // namespace kfa::backends
