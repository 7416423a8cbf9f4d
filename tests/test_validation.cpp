// Bad input throws kfa::Error naming the argument, before anything runs (outputs stay poisoned).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
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
  a.v = V4("v", 2, 2, 12, 16);
  expect_error(a, {"v has head_dim = 16"});
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

}  // namespace
