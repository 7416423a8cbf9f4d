// Terms of the score (kfa/masks.hpp): ALiBi slopes, a dense bias with its gradient, a boolean
// visibility mask and key padding, against the double-precision reference
// (kfa::reference::Terms, which removes hidden keys rather than adding -inf) over the masks of
// docs/testing.md, GQA, split-KV, both dQ modes, dropout and a 16-bit type; dbias against
// central finite differences of the reference; rows that see no key; key padding against the
// reference on truncated keys; masks whose tiles hide every key, none or some; shape and range
// errors. Built also on the portable tiles in the key-major layout (test_bias_portable_key_major).
#ifdef KFA_TEST_KEY_MAJOR_SCORES
#include "portable_traits.hpp"
#endif

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "problem.hpp"
#include "terms.hpp"

namespace {

using namespace kfa_test;
namespace ref = kfa::reference;

template <class T>
struct Run {
  Tensor4 o;
  Tensor3 lse;
  Tensor4 dq, dk, dv, dbias;
};

/// kfa::forward with the term, then (with dout) kfa::backward with it and dlse when given,
/// every output poisoned with NaN beforehand; dbias is asked for when the term is a bias.
template <class T>
Run<T> run(const Problem& pb, const kfa::Params& p, const ref::Terms& t, const Tensor4& dout = {},
           const Tensor3& dlse = {}) {
  const auto& s = pb.shape;
  auto q = to_device<T>(pb.q), k = to_device<T>(pb.k), v = to_device<T>(pb.v);
  View4<T> o("o", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  View3<lse_t<T>> lse("lse", s.batch, s.heads_q, s.seqlen_q);
  Kokkos::deep_copy(o, quiet_nan<T>());
  Kokkos::deep_copy(lse, quiet_nan<lse_t<T>>());
  with_term<T>(t, {}, [&](const auto& term) { kfa::forward(Exec(), q, k, v, o, lse, p, term); });
  Run<T> r;
  if (dout.span() > 0) {
    auto dodev = to_device<T>(dout);
    View4<T> dq("dq", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
        dk("dk", s.batch, s.heads_k, s.seqlen_k, s.head_dim),
        dv("dv", s.batch, s.heads_k, s.seqlen_k, s.head_dim);
    for (const auto& g : {dq, dk, dv})
      Kokkos::deep_copy(g, quiet_nan<T>());
    View4<term_t<T>> db;
    if (t.bias.span() > 0) {
      db = View4<term_t<T>>("dbias", t.bias.extent(0), t.bias.extent(1), t.bias.extent(2),
                            t.bias.extent(3));
      Kokkos::deep_copy(db, quiet_nan<term_t<T>>());
    }
    with_term<T>(t, db, [&](const auto& term) {
      if (dlse.span() > 0) {
        View3<lse_t<T>> gl("dlse", s.batch, s.heads_q, s.seqlen_q);
        auto h = Kokkos::create_mirror_view(gl);
        for (std::size_t e = 0; e < h.span(); ++e)
          h.data()[e] = static_cast<lse_t<T>>(dlse.data()[e]);
        Kokkos::deep_copy(gl, h);
        kfa::backward(Exec(), q, k, v, o, lse, dodev, gl, dq, dk, dv, p, term);
      } else {
        kfa::backward(Exec(), q, k, v, o, lse, dodev, dq, dk, dv, p, term);
      }
    });
    Kokkos::fence();
    r.dq = to_host<Tensor4>(dq, "dq");
    r.dk = to_host<Tensor4>(dk, "dk");
    r.dv = to_host<Tensor4>(dv, "dv");
    if (db.span() > 0) r.dbias = to_host<Tensor4>(db, "dbias");
  }
  Kokkos::fence();
  r.o = to_host<Tensor4>(o, "o");
  r.lse = to_host<Tensor3>(lse, "lse");
  return r;
}

void expect_rule(const char* name, const ref::Check& c) {
  EXPECT_TRUE(c.ok()) << name << ": err " << c.err << " > bound " << c.bound
                      << " (naive same-precision err " << c.naive_err << ")";
}

/// Forward (and with `backward`, backward with dbias, and dlse when with_dlse) in precision T
/// with a term of `kind`, against the reference under the tolerance rule.
template <class T>
void check(const Shape& s, const kfa::Params& p, Kind kind, bool backward, bool with_dlse = false,
           int salt = 0) {
  const std::uint64_t seed = seed_of(s, salt + 77 * static_cast<int>(kind));
  SCOPED_TRACE(::testing::Message()
               << s << " " << describe(p) << " " << name_of(kind)
               << (p.deterministic ? " deterministic" : " atomic") << (with_dlse ? " dlse" : "")
               << " seed=" << seed << " " << type_name<T>());
  Problem pb(s, seed);
  pb.rounded<T>();
  std::mt19937_64 gen(seed + 1);
  const ref::Terms t = make_terms<T>(s, kind, gen);
  Tensor4 dout;
  Tensor3 dlse;
  if (backward) {
    dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
    round_to<T>(dout);
    if (with_dlse) dlse = random_dlse(s, gen);
  }
  const Run<T> r = run<T>(pb, p, t, dout, dlse);
  ASSERT_TRUE(all_written(r.o) && all_written(r.lse)) << "unwritten (NaN) outputs";
  const Keep4 keep = keep_mask(s, p);
  const auto f = ref::check_forward<T>(pb.q, pb.k, pb.v, p, r.o, r.lse, keep, t);
  expect_rule("O", f.o);
  expect_rule("LSE", f.lse);
  if (!backward) return;
  ASSERT_TRUE(all_written(r.dq) && all_written(r.dk) && all_written(r.dv))
      << "unwritten (NaN) gradients";
  const auto c = ref::check_backward<T>(pb.q, pb.k, pb.v, p, dout, dlse, r.dq, r.dk, r.dv, keep, t);
  expect_rule("dQ", c.dq);
  expect_rule("dK", c.dk);
  expect_rule("dV", c.dv);
  if (t.bias.span() > 0) {
    ASSERT_TRUE(all_written(r.dbias)) << "unwritten (NaN) dbias";
    expect_rule("dbias", ref::check_dbias<T>(pb.q, pb.k, pb.v, p, dout, dlse, r.dbias, keep, t));
  }
}

kfa::Params deterministic(kfa::Params p) {
  p.deterministic = true;
  return p;
}

kfa::Params with_splits(kfa::Params p, int n) {
  p.num_splits = n;
  return p;
}

// Every mask of docs/testing.md (causal in both alignments, windows, softcap) with ALiBi, a full
// bias, a full boolean mask and key padding, seqlen_q < seqlen_k and >, GQA; forward and
// backward in both dQ modes.
class TermMasks : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(TermMasks, FloatAndDouble) {
  const auto [mi, ki] = GetParam();
  const Kind kind = std::array<Kind, 4>{Kind::alibi, Kind::bias, Kind::dense, Kind::keypad}[ki];
  const kfa::Params p = masks()[mi];
  for (const Shape& s : {Shape{2, 4, 2, 70, 150, 32}, Shape{1, 2, 1, 150, 70, 64}}) {
    check<float>(s, p, kind, true, false, mi);
    check<float>(s, deterministic(p), kind, true, false, mi);
    check<double>(s, p, kind, true, true, mi);
    check<double>(s, deterministic(p), kind, true, false, mi);
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, TermMasks,
                         ::testing::Combine(::testing::Range(0, int(masks().size())),
                                            ::testing::Values(0, 1, 2, 3)));

// The one-kernel backward (DqMode::symmetric) with each term, dbias included: its (i, j) steps
// own dS(i, j), as the key-tile kernel does in the two-kernel path.
TEST(Terms, SymmetricBackward) {
  for (const kfa::Params& mask : masks()) {
    kfa::Params p = mask;
    p.dq_mode = kfa::DqMode::symmetric;
    for (Kind kind : {Kind::alibi, Kind::bias, Kind::bias_11, Kind::dense_1h, Kind::keypad}) {
      check<float>({1, 2, 2, 97, 97, 32}, p, kind, true);
      check<double>({2, 2, 2, 70, 70, 16}, p, kind, true, true);
    }
  }
}

// The broadcast extents of a bias: dbias is summed over the dimensions of extent 1.
TEST(Terms, BiasBroadcasts) {
  kfa::Params causal;
  causal.causal = true;
  for (Kind kind : {Kind::bias_1h, Kind::bias_b1, Kind::bias_11})
    for (const auto& p : {kfa::Params{}, causal, deterministic(causal)}) {
      check<float>({2, 4, 2, 40, 90, 16}, p, kind, true);
      check<double>({2, 4, 2, 90, 40, 16}, p, kind, true, true);
    }
}

// Split-KV: the term is read per key tile of each chunk.
TEST(Terms, SplitKV) {
  kfa::Params causal;
  causal.causal = true;
  for (Kind kind : {Kind::alibi, Kind::bias_1h, Kind::dense_11, Kind::keypad})
    for (int n : {1, 3, 7})
      for (const auto& p : {with_splits({}, n), with_splits(causal, n)}) {
        check<float>({1, 4, 2, 17, 700, 64}, p, kind, false);
        check<double>({kind == Kind::keypad ? 4 : 1, 2, 1, 5, 700, 40}, p, kind, false);
      }
}

// A bias of zeros gives the forward without a term, element for element (x + 0 = x): with no
// term the host's sweep takes each tile's column maxima from the score product
// (TileOps::gemm_col_max), with a term from a pass over S^T after it is added. The softmax is
// the same for any shift, so a wrong maximum would pass the tolerance rule; it would not pass
// this. float and bfloat16 (the pair products), several query and key tiles with edges,
// causal (interior tiles and edge tiles) and not.
// Every interval mask of the matrix without softcap (where a tile's edge S^T is computed by the
// groups of query rows that see each key, ForwardKernel::visible_key_rows; a bias takes the
// whole tile), queries fewer and more than keys.
TEST(Terms, ZeroBiasGivesThePlainForward) {
  std::vector<kfa::Params> interval;
  for (const auto& p : masks())
    if (p.softcap == 0) interval.push_back(p);
  const auto both = [&](auto type) {
    using T = decltype(type);
    for (const Shape& s :
         {Shape{1, 2, 2, 200, 700, 64}, Shape{1, 1, 1, 97, 300, 128}, Shape{1, 1, 1, 300, 97, 64}})
      for (const auto& p : interval) {
        SCOPED_TRACE(::testing::Message() << s << " " << describe(p) << " " << type_name<T>());
        Problem pb(s, seed_of(s, 5));
        pb.rounded<T>();
        ref::Terms zero;
        zero.bias = Tensor4("bias", 1, s.heads_q, s.seqlen_q, s.seqlen_k);  // zeros
        const auto with = run<T>(pb, p, zero);
        auto q = to_device<T>(pb.q), k = to_device<T>(pb.k), v = to_device<T>(pb.v);
        View4<T> o("o", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
        View3<lse_t<T>> lse("lse", s.batch, s.heads_q, s.seqlen_q);
        kfa::forward(Exec(), q, k, v, o, lse, p);
        Kokkos::fence();
        const auto o_plain = to_host<Tensor4>(o, "o");
        const auto lse_plain = to_host<Tensor3>(lse, "lse");
        ASSERT_TRUE(all_written(with.o) && all_written(with.lse));
        for (std::size_t e = 0; e < o_plain.span(); ++e)
          ASSERT_EQ(o_plain.data()[e], with.o.data()[e]) << "O at " << e;
        for (std::size_t e = 0; e < lse_plain.span(); ++e)
          ASSERT_EQ(lse_plain.data()[e], with.lse.data()[e]) << "LSE at " << e;
      }
  };
  both(float{});
  both(kfa::bf16{});
}

// A 16-bit type: the term is added in float, S rounded once as an unfused run stores it.
TEST(Terms, Bfloat16) {
  kfa::Params causal;
  causal.causal = true;
  for (Kind kind : {Kind::alibi, Kind::bias})
    for (const auto& p : {kfa::Params{}, causal, deterministic(causal)})
      check<kfa::bf16>({1, 2, 1, 40, 90, 64}, p, kind, true);
}

// Rows that see no key (bottom_right causal with seqlen_q > seqlen_k: the first rows): O = 0,
// LSE = -inf, and no gradient comes from them, dbias included.
TEST(Terms, FullyMaskedRows) {
  kfa::Params p;
  p.causal = true;
  const Shape s{1, 2, 1, 50, 20, 32};
  for (Kind kind : {Kind::alibi, Kind::bias}) {
    for (const auto& pp : {p, deterministic(p)}) {
      Problem pb(s, seed_of(s, 3));
      std::mt19937_64 gen(9);
      const auto t = make_terms<double>(s, kind, gen);
      const Tensor4 dout = random_tensor("dout", 1, 2, 50, 32, gen);
      const auto r = run<double>(pb, pp, t, dout);
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 30; ++i) {  // row i sees keys j <= i - 30
          EXPECT_EQ(r.lse(0, h, i), -std::numeric_limits<double>::infinity());
          for (int d = 0; d < 32; ++d) {
            EXPECT_EQ(r.o(0, h, i, d), 0.0);
            EXPECT_EQ(r.dq(0, h, i, d), 0.0);
          }
          if (kind != Kind::alibi) {
            for (int j = 0; j < 20; ++j)
              EXPECT_EQ(r.dbias(0, h, i, j), 0.0);
          }
        }
      check<double>(s, pp, kind, true);
    }
  }
}

// dbias is bitwise repeatable in both dQ modes, and the same in both.
TEST(Terms, DbiasIsDeterministic) {
  const Shape s{2, 4, 2, 70, 130, 32};
  Problem pb(s, seed_of(s, 11));
  std::mt19937_64 gen(5);
  const auto t = make_terms<float>(s, Kind::bias_1h, gen);
  const Tensor4 dout = random_tensor("dout", 2, 4, 70, 32, gen);
  const auto a = run<float>(pb, {}, t, dout), b = run<float>(pb, {}, t, dout);
  const auto c = run<float>(pb, deterministic({}), t, dout);
  EXPECT_EQ(ref::max_abs_diff(a.dbias, b.dbias), 0.0);
  EXPECT_EQ(ref::max_abs_diff(a.dbias, c.dbias), 0.0);
}

// dbias against central differences of the reference's loss L = sum dO . O + sum dlse LSE:
// an oracle for the gradient that does not go through either backward.
TEST(Terms, DbiasMatchesFiniteDifferences) {
  kfa::Params p;
  p.causal = true;
  p.softcap = 3.0;
  const Shape s{2, 2, 1, 7, 9, 8};
  Problem pb(s, seed_of(s, 21));
  std::mt19937_64 gen(2);
  ref::Terms t = make_terms<double>(s, Kind::bias_1h, gen);
  const Tensor4 dout = random_tensor("dout", 2, 2, 7, 8, gen);
  const Tensor3 dlse = random_dlse(s, gen);
  const auto r = run<double>(pb, p, t, dout, dlse);
  auto loss = [&]() {
    Tensor4 o("o", 2, 2, 7, 8);
    Tensor3 lse("lse", 2, 2, 7);
    ref::forward<double>(pb.q, pb.k, pb.v, p, o, lse, {}, t);
    double l = 0;
    for (std::size_t e = 0; e < o.span(); ++e)
      l += o.data()[e] * dout.data()[e];
    for (std::size_t e = 0; e < lse.span(); ++e)
      if (std::isfinite(lse.data()[e])) l += lse.data()[e] * dlse.data()[e];
    return l;
  };
  const double h = 1e-5;
  double worst = 0, scale = 0;
  for (std::size_t e = 0; e < t.bias.span(); ++e) {
    const double x = t.bias.data()[e];
    t.bias.data()[e] = x + h;
    const double up = loss();
    t.bias.data()[e] = x - h;
    const double down = loss();
    t.bias.data()[e] = x;
    const double fd = (up - down) / (2 * h);
    worst = std::max(worst, std::fabs(fd - r.dbias.data()[e]));
    scale = std::max(scale, std::fabs(fd));
  }
  EXPECT_GT(scale, 1e-2);  // the loss depends on the bias
  EXPECT_LE(worst, 1e-8 * std::max(1.0, scale));
}

// ALiBi's distance is measured from the masks' diagonal: under bottom_right the last query
// and the last key are at distance 0, so with equal keys a lone query's weights follow the
// slope from the end of the sequence. Checked with q = 0 (all scores 0): P_j proportional to
// exp(-slope |N_k - 1 - j|).
TEST(Terms, AlibiDistanceFollowsAlignment) {
  const Shape s{1, 1, 1, 1, 6, 16};
  Problem pb(s, 1);
  for (std::size_t e = 0; e < pb.q.span(); ++e)
    pb.q.data()[e] = 0;
  ref::Terms t;
  t.alibi = {0.5};
  for (kfa::Align a : {kfa::Align::bottom_right, kfa::Align::top_left}) {
    kfa::Params p;
    p.align = a;
    const auto r = run<double>(pb, p, t);
    const double shift = a == kfa::Align::bottom_right ? 5 : 0;
    double sum = 0;
    for (int j = 0; j < 6; ++j)
      sum += std::exp(-0.5 * std::fabs(j - shift));
    EXPECT_NEAR(r.lse(0, 0, 0), std::log(sum), 1e-14);
  }
}

// Shapes that do not fit are errors naming both shapes, before any launch.
TEST(Terms, ShapeErrors) {
  const Shape s{2, 4, 2, 10, 12, 16};
  Problem pb(s, 3);
  auto q = to_device<float>(pb.q), k = to_device<float>(pb.k), v = to_device<float>(pb.v);
  View4<float> o("o", 2, 4, 10, 16);
  View3<float> lse("lse", 2, 4, 10);
  auto message = [](const auto& f) {
    try {
      f();
    } catch (const kfa::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Kokkos::View<float*, Device> slopes("slopes", 3);
  EXPECT_NE(message([&] {
              kfa::forward(Exec(), q, k, v, o, lse, {}, kfa::masks::Alibi{slopes});
            }).find("alibi slopes has shape (3) but q has heads_q = 4"),
            std::string::npos);
  View4<float> bias("bias", 2, 3, 10, 12);
  EXPECT_NE(message([&] {
              kfa::forward(Exec(), q, k, v, o, lse, {}, kfa::masks::Bias{bias});
            }).find("bias has shape (2, 3, 10, 12) but q, k need (2 or 1, 4 or 1, 10, 12)"),
            std::string::npos);
  View4<float> good("bias", 1, 4, 10, 12), dbias("dbias", 2, 4, 10, 12);
  View4<float> dq("dq", 2, 4, 10, 16), dk("dk", 2, 2, 12, 16), dv("dv", 2, 2, 12, 16);
  EXPECT_NE(
      message([&] {
        kfa::backward(Exec(), q, k, v, o, lse, o, dq, dk, dv, {}, kfa::masks::Bias{good, dbias});
      }).find("dbias has shape (2, 4, 10, 12) but bias has shape (1, 4, 10, 12)"),
      std::string::npos);
}

// Dropout on top of a boolean mask and key padding: the keep-mask is drawn over every pair
// and applied to the visible ones; hidden keys stay excluded.
TEST(Visibility, WithDropout) {
  kfa::Params p;
  p.dropout = 0.3;
  p.seed = 1234;
  kfa::Params causal = p;
  causal.causal = true;
  for (Kind kind : {Kind::dense, Kind::keypad})
    for (const auto& pp : {p, causal, deterministic(causal)}) {
      check<float>({2, 4, 2, 70, 90, 32}, pp, kind, true);
      check<double>({4, 2, 1, 33, 65, 16}, pp, kind, true, true);
    }
}

// Boolean masks whose 64 x 128 blocks hide every key, show every key, or some (block_mask): the
// host forward skips the first, adds nothing for the second and adds the mask tile transposed
// for the third. Broadcast over batch or heads, lengths that are not multiples of the tile,
// GQA, with causal and window edges, softcap (applied before the term) and split-KV.
TEST(Visibility, TilesHiddenVisibleOrMixed) {
  kfa::Params causal;
  causal.causal = true;
  kfa::Params window;
  window.window_left = 70;
  window.window_right = 10;
  kfa::Params capped = causal;
  capped.softcap = 3.0;
  for (Kind kind : {Kind::blocks, Kind::blocks_1h, Kind::blocks_b1})
    for (const auto& p : {kfa::Params{}, causal, window, capped, with_splits({}, 3)}) {
      check<float>({2, 4, 2, 150, 200, 32}, p, kind, false);
      check<double>({2, 2, 1, 200, 150, 16}, p, kind, true, true);
    }
}

// A 16-bit type with a boolean mask: S of hidden keys is -inf, not a rounded large negative.
TEST(Visibility, Bfloat16) {
  kfa::Params causal;
  causal.causal = true;
  for (Kind kind : {Kind::dense_1h, Kind::keypad})
    for (const auto& p : {kfa::Params{}, causal})
      check<kfa::bf16>({4, 2, 1, 40, 90, 64}, p, kind, true);
}

// Rows that a boolean mask hides entirely (rows i = 2 mod 5), though the interval mask leaves
// them keys: O = 0, LSE = -inf, zero dQ, and no NaN anywhere, in both dQ modes, also with a
// softcap (whose chain rule multiplies the hidden elements' zero dS by a finite slope).
TEST(Visibility, FullyHiddenRows) {
  const Shape s{2, 2, 1, 23, 40, 16};
  kfa::Params capped;
  capped.softcap = 4.0;
  for (const auto& p : {kfa::Params{}, deterministic({}), capped}) {
    Problem pb(s, seed_of(s, 5));
    std::mt19937_64 gen(17);
    const auto t = make_terms<double>(s, Kind::dense, gen);
    const Tensor4 dout = random_tensor("dout", 2, 2, 23, 16, gen);
    const auto r = run<double>(pb, p, t, dout);
    for (const Tensor4* g : {&r.o, &r.dq, &r.dk, &r.dv})
      for (std::size_t e = 0; e < g->span(); ++e)
        ASSERT_TRUE(std::isfinite(g->data()[e]));
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h)
        for (int i = 2; i < 23; i += 5) {
          EXPECT_EQ(r.lse(b, h, i), -std::numeric_limits<double>::infinity());
          for (int d = 0; d < 16; ++d) {
            EXPECT_EQ(r.o(b, h, i, d), 0.0);
            EXPECT_EQ(r.dq(b, h, i, d), 0.0);
          }
        }
    check<double>(s, p, Kind::dense, true);
    check<float>(s, p, Kind::dense, true);
  }
}

// Key padding is attention over the first lengths[b] keys: each batch's outputs and gradients
// against the reference run on K and V truncated to its length (no padding term at all), and
// zero dK, dV past it; length 0 gives O = 0, LSE = -inf and zero gradients. Top-left alignment,
// whose masks do not move with seqlen_k, so that truncating keeps them.
TEST(Visibility, KeyPaddingIsTruncation) {
  const Shape s{4, 4, 2, 37, 75, 32};  // lengths 2/3 Nk, Nk, 1, 0 (make_terms)
  kfa::Params causal;
  causal.causal = true;
  causal.align = kfa::Align::top_left;
  kfa::Params window;
  window.align = kfa::Align::top_left;
  window.window_left = 9;
  window.window_right = 3;
  for (const auto& p : {kfa::Params{}, causal, window, deterministic(causal)}) {
    SCOPED_TRACE(describe(p));
    Problem pb(s, seed_of(s, 8));
    pb.rounded<float>();
    std::mt19937_64 gen(23);
    const auto t = make_terms<float>(s, Kind::keypad, gen);
    const Tensor4 dout = random_tensor("dout", 4, 4, 37, 32, gen);
    const auto r = run<float>(pb, p, t, dout);
    for (int b = 0; b < 4; ++b) {
      const int n = t.key_lengths[static_cast<std::size_t>(b)];
      SCOPED_TRACE(::testing::Message() << "batch " << b << " length " << n);
      const auto rows = [&](const Tensor4& x, int len) {
        Tensor4 y("slice", 1, x.extent(1), len, x.extent(3));
        for (int h = 0; h < int(x.extent(1)); ++h)
          for (int i = 0; i < len; ++i)
            for (int d = 0; d < int(x.extent(3)); ++d)
              y(0, h, i, d) = x(b, h, i, d);
        return y;
      };
      Tensor3 lse("lse", 1, 4, 37);
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < 37; ++i)
          lse(0, h, i) = r.lse(b, h, i);
      for (int h = 0; h < 2; ++h)
        for (int j = n; j < 75; ++j)
          for (int d = 0; d < 32; ++d) {
            ASSERT_EQ(r.dk(b, h, j, d), 0.0);
            ASSERT_EQ(r.dv(b, h, j, d), 0.0);
          }
      if (n == 0) {
        for (int h = 0; h < 4; ++h)
          for (int i = 0; i < 37; ++i) {
            EXPECT_EQ(lse(0, h, i), -std::numeric_limits<double>::infinity());
            for (int d = 0; d < 32; ++d) {
              EXPECT_EQ(r.o(b, h, i, d), 0.0);
              EXPECT_EQ(r.dq(b, h, i, d), 0.0);
            }
          }
        continue;
      }
      const Tensor4 q = rows(pb.q, 37), k = rows(pb.k, n), v = rows(pb.v, n);
      const auto f = ref::check_forward<float>(q, k, v, p, rows(r.o, 37), lse);
      expect_rule("O", f.o);
      expect_rule("LSE", f.lse);
      const auto c = ref::check_backward<float>(q, k, v, p, rows(dout, 37), {}, rows(r.dq, 37),
                                                rows(r.dk, n), rows(r.dv, n));
      expect_rule("dQ", c.dq);
      expect_rule("dK", c.dk);
      expect_rule("dV", c.dv);
    }
  }
}

// A mask or key lengths that do not fit q and k are errors naming both, before any launch.
TEST(Visibility, ShapeAndRangeErrors) {
  const Shape s{2, 4, 2, 10, 12, 16};
  Problem pb(s, 3);
  auto q = to_device<float>(pb.q), k = to_device<float>(pb.k), v = to_device<float>(pb.v);
  View4<float> o("o", 2, 4, 10, 16);
  View3<float> lse("lse", 2, 4, 10);
  auto message = [&](const auto& term) {
    try {
      kfa::forward(Exec(), q, k, v, o, lse, {}, term);
    } catch (const kfa::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  View4<std::uint8_t> mask("mask", 2, 4, 10, 11);
  EXPECT_NE(message(kfa::masks::Dense{mask})
                .find("mask has shape (2, 4, 10, 11) but q, k need (2 or 1, 4 or 1, 10, 12)"),
            std::string::npos);
  Kokkos::View<std::int32_t*, Device> three("key_lengths", 3);
  EXPECT_NE(
      message(kfa::masks::KeyPadding{three}).find("key_lengths has shape (3) but q has batch = 2"),
      std::string::npos);
  Kokkos::View<std::int32_t*, Device> len("key_lengths", 2);
  for (int bad : {-1, 13}) {
    Kokkos::deep_copy(Kokkos::subview(len, 1), bad);
    EXPECT_NE(
        message(kfa::masks::KeyPadding{len})
            .find("key_lengths(1) = " + std::to_string(bad) + " is outside [0, seqlen_k = 12]"),
        std::string::npos);
  }
}

}  // namespace
