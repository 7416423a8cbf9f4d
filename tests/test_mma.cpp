// The warp-level tensor-core primitives of backends/cuda/mma.hpp.
//
// On the host (what CI runs) an emulator of mma.sync, written here from the PTX ISA's fragment
// tables (transcribed below, not taken from the library's layout functions), takes the
// fragments the library loads for all 32 lanes, rebuilds A, B and C from the registers,
// multiplies in double and hands D back to the lanes through the C table; the library's
// store_c writes it out, and it is compared with a product of the inputs rounded by this
// file's own rounding. The rounding itself is checked bit for bit against a reference that
// rounds by arithmetic in double, not by bits. With Kokkos' CUDA backend the same problems
// run on the tensor cores, and the device's rounding is compared with the host's bit for bit.
// The fragments' loads from 16-bit shared-memory tiles (cuda/ldmatrix.hpp) are checked the
// same way, through an emulation of ldmatrix and of shared memory's bank groups.
#include <kfa/backends/cuda/ldmatrix.hpp>
#include <kfa/backends/cuda/mma.hpp>
#include <kfa/backends/cuda/warp_backward.hpp>
#include <kfa/backends/cuda/warp_forward.hpp>
#include <kfa/backends/cuda/warp_forward_tf32x3.hpp>
#include <kfa/backends/cuda/warp_softmax.hpp>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The simulator's lanes switch stacks (below); AddressSanitizer is told of each switch.
#if defined(__SANITIZE_ADDRESS__)
#define KFA_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KFA_SIM_ASAN 1
#endif
#endif
#ifdef KFA_SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

namespace kc = kfa::backends::cuda;

// Random inputs come from this seed, printed by every test that uses it.
constexpr std::uint64_t kSeed = 0x6b66612d6d6d61u;

float float_from(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
std::uint32_t bits_from(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// ---------------------------------------------------------------------------------------------
// Rounding reference: round to nearest, ties to even, by scaling x to an integer number of
// quanta in double and std::nearbyint (the default rounding mode), not by bit manipulation.

struct Format {
  int precision;  // significand bits, the implicit one included
  int emin;       // exponent of the smallest normal number
  int emax;       // exponent of the largest finite number
};
constexpr Format kBf16Format{8, -126, 127};
constexpr Format kF16Format{11, -14, 15};
constexpr Format kTf32Format{11, -126, 127};

double round_ref(float x, Format f) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  const int e = std::max(std::ilogb(x), f.emin);  // below emin: the subnormal quantum
  const double quantum = std::ldexp(1.0, e - f.precision + 1);
  const double r = std::nearbyint(double(x) / quantum) * quantum;  // exact: x has 24 bits
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.precision), f.emax);
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

// Decoders of the three encodings, written from the formats' definitions.
double decode_bf16(std::uint16_t h) {
  return float_from(std::uint32_t(h) << 16);
}
double decode_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f)
    return std::copysign(
        m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity(),
        sign);
  if (e == 0) return sign * std::ldexp(double(m), -24);
  return sign * std::ldexp(double(1024 + m), e - 25);
}
double decode_tf32(std::uint32_t u) {
  return float_from(u);
}

// ---------------------------------------------------------------------------------------------
// The PTX ISA's fragment tables, transcribed. For a lane, groupID g = lane >> 2 and
// threadID_in_group t = lane % 4; each element's row is row_g * g + row_t * t + row_c and its
// column col_g * g + col_t * t + col_c.
//
// "Matrix Fragments for mma.m16n8k16 with floating point type", .f16 / .bf16:
//   A (16 x 16): row = g for a0, a1, a4, a5, g + 8 otherwise;
//                col = 2t + (i & 1) for a0..a3, 2t + (i & 1) + 8 for a4..a7.
//   B (16 x 8):  row = 2t + (i & 1) for b0, b1, 2t + (i & 1) + 8 for b2, b3; col = g.
// "Matrix Fragments for mma.m16n8k8", .tf32:
//   A (16 x 8):  row = g for a0, a2, g + 8 for a1, a3; col = t for a0, a1, t + 4 for a2, a3.
//   B (8 x 8):   row = t for b0, t + 4 for b1; col = g.
// Accumulators C and D (16 x 8, .f32), both shapes:
//   row = g for c0, c1, g + 8 for c2, c3; col = 2t + (i & 1).

struct Entry {
  int row_g, row_t, row_c, col_g, col_t, col_c;
  int row(int lane) const { return row_g * (lane >> 2) + row_t * (lane % 4) + row_c; }
  int col(int lane) const { return col_g * (lane >> 2) + col_t * (lane % 4) + col_c; }
};

constexpr Entry kA16[8] = {{1, 0, 0, 0, 2, 0}, {1, 0, 0, 0, 2, 1}, {1, 0, 8, 0, 2, 0},
                           {1, 0, 8, 0, 2, 1}, {1, 0, 0, 0, 2, 8}, {1, 0, 0, 0, 2, 9},
                           {1, 0, 8, 0, 2, 8}, {1, 0, 8, 0, 2, 9}};
constexpr Entry kB16[4] = {
    {0, 2, 0, 1, 0, 0}, {0, 2, 1, 1, 0, 0}, {0, 2, 8, 1, 0, 0}, {0, 2, 9, 1, 0, 0}};
constexpr Entry kA8[4] = {
    {1, 0, 0, 0, 1, 0}, {1, 0, 8, 0, 1, 0}, {1, 0, 0, 0, 1, 4}, {1, 0, 8, 0, 1, 4}};
constexpr Entry kB8[2] = {{0, 1, 0, 1, 0, 0}, {0, 1, 4, 1, 0, 0}};
constexpr Entry kC[4] = {
    {1, 0, 0, 0, 2, 0}, {1, 0, 0, 0, 2, 1}, {1, 0, 8, 0, 2, 0}, {1, 0, 8, 0, 2, 1}};

// Per operand type: the shape, the tables, this file's rounding and how an element sits in
// the registers (two 16-bit halves, low half first, or one tf32 per register).
template <class Tag>
struct Type;

template <>
struct Type<kc::bf16_tag> {
  static constexpr const char* name = "bf16";
  static constexpr int k = 16;
  static constexpr const Entry* a_table = kA16;
  static constexpr const Entry* b_table = kB16;
  static double round(float x) { return round_ref(x, kBf16Format); }
  static double element(const std::uint32_t* regs, int i) {
    return decode_bf16(std::uint16_t(regs[i / 2] >> (16 * (i % 2))));
  }
};

template <>
struct Type<kc::f16_tag> {
  static constexpr const char* name = "f16";
  static constexpr int k = 16;
  static constexpr const Entry* a_table = kA16;
  static constexpr const Entry* b_table = kB16;
  static double round(float x) { return round_ref(x, kF16Format); }
  static double element(const std::uint32_t* regs, int i) {
    return decode_f16(std::uint16_t(regs[i / 2] >> (16 * (i % 2))));
  }
};

template <>
struct Type<kc::tf32_tag> {
  static constexpr const char* name = "tf32";
  static constexpr int k = 8;
  static constexpr const Entry* a_table = kA8;
  static constexpr const Entry* b_table = kB8;
  static double round(float x) { return round_ref(x, kTf32Format); }
  static double element(const std::uint32_t* regs, int i) {
    // The tensor core reads the upper 19 bits; the library leaves the rest zero.
    EXPECT_EQ(regs[i] & 0x1fffu, 0u) << "tf32 register with low mantissa bits set";
    return decode_tf32(regs[i]);
  }
};

// A rows x cols matrix in double, row-major, for the emulator and the reference.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<double> v;
  Matrix(int r, int c) : rows(r), cols(c), v(std::size_t(r) * c, 0.0) {}
  double& operator()(int r, int c) { return v[std::size_t(r) * cols + c]; }
  double operator()(int r, int c) const { return v[std::size_t(r) * cols + c]; }
};

// Rebuilds a matrix from the 32 lanes' registers through a PTX table, checking that the table
// puts every element in exactly one place.
template <class Tag, std::size_t N>
Matrix gather(const std::array<std::array<std::uint32_t, N>, 32>& regs, const Entry* table,
              int elements, int rows, int cols) {
  Matrix m(rows, cols);
  std::vector<int> seen(std::size_t(rows) * cols, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < elements; ++i) {
      const int r = table[i].row(lane), c = table[i].col(lane);
      m(r, c) = Type<Tag>::element(regs[lane].data(), i);
      ++seen[std::size_t(r) * cols + c];
    }
  for (int s : seen)
    EXPECT_EQ(s, 1) << "a PTX table does not cover the matrix once";
  return m;
}

// What mma.sync does, from the tables: D = A B + C with the operands as the registers hold
// them, summed in double and rounded once to float per element of D.
template <class Tag>
struct Emulated {
  Matrix a, b, c;
  std::array<kc::FragC, 32> d;
};

template <class Tag>
Emulated<Tag> emulate_mma(const std::array<kc::FragA<Tag>, 32>& fa,
                          const std::array<kc::FragB<Tag>, 32>& fb,
                          const std::array<kc::FragC, 32>& fc) {
  constexpr int K = Type<Tag>::k;
  std::array<std::array<std::uint32_t, 4>, 32> a_regs{};
  std::array<std::array<std::uint32_t, 2>, 32> b_regs{};
  Matrix c(16, 8);
  std::vector<int> c_seen(std::size_t(16) * 8, 0);
  for (int lane = 0; lane < 32; ++lane) {
    std::copy(std::begin(fa[lane].x), std::end(fa[lane].x), a_regs[lane].begin());
    std::copy(std::begin(fb[lane].x), std::end(fb[lane].x), b_regs[lane].begin());
    for (int i = 0; i < 4; ++i) {
      c(kC[i].row(lane), kC[i].col(lane)) = fc[lane].x[i];
      ++c_seen[std::size_t(kC[i].row(lane)) * 8 + kC[i].col(lane)];
    }
  }
  for (int s : c_seen)
    EXPECT_EQ(s, 1) << "the C table does not cover the matrix once";
  Emulated<Tag> out{gather<Tag>(a_regs, Type<Tag>::a_table, K == 16 ? 8 : 4, 16, K),
                    gather<Tag>(b_regs, Type<Tag>::b_table, K == 16 ? 4 : 2, K, 8),
                    c,
                    {}};
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int r = kC[i].row(lane), j = kC[i].col(lane);
      double sum = out.c(r, j);
      for (int p = 0; p < K; ++p)
        sum += out.a(r, p) * out.b(p, j);
      out.d[lane].x[i] = static_cast<float>(sum);
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Problems: A (rows x k valid of 16 x K), B (k x cols valid of K x 8), C (rows x cols valid of
// 16 x 8) in padded float buffers whose unused parts are NaN, so that a load outside the bounds
// shows in the result. A is row-major or transposed (read with rs = 1); B row-major or given as
// its transpose (an n x k row-major K, as in S = Q K^T).

struct Shape {
  const char* name;
  int rows, k, cols;
  bool a_transposed, b_from_kt;
};

template <class Tag>
std::vector<Shape> shapes() {
  constexpr int K = Type<Tag>::k;
  return {{"full", 16, K, 8, false, false},
          {"full, A transposed, B = K^T", 16, K, 8, true, true},
          {"edges", 13, K - 3, 5, false, false},
          {"edges, A transposed", 9, K - 1, 7, true, false},
          {"edges, B = K^T", 15, K / 2 + 1, 3, false, true},
          {"one row, one k, one column", 1, 1, 1, true, true},
          {"nothing valid", 0, K, 8, false, false}};
}

struct Problem {
  int rows, k, cols;
  int a_rs, a_cs, b_rs, b_cs, ldc;
  std::vector<float> a, b, c;
  float a_at(int r, int p) const { return a[std::size_t(r) * a_rs + std::size_t(p) * a_cs]; }
  float b_at(int p, int j) const { return b[std::size_t(p) * b_rs + std::size_t(j) * b_cs]; }
  float c_at(int r, int j) const { return c[std::size_t(r) * ldc + j]; }
};

constexpr float kSentinel = -12345.0f;  // D outside the bounds must keep it

template <class Tag>
Problem make_problem(const Shape& s, std::mt19937_64& gen) {
  constexpr int K = Type<Tag>::k;
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Problem p{s.rows, s.k, s.cols, 0, 0, 0, 0, 8 + 2, {}, {}, {}};
  const int lda = s.a_transposed ? 16 + 5 : K + 3;  // leading dimensions with padding
  const int ldb = s.b_from_kt ? K + 1 : 8 + 4;
  p.a_rs = s.a_transposed ? 1 : lda;
  p.a_cs = s.a_transposed ? lda : 1;
  p.b_rs = s.b_from_kt ? 1 : ldb;
  p.b_cs = s.b_from_kt ? ldb : 1;
  p.a.assign(std::size_t(s.a_transposed ? K : 16) * lda, nan);
  p.b.assign(std::size_t(s.b_from_kt ? 8 : K) * ldb, nan);
  p.c.assign(std::size_t(16) * p.ldc, nan);
  for (int r = 0; r < s.rows; ++r)
    for (int q = 0; q < s.k; ++q)
      p.a[std::size_t(r) * p.a_rs + std::size_t(q) * p.a_cs] = u(gen);
  for (int q = 0; q < s.k; ++q)
    for (int j = 0; j < s.cols; ++j)
      p.b[std::size_t(q) * p.b_rs + std::size_t(j) * p.b_cs] = u(gen);
  for (int r = 0; r < s.rows; ++r)
    for (int j = 0; j < s.cols; ++j)
      p.c[std::size_t(r) * p.ldc + j] = u(gen);
  return p;
}

// D (16 x ldc floats, as store_c wrote it) against sum_p round(A) round(B) + C in double: within
// (k + 2) float epsilons of the sum of the terms' magnitudes (float accumulation in any order)
// inside the bounds, the sentinel outside.
template <class Tag>
void check_d(const Problem& p, const std::vector<float>& d) {
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (int r = 0; r < 16; ++r)
    for (int j = 0; j < 8; ++j) {
      const float got = d[std::size_t(r) * p.ldc + j];
      if (r >= p.rows || j >= p.cols) {
        EXPECT_EQ(got, kSentinel) << "D(" << r << ", " << j << ") written outside the bounds";
        continue;
      }
      double sum = p.c_at(r, j), mag = std::fabs(sum);
      for (int q = 0; q < p.k; ++q) {
        const double term = Type<Tag>::round(p.a_at(r, q)) * Type<Tag>::round(p.b_at(q, j));
        sum += term;
        mag += std::fabs(term);
      }
      EXPECT_NEAR(got, sum, (Type<Tag>::k + 2) * eps * mag) << "D(" << r << ", " << j << ")";
    }
}

// The host run: the library's loads for every lane, the emulator, the library's store_c.
template <class Tag>
void check_host_product(const Shape& s, std::mt19937_64& gen) {
  SCOPED_TRACE(std::string(Type<Tag>::name) + ", " + s.name);
  constexpr int K = Type<Tag>::k;
  const Problem p = make_problem<Tag>(s, gen);
  std::array<kc::FragA<Tag>, 32> fa{};
  std::array<kc::FragB<Tag>, 32> fb{};
  std::array<kc::FragC, 32> fc{};
  for (int lane = 0; lane < 32; ++lane) {
    fa[lane] = kc::load_a(Tag{}, p.a.data(), p.a_rs, p.a_cs, p.rows, p.k, lane);
    fb[lane] = kc::load_b(Tag{}, p.b.data(), p.b_rs, p.b_cs, p.k, p.cols, lane);
    fc[lane] = kc::load_c(p.c.data(), p.ldc, p.rows, p.cols, lane);
  }
  const Emulated<Tag> e = emulate_mma<Tag>(fa, fb, fc);

  // The operands the registers hold are the inputs rounded, exactly, and zero outside.
  for (int r = 0; r < 16; ++r)
    for (int q = 0; q < K; ++q) {
      const double want = (r < p.rows && q < p.k) ? Type<Tag>::round(p.a_at(r, q)) : 0.0;
      ASSERT_EQ(e.a(r, q), want) << "A(" << r << ", " << q << ")";
    }
  for (int q = 0; q < K; ++q)
    for (int j = 0; j < 8; ++j) {
      const double want = (q < p.k && j < p.cols) ? Type<Tag>::round(p.b_at(q, j)) : 0.0;
      ASSERT_EQ(e.b(q, j), want) << "B(" << q << ", " << j << ")";
    }
  for (int r = 0; r < 16; ++r)
    for (int j = 0; j < 8; ++j) {
      const double want = (r < p.rows && j < p.cols) ? double(p.c_at(r, j)) : 0.0;
      ASSERT_EQ(e.c(r, j), want) << "C(" << r << ", " << j << ")";
    }

  std::vector<float> d(std::size_t(16) * p.ldc, kSentinel);
  for (int lane = 0; lane < 32; ++lane)
    kc::store_c(e.d[lane], d.data(), p.ldc, p.rows, p.cols, lane);
  check_d<Tag>(p, d);
}

template <class Tag>
void check_host_products() {
  std::mt19937_64 gen(kSeed);
  std::cout << "seed " << kSeed << "\n";
  for (const Shape& s : shapes<Tag>())
    check_host_product<Tag>(s, gen);
}

TEST(Mma, HostEmulatedBf16) {
  check_host_products<kc::bf16_tag>();
}
TEST(Mma, HostEmulatedF16) {
  check_host_products<kc::f16_tag>();
}
TEST(Mma, HostEmulatedTf32) {
  check_host_products<kc::tf32_tag>();
}

// The library's layout functions name the same places as the transcribed tables.
TEST(Mma, CoordinatesMatchPtxTables) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const kc::Coord a = kc::a_coord(kc::bf16_tag{}, lane, i);
      EXPECT_EQ(a.row, kA16[i].row(lane)) << "lane " << lane << " a" << i;
      EXPECT_EQ(a.col, kA16[i].col(lane)) << "lane " << lane << " a" << i;
    }
    for (int i = 0; i < 4; ++i) {
      const kc::Coord b = kc::b_coord(kc::f16_tag{}, lane, i),
                      a = kc::a_coord(kc::tf32_tag{}, lane, i), c = kc::c_coord(lane, i);
      EXPECT_TRUE(b.row == kB16[i].row(lane) && b.col == kB16[i].col(lane)) << lane << " b" << i;
      EXPECT_TRUE(a.row == kA8[i].row(lane) && a.col == kA8[i].col(lane)) << lane << " tf32 a" << i;
      EXPECT_TRUE(c.row == kC[i].row(lane) && c.col == kC[i].col(lane)) << lane << " c" << i;
    }
    for (int i = 0; i < 2; ++i) {
      const kc::Coord b = kc::b_coord(kc::tf32_tag{}, lane, i);
      EXPECT_TRUE(b.row == kB8[i].row(lane) && b.col == kB8[i].col(lane)) << lane << " tf32 b" << i;
    }
  }
}

// a_from_c: the accumulators of the two 16 x 8 halves of a 16 x 16 block, read by the A table,
// are the block rounded.
template <class Tag>
void check_a_from_c() {
  SCOPED_TRACE(Type<Tag>::name);
  std::mt19937_64 gen(kSeed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const int ldp = 16 + 3;
  std::vector<float> pm(std::size_t(16) * ldp);
  for (auto& x : pm)
    x = u(gen);
  std::array<std::array<std::uint32_t, 4>, 32> regs{};
  for (int lane = 0; lane < 32; ++lane) {
    const kc::FragC left = kc::load_c(pm.data(), ldp, 16, 8, lane);
    const kc::FragC right = kc::load_c(pm.data() + 8, ldp, 16, 8, lane);
    const kc::FragA<Tag> a = kc::a_from_c(Tag{}, left, right);
    std::copy(std::begin(a.x), std::end(a.x), regs[lane].begin());
  }
  const Matrix a = gather<Tag>(regs, kA16, 8, 16, 16);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      ASSERT_EQ(a(r, c), Type<Tag>::round(pm[std::size_t(r) * ldp + c])) << r << ", " << c;
}
TEST(Mma, AFromC) {
  check_a_from_c<kc::bf16_tag>();
  check_a_from_c<kc::f16_tag>();
}

// ---------------------------------------------------------------------------------------------
// Rounding, bit for bit.

// Hand-picked values with their encodings worked out by hand: ties to even both ways,
// overflow, subnormals, signed zero, infinities.
struct Literal {
  std::uint32_t in;   // float bits
  std::uint32_t out;  // expected encoding
};

TEST(Mma, RoundingLiterals) {
  const Literal bf16[] = {
      {0x3f800000u, 0x3f80u},  // 1
      {0x3f808000u, 0x3f80u},  // 1 + 2^-8: tie, to the even 1
      {0x3f818000u, 0x3f82u},  // 1 + 3 * 2^-8: tie, to the even 1 + 2^-6
      {0x3f808001u, 0x3f81u},  // just above the tie
      {0x3f807fffu, 0x3f80u},  // just below it
      {0xc0000000u, 0xc000u},  // -2
      {0x80000000u, 0x8000u},  // -0
      {0x7f800000u, 0x7f80u},  // inf
      {0xff800000u, 0xff80u},  // -inf
      {0x7f7fffffu, 0x7f80u},  // FLT_MAX rounds up to inf
      {0x7f7f7fffu, 0x7f7fu},  // the largest bf16 from below
      {0x00000001u, 0x0000u},  // the smallest float subnormal: to 0
      {0x00018000u, 0x0002u},  // a subnormal tie, to even
  };
  for (const Literal& l : bf16)
    EXPECT_EQ(kc::to_bits(kc::bf16_tag{}, float_from(l.in)), l.out) << std::hex << l.in;

  const Literal f16[] = {
      {0x3f800000u, 0x3c00u},  // 1
      {0xc0000000u, 0xc000u},  // -2
      {0x3dcccccdu, 0x2e66u},  // 0.1f
      {0x3f801000u, 0x3c00u},  // 1 + 2^-11: tie, to the even 1
      {0x3f803000u, 0x3c02u},  // 1 + 3 * 2^-11: tie, up to the even 1 + 2^-9
      {0x477fe000u, 0x7bffu},  // 65504, the largest half
      {0x477fefffu, 0x7bffu},  // just below the tie at 65520
      {0x477ff000u, 0x7c00u},  // 65520: tie, to the even neighbour, inf
      {0x49742400u, 0x7c00u},  // 1e6
      {0xc9742400u, 0xfc00u},  // -1e6
      {0x38800000u, 0x0400u},  // 2^-14, the smallest normal half
      {0x387fc000u, 0x03ffu},  // 2^-14 - 2^-24, the largest subnormal half
      {0x387fe000u, 0x0400u},  // 2^-14 - 2^-25: tie, to the even 0x400
      {0x33800000u, 0x0001u},  // 2^-24, the smallest subnormal half
      {0x33000000u, 0x0000u},  // 2^-25: tie, to the even 0
      {0x33000001u, 0x0001u},  // just above it
      {0x33c00000u, 0x0002u},  // 3 * 2^-25: tie, to the even 2 * 2^-24
      {0x34400000u, 0x0003u},  // 3 * 2^-24, exact
      {0xb3c00000u, 0x8002u},  // -3 * 2^-25 (1.5 quanta): tie, to -2 * 2^-24
      {0x80000000u, 0x8000u},  // -0
      {0x7f800000u, 0x7c00u},  // inf
      {0xff800000u, 0xfc00u},  // -inf
  };
  for (const Literal& l : f16)
    EXPECT_EQ(kc::to_bits(kc::f16_tag{}, float_from(l.in)), l.out) << std::hex << l.in;

  const Literal tf32[] = {
      {0x3f801000u, 0x3f800000u},  // 1 + 2^-11: tie, to the even 1
      {0x3f803000u, 0x3f804000u},  // tie, up to the even neighbour
      {0x3f801001u, 0x3f802000u},  // just above a tie
      {0x3f800fffu, 0x3f800000u},  // just below it
      {0x7f7fffffu, 0x7f800000u},  // FLT_MAX rounds up to inf
      {0x80000000u, 0x80000000u},  // -0
      {0xff800000u, 0xff800000u},  // -inf
  };
  for (const Literal& l : tf32)
    EXPECT_EQ(kc::to_bits(kc::tf32_tag{}, float_from(l.in)), l.out) << std::hex << l.in;

  // pack2 puts the lower-indexed element in the low half.
  EXPECT_EQ(kc::pack2(kc::bf16_tag{}, 1.0f, -2.0f), 0xc0003f80u);
  EXPECT_EQ(kc::pack2(kc::f16_tag{}, 1.0f, -2.0f), 0xc0003c00u);
  EXPECT_EQ(kc::unpack(kc::f16_tag{}, 0xc0003c00u, 0), 1.0f);
  EXPECT_EQ(kc::unpack(kc::f16_tag{}, 0xc0003c00u, 1), -2.0f);
  EXPECT_EQ(kc::unpack(kc::bf16_tag{}, 0xc0003f80u, 1), -2.0f);
}

// Inputs for the sweep: random bit patterns over the whole float range, the same with the
// dropped bits set to an exact tie for each format, floats in the half's subnormal and
// overflow ranges, and NaNs with payloads in the high and in the low bits only.
std::vector<float> sweep_inputs(std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<float> x;
  for (int n = 0; n < (1 << 18); ++n) {
    const auto u = static_cast<std::uint32_t>(gen());
    x.push_back(float_from(u));
    x.push_back(float_from((u & 0xffff0000u) | 0x8000u));  // bf16 tie
    x.push_back(float_from((u & 0xffffe000u) | 0x1000u));  // f16 (normal) and tf32 tie
    // Exponents 100..145: below 2^-25 to above 65504.
    const std::uint32_t e = 100u + static_cast<std::uint32_t>(gen() % 46u);
    const std::uint32_t near_half = (u & 0x807fffffu) | (e << 23);
    x.push_back(float_from(near_half));
    x.push_back(float_from(near_half & 0xffffff00u));  // more exact ties among subnormal halves
  }
  for (std::uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u})
    x.push_back(float_from(u));
  return x;
}

template <class Tag, class Bits>
void check_rounding_sweep(double (*decode_value)(Bits)) {
  for (float x : sweep_inputs(kSeed)) {
    const auto bits = kc::to_bits(Tag{}, x);
    const double got = decode_value(bits);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits_from(x) << " -> " << bits;
      ASSERT_EQ(std::signbit(got), std::signbit(x)) << std::hex << bits_from(x);
      continue;
    }
    const double want = Type<Tag>::round(x);
    ASSERT_EQ(got, want) << Type<Tag>::name << " of " << std::hex << bits_from(x) << " gave "
                         << bits;
    ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << bits_from(x);
    // The library's own decoder agrees with this file's.
    ASSERT_EQ(double(kc::rounded(Tag{}, x)), got) << std::hex << bits_from(x);
  }
}

TEST(Mma, RoundingSweep) {
  std::cout << "seed " << kSeed << "\n";
  check_rounding_sweep<kc::bf16_tag>(decode_bf16);
  check_rounding_sweep<kc::f16_tag>(decode_f16);
  check_rounding_sweep<kc::tf32_tag>(decode_tf32);
}

// ---------------------------------------------------------------------------------------------
// On the GPU: the same problems on the tensor cores, one warp (a team of one thread with 32
// vector lanes: on CUDA the lanes are threadIdx.x of a 32-thread block, and ThreadVectorRange
// over 32 gives lane i to thread i, all lanes converged), and the device's rounding against
// the host's.

// ---------------------------------------------------------------------------------------------
// ldmatrix, the swizzle and the tile step's fragments (cuda/ldmatrix.hpp). The emulator below
// follows the PTX ISA's description of "ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16":
// thread 8 i + r gives the address of row r of matrix i (eight consecutive 16-bit elements);
// without .trans thread t receives in register i the elements (row t / 4, columns 2 (t % 4)
// and 2 (t % 4) + 1) of matrix i, the first in the low half; with .trans the elements (rows
// 2 (t % 4) and 2 (t % 4) + 1, column t / 4). Shared memory has 32 banks of 4 bytes: a 16-byte
// access at element offset e sits in bank group (e / 8) mod 8, and the eight lanes of one
// phase conflict unless their groups differ.

using Regs4 = std::array<std::array<std::uint32_t, 4>, 32>;
using RowAddresses = std::array<int, 32>;  // element offsets in the tile, one per lane

Regs4 emulate_ldmatrix_x4(const std::vector<std::uint16_t>& smem, const RowAddresses& row_at,
                          bool trans) {
  Regs4 out{};
  for (int t = 0; t < 32; ++t)
    for (int i = 0; i < 4; ++i) {
      std::uint32_t reg = 0;
      for (int h = 0; h < 2; ++h) {
        const int r = trans ? 2 * (t % 4) + h : t / 4;
        const int c = trans ? t / 4 : 2 * (t % 4) + h;
        reg |= std::uint32_t(smem.at(std::size_t(row_at[8 * i + r]) + c)) << (16 * h);
      }
      out[t][i] = reg;
    }
  return out;
}

// Bank groups of each 8-lane phase of 16-byte accesses at these element offsets.
std::vector<int> distinct_groups_per_phase(const RowAddresses& at) {
  std::vector<int> out;
  for (int phase = 0; phase < 4; ++phase) {
    std::vector<int> groups;
    for (int l = 8 * phase; l < 8 * phase + 8; ++l) {
      EXPECT_EQ(at[l] % 8, 0) << "lane " << l << ": not 16-byte aligned";
      groups.push_back((at[l] / 8) % 8);
    }
    std::sort(groups.begin(), groups.end());
    out.push_back(int(std::unique(groups.begin(), groups.end()) - groups.begin()));
  }
  return out;
}

void expect_conflict_free(const RowAddresses& at, const std::string& what) {
  const std::vector<int> groups = distinct_groups_per_phase(at);
  for (int phase = 0; phase < 4; ++phase)
    EXPECT_EQ(groups[phase], 8) << what << ": bank conflict in phase " << phase;
}

// A rows x width tile of distinct 16-bit ids (id = row * width + col), stored swizzled.
struct IdTile {
  int rows, width;
  std::vector<std::uint16_t> smem;
  IdTile(int r, int w) : rows(r), width(w), smem(std::size_t(r) * w, 0xffffu) {
    for (int i = 0; i < r; ++i)
      for (int c = 0; c < w; ++c)
        smem.at(std::size_t(kc::swizzled(i, c, w))) = std::uint16_t(i * w + c);
  }
  std::uint16_t id(int r, int c) const { return std::uint16_t(r * width + c); }
};

template <class Source>
RowAddresses row_addresses(const IdTile& t, int r0, int c0, Source source) {
  RowAddresses at{};
  for (int lane = 0; lane < 32; ++lane) {
    const kc::Coord s = source(lane);
    at[lane] = kc::swizzled(r0 + s.row, c0 + s.col, t.width);
  }
  return at;
}

std::uint16_t half_of(const std::array<std::uint32_t, 4>& regs, int reg, int i) {
  return std::uint16_t(regs[reg] >> (16 * (i % 2)));
}

TEST(Ldmatrix, SwizzleIsAPermutationOfEachRow) {
  for (int width : {16, 32, 64, 128})
    for (int r = 0; r < 32; ++r) {
      std::vector<int> seen(std::size_t(width), 0);
      for (int c = 0; c < width; ++c) {
        const int off = kc::swizzled(r, c, width) - r * width;
        ASSERT_TRUE(off >= 0 && off < width) << "width " << width << " row " << r << " col " << c;
        ++seen[std::size_t(off)];
        if (c % kc::chunk_elements != 0) {  // a chunk stays whole
          EXPECT_EQ(off, kc::swizzled(r, c - 1, width) - r * width + 1);
        }
      }
      for (int s : seen)
        ASSERT_EQ(s, 1) << "width " << width << " row " << r;
    }
}

// The A fragment of a 16 x 16 block, the two B fragments of K^T (keys x head dim, no .trans)
// and of V (.trans), each from ldmatrix.x4 at the lanes' addresses, hold exactly the elements
// the transcribed mma tables (kA16, kB16) name; every phase is conflict-free; 16-byte stores of
// whole rows (cp.async filling the tile) are conflict-free too.
TEST(Ldmatrix, FragmentsMatchMmaTablesWithoutConflicts) {
  for (int width : {32, 64, 128}) {
    const IdTile t(64, width);
    for (int r0 = 0; r0 < t.rows; r0 += 16)
      for (int c0 = 0; c0 < width; c0 += 16) {
        const std::string where = "width " + std::to_string(width) + ", block (" +
                                  std::to_string(r0) + ", " + std::to_string(c0) + ")";
        SCOPED_TRACE(where);
        const RowAddresses a_at = row_addresses(t, r0, c0, kc::a_source);
        const RowAddresses b_at = row_addresses(t, r0, c0, kc::b_source);
        const RowAddresses v_at = row_addresses(t, r0, c0, kc::bt_source);
        expect_conflict_free(a_at, "A");
        expect_conflict_free(b_at, "K^T");
        expect_conflict_free(v_at, "V");
        const Regs4 a = emulate_ldmatrix_x4(t.smem, a_at, false);
        const Regs4 k = emulate_ldmatrix_x4(t.smem, b_at, false);
        const Regs4 v = emulate_ldmatrix_x4(t.smem, v_at, true);
        for (int lane = 0; lane < 32; ++lane) {
          for (int i = 0; i < 8; ++i)
            ASSERT_EQ(half_of(a[lane], i / 2, i),
                      t.id(r0 + kA16[i].row(lane), c0 + kA16[i].col(lane)))
                << "A, lane " << lane << ", a" << i;
          for (int n = 0; n < 2; ++n)  // registers 2n, 2n + 1: the n-th block of 8 columns
            for (int i = 0; i < 4; ++i) {
              // K^T: B(k, n) = K(n, k), keys are the tile's rows.
              ASSERT_EQ(half_of(k[lane], 2 * n + i / 2, i),
                        t.id(r0 + 8 * n + kB16[i].col(lane), c0 + kB16[i].row(lane)))
                  << "K^T, lane " << lane << ", block " << n << ", b" << i;
              // V: B(k, n) = V(k, n).
              ASSERT_EQ(half_of(v[lane], 2 * n + i / 2, i),
                        t.id(r0 + kB16[i].row(lane), c0 + 8 * n + kB16[i].col(lane)))
                  << "V, lane " << lane << ", block " << n << ", b" << i;
            }
        }
      }
    // A warp's 16-byte stores of consecutive chunks, rows after one another.
    const int chunks = width / kc::chunk_elements;
    for (int first = 0; first < t.rows * chunks; first += 32) {
      RowAddresses at{};
      for (int lane = 0; lane < 32; ++lane) {
        const int chunk = first + lane;
        at[lane] = kc::swizzled(chunk / chunks, chunk % chunks * kc::chunk_elements, width);
      }
      expect_conflict_free(at, "stores, width " + std::to_string(width));
    }
  }
}

// The float tiles of WarpForwardTf32x3 (rows of D floats, 2 D 16-bit units, the same swizzle):
// ldmatrix.x4 gives the tf32 A fragment of Q and the B fragments of K^T (kA8, kB8), one float
// a register, without conflicts; the 32-bit loads of V's B fragment read keys 2t + i (P's
// renamed columns) at dim g, 32 distinct banks per load.
TEST(Ldmatrix, FloatTilesMatchTf32TablesWithoutConflicts) {
  const auto check = [](auto kernel) {
    using K = decltype(kernel);
    constexpr int D = K::db * 8, units = 2 * D;
    SCOPED_TRACE("D = " + std::to_string(D));
    std::vector<std::uint16_t> smem(std::size_t(64) * units);
    const auto id = [](int r, int c) { return std::uint32_t(r * D + c); };
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < D; ++c) {
        const std::uint32_t v = id(r, c);
        std::memcpy(&smem.at(std::size_t(K::at(r, c))), &v, sizeof v);
      }
    for (int r0 = 0; r0 < 64; r0 += 16)
      for (int c0 = 0; c0 < D; c0 += 8) {
        RowAddresses a_at{}, b_at{};
        for (int lane = 0; lane < 32; ++lane) {
          a_at[lane] = K::at(r0 + K::a_source(lane).row, c0 + K::a_source(lane).col);
          b_at[lane] = K::at(r0 + K::b_source(lane).row, c0 + K::b_source(lane).col);
        }
        expect_conflict_free(a_at, "float A");
        expect_conflict_free(b_at, "float K^T");
        const Regs4 a = emulate_ldmatrix_x4(smem, a_at, false);
        const Regs4 k = emulate_ldmatrix_x4(smem, b_at, false);
        for (int lane = 0; lane < 32; ++lane) {
          for (int i = 0; i < 4; ++i)
            ASSERT_EQ(a[lane][i], id(r0 + kA8[i].row(lane), c0 + kA8[i].col(lane)))
                << "A, lane " << lane << ", a" << i;
          for (int n = 0; n < 2; ++n)
            for (int i = 0; i < 2; ++i)  // K^T: B(k, n) = K(key n, dim k)
              ASSERT_EQ(k[lane][2 * n + i],
                        id(r0 + 8 * n + kB8[i].col(lane), c0 + kB8[i].row(lane)))
                  << "K^T, lane " << lane << ", block " << n << ", b" << i;
        }
        for (int i = 0; i < 2; ++i) {  // V: keys r0 + 2t + i, dim c0 + g
          std::vector<int> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const kc::Coord v = K::v_source(lane, i);
            EXPECT_EQ(v.row, 2 * (kB8[i].row(lane) % 4) + kB8[i].row(lane) / 4);
            EXPECT_EQ(v.col, kB8[i].col(lane));
            banks.push_back(K::at(r0 + v.row, c0 + v.col) / 2 % 32);
          }
          std::sort(banks.begin(), banks.end());
          EXPECT_EQ(std::unique(banks.begin(), banks.end()) - banks.begin(), 32)
              << "V loads b" << i << " at (" << r0 << ", " << c0 << ")";
        }
      }
  };
  struct NoWarp {};  // the addresses need no warp primitive
  check(kc::WarpForwardTf32x3<NoWarp, 64>{});
  check(kc::WarpForwardTf32x3<NoWarp, 128>{});
}

// The check above can fail: the same A loads from an unswizzled tile of rows of 64 or 128
// elements put all eight lanes of a phase in one bank group.
TEST(Ldmatrix, UnswizzledRowsConflict) {
  for (int width : {64, 128}) {
    RowAddresses at{};
    for (int lane = 0; lane < 32; ++lane)
      at[lane] = kc::a_source(lane).row * width + kc::a_source(lane).col;
    for (int groups : distinct_groups_per_phase(at))
      EXPECT_EQ(groups, 1) << "width " << width;
  }
}

// One warp's forward over several key tiles, simulated on the host: the 32 lanes run the
// per-lane functions of cuda/warp_softmax.hpp, the quad shuffles (lane ^ 1, lane ^ 2) are
// emulated here, and S = Q K_j^T and O~ += P V_j come from the emulated ldmatrix and mma.sync
// on swizzled 16-bit tiles, P passed register to register (a_from_c). O and the LSE are
// compared with softmax attention in double on the same rounded inputs: S on the first tile
// within float accumulation, O within the rounding of P to the 16-bit type (u per element of
// P) and float, the LSE within float.

// ldmatrix.x4 of a block of a swizzled tile of `width` columns at (r0, c0).
template <class Source>
Regs4 load_x4(const std::vector<std::uint16_t>& smem, int width, int r0, int c0, Source source,
              bool trans) {
  RowAddresses at{};
  for (int lane = 0; lane < 32; ++lane)
    at[lane] = kc::swizzled(r0 + source(lane).row, c0 + source(lane).col, width);
  return emulate_ldmatrix_x4(smem, at, trans);
}

// Registers 2n, 2n + 1 of every lane as B fragments.
template <class Tag>
std::array<kc::FragB<Tag>, 32> b_half(const Regs4& r, int n) {
  std::array<kc::FragB<Tag>, 32> fb{};
  for (int lane = 0; lane < 32; ++lane)
    fb[lane] = {{r[lane][std::size_t(n) * 2], r[lane][std::size_t(n) * 2 + 1]}};
  return fb;
}

// The emulated quad shuffles: every lane gets f over its quad's four values.
template <class F>
void quad_reduce(std::array<float, 32>& v, F f) {
  for (int mask : {1, 2}) {
    const std::array<float, 32> was = v;
    for (int lane = 0; lane < 32; ++lane)
      v[lane] = f(was[lane], was[lane ^ mask]);
  }
}

// The unit roundoff of a 16-bit operand type: bfloat16 keeps 8 significant bits, binary16 11.
template <class Tag>
constexpr double unit_roundoff = std::is_same_v<Tag, kc::bf16_tag> ? 0x1p-8 : 0x1p-11;

// A rows x d tile of random values in [-2, 2] rounded to Tag: its shared-memory image
// (swizzled 16-bit elements) and, in `value`, the numbers it holds, row-major in double.
template <class Tag>
std::vector<std::uint16_t> random_tile(int rows, int d, std::mt19937_64& gen,
                                       std::vector<double>& value) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::uint16_t> smem(std::size_t(rows) * d);
  value.assign(std::size_t(rows) * d, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) {
      const std::uint16_t bits = kc::to_bits(Tag{}, dist(gen));
      smem[std::size_t(kc::swizzled(r, c, d))] = bits;
      value[std::size_t(r) * d + c] = kc::to_float(Tag{}, bits);
    }
  return smem;
}

template <class Tag>
void check_warp_forward(bool masked) {
  SCOPED_TRACE(std::string(Type<Tag>::name) + (masked ? ", masked" : ""));
  constexpr int d = 64, bc = 64, tiles = 3, keys = bc * tiles, nb = bc / 8, db = d / 8;
  const double u = unit_roundoff<Tag>;
  const double scale = 1.0 / std::sqrt(double(d));
  std::mt19937_64 gen(kSeed);
  auto tile = [&](int rows, std::vector<double>& value) {
    return random_tile<Tag>(rows, d, gen, value);
  };
  std::vector<double> q, k, v, kt, vt;
  const auto qs = tile(16, q);
  std::vector<std::vector<std::uint16_t>> ks, vs;
  for (int t = 0; t < tiles; ++t) {
    ks.push_back(tile(bc, kt));
    vs.push_back(tile(bc, vt));
    k.insert(k.end(), kt.begin(), kt.end());
    v.insert(v.end(), vt.begin(), vt.end());
  }
  // Masked: row r sees keys up to 40 r - 30 (none for rows 0 and, of the last tile, most).
  auto visible = [&](int r, int j) { return !masked || j <= 40 * r - 30; };

  std::array<kc::RowState, 32> rows{};
  kc::FragC o[32][db] = {};  // C arrays, as the device kernel holds them
  for (auto& r : rows)
    r = kc::initial_rows();
  for (int t = 0; t < tiles; ++t) {
    kc::FragC s[32][nb] = {};
    for (int k0 = 0; k0 < d; k0 += 16) {
      const Regs4 a = load_x4(qs, d, 0, k0, kc::a_source, false);
      std::array<kc::FragA<Tag>, 32> fa{};
      for (int lane = 0; lane < 32; ++lane)
        std::copy(a[lane].begin(), a[lane].end(), fa[lane].x);
      for (int n0 = 0; n0 < bc; n0 += 16) {
        const Regs4 b = load_x4(ks[t], d, n0, k0, kc::b_source, false);
        for (int n = 0; n < 2; ++n) {
          std::array<kc::FragC, 32> c{};
          for (int lane = 0; lane < 32; ++lane)
            c[lane] = s[lane][n0 / 8 + n];
          const auto e = emulate_mma<Tag>(fa, b_half<Tag>(b, n), c).d;
          for (int lane = 0; lane < 32; ++lane)
            s[lane][n0 / 8 + n] = e[lane];
        }
      }
    }
    // Scale (with log2 e), mask; on the first tile, S against double.
    constexpr double eps = std::numeric_limits<float>::epsilon();
    for (int lane = 0; lane < 32; ++lane)
      for (int n = 0; n < nb; ++n)
        for (int i = 0; i < 4; ++i) {
          const int r = kC[i].row(lane), j = t * bc + 8 * n + kC[i].col(lane);
          float& x = s[lane][n].x[i];
          if (t == 0) {
            double want = 0, mag = 0;
            for (int p = 0; p < d; ++p) {
              want += q[std::size_t(r) * d + p] * k[std::size_t(j) * d + p];
              mag += std::fabs(q[std::size_t(r) * d + p] * k[std::size_t(j) * d + p]);
            }
            ASSERT_NEAR(x, want, (d + 2) * eps * mag) << "S(" << r << ", " << j << ")";
          }
          x = visible(r, j) ? x * float(scale) * kc::log2e : -INFINITY;
        }
    // The online softmax, split at the shuffles as the device runs it.
    std::array<std::array<float, 32>, 2> tile_max{};
    for (int lane = 0; lane < 32; ++lane) {
      float m[2];
      kc::tile_row_max(s[lane], m);
      tile_max[0][lane] = m[0];
      tile_max[1][lane] = m[1];
    }
    for (auto& h : tile_max)
      quad_reduce(h, [](float x, float y) { return std::fmax(x, y); });
    for (int lane = 0; lane < 32; ++lane) {
      const float tm[2] = {tile_max[0][lane], tile_max[1][lane]};
      float alpha[2];
      kc::softmax_update(s[lane], rows[lane], tm, alpha);
      kc::rescale(o[lane], alpha);
    }
    // O~ += P V_j: 16 keys per step, P from the accumulators, V by ldmatrix.trans.
    for (int k0 = 0; k0 < bc; k0 += 16) {
      std::array<kc::FragA<Tag>, 32> p{};
      for (int lane = 0; lane < 32; ++lane)
        p[lane] = kc::a_from_c(Tag{}, s[lane][k0 / 8], s[lane][k0 / 8 + 1]);
      for (int n0 = 0; n0 < d; n0 += 16) {
        const Regs4 b = load_x4(vs[t], d, k0, n0, kc::bt_source, true);
        for (int n = 0; n < 2; ++n) {
          std::array<kc::FragC, 32> c{};
          for (int lane = 0; lane < 32; ++lane)
            c[lane] = o[lane][n0 / 8 + n];
          const auto e = emulate_mma<Tag>(p, b_half<Tag>(b, n), c).d;
          for (int lane = 0; lane < 32; ++lane)
            o[lane][n0 / 8 + n] = e[lane];
        }
      }
    }
  }
  std::array<std::array<float, 32>, 2> sums{};
  for (int lane = 0; lane < 32; ++lane) {
    sums[0][lane] = rows[lane].l[0];
    sums[1][lane] = rows[lane].l[1];
  }
  for (auto& h : sums)
    quad_reduce(h, [](float x, float y) { return x + y; });

  int empty_rows = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const float sum[2] = {sums[0][lane], sums[1][lane]};
    float lse[2];
    kc::finish_rows(o[lane], rows[lane], sum, lse);
    for (int h = 0; h < 2; ++h) {
      const int first = 2 * h;  // elements 0, 1: row g; 2, 3: row g + 8
      const int r = kC[first].row(lane);
      // softmax attention of row r in double
      std::vector<double> z(keys, -INFINITY);
      double zmax = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        if (!visible(r, j)) continue;
        double dot = 0;
        for (int p = 0; p < d; ++p)
          dot += q[std::size_t(r) * d + p] * k[std::size_t(j) * d + p];
        z[j] = scale * dot;
        zmax = std::max(zmax, z[j]);
      }
      if (zmax == -INFINITY) {  // no visible key: O = 0, LSE = -inf
        empty_rows += lane % 4 == 0;
        EXPECT_EQ(lse[h], -INFINITY) << "row " << r;
        for (int n = 0; n < db; ++n)
          for (int e = 2 * h; e < 2 * h + 2; ++e)
            EXPECT_EQ(o[lane][n].x[e], 0.0f) << "row " << r;
        continue;
      }
      double l = 0;
      for (int j = 0; j < keys; ++j)
        l += std::exp(z[j] - zmax);
      const double lse_ref = zmax + std::log(l);
      EXPECT_NEAR(lse[h], lse_ref, 1e-5 * std::max(1.0, std::fabs(lse_ref))) << "row " << r;
      for (int n = 0; n < db; ++n)
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int c = 8 * n + kC[e].col(lane);
          double want = 0, mag = 0;
          for (int j = 0; j < keys; ++j) {
            const double pj = std::exp(z[j] - lse_ref);
            want += pj * v[std::size_t(j) * d + c];
            mag += pj * std::fabs(v[std::size_t(j) * d + c]);
          }
          EXPECT_NEAR(o[lane][n].x[e], want, 2 * u * mag + 1e-5 * mag)
              << "O(" << r << ", " << c << ")";
        }
    }
  }
  EXPECT_EQ(empty_rows, masked ? 1 : 0) << "the masked case must hold one row that sees nothing";
}

TEST(WarpForward, HostSimulatedBf16) {
  check_warp_forward<kc::bf16_tag>(false);
  check_warp_forward<kc::bf16_tag>(true);
}
TEST(WarpForward, HostSimulatedF16) {
  check_warp_forward<kc::f16_tag>(false);
  check_warp_forward<kc::f16_tag>(true);
}

// One warp's backward tile step, simulated on the host as the forward above: the warp owns 16
// keys of K_j, V_j and meets 32 queries of Q_i, dO_i (head dim 64). S^T = K_j Q_i^T and dP^T =
// V_j dO_i^T by ldmatrix and mma; P^T and dS^T by cuda/warp_softmax.hpp; dV_j = P^T dO_i and
// dK_j = scale dS^T Q_i with P^T and dS^T register to register; dQ_i = scale dS K_j through a
// swizzled 16-bit dS^T tile read back by ldmatrix.trans (FlashAttention-2's one dS buffer).
// Against the gradients in double of softmax attention over these keys, on the same rounded
// inputs; masked keys (a causal-like band) included.
template <class Tag>
void check_warp_backward() {
  SCOPED_TRACE(Type<Tag>::name);
  constexpr int d = 64, keys = 16, queries = 32, nb = queries / 8;
  const double u = unit_roundoff<Tag>;
  const double scale = 1.0 / std::sqrt(double(d));
  std::mt19937_64 gen(kSeed + 1);
  auto tile = [&](int rows, std::vector<double>& value) {
    return random_tile<Tag>(rows, d, gen, value);
  };
  std::vector<double> q, k, v, dout;
  const auto qs = tile(queries, q), ks = tile(keys, k), vs = tile(keys, v),
             dos = tile(queries, dout);
  auto visible = [](int i, int j) { return j <= i / 2 + 1; };  // query i sees keys 0..i/2+1

  // The reference in double: P, LSE, O, delta = rowsum(dO O), dS, and the three gradients.
  std::vector<double> p(std::size_t(queries) * keys, 0.0), lse(queries), delta(queries, 0.0);
  for (int i = 0; i < queries; ++i) {
    double zmax = -INFINITY;
    std::vector<double> z(keys, -INFINITY);
    for (int j = 0; j < keys; ++j) {
      if (!visible(i, j)) continue;
      double dot = 0;
      for (int c = 0; c < d; ++c)
        dot += q[std::size_t(i) * d + c] * k[std::size_t(j) * d + c];
      z[j] = scale * dot;
      zmax = std::max(zmax, z[j]);
    }
    double l = 0;
    for (int j = 0; j < keys; ++j)
      l += std::exp(z[j] - zmax);
    lse[i] = zmax + std::log(l);
    for (int j = 0; j < keys; ++j)
      p[std::size_t(i) * keys + j] = std::exp(z[j] - lse[i]);
    for (int c = 0; c < d; ++c) {
      double o = 0;
      for (int j = 0; j < keys; ++j)
        o += p[std::size_t(i) * keys + j] * v[std::size_t(j) * d + c];
      delta[i] += dout[std::size_t(i) * d + c] * o;
    }
  }
  auto dp = [&](int i, int j) {
    double s = 0;
    for (int c = 0; c < d; ++c)
      s += dout[std::size_t(i) * d + c] * v[std::size_t(j) * d + c];
    return s;
  };
  std::vector<double> ds(std::size_t(queries) * keys);
  for (int i = 0; i < queries; ++i)
    for (int j = 0; j < keys; ++j)
      ds[std::size_t(i) * keys + j] = p[std::size_t(i) * keys + j] * (dp(i, j) - delta[i]);

  // The warp. S^T and dP^T: A = K_j or V_j rows, B = Q_i^T or dO_i^T (b_source, as K^T).
  kc::FragC st[32][nb] = {}, dpt[32][nb] = {};
  auto product_t = [&](const std::vector<std::uint16_t>& a_tile,
                       const std::vector<std::uint16_t>& b_tile, kc::FragC(&acc)[32][nb]) {
    for (int k0 = 0; k0 < d; k0 += 16) {
      const Regs4 a = load_x4(a_tile, d, 0, k0, kc::a_source, false);
      std::array<kc::FragA<Tag>, 32> fa{};
      for (int lane = 0; lane < 32; ++lane)
        std::copy(a[lane].begin(), a[lane].end(), fa[lane].x);
      for (int n0 = 0; n0 < queries; n0 += 16) {
        const Regs4 b = load_x4(b_tile, d, n0, k0, kc::b_source, false);
        for (int n = 0; n < 2; ++n) {
          std::array<kc::FragC, 32> c{};
          for (int lane = 0; lane < 32; ++lane)
            c[lane] = acc[lane][n0 / 8 + n];
          const auto e = emulate_mma<Tag>(fa, b_half<Tag>(b, n), c).d;
          for (int lane = 0; lane < 32; ++lane)
            acc[lane][n0 / 8 + n] = e[lane];
        }
      }
    }
  };
  product_t(ks, qs, st);
  product_t(vs, dos, dpt);
  for (int lane = 0; lane < 32; ++lane) {
    float lse2[nb][2], dl[nb][2];
    for (int n = 0; n < nb; ++n)
      for (int e = 0; e < 2; ++e) {
        const int i = 8 * n + kC[e].col(lane);
        lse2[n][e] = float(lse[i] * 1.4426950408889634);
        dl[n][e] = float(delta[i]);
      }
    for (int n = 0; n < nb; ++n)
      for (int e = 0; e < 4; ++e) {
        const int j = kC[e].row(lane), i = 8 * n + kC[e].col(lane);
        float& x = st[lane][n].x[e];
        x = visible(i, j) ? x * float(scale) * kc::log2e : -INFINITY;
      }
    kc::probabilities<true>(st[lane], lse2);
    kc::score_gradients(dpt[lane], st[lane], dl);
  }
  // dV_j = P^T dO_i and dK_j = dS^T Q_i (times scale): A from the accumulators, B by .trans.
  auto product_from_c = [&](const kc::FragC(&acc)[32][nb],
                            const std::vector<std::uint16_t>& b_tile) {
    std::array<std::array<kc::FragC, d / 8>, 32> out{};
    for (int k0 = 0; k0 < queries; k0 += 16) {
      std::array<kc::FragA<Tag>, 32> fa{};
      for (int lane = 0; lane < 32; ++lane)
        fa[lane] = kc::a_from_c(Tag{}, acc[lane][k0 / 8], acc[lane][k0 / 8 + 1]);
      for (int n0 = 0; n0 < d; n0 += 16) {
        const Regs4 b = load_x4(b_tile, d, k0, n0, kc::bt_source, true);
        for (int n = 0; n < 2; ++n) {
          std::array<kc::FragC, 32> c{};
          for (int lane = 0; lane < 32; ++lane)
            c[lane] = out[lane][n0 / 8 + n];
          const auto e = emulate_mma<Tag>(fa, b_half<Tag>(b, n), c).d;
          for (int lane = 0; lane < 32; ++lane)
            out[lane][n0 / 8 + n] = e[lane];
        }
      }
    }
    return out;
  };
  const auto dv = product_from_c(st, dos);
  const auto dk = product_from_c(dpt, qs);
  for (int lane = 0; lane < 32; ++lane)
    for (int n = 0; n < d / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int j = kC[e].row(lane), c = 8 * n + kC[e].col(lane);
        double want_v = 0, mag_v = 0, want_k = 0, mag_k = 0;
        for (int i = 0; i < queries; ++i) {
          const double pij = p[std::size_t(i) * keys + j], dsij = ds[std::size_t(i) * keys + j];
          want_v += pij * dout[std::size_t(i) * d + c];
          mag_v += std::fabs(pij * dout[std::size_t(i) * d + c]);
          want_k += scale * dsij * q[std::size_t(i) * d + c];
          mag_k += scale * std::fabs(dsij * q[std::size_t(i) * d + c]);
        }
        EXPECT_NEAR(dv[lane][n].x[e], want_v, 4 * u * mag_v + 1e-5)
            << "dV(" << j << ", " << c << ")";
        EXPECT_NEAR(float(scale) * dk[lane][n].x[e], want_k, 4 * u * mag_k + 1e-4)
            << "dK(" << j << ", " << c << ")";
      }

  // dQ_i = scale dS K_j: dS^T (keys x queries) to a swizzled 16-bit tile, read back as A = dS
  // (queries x keys) by ldmatrix.trans at b_source's addresses, B = K_j by .trans.
  std::vector<std::uint16_t> dst(std::size_t(keys) * queries, 0xffffu);
  for (int lane = 0; lane < 32; ++lane)
    for (int n = 0; n < nb; ++n)
      for (int e = 0; e < 4; ++e)
        dst[std::size_t(kc::swizzled(kC[e].row(lane), 8 * n + kC[e].col(lane), queries))] =
            kc::to_bits(Tag{}, dpt[lane][n].x[e]);
  for (int m0 = 0; m0 < queries; m0 += 16) {
    const Regs4 a = load_x4(dst, queries, 0, m0, kc::b_source, true);
    std::array<kc::FragA<Tag>, 32> fa{};
    for (int lane = 0; lane < 32; ++lane)
      std::copy(a[lane].begin(), a[lane].end(), fa[lane].x);
    for (int n0 = 0; n0 < d; n0 += 16) {
      const Regs4 b = load_x4(ks, d, 0, n0, kc::bt_source, true);
      for (int n = 0; n < 2; ++n) {
        const auto dq = emulate_mma<Tag>(fa, b_half<Tag>(b, n), {}).d;
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 4; ++e) {
            const int i = m0 + kC[e].row(lane), c = n0 + 8 * n + kC[e].col(lane);
            double want = 0, mag = 0;
            for (int j = 0; j < keys; ++j) {
              want += scale * ds[std::size_t(i) * keys + j] * k[std::size_t(j) * d + c];
              mag += scale * std::fabs(ds[std::size_t(i) * keys + j] * k[std::size_t(j) * d + c]);
            }
            EXPECT_NEAR(float(scale) * dq[lane].x[e], want, 4 * u * mag + 1e-4)
                << "dQ(" << i << ", " << c << ")";
          }
      }
    }
  }
}

TEST(WarpBackward, HostSimulatedBf16) {
  check_warp_backward<kc::bf16_tag>();
}
TEST(WarpBackward, HostSimulatedF16) {
  check_warp_backward<kc::f16_tag>();
}

// ---------------------------------------------------------------------------------------------
// The team kernel of cuda/warp_forward.hpp, run on the host by a simulator: 128 fibers are
// the 4 warps' lanes, each runs the kernel's code as a CUDA thread would, and every warp-wide
// primitive is a rendezvous of the warp's 32 lanes: ldmatrix (each lane posts its row
// address, then gathers its elements by the ISA's rule above), mma.sync (each lane posts its
// fragments, then computes its own elements of D from everybody's through the transcribed
// tables, in double, rounded once), the quad shuffles; the team barrier waits for all 128.
// cp.async lands at either end of the freedom the hardware has: at once (a copy that overwrites
// a tile other warps still read shows), or only at the wait (a read before the wait shows).

// The 128 lanes are fibers on the test's thread (ucontext), not threads: a lane runs alone until
// it waits at a rendezvous, then the scheduler (run_simulated_team) resumes another. As 128
// threads on a 2-core machine the suite took 222 s, most of it in the kernel waking lanes at
// every rendezvous; as fibers, under a minute. A lane that never reaches a rendezvous the
// others wait at is reported as a deadlock instead of hanging the suite.
struct PendingCopy {
  std::uint16_t* dst;
  std::array<std::uint16_t, 8> bytes;  // the source as read at the copy's issue
};

struct Lane {
  int warp = 0, lane = 0;
  bool done = false;
  // The lane's copies in flight: issued but not committed (a wait does not cover them, as
  // cp.async.wait_group does not), and committed.
  std::vector<PendingCopy> uncommitted, committed;
  ucontext_t context{};
  char* stack = nullptr;       // kLaneStack bytes (lane_stack)
  void* fake_stack = nullptr;  // AddressSanitizer's, while the lane is switched out
};

// The scheduler of the simulated team that runs (one at a time, on the test's thread).
struct SimScheduler {
  ucontext_t main{};
  Lane* current = nullptr;
  long progress = 0;            // rendezvous arrivals and finished lanes
  std::function<void()> entry;  // the body every lane runs
  // AddressSanitizer follows the switches between stacks (its fiber interface); the main
  // stack's bounds come from the first switch.
  const void* main_bottom = nullptr;
  std::size_t main_size = 0;
  void* main_fake_stack = nullptr;
  unsigned teams = 0;  // teams simulated so far in this process (run_simulated_team's seeds)
};
SimScheduler sim;

// 256 KiB a lane. AddressSanitizer clears the shadow of the stack each swapcontext goes to, and
// above its clear_shadow_mmap_threshold (64 KiB of shadow by default, a 512 KiB stack) it
// returns the pages to the kernel instead: with 1 MiB stacks the suite took 22 minutes under
// the sanitizers, 11 of them system time; with 256 KiB, 107 s.
constexpr std::size_t kLaneStack = std::size_t(256) << 10;

// The lanes' stacks, kept for the next team. Each lies above a page no access may touch, so
// that a lane that outgrows its stack (a thread's is 8 MiB) faults at once instead of writing
// over the next lane's.
char* lane_stack(int i) {
  static std::vector<char*> stacks;
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  while (int(stacks.size()) <= i) {
    void* base = mmap(nullptr, page + kLaneStack, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0) {
      ADD_FAILURE() << "no stack for simulated lane " << stacks.size();
      std::abort();
    }
    stacks.push_back(static_cast<char*>(base) + page);  // the stack grows down to the guard
  }
  return stacks[std::size_t(i)];
}

// From a lane back to the scheduler, which resumes it at its next turn.
void sim_yield() {
  Lane& me = *sim.current;
#ifdef KFA_SIM_ASAN
  __sanitizer_start_switch_fiber(&me.fake_stack, sim.main_bottom, sim.main_size);
#endif
  swapcontext(&me.context, &sim.main);
#ifdef KFA_SIM_ASAN
  __sanitizer_finish_switch_fiber(me.fake_stack, &sim.main_bottom, &sim.main_size);
#endif
}

void sim_lane_main() {
#ifdef KFA_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sim.main_bottom, &sim.main_size);
#endif
  sim.entry();
  sim.current->done = true;
#ifdef KFA_SIM_ASAN
  __sanitizer_start_switch_fiber(nullptr, sim.main_bottom, sim.main_size);  // the lane ends
#endif
}  // to uc_link: the scheduler

// Lane i (warp i / 32) made ready to start at sim_lane_main on its stack. sim_start and
// sim_resume are not inlined: the context calls stay in small frames of their own, away from
// the scheduler's loop variables (getcontext returns twice as GCC sees it: -Wclobbered).
[[gnu::noinline]] void sim_start(Lane& lane, int i) {
  lane.warp = i / 32;
  lane.lane = i % 32;
  lane.stack = lane_stack(i);
  getcontext(&lane.context);
  lane.context.uc_stack.ss_sp = lane.stack;
  lane.context.uc_stack.ss_size = kLaneStack;
  lane.context.uc_link = &sim.main;
  makecontext(&lane.context, sim_lane_main, 0);
}

// From the scheduler to a lane until it yields or ends.
[[gnu::noinline]] void sim_resume(Lane& lane) {
  sim.current = &lane;
#ifdef KFA_SIM_ASAN
  __sanitizer_start_switch_fiber(&sim.main_fake_stack, lane.stack, kLaneStack);
#endif
  swapcontext(&sim.main, &lane.context);
#ifdef KFA_SIM_ASAN
  __sanitizer_finish_switch_fiber(sim.main_fake_stack, nullptr, nullptr);
#endif
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    ++sim.progress;
    const long gen = gen_;
    if (++count_ == n_) {  // the last to arrive releases the others and goes on
      count_ = 0;
      ++gen_;
      return;
    }
    while (gen_ == gen)
      sim_yield();
  }

 private:
  int n_, count_ = 0;
  long gen_ = 0;
};

struct SimTeam {
  Barrier team{128};
  std::vector<std::unique_ptr<Barrier>> warp;
  struct Exchange {
    std::array<const std::uint16_t*, 32> row{};
    std::array<std::array<std::uint32_t, 4>, 32> a{};
    std::array<std::array<std::uint32_t, 2>, 32> b{};
    std::array<float, 32> value{};
    std::array<std::uint32_t, 32> bits{};
  };
  std::array<Exchange, 4> x;
  SimTeam() {
    for (int w = 0; w < 4; ++w)
      warp.push_back(std::make_unique<Barrier>(32));
  }
};

SimTeam* sim_team = nullptr;
bool sim_copies_late = false;  // cp.async lands at the wait, not at once

// (lane, element) of the fragment element at (row, col) of A or B: the tables inverted.
template <int Elements, int Rows, int Cols>
std::array<std::array<std::pair<int, int>, Cols>, Rows> invert(const Entry* table) {
  std::array<std::array<std::pair<int, int>, Cols>, Rows> at{};
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < Elements; ++i)
      at[std::size_t(table[i].row(lane))][std::size_t(table[i].col(lane))] = {lane, i};
  return at;
}

// Sm90: the warp stands for sm_90 and newer (W::sm90: dQ four columns at once, LSE and delta
// held in registers) or for sm_80.
template <class Tag, bool Sm90 = true>
struct SimWarp {
  static int lane() { return sim.current->lane; }
  static int warp() { return sim.current->warp; }
  static void barrier() { sim_team->team.wait(); }
  static void warp_sync() { sim_team->warp[std::size_t(warp())]->wait(); }
  static SimTeam::Exchange& exchange() { return sim_team->x[std::size_t(warp())]; }

  static void ldmatrix(std::uint32_t (&r)[4], const std::uint16_t* row, bool trans) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(row) % 16, 0u) << "ldmatrix row off 16 bytes";
    SimTeam::Exchange& x = exchange();
    x.row[std::size_t(lane())] = row;
    warp_sync();
    const int t = lane();
    for (int i = 0; i < 4; ++i) {
      std::uint32_t reg = 0;
      for (int h = 0; h < 2; ++h) {
        const int rr = trans ? 2 * (t % 4) + h : t / 4, cc = trans ? t / 4 : 2 * (t % 4) + h;
        reg |= std::uint32_t(x.row[std::size_t(8) * std::size_t(i) + std::size_t(rr)][cc])
               << (16 * h);
      }
      r[i] = reg;
    }
    warp_sync();
  }
  static void ldmatrix_x4(std::uint32_t (&r)[4], const std::uint16_t* row) {
    ldmatrix(r, row, false);
  }
  static void ldmatrix_x4_trans(std::uint32_t (&r)[4], const std::uint16_t* row) {
    ldmatrix(r, row, true);
  }
  static void cp_async_16(std::uint16_t* dst, const std::uint16_t* src, bool valid) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(dst) % 16, 0u) << "cp.async to shared off 16 bytes";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src) % 16, 0u) << "cp.async from off 16 bytes";
    PendingCopy c{dst, {}};
    if (valid) std::memcpy(c.bytes.data(), src, 16);
    if (sim_copies_late)
      sim.current->uncommitted.push_back(c);
    else
      std::memcpy(dst, c.bytes.data(), 16);
  }
  static void cp_async_commit() {
    Lane& me = *sim.current;
    me.committed.insert(me.committed.end(), me.uncommitted.begin(), me.uncommitted.end());
    me.uncommitted.clear();
  }
  static void cp_async_wait_all() {  // cp.async.wait_group 0: the committed groups
    for (const PendingCopy& c : sim.current->committed)
      std::memcpy(c.dst, c.bytes.data(), 16);
    sim.current->committed.clear();
  }
  static void mma(kc::FragC& d, const kc::FragA<Tag>& a, const kc::FragB<Tag>& b) {
    constexpr int K = Type<Tag>::k;  // m16n8k16 (16-bit) or m16n8k8 (tf32)
    static const auto a_at = invert<(K == 16 ? 8 : 4), 16, K>(Type<Tag>::a_table);
    static const auto b_at = invert<(K == 16 ? 4 : 2), K, 8>(Type<Tag>::b_table);
    SimTeam::Exchange& x = exchange();
    std::copy(std::begin(a.x), std::end(a.x), x.a[std::size_t(lane())].begin());
    std::copy(std::begin(b.x), std::end(b.x), x.b[std::size_t(lane())].begin());
    warp_sync();
    for (int e = 0; e < 4; ++e) {
      const int r = kC[e].row(lane()), c = kC[e].col(lane());
      double sum = d.x[e];
      for (int k = 0; k < K; ++k) {
        const auto [al, ai] = a_at[std::size_t(r)][std::size_t(k)];
        const auto [bl, bi] = b_at[std::size_t(k)][std::size_t(c)];
        sum += Type<Tag>::element(x.a[std::size_t(al)].data(), ai) *
               Type<Tag>::element(x.b[std::size_t(bl)].data(), bi);
      }
      float f = static_cast<float>(sum);
      // tf32: rounded toward zero, as the A100's tensor cores were measured to round their sums
      // (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ
      // Comput. Sci. 2021): a bias of up to an ulp per instruction, which the 3xTF32 kernel's
      // many accumulating instructions per score add up.
      if (std::is_same_v<Tag, kc::tf32_tag> && std::fabs(double(f)) > std::fabs(sum))
        f = std::nextafter(f, 0.0f);
      d.x[e] = f;
    }
    warp_sync();
  }
  template <class F>
  static float quad(float v, F f) {
    SimTeam::Exchange& x = exchange();
    x.value[std::size_t(lane())] = v;
    warp_sync();
    const int first = lane() & ~3;
    float r = x.value[std::size_t(first)];
    for (int l = first + 1; l < first + 4; ++l)
      r = f(r, x.value[std::size_t(l)]);
    warp_sync();
    return r;
  }
  static float quad_max(float v) {
    return quad(v, [](float a, float b) { return std::fmax(a, b); });
  }
  static float quad_sum(float v) {
    return quad(v, [](float a, float b) { return a + b; });
  }
  static float lane_pair(float v) {
    SimTeam::Exchange& x = exchange();
    x.value[std::size_t(lane())] = v;
    warp_sync();
    const float r = x.value[std::size_t(lane() ^ 1)];
    warp_sync();
    return r;
  }
  static std::uint32_t lane_xor_bits(std::uint32_t v, int m) {
    SimTeam::Exchange& x = exchange();
    x.bits[std::size_t(lane())] = v;
    warp_sync();
    const std::uint32_t r = x.bits[std::size_t(lane() ^ m)];
    warp_sync();
    return r;
  }
  // The team's lanes add to distinct elements (teams run one at a time), so plain adds emulate
  // the device's atomics; its red.global.add.v4.f32 needs 16 bytes.
  static constexpr bool sm90 = Sm90;
  static void add(float* p, float x) {
    EXPECT_FALSE(Sm90) << "dQ by elements on sm_90";
    *p += x;
  }
  static void add4(float* p, const float (&x)[4]) {
    EXPECT_TRUE(Sm90) << "dQ by fours before sm_90";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 16, 0u) << "add4 off 16 bytes";
    for (int e = 0; e < 4; ++e)
      p[e] += x[e];
  }
};

// Runs `body(tile)` on one simulated team: 128 fibers as 4 warps of 32 lanes, each with its
// ids set, and `tile` a 128-byte aligned shared memory of `bytes`. Returns the copies the lanes
// left in flight (issued and never committed or waited for), or -1 after a deadlock (a
// failure is added).
template <class Body>
int run_simulated_team(int bytes, const Body& body) {
  SimTeam team;
  sim_team = &team;
  std::vector<std::uint16_t> smem(std::size_t(bytes) / 2 + 64);
  std::uint16_t* tile = smem.data();
  while (reinterpret_cast<std::uintptr_t>(tile) % 128 != 0)
    ++tile;
  sim.entry = [&] { body(tile); };
  std::vector<Lane> lanes(128);
  for (int i = 0; i < 128; ++i)
    sim_start(lanes[std::size_t(i)], i);
  // A step resumes the lanes of one warp, drawn at random among the warps that can move, in a
  // shuffled order; each lane runs to its next rendezvous. The k-th team a process simulates
  // draws from seed 20261128 + k: each team sees another interleaving, and a run of the same
  // tests repeats them all (the seed is printed with a deadlock). A warp thus
  // runs ahead of the others by any number of steps until a team barrier holds it, as warps
  // do on the device: a barrier the kernel lacks lets a warp overwrite shared memory another
  // still reads. A warp whose step moved nothing waits for another's (it is `stuck` until any
  // lane moves); when every warp left is stuck, the team is deadlocked.
  const unsigned seed = 20261128u + sim.teams++;
  std::mt19937 random(seed);
  std::array<int, 32> order{};
  for (int l = 0; l < 32; ++l)
    order[std::size_t(l)] = l;
  std::array<int, 4> left{32, 32, 32, 32};  // lanes not done, per warp
  std::array<bool, 4> stuck{};
  const auto lanes_left = [&] { return left[0] + left[1] + left[2] + left[3]; };
  int in_flight = 0;
  while (lanes_left() > 0) {
    int movable[4], n = 0;
    for (int w = 0; w < 4; ++w)
      if (left[std::size_t(w)] > 0 && !stuck[std::size_t(w)]) movable[n++] = w;
    if (n == 0) {
      ADD_FAILURE() << "simulated team deadlocked: " << lanes_left()
                    << " lanes wait at a rendezvous no other lane reaches (team seed " << seed
                    << ")";
      in_flight = -1;
      break;
    }
    const int w = movable[std::uniform_int_distribution<int>(0, n - 1)(random)];
    const long before = sim.progress;
    std::shuffle(order.begin(), order.end(), random);
    for (const int l : order) {
      Lane& lane = lanes[std::size_t(32) * std::size_t(w) + std::size_t(l)];
      if (lane.done) continue;
      sim_resume(lane);
      if (lane.done) {
        --left[std::size_t(w)];
        ++sim.progress;
        in_flight += int(lane.uncommitted.size() + lane.committed.size());
      }
    }
    if (sim.progress != before)
      stuck.fill(false);
    else
      stuck[std::size_t(w)] = true;
  }
  sim.current = nullptr;
  sim_team = nullptr;
  return in_flight;
}

// The simulator itself: a lane that waits at the team barrier when no other lane will is a
// failure, not a hang; the next team runs as before.
void simulate_deadlock() {
  using W = SimWarp<kc::bf16_tag>;
  const int left = run_simulated_team(256, [](std::uint16_t* /*tile*/) {
    if (W::warp() == 0 && W::lane() == 0) W::barrier();
  });
  EXPECT_EQ(left, -1);
}
TEST(Simulator, ReportsDeadlock) {
  EXPECT_NONFATAL_FAILURE(simulate_deadlock(), "simulated team deadlocked: 1 lanes wait");
  int barriers_passed = 0;
  EXPECT_EQ(run_simulated_team(256,
                               [&](std::uint16_t* /*tile*/) {
                                 SimWarp<kc::bf16_tag>::barrier();
                                 ++barriers_passed;
                               }),
            0);
  EXPECT_EQ(barriers_passed, 128);
}

// One team of the kernel on the simulator: 50 query rows against 150 keys (three key tiles,
// the last partial). Masks: `band`, a band with a row that sees nothing, whose last tile is
// hidden from every row and must be skipped; `lower`, the same without the band's upper edge
// (the partial tile is used); `none`, every key seen (the whole tiles take the path without a
// mask test); `leading`, the first tile hidden from every row (skipped before the loop starts).
// Copies land at once or at the wait (`late`); a copy left uncommitted when the kernel returns
// fails the test. O and LSE against softmax attention in double.
// Dropped: P weighed by sim_weight (a fifth of the elements dropped, the rest times 1.25,
// from a hash of the position): the kernel's part is to put each weight on its own element
// after the row sums took P (core's Philox scheme behind Row::kept_pair is test_dropout's).
enum class SimMask { band, lower, none, leading };

float sim_weight(int i, int j) {
  std::uint64_t x = (std::uint64_t(i) << 32 | std::uint32_t(j)) + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return (x ^ (x >> 31)) % 5 == 0 ? 0.0f : 1.25f;
}

// What SimScore and SimMasks share: which (query, key) pairs are visible, tile by tile, and
// `groups`, whether dropout's groups of four keys start on the tiles (group_starts: the lanes
// holding a group's keys share its draw) or not (a draw per pair or element).
struct SimTiles {
  bool (*visible_fn)(int, int);
  bool groups = true;
  bool group_starts(int) const { return groups; }
  bool tile_visible(int q0, int n, int j0, int nc) const {
    for (int i = q0; i < q0 + n; ++i)
      for (int j = j0; j < j0 + nc; ++j)
        if (visible_fn(i, j)) return true;
    return false;
  }
  bool tile_inside(int q0, int n, int j0, int nc) const {
    for (int i = q0; i < q0 + n; ++i)
      for (int j = j0; j < j0 + nc; ++j)
        if (!visible_fn(i, j)) return false;
    return true;
  }
};

template <bool Dropped>
struct SimScore : SimTiles {
  static constexpr bool dropped = Dropped;
  double scale;
  struct Row {
    int i;
    float scale;
    bool (*visible)(int, int);
    float operator()(int j, float dot) const {
      return visible(i, j) ? unmasked(j, dot) : -INFINITY;
    }
    float unmasked(int, float dot) const { return dot * scale; }
    unsigned kept_pair(int j) const {
      return (sim_weight(i, j) != 0 ? 1u : 0u) | (sim_weight(i, j + 1) != 0 ? 2u : 0u);
    }
    unsigned kept4(int j) const { return kept_pair(j) | kept_pair(j + 2) << 2; }
  };
  Row row(int i) const { return {i, float(scale), visible_fn}; }
  static float keep_scale() { return 1.25f; }
};

// Tag tf32_tag: float inputs on WarpForwardTf32x3 (3xTF32), held to float's tolerance rule
// (kfa::reference: the largest error at most twice that of the naive attention in float, plus
// 8 ulps of the largest |O|) where the 16-bit kernels get a bound per element from their
// rounding of P.
// amp scales Q and K: 60 makes scores of thousands (the suite's LargeLogits), where an error
// of the products is multiplied by the scores' size in P. origin: the team's first query row
// and first key (split-KV's chunks start past key 0): rows before it must stay unwritten.
template <class Tag, int D, int R = 1, bool Dropped = false>
void check_simulated_team(SimMask mask, bool late, bool groups = true, float amp = 1.0f,
                          int origin = 0) {
  SCOPED_TRACE(std::string(Type<Tag>::name) + ", D = " + std::to_string(D) +
               ", R = " + std::to_string(R) + ", mask " + std::to_string(int(mask)) +
               ", amplitude " + std::to_string(amp) + ", origin " + std::to_string(origin) +
               (late ? ", copies late" : ", copies at once") +
               (Dropped ? (groups ? ", dropout by groups" : ", dropout by pairs") : ""));
  const bool band = mask == SimMask::band;
  constexpr bool fp32 = std::is_same_v<Tag, kc::tf32_tag>;
  using Kernel = std::conditional_t<fp32, kc::WarpForwardTf32x3<SimWarp<Tag>, D>,
                                    kc::WarpForward<SimWarp<Tag>, Tag, D, R>>;
  constexpr int units = fp32 ? 2 * D : D;  // 16-bit units per row
  constexpr int nq = 50 * R, nk = 150;     // the last warp's rows partly past nq
  const double scale = 1.0 / std::sqrt(double(D));
  std::mt19937_64 gen(kSeed + D);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto put = [&](std::vector<std::uint16_t>& bits, std::size_t i, float x) {
    if constexpr (fp32)
      std::memcpy(bits.data() + 2 * i, &x, sizeof x);
    else
      bits[i] = kc::to_bits(Tag{}, x);
  };
  auto array = [&](int rows, std::vector<double>& value, float scale_by = 1.0f) {
    std::vector<std::uint16_t> bits(std::size_t(rows) * units);
    value.assign(std::size_t(rows) * D, 0.0);
    for (std::size_t i = 0; i < value.size(); ++i) {
      const float x = dist(gen) * scale_by;
      put(bits, i, x);
      value[i] = fp32 ? double(x) : double(kc::to_float(Tag{}, bits[i]));
    }
    return bits;
  };
  std::vector<double> q, k, v;
  const auto qb = array(nq, q, amp);
  auto kb = array(nk, k, amp), vb = array(nk, v);
  const auto poison = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      put(kb, i, std::nanf(""));
      put(vb, i, std::nanf(""));
    }
  };
  if (band)  // NaN in the tile nobody sees: reading it at all would show in O
    poison(std::size_t(128) * D, std::size_t(nk) * D);
  if (mask == SimMask::leading) poison(0, std::size_t(64) * D);
  static SimMask kind = SimMask::band;  // a plain function pointer below (Score is a literal)
  static int reach = 60;                // the band's upper edge: the last tile stays hidden
  kind = mask;
  reach = 110 - nq;
  auto visible = [](int i, int j) {
    if (kind == SimMask::leading) return j >= 64;
    return kind == SimMask::none ||
           (i != 7 && (kind != SimMask::band || j <= i + reach) && j >= i - 40);
  };

  const SimScore<Dropped> score{{+visible, groups}, scale};
  std::vector<float> o(std::size_t(nq) * D, std::nanf("")), lse(nq, std::nanf(""));
  struct Writer {
    float* o_data;
    float* lse_data;
    void o(int i, int c, float x) { o_data[std::size_t(i) * D + c] = x; }
    void lse(int i, float x) { lse_data[i] = x; }
  } out{o.data(), lse.data()};

  sim_copies_late = late;
  const int left_in_flight = run_simulated_team(Kernel::shared_bytes(), [&](std::uint16_t* tile) {
    Kernel::run(
        tile, origin, nq - origin, origin, nk,
        [&](int i) { return qb.data() + std::size_t(i) * units; },
        [&](int j) { return kb.data() + std::size_t(j) * units; },
        [&](int j) { return vb.data() + std::size_t(j) * units; }, score, out);
  });
  EXPECT_EQ(left_in_flight, 0) << "copies never waited for";

  // The reference in double and, for float inputs, the naive attention in float.
  double err = 0, naive_err = 0, ref_max = 0;
  for (int i = 0; i < origin; ++i) {
    EXPECT_TRUE(std::isnan(lse[i])) << "row " << i << " before the origin written";
    EXPECT_TRUE(std::isnan(o[std::size_t(i) * D])) << "row " << i << " before the origin written";
  }
  for (int i = origin; i < nq; ++i) {
    std::vector<double> z(nk, -INFINITY);
    std::vector<float> zf(nk, -INFINITY);
    double zmax = -INFINITY;
    float zfmax = -INFINITY;
    for (int j = origin; j < nk; ++j) {
      if (!visible(i, j)) continue;
      double dot = 0;
      float dotf = 0;
      for (int c = 0; c < D; ++c) {
        dot += q[std::size_t(i) * D + c] * k[std::size_t(j) * D + c];
        dotf += float(q[std::size_t(i) * D + c]) * float(k[std::size_t(j) * D + c]);
      }
      z[j] = scale * dot;
      zf[j] = float(scale) * dotf;
      zmax = std::max(zmax, z[j]);
      zfmax = std::max(zfmax, zf[j]);
    }
    if (zmax == -INFINITY) {
      EXPECT_EQ(lse[i], -INFINITY) << "row " << i;
      for (int c = 0; c < D; ++c)
        EXPECT_EQ(o[std::size_t(i) * D + c], 0.0f) << "O(" << i << ", " << c << ")";
      continue;
    }
    double l = 0;
    float lf = 0;
    for (int j = 0; j < nk; ++j) {
      l += std::exp(z[j] - zmax);
      lf += std::exp(zf[j] - zfmax);
    }
    const double lse_ref = zmax + std::log(l);
    EXPECT_NEAR(lse[i], lse_ref, 1e-5 * std::max(1.0, std::fabs(lse_ref))) << "row " << i;
    for (int c = 0; c < D; ++c) {
      double want = 0, mag = 0;
      float naive = 0;
      for (int j = origin; j < nk; ++j) {
        if (!visible(i, j)) continue;
        const double w = Dropped ? sim_weight(i, j) : 1.0;
        const double pj = std::exp(z[j] - lse_ref) * w;
        want += pj * v[std::size_t(j) * D + c];
        mag += pj * std::fabs(v[std::size_t(j) * D + c]);
        naive += std::exp(zf[j] - zfmax) / lf * float(w) * float(v[std::size_t(j) * D + c]);
      }
      const float got = o[std::size_t(i) * D + c];
      if constexpr (fp32) {
        ASSERT_FALSE(std::isnan(got)) << "O(" << i << ", " << c << ")";
        err = std::max(err, std::fabs(got - want));
        naive_err = std::max(naive_err, std::fabs(naive - want));
        ref_max = std::max(ref_max, std::fabs(want));
      } else {
        EXPECT_NEAR(got, want, 2 * unit_roundoff<Tag> * mag + 1e-5 * mag)
            << "O(" << i << ", " << c << ")";
      }
    }
  }
  if constexpr (fp32) {
    const double bound = 2 * naive_err + 8 * 0x1p-23 * std::max(1.0, ref_max);
    EXPECT_LE(err, bound) << "float's rule: naive float error " << naive_err;
    std::printf(
        "3xTF32 D=%d mask %d amplitude %g: max |O - ref| %.3g, naive float %.3g, "
        "bound %.3g\n",
        D, int(mask), double(amp), err, naive_err, bound);
  }
}

TEST(WarpForward, SimulatedTeamBf16D64) {
  for (const bool late : {false, true})
    for (const SimMask mask : {SimMask::band, SimMask::lower, SimMask::none, SimMask::leading})
      check_simulated_team<kc::bf16_tag, 64>(mask, late);
}
TEST(WarpForward, SimulatedTeamTwoBlocksPerWarpBf16D64) {
  for (const bool late : {false, true})
    for (const SimMask mask : {SimMask::band, SimMask::lower, SimMask::none, SimMask::leading})
      check_simulated_team<kc::bf16_tag, 64, 2>(mask, late);
}
TEST(WarpForward, SimulatedTeamF16D128) {
  for (const bool late : {false, true})
    for (const SimMask mask : {SimMask::band, SimMask::lower, SimMask::none, SimMask::leading})
      check_simulated_team<kc::f16_tag, 128>(mask, late);
}
TEST(WarpForward, SimulatedTeamDropout) {
  for (const SimMask mask : {SimMask::band, SimMask::none})
    for (const bool groups : {true, false}) {
      check_simulated_team<kc::bf16_tag, 64, 1, true>(mask, false, groups);
      check_simulated_team<kc::bf16_tag, 64, 2, true>(mask, true, groups);
      check_simulated_team<kc::f16_tag, 128, 1, true>(mask, false, groups);
    }
}

// Float inputs by 3xTF32 (cuda/warp_forward_tf32x3.hpp): 64 keys a tile at D = 64, 32 at 128.
TEST(WarpForward, SimulatedTeamFloatD64) {
  for (const bool late : {false, true})
    for (const SimMask mask : {SimMask::band, SimMask::lower, SimMask::none, SimMask::leading})
      check_simulated_team<kc::tf32_tag, 64>(mask, late);
}
TEST(WarpForward, SimulatedTeamFloatD128) {
  for (const bool late : {false, true})
    for (const SimMask mask : {SimMask::band, SimMask::lower, SimMask::none, SimMask::leading})
      check_simulated_team<kc::tf32_tag, 128>(mask, late);
}
TEST(WarpForward, SimulatedTeamFloatLargeLogits) {
  for (const float amp : {6.0f, 60.0f}) {  // scores in the tens, and thousands
    check_simulated_team<kc::tf32_tag, 64>(SimMask::lower, false, true, amp);
    check_simulated_team<kc::tf32_tag, 128>(SimMask::none, true, true, amp);
  }
}
// A team whose rows and keys start at 32 (split-KV's chunks start past key 0): the last warps
// hold few rows or none, and key tiles start off the multiples of 64.
TEST(WarpForward, SimulatedTeamOrigin) {
  for (const SimMask mask : {SimMask::lower, SimMask::none}) {
    check_simulated_team<kc::tf32_tag, 64>(mask, true, true, 1.0f, 32);
    check_simulated_team<kc::tf32_tag, 128>(mask, false, true, 1.0f, 32);
    check_simulated_team<kc::bf16_tag, 64, 2>(mask, true, true, 1.0f, 32);
  }
}
TEST(WarpForward, SimulatedTeamFloatDropout) {
  for (const SimMask mask : {SimMask::band, SimMask::none})
    for (const bool groups : {true, false}) {
      check_simulated_team<kc::tf32_tag, 64, 1, true>(mask, false, groups);
      check_simulated_team<kc::tf32_tag, 128, 1, true>(mask, true, groups);
    }
}

// The backward team of cuda/warp_backward.hpp on the same simulator: two query heads of one
// kv head (a GQA group), 70 query rows against 150 keys, the three key tiles as three teams run
// one after another (the last partial), adding into one dQ as the device's teams do by atomics.
// The masks as above (`band` leaves the last key tile unseen, `leading` the first: their teams
// visit no query tile and must write zero dK and dV; row 7 sees no key). dQ, dK and dV against
// the gradients of softmax attention in double on the same 16-bit inputs, with the LSE and
// delta = rowsum(dO O) of that reference passed in as the device gets the forward's.
// Dropped: dropout by sim_weight of (query head, row) and key, as in the forward's check.
template <bool Dropped>
struct SimMasks : SimTiles {
  static constexpr bool dropped = Dropped;
  bool visible(int i, int j) const { return visible_fn(i, j); }
  static float weight(int h, int i, int j) { return sim_weight(4096 * h + i, j); }
  static bool kept(int h, int i, int j) { return weight(h, i, j) != 0; }
  static unsigned kept4(int h, int i, int j) {
    unsigned bits = 0;
    for (int u = 0; u < 4; ++u)
      bits |= (kept(h, i, j + u) ? 1u : 0u) << u;
    return bits;
  }
  static float keep_scale() { return 1.25f; }
};

template <class Tag, int D, int QR, bool Sm90 = true, bool Dropped = false>
void check_simulated_backward(SimMask mask, bool late, bool groups = true) {
  SCOPED_TRACE(std::string(Type<Tag>::name) + ", D = " + std::to_string(D) +
               ", QR = " + std::to_string(QR) + ", mask " + std::to_string(int(mask)) +
               (late ? ", copies late" : ", copies at once") +
               (Sm90 ? ", as on sm_90" : ", as on sm_80") +
               (Dropped ? (groups ? ", dropout by groups" : ", dropout by elements") : ""));
  const auto weight = [](int h, int i, int j) {
    return Dropped ? double(SimMasks<true>::weight(h, i, j)) : 1.0;
  };
  using Kernel = kc::WarpBackward<SimWarp<Tag, Sm90>, Tag, D, QR>;
  constexpr int heads = 2, nq = 70, nk = 150;
  const double u = unit_roundoff<Tag>;
  const double scale = 1.0 / std::sqrt(double(D));
  std::mt19937_64 gen(kSeed + std::uint64_t(3 * D + QR));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  auto array = [&](int rows, std::vector<double>& value) {
    std::vector<std::uint16_t> bits(std::size_t(rows) * D);
    value.assign(bits.size(), 0.0);
    for (std::size_t i = 0; i < bits.size(); ++i) {
      bits[i] = kc::to_bits(Tag{}, dist(gen));
      value[i] = kc::to_float(Tag{}, bits[i]);
    }
    return bits;
  };
  std::vector<double> q, k, v, dout;  // q and dout: heads x nq rows
  const auto qb = array(heads * nq, q), dob = array(heads * nq, dout);
  const auto kb = array(nk, k), vb = array(nk, v);
  static SimMask kind = SimMask::band;
  kind = mask;
  auto visible = [](int i, int j) {
    if (kind == SimMask::leading) return j >= 64;
    return kind == SimMask::none ||
           (i != 7 && (kind != SimMask::band || j <= i + 40) && j >= i - 40);
  };

  // The reference in double, per head: P, LSE, delta, dS; the gradients.
  std::vector<double> lse(std::size_t(heads) * nq), delta(lse.size(), 0.0);
  std::vector<double> p(std::size_t(heads) * nq * nk, 0.0), ds(p.size(), 0.0);
  const auto at = [](int h, int i) { return std::size_t(h) * nq + std::size_t(i); };
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < nq; ++i) {
      const double* qi = &q[at(h, i) * D];
      const double* doi = &dout[at(h, i) * D];
      std::vector<double> z(nk, -INFINITY);
      double zmax = -INFINITY;
      for (int j = 0; j < nk; ++j) {
        if (!visible(i, j)) continue;
        double dot = 0;
        for (int c = 0; c < D; ++c)
          dot += qi[c] * k[std::size_t(j) * D + c];
        z[j] = scale * dot;
        zmax = std::max(zmax, z[j]);
      }
      if (zmax == -INFINITY) {
        lse[at(h, i)] = -INFINITY;
        continue;
      }
      double l = 0;
      for (int j = 0; j < nk; ++j)
        l += std::exp(z[j] - zmax);
      lse[at(h, i)] = zmax + std::log(l);
      double* pi = &p[at(h, i) * nk];
      for (int j = 0; j < nk; ++j)
        pi[j] = std::exp(z[j] - lse[at(h, i)]);
      for (int c = 0; c < D; ++c) {
        double o = 0;
        for (int j = 0; j < nk; ++j)
          o += pi[j] * weight(h, i, j) * v[std::size_t(j) * D + c];
        delta[at(h, i)] += doi[c] * o;
      }
      for (int j = 0; j < nk; ++j) {
        double dp = 0;
        for (int c = 0; c < D; ++c)
          dp += doi[c] * v[std::size_t(j) * D + c];
        ds[at(h, i) * nk + j] = pi[j] * (weight(h, i, j) * dp - delta[at(h, i)]);
      }
    }

  struct Stats {
    const double* lse_data;
    const double* delta_data;
    float lse(int h, int i) const { return float(lse_data[std::size_t(h) * nq + i]); }
    float delta(int h, int i) const { return float(delta_data[std::size_t(h) * nq + i]); }
  } stats{lse.data(), delta.data()};
  const SimMasks<Dropped> masks{{+visible, groups}};
  // dQ sums over the teams (one at a time here); dK and dV are written once per element.
  // dQ on 16 bytes as the device's (Kokkos allocations are aligned; add4 checks it).
  std::vector<std::array<float, 4>> dq_store(std::size_t(heads) * nq * D / 4 + 1);
  float* dq = dq_store[0].data();
  while (reinterpret_cast<std::uintptr_t>(dq) % 16 != 0)
    ++dq;
  std::fill(dq, dq + std::size_t(heads) * nq * D, 0.0f);
  std::vector<float> dk(std::size_t(nk) * D, std::nanf("")), dv(dk.size(), std::nanf(""));
  std::vector<int> dk_writes(dk.size(), 0), dv_writes(dk.size(), 0);
  struct Grads {
    float* dq_data;
    float* dk_data;
    float* dv_data;
    int* dk_count;
    int* dv_count;
    float* dq_row(int h, int i) const { return dq_data + (std::size_t(h) * nq + i) * D; }
    void dk(int j, int c, float x) {
      dk_data[std::size_t(j) * D + c] = x;
      ++dk_count[std::size_t(j) * D + c];
    }
    void dv(int j, int c, float x) {
      dv_data[std::size_t(j) * D + c] = x;
      ++dv_count[std::size_t(j) * D + c];
    }
  } grads{dq, dk.data(), dv.data(), dk_writes.data(), dv_writes.data()};

  sim_copies_late = late;
  int left_in_flight = 0;
  for (int k0 = 0; k0 < nk; k0 += Kernel::keys) {
    const int nc = std::min(Kernel::keys, nk - k0);
    left_in_flight += run_simulated_team(Kernel::shared_bytes(), [&](std::uint16_t* tile) {
      Kernel::run(
          tile, k0, nc, heads, nq, float(scale),
          [&](int j) { return kb.data() + std::size_t(j) * D; },
          [&](int j) { return vb.data() + std::size_t(j) * D; },
          [&](int h, int i) { return qb.data() + at(h, i) * D; },
          [&](int h, int i) { return dob.data() + at(h, i) * D; }, stats, masks, grads);
    });
  }
  EXPECT_EQ(left_in_flight, 0) << "copies never waited for";

  for (int j = 0; j < nk; ++j)
    for (int c = 0; c < D; ++c) {
      const std::size_t e = std::size_t(j) * D + c;
      ASSERT_EQ(dk_writes[e], 1) << "dK(" << j << ", " << c << ") writes";
      ASSERT_EQ(dv_writes[e], 1) << "dV(" << j << ", " << c << ") writes";
      double want_v = 0, mag_v = 0, want_k = 0, mag_k = 0;
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < nq; ++i) {
          const double pij = p[at(h, i) * nk + j] * weight(h, i, j), dsij = ds[at(h, i) * nk + j];
          const double doc = dout[at(h, i) * D + c], qc = q[at(h, i) * D + c];
          want_v += pij * doc;
          mag_v += std::fabs(pij * doc);
          want_k += scale * dsij * qc;
          mag_k += scale * std::fabs(dsij * qc);
        }
      EXPECT_NEAR(dv[e], want_v, 4 * u * mag_v + 1e-5) << "dV(" << j << ", " << c << ")";
      EXPECT_NEAR(dk[e], want_k, 4 * u * mag_k + 1e-4) << "dK(" << j << ", " << c << ")";
    }
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < nq; ++i)
      for (int c = 0; c < D; ++c) {
        double want = 0, mag = 0;
        for (int j = 0; j < nk; ++j) {
          const double x = scale * ds[at(h, i) * nk + j] * k[std::size_t(j) * D + c];
          want += x;
          mag += std::fabs(x);
        }
        EXPECT_NEAR(dq[at(h, i) * D + c], want, 4 * u * mag + 1e-4)
            << "dQ(" << h << ", " << i << ", " << c << ")";
      }
}

TEST(WarpBackward, SimulatedTeamBf16D64) {
  // Copies late with two masks, at once with the other two (each mode fails its mutant).
  check_simulated_backward<kc::bf16_tag, 64, 64>(SimMask::band, true);
  check_simulated_backward<kc::bf16_tag, 64, 64>(SimMask::lower, false);
  check_simulated_backward<kc::bf16_tag, 64, 64>(SimMask::none, false);
  check_simulated_backward<kc::bf16_tag, 64, 64>(SimMask::leading, true);
}
TEST(WarpBackward, SimulatedTeamBf16D64Rows32) {  // a tile size the device does not run today
  check_simulated_backward<kc::bf16_tag, 64, 32>(SimMask::band, true);
}
TEST(WarpBackward, SimulatedTeamSm80) {  // dQ by elements, LSE and delta stored at once
  check_simulated_backward<kc::bf16_tag, 64, 64, false>(SimMask::band, true);
  check_simulated_backward<kc::f16_tag, 128, 16, false>(SimMask::lower, false);
}
TEST(WarpBackward, SimulatedTeamDropout) {  // the device's tiles with dropout: 32 rows at D 64
  for (const bool groups : {true, false}) {
    check_simulated_backward<kc::bf16_tag, 64, 32, true, true>(SimMask::band, true, groups);
    check_simulated_backward<kc::bf16_tag, 64, 32, false, true>(SimMask::none, false, groups);
    check_simulated_backward<kc::bf16_tag, 64, 64, true, true>(SimMask::lower, false, groups);
    check_simulated_backward<kc::f16_tag, 128, 16, true, true>(SimMask::lower, false, groups);
    check_simulated_backward<kc::f16_tag, 128, 16, false, true>(SimMask::leading, true, groups);
  }
}
TEST(WarpBackward, SimulatedTeamF16D128) {
  // Copies late with two masks, at once with the other two (each mode fails its mutant).
  check_simulated_backward<kc::f16_tag, 128, 16>(SimMask::band, true);
  check_simulated_backward<kc::f16_tag, 128, 16>(SimMask::lower, false);
  check_simulated_backward<kc::f16_tag, 128, 16>(SimMask::none, true);
  check_simulated_backward<kc::f16_tag, 128, 16>(SimMask::leading, false);
}

#if defined(KOKKOS_ENABLE_CUDA)
using DeviceView = Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::CudaSpace>;

DeviceView to_device(const std::vector<float>& v, const std::string& label) {
  DeviceView d(label, v.size());
  Kokkos::View<const float*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(
      v.data(), v.size());
  Kokkos::deep_copy(d, h);
  return d;
}

template <class Tag>
struct WarpProduct {
  using Member = Kokkos::TeamPolicy<Kokkos::Cuda>::member_type;
  DeviceView a, b, c, d;
  int rows, k, cols, a_rs, a_cs, b_rs, b_cs, ldc;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, 32), [&](int lane) {
      (void)lane;
      KOKKOS_IF_ON_DEVICE((product(lane);))  // mma exists in device code only
    });
  }

  __device__ void product(int lane) const {
    const kc::FragA<Tag> fa = kc::load_a(Tag{}, a.data(), a_rs, a_cs, rows, k, lane);
    const kc::FragB<Tag> fb = kc::load_b(Tag{}, b.data(), b_rs, b_cs, k, cols, lane);
    kc::FragC fc = kc::load_c(c.data(), ldc, rows, cols, lane);
    kc::mma(fc, fa, fb);
    kc::store_c(fc, d.data(), ldc, rows, cols, lane);
  }
};

template <class Tag>
void check_device_products() {
  std::mt19937_64 gen(kSeed);
  std::cout << "seed " << kSeed << "\n";
  for (const Shape& s : shapes<Tag>()) {
    SCOPED_TRACE(std::string(Type<Tag>::name) + ", " + s.name + " (device)");
    const Problem p = make_problem<Tag>(s, gen);
    WarpProduct<Tag> f{
        to_device(p.a, "kfa::test::a"),
        to_device(p.b, "kfa::test::b"),
        to_device(p.c, "kfa::test::c"),
        to_device(std::vector<float>(std::size_t(16) * p.ldc, kSentinel), "kfa::test::d"),
        p.rows,
        p.k,
        p.cols,
        p.a_rs,
        p.a_cs,
        p.b_rs,
        p.b_cs,
        p.ldc};
    Kokkos::parallel_for("kfa::test::mma", Kokkos::TeamPolicy<Kokkos::Cuda>(1, 1, 32), f);
    std::vector<float> d(f.d.size());
    Kokkos::deep_copy(
        Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
            d.data(), d.size()),
        f.d);
    check_d<Tag>(p, d);
  }
}

bool has_tensor_cores() {
  return Kokkos::Cuda().cuda_device_prop().major >= 8;
}

TEST(Mma, DeviceProducts) {
  if (!has_tensor_cores()) GTEST_SKIP() << "mma.sync m16n8k16 and tf32 need sm_80 or newer";
  check_device_products<kc::bf16_tag>();
  check_device_products<kc::f16_tag>();
  check_device_products<kc::tf32_tag>();
}

// Outside the TEST body: nvcc takes no device lambda in a private member function.
void check_device_rounding() {
  const std::vector<float> x = sweep_inputs(kSeed + 1);
  const DeviceView in = to_device(x, "kfa::test::x");
  Kokkos::View<std::uint32_t* [3], Kokkos::LayoutRight, Kokkos::CudaSpace> out("kfa::test::bits",
                                                                               x.size());
  Kokkos::parallel_for(
      "kfa::test::round", Kokkos::RangePolicy<Kokkos::Cuda>(0, x.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        out(i, 0) = kc::to_bits(kc::bf16_tag{}, in(i));
        out(i, 1) = kc::to_bits(kc::f16_tag{}, in(i));
        out(i, 2) = kc::to_bits(kc::tf32_tag{}, in(i));
      });
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h(i, 0), kc::to_bits(kc::bf16_tag{}, x[i])) << std::hex << bits_from(x[i]);
    ASSERT_EQ(h(i, 1), kc::to_bits(kc::f16_tag{}, x[i])) << std::hex << bits_from(x[i]);
    ASSERT_EQ(h(i, 2), kc::to_bits(kc::tf32_tag{}, x[i])) << std::hex << bits_from(x[i]);
  }
}
TEST(Mma, DeviceRoundingMatchesHost) {
  check_device_rounding();
}
#else
TEST(Mma, DeviceProducts) {
  GTEST_SKIP() << "needs Kokkos' CUDA backend";
}
#endif

}  // namespace
