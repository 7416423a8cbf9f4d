#pragma once
// Random attention problems for the tests: inputs drawn in double on the host from a printed
// seed, copied to the suite's execution space (category.hpp) in the precision under test, and
// the kernel's outputs copied back as double for comparison with kfa::reference.

#include "category.hpp"
#include "narrow_float.hpp"

#include <gtest/gtest.h>
#include <kfa/kfa.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfa_test {

using kfa::reference::Keep4;
using kfa::reference::Tensor3;
using kfa::reference::Tensor4;

/// Views of the suite's space (category.hpp), in the layout the helpers below produce.
template <class T>
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Device>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Device>;

struct Shape {
  int batch = 1, heads_q = 1, heads_k = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 16;
  int head_dim_v = 0;  ///< v's, o's, dout's and dv's head dim Dv; 0: head_dim
  /// Dv.
  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << "B=" << s.batch << " Hq=" << s.heads_q << " Hk=" << s.heads_k << " Nq=" << s.seqlen_q
     << " Nk=" << s.seqlen_k << " D=" << s.head_dim;
  if (s.dv() != s.head_dim) os << " Dv=" << s.dv();
  return os;
}

/// Uniform(-amp, amp) entries from a seeded generator.
inline Tensor4 random_tensor(const char* label, int b, int h, int n, int d, std::mt19937_64& gen,
                             double amp = 1.0) {
  Tensor4 t(std::string(label), b, h, n, d);
  std::uniform_real_distribution<double> dist(-amp, amp);
  for (std::size_t e = 0; e < t.span(); ++e)
    t.data()[e] = dist(gen);
  return t;
}

/// Rounds t's entries to T in place (nothing for float and double, whose conversion the
/// reference sees anyway): a narrow type's kernel and its reference then see the same inputs.
template <class T>
void round_to(const Tensor4& t) {
  if constexpr (kfa::backends::is_narrow_float<T>::value)
    for (std::size_t e = 0; e < t.span(); ++e)
      t.data()[e] = static_cast<double>(T(t.data()[e]));
}

struct Problem {
  Shape shape;
  Tensor4 q, k, v;
  Problem(const Shape& s, std::uint64_t seed, double amp_qk = 1.0) : shape(s) {
    std::mt19937_64 gen(seed);
    q = random_tensor("q", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen, amp_qk);
    k = random_tensor("k", s.batch, s.heads_k, s.seqlen_k, s.head_dim, gen, amp_qk);
    v = random_tensor("v", s.batch, s.heads_k, s.seqlen_k, s.dv(), gen);
  }
  /// The inputs rounded to T (see round_to).
  template <class T>
  Problem& rounded() {
    round_to<T>(q);
    round_to<T>(k);
    round_to<T>(v);
    return *this;
  }
};

/// Copies a double host tensor to a View of T in the suite's space (same extents, LayoutRight):
/// converted on the host, then deep-copied (a no-op where the space is the host's).
template <class T, class Src>
auto to_device(const Src& src) {
  View4<T> dst("kfa_test::tensor", src.extent(0), src.extent(1), src.extent(2), src.extent(3));
  auto h = Kokkos::create_mirror_view(dst);
  for (std::size_t e = 0; e < src.span(); ++e)
    h.data()[e] = static_cast<T>(src.data()[e]);
  Kokkos::deep_copy(dst, h);
  return dst;
}

/// Copies any View of the suite's space back to a double host tensor of the same rank.
template <class HostDouble, class Dev>
HostDouble to_host(const Dev& dev, const char* label) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dev);
  HostDouble out(Kokkos::view_alloc(std::string(label)), dev.layout());
  for (std::size_t e = 0; e < out.span(); ++e)
    out.data()[e] = static_cast<double>(h.data()[e]);
  return out;
}

template <class T>
struct Outputs {
  Tensor4 o;
  Tensor3 lse;
};

/// Runs kfa::forward in precision T with outputs poisoned by NaN beforehand; O is handed over as
/// an OView (another view type of the same memory, e.g. with atomic memory traits).
template <class T, class OView = View4<T>>
Outputs<T> run_forward(const Problem& pb, const kfa::Params& params) {
  auto q = to_device<T>(pb.q);
  auto k = to_device<T>(pb.k);
  auto v = to_device<T>(pb.v);
  const auto& s = pb.shape;
  View4<T> o("o", s.batch, s.heads_q, s.seqlen_q, s.dv());
  View3<lse_t<T>> lse("lse", s.batch, s.heads_q, s.seqlen_q);
  Kokkos::deep_copy(o, quiet_nan<T>());
  Kokkos::deep_copy(lse, quiet_nan<lse_t<T>>());
  kfa::forward(Exec(), q, k, v, OView(o), lse, params);
  Kokkos::fence();
  return {to_host<Tensor4>(o, "o"), to_host<Tensor3>(lse, "lse")};
}

template <class T>
struct Gradients {
  Tensor4 dq, dk, dv;
};

/// Runs kfa::forward then kfa::backward in precision T (with dlse when it is non-empty); the
/// gradients are poisoned with NaN beforehand.
template <class T>
Gradients<T> run_backward(const Problem& pb, const kfa::Params& params, const Tensor4& dout,
                          const Tensor3& dlse = {}) {
  auto q = to_device<T>(pb.q);
  auto k = to_device<T>(pb.k);
  auto v = to_device<T>(pb.v);
  auto dodev = to_device<T>(dout);
  const auto& s = pb.shape;
  View4<T> o("o", s.batch, s.heads_q, s.seqlen_q, s.dv());
  View3<lse_t<T>> lse("lse", s.batch, s.heads_q, s.seqlen_q);
  kfa::forward(Exec(), q, k, v, o, lse, params);
  View4<T> dq("dq", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
      dk("dk", s.batch, s.heads_k, s.seqlen_k, s.head_dim),
      dv("dv", s.batch, s.heads_k, s.seqlen_k, s.dv());
  for (const auto& g : {dq, dk, dv})
    Kokkos::deep_copy(g, quiet_nan<T>());
  if (dlse.span() > 0) {
    View3<lse_t<T>> gl("dlse", s.batch, s.heads_q, s.seqlen_q);
    auto h = Kokkos::create_mirror_view(gl);
    for (std::size_t e = 0; e < h.span(); ++e)
      h.data()[e] = static_cast<lse_t<T>>(dlse.data()[e]);
    Kokkos::deep_copy(gl, h);
    kfa::backward(Exec(), q, k, v, o, lse, dodev, gl, dq, dk, dv, params);
  } else {
    kfa::backward(Exec(), q, k, v, o, lse, dodev, dq, dk, dv, params);
  }
  Kokkos::fence();
  return {to_host<Tensor4>(dq, "dq"), to_host<Tensor4>(dk, "dk"), to_host<Tensor4>(dv, "dv")};
}

/// The dropout keep-mask of params for a problem of shape s, made by kfa::dropout_mask on the
/// suite's space and copied to the host; empty when params.dropout is 0.
inline Keep4 keep_mask(const Shape& s, const kfa::Params& params) {
  if (!(params.dropout > 0)) return {};
  View4<std::uint8_t> keep("keep", s.batch, s.heads_q, s.seqlen_q, s.seqlen_k);
  kfa::dropout_mask(Exec(), keep, params);
  Keep4 h("keep_host", s.batch, s.heads_q, s.seqlen_q, s.seqlen_k);
  Kokkos::deep_copy(h, keep);
  return h;
}

/// True when no element is NaN: the kernel wrote every poisoned output.
template <class View>
bool all_written(const View& v) {
  for (std::size_t e = 0; e < v.span(); ++e)
    if (std::isnan(v.data()[e])) return false;
  return true;
}

/// The matrix of docs/testing.md: seqlen pairs that are not multiples of any tile, and head dims.
/// Under the sanitizers (KFA_TESTS_UNDER_SANITIZERS) the two long pairs are left out: they add
/// no tile edge the short pairs lack (what ASan and UBSan look at), and at -O1 with the
/// sanitizers they took three quarters of test_backward's time; the Release and Kokkos 4
/// builds run them.
#ifdef KFA_TESTS_UNDER_SANITIZERS
inline constexpr bool kUnderSanitizers = true;
#else
inline constexpr bool kUnderSanitizers = false;
#endif
inline const std::vector<std::pair<int, int>> kSeqlens = [] {
  std::vector<std::pair<int, int>> s = {{1, 1},   {1, 239},   {3, 799},
                                        {17, 17}, {113, 203}, {128, 217}};
  if (!kUnderSanitizers) s.insert(s.end(), {{1023, 1024}, {1024, 1023}});
  return s;
}();
inline const std::vector<int> kHeadDims = {16, 32, 40, 59, 64, 80, 96, 111, 128, 256};
/// (D, Dv) pairs where v's head dim differs from q's and k's: half, double, an odd Dv, and a
/// small D under a wide Dv.
inline const std::vector<std::pair<int, int>> kValueHeadDims = {
    {64, 32}, {32, 64}, {64, 40}, {24, 72}};

/// The masks of docs/testing.md: none, causal in both alignments, windows (left, right, both, 0),
/// causal with a window, and softcap alone and combined.
inline std::vector<kfa::Params> masks() {
  std::vector<kfa::Params> out;
  auto add = [&](bool causal, kfa::Align a, int wl, int wr, double cap = 0) {
    kfa::Params p;
    p.causal = causal;
    p.align = a;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = cap;
    out.push_back(p);
  };
  const auto br = kfa::Align::bottom_right, tl = kfa::Align::top_left;
  add(false, br, -1, -1);
  add(true, br, -1, -1);
  add(true, tl, -1, -1);
  add(false, br, 37, -1);       // left only
  add(false, tl, -1, 5);        // right only
  add(false, br, 50, 9);        // both
  add(false, tl, 0, 0);         // window 0: the diagonal only
  add(true, br, 64, -1);        // causal + left window
  add(false, br, -1, -1, 5.0);  // softcap (the backward's chain rule through tanh)
  add(true, tl, 20, -1, 2.0);   // softcap + causal + window
  return out;
}

/// A seed per shape, so every case draws fresh inputs; printed on failure.
inline std::uint64_t seed_of(const Shape& s, int salt) {
  return 0x9E3779B97F4A7C15ULL ^ (std::uint64_t(s.seqlen_q) << 40) ^
         (std::uint64_t(s.seqlen_k) << 20) ^ (std::uint64_t(s.head_dim) << 8) ^
         (std::uint64_t(s.head_dim_v) << 50) ^ std::uint64_t(s.heads_q * 31 + s.heads_k * 7 + salt);
}

inline std::string describe(const kfa::Params& p) {
  std::string s = p.causal ? "causal" : "no-causal";
  s += p.align == kfa::Align::bottom_right ? "/bottom-right" : "/top-left";
  s += " window=(" + std::to_string(p.window_left) + "," + std::to_string(p.window_right) + ")";
  if (p.softcap > 0) s += " softcap=" + std::to_string(p.softcap);
  if (p.num_splits != 0) s += " splits=" + std::to_string(p.num_splits);
  if (p.dq_mode != kfa::DqMode::automatic) s += std::string(" dq=") + kfa::name_of(p.dq_mode);
  if (p.dropout > 0)
    s += " dropout=" + std::to_string(p.dropout) + " seed=" + std::to_string(p.seed) +
         " offset=" + std::to_string(p.offset);
  return s;
}

/// Runs one case in precision T and applies the tolerance rule of kfa::reference; every output must
/// have been written.
template <class T>
void check_case(const Shape& s, const kfa::Params& p, int salt = 0, double amp_qk = 1.0) {
  const std::uint64_t seed = seed_of(s, salt);
  SCOPED_TRACE(::testing::Message()
               << s << " " << describe(p) << " seed=" << seed << " " << type_name<T>());
  Problem pb(s, seed, amp_qk);
  pb.rounded<T>();
  auto out = run_forward<T>(pb, p);
  // Poisoned with NaN before the call: a NaN left means an element was not written
  // (the reference itself never produces NaN for finite inputs).
  ASSERT_TRUE(all_written(out.o)) << "o has unwritten (NaN) elements";
  ASSERT_TRUE(all_written(out.lse)) << "lse has unwritten (NaN) elements";
  const auto c =
      kfa::reference::check_forward<T>(pb.q, pb.k, pb.v, p, out.o, out.lse, keep_mask(s, p));
  EXPECT_TRUE(c.o.ok()) << "O: err " << c.o.err << " > bound " << c.o.bound
                        << " (naive same-precision err " << c.o.naive_err << ")";
  EXPECT_TRUE(c.lse.ok()) << "LSE: err " << c.lse.err << " > bound " << c.lse.bound
                          << " (naive same-precision err " << c.lse.naive_err << ")";
}

/// A random dL/dLSE in [-1, 1) for a problem of shape s.
inline Tensor3 random_dlse(const Shape& s, std::mt19937_64& gen) {
  Tensor3 dlse(std::string("dlse"), s.batch, s.heads_q, s.seqlen_q);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (std::size_t e = 0; e < dlse.span(); ++e)
    dlse.data()[e] = dist(gen);
  return dlse;
}

/// Runs forward and backward in precision T on a fresh problem with random dO (and dlse when
/// with_dlse) and applies the tolerance rule to dQ, dK and dV.
template <class T>
void check_backward_case(const Shape& s, const kfa::Params& p, bool with_dlse = false, int salt = 0,
                         double amp_qk = 1.0) {
  const std::uint64_t seed = seed_of(s, salt + 1000);
  SCOPED_TRACE(::testing::Message() << s << " " << describe(p) << (with_dlse ? " dlse" : "")
                                    << (p.deterministic ? " deterministic" : " atomic")
                                    << " seed=" << seed << " " << type_name<T>());
  Problem pb(s, seed, amp_qk);
  pb.rounded<T>();
  std::mt19937_64 gen(seed + 1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.dv(), gen);
  round_to<T>(dout);
  const Tensor3 dlse = with_dlse ? random_dlse(s, gen) : Tensor3();
  const auto g = run_backward<T>(pb, p, dout, dlse);
  ASSERT_TRUE(all_written(g.dq)) << "dq has unwritten (NaN) elements";
  ASSERT_TRUE(all_written(g.dk)) << "dk has unwritten (NaN) elements";
  ASSERT_TRUE(all_written(g.dv)) << "dv has unwritten (NaN) elements";
  const auto c = kfa::reference::check_backward<T>(pb.q, pb.k, pb.v, p, dout, dlse, g.dq, g.dk,
                                                   g.dv, keep_mask(s, p));
  // A named array rather than a braced list in the loop header: nvcc's front end rejects the
  // latter.
  const std::pair<const char*, kfa::reference::Check> checks[] = {
      {"dQ", c.dq}, {"dK", c.dk}, {"dV", c.dv}};
  for (const auto& [name, r] : checks)
    EXPECT_TRUE(r.ok()) << name << ": err " << r.err << " > bound " << r.bound
                        << " (naive same-precision err " << r.naive_err << ")";
}

}  // namespace kfa_test
