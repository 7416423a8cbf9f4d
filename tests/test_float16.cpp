// kfa::bf16 and kfa::half (<kfa/float16.hpp>): their conversions against references that share
// no code with them. Decoding is checked on all 65536 encodings against the formula of each
// format evaluated in double; rounding from float against a rounding done in double arithmetic
// (the two neighbours of x in the format, the nearer one, ties to the even encoding, and the
// overflow threshold where rounding with an unbounded exponent reaches 2^emax+1), on every
// midpoint between neighbouring encodings and the floats either side of it, every encoding
// itself, the special values and random floats of every exponent. Where the compiler targets
// F16C, kfa::half uses its instructions; they are compared with the portable integer path too.
#include <gtest/gtest.h>
#include <kfa/kfa.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace {

namespace impl = kfa::backends::float16_impl;

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The layout of a 16-bit format: exponent and mantissa bits, exponent bias.
struct Format {
  int ebits, mbits, bias;
};
constexpr Format kBf16{8, 7, 127}, kHalf{5, 10, 15};

template <class T>
constexpr Format format() {
  return std::is_same_v<T, kfa::bf16> ? kBf16 : kHalf;
}

// The value of encoding h, in double, from the format's definition. NaN for every NaN.
double decode(const Format& f, std::uint16_t h) {
  const int e = (h >> f.mbits) & ((1 << f.ebits) - 1);
  const int m = h & ((1 << f.mbits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << f.ebits) - 1)
    return m ? std::numeric_limits<double>::quiet_NaN()
             : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.mbits);
  return sign * std::ldexp((1 << f.mbits) + m, e - f.bias - f.mbits);
}

// The encoding the format's rounding gives for float x (not NaN): the nearest of the two
// encodings around |x|, found as magnitudes in double, ties to the even one, and infinity at and
// beyond the midpoint between the largest finite value and 2^(emax+1).
// `ties` counts the inputs that fall exactly between two encodings.
std::uint16_t reference_round(const Format& f, float x, long long& ties) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const std::uint16_t inf = static_cast<std::uint16_t>(((1 << f.ebits) - 1) << f.mbits);
  const double max_finite = decode(f, static_cast<std::uint16_t>(inf - 1));
  const double ulp_max = std::ldexp(1.0, (1 << f.ebits) - 2 - f.bias - f.mbits);
  if (a >= max_finite + ulp_max / 2) return sign | inf;
  // The largest encoding (of a magnitude) whose value is <= a, by bisection over encodings.
  std::uint16_t lo = 0, hi = static_cast<std::uint16_t>(inf - 1);
  while (lo < hi) {
    const std::uint16_t mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (decode(f, mid) <= a)
      lo = mid;
    else
      hi = static_cast<std::uint16_t>(mid - 1);
  }
  if (decode(f, lo) == a || lo == inf - 1) return sign | lo;
  const std::uint16_t up = static_cast<std::uint16_t>(lo + 1);
  const double below = a - decode(f, lo), above = decode(f, up) - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | up;
  ++ties;
  return sign | ((lo & 1) ? up : lo);
}

template <class T>
std::uint16_t bits_from(float x) {
  return T(x).bits;
}

// The floats the rounding is tried on: every encoding, every midpoint between neighbouring
// encodings and the floats just below and above it (both signs), the special values, and
// random floats over every exponent.
std::vector<float> rounding_inputs(const Format& f) {
  std::vector<float> xs;
  const std::uint16_t inf = static_cast<std::uint16_t>(((1 << f.ebits) - 1) << f.mbits);
  for (std::uint32_t h = 0; h < inf; ++h) {
    const double v = decode(f, static_cast<std::uint16_t>(h));
    // The next value up; for the largest finite one, 2^(emax+1) (where infinity starts counting).
    const double next = h + 1 < inf ? decode(f, static_cast<std::uint16_t>(h + 1))
                                    : 2 * v - decode(f, static_cast<std::uint16_t>(h - 1));
    const float mid = static_cast<float>((v + next) / 2);  // exact: at most 12 significant bits
    for (float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  const float inf_f = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, inf_f, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                  0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.7fep-24f, 0x1.8p-24f, 0x1p-14f,
                  0x1.ffcp-15f, 0x1.ffep-15f, 0x1.ffe002p-15f}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  std::mt19937_64 gen(16);
  for (int i = 0; i < 1 << 20; ++i) {
    const auto u = static_cast<std::uint32_t>(gen());
    if ((u & 0x7f800000u) != 0x7f800000u) xs.push_back(float_of(u));
  }
  return xs;
}

template <class T>
class Float16Test : public ::testing::Test {};
using Types = ::testing::Types<kfa::bf16, kfa::half>;
TYPED_TEST_SUITE(Float16Test, Types);

TYPED_TEST(Float16Test, StorageType) {
  using T = TypeParam;
  static_assert(sizeof(T) == 2 && std::is_trivially_copyable_v<T>);
  static_assert(kfa::backends::is_narrow_float<T>::value);
  static_assert(kfa::backends::is_value_type_v<T>);
  static_assert(std::is_same_v<kfa::backends::accum_t<T>, float>);
  static_assert(!std::is_convertible_v<float, T> && !std::is_convertible_v<T, float>);
  // Through a View on the host, as kfa's tensors hold it.
  Kokkos::View<T*, Kokkos::HostSpace> v("v", 3);
  v(0) = T(1.5f);
  v(1) = T(-2.0);
  EXPECT_EQ(static_cast<float>(v(0)), 1.5f);
  EXPECT_EQ(static_cast<double>(v(1)), -2.0);
  EXPECT_EQ(v(2).bits, 0);
}

// Every encoding decodes to the format's value (float and double alike); every one but the
// signalling NaNs comes back unchanged from float, and a signalling NaN comes back as the
// quiet NaN of the same sign and payload.
TYPED_TEST(Float16Test, EveryEncodingThroughFloat) {
  using T = TypeParam;
  constexpr Format f = format<T>();
  const std::uint16_t quiet = static_cast<std::uint16_t>(1 << (f.mbits - 1));
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float x = static_cast<float>(T::from_bits(h));
    const double want = decode(f, h);
    SCOPED_TRACE(::testing::Message() << std::hex << "encoding 0x" << b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(x));
      ASSERT_EQ(std::signbit(x), (h & 0x8000) != 0);
      ASSERT_EQ(bits_from<T>(x), h | quiet);
      ASSERT_TRUE(std::isnan(static_cast<double>(T::from_bits(h))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(x), want);
    ASSERT_EQ(std::signbit(x), (h & 0x8000) != 0);
    ASSERT_EQ(static_cast<double>(T::from_bits(h)), want);
    ASSERT_EQ(bits_from<T>(x), h);
    ASSERT_EQ(T(static_cast<double>(x)).bits, h);
    if (std::is_same_v<T, kfa::bf16>) {
      ASSERT_EQ(bits_of(x), b << 16) << "bf16 is a float's top";
    }
  }
}

// Rounding from float: nearest, ties to even, overflow to infinity, subnormals, signed zeros.
TYPED_TEST(Float16Test, RoundingFromFloat) {
  using T = TypeParam;
  constexpr Format f = format<T>();
  long long ties = 0;
  for (const float x : rounding_inputs(f)) {
    const std::uint16_t want = reference_round(f, x, ties), got = bits_from<T>(x);
    ASSERT_EQ(got, want) << std::hexfloat << x << std::hex << " (float bits 0x" << bits_of(x)
                         << ")";
  }
  EXPECT_GT(ties, 10000) << "the inputs hold ties";
}

// The edges by name, each against the value the format's definition gives.
TEST(Float16, Edges) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  // bf16: ties to even, the largest finite value and what rounds past it, NaN kept.
  EXPECT_EQ(kfa::bf16(1.0f + 0x1p-8f).bits, 0x3f80);      // tie, to even (down)
  EXPECT_EQ(kfa::bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);  // tie, to even (up)
  EXPECT_EQ(kfa::bf16(1.0f + 0x1p-8f + 0x1p-23f).bits, 0x3f81);
  EXPECT_EQ(kfa::bf16(float_of(0x7f7f7fffu)).bits, 0x7f7f);
  EXPECT_EQ(kfa::bf16(float_of(0x7f7f8000u)).bits, 0x7f80);  // tie at the top: to inf
  EXPECT_EQ(kfa::bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(kfa::bf16(-inf).bits, 0xff80);
  EXPECT_EQ(kfa::bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(kfa::bf16(float_of(0x00008000u)).bits, 0x0000);  // a float subnormal tie
  EXPECT_EQ(kfa::bf16(float_of(0x7f800001u)).bits, 0x7fc0);  // signalling NaN, made quiet
  EXPECT_TRUE(std::isnan(static_cast<float>(kfa::bf16(nan))));
  EXPECT_EQ(kfa::bf16(1e300).bits, 0x7f80);  // double beyond float: inf
  // half: 65504 is the largest finite value; 65520 the midpoint to 2^16, rounding to inf.
  EXPECT_EQ(kfa::half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(kfa::half(65519.99f).bits, 0x7bff);
  EXPECT_EQ(kfa::half(65520.0f).bits, 0x7c00);
  EXPECT_EQ(kfa::half(-1e10f).bits, 0xfc00);
  EXPECT_EQ(kfa::half(inf).bits, 0x7c00);
  EXPECT_EQ(kfa::half(-0.0f).bits, 0x8000);
  EXPECT_EQ(kfa::half(1.0f + 0x1p-11f).bits, 0x3c00);      // tie, to even (down)
  EXPECT_EQ(kfa::half(1.0f + 3 * 0x1p-11f).bits, 0x3c02);  // tie, to even (up)
  EXPECT_EQ(kfa::half(0x1p-24f).bits, 0x0001);             // smallest subnormal
  EXPECT_EQ(kfa::half(0x1p-25f).bits, 0x0000);             // its half: a tie, to even 0
  EXPECT_EQ(kfa::half(0x1.000002p-25f).bits, 0x0001);
  EXPECT_EQ(kfa::half(0x1.8p-24f).bits, 0x0002);    // 1.5 subnormal ulps: tie, to even 2
  EXPECT_EQ(kfa::half(0x1.ff8p-15f).bits, 0x03ff);  // largest subnormal, 1023 2^-24
  EXPECT_EQ(kfa::half(0x1.ffcp-15f).bits, 0x0400);  // tie above it: to the smallest normal
  EXPECT_EQ(static_cast<float>(kfa::half::from_bits(0x0001)), 0x1p-24f);
  EXPECT_EQ(static_cast<float>(kfa::half::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(kfa::half(float_of(0x7f802000u)).bits, 0x7e01);  // payload's top bits kept, quiet
  EXPECT_EQ(kfa::half(float_of(0xffc00000u)).bits, 0xfe00);
  EXPECT_TRUE(std::isnan(static_cast<float>(kfa::half::from_bits(0x7c01))));
}

// The portable integer conversions of half against F16C's where kfa::half uses F16C, bit for
// bit; elsewhere the portable ones are what kfa::half runs, already checked above.
TEST(Float16, PortableMatchesHardware) {
#if !defined(KFA_FLOAT16_F16C)
  GTEST_SKIP() << "no F16C in this build: kfa::half runs the portable conversions only";
#else
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    ASSERT_EQ(bits_of(impl::half_to_float_portable(h)), bits_of(impl::half_to_float(h)))
        << std::hex << b;
  }
  // Every sign, exponent and top 10 mantissa bits, with the low 13 bits (those rounded away
  // from a normal half) at zero, one, just below, at and above the midpoint, and all ones.
  for (std::uint32_t top = 0; top < (1u << 19); ++top)
    for (std::uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) {
      const float x = float_of(top << 13 | low);
      ASSERT_EQ(impl::half_bits_portable(x), impl::half_bits(x)) << std::hex << bits_of(x);
    }
  std::mt19937_64 gen(17);
  for (int i = 0; i < 1 << 22; ++i) {
    const float x = float_of(static_cast<std::uint32_t>(gen()));
    ASSERT_EQ(impl::half_bits_portable(x), impl::half_bits(x)) << std::hex << bits_of(x);
  }
#endif
}

}  // namespace
