// The tile products and row operations the kernels are built from (backends/), each against a
// double-precision computation of its own: the host version (register-blocked, vectorised)
// and the portable one (on a team of several threads where the space has them), on shapes
// that hit the micro-kernel blocks and every edge path, with transposed operands read in
// place; and the host's float and double exp against the library's in higher precision.
// Compiled for each host space (the products run on host memory here): on Serial a team has
// one thread, on OpenMP and Threads the portable products run on teams of several.
#include <kfa/backends/traits.hpp>

#include <gtest/gtest.h>

#include "category.hpp"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

// Where host/tile.hpp compiles its intrinsic forms (exp2_8, exp2_16): GCC or Clang for the
// host, not a device compiler's host pass (nvcc, hipcc), which may still see __AVX512F__.
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#define KFA_TEST_HOST_INTRINSICS 1
#endif

namespace {

using Host = kfa_test::Exec;
static_assert(kfa_test::host_accessible, "test_tiles is built for host spaces only");
using Member = Kokkos::TeamPolicy<Host>::member_type;

/// Runs f(member) on one team of the host space: one thread, or up to 4 when `threads` and
/// the space allows (the portable products split rows between the team's threads).
template <class F>
void on_one_team(const F& f, bool threads = false) {
  Kokkos::TeamPolicy<Host> one(1, 1);
  const int most = one.team_size_max([](const Member&) {}, Kokkos::ParallelForTag());
  const int size = threads ? (most < 4 ? most : 4) : 1;
  Kokkos::parallel_for(Kokkos::TeamPolicy<Host>(1, size), [&](const Member& team) { f(team); });
  Kokkos::fence();
}

/// Units in the last place of x in type T.
template <class T>
double ulp_of(double x) {
  return std::ldexp(double(std::numeric_limits<T>::epsilon()), std::ilogb(x));
}

template <class Acc>
std::vector<Acc> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<Acc> x(n);
  for (auto& e : x)
    e = static_cast<Acc>(u(gen));
  return x;
}

struct Shape {
  int m, n, k;
};

template <class Ops, class Acc>
void check_gemm(const Shape& sh, bool transposed_a, bool accumulate, bool threads) {
  const int m = sh.m, n = sh.n, k = sh.k;
  // A stored either as m x k (row stride k) or as its transpose k x m, read through strides;
  // B and C with a leading dimension larger than their width, as the kernels' tiles have.
  const int a_rs = transposed_a ? 1 : k + 3, a_cs = transposed_a ? m + 5 : 1;
  const int ldb = n + 7, ldc = n + 2;
  const auto a = random_values<Acc>(std::size_t(transposed_a ? k * a_cs : m * a_rs), 1);
  const auto b = random_values<Acc>(std::size_t(k) * ldb, 2);
  auto c = random_values<Acc>(std::size_t(m) * ldc + 1, 3);
  const auto c0 = c;
  on_one_team(
      [&](const Member& team) {
        Ops::gemm(team, m, n, k, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc, accumulate);
      },
      threads);
  const double eps = std::numeric_limits<Acc>::epsilon();
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = accumulate ? double(c0[i * ldc + j]) : 0.0, mag = std::abs(ref);
      for (int p = 0; p < k; ++p) {
        const double t = double(a[i * a_rs + p * a_cs]) * double(b[p * ldb + j]);
        ref += t;
        mag += std::abs(t);
      }
      // The standard bound for a sum of k + 1 products, in any order: (k + 1) eps sum |terms|.
      ASSERT_NEAR(c[i * ldc + j], ref, (k + 2) * eps * mag + 1e-300)
          << "m=" << m << " n=" << n << " k=" << k << " at (" << i << ", " << j << ")";
    }
  // Nothing outside the m x n block is written.
  for (int i = 0; i < m; ++i)
    for (int j = n; j < ldc; ++j)
      ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
  ASSERT_EQ(c.back(), c0.back());
}

template <class Ops, class Acc>
void check_rows() {
  for (const auto& range : {std::pair{0, 64}, {3, 61}, {5, 6}, {0, 17}, {63, 64}}) {
    const int c0 = range.first, c1 = range.second;  // captured below: not a structured binding
    auto x = random_values<Acc>(64, static_cast<unsigned>(c0 * 100 + c1));
    for (auto& e : x)
      e *= Acc(30);  // scores spread over a range where exp matters
    const auto x0 = x;
    Acc mx = 0, sum = 0;
    const Acc shift = Acc(7.5);
    on_one_team([&](const Member& team) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        mx = Ops::row_max(team, x.data(), c0, c1);
        sum = Ops::row_exp_sum(team, x.data(), c0, c1, shift);
      });
    });
    double ref_max = -std::numeric_limits<double>::infinity(), ref_sum = 0;
    const double eps = std::numeric_limits<Acc>::epsilon();
    for (int c = 0; c < 64; ++c) {
      if (c < c0 || c >= c1) {
        ASSERT_EQ(x[c], x0[c]) << "outside [c0, c1) is not touched";
        continue;
      }
      ref_max = std::max(ref_max, double(x0[c]));
      const double e = std::exp(double(x0[c]) - double(shift));
      ref_sum += e;
      // exp of a rounded argument: the rounding of x - shift (and, in base 2 as the host's
      // AVX-512 path and col_softmax take it, of its product with log2(e)), |x - shift| eps
      // with check_cols' bound, plus a few ulp.
      ASSERT_NEAR(x[c], e, e * (4 + std::abs(double(x0[c]) - double(shift))) * eps) << "c=" << c;
    }
    EXPECT_EQ(double(mx), ref_max);
    EXPECT_NEAR(sum, ref_sum, ref_sum * 70 * eps);
  }
}

template <class Ops, class Acc>
void check_all_gemms(bool threads = false) {
  // Square tiles as the kernels use them, shapes smaller than one micro-kernel block, and
  // every kind of edge: rows, columns and both, with short and long k.
  const Shape shapes[] = {{64, 64, 64}, {64, 64, 128}, {128, 64, 64}, {64, 32, 64},  {8, 32, 1},
                          {1, 1, 1},    {3, 5, 7},     {13, 37, 5},   {64, 17, 128}, {7, 64, 3},
                          {63, 65, 33}, {16, 48, 64},  {0, 8, 8},     {8, 0, 8},     {8, 8, 0}};
  for (const Shape& sh : shapes)
    for (bool transposed : {false, true})
      for (bool accumulate : {false, true})
        check_gemm<Ops, Acc>(sh, transposed, accumulate, threads);
}

using HostOps = kfa::backends::TileOps<Host, float>;
using HostOpsD = kfa::backends::TileOps<Host, double>;

TEST(Tiles, HostGemmFloat) {
  check_all_gemms<HostOps, float>();
}
TEST(Tiles, HostGemmDouble) {
  check_all_gemms<HostOpsD, double>();
}
TEST(Tiles, PortableGemmFloat) {
  check_all_gemms<kfa::backends::PortableTileOps<float>, float>(true);
}
TEST(Tiles, PortableGemmDouble) {
  check_all_gemms<kfa::backends::PortableTileOps<double>, double>(true);
}
TEST(Tiles, HostRowsFloat) {
  check_rows<HostOps, float>();
}
TEST(Tiles, HostRowsDouble) {
  check_rows<HostOpsD, double>();
}
TEST(Tiles, PortableRowsFloat) {
  check_rows<kfa::backends::PortableTileOps<float>, float>();
}
TEST(Tiles, PortableRowsDouble) {
  check_rows<kfa::backends::PortableTileOps<double>, double>();
}

// Whether Ops has the products that give C's column maxima and the softmax step that takes
// them (the host's: gemm_col_max, gemm_bf16x2_col_max, col_softmax_max).
template <class Ops, class = void>
struct has_col_max : std::false_type {};
template <class Ops>
struct has_col_max<Ops, std::void_t<decltype(&Ops::template col_softmax_max<Member>)>>
    : std::true_type {};

// c2, the product with the maxima, equals c1, the product without them (NaN where c1 is NaN),
// and top[j] is the maximum of c1's column j, a NaN skipped (-inf over no rows); top[n], past
// the columns, still holds the 7 it was given.
template <class Acc>
void expect_col_max(const std::vector<Acc>& c1, const std::vector<Acc>& c2,
                    const std::vector<Acc>& top, int m, int n, int ldc) {
  for (std::size_t e = 0; e < c1.size(); ++e) {
    if (std::isnan(c1[e])) {
      ASSERT_TRUE(std::isnan(c2[e])) << "at " << e;
    } else {
      ASSERT_EQ(c2[e], c1[e]) << "at " << e;
    }
  }
  for (int j = 0; j < n; ++j) {
    Acc want = -std::numeric_limits<Acc>::infinity();
    for (int i = 0; i < m; ++i)
      if (c1[std::size_t(i) * ldc + j] > want) want = c1[std::size_t(i) * ldc + j];
    ASSERT_EQ(top[j], want) << "column " << j;
  }
  ASSERT_EQ(top[n], Acc(7)) << "past column n is not touched";
}

// gemm_col_max: C bit for bit as gemm's (itself checked against double above), and col_max[j]
// the maximum of C's column j taken here from that C: -inf over no rows, a row of NaN (a NaN
// in A) skipped; nothing past column n touched.
template <class Ops, class Acc>
void check_gemm_col_max(const Shape& sh, bool transposed_a, bool nan_row) {
  const int m = sh.m, n = sh.n, k = sh.k;
  SCOPED_TRACE(::testing::Message() << m << " x " << n << " x " << k << (transposed_a ? " A^T" : "")
                                    << (nan_row ? " NaN row" : ""));
  const int a_rs = transposed_a ? 1 : k + 3, a_cs = transposed_a ? m + 5 : 1;
  const int ldb = n + 7, ldc = n + 2;
  auto a = random_values<Acc>(std::size_t(transposed_a ? k * a_cs : m * a_rs), 1);
  if (nan_row && m > 2 && k > 0) a[std::size_t(2) * a_rs] = std::numeric_limits<Acc>::quiet_NaN();
  const auto b = random_values<Acc>(std::size_t(k) * ldb, 2);
  auto c1 = random_values<Acc>(std::size_t(m) * ldc + 1, 3), c2 = c1;
  std::vector<Acc> top(std::size_t(n) + 1, Acc(7));  // the last element is past column n
  on_one_team([&](const Member& team) {
    Ops::gemm(team, m, n, k, a.data(), a_rs, a_cs, b.data(), ldb, c1.data(), ldc, false);
    Ops::gemm_col_max(team, m, n, k, a.data(), a_rs, a_cs, b.data(), ldb, c2.data(), ldc,
                      top.data());
  });
  expect_col_max(c1, c2, top, m, n, ldc);
}

// col_softmax on a key-major score tile (rows of keys, columns of queries): rows [j0, j1) of
// the first n columns, n across the 16-lane blocks and their tails, against the combiner's
// rule computed here in double. Columns whose earlier partial is empty (m = -inf) or not,
// masked keys (-inf) giving P = 0, a column that has seen nothing at all (alpha 0, l 0), and
// nothing outside rows [j0, j1) or columns [0, n) touched.
template <class Ops, class Acc>
void check_cols(bool threads = false) {
  const int lds = 53, rows = 64;
  const Acc inf = std::numeric_limits<Acc>::infinity();
  const struct {
    int j0, j1, n;
  } cases[] = {{0, 64, 48}, {3, 17, 50}, {5, 6, 1}, {0, 40, 16}, {2, 2, 7}, {9, 64, 33}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(::testing::Message() << "rows [" << cs.j0 << ", " << cs.j1 << "), n = " << cs.n);
    auto s = random_values<Acc>(std::size_t(rows) * lds, 7);
    for (std::size_t e = 0; e < s.size(); ++e) {
      s[e] *= Acc(6);
      if (e % 11 == 3) s[e] = -inf;  // masked keys
    }
    for (int j = 0; j < rows; ++j)
      s[std::size_t(j) * lds + 4] = -inf;  // column 4 sees nothing in this tile
    const auto s0 = s;
    std::vector<Acc> m(lds), l(lds), alpha(lds, Acc(-7));
    for (int c = 0; c < lds; ++c) {
      // An earlier partial above the tile's values, within them, or empty (column 4: empty).
      m[c] = c % 3 == 0 ? Acc(9.5) : c % 3 == 1 && c != 4 ? Acc(1.25) : -inf;
      l[c] = m[c] == -inf ? Acc(0) : Acc(0.5 + 0.01 * c);
    }
    const auto m0 = m, l0 = l, alpha0 = alpha;
    on_one_team(
        [&](const Member& team) {
          Ops::col_softmax(team, s.data(), lds, cs.j0, cs.j1, cs.n, m.data(), l.data(),
                           alpha.data());
        },
        threads);
    if constexpr (has_col_max<Ops>::value) {
      // col_softmax_max with the tile's maxima given (as gemm_col_max leaves them in alpha,
      // computed here): the same m, l, alpha and P, bit for bit.
      auto s2 = s0, m2 = m0, l2 = l0, alpha2 = alpha0;
      for (int c = 0; c < cs.n; ++c) {
        alpha2[c] = -inf;
        for (int j = cs.j0; j < cs.j1; ++j)
          alpha2[c] = std::max(alpha2[c], s0[std::size_t(j) * lds + c]);
      }
      on_one_team([&](const Member& team) {
        Ops::col_softmax_max(team, s2.data(), lds, cs.j0, cs.j1, cs.n, m2.data(), l2.data(),
                             alpha2.data());
      });
      for (int c = 0; c < lds; ++c) {
        ASSERT_EQ(m2[c], m[c]) << "c=" << c;
        ASSERT_EQ(l2[c], l[c]) << "c=" << c;
        if (c < cs.n) {
          ASSERT_EQ(alpha2[c], alpha[c]) << "c=" << c;
        }
      }
      for (std::size_t e = 0; e < s.size(); ++e)
        ASSERT_EQ(s2[e], s[e]) << "P at " << e;
    }
    const double eps = std::numeric_limits<Acc>::epsilon();
    for (int c = 0; c < lds; ++c) {
      if (c >= cs.n) {
        ASSERT_EQ(m[c], m0[c]);
        ASSERT_EQ(l[c], l0[c]);
        ASSERT_EQ(alpha[c], alpha0[c]);
      }
      double top = m0[c];
      for (int j = cs.j0; j < cs.j1 && c < cs.n; ++j)
        top = std::max(top, double(s0[std::size_t(j) * lds + c]));
      const double shift = top == -double(inf) ? 0.0 : top;
      const double a = std::exp(double(m0[c]) - shift);  // 0 for an empty partial
      double sum = 0;
      for (int j = 0; j < rows; ++j) {
        const std::size_t e = std::size_t(j) * lds + c;
        if (c >= cs.n || j < cs.j0 || j >= cs.j1) {
          ASSERT_EQ(s[e], s0[e]) << "outside the block is not touched: j=" << j << " c=" << c;
          continue;
        }
        const double x = double(s0[e]) - shift;
        const double p = std::exp(x);
        sum += p;
        if (s0[e] == -inf) {
          ASSERT_EQ(s[e], Acc(0)) << "a masked key gives P = 0: j=" << j << " c=" << c;
        } else {
          ASSERT_NEAR(s[e], p, p * (4 + std::abs(x)) * eps) << "j=" << j << " c=" << c;
        }
      }
      if (c >= cs.n) continue;
      ASSERT_EQ(double(m[c]), top) << "c=" << c;
      if (m0[c] == -inf) {
        ASSERT_EQ(alpha[c], Acc(0)) << "c=" << c << ": an empty partial weighs 0";
      } else {
        ASSERT_NEAR(alpha[c], a, a * (4 + std::abs(double(m0[c]) - shift)) * eps) << "c=" << c;
      }
      const double l_ref = a * double(l0[c]) + sum;
      ASSERT_NEAR(l[c], l_ref, l_ref * 80 * eps) << "c=" << c;
      if (top == -double(inf)) {
        ASSERT_EQ(l[c], Acc(0)) << "c=" << c << " has seen nothing";
      }
    }
  }
}
TEST(Tiles, HostGemmColMax) {
  const Shape shapes[] = {{132, 64, 64}, {64, 64, 128}, {13, 37, 5}, {7, 64, 3}, {63, 65, 33},
                          {5, 16, 8},    {1, 1, 1},     {0, 8, 8},   {8, 0, 8},  {8, 8, 0}};
  for (const Shape& sh : shapes)
    for (bool transposed : {false, true})
      for (bool nan_row : {false, true}) {
        check_gemm_col_max<HostOps, float>(sh, transposed, nan_row);
        check_gemm_col_max<HostOpsD, double>(sh, transposed, nan_row);
      }
}
TEST(Tiles, HostColumnsFloat) {
  check_cols<HostOps, float>();
}
TEST(Tiles, HostColumnsDouble) {
  check_cols<HostOpsD, double>();
}
TEST(Tiles, PortableColumnsFloat) {
  check_cols<kfa::backends::PortableTileOps<float>, float>(true);
}
TEST(Tiles, PortableColumnsDouble) {
  check_cols<kfa::backends::PortableTileOps<double>, double>(true);
}

// stage_transposed: element (r, c) of rows[r] (keys c in [c0, c1)) into dst[c * ldd + r], as
// it is (Widen, float rows) or as the additive term of a boolean mask (Visibility, bytes: 0 or
// -inf), stored or added; rows and key ranges across the 8- and 16-row blocks, the 64-key
// chunks and their tails; nothing outside the block touched. Against the element rule here.
template <class Ops, class Acc, class Src, class Convert>
void check_stage_transposed() {
  const int ldd = 45, ld_src = 211, keys = 150;
  const Acc inf = std::numeric_limits<Acc>::infinity();
  const struct {
    int rows, c0, c1;
  } cases[] = {{45, 0, 150}, {16, 3, 67}, {33, 64, 128}, {17, 5, 6},
               {8, 0, 63},   {7, 10, 75}, {32, 1, 130},  {1, 0, 150}};
  std::mt19937 gen(11);
  std::vector<Src> src(std::size_t(ldd) * ld_src);
  for (auto& e : src) {
    if constexpr (std::is_integral_v<Src>) {
      const unsigned u = gen() % 4;          // hidden (0) or visible, with values other than 1
      e = static_cast<Src>(u == 3 ? 0 : u);  // a run of 0 and 3 of 4 visible on average
    } else {
      e = static_cast<Src>(std::uniform_real_distribution<double>(-2, 2)(gen));
    }
  }
  if constexpr (std::is_integral_v<Src>)  // a row with every key hidden, one with every visible
    for (int c = 0; c < keys; ++c) {
      src[std::size_t(5) * ld_src + c] = Src(0);
      src[std::size_t(20) * ld_src + c] = Src(1);
    }
  for (const bool accumulate : {false, true})
    for (const auto& cs : cases) {
      SCOPED_TRACE(::testing::Message() << "rows " << cs.rows << ", keys [" << cs.c0 << ", "
                                        << cs.c1 << "), accumulate " << accumulate);
      auto dst = random_values<Acc>(std::size_t(keys) * ldd, 5);
      const auto dst0 = dst;
      on_one_team([&](const Member& team) {
        Ops::stage_transposed(
            team, cs.rows, cs.c0, cs.c1,
            [&](int r) { return src.data() + static_cast<std::ptrdiff_t>(r) * ld_src; }, dst.data(),
            ldd, Convert{}, accumulate);
      });
      for (int c = 0; c < keys; ++c)
        for (int r = 0; r < ldd; ++r) {
          const std::size_t e = std::size_t(c) * ldd + r;
          if (r >= cs.rows || c < cs.c0 || c >= cs.c1) {
            ASSERT_EQ(dst[e], dst0[e]) << "outside the block is not touched: r=" << r << " c=" << c;
            continue;
          }
          const Src x = src[std::size_t(r) * ld_src + c];
          Acc term;
          if constexpr (std::is_integral_v<Src>)
            term = x ? Acc(0) : -inf;
          else
            term = static_cast<Acc>(x);
          ASSERT_EQ(dst[e], accumulate ? dst0[e] + term : term) << "r=" << r << " c=" << c;
        }
    }
}
TEST(Tiles, HostStageTransposed) {
  check_stage_transposed<HostOps, float, float, kfa::backends::Widen>();
  check_stage_transposed<HostOps, float, std::uint8_t, kfa::backends::Visibility>();
  check_stage_transposed<HostOpsD, double, std::uint8_t, kfa::backends::Visibility>();
}
TEST(Tiles, PortableStageTransposed) {
  check_stage_transposed<kfa::backends::PortableTileOps<float>, float, std::uint8_t,
                         kfa::backends::Visibility>();
  check_stage_transposed<kfa::backends::PortableTileOps<double>, double, float,
                         kfa::backends::Widen>();
}

// A boolean mask through visibility words (host float with AVX-512BW, VBMI and GFNI): each
// word's bits against the mask's bytes, and col_softmax with the words against col_softmax on
// the same tile with -inf written where the mask hides a key (the same arithmetic: equal).
template <class Ops, class = void>
struct has_words : std::false_type {};
template <class Ops>
struct has_words<Ops, std::enable_if_t<Ops::has_visibility_words>> : std::true_type {};

// A template, so that the branch for builds without the words is discarded, not compiled.
template <class Ops>
void check_visibility_words() {
  if constexpr (!has_words<Ops>::value) {
    GTEST_SKIP() << "no visibility words on this build (needs AVX-512BW, VBMI and GFNI)";
  } else {
    const int lds = 53, keys = 150, ld_src = 211, ldw = 160;
    const float inf = std::numeric_limits<float>::infinity();
    std::mt19937 gen(3);
    std::vector<std::uint8_t> src(std::size_t(lds) * ld_src);
    for (auto& e : src)
      e = static_cast<std::uint8_t>(gen() % 3 == 0 ? 0 : 1 + gen() % 200);
    for (int c = 0; c < keys; ++c)  // a query row that sees nothing
      src[std::size_t(9) * ld_src + c] = 0;
    const struct {
      int rows, c0, c1;
    } cases[] = {{48, 0, 64}, {53, 3, 150}, {16, 64, 128}, {17, 5, 6}, {7, 10, 75}, {33, 1, 130}};
    for (const auto& cs : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "rows " << cs.rows << ", keys [" << cs.c0 << ", " << cs.c1 << ")");
      const auto row = [&](int r) { return src.data() + static_cast<std::ptrdiff_t>(r) * ld_src; };
      std::vector<std::uint16_t> w(std::size_t(4) * ldw, 0xABCD);
      const auto w0 = w;
      Ops::visibility_words(cs.rows, cs.c0, cs.c1, row, w.data(), ldw);
      for (int g = 0; g < 4; ++g)
        for (int c = 0; c < ldw; ++c) {
          const std::uint16_t word = w[std::size_t(g) * ldw + c];
          if (c < cs.c0 || c >= cs.c1 || g * 16 >= cs.rows) {
            ASSERT_EQ(word, w0[std::size_t(g) * ldw + c]) << "not touched: g=" << g << " c=" << c;
            continue;
          }
          for (int b = 0; b < 16; ++b) {
            const int r = g * 16 + b;
            const bool seen = r < cs.rows && row(r)[c] != 0;
            ASSERT_EQ((word >> b) & 1U, seen ? 1U : 0U) << "row " << r << " key " << c;
          }
        }
      // The online-softmax step with the words, and with -inf written into the tile.
      auto s = random_values<float>(std::size_t(keys) * lds, 8);
      for (auto& e : s)
        e *= 5.0f;
      auto s_inf = s;
      for (int c = cs.c0; c < cs.c1; ++c)
        for (int r = 0; r < cs.rows; ++r)
          if (row(r)[c] == 0) s_inf[std::size_t(c) * lds + r] = -inf;
      std::vector<float> m(lds), l(lds), alpha(lds);
      for (int r = 0; r < lds; ++r) {
        m[r] = r % 4 == 0 ? -inf : 0.5f * float(r % 7);
        l[r] = m[r] == -inf ? 0.0f : 1.0f + 0.1f * float(r);
      }
      auto m2 = m, l2 = l, alpha2 = alpha;
      on_one_team([&](const Member& team) {
        Ops::col_softmax(team, s.data(), lds, cs.c0, cs.c1, cs.rows, m.data(), l.data(),
                         alpha.data(), w.data(), ldw);
        Ops::col_softmax(team, s_inf.data(), lds, cs.c0, cs.c1, cs.rows, m2.data(), l2.data(),
                         alpha2.data());
      });
      for (int r = 0; r < cs.rows; ++r) {
        ASSERT_EQ(m[r], m2[r]) << "r=" << r;
        ASSERT_EQ(l[r], l2[r]) << "r=" << r;
        ASSERT_EQ(alpha[r], alpha2[r]) << "r=" << r;
        for (int c = cs.c0; c < cs.c1; ++c)
          ASSERT_EQ(s[std::size_t(c) * lds + r], s_inf[std::size_t(c) * lds + r])
              << "P of r=" << r << " c=" << c;
      }
    }
  }
}

TEST(Tiles, HostVisibilityWords) {
  check_visibility_words<HostOps>();
}

// The bfloat16 pair products and packings (bf16x2.hpp) of the key-major bf16 forward, host
// (VDPBF16PS where the CPU has it) and portable, against double on the bfloat16 values: every
// micro-kernel block and edge, A read by rows and transposed, with and without accumulate.
std::uint16_t random_bf16(std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return kfa::backends::bf16_round(u(gen));
}

// `tiles`: inside a PairScope, where the host's products run on AMX tiles (A by rows).
template <class Ops>
void check_gemm_bf16x2(const Shape& sh, bool transposed_a, bool accumulate, bool threads,
                       bool tiles = false, float scale = 0.37f) {
  using namespace kfa::backends;
  const int m = sh.m, n = sh.n, k2 = sh.k;
  SCOPED_TRACE(::testing::Message() << m << " x " << n << " x 2*" << k2
                                    << (transposed_a ? " A^T" : "") << (accumulate ? " +=" : "")
                                    << (tiles ? " in a pair scope" : "") << " scale " << scale);
  std::mt19937 gen(unsigned(m * 131 + n * 7 + k2));
  // A as m x k2 words (row stride k2 + 3) or as its transpose k2 x m (row stride m + 5).
  const int a_ld = transposed_a ? m + 5 : k2 + 3;
  const int a_rs = transposed_a ? 1 : a_ld, a_cs = transposed_a ? a_ld : 1;
  const int ldb = n + 2, ldc = n + 1;
  std::vector<std::uint32_t> a(std::size_t(transposed_a ? k2 : m) * a_ld + 1);
  std::vector<std::uint32_t> b(std::size_t(k2) * ldb + 1);
  for (auto& w : a)
    w = bf16x2_pack(random_bf16(gen), random_bf16(gen));
  for (auto& w : b)
    w = bf16x2_pack(random_bf16(gen), random_bf16(gen));
  auto c = random_values<float>(std::size_t(m) * ldc + 1, 3);
  const auto c0 = c;
  [[maybe_unused]] long tile_calls = 0;  // the AMX products this call made, where it has them
  on_one_team(
      [&](const Member& team) {
        const typename Ops::PairScope scope(tiles);
#ifdef KFA_HOST_AMX
        tile_calls = -kfa::backends::host::amx::products;
#endif
        Ops::gemm_bf16x2(team, m, n, k2, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc, scale,
                         accumulate);
#ifdef KFA_HOST_AMX
        tile_calls += kfa::backends::host::amx::products;
#endif
      },
      threads);
#ifdef KFA_HOST_AMX
  // The tiles are taken exactly where they should be: in a scope, on a CPU that has them, for A
  // by rows, and with a block of 16 x 16 x 32 to do.
  if constexpr (std::is_same_v<Ops, HostOps>) {
    const bool want =
        tiles && Ops::bf16x2_tiles() && !transposed_a && m >= 16 && n >= 16 && k2 >= 16;
    EXPECT_EQ(tile_calls, want ? 1 : 0);
  }
#endif
  const double eps = std::numeric_limits<float>::epsilon();
  ASSERT_EQ(c.back(), c0.back()) << "past C's last row is not touched";
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < ldc; ++j) {
      const std::size_t e = std::size_t(i) * ldc + j;
      if (j >= n) {
        ASSERT_EQ(c[e], c0[e]) << "outside C is not touched";
        continue;
      }
      double sum = 0, mag = 0;
      for (int p = 0; p < k2; ++p) {
        const std::uint32_t wa = a[std::size_t(i) * a_rs + std::size_t(p) * a_cs];
        const std::uint32_t wb = b[std::size_t(p) * ldb + j];
        for (int h = 0; h < 2; ++h) {
          const double x = double(bf16_widen(std::uint16_t(wa >> (16 * h)))) *
                           double(bf16_widen(std::uint16_t(wb >> (16 * h))));
          sum += x;
          mag += std::abs(x);
        }
      }
      const double want = (accumulate ? double(c0[e]) : 0.0) + double(scale) * sum;
      ASSERT_NEAR(c[e], want, (2 * k2 + 4) * eps * (scale * mag + std::abs(double(c0[e]))))
          << "i=" << i << " j=" << j;
    }
}

template <class Ops>
void check_bf16x2_packing(bool threads) {
  using namespace kfa::backends;
  for (const auto& shape :
       {std::pair{64, 64}, {7, 37}, {1, 16}, {2, 5}, {33, 96}, {0, 8}, {128, 64}, {95, 50}}) {
    const int rows = shape.first, n = shape.second, lds = n + 3, ldo = n + 1;
    SCOPED_TRACE(::testing::Message() << rows << " rows x " << n);
    std::mt19937 gen(unsigned(rows * 17 + n));
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    std::vector<float> s(std::size_t(rows) * lds + 1);
    std::vector<std::uint16_t> v(s.size());
    for (std::size_t e = 0; e < s.size(); ++e) {
      s[e] = u(gen);
      v[e] = random_bf16(gen);
    }
    const std::size_t words = std::size_t((rows + 1) / 2) * ldo + 1;
    std::vector<std::uint32_t> packed(words, 0xdeadbeefu), interleaved(words, 0xdeadbeefu);
    // The columns' form: row c of `columns` (ldt words apart) holds what column c of `packed`
    // holds.
    const int ldt = (rows + 1) / 2 + 2;
    std::vector<std::uint32_t> columns(std::size_t(n) * ldt + 1, 0xdeadbeefu);
    on_one_team(
        [&](const Member& team) {
          Ops::pack_bf16x2_rows(team, s.data(), lds, rows, n, packed.data(), ldo);
          Ops::interleave_bf16x2_rows(team, v.data(), lds, rows, n, interleaved.data(), ldo);
          Ops::pack_bf16x2_columns(team, s.data(), lds, rows, n, columns.data(), ldt);
        },
        threads);
    for (int c = 0; c < n; ++c)
      for (int r = 0; r < ldt; ++r) {
        const std::uint32_t got = columns[std::size_t(c) * ldt + r];
        if (r >= (rows + 1) / 2)
          ASSERT_EQ(got, 0xdeadbeefu) << "outside the columns is not touched";
        else
          ASSERT_EQ(
              got,
              bf16x2_pack(bf16_round(s[std::size_t(2 * r) * lds + c]),
                          2 * r + 1 < rows ? bf16_round(s[std::size_t(2 * r + 1) * lds + c]) : 0))
              << "column " << c << " word " << r;
      }
    ASSERT_EQ(columns.back(), 0xdeadbeefu);
    for (int r = 0; r < (rows + 1) / 2; ++r)
      for (int c = 0; c < ldo; ++c) {
        const std::size_t w = std::size_t(r) * ldo + c;
        if (c >= n) {
          ASSERT_EQ(packed[w], 0xdeadbeefu) << "outside the rows is not touched";
          ASSERT_EQ(interleaved[w], 0xdeadbeefu) << "outside the rows is not touched";
          continue;
        }
        const std::size_t e0 = std::size_t(2 * r) * lds + c, e1 = e0 + lds;
        const bool pair = 2 * r + 1 < rows;
        ASSERT_EQ(packed[w], bf16x2_pack(bf16_round(s[e0]), pair ? bf16_round(s[e1]) : 0))
            << "r=" << r << " c=" << c;
        ASSERT_EQ(interleaved[w], bf16x2_pack(v[e0], pair ? v[e1] : 0)) << "r=" << r << " c=" << c;
      }
  }
}

// The same for gemm_bf16x2_col_max against gemm_bf16x2 (C = scale A B), with a row of NaN, on
// the vector products and, in a pair scope where the CPU has AMX, on the tiles.
template <class Ops>
void check_gemm_bf16x2_col_max(const Shape& sh, bool tiles) {
  using namespace kfa::backends;
  const int m = sh.m, n = sh.n, k2 = sh.k, a_rs = k2 + 3, ldb = n + 2, ldc = n + 1;
  SCOPED_TRACE(::testing::Message()
               << m << " x " << n << " x 2*" << k2 << (tiles ? " in a pair scope" : ""));
  std::mt19937 gen(unsigned(m * 29 + n * 3 + k2));
  std::vector<std::uint32_t> a(std::size_t(m) * a_rs + 1), b(std::size_t(k2) * ldb + 1);
  for (auto& w : a)
    w = bf16x2_pack(random_bf16(gen), random_bf16(gen));
  for (auto& w : b)
    w = bf16x2_pack(random_bf16(gen), random_bf16(gen));
  if (m > 2 && k2 > 0) a[std::size_t(2) * a_rs] = bf16x2_pack(0x7FC0, 0x7FC0);  // a row of NaN
  auto c1 = random_values<float>(std::size_t(m) * ldc + 1, 4), c2 = c1;
  std::vector<float> top(std::size_t(n) + 1, 7.0f);
  on_one_team([&](const Member& team) {
    const typename Ops::PairScope scope(tiles);
    Ops::gemm_bf16x2(team, m, n, k2, a.data(), a_rs, 1, b.data(), ldb, c1.data(), ldc, 0.37f,
                     false);
    Ops::gemm_bf16x2_col_max(team, m, n, k2, a.data(), a_rs, 1, b.data(), ldb, c2.data(), ldc,
                             0.37f, top.data());
  });
  expect_col_max(c1, c2, top, m, n, ldc);
}

TEST(Tiles, HostBf16x2) {
  const Shape shapes[] = {{64, 64, 32}, {64, 64, 64}, {6, 64, 1}, {13, 37, 5}, {7, 48, 9},
                          {1, 1, 1},    {63, 65, 17}, {0, 8, 8},  {8, 0, 8},   {8, 8, 0}};
  for (const Shape& sh : shapes)
    for (bool transposed : {false, true})
      for (bool accumulate : {false, true})
        check_gemm_bf16x2<HostOps>(sh, transposed, accumulate, false);
  for (const Shape& sh : shapes)
    check_gemm_bf16x2_col_max<HostOps>(sh, false);
  check_bf16x2_packing<HostOps>(false);
}
// The same in a pair scope: on AMX tiles where this machine has them (A by rows; A by columns
// still takes the vector products), every block shape (2 x 2, 2 x 1, 1 x 2, 1 x 1 tiles) and
// the edges around them, C loaded by the tiles (accumulate, scale 1), scaled after them, or
// finished from a buffer (accumulate with a scale).
TEST(Tiles, HostBf16x2Tiles) {
  const Shape shapes[] = {{64, 64, 32}, {128, 64, 32}, {64, 128, 64}, {16, 16, 16},
                          {48, 80, 40}, {33, 17, 16},  {96, 48, 20},  {17, 33, 15},
                          {15, 64, 32}, {64, 15, 32},  {150, 22, 32}, {22, 64, 64}};
  for (const Shape& sh : shapes)
    for (bool transposed : {false, true})
      for (bool accumulate : {false, true})
        for (float scale : {0.37f, 1.0f})
          check_gemm_bf16x2<HostOps>(sh, transposed, accumulate, false, true, scale);
  for (const Shape& sh : shapes)
    check_gemm_bf16x2_col_max<HostOps>(sh, true);
  if (!HostOps::bf16x2_tiles()) GTEST_SKIP() << "no AMX tiles here: the vector products ran";
}
// A pair scope gives the thread back the tile configuration it found: another library's (here
// one of its own shapes, loaded before), which may count on it staying loaded, or none.
TEST(Tiles, AmxScopeGivesBackTheConfiguration) {
#ifdef KFA_HOST_AMX
  using kfa::backends::host::amx::Config;
  if (!kfa::backends::host::amx::available()) GTEST_SKIP() << "no AMX tiles here";
  Config theirs{};
  theirs.palette = 1;
  theirs.colsb[0] = 32;
  theirs.rows[0] = 5;
  // GCC 12's configuration intrinsics tell the compiler they touch 8 bytes: barriers make it
  // write all 64 before a load and read all 64 after a store.
  const auto current = [] {
    Config c{};
    _tile_storeconfig(&c);
    asm volatile("" ::: "memory");
    return c;
  };
  const auto scope_then_current = [&] {
    {
      const HostOps::PairScope scope(true);
      EXPECT_TRUE(kfa::backends::host::amx::active());
      const Config ours = current();
      EXPECT_EQ(ours.colsb[7], 64);
      EXPECT_EQ(ours.rows[7], 16);
    }
    return current();
  };
  asm volatile("" ::: "memory");
  _tile_loadconfig(&theirs);
  const Config after = scope_then_current();
  EXPECT_EQ(std::memcmp(&after, &theirs, sizeof(Config)), 0) << "their configuration is back";
  _tile_release();
  const Config none = scope_then_current();
  EXPECT_EQ(none.palette, 0) << "no configuration found, none left";
#else
  GTEST_SKIP() << "this build has no AMX tile products";
#endif
}

TEST(Tiles, PortableBf16x2) {
  using Ops = kfa::backends::PortableTileOps<float>;
  for (const Shape& sh : {Shape{13, 37, 5}, Shape{64, 64, 32}, Shape{1, 1, 1}})
    for (bool transposed : {false, true})
      check_gemm_bf16x2<Ops>(sh, transposed, true, true);
  check_bf16x2_packing<Ops>(true);
}

// for_each_element visits every (r, c) of the tile exactly once, in both versions.
template <class Ops>
void check_for_each_element(bool threads) {
  for (const auto& shape : {std::pair{1, 1}, {3, 7}, {64, 64}, {13, 59}, {0, 5}}) {
    const int rows = shape.first, cols = shape.second;
    std::vector<int> seen(std::size_t(rows) * cols + 1, 0);
    on_one_team(
        [&](const Member& team) {
          int* count = seen.data();
          Ops::for_each_element(
              team, rows, cols, KOKKOS_LAMBDA(int r, int c) {
                Kokkos::atomic_add(&count[std::size_t(r) * cols + c], 1);
              });
        },
        threads);
    for (std::size_t e = 0; e + 1 < seen.size(); ++e)
      ASSERT_EQ(seen[e], 1) << rows << " x " << cols << " element " << e;
    ASSERT_EQ(seen.back(), 0);
  }
}
TEST(Tiles, ForEachElement) {
  check_for_each_element<HostOps>(false);
  check_for_each_element<kfa::backends::PortableTileOps<float>>(true);
}

// The host float exp over the whole range softmax feeds it (arguments <= 0 and slightly
// above, from rounding), against std::exp in double: at most 2 ulp of the result.
TEST(Tiles, HostExpFloat) {
  double worst = 0;
  for (float x = -87.0f; x <= 2.0f; x += 0.000731f) {
    const double ref = std::exp(double(x));
    const double err =
        std::abs(double(kfa::backends::host::exp_float(x)) - ref) / ulp_of<float>(ref);
    worst = std::max(worst, err);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(kfa::backends::host::exp_float(0.0f), 1.0f);
  EXPECT_EQ(kfa::backends::host::exp_float(-88.0f), 0.0f);  // below the normal range: 0
  EXPECT_EQ(kfa::backends::host::exp_float(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(kfa::backends::host::exp_float(std::nanf(""))));
}

// The softmax's 2^y forms (exp2_16, exp2_8) at one argument: NaN kept, 0 below -126 and at
// -inf, within 2 ulp of exp2 in long double above, exact powers of two at the integers.
void check_exp2(float v, float out) {
  if (std::isnan(v)) {
    ASSERT_TRUE(std::isnan(out));
  } else if (v < -126.0f) {
    ASSERT_EQ(out, 0.0f) << "y=" << v;
  } else {
    const long double ref = std::exp2(static_cast<long double>(v));
    ASSERT_LE(std::abs(static_cast<long double>(out) - ref),
              2 * ulp_of<float>(static_cast<double>(ref)))
        << "y=" << v;
    if (v == std::floor(v)) {
      ASSERT_EQ(static_cast<long double>(out), ref) << "y=" << v;
    }
  }
}

// Their arguments' grid: -130 to 4 in steps of 0.000731.
std::vector<float> exp2_arguments() {
  std::vector<float> y;
  for (float v = -130.0f; v <= 4.0f; v += 0.000731f)
    y.push_back(v);
  return y;
}

// The AVX-512 exp2_16 of the softmax's column loop: within 2 ulp of exp2 in long double from
// 2^-126 to 4 (y = (x - m) log2(e) <= 0 up to rounding), 0 below -126 and at -inf, NaN kept,
// exact powers of two at the integers; lanes left out of the mask 0.
TEST(Tiles, HostExp2_16IsExp2) {
#if defined(KFA_TEST_HOST_INTRINSICS) && defined(__AVX512F__)
  std::vector<float> y = exp2_arguments();
  for (float v : {0.0f, -0.0f, -1.0f, -2.0f, -126.0f, -125.99999f, -126.00001f, 1e-30f, -1e-30f})
    y.push_back(v);
  y.push_back(-std::numeric_limits<float>::infinity());
  y.push_back(std::nanf(""));
  while (y.size() % 16 != 0)
    y.push_back(0.5f);
  for (std::size_t i = 0; i < y.size(); i += 16) {
    float out[16];
    _mm512_storeu_ps(out, kfa::backends::host::exp2_16(_mm512_loadu_ps(&y[i])));
    for (int l = 0; l < 16; ++l) {
      ASSERT_NO_FATAL_FAILURE(check_exp2(y[i + l], out[l]));
    }
  }
  // Lanes left out of `lanes` are 0 whatever y is (a hidden score far above the maximum).
  float out[16];
  _mm512_storeu_ps(out, kfa::backends::host::exp2_16(_mm512_set1_ps(200.0f), 0x00FF));
  for (int l = 0; l < 16; ++l) {
    if (l < 8) {
      EXPECT_TRUE(std::isinf(out[l])) << "lane " << l;
    } else {
      EXPECT_EQ(out[l], 0.0f) << "lane " << l;
    }
  }
#else
  GTEST_SKIP() << "built without AVX-512, or by a device compiler";
#endif
}

// exp2_8, exp2_16's AVX2 form where AVX-512 is absent: the same bounds; within an ulp of
// exp2_16 where both exist (vreduceps rounds f down, exp2_8 to nearest); y above 127 taken as
// 127 (finite); lanes left out of the mask 0 whatever they hold (NaN, -inf, above the range).
TEST(Tiles, HostExp2_8IsExp2) {
#if defined(KFA_TEST_HOST_INTRINSICS) && defined(__AVX2__) && defined(__FMA__)
  std::vector<float> y = exp2_arguments();
  for (float v : {0.0f, -0.0f, -1.0f, -2.0f, -126.0f, -125.99999f, -126.00001f, 1e-30f, -1e-30f,
                  127.0f, 126.5f, -126.5f, -127.0f, -127.00001f})
    y.push_back(v);
  y.push_back(-std::numeric_limits<float>::infinity());
  y.push_back(std::nanf(""));
  while (y.size() % 16 != 0)
    y.push_back(0.5f);
  for (std::size_t i = 0; i < y.size(); i += 8) {
    float out[8];
    _mm256_storeu_ps(out, kfa::backends::host::exp2_8(_mm256_loadu_ps(&y[i])));
    for (int l = 0; l < 8; ++l) {
      ASSERT_NO_FATAL_FAILURE(check_exp2(y[i + l], out[l]));
    }
  }
#ifdef __AVX512F__
  for (std::size_t i = 0; i < y.size(); i += 16) {
    float wide[16], narrow[16];
    _mm512_storeu_ps(wide, kfa::backends::host::exp2_16(_mm512_loadu_ps(&y[i])));
    _mm256_storeu_ps(narrow, kfa::backends::host::exp2_8(_mm256_loadu_ps(&y[i])));
    _mm256_storeu_ps(narrow + 8, kfa::backends::host::exp2_8(_mm256_loadu_ps(&y[i + 8])));
    for (int l = 0; l < 16; ++l) {
      if (y[i + l] > 127.0f || std::isnan(y[i + l])) continue;  // exp2_16: inf above 127
      ASSERT_LE(std::abs(double(wide[l]) - double(narrow[l])), ulp_of<float>(double(wide[l])))
          << "y=" << y[i + l];
    }
  }
#endif
  // Far above the range: finite (taken as 127), and no overflow raised; lanes outside the
  // mask 0 whatever y is.
  float out[8];
  const float inf = std::numeric_limits<float>::infinity();
  const __m256 half = _mm256_castsi256_ps(_mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0));
  __m256 far = _mm256_set1_ps(200.0f);
  asm volatile("" : "+x"(far));  // not folded at compile time
  std::feclearexcept(FE_OVERFLOW);
  far = kfa::backends::host::exp2_8(far, half);
  asm volatile("" : "+x"(far));  // computed before the flags are read
  EXPECT_FALSE(std::fetestexcept(FE_OVERFLOW));
  _mm256_storeu_ps(out, far);
  for (int l = 0; l < 8; ++l) {
    if (l < 4) {
      EXPECT_EQ(out[l], std::exp2(127.0f)) << "lane " << l;
    } else {
      EXPECT_EQ(out[l], 0.0f) << "lane " << l;
    }
  }
  _mm256_storeu_ps(out, kfa::backends::host::exp2_8(_mm256_set1_ps(inf)));
  for (float x : out)
    EXPECT_EQ(x, std::exp2(127.0f));  // +inf unmasked: taken as 127 too
  _mm256_storeu_ps(
      out, kfa::backends::host::exp2_8(
               _mm256_setr_ps(127.5f, 1.0f, 2.0f, 3.0f, std::nanf(""), -inf, 127.5f, inf), half));
  EXPECT_EQ(out[0], std::exp2(127.0f));  // (127, 128): taken as 127
  EXPECT_EQ(out[1], 2.0f);
  for (int l = 4; l < 8; ++l)
    EXPECT_EQ(out[l], 0.0f) << "lane " << l;
#else
  GTEST_SKIP() << "built without AVX2 and FMA, or by a device compiler";
#endif
}

// The host double exp likewise, against long double: at most 2 ulp.
TEST(Tiles, HostExpDouble) {
  long double worst = 0;
  for (double x = -708.0; x <= 2.0; x += 0.0137) {
    const long double ref = std::exp(static_cast<long double>(x));
    const long double err = std::abs(kfa::backends::host::exp_double(x) - ref) /
                            ulp_of<double>(static_cast<double>(ref));
    worst = std::max(worst, err);
  }
  EXPECT_LE(worst, 2.0L);
  EXPECT_EQ(kfa::backends::host::exp_double(0.0), 1.0);
  EXPECT_EQ(kfa::backends::host::exp_double(-709.0), 0.0);
  EXPECT_EQ(kfa::backends::host::exp_double(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_TRUE(std::isnan(kfa::backends::host::exp_double(std::nan(""))));
}

}  // namespace
