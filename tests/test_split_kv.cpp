// Split-KV forward: any number of key chunks per query tile, merged with the combiner, equals
// the double-precision reference within the tolerance rule and the unsplit forward within
// rounding; masks, GQA/MQA, a single query, empty chunks and fully masked rows; the heuristic.
#include <kfa/impl/split_kv.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "problem.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

kfa::Params with_splits(kfa::Params p, int n) {
  p.num_splits = n;
  return p;
}

// 17 whole key tiles and a partial one (1100 keys at 64-key tiles, 2188 at the host's 128):
// every k = 1..17 gives chunks of one or two tiles with a remainder, and 17 queries are one
// partial query tile.
TEST(SplitKV, EveryChunkCountMatchesReferenceAndUnsplit) {
  const int bc = kfa::backends::TileTraits<Exec, float>::block_k(64);
  const Shape s{1, 2, 1, 17, 17 * bc + 12, 64};
  Problem pb(s, seed_of(s, 5));
  const auto unsplit = run_forward<float>(pb, with_splits({}, 1));
  for (int k = 1; k <= 17; ++k) {
    SCOPED_TRACE(::testing::Message() << "splits=" << k);
    check_case<float>(s, with_splits({}, k), 5);
    check_case<double>(s, with_splits({}, k), 5);
    // Against the unsplit kernel: the two differ only by the order of float sums.
    const auto split = run_forward<float>(pb, with_splits({}, k));
    double omax = 0;
    for (std::size_t e = 0; e < unsplit.o.span(); ++e)
      omax = std::max(omax, std::fabs(unsplit.o.data()[e]));
    EXPECT_LE(ref::max_abs_diff(split.o, unsplit.o),
              64 * std::numeric_limits<float>::epsilon() * std::max(1.0, omax));
    EXPECT_LE(ref::max_abs_diff(split.lse, unsplit.lse),
              64 * std::numeric_limits<float>::epsilon() * 10);
  }
}

// Masks cut the visible tiles per query tile, so chunks differ in length and some are empty
// (the combiner's identity at work); seqlen_q = 1 is the decoding shape.
TEST(SplitKV, MasksGroupsAndSingleQuery) {
  std::vector<kfa::Params> masks(6);
  masks[1].causal = true;
  masks[2].causal = true;
  masks[2].align = kfa::Align::top_left;
  masks[3].window_left = 150;
  masks[3].window_right = 40;
  masks[4].softcap = 3.0;
  masks[5].causal = true;
  masks[5].window_left = 300;
  for (const auto& m : masks)
    for (int splits : {3, 7, 16})
      for (const Shape& s : {Shape{2, 4, 2, 70, 900, 64}, Shape{1, 4, 1, 1, 1500, 128},
                             Shape{1, 3, 3, 130, 400, 40}}) {
        check_case<float>(s, with_splits(m, splits), splits);
        if (splits == 7) check_case<double>(s, with_splits(m, splits), splits);
      }
}

// v with a head dim of its own: the partials and the merge carry Dv columns.
TEST(SplitKV, ValueHeadDimOfItsOwn) {
  const auto ms = masks();
  for (const auto& [d, dv] : kValueHeadDims)
    for (int mi : {0, 1, 5, 8})
      for (int splits : {1, 3, 8}) {
        check_case<float>({2, 4, 2, 5, 700, d, dv}, with_splits(ms[mi], splits), mi);
        check_case<double>({1, 2, 1, 70, 500, d, dv}, with_splits(ms[mi], splits), mi);
      }
}

// Rows that see no key get O = 0 and LSE = -inf through the merge too.
TEST(SplitKV, FullyMaskedRows) {
  kfa::Params p;  // bottom-right causal with seqlen_q > seqlen_k: the first 60 rows see nothing
  p.causal = true;
  p.num_splits = 5;
  Problem pb({1, 2, 1, 360, 300, 32}, 91);
  auto out = run_forward<float>(pb, p);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 60; ++i) {
      EXPECT_EQ(out.lse(0, h, i), -std::numeric_limits<double>::infinity()) << "row " << i;
      for (int d = 0; d < 32; ++d)
        ASSERT_EQ(out.o(0, h, i, d), 0.0) << "row " << i;
    }
  check_case<float>(pb.shape, p);
}

TEST(SplitKV, BitwiseRepeatable) {
  Problem pb({1, 2, 1, 5, 2000, 64}, 17);
  const auto p = with_splits({}, 9);
  auto a = run_forward<float>(pb, p);
  auto b = run_forward<float>(pb, p);
  EXPECT_EQ(ref::max_abs_diff(a.o, b.o), 0.0);
  EXPECT_EQ(ref::max_abs_diff(a.lse, b.lse), 0.0);
}

// More splits than key tiles is capped, and the automatic choice is correct whatever it is.
TEST(SplitKV, ForcedBeyondKeyTilesAndAutomatic) {
  check_case<float>({1, 1, 1, 4, 100, 32}, with_splits({}, 1000));
  check_case<float>({1, 2, 1, 1, 5000, 64}, with_splits({}, 0));
}

TEST(SplitKV, HeuristicFillsIdleTeamsOnly) {
  using kfa::impl::choose_splits;
  // Already as many teams as slots: never split.
  EXPECT_EQ(choose_splits(64, 4096, 64), 1);
  EXPECT_EQ(choose_splits(1000, 4096, 2), 1);
  EXPECT_EQ(choose_splits(32, 4096, 1), 1);  // one slot (Serial)
  // Decoding on a wide device: enough splits to fill the slots, capped.
  EXPECT_EQ(choose_splits(32, 4096, 1056), 33);
  EXPECT_EQ(choose_splits(1, 100000, 100000), kfa::impl::max_auto_splits);
  // Too few key tiles to share: every split keeps min_tiles_per_split tiles.
  EXPECT_EQ(choose_splits(2, 8, 64), 8 / kfa::impl::min_tiles_per_split);
  EXPECT_EQ(choose_splits(2, 3, 64), 1);
}

TEST(SplitKV, ChunksCoverTheTilesOnce) {
  for (int tiles : {0, 1, 5, 18, 64})
    for (int splits = 1; splits <= 20; ++splits) {
      int next = 3;  // first tile
      for (int sp = 0; sp < splits; ++sp) {
        int begin = 0, count = 0;
        kfa::impl::split_range(3, tiles, splits, sp, begin, count);
        EXPECT_EQ(begin, next) << tiles << " tiles, split " << sp << " of " << splits;
        EXPECT_GE(count, tiles / splits);
        EXPECT_LE(count, tiles / splits + 1);
        next = begin + count;
      }
      EXPECT_EQ(next, 3 + tiles);
    }
}

TEST(SplitKV, NegativeSplitsIsAnError) {
  Problem pb({1, 1, 1, 4, 8, 16}, 1);
  try {
    run_forward<float>(pb, with_splits({}, -2));
    FAIL() << "no error";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_splits"), std::string::npos) << e.what();
  }
}

}  // namespace
