// The Fortran module kfa against the C++ API: forward and backward called from Fortran
// (fortran/calls.f90, through the generic kfa_forward and kfa_backward) on arrays in Fortran
// order (head_dim, seqlen, heads, batch), which are C's row-major (batch, heads, seqlen,
// head_dim), give bitwise the C++ API's results on the same inputs; a bad head ratio returns
// its status through the module and kfa_last_error() names it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "c_arrays.hpp"

extern "C" {
void fortran_forward_f32(int d, int e, int nq, int hq, int nk, int hk, int b, const float* q,
                         const float* k, const float* v, float* o, float* lse, int causal,
                         int* status);
void fortran_forward_f64(int d, int e, int nq, int hq, int nk, int hk, int b, const double* q,
                         const double* k, const double* v, double* o, double* lse, int causal,
                         int* status);
void fortran_backward_f32(int d, int e, int nq, int hq, int nk, int hk, int b, const float* q,
                          const float* k, const float* v, const float* o, const float* lse,
                          const float* dout, const float* dlse, float* dq, float* dk, float* dv,
                          int causal, int with_dlse, int* status);
void fortran_backward_f64(int d, int e, int nq, int hq, int nk, int hk, int b, const double* q,
                          const double* k, const double* v, const double* o, const double* lse,
                          const double* dout, const double* dlse, double* dq, double* dk,
                          double* dv, int causal, int with_dlse, int* status);
void fortran_bias_f64(int d, int nq, int hq, int nk, int hk, int b, const double* q,
                      const double* k, const double* v, double* o, double* lse, const double* dout,
                      double* dq, double* dk, double* dv, const double* bias, double* dbias,
                      int* status);
void fortran_varlen_f32(int d, int hq, int hk, int nb, int tq, int tk, const float* q,
                        const float* k, const float* v, const std::int32_t* cu_q,
                        const std::int32_t* cu_k, float* o, float* lse, const float* dout,
                        float* dq, float* dk, float* dv, int* status);
void fortran_term_f32(int d, int nq, int hq, int nk, int hk, int b, const float* q, const float* k,
                      const float* v, float* o, float* lse, const std::uint8_t* mask,
                      const std::int32_t* key_lengths, int which, int* status);
void fortran_last_error(char* buf, int n);
void fortran_release_workspaces(std::int64_t* bytes, int* status);
}

namespace {

using kfa_test::Arrays;
using kfa_test::Dims;
using kfa_test::same_bits;

template <class T>
int fortran_forward(Arrays<T>& a, int causal) {
  const Dims& s = a.s;
  int status = -1;
  if constexpr (std::is_same_v<T, float>)
    fortran_forward_f32(s.d, s.dv(), s.nq, s.hq, s.nk, s.hk, s.b, a.q.data(), a.k.data(),
                        a.v.data(), a.o.data(), a.lse.data(), causal, &status);
  else
    fortran_forward_f64(s.d, s.dv(), s.nq, s.hq, s.nk, s.hk, s.b, a.q.data(), a.k.data(),
                        a.v.data(), a.o.data(), a.lse.data(), causal, &status);
  return status;
}

template <class T>
int fortran_backward(Arrays<T>& a, int causal, int with_dlse) {
  const Dims& s = a.s;
  int status = -1;
  if constexpr (std::is_same_v<T, float>)
    fortran_backward_f32(s.d, s.dv(), s.nq, s.hq, s.nk, s.hk, s.b, a.q.data(), a.k.data(),
                         a.v.data(), a.o.data(), a.lse.data(), a.dout.data(), a.dlse.data(),
                         a.dq.data(), a.dk.data(), a.dv.data(), causal, with_dlse, &status);
  else
    fortran_backward_f64(s.d, s.dv(), s.nq, s.hq, s.nk, s.hk, s.b, a.q.data(), a.k.data(),
                         a.v.data(), a.o.data(), a.lse.data(), a.dout.data(), a.dlse.data(),
                         a.dq.data(), a.dk.data(), a.dv.data(), causal, with_dlse, &status);
  return status;
}

std::string fortran_message() {
  char buf[512];
  fortran_last_error(buf, sizeof buf);
  return buf;
}

template <class T>
void check_same(const Dims& s, int causal, int with_dlse) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << s.b << " Hq=" << s.hq << " Hk=" << s.hk << " Nq=" << s.nq
               << " Nk=" << s.nk << " D=" << s.d << " Dv=" << s.dv() << " causal=" << causal
               << " dlse=" << with_dlse << " " << sizeof(T) * 8 << "-bit");
  Arrays<T> f(s, false, 11), cxx(s, false, 11);
  ASSERT_EQ(fortran_forward(f, causal), KFA_OK) << fortran_message();
  kfa::Params p;
  p.causal = causal != 0;
  kfa_test::cxx_forward(cxx, p);
  EXPECT_TRUE(same_bits(f.o, cxx.o));
  EXPECT_TRUE(same_bits(f.lse, cxx.lse));
  ASSERT_EQ(fortran_backward(f, causal, with_dlse), KFA_OK) << fortran_message();
  kfa_test::cxx_backward(cxx, p, with_dlse != 0);
  EXPECT_TRUE(same_bits(f.dq, cxx.dq));
  EXPECT_TRUE(same_bits(f.dk, cxx.dk));
  EXPECT_TRUE(same_bits(f.dv, cxx.dv));
}

TEST(Fortran, SameBitsAsCxx) {
  check_same<float>({1, 2, 2, 33, 33, 16}, 1, 0);
  check_same<float>({2, 4, 2, 17, 40, 32}, 1, 1);  // GQA, Nq != Nk
  check_same<double>({1, 2, 2, 33, 33, 16}, 1, 0);
  check_same<double>({2, 3, 1, 20, 9, 8}, 0, 1);       // MQA
  check_same<float>({2, 4, 2, 19, 30, 16, 40}, 1, 1);  // v's head dim of its own
  check_same<double>({1, 2, 1, 25, 25, 24, 8}, 0, 0);
}

// kfa_forward / kfa_backward with bias= and dbias=: bitwise the C interface's
// kfa_forward_term_f64 / kfa_backward_term_f64 on the same arrays (the C interface is checked
// against the reference in test_c_api).
TEST(Fortran, BiasSameBitsAsC) {
  const Dims s{2, 4, 2, 11, 14, 16};
  Arrays<double> f(s, false, 21), c(s, false, 21);
  std::vector<double> bias(std::size_t(s.b) * s.hq * s.nq * s.nk);
  for (std::size_t e = 0; e < bias.size(); ++e)
    bias[e] = 0.01 * static_cast<double>(e % 97) - 0.5;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> fdb(bias.size(), nan), cdb(bias.size(), nan);
  int status = -1;
  fortran_bias_f64(s.d, s.nq, s.hq, s.nk, s.hk, s.b, f.q.data(), f.k.data(), f.v.data(), f.o.data(),
                   f.lse.data(), f.dout.data(), f.dq.data(), f.dk.data(), f.dv.data(), bias.data(),
                   fdb.data(), &status);
  ASSERT_EQ(status, KFA_OK) << fortran_message();
  const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                   v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                   lse = c.rows(c.lse), dout = c.tensor(c.dout, s.hq, s.nq),
                   dq = c.tensor(c.dq, s.hq, s.nq), dk = c.tensor(c.dk, s.hk, s.nk),
                   dv = c.tensor(c.dv, s.hk, s.nk);
  const kfa_term term = kfa_term_bias(kfa_tensor_contiguous(bias.data(), s.b, s.hq, s.nq, s.nk),
                                      kfa_tensor_contiguous(cdb.data(), s.b, s.hq, s.nq, s.nk));
  kfa_params p = kfa_params_default();
  p.causal = 1;
  ASSERT_EQ(kfa_forward_term_f64(&q, &k, &v, &o, &lse, &p, &term, KFA_MEMORY_HOST), KFA_OK);
  ASSERT_EQ(kfa_backward_term_f64(&q, &k, &v, &o, &lse, &dout, nullptr, &dq, &dk, &dv, &p, &term,
                                  KFA_MEMORY_HOST),
            KFA_OK);
  EXPECT_TRUE(same_bits(f.o, c.o));
  EXPECT_TRUE(same_bits(f.lse, c.lse));
  EXPECT_TRUE(same_bits(f.dq, c.dq));
  EXPECT_TRUE(same_bits(f.dk, c.dk));
  EXPECT_TRUE(same_bits(f.dv, c.dv));
  EXPECT_TRUE(same_bits(fdb, cdb));
  for (double x : fdb)
    ASSERT_TRUE(x == x) << "dbias not written";
}

// A mask and key lengths given to kfa_forward in Fortran, and the mask as a section that is not
// contiguous: bitwise kfa_forward_term_f32 on the same arrays. (BiasSameBitsAsC gives bias and
// dbias; every other case leaves the optional term arrays absent, which the module forwards.)
TEST(Fortran, MaskAndKeyLengthsSameBitsAsC) {
  const Dims s{2, 4, 2, 13, 17, 16};
  std::vector<std::uint8_t> mask(std::size_t(s.b) * s.hq * s.nq * s.nk);
  for (std::size_t e = 0; e < mask.size(); ++e)
    mask[e] = (e * 7 + e / 5) % 3 != 0;
  const std::vector<std::int32_t> lengths{9, 0};  // the second batch sees no key
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(which == 0 ? "mask" : which == 1 ? "key lengths" : "mask section");
    Arrays<float> f(s, false, 31), c(s, false, 31);
    int status = -1;
    fortran_term_f32(s.d, s.nq, s.hq, s.nk, s.hk, s.b, f.q.data(), f.k.data(), f.v.data(),
                     f.o.data(), f.lse.data(), mask.data(), lengths.data(), which, &status);
    ASSERT_EQ(status, KFA_OK) << fortran_message();
    const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                     v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                     lse = c.rows(c.lse);
    const kfa_term term =
        which == 1 ? kfa_term_key_padding(lengths.data(), s.b, KFA_INT32)
                   : kfa_term_mask(kfa_tensor_contiguous(mask.data(), s.b, s.hq, s.nq, s.nk));
    const kfa_params p = kfa_params_default();
    ASSERT_EQ(kfa_forward_term_f32(&q, &k, &v, &o, &lse, &p, &term, KFA_MEMORY_HOST), KFA_OK);
    EXPECT_TRUE(same_bits(f.o, c.o));
    EXPECT_TRUE(same_bits(f.lse, c.lse));
  }
}

// kfa_varlen_forward / kfa_varlen_backward: bitwise the C interface's on the same packed arrays,
// with sequences of 0 and 1 queries and keys.
TEST(Fortran, VarlenSameBitsAsC) {
  const int hq = 4, hk = 2, d = 16;
  std::vector<std::int32_t> cu_q = {0, 6, 6, 7, 18}, cu_k = {0, 9, 10, 10, 21};
  const int nb = 4, tq = cu_q.back(), tk = cu_k.back();
  // Packed (total, heads, head_dim) arrays as an Arrays problem of batch 1 whose "heads" hold
  // the rows: the values are any, only the sizes matter.
  Arrays<float> f({1, tq, tk, hq, hk, d}, false, 23), c({1, tq, tk, hq, hk, d}, false, 23);
  int status = -1;
  fortran_varlen_f32(d, hq, hk, nb, tq, tk, f.q.data(), f.k.data(), f.v.data(), cu_q.data(),
                     cu_k.data(), f.o.data(), f.lse.data(), f.dout.data(), f.dq.data(), f.dk.data(),
                     f.dv.data(), &status);
  ASSERT_EQ(status, KFA_OK) << fortran_message();
  const auto packed = [&](std::vector<float>& a, int total, int heads) {
    kfa_tensor t{};
    t.data = a.data();
    t.extent[0] = total;
    t.extent[1] = heads;
    t.extent[2] = d;
    return t;
  };
  const auto offsets = [](std::vector<std::int32_t>& x) {
    kfa_tensor t{};
    t.data = x.data();
    t.extent[0] = static_cast<std::int64_t>(x.size());
    return t;
  };
  const kfa_tensor q = packed(c.q, tq, hq), k = packed(c.k, tk, hk), v = packed(c.v, tk, hk),
                   o = packed(c.o, tq, hq), dout = packed(c.dout, tq, hq),
                   dq = packed(c.dq, tq, hq), dk = packed(c.dk, tk, hk), dv = packed(c.dv, tk, hk),
                   cq = offsets(cu_q), ck = offsets(cu_k);
  kfa_tensor lse{};
  lse.data = c.lse.data();
  lse.extent[0] = hq;
  lse.extent[1] = tq;
  kfa_params p = kfa_params_default();
  p.causal = 1;
  ASSERT_EQ(kfa_varlen_forward_f32(&q, &k, &v, &cq, &ck, &o, &lse, &p, KFA_MEMORY_HOST), KFA_OK)
      << kfa_last_error();
  ASSERT_EQ(kfa_varlen_backward_f32(&q, &k, &v, &o, &lse, &dout, nullptr, &cq, &ck, &dq, &dk, &dv,
                                    &p, KFA_MEMORY_HOST),
            KFA_OK)
      << kfa_last_error();
  EXPECT_TRUE(same_bits(f.o, c.o));
  EXPECT_TRUE(same_bits(f.lse, c.lse));
  EXPECT_TRUE(same_bits(f.dq, c.dq));
  EXPECT_TRUE(same_bits(f.dk, c.dk));
  EXPECT_TRUE(same_bits(f.dv, c.dv));
}

// kfa_release_workspaces and kfa_workspace_bytes from Fortran: nothing held after a release.
TEST(Fortran, ReleasesWorkspaces) {
  Arrays<float> a({1, 2, 2, 20, 20, 16}, false, 4);
  ASSERT_EQ(fortran_forward(a, 0), KFA_OK) << fortran_message();
  ASSERT_EQ(fortran_backward(a, 0, 0), KFA_OK) << fortran_message();  // takes delta
  EXPECT_GT(kfa_workspace_bytes(), kfa::impl::workspace_cache_enabled() ? 0 : -1);
  std::int64_t bytes = -1;
  int status = -1;
  fortran_release_workspaces(&bytes, &status);
  EXPECT_EQ(status, KFA_OK);
  EXPECT_EQ(bytes, 0);
}

TEST(Fortran, StatusAndMessage) {
  Arrays<float> a({1, 3, 2, 5, 5, 16}, false, 3);  // 3 query heads over 2 key heads
  EXPECT_EQ(fortran_forward(a, 1), KFA_ERROR_INVALID_ARGUMENT);
  const std::string msg = fortran_message();
  EXPECT_NE(msg.find("heads of q (3) must be a positive multiple of heads of k and v (2)"),
            std::string::npos)
      << msg;
  for (float x : a.o)
    EXPECT_TRUE(x != x) << "o written on error";
}

}  // namespace
