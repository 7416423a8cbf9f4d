// kfa::msa (multi-scale attention) forward and backward against kfa::reference's msa_forward and
// msa_backward, with the tolerance rule: both regimes of the clamp, decay masks with causal,
// zero mask rows, windows, GQA/MQA, odd head dims, split-KV, both dQ modes, 16-bit types, and
// the argument checks. Built three times: on the space's tile code (the host's key-major
// forward), on the portable tile code (test_multiscale_portable: the device backends'
// query-major forward) and on the portable tile code with key-major scores
// (test_multiscale_portable_key_major: the portable column operations of the key-major
// multi-scale step, teams of two threads where the space has threads).
#ifdef KFA_TEST_KEY_MAJOR_SCORES
#include "portable_traits.hpp"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "msa_mask.hpp"
#include "problem.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;
using ref::Mask3;
using namespace kfa_test::msa;

#ifdef KFA_TEST_KEY_MAJOR_SCORES
static_assert(kfa::backends::TileTraits<Exec, float>::key_major_scores &&
                  std::is_base_of_v<kfa::backends::PortableTileOps<float>,
                                    kfa::backends::TileOps<Exec, float>>,
              "test_multiscale_portable_key_major must run the portable key-major forward");
#endif

template <class T>
struct Run {
  Tensor4 o, dq, dk, dv;
  Tensor3 rsum;
};

// kfa::msa::forward (and backward when dout is non-empty) in precision T, outputs poisoned.
template <class T>
Run<T> run(const Problem& pb, const Mask3& mask, const kfa::msa::Params& p,
           const Tensor4& dout = {}) {
  const auto& s = pb.shape;
  auto q = to_device<T>(pb.q);
  auto k = to_device<T>(pb.k);
  auto v = to_device<T>(pb.v);
  View4<T> o("o", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  View3<lse_t<T>> rsum("rsum", s.batch, s.heads_q, s.seqlen_q);
  Kokkos::deep_copy(o, quiet_nan<T>());
  Kokkos::deep_copy(rsum, quiet_nan<lse_t<T>>());
  const bool has_mask = mask.span() > 0;
  Mask3Dev<T> m = has_mask ? mask_to_device<T>(mask) : Mask3Dev<T>();
  if (has_mask)
    kfa::msa::forward(Exec(), q, k, v, m, o, rsum, p);
  else
    kfa::msa::forward(Exec(), q, k, v, o, rsum, p);
  Run<T> out;
  if (dout.span() > 0) {
    auto dodev = to_device<T>(dout);
    View4<T> dq("dq", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
        dk("dk", s.batch, s.heads_k, s.seqlen_k, s.head_dim),
        dv("dv", s.batch, s.heads_k, s.seqlen_k, s.head_dim);
    for (const auto& g : {dq, dk, dv})
      Kokkos::deep_copy(g, quiet_nan<T>());
    if (has_mask)
      kfa::msa::backward(Exec(), q, k, v, m, o, rsum, dodev, dq, dk, dv, p);
    else
      kfa::msa::backward(Exec(), q, k, v, o, rsum, dodev, dq, dk, dv, p);
    out.dq = to_host<Tensor4>(dq, "dq");
    out.dk = to_host<Tensor4>(dk, "dk");
    out.dv = to_host<Tensor4>(dv, "dv");
  }
  Kokkos::fence();
  out.o = to_host<Tensor4>(o, "o");
  out.rsum = to_host<Tensor3>(rsum, "rsum");
  return out;
}

// Runs case c in precision T, forward and backward, and applies the rule to O, r, dQ, dK, dV.
// With `regimes`, asserts that at least 20 % of the rows have r < 1 and 20 % r > 1.
template <class T>
void check(const Case& c, int salt = 0, bool regimes = false) {
  const std::uint64_t seed = seed_of(c.shape, salt);
  SCOPED_TRACE(::testing::Message()
               << c.shape << " " << describe(c) << " seed=" << seed << " " << type_name<T>());
  Problem pb(c.shape, seed);
  pb.rounded<T>();
  const Mask3 mask = make_mask<T>(c, pb, seed);
  std::mt19937_64 gen(seed + 1);
  Tensor4 dout = random_tensor("dout", c.shape.batch, c.shape.heads_q, c.shape.seqlen_q,
                               c.shape.head_dim, gen);
  round_to<T>(dout);
  const auto out = run<T>(pb, mask, c.p, dout);
  ASSERT_TRUE(all_written(out.o) && all_written(out.rsum));
  ASSERT_TRUE(all_written(out.dq) && all_written(out.dk) && all_written(out.dv));
  if (regimes) {
    Tensor4 o(std::string("o"), c.shape.batch, c.shape.heads_q, c.shape.seqlen_q, c.shape.head_dim);
    Tensor3 r(std::string("r"), c.shape.batch, c.shape.heads_q, c.shape.seqlen_q);
    ref::msa_forward<double>(pb.q, pb.k, pb.v, mask, c.p, o, r);
    std::size_t below = 0, above = 0;
    for (std::size_t e = 0; e < r.span(); ++e)
      (r.data()[e] < 1 ? below : above) += r.data()[e] != 1;
    EXPECT_GE(below * 5, r.span()) << below << " of " << r.span() << " rows with r < 1";
    EXPECT_GE(above * 5, r.span()) << above << " of " << r.span() << " rows with r > 1";
  }
  const auto f = ref::msa_check_forward<T>(pb.q, pb.k, pb.v, mask, c.p, out.o, out.rsum);
  EXPECT_TRUE(f.o.ok()) << "O: err " << f.o.err << " > bound " << f.o.bound << " (naive "
                        << f.o.naive_err << ")";
  EXPECT_TRUE(f.lse.ok()) << "rsum: err " << f.lse.err << " > bound " << f.lse.bound << " (naive "
                          << f.lse.naive_err << ")";
  const auto b =
      ref::msa_check_backward<T>(pb.q, pb.k, pb.v, mask, c.p, dout, out.dq, out.dk, out.dv);
  EXPECT_TRUE(b.dq.ok()) << "dQ: err " << b.dq.err << " > bound " << b.dq.bound << " (naive "
                         << b.dq.naive_err << ")";
  EXPECT_TRUE(b.dk.ok()) << "dK: err " << b.dk.err << " > bound " << b.dk.bound << " (naive "
                         << b.dk.naive_err << ")";
  EXPECT_TRUE(b.dv.ok()) << "dV: err " << b.dv.err << " > bound " << b.dv.bound << " (naive "
                         << b.dv.naive_err << ")";
}

kfa::msa::Params params(bool causal = false, kfa::Align a = kfa::Align::bottom_right, int wl = -1,
                        int wr = -1) {
  kfa::msa::Params p;
  p.causal = causal;
  p.align = a;
  p.window_left = wl;
  p.window_right = wr;
  return p;
}

// Both clamp regimes on a dense mask, across head dims (odd ones included) and GQA/MQA, in both
// dQ modes.
TEST(MultiScale, DenseMaskBothRegimesDouble) {
  for (bool det : {false, true})
    for (const Shape& s :
         {Shape{1, 2, 2, 33, 47, 16}, Shape{2, 4, 2, 70, 65, 64}, Shape{1, 4, 1, 65, 130, 128},
          Shape{1, 2, 1, 19, 23, 17}, Shape{1, 1, 1, 40, 81, 33}}) {
      Case c{s, params()};
      c.p.deterministic = det;
      check<double>(c, 0, true);
    }
}

TEST(MultiScale, DenseMaskBothRegimesFloat) {
  for (bool det : {false, true})
    for (const Shape& s : {Shape{1, 4, 2, 70, 65, 64}, Shape{1, 2, 1, 19, 23, 17}}) {
      Case c{s, params()};
      c.p.deterministic = det;
      check<float>(c, 1, true);
    }
}

// The one-kernel backward (DqMode::symmetric) on self-attention shapes, dense mask and causal.
TEST(MultiScale, SymmetricBackward) {
  for (bool causal : {false, true})
    for (const Shape& s : {Shape{1, 2, 2, 70, 70, 64}, Shape{2, 1, 1, 33, 33, 17}}) {
      Case c{s, params(causal)};
      c.p.dq_mode = kfa::DqMode::symmetric;
      check<double>(c, 3, true);
      check<float>(c, 3, true);
    }
}

TEST(MultiScale, SixteenBit) {
  const Case c{{1, 4, 2, 45, 70, 32}, params(true)};
  check<kfa::bf16>(c, 2);
  check<kfa::half>(c, 2);
}

// Decay masks gamma^(i - j) with causal (Nq = Nk, so both alignments agree), one gamma per head.
TEST(MultiScale, DecayMasksCausal) {
  for (double g : {0.5, 0.9, 0.99})
    for (auto a : {kfa::Align::bottom_right, kfa::Align::top_left}) {
      Case c{{1, 2, 1, 90, 90, 32}, params(true, a), MaskKind::decay, {g}};
      check<double>(c, 3);
      check<float>(c, 3);
    }
}

// Causal and windows with Nq != Nk in both alignments, scale != 1, no mask and a mask.
TEST(MultiScale, MasksAndAlignments) {
  const auto br = kfa::Align::bottom_right, tl = kfa::Align::top_left;
  for (const auto& p : {params(true, br), params(true, tl), params(false, br, 20, 3),
                        params(false, tl, 0, 0), params(true, br, 30, -1)})
    for (const Shape& s : {Shape{1, 2, 1, 50, 130, 24}, Shape{1, 2, 2, 130, 50, 24}}) {
      Case c{s, p};
      c.p.scale = 0.3;
      check<double>(c, 4);
      c.kind = MaskKind::none;
      check<double>(c, 5);
    }
}

// A row whose mask is all zero: r = 0, O = 0, finite gradients (checked against the reference).
TEST(MultiScale, ZeroMaskRows) {
  Case c{{1, 2, 1, 20, 30, 16}, params(), MaskKind::dense, {}, 6};
  check<double>(c, 6);
  c.p.deterministic = true;
  check<double>(c, 6);
  Problem pb(c.shape, 1);
  const Mask3 m = make_mask<double>(c, pb, 1);
  const auto out = run<double>(pb, m, c.p);
  for (int z = 0; z < c.zero_rows; ++z) {
    const int h = z % c.shape.heads_q, i = (z * 7) % c.shape.seqlen_q;
    EXPECT_EQ(out.rsum(0, h, i), 0.0);
    for (int d = 0; d < c.shape.head_dim; ++d)
      EXPECT_EQ(out.o(0, h, i, d), 0.0);
  }
}

// Split-KV: every split count 1..17 against the reference (the chunks merge by
// kfa::msa::combine_into), and within 64 ulp of the unsplit result.
TEST(MultiScale, SplitKv) {
  Case c{{1, 2, 1, 3, 1200, 32}, params()};
  const std::uint64_t seed = seed_of(c.shape, 7);
  for (bool causal : {false, true}) {
    c.p.causal = causal;
    Problem pb(c.shape, seed);
    const Mask3 m = make_mask<double>(c, pb, seed);
    Tensor4 o(std::string("o"), 1, 2, 3, 32);
    Tensor3 r(std::string("r"), 1, 2, 3);
    ref::msa_forward<double>(pb.q, pb.k, pb.v, m, c.p, o, r);
    for (int splits = 1; splits <= 17; ++splits) {
      c.p.num_splits = splits;
      const auto out = run<double>(pb, m, c.p);
      const auto f = ref::apply_rule<double>(out.o, out.o, o);
      const auto fr = ref::apply_rule<double>(out.rsum, out.rsum, r);
      EXPECT_TRUE(f.ok() && fr.ok())
          << "splits " << splits << " O err " << f.err << " r err " << fr.err;
    }
  }
}

// The deterministic backward is bitwise repeatable.
TEST(MultiScale, DeterministicBitwise) {
  Case c{{1, 4, 2, 70, 90, 32}, params(true)};
  c.p.deterministic = true;
  Problem pb(c.shape, 11);
  const Mask3 m = make_mask<float>(c, pb, 11);
  std::mt19937_64 gen(12);
  const Tensor4 dout = random_tensor("dout", 1, 4, 70, 32, gen);
  const auto first = run<float>(pb, m, c.p, dout);
  for (int rep = 0; rep < 20; ++rep) {
    const auto again = run<float>(pb, m, c.p, dout);
    for (const auto& [a, b] : {std::pair{first.dq, again.dq}, std::pair{first.dk, again.dk},
                               std::pair{first.dv, again.dv}})
      for (std::size_t e = 0; e < a.span(); ++e)
        ASSERT_EQ(a.data()[e], b.data()[e]) << a.label() << " element " << e << " run " << rep;
  }
}

// Bad arguments: a kfa::Error naming the mask's shape and the expected one, and the scale.
TEST(MultiScale, Validation) {
  View4<float> q("q", 1, 2, 8, 16), k("k", 1, 1, 10, 16), v("v", 1, 1, 10, 16), o("o", 1, 2, 8, 16);
  View3<float> rsum("rsum", 1, 2, 8), bad_rsum("rsum", 1, 2, 7);
  Mask3Dev<float> bad("mask", 2, 8, 9);
  try {
    kfa::msa::forward(Exec(), q, k, v, bad, o, rsum);
    FAIL() << "no error for a misshaped mask";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 8, 9)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2, 8, 10)"), std::string::npos) << e.what();
  }
  try {
    kfa::msa::forward(Exec(), q, k, v, o, bad_rsum);
    FAIL() << "no error for a misshaped rsum";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rsum"), std::string::npos) << e.what();
  }
  {  // v with a head dim of its own: refused here (kfa::forward takes it), both shapes named
    View4<float> v24("v", 1, 1, 10, 24), o24("o", 1, 2, 8, 24);
    try {
      kfa::msa::forward(Exec(), q, k, v24, o24, rsum);
      FAIL() << "no error for Dv != D";
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find("v is (1, 1, 10, 24) but q is (1, 2, 8, 16)"),
                std::string::npos)
          << e.what();
    }
  }
  kfa::msa::Params p;
  p.scale = std::nan("");
  EXPECT_THROW(kfa::msa::forward(Exec(), q, k, v, o, rsum, p), kfa::Error);
  p.scale = 1e300;  // not a float
  EXPECT_THROW(kfa::msa::forward(Exec(), q, k, v, o, rsum, p), kfa::Error);
}

}  // namespace
