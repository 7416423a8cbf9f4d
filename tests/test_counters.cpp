// The tile skipping the masks promise, counted (built with KFA_TEST_COUNTERS, impl/counters.hpp):
// every kernel stages exactly the tiles that hold a visible (query, key) pair, as the float64
// reference's visibility rule (kfa::reference::visible, sharing no code with the kernels' masks)
// counts them on the host. A causal square problem of 1024 rows in 64 x 64 tiles stages 136 of
// its 256 tile pairs per head (66 of 121 in 96 x 96): about half the work of the full problem.
#include <kfa/flops.hpp>
#include <kfa/impl/counters.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using traits = kfa::backends::TileTraits<Exec, float>;
using kfa::impl::TileCounter;

/// What the kernels counted: tiles and their rows per TileCounter.
struct Counts {
  std::array<unsigned long long, kfa::impl::tile_counter_slots> c{};
  static int tiles_at(TileCounter k) { return static_cast<int>(k); }
  static int rows_at(TileCounter k) { return kfa::impl::tile_counters + static_cast<int>(k); }
  /// Tiles staged in the loop of `k`.
  unsigned long long tiles(TileCounter k) const { return c[tiles_at(k)]; }
  /// Their rows.
  unsigned long long rows(TileCounter k) const { return c[rows_at(k)]; }
};

/// Zeroes the counters, runs f, and returns what the kernels counted.
template <class F>
Counts count_tiles(const F& f) {
  auto& counts = kfa::impl::test_tile_counters<Exec::memory_space>();
  Kokkos::deep_copy(counts, 0ULL);
  f();
  Kokkos::fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), counts);
  Counts out;
  for (std::size_t i = 0; i < out.c.size(); ++i)
    out.c[i] = h(i);
  return out;
}

/// Tile pairs (query tile of `rows`, key tile of `cols`) of one head that hold a visible pair.
long long meeting_tiles(const Shape& s, const kfa::Params& p, int rows, int cols) {
  long long n = 0;
  for (int q0 = 0; q0 < s.seqlen_q; q0 += rows)
    for (int k0 = 0; k0 < s.seqlen_k; k0 += cols) {
      bool meet = false;
      for (int i = q0; i < q0 + rows && i < s.seqlen_q && !meet; ++i)
        for (int j = k0; j < k0 + cols && j < s.seqlen_k && !meet; ++j)
          meet = kfa::reference::visible(p, i, j, s.seqlen_q, s.seqlen_k);
      n += meet;
    }
  return n;
}

/// Key tiles one head's forward counts: the tile path's Br x Bc tile pairs that meet, or none
/// where float takes the register forward (CUDA, TileOps::warp_forward under KFA_CUDA_TF32X3),
/// which stages its own tiles without the counter (its tile skipping is test_mma's: the
/// simulated team's hidden tiles hold NaN).
template <class E = Exec>
long long forward_tiles(const Shape& s, const kfa::Params& p) {
  using Traits = kfa::backends::TileTraits<E, float>;
  if constexpr (Traits::warp_tiles) {
    using Ops = kfa::backends::TileOps<E, float>;
    if (Ops::warp_head_dim(s.head_dim) && s.dv() == s.head_dim && Ops::warp_runs(E{})) return 0;
  }
  return meeting_tiles(s, p, Traits::block_q(s.head_dim, s.seqlen_k), Traits::block_k(s.head_dim));
}

Counts run_both(const Shape& s, const kfa::Params& p) {
  Problem pb(s, seed_of(s, 0));
  std::mt19937_64 gen(1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.dv(), gen);
  const auto fwd = count_tiles([&] { run_forward<float>(pb, p); });
  // run_backward runs the forward first: the backward's counts are what the pair adds.
  auto both = count_tiles([&] { run_backward<float>(pb, p, dout); });
  for (int at : {Counts::tiles_at(TileCounter::forward), Counts::rows_at(TileCounter::forward)})
    both.c[at] = fwd.c[at];
  return both;
}

TEST(TileSkip, CausalSquareStagesHalfTheTiles) {
  if (traits::warp_tiles || traits::warp_backward)
    GTEST_SKIP() << "the register kernels stage their own tiles; TileSkip.EveryMask covers "
                 << Exec::name() << "'s";
  kfa::Params p;
  p.causal = true;
  const Shape s{1, 2, 2, 1024, 1024, 64};
  // Forward, Br x Bc tiles: query tile i (rows up to min((i + 1) Br, N) - 1: the last tile is
  // short where Br does not divide N, 96 into 1024) sees key tiles 0 to that row / Bc.
  const int br = traits::block_q(s.head_dim, s.seqlen_k), bc = traits::block_k(s.head_dim);
  unsigned forward_tiles = 0;
  for (int i = 0; i * br < 1024; ++i)
    forward_tiles += static_cast<unsigned>((std::min((i + 1) * br, 1024) - 1) / bc + 1);
  // Backward, Bt x Bt tiles: query tile i meets key tiles 0 to i, T (T + 1) / 2 of the T x T
  // pairs for T = ceil(N / Bt), a short last tile included (136 at 64 x 64, 66 at 96 x 96).
  const int bt = traits::block_bwd(64);
  const unsigned t = static_cast<unsigned>((1024 + bt - 1) / bt), backward_tiles = t * (t + 1) / 2;
  for (bool deterministic : {false, true}) {  // atomic dQ, or the query pass
    p.dq_mode = deterministic ? kfa::DqMode::query_pass : kfa::DqMode::atomic;
    const auto c = run_both(s, p);
    EXPECT_EQ(c.tiles(TileCounter::forward), 2u * forward_tiles) << "forward key tiles";
    EXPECT_EQ(c.tiles(TileCounter::key_value), 2u * backward_tiles)
        << "backward key-tile kernel: query tiles";
    EXPECT_EQ(c.tiles(TileCounter::query), deterministic ? 2u * backward_tiles : 0u)
        << "backward query-tile kernel: key tiles";
  }
  EXPECT_EQ(meeting_tiles(s, p, 64, 64), 136);  // the host count agrees: 16 * 17 / 2
  EXPECT_EQ(meeting_tiles(s, p, bt, bt), static_cast<long long>(backward_tiles));
  EXPECT_EQ(meeting_tiles(s, p, br, bc), static_cast<long long>(forward_tiles));
}

TEST(TileSkip, EveryMaskEveryKernel) {
  const Shape shapes[] = {
      {1, 2, 1, 113, 203, 64}, {2, 1, 1, 203, 113, 32}, {1, 4, 2, 130, 130, 16}};
  for (const Shape& s : shapes)
    for (const kfa::Params& mask : masks())
      for (bool deterministic : {false, true}) {
        kfa::Params p = mask;
        p.dq_mode = deterministic ? kfa::DqMode::query_pass : kfa::DqMode::atomic;
        p.num_splits = 1;
        SCOPED_TRACE(::testing::Message()
                     << s << " " << describe(p) << (deterministic ? " deterministic" : " atomic"));
        const int d = s.head_dim, bt = traits::block_bwd(d);
        const long long heads = static_cast<long long>(s.batch) * s.heads_q;
        const long long fwd = heads * forward_tiles(s, p);
        const long long bwd = heads * meeting_tiles(s, p, bt, bt);
        const auto c = run_both(s, p);
        EXPECT_EQ(c.tiles(TileCounter::forward), static_cast<unsigned long long>(fwd)) << "forward";
        EXPECT_EQ(c.tiles(TileCounter::key_value), static_cast<unsigned long long>(bwd))
            << "key-tile kernel";
        EXPECT_EQ(c.tiles(TileCounter::query),
                  static_cast<unsigned long long>(deterministic ? bwd : 0))
            << "query-tile";
      }
}

// Long key sequences: the forward stages the tiles of TileTraits::block_q(head_dim, seqlen_k),
// without a mask and causal. On the host this shape meets host/traits.hpp's long-key rule with
// and without AVX-512: 192 query rows, 3 x 257 tiles without a mask where the short rule would
// stage 7 x 257 (64 rows, AVX-512) or 5 x 257 (96 rows).
TEST(TileSkip, LongKeysStageTheirQueryTiles) {
  const Shape s{1, 1, 1, 421, 16445, 128};
  if constexpr (Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible) {
    EXPECT_EQ(traits::block_q(s.head_dim, s.seqlen_k), kfa::backends::host::long_query_tile_rows)
        << "the shape no longer meets the host's long-key rule";
  }
  kfa::Params causal;
  causal.causal = true;
  for (kfa::Params p : {kfa::Params{}, causal}) {
    p.num_splits = 1;
    SCOPED_TRACE(describe(p));
    Problem pb(s, seed_of(s, 0));
    const auto c = count_tiles([&] { run_forward<float>(pb, p); });
    EXPECT_EQ(c.tiles(TileCounter::forward), static_cast<unsigned long long>(forward_tiles(s, p)));
  }
}

// Split-KV divides a query tile's visible key tiles among its splits, none twice, none lost.
// 517 keys: 9 tiles of 64 (5 of the host's 128 at head_dim 64), so 17 splits leave empty ones.
TEST(TileSkip, SplitsStageEachTileOnce) {
  const Shape s{1, 2, 1, 70, 517, 64};
  for (const kfa::Params& mask : masks())
    for (int splits : {2, 3, 17}) {
      kfa::Params p = mask;
      p.num_splits = splits;
      SCOPED_TRACE(::testing::Message() << describe(p));
      Problem pb(s, seed_of(s, splits));
      const auto c = count_tiles([&] { run_forward<float>(pb, p); });
      EXPECT_EQ(c.tiles(TileCounter::forward),
                static_cast<unsigned long long>(2 * forward_tiles(s, p)));
    }
}

// A boolean mask (kfa::masks::Dense, broadcast over heads) whose 64 x 64 blocks hide every key,
// none or some: every kernel stages exactly the tile pairs in which the mask and the interval
// masks leave a visible pair, as counted here from the mask itself (the forward with its Br x Bc
// tiles, the backward's key-tile and query-tile kernels with Bt x Bt), fewer than the interval
// masks alone leave.
TEST(TileSkip, DenseMaskHidesTilesInEveryKernel) {
  const Shape s{2, 2, 1, 150, 203, 32};
  const int br = traits::block_q(s.head_dim, s.seqlen_k), bc = traits::block_k(s.head_dim),
            bt = traits::block_bwd(s.head_dim);
  // Blocks of the pattern as large as the largest tiles, so that whole tiles of every kernel
  // fall in its hidden blocks.
  const int block_rows = br > bt ? br : bt, block_cols = bc > bt ? bc : bt;
  View4<std::uint8_t> m("mask", s.batch, 1, s.seqlen_q, s.seqlen_k);
  auto hm = Kokkos::create_mirror_view(m);
  for (int x = 0; x < s.batch; ++x)
    for (int i = 0; i < s.seqlen_q; ++i)
      for (int j = 0; j < s.seqlen_k; ++j) {
        // hidden, visible, a checkerboard
        const int kind = (i / block_rows + 2 * (j / block_cols) + x) % 3;
        hm(x, 0, i, j) = kind == 1 || (kind == 2 && (i + j) % 2 == 0) ? 1 : 0;
      }
  Kokkos::deep_copy(m, hm);
  // Tile pairs of rows x cols that the mask and p leave a visible pair in, over the batch.
  const auto meeting = [&](const kfa::Params& p, int rows, int cols) {
    long long n = 0;
    for (int x = 0; x < s.batch; ++x)
      for (int q0 = 0; q0 < s.seqlen_q; q0 += rows)
        for (int k0 = 0; k0 < s.seqlen_k; k0 += cols) {
          bool meet = false;
          for (int i = q0; i < q0 + rows && i < s.seqlen_q && !meet; ++i)
            for (int j = k0; j < k0 + cols && j < s.seqlen_k && !meet; ++j)
              meet = kfa::reference::visible(p, i, j, s.seqlen_q, s.seqlen_k) && hm(x, 0, i, j);
          n += meet;
        }
    return n * s.heads_q;
  };
  kfa::Params causal;
  causal.causal = true;
  Problem pb(s, seed_of(s, 4));
  auto q = to_device<float>(pb.q), k = to_device<float>(pb.k), v = to_device<float>(pb.v);
  std::mt19937_64 gen(5);
  auto dout =
      to_device<float>(random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen));
  View4<float> o("o", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  View3<float> lse("lse", s.batch, s.heads_q, s.seqlen_q);
  View4<float> dq("dq", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
      dk("dk", s.batch, s.heads_k, s.seqlen_k, s.head_dim),
      dv("dv", s.batch, s.heads_k, s.seqlen_k, s.head_dim);
  for (const auto& mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass})
    for (auto p : {kfa::Params{}, causal}) {
      p.dq_mode = mode;
      p.num_splits = 1;
      SCOPED_TRACE(describe(p) + " " + kfa::name_of(mode));
      const long long fwd = meeting(p, br, bc), bwd = meeting(p, bt, bt);
      const auto cf =
          count_tiles([&] { kfa::forward(Exec(), q, k, v, o, lse, p, kfa::masks::Dense{m}); });
      EXPECT_EQ(cf.tiles(TileCounter::forward), static_cast<unsigned long long>(fwd));
      EXPECT_LT(fwd, static_cast<long long>(s.heads_q) * s.batch * meeting_tiles(s, p, br, bc))
          << "the mask hides tiles the interval masks leave";
      const auto cb = count_tiles([&] {
        kfa::backward(Exec(), q, k, v, o, lse, dout, dq, dk, dv, p, kfa::masks::Dense{m});
      });
      EXPECT_EQ(cb.tiles(TileCounter::key_value), static_cast<unsigned long long>(bwd))
          << "key-tile kernel";
      EXPECT_EQ(cb.tiles(TileCounter::query),
                static_cast<unsigned long long>(mode == kfa::DqMode::query_pass ? bwd : 0))
          << "query-tile kernel";
      EXPECT_LT(bwd, static_cast<long long>(s.heads_q) * s.batch * meeting_tiles(s, p, bt, bt));
    }
}

// The symmetric kernel pairs tile j with every tile i that meets it in either direction.
TEST(TileSkip, SymmetricPairsTilesMeetingEitherWay) {
  const Shape shapes[] = {{1, 2, 2, 1024, 1024, 64}, {2, 1, 1, 203, 203, 32}};
  for (const Shape& s : shapes)
    for (const kfa::Params& mask : masks()) {
      kfa::Params p = mask;
      p.dq_mode = kfa::DqMode::symmetric;
      SCOPED_TRACE(::testing::Message() << s << " " << describe(p));
      const int bt = traits::block_bwd(s.head_dim);
      long long pairs = 0;
      for (int j0 = 0; j0 < s.seqlen_q; j0 += bt)
        for (int i0 = 0; i0 < s.seqlen_q; i0 += bt) {
          bool meet = false;
          for (int a = 0; a < bt && !meet; ++a)
            for (int c = 0; c < bt && !meet; ++c) {
              const int i = i0 + a, j = j0 + c;
              if (i >= s.seqlen_q || j >= s.seqlen_q) continue;
              meet = kfa::reference::visible(p, i, j, s.seqlen_q, s.seqlen_k) ||
                     kfa::reference::visible(p, j, i, s.seqlen_q, s.seqlen_k);
            }
          pairs += meet;
        }
      const auto c = run_both(s, p);
      EXPECT_EQ(c.tiles(TileCounter::key_value) + c.tiles(TileCounter::query), 0u)
          << "the two-kernel path ran";
      EXPECT_EQ(c.tiles(TileCounter::symmetric),
                static_cast<unsigned long long>(pairs) * s.batch * s.heads_q);
    }
}

// ---- The I/O model of kfa/flops.hpp -------------------------------------------------------

// Unmasked, the forward's model is FlashAttention's closed form: Q read and O written once,
// K and V once per query tile, the LSE once; doubling N multiplies it by 4 within 10 % for
// N >= 4096 with the tiles fixed (Theta(N^2 D / Br)).
TEST(IoModel, ForwardClosedFormAndQuadraticGrowth) {
  const int B = 2, H = 3, D = 64, br = 64, bc = 32, e = 4, lse = 4;
  for (int n : {100, 1024, 4096}) {
    const double tr = std::ceil(double(n) / br);  // query tiles
    const double want = double(e) * B * H * D * (2.0 * n + 2.0 * tr * n) + double(lse) * B * H * n;
    EXPECT_DOUBLE_EQ(kfa::forward_traffic(B, H, n, n, D, e, lse, {}, br, bc).total(), want);
  }
  for (int n : {4096, 8192}) {
    const double a = kfa::forward_traffic(1, 1, n, n, D, e, lse, {}, br, bc).total();
    const double b = kfa::forward_traffic(1, 1, 2 * n, 2 * n, D, e, lse, {}, br, bc).total();
    EXPECT_NEAR(b / a, 4.0, 0.4) << "N " << n;
  }
  kfa::Params causal;
  causal.causal = true;  // about half the key tiles
  const double full = kfa::forward_traffic(1, 1, 4096, 4096, D, e, lse, {}, br, bc).read;
  const double half = kfa::forward_traffic(1, 1, 4096, 4096, D, e, lse, causal, br, bc).read;
  EXPECT_NEAR(half / full, 0.5, 0.02);
}

// The model charges exactly the rows the kernels stage: its bytes equal the bytes rebuilt from
// the counted rows, forward and every backward dQ mode (symmetric on self-attention shapes),
// over the mask matrix, with v's head dim Dv equal to D and not (O, V, dO and dV rows Dv wide).
TEST(IoModel, EqualsTheBytesOfTheRowsTheKernelsStage) {
  const Shape shapes[] = {{1, 2, 1, 113, 203, 64},     {2, 2, 2, 203, 113, 32},
                          {1, 4, 2, 130, 130, 16},     {2, 2, 2, 150, 150, 32},
                          {1, 2, 1, 113, 203, 32, 64}, {1, 2, 2, 130, 130, 64, 16}};
  const double e = sizeof(float), lse = sizeof(float), acc = sizeof(float);
  for (const Shape& s : shapes)
    for (const kfa::Params& mask : masks())
      for (kfa::DqMode mode :
           {kfa::DqMode::atomic, kfa::DqMode::query_pass, kfa::DqMode::symmetric}) {
        if (mode == kfa::DqMode::symmetric && (s.seqlen_q != s.seqlen_k || s.heads_q != s.heads_k))
          continue;
        kfa::Params p = mask;
        p.num_splits = 1;
        p.dq_mode = mode;
        SCOPED_TRACE(::testing::Message() << s << " " << describe(p));
        // The kernels' tiles follow the wider head dim (impl's tile_dim).
        const int d = s.head_dim, dv = s.dv(), wide = d > dv ? d : dv, bt = traits::block_bwd(wide);
        const double b = s.batch, hq = s.heads_q, hk = s.heads_k, nq = s.seqlen_q, nk = s.seqlen_k,
                     D = d, Dv = dv;
        const auto c = run_both(s, p);
        const auto rows = [&](TileCounter k) { return double(c.rows(k)); };
        const auto fwd = kfa::forward_traffic(s.batch, s.heads_q, s.seqlen_q, s.seqlen_k, d, 4, 4,
                                              p, traits::block_q(wide, s.seqlen_k),
                                              traits::block_k(wide), s.head_dim_v);
        if (forward_tiles(s, p) > 0 || c.tiles(TileCounter::forward) > 0) {  // a counted forward
          EXPECT_DOUBLE_EQ(fwd.read,
                           b * hq * nq * D * e + rows(TileCounter::forward) * (D + Dv) * e);
        }
        EXPECT_DOUBLE_EQ(fwd.written, b * hq * nq * (Dv * e + lse));
        const auto bwd = kfa::backward_traffic(s.batch, s.heads_q, s.heads_k, s.seqlen_q,
                                               s.seqlen_k, d, 4, 4, 4, p, bt, mode, s.head_dim_v);
        const double per_q_row = (D + Dv) * e + lse + acc, per_k_row = (D + Dv) * e;
        // The preprocessing: dO and O read, delta written.
        double read = b * hq * nq * Dv * 2 * e;
        double written = b * hq * nq * acc;
        if (mode == kfa::DqMode::symmetric) {
          EXPECT_EQ(c.tiles(TileCounter::key_value) + c.tiles(TileCounter::query), 0u);
          read += b * hq * nq * (per_q_row + per_k_row) +
                  rows(TileCounter::symmetric_query) * per_q_row +
                  rows(TileCounter::symmetric_key) * per_k_row;
          written += b * hq * nq * (2 * D + Dv) * e;
        } else {
          read += b * hk * nk * per_k_row + rows(TileCounter::key_value) * per_q_row;
          written += b * hk * nk * per_k_row;
        }
        if (mode == kfa::DqMode::query_pass) {
          read += b * hk * nk * per_k_row + b * hq * nq * per_q_row +
                  rows(TileCounter::query) * (D * e + (D + Dv) * acc);
          written += b * hk * nk * (D + Dv) * acc + b * hq * nq * D * e;
        } else if (mode == kfa::DqMode::atomic) {
          read += rows(TileCounter::key_value) * D * e;
          written += b * hq * nq * D * e + rows(TileCounter::key_value) * D * e;
        }
        EXPECT_DOUBLE_EQ(bwd.read, read);
        EXPECT_DOUBLE_EQ(bwd.written, written);
      }
  EXPECT_THROW(kfa::backward_traffic(1, 1, 1, 64, 64, 32, 4, 4, 4, {}, 32, kfa::DqMode::automatic),
               kfa::Error);
  // The symmetric kernel is self-attention only; the model refuses what the kernel refuses.
  EXPECT_THROW(kfa::backward_traffic(1, 2, 1, 64, 64, 32, 4, 4, 4, {}, 32, kfa::DqMode::symmetric),
               kfa::Error);
  EXPECT_THROW(kfa::backward_traffic(1, 1, 1, 64, 96, 32, 4, 4, 4, {}, 32, kfa::DqMode::symmetric),
               kfa::Error);
}

}  // namespace
