// The tile skipping the masks promise, counted (built with KFA_TEST_COUNTERS, impl/counters.hpp):
// every kernel stages exactly the tiles that hold a visible (query, key) pair, as the float64
// reference's visibility rule (kfa::reference::visible, sharing no code with the kernels' masks)
// counts them on the host. A causal square problem of 1024 rows in 64 x 64 tiles stages 136 of
// its 256 tile pairs per head: about half the work of the full problem.
#include <kfa/flops.hpp>
#include <kfa/impl/counters.hpp>

#include <gtest/gtest.h>

#include <array>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using traits = kfa::backends::TileTraits<Exec, float>;
using kfa::impl::TileCounter;

/// Zeroes the counters, runs f, and returns what the kernels counted.
template <class F>
std::array<unsigned long long, 8> count_tiles(const F& f) {
  auto& counts = kfa::impl::test_tile_counters<Exec::memory_space>();
  Kokkos::deep_copy(counts, 0ULL);
  f();
  Kokkos::fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), counts);
  return {h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)};
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

std::array<unsigned long long, 8> run_both(const Shape& s, const kfa::Params& p) {
  Problem pb(s, seed_of(s, 0));
  std::mt19937_64 gen(1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  const auto fwd = count_tiles([&] { run_forward<float>(pb, p); });
  // run_backward runs the forward first: the backward's counts are what the pair adds.
  auto both = count_tiles([&] { run_backward<float>(pb, p, dout); });
  both[0] = fwd[0];  // the forward's own run; the pair's forward counted the same again
  both[4] = fwd[4];
  return both;
}

TEST(TileSkip, CausalSquareStagesHalfTheTiles) {
  if (traits::block_q(64) != 64 || traits::block_k(64) != 64 || traits::block_bwd(64) != 64)
    GTEST_SKIP() << "the 136-of-256 count is for 64 x 64 tiles; TileSkip.EveryMask covers "
                 << Exec::name() << "'s";
  kfa::Params p;
  p.causal = true;
  const Shape s{1, 2, 2, 1024, 1024, 64};
  for (bool deterministic : {false, true}) {  // atomic dQ, or the query pass
    p.dq_mode = deterministic ? kfa::DqMode::query_pass : kfa::DqMode::atomic;
    const auto c = run_both(s, p);
    EXPECT_EQ(c[0], 2u * 136u) << "forward key tiles";
    EXPECT_EQ(c[1], 2u * 136u) << "backward key-tile kernel: query tiles";
    EXPECT_EQ(c[2], deterministic ? 2u * 136u : 0u) << "backward query-tile kernel: key tiles";
  }
  EXPECT_EQ(meeting_tiles(s, p, 64, 64), 136);  // the host count agrees: 16 * 17 / 2
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
        const long long fwd = heads * meeting_tiles(s, p, traits::block_q(d), traits::block_k(d));
        const long long bwd = heads * meeting_tiles(s, p, bt, bt);
        const auto c = run_both(s, p);
        EXPECT_EQ(c[0], static_cast<unsigned long long>(fwd)) << "forward";
        EXPECT_EQ(c[1], static_cast<unsigned long long>(bwd)) << "key-tile kernel";
        EXPECT_EQ(c[2], static_cast<unsigned long long>(deterministic ? bwd : 0)) << "query-tile";
      }
}

// Split-KV divides a query tile's visible key tiles among its splits, none twice, none lost.
TEST(TileSkip, SplitsStageEachTileOnce) {
  const Shape s{1, 2, 1, 70, 517, 64};
  for (const kfa::Params& mask : masks())
    for (int splits : {2, 3, 17}) {
      kfa::Params p = mask;
      p.num_splits = splits;
      SCOPED_TRACE(::testing::Message() << describe(p));
      Problem pb(s, seed_of(s, splits));
      const auto c = count_tiles([&] { run_forward<float>(pb, p); });
      const int d = s.head_dim;
      EXPECT_EQ(c[0], static_cast<unsigned long long>(
                          2 * meeting_tiles(s, p, traits::block_q(d), traits::block_k(d))));
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
      EXPECT_EQ(c[1] + c[2], 0u) << "the two-kernel path ran";
      EXPECT_EQ(c[3], static_cast<unsigned long long>(pairs) * s.batch * s.heads_q);
    }
}

// ---- The I/O model of kfa/flops.hpp -------------------------------------------------------

// Unmasked, the forward's model is FlashAttention's closed form: Q read and O written once,
// K and V once per query tile, the LSE once; doubling N multiplies it by 4 within 10 % for
// N >= 4096 with the tiles fixed (Theta(N^2 D / Br)).
TEST(IoModel, ForwardClosedFormAndQuadraticGrowth) {
  const int B = 2, H = 3, D = 64, br = 64, bc = 32, e = 4, lse = 4;
  for (int n : {100, 1024, 4096}) {
    const double tr = double((n + br - 1) / br);  // whole query tiles
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

// The model charges exactly the key rows the kernels stage: its bytes equal the bytes rebuilt
// from the counted rows, forward and both two-kernel backward modes, over the mask matrix.
TEST(IoModel, EqualsTheBytesOfTheRowsTheKernelsStage) {
  const Shape shapes[] = {
      {1, 2, 1, 113, 203, 64}, {2, 2, 2, 203, 113, 32}, {1, 4, 2, 130, 130, 16}};
  const double e = sizeof(float), lse = sizeof(float), acc = sizeof(float);
  for (const Shape& s : shapes)
    for (const kfa::Params& mask : masks())
      for (bool query_pass : {false, true}) {
        kfa::Params p = mask;
        p.num_splits = 1;
        p.dq_mode = query_pass ? kfa::DqMode::query_pass : kfa::DqMode::atomic;
        SCOPED_TRACE(::testing::Message() << s << " " << describe(p));
        const int d = s.head_dim, bt = traits::block_bwd(d);
        const double b = s.batch, hq = s.heads_q, hk = s.heads_k, nq = s.seqlen_q, nk = s.seqlen_k,
                     D = d;
        const auto c = run_both(s, p);
        const auto fwd = kfa::forward_traffic(s.batch, s.heads_q, s.seqlen_q, s.seqlen_k, d, 4, 4,
                                              p, traits::block_q(d), traits::block_k(d));
        EXPECT_DOUBLE_EQ(fwd.read, b * hq * nq * D * e + 2.0 * double(c[4]) * D * e);
        EXPECT_DOUBLE_EQ(fwd.written, b * hq * nq * (D * e + lse));
        const auto bwd = kfa::backward_traffic(s.batch, s.heads_q, s.heads_k, s.seqlen_q,
                                               s.seqlen_k, d, 4, 4, 4, p, bt, query_pass);
        const double per_q_row = 2 * D * e + lse + acc;
        double read = b * hq * nq * D * 2 * e + b * hk * nk * 2 * D * e + double(c[5]) * per_q_row;
        double written = b * hq * nq * acc + b * hk * nk * 2 * D * e;
        if (query_pass) {
          read +=
              b * hk * nk * 2 * D * e + b * hq * nq * per_q_row + double(c[6]) * D * (e + 2 * acc);
          written += b * hk * nk * 2 * D * acc + b * hq * nq * D * e;
        } else {
          read += double(c[5]) * D * e;
          written += b * hq * nq * D * e + double(c[5]) * D * e;
        }
        EXPECT_DOUBLE_EQ(bwd.read, read);
        EXPECT_DOUBLE_EQ(bwd.written, written);
      }
}

}  // namespace
