// The C interface (<kfa/kfa.h>) against the C++ API: the same inputs give bitwise the same
// outputs (float and double, forward and backward, causal, GQA, (batch, seqlen, heads, head_dim)
// strides), every error path returns its status with a message naming the argument and writes
// nothing, and kfa_params carries every field of kfa::Params (kfa::for_each_field's list).
#include <gtest/gtest.h>
#include <kfa/kfa.h>
#include <kfa/kfa.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
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
