// Dropout: the generator against Philox4x32-10's published answers, and its 16-block form and
// the kernels' batched walks against one block at a time; the keep-mask's statistics and its
// dependence on (seed, offset, position) alone; forward and backward apply exactly the
// materialised mask at every tile shape and split count; both equal the double-precision
// reference fed with that mask, with and without causal and other masks.
#include <kfa/impl/dropout.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;

kfa::Params dropout(double p, std::uint64_t seed, std::uint64_t offset = 0, kfa::Params base = {}) {
  base.dropout = p;
  base.seed = seed;
  base.offset = offset;
  return base;
}

// Random123's known-answer vectors for Philox4x32-10 (its kat_vectors file), the published
// definition the generator is written from.
TEST(Dropout, PhiloxKnownAnswers) {
  struct Kat {
    kfa::impl::PhiloxBlock counter;
    std::uint32_t k0, k1;
    kfa::impl::PhiloxBlock expect;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& kat : kats) {
    const auto out = kfa::impl::philox4x32_10(kat.counter, kat.k0, kat.k1);
    for (int w = 0; w < 4; ++w)
      EXPECT_EQ(out.w[w], kat.expect.w[w]) << "word " << w;
  }
}

// The batched generator (TileOps::philox16: AVX-512 lanes on such a host, a loop elsewhere)
// against one block at a time, on counters and keys that vary in every word, the all-ones
// words among them; and the portable form. Its words as weights (TileOps::weights64) against
// the threshold rule.
TEST(Dropout, PhiloxSixteenAtATimeMatchesOneAtATime) {
  using Host = kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, float>;
  using Portable = kfa::backends::PortableTileOps<float>;
  std::uint32_t x = 12345u;
  const auto next = [&x] { return x = x * 1664525u + 1013904223u; };  // Numerical Recipes' LCG
  for (int trial = 0; trial < 64; ++trial) {
    const std::uint32_t k0 = trial == 0 ? 0xFFFFFFFFu : next(),
                        k1 = trial == 0 ? 0xFFFFFFFFu : next();
    std::uint32_t host[4][16], portable[4][16], counter[4][16];
    for (int e = 0; e < 4; ++e)
      for (int l = 0; l < 16; ++l)
        host[e][l] = portable[e][l] = counter[e][l] = trial == 0 ? 0xFFFFFFFFu : next();
    Host::philox16(host, k0, k1);
    Portable::philox16(portable, k0, k1);
    // The words as weights in key order (TileOps::weights64), host and portable alike.
    const std::uint32_t threshold = next();
    float host_z[64], portable_z[64];
    Host::weights64(host, threshold, 1.25f, host_z);
    Portable::weights64(host, threshold, 1.25f, portable_z);
    for (int q = 0; q < 64; ++q) {
      const float expect = host[q % 4][q / 4] >= threshold ? 1.25f : 0.0f;
      EXPECT_EQ(host_z[q], expect) << "trial " << trial << " key " << q;
      EXPECT_EQ(portable_z[q], expect) << "trial " << trial << " key " << q;
    }
    for (int l = 0; l < 16; ++l) {
      const auto one = kfa::impl::philox4x32_10(
          {{counter[0][l], counter[1][l], counter[2][l], counter[3][l]}}, k0, k1);
      for (int e = 0; e < 4; ++e) {
        EXPECT_EQ(host[e][l], one.w[e]) << "trial " << trial << " lane " << l << " word " << e;
        EXPECT_EQ(portable[e][l], one.w[e]) << "trial " << trial << " lane " << l << " word " << e;
      }
    }
  }
}

// Dropout's one-thread walks (row_weights64 over runs of 64 keys through TileOps::weights64,
// scale_key_major over a key-major tile through TileOps::weigh16), on the host's TileOps and
// the portable ones: every element gets the weight of its own Philox word (words()), and no
// other element is touched. Key origins that are not multiples of four (k_origin 6, tiles at
// 3 and 11), windows that start and end inside a group of four keys and inside a run of 64,
// 16-row batches with rows past nr.
template <class Ops>
void check_walks() {
  kfa::impl::Origin at;
  at.q = 37;
  at.k = 6;
  at.b = 2;
  const auto d = kfa::impl::make_dropout<float>(dropout(0.3, 99, 4), at);
  const auto weight = [&](int b, int h, int i, int k) {  // local indices, as the kernels pass
    const int j = d.k_origin + k;
    const auto r = d.words(b, h, d.q_origin + i, j >> 2);
    return r.w[j & 3] >= d.threshold ? d.scale : 0.0f;
  };
  int kept = 0, dropped = 0;
  for (int k0 : {0, 3, 64})
    for (auto [c0, c1] : {std::pair{0, 1}, {1, 64}, {3, 70}, {0, 128}, {5, 5}, {2, 67}})
      for (int i : {0, 5}) {
        std::vector<float> got(130, -1.0f);
        for (int ca = c0; ca < c1;) {
          float z[64];
          const int first = d.template row_weights64<Ops>(1, 3, i, k0, ca, z);
          ASSERT_LE(first, ca);
          ASSERT_GT(first + 64, ca);
          ASSERT_EQ((d.k_origin + k0 + first) % 64, 0) << "run at column " << first;
          const int cz = first + 64 < c1 ? first + 64 : c1;
          for (int c = ca; c < cz; ++c)
            got[c] = z[c - first];
          ca = cz;
        }
        for (int c = 0; c < 130; ++c) {
          const float expect = c >= c0 && c < c1 ? weight(1, 3, i, k0 + c) : -1.0f;
          EXPECT_EQ(got[c], expect) << "k0 " << k0 << " row " << i << " column " << c;
          kept += expect > 0;
          dropped += expect == 0;
        }
      }
  EXPECT_GT(kept, 0);
  EXPECT_GT(dropped, 0);
  for (int k0 : {10, 11})
    for (int nr : {1, 13, 16, 21})
      for (auto [cb, ce] : {std::pair{0, 64}, {3, 70}, {5, 6}}) {
        const int q0 = 7, lds = nr + 3, rows = ce + 1;
        std::vector<float> s(static_cast<std::size_t>(rows) * lds, 2.0f);
        d.template scale_key_major<Ops>(0, 1, q0, nr, k0, cb, ce, s.data(), lds);
        for (int c = 0; c < rows; ++c)
          for (int r = 0; r < lds; ++r) {
            const bool inside = c >= cb && c < ce && r < nr;
            const float expect = inside ? 2.0f * weight(0, 1, q0 + r, k0 + c) : 2.0f;
            EXPECT_EQ(s[static_cast<std::size_t>(c) * lds + r], expect)
                << "k0 " << k0 << " nr " << nr << " key " << c << " row " << r;
          }
      }
}

TEST(Dropout, BatchedWalksWeighEachElementByItsOwnWord) {
  check_walks<kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, float>>();
}

TEST(Dropout, PortableBatchedWalksWeighEachElementByItsOwnWord) {
  check_walks<kfa::backends::PortableTileOps<float>>();
}

// kept, kept_pair and kept4 (the register-resident CUDA kernels' verdicts: an element, a pair
// of neighbouring columns, a group of four): each element by its own word, at every offset in
// a group of four keys, the pair straddling two groups included (odd key origins).
TEST(Dropout, ElementsAndPairsAreKeptByTheirOwnWords) {
  int kept = 0, dropped = 0, straddling = 0;
  for (int k_origin : {0, 1, 6, 7}) {
    kfa::impl::Origin at;
    at.q = 5;
    at.k = k_origin;
    at.b = 1;
    const auto d = kfa::impl::make_dropout<float>(dropout(0.3, 7, 2), at);
    for (int i : {0, 9})
      for (int j = 0; j < 40; ++j) {
        const unsigned pair = d.kept_pair(0, 2, i, j);
        bool want[2];
        for (int u = 0; u < 2; ++u) {
          const int jg = k_origin + j + u;
          const auto r = d.words(0, 2, at.q + i, jg >> 2);
          want[u] = r.w[jg & 3] >= d.threshold;
          kept += want[u];
          dropped += !want[u];
        }
        straddling += (k_origin + j) % 4 == 3;
        EXPECT_EQ(d.kept(0, 2, i, j), want[0])
            << "origin " << k_origin << " row " << i << " key " << j;
        EXPECT_EQ(pair, (want[0] ? 1u : 0u) | (want[1] ? 2u : 0u))
            << "origin " << k_origin << " row " << i << " key " << j;
        if ((k_origin + j) % 4 == 0) {  // a group of four starts at j
          unsigned four = 0;
          for (int u = 0; u < 4; ++u)
            four |= (d.kept(0, 2, i, j + u) ? 1u : 0u) << u;
          EXPECT_EQ(d.kept4(0, 2, i, j), four) << "origin " << k_origin << " row " << i;
        }
      }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(dropped, 0);
  EXPECT_GT(straddling, 0);
}

double kept_fraction(const Keep4& keep) {
  std::size_t kept = 0;
  for (std::size_t e = 0; e < keep.span(); ++e)
    kept += keep.data()[e];
  return double(kept) / double(keep.span());
}

double differing_fraction(const Keep4& a, const Keep4& b) {
  std::size_t diff = 0;
  for (std::size_t e = 0; e < a.span(); ++e)
    diff += a.data()[e] != b.data()[e];
  return double(diff) / double(a.span());
}

// 2 x 3 x 257 x 1031 = 1.6 million elements: the binomial standard deviation of the kept
// fraction is below 4e-4, so 0.01 is 25 sigma for a correct generator and a real test of a
// biased threshold or a broken bit split.
TEST(Dropout, KeptFractionIsOneMinusP) {
  const Shape s{2, 3, 3, 257, 1031, 16};
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    const auto keep = keep_mask(s, dropout(p, 42));
    if (p == 0) continue;  // keep_mask is empty: nothing dropped, checked below
    EXPECT_NEAR(kept_fraction(keep), 1 - p, 0.01) << "p = " << p;
  }
  // dropout = 0: kfa::dropout_mask keeps everything.
  View4<std::uint8_t> all("all", 1, 2, 33, 65);
  kfa::dropout_mask(Exec(), all, dropout(0, 42));
  Keep4 h("h", 1, 2, 33, 65);
  Kokkos::deep_copy(h, all);
  EXPECT_EQ(kept_fraction(h), 1.0);
}

// The mask is a function of (seed, offset, b, h, i, j): the same pair gives the same bits on
// every call, in any layout, and for any enclosing shape (what lets a rank that holds part of
// the sequence regenerate its block of the global mask).
TEST(Dropout, SameSeedAndOffsetGiveTheSameMaskForAnyShapeAndLayout) {
  const kfa::Params p = dropout(0.3, 7, 11);
  const Shape big{2, 3, 3, 100, 301, 16};
  const auto a = keep_mask(big, p), b = keep_mask(big, p);
  EXPECT_EQ(differing_fraction(a, b), 0.0);

  Kokkos::View<std::uint8_t****, Kokkos::LayoutLeft, Device> left("left", 1, 2, 9, 23);
  kfa::dropout_mask(Exec(), left, p);
  auto lh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), left);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 9; ++i)
      for (int j = 0; j < 23; ++j)
        ASSERT_EQ(lh(0, h, i, j), a(0, h, i, j)) << "h=" << h << " i=" << i << " j=" << j;
}

// A different seed or offset gives an unrelated mask: about 2 p (1 - p) of the elements
// differ, as for independent masks. So do different heads, batches and rows of one mask
// (each position has its own counter).
TEST(Dropout, DifferentSeedOffsetOrPositionGivesAnUnrelatedMask) {
  const double p = 0.5, expect = 2 * p * (1 - p);
  const Shape s{2, 2, 2, 64, 512, 16};
  const auto base = keep_mask(s, dropout(p, 1, 0));
  for (const auto& other :
       {dropout(p, 2, 0), dropout(p, 1, 1), dropout(p, 1ULL << 32, 0), dropout(p, 1, 1ULL << 32)}) {
    SCOPED_TRACE(::testing::Message() << "seed " << other.seed << " offset " << other.offset);
    EXPECT_NEAR(differing_fraction(base, keep_mask(s, other)), expect, 0.02);
  }
  // Slices of one mask: head 0 vs head 1, batch 0 vs batch 1, row i vs row i + 1, keys j vs
  // j + 4 (the next Philox call).
  std::size_t n = 0, diff_h = 0, diff_b = 0, diff_i = 0, diff_j = 0;
  for (int i = 0; i + 1 < 64; ++i)
    for (int j = 0; j + 4 < 512; ++j) {
      ++n;
      diff_h += base(0, 0, i, j) != base(0, 1, i, j);
      diff_b += base(0, 0, i, j) != base(1, 0, i, j);
      diff_i += base(0, 0, i, j) != base(0, 0, i + 1, j);
      diff_j += base(0, 0, i, j) != base(0, 0, i, j + 4);
    }
  for (std::size_t d : {diff_h, diff_b, diff_i, diff_j})
    EXPECT_NEAR(double(d) / double(n), expect, 0.03);
}

// Reads back the mask a kernel applied. Forward with V = identity (seqlen_k <= head_dim):
// O(i, j) = P_ij Z_ij / (sum), zero exactly where dropped (P > 0 for these inputs). Backward
// with dO = identity (seqlen_q <= head_dim) and one query head per kv head:
// dV(j, i) = P_ij Z_ij, zero exactly where dropped.
Keep4 forward_applied_mask(const Shape& s, const kfa::Params& p) {
  Problem pb(s, seed_of(s, 77));
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_k; ++h)
      for (int j = 0; j < s.seqlen_k; ++j)
        for (int d = 0; d < s.head_dim; ++d)
          pb.v(b, h, j, d) = j == d ? 1.0 : 0.0;
  const auto out = run_forward<float>(pb, p);
  Keep4 keep("applied", s.batch, s.heads_q, s.seqlen_q, s.seqlen_k);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)
        for (int j = 0; j < s.seqlen_k; ++j)
          keep(b, h, i, j) = out.o(b, h, i, j) != 0.0;
  return keep;
}

Keep4 backward_applied_mask(const Shape& s, const kfa::Params& p) {
  Problem pb(s, seed_of(s, 78));
  Tensor4 dout("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)
        dout(b, h, i, i) = 1.0;
  const auto g = run_backward<float>(pb, p, dout);
  Keep4 keep("applied", s.batch, s.heads_q, s.seqlen_q, s.seqlen_k);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)
        for (int j = 0; j < s.seqlen_k; ++j)
          keep(b, h, i, j) = g.dv(b, h, j, i) != 0.0;
  return keep;
}

// The kernels use the materialised mask bit for bit, whatever their tiles (head_dim 128: 64 x
// 64 forward tiles and 64-row backward tiles; head_dim 256: 32-key forward tiles and 32-row
// backward tiles), split count and dQ strategy.
TEST(Dropout, KernelsApplyTheMaterialisedMaskAtEveryTileShapeAndSplitCount) {
  for (const Shape& s : {Shape{2, 2, 2, 100, 128, 128}, Shape{1, 3, 3, 70, 250, 256}}) {
    for (std::uint64_t offset : {0, 5}) {
      const kfa::Params p = dropout(0.4, 1234, offset);
      const auto expect = keep_mask(s, p);
      for (int splits : {1, 2, 3, 0}) {
        kfa::Params ps = p;
        ps.num_splits = splits;
        SCOPED_TRACE(::testing::Message() << s << " " << describe(ps));
        EXPECT_EQ(differing_fraction(forward_applied_mask(s, ps), expect), 0.0);
      }
      for (bool det : {false, true}) {
        kfa::Params pd = p;
        pd.deterministic = det;
        SCOPED_TRACE(::testing::Message() << s << " " << describe(pd) << " deterministic=" << det);
        EXPECT_EQ(differing_fraction(backward_applied_mask(s, pd), expect), 0.0);
      }
    }
  }
}

// LSE is the undropped softmax's: dropout comes after the row statistics.
TEST(Dropout, LseDoesNotDependOnDropout) {
  const Shape s{1, 2, 1, 77, 300, 64};
  Problem pb(s, seed_of(s, 3));
  const auto plain = run_forward<float>(pb, {});
  const auto dropped = run_forward<float>(pb, dropout(0.5, 9));
  EXPECT_EQ(kfa::reference::max_abs_diff(plain.lse, dropped.lse), 0.0);
  EXPECT_GT(kfa::reference::max_abs_diff(plain.o, dropped.o), 0.0);
}

// Forward and backward against the reference fed with the materialised mask: masks of
// docs/testing.md (causal in both alignments, windows, softcap), GQA, fully masked rows
// (bottom-right causal with seqlen_q > seqlen_k), split-KV, both dQ strategies, dlse.
class DropoutMatrix : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(DropoutMatrix, ForwardAndBackwardMatchReference) {
  const auto [mi, n] = GetParam();
  const auto all = masks();
  const int pick[] = {0, 1, 2, 5, 9};  // none, causal (both), window both sides, softcap+causal
  const kfa::Params m = all[pick[mi]];
  const Shape s{2, 4, 2, n.first, n.second, 64};
  for (double p : {0.2, 0.7}) {
    const kfa::Params pd = dropout(p, 2024 + mi, 3, m);
    check_case<float>(s, pd, mi);
    check_case<double>(s, pd, mi);
    kfa::Params split = pd;
    split.num_splits = 3;
    check_case<float>(s, split, mi);
    kfa::Params det = pd;
    det.deterministic = true;
    check_backward_case<float>(s, pd, false, mi);
    check_backward_case<float>(s, det, true, mi);
    check_backward_case<double>(s, pd, true, mi);
    check_backward_case<double>(s, det, false, mi);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, DropoutMatrix,
    ::testing::Combine(::testing::Range(0, 5),
                       ::testing::Values(std::pair{1, 239}, std::pair{17, 17}, std::pair{113, 203},
                                         std::pair{203, 113}, std::pair{128, 217})));

// Bad input: dropout outside [0, 1) in the materialiser; the reference refuses to guess a
// mask it was not given.
TEST(Dropout, BadInput) {
  View4<std::uint8_t> keep("keep", 1, 1, 4, 4);
  for (double p : {1.0, -0.1, std::nan("")}) {
    try {
      kfa::dropout_mask(Exec(), keep, dropout(p, 1));
      ADD_FAILURE() << "no kfa::Error for dropout = " << p;
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout must be in [0, 1)"), std::string::npos)
          << e.what();
    }
  }
  const Shape s{1, 1, 1, 4, 5, 16};
  Problem pb(s, 1);
  Tensor4 o("o", 1, 1, 4, 16);
  Tensor3 lse("lse", 1, 1, 4);
  try {
    kfa::reference::forward<double>(pb.q, pb.k, pb.v, dropout(0.5, 1), o, lse);
    ADD_FAILURE() << "the reference ran dropout without a mask";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep-mask"), std::string::npos) << e.what();
  }
}

}  // namespace
