// The C interface (<kfa/kfa.h>) against the C++ API: the same inputs give bitwise the same
// outputs (float and double, forward and backward, causal, GQA, (batch, seqlen, heads, head_dim)
// strides), every error path returns its status with a message naming the argument and writes
// nothing, and kfa_params carries every field of kfa::Params (kfa::for_each_field's list).
#include <gtest/gtest.h>
#include <kfa/kfa.h>
#include <kfa/kfa.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../c/src/params.hpp"
#include "c_arrays.hpp"

namespace {

using kfa_test::Arrays;
using kfa_test::cxx_backward;
using kfa_test::cxx_forward;
using kfa_test::Dims;
using kfa_test::same_bits;

template <class T>
kfa_status c_forward(Arrays<T>& a, const kfa_params& p, int memory = KFA_MEMORY_HOST) {
  const Dims& s = a.s;
  const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                   v = a.tensor(a.v, s.hk, s.nk, s.dv()), o = a.tensor(a.o, s.hq, s.nq, s.dv()),
                   lse = a.rows(a.lse);
  if constexpr (std::is_same_v<T, float>)
    return kfa_forward_f32(&q, &k, &v, &o, &lse, &p, memory);
  else
    return kfa_forward_f64(&q, &k, &v, &o, &lse, &p, memory);
}

template <class T>
kfa_status c_backward(Arrays<T>& a, const kfa_params& p, bool with_dlse) {
  const Dims& s = a.s;
  const int d_v = s.dv();
  const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                   v = a.tensor(a.v, s.hk, s.nk, d_v), o = a.tensor(a.o, s.hq, s.nq, d_v),
                   lse = a.rows(a.lse), dout = a.tensor(a.dout, s.hq, s.nq, d_v),
                   dlse = a.rows(a.dlse), dq = a.tensor(a.dq, s.hq, s.nq),
                   dk = a.tensor(a.dk, s.hk, s.nk), dv = a.tensor(a.dv, s.hk, s.nk, d_v);
  const kfa_tensor* dl = with_dlse ? &dlse : nullptr;
  if constexpr (std::is_same_v<T, float>)
    return kfa_backward_f32(&q, &k, &v, &o, &lse, &dout, dl, &dq, &dk, &dv, &p, KFA_MEMORY_HOST);
  else
    return kfa_backward_f64(&q, &k, &v, &o, &lse, &dout, dl, &dq, &dk, &dv, &p, KFA_MEMORY_HOST);
}

/// Forward and backward through C and through C++ on copies of one problem: bitwise equal,
/// and every output written (finite: the NaN it started as is gone).
template <class T>
void check_same(const Dims& s, bool bnhd, const kfa_params& cp, bool with_dlse) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.b << " Hq=" << s.hq << " Hk=" << s.hk << " Nq="
                                    << s.nq << " Nk=" << s.nk << " D=" << s.d << " Dv=" << s.dv()
                                    << (bnhd ? " (B,N,H,D)" : "") << " causal=" << cp.causal
                                    << " dlse=" << with_dlse << " " << sizeof(T) * 8 << "-bit");
  Arrays<T> c(s, bnhd, 42), cxx(s, bnhd, 42);
  ASSERT_EQ(c_forward(c, cp), KFA_OK) << kfa_last_error();
  EXPECT_STREQ(kfa_last_error(), "");
  cxx_forward(cxx, kfa::c_api::to_params(cp));
  EXPECT_TRUE(same_bits(c.o, cxx.o));
  EXPECT_TRUE(same_bits(c.lse, cxx.lse));
  for (T x : c.o)
    ASSERT_TRUE(std::isfinite(x));
  ASSERT_EQ(c_backward(c, cp, with_dlse), KFA_OK) << kfa_last_error();
  cxx_backward(cxx, kfa::c_api::to_params(cp), with_dlse);
  EXPECT_TRUE(same_bits(c.dq, cxx.dq));
  EXPECT_TRUE(same_bits(c.dk, cxx.dk));
  EXPECT_TRUE(same_bits(c.dv, cxx.dv));
  for (const auto* g : {&c.dq, &c.dk, &c.dv})
    for (T x : *g)
      ASSERT_TRUE(std::isfinite(x));
}

template <class T>
void check_all() {
  kfa_params causal = kfa_params_default();
  causal.causal = 1;
  kfa_params window = kfa_params_default();
  window.window_left = 5;
  window.align = KFA_ALIGN_TOP_LEFT;
  window.softcap = 3;
  window.deterministic = 1;
  for (bool bnhd : {false, true}) {
    check_same<T>({1, 2, 2, 33, 33, 16}, bnhd, causal, false);
    check_same<T>({2, 4, 2, 17, 40, 32}, bnhd, causal, true);      // GQA, Nq != Nk
    check_same<T>({1, 3, 1, 20, 9, 8}, bnhd, window, false);       // MQA
    check_same<T>({2, 4, 2, 19, 30, 16, 40}, bnhd, causal, true);  // v's head dim of its own
  }
}

TEST(CApi, SameBitsAsCxxFloat) {
  check_all<float>();
}
TEST(CApi, SameBitsAsCxxDouble) {
  check_all<double>();
}

// The strides are read as the layout they describe: a (B,N,H,D) problem gives the results of
// the same problem copied, by this test, into (B,H,N,D) order.
TEST(CApi, StridesAreTheLayout) {
  const Dims s{2, 4, 2, 13, 21, 16};
  Arrays<double> bnhd(s, true, 7), bhnd(s, false, 7);
  const auto permute = [&](const std::vector<double>& from, std::vector<double>& to, int h, int n,
                           int d) {
    for (int b = 0; b < s.b; ++b)
      for (int i = 0; i < h; ++i)
        for (int j = 0; j < n; ++j)
          for (int e = 0; e < d; ++e)
            to[((std::size_t(b) * h + i) * n + j) * d + e] =
                from[((std::size_t(b) * n + j) * h + i) * d + e];
  };
  permute(bnhd.q, bhnd.q, s.hq, s.nq, s.d);
  permute(bnhd.k, bhnd.k, s.hk, s.nk, s.d);
  permute(bnhd.v, bhnd.v, s.hk, s.nk, s.d);
  kfa_params p = kfa_params_default();
  p.causal = 1;
  ASSERT_EQ(c_forward(bnhd, p), KFA_OK) << kfa_last_error();
  ASSERT_EQ(c_forward(bhnd, p), KFA_OK) << kfa_last_error();
  std::vector<double> o(bnhd.o.size()), lse(bnhd.lse.size());
  permute(bnhd.o, o, s.hq, s.nq, s.d);
  permute(bnhd.lse, lse, s.hq, s.nq, 1);
  EXPECT_TRUE(same_bits(o, bhnd.o));
  EXPECT_TRUE(same_bits(lse, bhnd.lse));
}

// kfa_params mirrors kfa::Params: the defaults are kfa::Params{}'s, and a struct whose every
// field differs from the default converts to a kfa::Params whose every field (as
// kfa::for_each_field lists them) differs too, so a field added to one and not the other fails.
TEST(CApi, ParamsMirrorEveryField) {
  const kfa::Params defaults;
  const kfa::Params from_default = kfa::c_api::to_params(kfa_params_default());
  kfa_params c = kfa_params_default();
  c.scale = 0.5;
  c.causal = 1;
  c.align = KFA_ALIGN_TOP_LEFT;
  c.window_left = 3;
  c.window_right = 4;
  c.softcap = 2;
  c.dropout = 0.25;
  c.seed = 5;
  c.offset = 6;
  c.deterministic = 1;
  c.num_splits = 7;
  c.dq_mode = KFA_DQ_SYMMETRIC;
  const kfa::Params changed = kfa::c_api::to_params(c);
  const kfa::Params round_trip = kfa::c_api::to_params(kfa::c_api::from_params(changed));
  int fields = 0;
  kfa::for_each_field(defaults, [&](const kfa::Field& f, const auto& member) {
    ++fields;
    const auto offset =
        reinterpret_cast<const char*>(&member) - reinterpret_cast<const char*>(&defaults);
    using M = std::decay_t<decltype(member)>;
    M d{}, fd{}, ch{}, rt{};
    std::memcpy(&d, &member, sizeof(M));
    std::memcpy(&fd, reinterpret_cast<const char*>(&from_default) + offset, sizeof(M));
    std::memcpy(&ch, reinterpret_cast<const char*>(&changed) + offset, sizeof(M));
    std::memcpy(&rt, reinterpret_cast<const char*>(&round_trip) + offset, sizeof(M));
    EXPECT_TRUE(fd == d) << f.name << ": kfa_params_default() differs from kfa::Params{}";
    EXPECT_FALSE(ch == d) << f.name << ": not carried from kfa_params to kfa::Params";
    EXPECT_TRUE(rt == ch) << f.name << ": from_params does not invert to_params";
  });
  EXPECT_EQ(fields, 12) << "kfa::Params changed: update kfa_params, the Fortran kfa_params and "
                           "c/src/params.hpp";
}

/// An error case: the call's status and a message naming `word`; nothing written.
template <class F>
void expect_error(kfa_status want, const std::string& word, F&& call) {
  Arrays<float> a({1, 2, 2, 5, 5, 16}, false, 3);
  const std::vector<float> o = a.o, lse = a.lse;
  const kfa_status got = call(a);
  EXPECT_EQ(got, want) << kfa_last_error();
  const std::string msg = kfa_last_error();
  EXPECT_NE(msg.find(word), std::string::npos) << "message \"" << msg << "\" lacks " << word;
  EXPECT_EQ(msg.rfind("kfa: ", 0), 0u) << msg;
  EXPECT_EQ(std::memcmp(o.data(), a.o.data(), o.size() * sizeof(float)), 0) << "o written";
  EXPECT_EQ(std::memcmp(lse.data(), a.lse.data(), lse.size() * sizeof(float)), 0) << "lse written";
}

/// Forward through C with one tensor or the params changed by `edit` before the call.
template <class Edit>
kfa_status forward_with(Arrays<float>& a, Edit&& edit, int memory = KFA_MEMORY_HOST) {
  const Dims& s = a.s;
  kfa_tensor t[5] = {a.tensor(a.q, s.hq, s.nq), a.tensor(a.k, s.hk, s.nk),
                     a.tensor(a.v, s.hk, s.nk), a.tensor(a.o, s.hq, s.nq), a.rows(a.lse)};
  kfa_params p = kfa_params_default();
  const kfa_tensor* ptr[5] = {&t[0], &t[1], &t[2], &t[3], &t[4]};
  const kfa_params* pp = &p;
  edit(t, ptr, p, pp);
  return kfa_forward_f32(ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], pp, memory);
}

TEST(CApi, ErrorsNameTheArgument) {
  using T5 = kfa_tensor[5];
  using P5 = const kfa_tensor* [5];
  using PP = const kfa_params*;
  const auto fwd = [](auto edit) {
    return [edit](Arrays<float>& a) { return forward_with(a, edit); };
  };
  // Shapes: o's seqlen, head_dim beyond 256, the head ratio (3 query heads over 2).
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "o has seqlen",
               fwd([](T5& t, P5&, kfa_params&, PP&) { t[3].extent[2] = 4; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "head_dim", fwd([](T5& t, P5&, kfa_params&, PP&) {
                 for (auto& x : t)
                   x.extent[3] = 300;
               }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "heads of q", fwd([](T5& t, P5&, kfa_params&, PP&) {
                 t[0].extent[1] = t[3].extent[1] = t[4].extent[1] = 3;
               }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "k.extent[2] = -1",
               fwd([](T5& t, P5&, kfa_params&, PP&) { t[1].extent[2] = -1; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "v.stride[1] = -8",
               fwd([](T5& t, P5&, kfa_params&, PP&) { t[2].stride[1] = -8; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "q must have unit stride in head_dim",
               fwd([](T5& t, P5&, kfa_params&, PP&) {
                 const std::int64_t st[4] = {320, 160, 32, 2};
                 std::memcpy(t[0].stride, st, sizeof st);
               }));
  // Null pointers.
  expect_error(KFA_ERROR_NULL_POINTER, "q is NULL",
               fwd([](T5&, P5& p, kfa_params&, PP&) { p[0] = nullptr; }));
  expect_error(KFA_ERROR_NULL_POINTER, "lse is NULL",
               fwd([](T5&, P5& p, kfa_params&, PP&) { p[4] = nullptr; }));
  expect_error(KFA_ERROR_NULL_POINTER, "v.data is NULL",
               fwd([](T5& t, P5&, kfa_params&, PP&) { t[2].data = nullptr; }));
  expect_error(KFA_ERROR_NULL_POINTER, "params is NULL",
               fwd([](T5&, P5&, kfa_params&, PP& pp) { pp = nullptr; }));
  // Parameters.
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()})
    expect_error(KFA_ERROR_INVALID_ARGUMENT, "scale must be finite",
                 fwd([bad](T5&, P5&, kfa_params& p, PP&) { p.scale = bad; }));
  for (double bad : {1.0, -0.1, std::nan("")})
    expect_error(KFA_ERROR_INVALID_ARGUMENT, "dropout must be in [0, 1)",
                 fwd([bad](T5&, P5&, kfa_params& p, PP&) { p.dropout = bad; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "params.align = 2",
               fwd([](T5&, P5&, kfa_params& p, PP&) { p.align = 2; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "params.dq_mode = 7",
               fwd([](T5&, P5&, kfa_params& p, PP&) { p.dq_mode = 7; }));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "window_left",
               fwd([](T5&, P5&, kfa_params& p, PP&) { p.window_left = -2; }));
  // Where the memory is.
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "memory = 5", [](Arrays<float>& a) {
    return forward_with(
        a, [](T5&, P5&, kfa_params&, PP&) {}, 5);
  });
  if (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>)
    expect_error(KFA_ERROR_UNSUPPORTED, "KFA_MEMORY_DEVICE", [](Arrays<float>& a) {
      return forward_with(
          a, [](T5&, P5&, kfa_params&, PP&) {}, KFA_MEMORY_DEVICE);
    });
  // The backward's own arguments: a NULL gradient, dlse of another shape, dk of another shape.
  expect_error(KFA_ERROR_NULL_POINTER, "dk is NULL", [](Arrays<float>& a) {
    const Dims& s = a.s;
    const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                     lse = a.rows(a.lse), o = a.tensor(a.o, s.hq, s.nq);
    const kfa_params p = kfa_params_default();
    return kfa_backward_f32(&q, &k, &k, &o, &lse, &q, nullptr, &o, nullptr, &k, &p,
                            KFA_MEMORY_HOST);
  });
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "dlse has seqlen", [](Arrays<float>& a) {
    const Dims& s = a.s;
    const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                     lse = a.rows(a.lse), o = a.tensor(a.o, s.hq, s.nq);
    kfa_tensor dlse = a.rows(a.dlse), dk = a.tensor(a.dk, s.hk, s.nk);
    dlse.extent[2] = 2;
    const kfa_params p = kfa_params_default();
    return kfa_backward_f32(&q, &k, &k, &o, &lse, &q, &dlse, &o, &dk, &dk, &p, KFA_MEMORY_HOST);
  });
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "dv has heads", [](Arrays<float>& a) {
    const Dims& s = a.s;
    const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                     lse = a.rows(a.lse), o = a.tensor(a.o, s.hq, s.nq);
    kfa_tensor dk = a.tensor(a.dk, s.hk, s.nk), dv = dk;
    dv.extent[1] = 1;
    const kfa_params p = kfa_params_default();
    return kfa_backward_f32(&q, &k, &k, &o, &lse, &q, nullptr, &o, &dk, &dv, &p, KFA_MEMORY_HOST);
  });
}

/// A host copy in double of a row-major array, as the reference's View V of the given extents.
template <class V, class T, class... N>
V ref_of(const std::vector<T>& a, N... n) {
  V r("ref", static_cast<std::size_t>(n)...);
  EXPECT_EQ(r.span(), a.size());
  for (std::size_t e = 0; e < a.size(); ++e)
    r.data()[e] = static_cast<double>(a[e]);
  return r;
}

/// A score term of kind `kind` for the problem a: its arrays (kept alive here), the kfa_term
/// the C calls take, and the reference's Terms. `broadcast`: a (1, 1, Nq, Nk) bias or a
/// (1, Hq, Nq, Nk) mask instead of full extents; `i64`: key lengths as int64_t.
template <class T>
struct CTerm {
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> len32;
  std::vector<std::int64_t> len64;
  std::vector<T> bias, dbias, slopes;
  kfa_term term{};
  kfa::reference::Terms ref;

  CTerm(const Dims& s, kfa_term_kind kind, bool broadcast, bool i64) {
    std::mt19937_64 gen(5);
    std::uniform_real_distribution<double> u(-2, 2);
    const int b = broadcast ? 1 : s.b, h = broadcast && kind == KFA_TERM_BIAS ? 1 : s.hq;
    const std::size_t n = std::size_t(b) * h * s.nq * s.nk;
    if (kind == KFA_TERM_MASK) {
      // Density 1/2, and query rows 2 (mod 5) see no key at all.
      mask.resize(n);
      for (std::size_t e = 0; e < n; ++e)
        mask[e] = (e / s.nk) % s.nq % 5 != 2 && (gen() & 1);
      term = kfa_term_mask(kfa_tensor_contiguous(mask.data(), b, h, s.nq, s.nk));
      ref.mask = ref_of<kfa::reference::Keep4>(mask, b, h, s.nq, s.nk);
    } else if (kind == KFA_TERM_KEY_PADDING) {
      for (int x = 0; x < s.b; ++x)  // 0, then 1, then all keys, then 2/3 of them
        ref.key_lengths.push_back(x % 4 == 0   ? 0
                                  : x % 4 == 1 ? 1
                                  : x % 4 == 2 ? s.nk
                                               : 2 * s.nk / 3);
      len32.assign(ref.key_lengths.begin(), ref.key_lengths.end());
      len64.assign(ref.key_lengths.begin(), ref.key_lengths.end());
      term = i64 ? kfa_term_key_padding(len64.data(), s.b, KFA_INT64)
                 : kfa_term_key_padding(len32.data(), s.b, KFA_INT32);
    } else if (kind == KFA_TERM_BIAS) {
      bias.resize(n);
      for (T& x : bias)
        x = static_cast<T>(u(gen));
      dbias.assign(n, std::numeric_limits<T>::quiet_NaN());
      term = kfa_term_bias(kfa_tensor_contiguous(bias.data(), b, h, s.nq, s.nk),
                           kfa_tensor_contiguous(dbias.data(), b, h, s.nq, s.nk));
      ref.bias = ref_of<kfa::reference::Tensor4>(bias, b, h, s.nq, s.nk);
    } else {
      for (double x : kfa::masks::alibi_slopes(s.hq)) {
        slopes.push_back(static_cast<T>(x));
        ref.alibi.push_back(static_cast<double>(slopes.back()));
      }
      term = kfa_term_alibi(slopes.data(), s.hq);
    }
  }
};

/// Each kind of term through kfa_forward_term and kfa_backward_term against the float64
/// reference (kfa::reference with the same Terms), under the project's tolerance rule: o, lse,
/// dq, dk, dv and a bias's dbias.
template <class T>
void check_term(const Dims& s, kfa_term_kind kind, bool broadcast, bool i64, const kfa_params& cp) {
  SCOPED_TRACE(::testing::Message()
               << "kind=" << kind << " broadcast=" << broadcast << " int64=" << i64
               << " causal=" << cp.causal << " " << sizeof(T) * 8 << "-bit");
  using kfa::reference::Tensor3;
  using kfa::reference::Tensor4;
  Arrays<T> a(s, false, 9);
  CTerm<T> t(s, kind, broadcast, i64);
  const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                   v = a.tensor(a.v, s.hk, s.nk), o = a.tensor(a.o, s.hq, s.nq),
                   lse = a.rows(a.lse), dout = a.tensor(a.dout, s.hq, s.nq), dlse = a.rows(a.dlse),
                   dq = a.tensor(a.dq, s.hq, s.nq), dk = a.tensor(a.dk, s.hk, s.nk),
                   dv = a.tensor(a.dv, s.hk, s.nk);
  constexpr bool f32 = std::is_same_v<T, float>;
  const auto fwd = f32 ? kfa_forward_term_f32 : kfa_forward_term_f64;
  const auto bwd = f32 ? kfa_backward_term_f32 : kfa_backward_term_f64;
  ASSERT_EQ(fwd(&q, &k, &v, &o, &lse, &cp, &t.term, KFA_MEMORY_HOST), KFA_OK) << kfa_last_error();
  ASSERT_EQ(bwd(&q, &k, &v, &o, &lse, &dout, &dlse, &dq, &dk, &dv, &cp, &t.term, KFA_MEMORY_HOST),
            KFA_OK)
      << kfa_last_error();
  const Tensor4 q64 = ref_of<Tensor4>(a.q, s.b, s.hq, s.nq, s.d),
                k64 = ref_of<Tensor4>(a.k, s.b, s.hk, s.nk, s.d),
                v64 = ref_of<Tensor4>(a.v, s.b, s.hk, s.nk, s.d),
                dout64 = ref_of<Tensor4>(a.dout, s.b, s.hq, s.nq, s.d);
  const Tensor3 dlse64 = ref_of<Tensor3>(a.dlse, s.b, s.hq, s.nq);
  const kfa::Params p = kfa::c_api::to_params(cp);
  const auto f =
      kfa::reference::check_forward<T>(q64, k64, v64, p, ref_of<Tensor4>(a.o, s.b, s.hq, s.nq, s.d),
                                       ref_of<Tensor3>(a.lse, s.b, s.hq, s.nq), {}, t.ref);
  EXPECT_TRUE(f.o.ok()) << "o: err " << f.o.err << " > " << f.o.bound;
  EXPECT_TRUE(f.lse.ok()) << "lse: err " << f.lse.err << " > " << f.lse.bound;
  const auto g = kfa::reference::check_backward<T>(
      q64, k64, v64, p, dout64, dlse64, ref_of<Tensor4>(a.dq, s.b, s.hq, s.nq, s.d),
      ref_of<Tensor4>(a.dk, s.b, s.hk, s.nk, s.d), ref_of<Tensor4>(a.dv, s.b, s.hk, s.nk, s.d), {},
      t.ref);
  EXPECT_TRUE(g.dq.ok()) << "dq: err " << g.dq.err << " > " << g.dq.bound;
  EXPECT_TRUE(g.dk.ok()) << "dk: err " << g.dk.err << " > " << g.dk.bound;
  EXPECT_TRUE(g.dv.ok()) << "dv: err " << g.dv.err << " > " << g.dv.bound;
  if (kind == KFA_TERM_BIAS) {
    const auto& bx = t.term.values.extent;
    const auto db = kfa::reference::check_dbias<T>(
        q64, k64, v64, p, dout64, dlse64, ref_of<Tensor4>(t.dbias, bx[0], bx[1], bx[2], bx[3]), {},
        t.ref);
    EXPECT_TRUE(db.ok()) << "dbias: err " << db.err << " > " << db.bound;
  }
}

template <class T>
void check_terms() {
  kfa_params plain = kfa_params_default();
  kfa_params causal = kfa_params_default();
  causal.causal = 1;
  causal.softcap = 4;
  const Dims s{4, 4, 2, 13, 19, 16};  // GQA, Nq != Nk; key lengths 0, 1, Nk, 2 Nk / 3
  for (const kfa_params& cp : {plain, causal}) {
    check_term<T>(s, KFA_TERM_MASK, false, false, cp);
    check_term<T>(s, KFA_TERM_MASK, true, false, cp);
    check_term<T>(s, KFA_TERM_KEY_PADDING, false, false, cp);
    check_term<T>(s, KFA_TERM_KEY_PADDING, false, true, cp);
    check_term<T>(s, KFA_TERM_BIAS, false, false, cp);
    check_term<T>(s, KFA_TERM_BIAS, true, false, cp);
    check_term<T>(s, KFA_TERM_ALIBI, false, false, cp);
  }
}

TEST(CApi, TermsAgainstReferenceFloat) {
  check_terms<float>();
}
TEST(CApi, TermsAgainstReferenceDouble) {
  check_terms<double>();
}

// A NULL term and a term of kind KFA_TERM_NONE are the functions without one, bitwise.
TEST(CApi, NoTermIsThePlainPass) {
  const Dims s{1, 2, 2, 9, 11, 16};
  Arrays<float> plain(s, false, 4), none(s, false, 4), null(s, false, 4);
  const kfa_params p = kfa_params_default();
  ASSERT_EQ(c_forward(plain, p), KFA_OK) << kfa_last_error();
  const kfa_term zero{};
  for (auto* x : {&none, &null}) {
    const kfa_tensor q = x->tensor(x->q, s.hq, s.nq), k = x->tensor(x->k, s.hk, s.nk),
                     v = x->tensor(x->v, s.hk, s.nk), o = x->tensor(x->o, s.hq, s.nq),
                     lse = x->rows(x->lse);
    ASSERT_EQ(kfa_forward_term_f32(&q, &k, &v, &o, &lse, &p, x == &none ? &zero : nullptr,
                                   KFA_MEMORY_HOST),
              KFA_OK)
        << kfa_last_error();
    EXPECT_TRUE(same_bits(x->o, plain.o));
    EXPECT_TRUE(same_bits(x->lse, plain.lse));
  }
}

/// Packed (total, heads, head_dim) arrays of a varlen problem with the given offsets.
template <class T>
struct Packed {
  int hq, hk, d;
  std::int64_t q_extent3 = 0;  // q.extent[3], which a packed tensor must leave 0
  std::vector<std::int32_t> cu_q, cu_k;
  std::vector<T> q, k, v, o, lse, dout, dq, dk, dv;

  Packed(int hq_, int hk_, int d_, std::vector<std::int32_t> cq, std::vector<std::int32_t> ck)
      : hq(hq_), hk(hk_), d(d_), cu_q(std::move(cq)), cu_k(std::move(ck)) {
    std::mt19937_64 gen(17);
    std::uniform_real_distribution<double> u(-1, 1);
    const auto fill = [&](std::vector<T>& a, std::size_t n) {
      a.resize(n);
      for (T& x : a)
        x = static_cast<T>(u(gen));
    };
    const std::size_t tq = cu_q.back(), tk = cu_k.back();
    fill(q, tq * hq * d);
    fill(k, tk * hk * d);
    fill(v, tk * hk * d);
    fill(dout, tq * hq * d);
    const T nan = std::numeric_limits<T>::quiet_NaN();
    o.assign(q.size(), nan);
    lse.assign(tq * hq, nan);
    dq.assign(q.size(), nan);
    dk.assign(k.size(), nan);
    dv.assign(v.size(), nan);
  }
  static kfa_tensor packed(std::vector<T>& a, std::int64_t total, int heads, int d) {
    kfa_tensor t{};
    t.data = a.data();
    t.extent[0] = total;
    t.extent[1] = heads;
    t.extent[2] = d;
    return t;
  }
  kfa_tensor tq(std::vector<T>& a) { return packed(a, cu_q.back(), hq, d); }
  kfa_tensor tk(std::vector<T>& a) { return packed(a, cu_k.back(), hk, d); }
  kfa_tensor tlse() {
    kfa_tensor t{};
    t.data = lse.data();
    t.extent[0] = hq;
    t.extent[1] = cu_q.back();
    return t;
  }
  static kfa_tensor offsets(std::vector<std::int32_t>& c) {
    kfa_tensor t{};
    t.data = c.data();
    t.extent[0] = static_cast<std::int64_t>(c.size());
    return t;
  }

  kfa_status forward(const kfa_params& p) {
    kfa_tensor tq_ = tq(q);
    tq_.extent[3] = q_extent3;
    const kfa_tensor tk_ = tk(k), tv = tk(v), to = tq(o), tl = tlse(), cq = offsets(cu_q),
                     ck = offsets(cu_k);
    if constexpr (std::is_same_v<T, float>)
      return kfa_varlen_forward_f32(&tq_, &tk_, &tv, &cq, &ck, &to, &tl, &p, KFA_MEMORY_HOST);
    else
      return kfa_varlen_forward_f64(&tq_, &tk_, &tv, &cq, &ck, &to, &tl, &p, KFA_MEMORY_HOST);
  }
  kfa_status backward(const kfa_params& p) {
    const kfa_tensor tq_ = tq(q), tk_ = tk(k), tv = tk(v), to = tq(o), tl = tlse(), tdo = tq(dout),
                     tdq = tq(dq), tdk = tk(dk), tdv = tk(dv), cq = offsets(cu_q),
                     ck = offsets(cu_k);
    if constexpr (std::is_same_v<T, float>)
      return kfa_varlen_backward_f32(&tq_, &tk_, &tv, &to, &tl, &tdo, nullptr, &cq, &ck, &tdq, &tdk,
                                     &tdv, &p, KFA_MEMORY_HOST);
    else
      return kfa_varlen_backward_f64(&tq_, &tk_, &tv, &to, &tl, &tdo, nullptr, &cq, &ck, &tdq, &tdk,
                                     &tdv, &p, KFA_MEMORY_HOST);
  }
};

// kfa_varlen_forward and kfa_varlen_backward against the reference's loop over sequences, with
// sequences of 0 and 1 queries and keys among longer ones (GQA, causal aligned per sequence).
template <class T>
void check_varlen() {
  using kfa::reference::Packed3;
  using kfa::reference::Tensor2;
  // Lengths (q, k): (5, 7), (0, 1), (1, 0), (13, 12), (1, 1).
  Packed<T> a(4, 2, 16, {0, 5, 5, 6, 19, 20}, {0, 7, 8, 8, 20, 21});
  kfa_params cp = kfa_params_default();
  cp.causal = 1;
  ASSERT_EQ(a.forward(cp), KFA_OK) << kfa_last_error();
  ASSERT_EQ(a.backward(cp), KFA_OK) << kfa_last_error();
  const int tq = a.cu_q.back(), tk = a.cu_k.back();
  const std::vector<int> cq(a.cu_q.begin(), a.cu_q.end()), ck(a.cu_k.begin(), a.cu_k.end());
  const kfa::Params p = kfa::c_api::to_params(cp);
  const Packed3 q = ref_of<Packed3>(a.q, tq, a.hq, a.d), k = ref_of<Packed3>(a.k, tk, a.hk, a.d),
                v = ref_of<Packed3>(a.v, tk, a.hk, a.d);
  const auto f = kfa::reference::varlen::check_forward<T>(
      q, k, v, cq, ck, p, ref_of<Packed3>(a.o, tq, a.hq, a.d), ref_of<Tensor2>(a.lse, a.hq, tq));
  EXPECT_TRUE(f.o.ok()) << "o: err " << f.o.err << " > " << f.o.bound;
  EXPECT_TRUE(f.lse.ok()) << "lse: err " << f.lse.err << " > " << f.lse.bound;
  const auto g = kfa::reference::varlen::check_backward<T>(
      q, k, v, cq, ck, p, ref_of<Packed3>(a.dout, tq, a.hq, a.d), Tensor2(),
      ref_of<Packed3>(a.dq, tq, a.hq, a.d), ref_of<Packed3>(a.dk, tk, a.hk, a.d),
      ref_of<Packed3>(a.dv, tk, a.hk, a.d));
  EXPECT_TRUE(g.dq.ok()) << "dq: err " << g.dq.err << " > " << g.dq.bound;
  EXPECT_TRUE(g.dk.ok()) << "dk: err " << g.dk.err << " > " << g.dk.bound;
  EXPECT_TRUE(g.dv.ok()) << "dv: err " << g.dv.err << " > " << g.dv.bound;
}

TEST(CApi, VarlenAgainstReferenceFloat) {
  check_varlen<float>();
}
TEST(CApi, VarlenAgainstReferenceDouble) {
  check_varlen<double>();
}

// Bad terms and offsets: the status, a message naming the argument, nothing written.
TEST(CApi, TermAndVarlenErrorsNameTheArgument) {
  // A term's own checks, through kfa_forward_term_f32 on expect_error's (1, 2, 5, 5) problem.
  const auto with = [](kfa_term term) {
    return [term](Arrays<float>& a) {
      const Dims& s = a.s;
      const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                       o = a.tensor(a.o, s.hq, s.nq), lse = a.rows(a.lse);
      const kfa_params p = kfa_params_default();
      return kfa_forward_term_f32(&q, &k, &k, &o, &lse, &p, &term, KFA_MEMORY_HOST);
    };
  };
  std::vector<std::uint8_t> mask(std::size_t(2) * 6 * 5, 1);
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "mask has shape (1, 2, 6, 5)",
               with(kfa_term_mask(kfa_tensor_contiguous(mask.data(), 1, 2, 6, 5))));
  const std::int32_t lengths[] = {6};
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "key_lengths(0) = 6",
               with(kfa_term_key_padding(lengths, 1, KFA_INT32)));
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "term.lengths_type = 3",
               with(kfa_term_key_padding(lengths, 1, 3)));
  const float slopes[] = {0.5f, 0.25f, 0.125f};
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "alibi slopes has shape (3)",
               with(kfa_term_alibi(slopes, 3)));
  kfa_term bad = kfa_term_alibi(slopes, 2);
  bad.values.extent[1] = 2;
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "term.values has rank 1 but extent[1] = 2", with(bad));
  bad = kfa_term_alibi(slopes, 2);
  bad.kind = 9;
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "term.kind = 9", with(bad));
  bad = kfa_term_mask(kfa_tensor_contiguous(nullptr, 1, 2, 5, 5));
  expect_error(KFA_ERROR_NULL_POINTER, "term.values.data is NULL", with(bad));
  bad.dbias.data = mask.data();
  expect_error(KFA_ERROR_INVALID_ARGUMENT, "term.dbias.data is set", with(bad));
  // A dbias of another shape than the bias: nothing written, dbias included.
  {
    Arrays<float> a({1, 2, 2, 5, 5, 16}, false, 3);
    const Dims& s = a.s;
    std::vector<float> bias(std::size_t(2) * 25, 0.5f), dbias(std::size_t(2) * 25, 7.0f);
    const kfa_term term = kfa_term_bias(kfa_tensor_contiguous(bias.data(), 1, 2, 5, 5),
                                        kfa_tensor_contiguous(dbias.data(), 1, 1, 5, 5));
    const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                     o = a.tensor(a.o, s.hq, s.nq), lse = a.rows(a.lse),
                     dq = a.tensor(a.dq, s.hq, s.nq), dk = a.tensor(a.dk, s.hk, s.nk),
                     dv = a.tensor(a.dv, s.hk, s.nk);
    const kfa_params p = kfa_params_default();
    ASSERT_EQ(kfa_forward_term_f32(&q, &k, &k, &o, &lse, &p, &term, KFA_MEMORY_HOST), KFA_OK)
        << kfa_last_error();
    EXPECT_EQ(kfa_backward_term_f32(&q, &k, &k, &o, &lse, &q, nullptr, &dq, &dk, &dv, &p, &term,
                                    KFA_MEMORY_HOST),
              KFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kfa_last_error()).find("dbias has shape (1, 1, 5, 5)"), std::string::npos)
        << kfa_last_error();
    for (float x : dbias)
      EXPECT_EQ(x, 7.0f) << "dbias written";
    for (float x : a.dq)
      EXPECT_TRUE(x != x) << "dq written";
  }
  // Offsets: one that decreases, one that does not start at 0; q with a fourth extent.
  const auto varlen_error = [](const std::string& word, auto edit) {
    Packed<float> a(2, 2, 8, {0, 3, 5}, {0, 4, 6});
    edit(a);
    EXPECT_EQ(a.forward(kfa_params_default()), KFA_ERROR_INVALID_ARGUMENT);
    const std::string msg = kfa_last_error();
    EXPECT_NE(msg.find(word), std::string::npos) << "message \"" << msg << "\" lacks " << word;
    EXPECT_EQ(msg.rfind("kfa: ", 0), 0u) << msg;
    for (float x : a.o)
      ASSERT_TRUE(x != x) << "o written";
    for (float x : a.lse)
      ASSERT_TRUE(x != x) << "lse written";
  };
  varlen_error("cu_seqlens_k[2] = 6 is less than cu_seqlens_k[1] = 7", [](Packed<float>& a) {
    a.cu_k = {0, 7, 6};
  });
  varlen_error("cu_seqlens_q[0] = 1, must be 0", [](Packed<float>& a) { a.cu_q[0] = 1; });
  varlen_error("kfa_varlen_forward_f32: q has rank 3 but extent[3] = 8",
               [](Packed<float>& a) { a.q_extent3 = 8; });
}

// The message is per thread, and a success clears it.
TEST(CApi, LastErrorIsThreadLocal) {
  Arrays<float> a({1, 1, 1, 4, 4, 8}, false, 1);
  kfa_params p = kfa_params_default();
  p.dropout = 2;
  ASSERT_EQ(c_forward(a, p), KFA_ERROR_INVALID_ARGUMENT);
  const std::string mine = kfa_last_error();
  std::string other = "unset";
  std::thread([&] { other = kfa_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(kfa_last_error(), mine);
  p.dropout = 0;
  ASSERT_EQ(c_forward(a, p), KFA_OK);
  EXPECT_STREQ(kfa_last_error(), "");
}

// The workspace entry points: a backward's temporaries stay (unless KFA_WORKSPACE_CACHE=0)
// until kfa_release_workspaces frees them; the call reports the bytes.
TEST(CApi, ReleasesWorkspaces) {
  Arrays<float> a({1, 2, 2, 40, 40, 16}, false, 3);
  ASSERT_EQ(c_forward(a, kfa_params_default()), KFA_OK) << kfa_last_error();
  ASSERT_EQ(c_backward(a, kfa_params_default(), false), KFA_OK) << kfa_last_error();
  const std::int64_t held = kfa_workspace_bytes();
  EXPECT_GE(held, 0);
  if (kfa::impl::workspace_cache_enabled()) {
    EXPECT_GE(held, 2 * 40 * 4);  // delta's B Hq Nq
  }
  EXPECT_EQ(kfa_release_workspaces(), KFA_OK);
  EXPECT_EQ(kfa_workspace_bytes(), 0);
}

// Kokkos is this program's: kfa_initialize and kfa_finalize leave it alone.
TEST(CApi, LeavesTheCallersKokkosAlone) {
  ASSERT_TRUE(Kokkos::is_initialized());
  EXPECT_EQ(kfa_initialize(), KFA_OK);
  EXPECT_EQ(kfa_finalize(), KFA_OK);
  EXPECT_TRUE(Kokkos::is_initialized());
  Arrays<double> a({1, 1, 1, 3, 3, 4}, false, 2);
  EXPECT_EQ(c_forward(a, kfa_params_default()), KFA_OK) << kfa_last_error();
}

}  // namespace
