// The Fortran module kfa against the C++ API: forward and backward called from Fortran
// (fortran/calls.f90, through the generic kfa_forward and kfa_backward) on arrays in Fortran
// order (head_dim, seqlen, heads, batch), which are C's row-major (batch, heads, seqlen,
// head_dim), give bitwise the C++ API's results on the same inputs; a bad head ratio returns
// its status through the module and kfa_last_error() names it.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

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
void fortran_last_error(char* buf, int n);
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
