#pragma once
// One attention problem in plain host arrays, described for the C interface (kfa_tensor) and
// for the C++ API (Views of the same memory), and run through the C++ API: the suites of the C
// and Fortran interfaces compare their calls with it bitwise.
#include <kfa/kfa.h>
#include <kfa/kfa.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace kfa_test {

using Host = Kokkos::DefaultHostExecutionSpace;

struct Dims {
  int b = 1, hq = 1, hk = 1, nq = 1, nk = 1, d = 16;
  int d_v = 0;  ///< v's, o's, dout's and dv's head dim; 0: d
  /// v's head dim.
  int dv() const { return d_v > 0 ? d_v : d; }
};

/// One problem's arrays, in (batch, heads, seqlen, head_dim) order, or in
/// (batch, seqlen, heads, head_dim) order when bnhd (lse and dlse then (batch, seqlen, heads)).
template <class T>
struct Arrays {
  Dims s;
  bool bnhd = false;
  std::vector<T> q, k, v, o, lse, dout, dlse, dq, dk, dv;

  Arrays(const Dims& dims, bool bnhd_, std::uint64_t seed) : s(dims), bnhd(bnhd_) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    const auto fill = [&](std::vector<T>& a, std::size_t n) {
      a.resize(n);
      for (T& x : a)
        x = static_cast<T>(u(gen));
    };
    const std::size_t nq = std::size_t(s.b) * s.hq * s.nq, nk = std::size_t(s.b) * s.hk * s.nk;
    const std::size_t d = s.d, d_v = s.dv();
    fill(q, nq * d);
    fill(k, nk * d);
    fill(v, nk * d_v);
    fill(dout, nq * d_v);
    fill(dlse, nq);
    // Outputs start as NaN so that a value left unwritten shows.
    const T nan = std::numeric_limits<T>::quiet_NaN();
    o.assign(nq * d_v, nan);
    lse.assign(nq, nan);
    dq.assign(nq * d, nan);
    dk.assign(nk * d, nan);
    dv.assign(nk * d_v, nan);
  }

  /// The C description of a rank-4 array with h heads, n rows per head and rows of d values
  /// (0: s.d; v's arrays take s.dv()).
  kfa_tensor tensor(std::vector<T>& a, int h, int n, int d = 0) const {
    if (d == 0) d = s.d;
    kfa_tensor t = kfa_tensor_contiguous(a.data(), s.b, h, n, d);
    if (bnhd) {
      const std::int64_t st[4] = {std::int64_t(n) * h * d, d, std::int64_t(h) * d, 1};
      std::memcpy(t.stride, st, sizeof st);
    }
    return t;
  }
  kfa_tensor rows(std::vector<T>& a) const {
    kfa_tensor t = kfa_tensor_contiguous(a.data(), s.b, s.hq, s.nq, 0);
    if (bnhd) {
      const std::int64_t st[4] = {std::int64_t(s.nq) * s.hq, 1, s.hq, 0};
      std::memcpy(t.stride, st, sizeof st);
    }
    return t;
  }

  /// The C++ API's View of the same memory.
  using View4 = Kokkos::View<T****, Kokkos::LayoutStride, Kokkos::HostSpace>;
  using View3 = Kokkos::View<T***, Kokkos::LayoutStride, Kokkos::HostSpace>;
  View4 view(std::vector<T>& a, int h, int n, int width = 0) const {
    const kfa_tensor t = tensor(a, h, n, width);
    const std::size_t d = t.extent[3];
    return View4(a.data(),
                 bnhd ? Kokkos::LayoutStride(s.b, t.stride[0], h, t.stride[1], n, t.stride[2], d, 1)
                      : Kokkos::LayoutStride(s.b, std::size_t(h) * n * d, h, n * d, n, d, d, 1));
  }
  View3 row_view(std::vector<T>& a) const {
    const std::size_t b = s.b, h = s.hq, n = s.nq;
    return View3(a.data(), bnhd ? Kokkos::LayoutStride(b, n * h, h, 1, n, h)
                                : Kokkos::LayoutStride(b, h * n, h, n, n, 1));
  }
};

template <class T>
void cxx_forward(Arrays<T>& a, const kfa::Params& p) {
  const Dims& s = a.s;
  const int dv = s.dv();
  kfa::forward(Host(), a.view(a.q, s.hq, s.nq), a.view(a.k, s.hk, s.nk),
               a.view(a.v, s.hk, s.nk, dv), a.view(a.o, s.hq, s.nq, dv), a.row_view(a.lse), p);
  Host().fence();
}

template <class T>
void cxx_backward(Arrays<T>& a, const kfa::Params& p, bool with_dlse) {
  const Dims& s = a.s;
  const int d_v = s.dv();
  if (with_dlse)
    kfa::backward(Host(), a.view(a.q, s.hq, s.nq), a.view(a.k, s.hk, s.nk),
                  a.view(a.v, s.hk, s.nk, d_v), a.view(a.o, s.hq, s.nq, d_v), a.row_view(a.lse),
                  a.view(a.dout, s.hq, s.nq, d_v), a.row_view(a.dlse), a.view(a.dq, s.hq, s.nq),
                  a.view(a.dk, s.hk, s.nk), a.view(a.dv, s.hk, s.nk, d_v), p);
  else
    kfa::backward(Host(), a.view(a.q, s.hq, s.nq), a.view(a.k, s.hk, s.nk),
                  a.view(a.v, s.hk, s.nk, d_v), a.view(a.o, s.hq, s.nq, d_v), a.row_view(a.lse),
                  a.view(a.dout, s.hq, s.nq, d_v), a.view(a.dq, s.hq, s.nq),
                  a.view(a.dk, s.hk, s.nk), a.view(a.dv, s.hk, s.nk, d_v), p);
  Host().fence();
}

template <class T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

}  // namespace kfa_test
