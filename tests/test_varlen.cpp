// Packed variable-length batches (kfa::varlen): forward and backward against the float64
// reference run sequence by sequence, with lengths 0 and 1 and one long sequence among short
// ones, seqlen_q != seqlen_k, causal and window masks in both alignments, softcap, GQA,
// dropout (the padded batch's keep-mask; and bitwise the padded call where every sequence has
// the same lengths), every dQ mode, the LSE gradient; offsets that are not a partition refused
// before any kernel runs.
#include <kfa/varlen.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using kfa::reference::Packed3;
using kfa::reference::Tensor2;

template <class T>
using Packed = Kokkos::View<T***, Kokkos::LayoutRight, Device>;
template <class T>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight, Device>;
using Cu = Kokkos::View<std::int32_t*, Device>;

/// Offsets of the lengths: 0, n0, n0 + n1, ...
std::vector<int> offsets(const std::vector<int>& lens) {
  std::vector<int> c(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), c.begin() + 1);
  return c;
}

Cu to_device_cu(const std::vector<int>& c) {
  Cu d("cu", c.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t s = 0; s < c.size(); ++s)
    h(s) = c[s];
  Kokkos::deep_copy(d, h);
  return d;
}

/// A double host array (any rank) converted to T on the suite's space.
template <class Dev, class Host>
Dev to_space(const Host& src) {
  Dev dst(Kokkos::view_alloc(std::string("kfa_test::packed")), src.layout());
  auto h = Kokkos::create_mirror_view(dst);
  for (std::size_t e = 0; e < src.span(); ++e)
    h.data()[e] = static_cast<typename Dev::value_type>(src.data()[e]);
  Kokkos::deep_copy(dst, h);
  return dst;
}

Packed3 random_packed(const char* label, int total, int heads, int d, std::mt19937_64& gen) {
  Packed3 t(std::string(label), total, heads, d);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = dist(gen);
  return t;
}

struct VarlenProblem {
  int heads_q, heads_k, head_dim, head_dim_v;  // v's, o's, dout's and dv's Dv; q's and k's D
  std::vector<int> lens_q, lens_k, cu_q, cu_k;
  Packed3 q, k, v, dout;
  Tensor2 dlse;  // empty unless asked for

  VarlenProblem(std::vector<int> lq, std::vector<int> lk, int hq, int hk, int d, std::uint64_t seed,
                bool with_dlse = false, int dv = 0)
      : heads_q(hq),
        heads_k(hk),
        head_dim(d),
        head_dim_v(dv > 0 ? dv : d),
        lens_q(std::move(lq)),
        lens_k(std::move(lk)) {
    cu_q = offsets(lens_q);
    cu_k = offsets(lens_k);
    std::mt19937_64 gen(seed);
    q = random_packed("q", cu_q.back(), hq, d, gen);
    k = random_packed("k", cu_k.back(), hk, d, gen);
    v = random_packed("v", cu_k.back(), hk, head_dim_v, gen);
    dout = random_packed("dout", cu_q.back(), hq, head_dim_v, gen);
    if (with_dlse) {
      dlse = Tensor2("dlse", hq, cu_q.back());
      std::uniform_real_distribution<double> dist(-1, 1);
      for (std::size_t e = 0; e < dlse.span(); ++e)
        dlse.data()[e] = dist(gen);
    }
  }
  int batch() const { return static_cast<int>(lens_q.size()); }
  /// The padded batch (batch, heads, longest seqlen_q, longest seqlen_k).
  Shape padded() const {
    Shape s;
    s.batch = batch();
    s.heads_q = heads_q;
    s.heads_k = heads_k;
    s.seqlen_q = std::max(1, *std::max_element(lens_q.begin(), lens_q.end()));
    s.seqlen_k = std::max(1, *std::max_element(lens_k.begin(), lens_k.end()));
    s.head_dim = head_dim;
    s.head_dim_v = head_dim_v;
    return s;
  }
};

template <class T>
struct VarlenOut {
  Packed3 o;
  Tensor2 lse;
  Packed3 dq, dk, dv;
};

/// ALiBi slopes (heads_q of them, not the standard ones: a head's slope matters) on the space;
/// empty: none.
template <class T>
Kokkos::View<lse_t<T>*, Device> slopes_on_space(const std::vector<double>& alibi) {
  Kokkos::View<lse_t<T>*, Device> d("slopes", alibi.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < alibi.size(); ++i)
    h(i) = static_cast<lse_t<T>>(alibi[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

std::vector<double> some_slopes(int heads) {
  std::vector<double> s(static_cast<std::size_t>(heads));
  for (int h = 0; h < heads; ++h)
    s[static_cast<std::size_t>(h)] = 0.05 + 0.4 * h / heads;
  return s;
}

/// Calls f() or f(kfa::masks::Alibi{slopes}) as alibi is empty or not.
template <class T, class F>
void with_alibi(const std::vector<double>& alibi, const F& f) {
  if (alibi.empty())
    f();
  else
    f(kfa::masks::Alibi{slopes_on_space<T>(alibi)});
}

/// kfa::varlen::forward (and backward when asked) in precision T, outputs poisoned by NaN;
/// with ALiBi where alibi holds slopes.
template <class T>
VarlenOut<T> run(const VarlenProblem& pb, const kfa::Params& p, bool grads,
                 const std::vector<double>& alibi = {}) {
  const auto q = to_space<Packed<T>>(pb.q), k = to_space<Packed<T>>(pb.k),
             v = to_space<Packed<T>>(pb.v);
  const Cu cq = to_device_cu(pb.cu_q), ck = to_device_cu(pb.cu_k);
  Packed<T> o("o", q.extent(0), q.extent(1), v.extent(2));
  Rows<lse_t<T>> lse("lse", pb.heads_q, q.extent(0));
  Kokkos::deep_copy(o, quiet_nan<T>());
  Kokkos::deep_copy(lse, quiet_nan<lse_t<T>>());
  with_alibi<T>(alibi, [&](const auto&... term) {
    kfa::varlen::forward(Exec(), q, k, v, cq, ck, o, lse, p, term...);
  });
  VarlenOut<T> out;
  if (grads) {
    const auto dout = to_space<Packed<T>>(pb.dout);
    Packed<T> dq("dq", q.extent(0), q.extent(1), q.extent(2)),
        dk("dk", k.extent(0), k.extent(1), k.extent(2)),
        dv("dv", v.extent(0), v.extent(1), v.extent(2));
    for (const auto& g : {dq, dk, dv})
      Kokkos::deep_copy(g, quiet_nan<T>());
    with_alibi<T>(alibi, [&](const auto&... term) {
      if (pb.dlse.span() > 0) {
        const auto dlse = to_space<Rows<lse_t<T>>>(pb.dlse);
        kfa::varlen::backward(Exec(), q, k, v, o, lse, dout, dlse, cq, ck, dq, dk, dv, p, term...);
      } else {
        kfa::varlen::backward(Exec(), q, k, v, o, lse, dout, cq, ck, dq, dk, dv, p, term...);
      }
    });
    Kokkos::fence();
    out.dq = to_host<Packed3>(dq, "dq");
    out.dk = to_host<Packed3>(dk, "dk");
    out.dv = to_host<Packed3>(dv, "dv");
  }
  Kokkos::fence();
  out.o = to_host<Packed3>(o, "o");
  out.lse = to_host<Tensor2>(lse, "lse");
  return out;
}

/// Runs the pass(es) and checks them against the reference, sequence by sequence, fed with the
/// padded batch's keep-mask under dropout and the ALiBi slopes where alibi holds them.
template <class T>
void check(const VarlenProblem& pb, const kfa::Params& p, bool grads, const std::string& what,
           const std::vector<double>& alibi = {}) {
  SCOPED_TRACE(what);
  const auto out = run<T>(pb, p, grads, alibi);
  const Keep4 keep = keep_mask(pb.padded(), p);
  EXPECT_TRUE(all_written(out.o)) << "o";
  const auto fc = kfa::reference::varlen::check_forward<T>(pb.q, pb.k, pb.v, pb.cu_q, pb.cu_k, p,
                                                           out.o, out.lse, keep, alibi);
  EXPECT_TRUE(fc.o.ok()) << "o err " << fc.o.err << " bound " << fc.o.bound;
  EXPECT_TRUE(fc.lse.ok()) << "lse err " << fc.lse.err << " bound " << fc.lse.bound;
  if (!grads) return;
  EXPECT_TRUE(all_written(out.dq) && all_written(out.dk) && all_written(out.dv)) << "gradients";
  const auto bc = kfa::reference::varlen::check_backward<T>(
      pb.q, pb.k, pb.v, pb.cu_q, pb.cu_k, p, pb.dout, pb.dlse, out.dq, out.dk, out.dv, keep, alibi);
  EXPECT_TRUE(bc.dq.ok()) << "dq err " << bc.dq.err << " bound " << bc.dq.bound;
  EXPECT_TRUE(bc.dk.ok()) << "dk err " << bc.dk.err << " bound " << bc.dk.bound;
  EXPECT_TRUE(bc.dv.ok()) << "dv err " << bc.dv.err << " bound " << bc.dv.bound;
}

/// Lengths 0 and 1, seqlen_q != seqlen_k, a sequence with queries and no keys and one with keys
/// and no queries, and one long sequence among short ones.
VarlenProblem mixed(int hq, int hk, std::uint64_t seed, bool with_dlse = false, int dv = 0) {
  return VarlenProblem({3, 0, 1, 150, 5, 1, 9, 2}, {5, 4, 1, 131, 0, 1, 17, 0}, hq, hk, 24, seed,
                       with_dlse, dv);
}

std::vector<std::pair<std::string, kfa::Params>> options() {
  std::vector<std::pair<std::string, kfa::Params>> out;
  kfa::Params p;
  out.emplace_back("none", p);
  for (auto a : {kfa::Align::bottom_right, kfa::Align::top_left}) {
    const std::string an = kfa::name_of(a);
    kfa::Params c;
    c.align = a;
    c.causal = true;
    out.emplace_back("causal " + an, c);
    kfa::Params w;
    w.align = a;
    w.window_left = 7;
    w.window_right = 2;
    out.emplace_back("window 7,2 " + an, w);
    c.window_left = 4;
    c.softcap = 3;
    out.emplace_back("causal window 4 softcap " + an, c);
  }
  return out;
}

template <class T>
class Varlen : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Varlen, Types, );

TYPED_TEST(Varlen, ForwardMatchesReferencePerSequence) {
  const VarlenProblem pb = mixed(2, 2, 11);
  for (const auto& [name, p] : options())
    check<TypeParam>(pb, p, false, name);
}

TYPED_TEST(Varlen, ForwardGqaAndDropout) {
  const VarlenProblem pb = mixed(4, 2, 12);
  kfa::Params p;
  check<TypeParam>(pb, p, false, "gqa");
  p.dropout = 0.25;
  p.seed = 7;
  p.offset = 3;
  check<TypeParam>(pb, p, false, "gqa dropout");
  p.causal = true;
  p.align = kfa::Align::top_left;
  check<TypeParam>(pb, p, false, "gqa dropout causal top-left");
}

TYPED_TEST(Varlen, BackwardEachDqMode) {
  const VarlenProblem gqa = mixed(4, 2, 13, true);
  for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass, kfa::DqMode::automatic}) {
    kfa::Params p;
    p.dq_mode = mode;
    check<TypeParam>(gqa, p, true, std::string("gqa dlse ") + kfa::name_of(mode));
    p.causal = true;
    p.window_left = 5;
    p.dropout = 0.2;
    p.seed = 99;
    check<TypeParam>(gqa, p, true,
                     std::string("gqa dlse causal window dropout ") + kfa::name_of(mode));
  }
  // The symmetric pass: self-attention in every sequence (lengths 0 and 1 included).
  const VarlenProblem self({4, 0, 1, 70, 9}, {4, 0, 1, 70, 9}, 2, 2, 16, 14);
  kfa::Params p;
  p.dq_mode = kfa::DqMode::symmetric;
  check<TypeParam>(self, p, true, "symmetric");
  p.causal = true;
  p.dropout = 0.1;
  p.seed = 5;
  check<TypeParam>(self, p, true, "symmetric causal dropout");
}

// ALiBi: each sequence's bias from its own positions and diagonal (seqlen_k - seqlen_q of the
// sequence under bottom-right alignment), with every mask of Params, GQA and dropout.
TYPED_TEST(Varlen, AlibiForwardMatchesReferencePerSequence) {
  const VarlenProblem pb = mixed(2, 2, 21);
  const auto alibi = some_slopes(2);
  for (const auto& [name, p] : options())
    check<TypeParam>(pb, p, false, "alibi " + name, alibi);
  const VarlenProblem gqa = mixed(4, 2, 22);
  kfa::Params p;
  p.dropout = 0.25;
  p.seed = 8;
  p.causal = true;
  check<TypeParam>(gqa, p, false, "alibi gqa dropout causal", some_slopes(4));
}

TYPED_TEST(Varlen, AlibiBackwardEachDqMode) {
  const VarlenProblem gqa = mixed(4, 2, 23, true);
  const auto alibi = some_slopes(4);
  for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass}) {
    kfa::Params p;
    p.dq_mode = mode;
    check<TypeParam>(gqa, p, true, std::string("alibi gqa dlse ") + kfa::name_of(mode), alibi);
    p.causal = true;
    p.align = kfa::Align::top_left;
    p.window_left = 5;
    p.softcap = 4;
    p.dropout = 0.2;
    p.seed = 98;
    check<TypeParam>(
        gqa, p, true,
        std::string("alibi gqa dlse causal top-left window softcap dropout ") + kfa::name_of(mode),
        alibi);
  }
  const VarlenProblem self({4, 0, 1, 70, 9}, {4, 0, 1, 70, 9}, 2, 2, 16, 24);
  kfa::Params p;
  p.dq_mode = kfa::DqMode::symmetric;
  p.causal = true;
  check<TypeParam>(self, p, true, "alibi symmetric causal", some_slopes(2));
}

// v, o, dout and dv with a head dim of their own (the packed rows take each tensor's last
// extent): D = 24 with Dv = 72 and 13, forward and each dQ mode, GQA, dropout.
TYPED_TEST(Varlen, ValueHeadDimOfItsOwn) {
  for (int dv : {72, 13}) {
    const VarlenProblem gqa = mixed(4, 2, 15, true, dv);
    for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass}) {
      kfa::Params p;
      p.dq_mode = mode;
      p.causal = true;
      check<TypeParam>(gqa, p, true, "Dv " + std::to_string(dv) + " " + kfa::name_of(mode));
      p.dropout = 0.2;
      p.seed = 3;
      check<TypeParam>(gqa, p, true, "Dv " + std::to_string(dv) + " dropout");
    }
    const VarlenProblem self({4, 0, 1, 70, 9}, {4, 0, 1, 70, 9}, 2, 2, 24, 16, false, dv);
    kfa::Params p;
    p.dq_mode = kfa::DqMode::symmetric;
    check<TypeParam>(self, p, true, "Dv " + std::to_string(dv) + " symmetric");
  }
  // D and Dv on either side of a tile-size step (the host's backward tiles: 64 rows up to a head
  // dim of 128, 32 beyond; CUDA's: 16 up to 64, 8 beyond): the sequences' tiles must be numbered
  // as the kernels cut them, from the wider of the two.
  for (int dv : {256, 128}) {
    const VarlenProblem wide({100, 3, 0, 70}, {90, 5, 2, 70}, 2, 1, 64, 17, true, dv);
    for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass}) {
      kfa::Params p;
      p.dq_mode = mode;
      check<TypeParam>(wide, p, true, "D 64 Dv " + std::to_string(dv) + " " + kfa::name_of(mode));
    }
    const VarlenProblem self({100, 0, 70}, {100, 0, 70}, 1, 1, 64, 18, false, dv);
    kfa::Params p;
    p.dq_mode = kfa::DqMode::symmetric;
    p.causal = true;
    check<TypeParam>(self, p, true, "D 64 Dv " + std::to_string(dv) + " symmetric");
  }
}

// Where every sequence has the same lengths the packed batch is the padded one without
// padding: the kernels see the same rows, so the results equal kfa::forward's and
// kfa::backward's bitwise, dropout included (sequence s draws batch element s's mask).
TYPED_TEST(Varlen, EqualLengthsEqualThePaddedCallBitwise) {
  using T = TypeParam;
  const int B = 3, nq = 19, nk = 23;
  const VarlenProblem pb({nq, nq, nq}, {nk, nk, nk}, 2, 1, 16, 15);
  kfa::Params p;
  p.causal = true;
  p.dropout = 0.3;
  p.seed = 1234;
  p.dq_mode = kfa::DqMode::query_pass;
  const auto vl = run<T>(pb, p, true);
  // The same data as (B, heads, seqlen, head_dim).
  auto batched = [&](const Packed3& x, int n) {
    Tensor4 t("batched", B, x.extent(1), n, x.extent(2));
    for (int b = 0; b < B; ++b)
      for (std::size_t h = 0; h < x.extent(1); ++h)
        for (int i = 0; i < n; ++i)
          for (std::size_t d = 0; d < x.extent(2); ++d)
            t(b, h, i, d) = x(b * n + i, h, d);
    return t;
  };
  Problem padded(pb.padded(), 0);
  padded.q = batched(pb.q, nq);
  padded.k = batched(pb.k, nk);
  padded.v = batched(pb.v, nk);
  const auto fw = run_forward<T>(padded, p);
  const auto bw = run_backward<T>(padded, p, batched(pb.dout, nq));
  auto same = [&](const Tensor4& ref, const Packed3& x, int n, const char* what) {
    int differ = 0;
    for (int b = 0; b < B; ++b)
      for (std::size_t h = 0; h < x.extent(1); ++h)
        for (int i = 0; i < n; ++i)
          for (std::size_t d = 0; d < x.extent(2); ++d)
            differ += !(ref(b, h, i, d) == x(b * n + i, h, d));
    EXPECT_EQ(differ, 0) << what;
  };
  same(fw.o, vl.o, nq, "o");
  int lse_differ = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < nq; ++i)
        lse_differ += !(fw.lse(b, h, i) == vl.lse(h, b * nq + i));
  EXPECT_EQ(lse_differ, 0) << "lse";
  same(bw.dq, vl.dq, nq, "dq");
  same(bw.dk, vl.dk, nk, "dk");
  same(bw.dv, vl.dv, nk, "dv");
}

// Each pass is one launch of each of its kernels for the whole packed batch, whatever its
// lengths (0, 1, a long one among short ones): the Kokkos tools callback sees every
// parallel_for by name.
std::vector<std::string>* launched = nullptr;
void record_launch(const char* name, std::uint32_t /*device*/, std::uint64_t* id) {
  if (launched) launched->emplace_back(name);
  *id = 0;
}

TEST(VarlenLaunches, EachKernelLaunchesOnce) {
  const VarlenProblem pb = mixed(4, 2, 31);
  for (auto mode : {kfa::DqMode::atomic, kfa::DqMode::query_pass}) {
    SCOPED_TRACE(kfa::name_of(mode));
    std::vector<std::string> names;
    launched = &names;
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(record_launch);
    kfa::Params p;
    p.causal = true;
    p.dq_mode = mode;
    const auto out = run<double>(pb, p, true);
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
    launched = nullptr;
    auto count = [&](const char* n) { return std::count(names.begin(), names.end(), n); };
    EXPECT_EQ(count("kfa::forward"), 1) << names.size() << " launches in all";
    EXPECT_EQ(count("kfa::backward::dkdv"), 1);
    EXPECT_EQ(count("kfa::backward::dq"), mode == kfa::DqMode::query_pass ? 1 : 0);
    const auto fc = kfa::reference::varlen::check_forward<double>(pb.q, pb.k, pb.v, pb.cu_q,
                                                                  pb.cu_k, p, out.o, out.lse);
    EXPECT_TRUE(fc.ok());
    const auto bc = kfa::reference::varlen::check_backward<double>(
        pb.q, pb.k, pb.v, pb.cu_q, pb.cu_k, p, pb.dout, pb.dlse, out.dq, out.dk, out.dv);
    EXPECT_TRUE(bc.ok());
  }
  const VarlenProblem self({4, 0, 1, 70, 9}, {4, 0, 1, 70, 9}, 2, 2, 16, 32);
  std::vector<std::string> names;
  launched = &names;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(record_launch);
  kfa::Params p;
  p.dq_mode = kfa::DqMode::symmetric;
  run<double>(self, p, true);
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  launched = nullptr;
  EXPECT_EQ(std::count(names.begin(), names.end(), "kfa::backward::symmetric"), 1);
}

/// Expects `f` to throw kfa::Error whose message contains every one of `parts`.
template <class F>
void expect_error(const F& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no kfa::Error";
  } catch (const kfa::Error& e) {
    for (const auto& s : parts)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << " lacks " << s;
  }
}

TEST(VarlenValidation, BadOffsetsAreRefusedBeforeAnyKernel) {
  using T = double;
  Packed<T> q("q", 10, 2, 8), k("k", 12, 2, 8), v("v", 12, 2, 8), o("o", 10, 2, 8);
  Rows<T> lse("lse", 2, 10);
  Kokkos::deep_copy(o, quiet_nan<T>());
  const Cu good_q = to_device_cu({0, 4, 10}), good_k = to_device_cu({0, 5, 12});
  auto fwd = [&](const std::vector<int>& cq, const std::vector<int>& ck) {
    return [&, cq, ck] {
      kfa::varlen::forward(Exec(), q, k, v, to_device_cu(cq), to_device_cu(ck), o, lse);
    };
  };
  expect_error(fwd({1, 4, 10}, {0, 5, 12}), {"cu_seqlens_q[0] = 1", "must be 0"});
  expect_error(fwd({0, 6, 4, 10}, {0, 5, 5, 12}), {"cu_seqlens_q[2] = 4", "non-decreasing"});
  expect_error(fwd({0, 4, 10}, {0, 7, 5}), {"cu_seqlens_k[2] = 5", "non-decreasing"});
  expect_error(fwd({0, 4, 9}, {0, 5, 12}), {"cu_seqlens_q[2] = 9", "total_q", "10"});
  expect_error(fwd({0, 4, 10}, {0, 5, 13}), {"cu_seqlens_k[2] = 13", "total_k", "12"});
  expect_error(fwd({0, 4, 10}, {0, 2, 5, 12}), {"cu_seqlens_q has 3", "cu_seqlens_k has 4"});
  expect_error(fwd({}, {}), {"cu_seqlens_q is empty"});
  // Shapes of the packed arrays are named too.
  Packed<T> k_short("k", 12, 2, 4);
  expect_error([&] { kfa::varlen::forward(Exec(), q, k_short, v, good_q, good_k, o, lse); },
               {"head_dim"});
  Rows<T> lse_bad("lse", 10, 2);
  expect_error([&] { kfa::varlen::forward(Exec(), q, k, v, good_q, good_k, o, lse_bad); }, {"lse"});
  // The backward: offsets, and the symmetric pass where a sequence is not self-attention.
  Packed<T> dq("dq", 10, 2, 8), dk("dk", 12, 2, 8), dv("dv", 12, 2, 8), dout("dout", 10, 2, 8);
  Kokkos::deep_copy(dq, quiet_nan<T>());
  expect_error(
      [&] {
        kfa::varlen::backward(Exec(), q, k, v, o, lse, dout, good_q, to_device_cu({0, 5, 11}), dq,
                              dk, dv);
      },
      {"cu_seqlens_k[2] = 11"});
  kfa::Params sym;
  sym.dq_mode = kfa::DqMode::symmetric;
  expect_error(
      [&] {
        kfa::varlen::backward(Exec(), q, k, v, o, lse, dout, good_q, good_k, dq, dk, dv, sym);
      },
      {"symmetric", "sequence 0", "seqlen_q = 4", "seqlen_k = 5"});
  // Packed sequences have no split-KV.
  kfa::Params split;
  split.num_splits = 2;
  expect_error([&] { kfa::varlen::forward(Exec(), q, k, v, good_q, good_k, o, lse, split); },
               {"varlen::forward", "num_splits = 2", "split-KV"});
  // ALiBi slopes: one per query head.
  Kokkos::View<double*, Device> slopes3("slopes", 3);
  expect_error(
      [&] {
        kfa::varlen::forward(Exec(), q, k, v, good_q, good_k, o, lse, kfa::Params{},
                             kfa::masks::Alibi{slopes3});
      },
      {"varlen::forward", "alibi slopes", "heads_q = 2"});
  expect_error(
      [&] {
        kfa::varlen::backward(Exec(), q, k, v, o, lse, dout, good_q, good_k, dq, dk, dv,
                              kfa::Params{}, kfa::masks::Alibi{slopes3});
      },
      {"varlen::backward", "alibi slopes", "heads_q = 2"});
  Kokkos::fence();
  for (const Packed3& out : {to_host<Packed3>(o, "o"), to_host<Packed3>(dq, "dq")}) {
    int written = 0;
    for (std::size_t e = 0; e < out.span(); ++e)
      written += !std::isnan(out.data()[e]);
    EXPECT_EQ(written, 0) << "a refused call wrote " << out.label();
  }
}

}  // namespace
