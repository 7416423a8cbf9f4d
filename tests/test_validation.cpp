// Bad input throws kfa::Error naming the argument, before anything runs (outputs stay poisoned).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "problem.hpp"

namespace {

using namespace kfa_test;
using V4 = View4<float>;
using V3 = View3<float>;

struct Args {
  V4 q{"q", 2, 4, 10, 32}, k{"k", 2, 2, 12, 32}, v{"v", 2, 2, 12, 32}, o{"o", 2, 4, 10, 32};
  V3 lse{"lse", 2, 4, 10};
  kfa::Params p;
};

// Calls forward, expects kfa::Error whose message contains every fragment, and checks that
// the poisoned output was not touched.
void expect_error(const Args& a, const std::vector<std::string>& fragments) {
  Kokkos::deep_copy(a.o, std::numeric_limits<float>::quiet_NaN());
  try {
    kfa::forward(Exec(), a.q, a.k, a.v, a.o, a.lse, a.p);
    ADD_FAILURE() << "no kfa::Error thrown; expected one mentioning " << fragments.front();
  } catch (const kfa::Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg;
  }
  Kokkos::fence();
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.o);
  for (std::size_t e = 0; e < oh.span(); ++e)
    ASSERT_TRUE(std::isnan(oh.data()[e]));
}

TEST(Validation, ValidArgumentsPass) {
  Args a;
  EXPECT_NO_THROW(kfa::forward(Exec(), a.q, a.k, a.v, a.o, a.lse, a.p));
}

TEST(Validation, ErrorIsInvalidArgument) {
  static_assert(std::is_base_of_v<std::invalid_argument, kfa::Error>);
  Args a;
  a.k = V4("k", 3, 2, 12, 32);
  EXPECT_THROW(kfa::forward(Exec(), a.q, a.k, a.v, a.o, a.lse, a.p), std::invalid_argument);
}

TEST(Validation, ShapesThatDisagree) {
  Args a;
  a.k = V4("k", 3, 2, 12, 32);
  expect_error(a, {"k has batch = 3", "q has batch = 2"});
  a = Args();
  a.v = V4("v", 2, 2, 11, 32);
  expect_error(a, {"v has seqlen = 11", "k has seqlen = 12"});
  a = Args();
  a.v = V4("v", 2, 2, 12, 16);  // Dv may differ from D, but o must have it
  expect_error(a, {"o is (2, 4, 10, 32) but v is (2, 2, 12, 16)", "Dv = 16"});
  a = Args();
  a.k = V4("k", 2, 2, 12, 24);
  expect_error(a, {"k is (2, 2, 12, 24) but q is (2, 4, 10, 32)", "D = 32"});
  a = Args();
  a.k = V4("k", 2, 3, 12, 32);
  a.v = V4("v", 2, 3, 12, 32);
  expect_error(a, {"heads of q (4)", "heads of k and v (3)"});
  a = Args();
  a.o = V4("o", 2, 4, 9, 32);
  expect_error(a, {"o has seqlen = 9"});
  a = Args();
  a.lse = V3("lse", 2, 3, 10);
  expect_error(a, {"lse has heads = 3"});
}

TEST(Validation, HeadDimOutOfRange) {
  for (int d : {0, 257, 512}) {
    Args a;
    a.q = V4("q", 2, 4, 10, d);
    a.k = V4("k", 2, 2, 12, d);
    a.v = V4("v", 2, 2, 12, d);
    a.o = V4("o", 2, 4, 10, d);
    expect_error(a, {"head_dim = " + std::to_string(d)});
  }
}

// v (and so o) may have a head dim Dv of its own, in [1, 256] like D.
TEST(Validation, ValueHeadDim) {
  Args a;
  a.v = V4("v", 2, 2, 12, 48);
  a.o = V4("o", 2, 4, 10, 48);
  EXPECT_NO_THROW(kfa::forward(Exec(), a.q, a.k, a.v, a.o, a.lse, a.p));
  for (int dv : {0, 257}) {
    a.v = V4("v", 2, 2, 12, dv);
    a.o = V4("o", 2, 4, 10, dv);
    expect_error(a, {"head_dim = " + std::to_string(dv), "v.extent(3), Dv"});
  }
}

// The backward's Dv tensors: dout against o, dv against v, dq and dk against q and k.
TEST(Validation, BackwardValueHeadDim) {
  const int B = 1, H = 2, N = 9, D = 16, Dv = 24;
  V4 q("q", B, H, N, D), k("k", B, H, N, D), v("v", B, H, N, Dv), o("o", B, H, N, Dv);
  V3 lse("lse", B, H, N);
  kfa::forward(Exec(), q, k, v, o, lse, kfa::Params{});
  V4 dout("dout", B, H, N, Dv), dq("dq", B, H, N, D), dk("dk", B, H, N, D), dv("dv", B, H, N, Dv);
  EXPECT_NO_THROW(kfa::backward(Exec(), q, k, v, o, lse, dout, dq, dk, dv, kfa::Params{}));
  const auto expect = [&](const V4& go, const V4& gq, const V4& gk, const V4& gv,
                          const std::string& what) {
    try {
      kfa::backward(Exec(), q, k, v, o, lse, go, gq, gk, gv, kfa::Params{});
      ADD_FAILURE() << "no kfa::Error; expected " << what;
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect(V4("dout", B, H, N, D), dq, dk, dv, "dout is (1, 2, 9, 16) but o is (1, 2, 9, 24)");
  expect(dout, V4("dq", B, H, N, Dv), dk, dv, "dq is (1, 2, 9, 24) but q is (1, 2, 9, 16)");
  expect(dout, dq, V4("dk", B, H, N, Dv), dv, "dk is (1, 2, 9, 24) but k is (1, 2, 9, 16)");
  expect(dout, dq, dk, V4("dv", B, H, N, D), "dv is (1, 2, 9, 16) but v is (1, 2, 9, 24)");
}

TEST(Validation, NonUnitStride) {
  Args a;
  // LayoutLeft puts batch, not head_dim, at unit stride.
  Kokkos::View<float****, Kokkos::LayoutLeft, Device> ql("ql", 2, 4, 10, 32);
  Kokkos::deep_copy(a.o, std::numeric_limits<float>::quiet_NaN());
  try {
    kfa::forward(Exec(), ql, a.k, a.v, a.o, a.lse, a.p);
    ADD_FAILURE() << "no kfa::Error for a LayoutLeft q";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q must have unit stride"), std::string::npos) << e.what();
  }
}

TEST(Validation, BadParams) {
  Args a;
  a.p.window_left = -2;
  expect_error(a, {"window_left", "-2"});
  a = Args();
  a.p.window_right = -5;
  expect_error(a, {"window_right", "-5"});
  a = Args();
  a.p.softcap = -1;
  expect_error(a, {"softcap"});
  a = Args();
  a.p.scale = std::nan("");
  expect_error(a, {"scale"});
  a = Args();
  a.p.dropout = 1.0;
  expect_error(a, {"dropout", "[0, 1)"});
  a = Args();
  a.p.dropout = std::nan("");
  expect_error(a, {"dropout"});
}

// scale and softcap that float (the accumulation type of float inputs) cannot hold: refused,
// where they would give NaN (scale) or silently turn softcap off (it rounds to 0).
TEST(Validation, ParamsOutsideTheAccumulationType) {
  Args a;
  a.p.scale = 1e300;
  expect_error(a, {"scale = 1e+300", "float"});
  a = Args();
  a.p.scale = 1e-300;
  expect_error(a, {"scale = 1e-300", "float"});
  a = Args();
  a.p.softcap = 1e-300;
  expect_error(a, {"softcap = 1e-300", "float"});
  a = Args();
  a.p.softcap = 1e-40;  // a float subnormal: its reciprocal overflows
  expect_error(a, {"softcap = 1e-40", "float"});
  a = Args();
  a.p.softcap = 1e300;
  expect_error(a, {"softcap = 1e+300", "float"});
}

// ---- Outputs that share memory with inputs or with each other ----------------------------

// Unmanaged views onto another view's memory, at an element offset: the aliases a caller
// could pass.
using U4 = Kokkos::View<float****, Kokkos::LayoutRight, Device, Kokkos::MemoryUnmanaged>;
using U3 = Kokkos::View<float***, Kokkos::LayoutRight, Device, Kokkos::MemoryUnmanaged>;
using S4 = Kokkos::View<float****, Kokkos::LayoutStride, Device, Kokkos::MemoryUnmanaged>;

U4 alias(const V4& of, std::size_t offset = 0) {
  return U4(of.data() + offset, of.extent(0), of.extent(1), of.extent(2), of.extent(3));
}

// The forward with o (and lse) given as aliases: expects kfa::Error naming both sides.
template <class O, class L>
void expect_forward_overlap(const Args& a, const O& o, const L& lse,
                            const std::vector<std::string>& fragments) {
  try {
    kfa::forward(Exec(), a.q, a.k, a.v, o, lse, a.p);
    ADD_FAILURE() << "no kfa::Error for outputs overlapping; expected " << fragments.front();
  } catch (const kfa::Error& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(Validation, ForwardOutputsOverlappingInputs) {
  // k and v shaped like q, so that o may alias any of them.
  Args a;
  a.k = V4("k", 2, 4, 10, 32);
  a.v = V4("v", 2, 4, 10, 32);
  expect_forward_overlap(a, alias(a.k), a.lse, {"output o overlaps input k"});
  expect_forward_overlap(a, alias(a.v), a.lse, {"output o overlaps input v"});
  // o = q is refused as well (documented in validate.hpp: no backend promises it).
  expect_forward_overlap(a, alias(a.q), a.lse, {"output o overlaps input q"});
  // A partial overlap: o starting in the last row of k.
  V4 big("big", 4, 4, 10, 32);
  const U4 kb(big.data(), 2, 4, 10, 32),
      ob(big.data() + std::ptrdiff_t(2 * 4 * 10 * 32 - 32), 2, 4, 10, 32);
  try {
    kfa::forward(Exec(), a.q, kb, a.v, ob, a.lse, a.p);
    ADD_FAILURE() << "no kfa::Error for o overlapping the last row of k";
  } catch (const kfa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("o overlaps input k"), std::string::npos) << e.what();
  }
  // lse inside o: two outputs sharing memory.
  const U3 lse_in_o(a.o.data(), 2, 4, 10);
  expect_forward_overlap(a, a.o, lse_in_o, {"outputs o and lse overlap"});
  // Apart: o as rows [0, 10) of a (1, 2, 20, 32) buffer, k in the rows [10, 20) of its first
  // head, between o's two heads.
  {
    Args c;
    c.q = V4("q", 1, 2, 10, 32);
    c.lse = V3("lse", 1, 2, 10);
    V4 buf("buf", 1, 2, 20, 32);
    const auto o_rows =
        Kokkos::subview(buf, Kokkos::ALL, Kokkos::ALL, std::make_pair(0, 10), Kokkos::ALL);
    const U4 k_mid(buf.data() + std::ptrdiff_t(10 * 32), 1, 1, 10, 32);
    EXPECT_NO_THROW(kfa::forward(Exec(), c.q, k_mid, k_mid, o_rows, c.lse, c.p));
    // and k over o's second head is refused.
    const U4 k_over(buf.data() + std::ptrdiff_t(25 * 32), 1, 1, 10, 32);
    try {
      kfa::forward(Exec(), c.q, k_over, k_over, o_rows, c.lse, c.p);
      ADD_FAILURE() << "no kfa::Error for k over o's second head";
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find("o overlaps input k"), std::string::npos) << e.what();
    }
  }
  // Apart: o right after k in one buffer is fine.
  V4 two("two", 4, 4, 10, 32);
  const U4 k2(two.data(), 2, 4, 10, 32),
      o2(two.data() + std::ptrdiff_t(2 * 4 * 10 * 32), 2, 4, 10, 32);
  EXPECT_NO_THROW(kfa::forward(Exec(), a.q, k2, k2, o2, a.lse, a.p));
}

// The backward's outputs against each input and each other; outputs interleaved in one packed
// (B, N, 3, H, D) buffer, as frameworks keep dQKV, are apart and give the gradients that
// separate outputs give.
TEST(Validation, BackwardOutputsOverlapping) {
  const int B = 2, H = 2, N = 12, D = 16;
  V4 q("q", B, H, N, D), k("k", B, H, N, D), v("v", B, H, N, D), o("o", B, H, N, D),
      dout("dout", B, H, N, D), dq("dq", B, H, N, D), dk("dk", B, H, N, D), dv("dv", B, H, N, D);
  V3 lse("lse", B, H, N);
  std::mt19937_64 gen(7);
  for (V4* t : {&q, &k, &v, &dout})
    *t = to_device<float>(random_tensor("t", B, H, N, D, gen));
  const kfa::Params p;
  kfa::forward(Exec(), q, k, v, o, lse, p);
  const auto expect = [&](const auto& gq, const auto& gk, const auto& gv, const char* what) {
    try {
      kfa::backward(Exec(), q, k, v, o, lse, dout, gq, gk, gv, p);
      ADD_FAILURE() << "no kfa::Error; expected " << what;
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect(alias(q), dk, dv, "output dq overlaps input q");
  expect(alias(dout), dk, dv, "output dq overlaps input dout");
  expect(dq, alias(k), dv, "output dk overlaps input k");
  expect(dq, dk, alias(o), "output dv overlaps input o");
  expect(dq, dk, alias(dk), "outputs dk and dv overlap");

  kfa::backward(Exec(), q, k, v, o, lse, dout, dq, dk, dv, p);
  Kokkos::View<float*, Device> packed("packed", std::size_t(B) * N * 3 * H * D);
  const auto slice = [&](int c) {
    const Kokkos::LayoutStride layout(B, std::size_t(N) * 3 * H * D, H, D, N,
                                      std::size_t(3) * H * D, D, 1);
    return S4(packed.data() + std::size_t(c) * H * D, layout);
  };
  ASSERT_NO_THROW(kfa::backward(Exec(), q, k, v, o, lse, dout, slice(0), slice(1), slice(2), p));
  // The same code ran on the same inputs: the gradients agree exactly.
  const V4* sep[] = {&dq, &dk, &dv};
  for (int c = 0; c < 3; ++c) {
    const auto want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), *sep[c]);
    V4 got("got", B, H, N, D);
    Kokkos::deep_copy(got, slice(c));
    const auto goth = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
    for (std::size_t e = 0; e < goth.span(); ++e)
      ASSERT_EQ(goth.data()[e], want.data()[e]) << "gradient " << c << " element " << e;
  }
}

// ---- Extents beyond the kernels' int indices ----------------------------------------------

// Unmanaged views of any extents over a one-element buffer: validation refuses them before
// anything reads their memory.
U4 huge(const V4& at, std::size_t b, std::size_t h, std::size_t n, std::size_t d) {
  return U4(at.data(), b, h, n, d);
}

TEST(Validation, ExtentsBeyondInt) {
  V4 mem_q("q", 1, 1, 1, 1), mem_k("k", 1, 1, 1, 1), mem_v("v", 1, 1, 1, 1), mem_o("o", 1, 1, 1, 1);
  V3 lse("lse", 1, 1, 1);
  const std::size_t big = std::size_t(1) << 31;
  const auto expect = [&](std::size_t hq, std::size_t nq, std::size_t nk, std::size_t d,
                          std::size_t b, const std::string& what) {
    const U4 q = huge(mem_q, b, hq, nq, d), k = huge(mem_k, b, 1, nk, d),
             v = huge(mem_v, b, 1, nk, d), o = huge(mem_o, b, hq, nq, d);
    const U3 l(lse.data(), b, hq, nq);
    try {
      kfa::forward(Exec(), q, k, v, o, l, kfa::Params{});
      ADD_FAILURE() << "no kfa::Error; expected " << what;
    } catch (const kfa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // head_dim 2^31 + 5 was cut to int and reported as negative.
  expect(1, 1, 1, big + 5, 1, "head_dim = 2147483653");
  expect(big, 1, 1, 32, 1, "q has heads = 2147483648");
  // Kokkos 3.4 keeps extents in 32 bits (an extent of 2^32 + 4 reads back as 4); where a View
  // holds it, heads of 2^32 + 4, which an int cut to 4, are refused too.
  const std::size_t wide = (std::size_t(1) << 32) + 4;
  if (huge(mem_q, 1, wide, 1, 32).extent(1) == wide)
    expect(wide, 1, 1, 32, 1, "q has heads = 4294967300");
  expect(1, big + 1, 1, 32, 1, "q has seqlen = 2147483649");
  expect(1, 1, big, 32, 1, "k has seqlen = 2147483648");
  expect(1, 1, 1, 32, big, "q has batch = 2147483648");
  expect(65536, 1, 1, 32, 65536, "batch * heads = 65536 * 65536");
}

}  // namespace
