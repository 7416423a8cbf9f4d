#pragma once
/// \file cuda/mma.hpp
/// Warp-level tensor-core tile products for the CUDA backend: the fragments of
/// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` and
/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, where each lane of a warp holds its
/// share of A, B and the float accumulator C in registers as the PTX ISA lays them out
/// (sections "Matrix Fragments for mma.m16n8k16 with floating point type" and "Matrix
/// Fragments for mma.m16n8k8", .tf32); the float-to-16-bit and float-to-tf32 rounding the
/// loads do; loads of those fragments from float tiles with any strides and bounds; and the
/// products.
///
/// Everything except `mma` is host and device code with no Kokkos dependency, so that the
/// host compiler parses and tests the layouts and the rounding (tests/test_mma.cpp emulates
/// the instruction there) and nvcc can compile this file on its own. `mma` is device code for
/// sm_80 and newer and exists only when nvcc compiles.
///
/// Tile names as in FlashAttention-2: S = Q K^T takes A = a 16-row block of Q (row-major) and
/// B = K^T, read in place from row-major K with rs = 1, cs = ldk; O += P V takes A = P straight
/// from the accumulators of S (a_from_c) and B = V (row-major).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
/// Host and device function, inline (nvcc).
#define KFA_MMA_FUNCTION __host__ __device__ inline
#else
/// Host and device function, inline (a host compiler: plain inline).
#define KFA_MMA_FUNCTION inline
#endif

/// Unrolls the loop that follows in device code: a warp's fragment arrays stay in registers
/// only while every index into them is a constant. Nothing on the host (no unknown pragma).
#if defined(__CUDA_ARCH__)
#define KFA_UNROLL _Pragma("unroll")
#else
#define KFA_UNROLL
#endif

/// Keeps the loop that follows rolled in device code (one iteration's registers at a time);
/// nothing on the host.
#if defined(__CUDA_ARCH__)
#define KFA_NO_UNROLL _Pragma("unroll 1")
#else
#define KFA_NO_UNROLL
#endif

namespace kfa::backends::cuda {

/// Operands in bfloat16 (8 exponent bits, 7 stored mantissa bits): m16n8k16.
struct bf16_tag {};
/// Operands in IEEE binary16 (5 exponent bits, 10 stored mantissa bits): m16n8k16.
struct f16_tag {};
/// Operands in TensorFloat-32 (float with 10 stored mantissa bits): m16n8k8.
struct tf32_tag {};

/// Shape of one warp-wide product D = A B + C for operand type Tag: A is m x k, B is k x n,
/// C and D are m x n floats; each lane holds a_elements of A, b_elements of B and 4 of C, in
/// 32-bit registers of per_register elements each.
template <class Tag>
struct MmaShape;

/// bfloat16: m16n8k16, two elements per register.
template <>
struct MmaShape<bf16_tag> {
  static constexpr int m = 16;            ///< rows of A, C, D
  static constexpr int n = 8;             ///< columns of B, C, D
  static constexpr int k = 16;            ///< columns of A, rows of B
  static constexpr int a_elements = 8;    ///< A elements per lane
  static constexpr int b_elements = 4;    ///< B elements per lane
  static constexpr int per_register = 2;  ///< elements per 32-bit register
};

/// binary16: m16n8k16, two elements per register.
template <>
struct MmaShape<f16_tag> {
  static constexpr int m = 16;            ///< rows of A, C, D
  static constexpr int n = 8;             ///< columns of B, C, D
  static constexpr int k = 16;            ///< columns of A, rows of B
  static constexpr int a_elements = 8;    ///< A elements per lane
  static constexpr int b_elements = 4;    ///< B elements per lane
  static constexpr int per_register = 2;  ///< elements per 32-bit register
};

/// tf32: m16n8k8, one element (a float's bit pattern) per register.
template <>
struct MmaShape<tf32_tag> {
  static constexpr int m = 16;            ///< rows of A, C, D
  static constexpr int n = 8;             ///< columns of B, C, D
  static constexpr int k = 8;             ///< columns of A, rows of B
  static constexpr int a_elements = 4;    ///< A elements per lane
  static constexpr int b_elements = 2;    ///< B elements per lane
  static constexpr int per_register = 1;  ///< elements per 32-bit register
};

/// One lane's share of A (m x k). Four registers for every tag; the tag keeps a bf16
/// fragment out of an f16 product. Register j holds elements 2j (low half) and 2j + 1 (high
/// half) for 16-bit tags, element j for tf32.
template <class Tag>
struct FragA {
  std::uint32_t x[4];  ///< the registers, as the mma instruction takes them
};

/// One lane's share of B (k x n): two registers, packed as in FragA.
template <class Tag>
struct FragB {
  std::uint32_t x[2];  ///< the registers, as the mma instruction takes them
};

/// One lane's share of the float accumulator C or D (16 x 8), the same for every tag.
struct FragC {
  float x[4];  ///< elements c0..c3
};

/// Position of a fragment element in its matrix.
struct Coord {
  int row;  ///< row (for B: the k index)
  int col;  ///< column (for B: the n index)
};

/// The PTX tables' groupID: lanes 4g..4g+3 share the rows (of A, C) or column (of B) g, g + 8.
KFA_MMA_FUNCTION constexpr int group_id(int lane) {
  return lane >> 2;
}
/// The PTX tables' threadID_in_group: which columns (of A, C) or rows (of B) within the group.
KFA_MMA_FUNCTION constexpr int thread_in_group(int lane) {
  return lane & 3;
}

/// \cond kfa_internal
namespace detail {
// m16n8k16, 16-bit A (16 x 16): a0,a1 at (g, 2t..2t+1); a2,a3 at (g+8, 2t..); a4,a5 at
// (g, 2t+8..); a6,a7 at (g+8, 2t+8..).
KFA_MMA_FUNCTION constexpr Coord a_coord_k16(int lane, int i) {
  return {group_id(lane) + 8 * ((i >> 1) & 1), 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2)};
}
// m16n8k16, 16-bit B (16 x 8): b0,b1 at (2t..2t+1, g); b2,b3 at (2t+8.., g).
KFA_MMA_FUNCTION constexpr Coord b_coord_k16(int lane, int i) {
  return {2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 1), group_id(lane)};
}
}  // namespace detail
/// \endcond

/// (row, col) in the 16 x 16 A of bf16 element i (0..7) of lane's fragment.
KFA_MMA_FUNCTION constexpr Coord a_coord(bf16_tag, int lane, int i) {
  return detail::a_coord_k16(lane, i);
}
/// (row, col) in the 16 x 16 A of f16 element i (0..7) of lane's fragment.
KFA_MMA_FUNCTION constexpr Coord a_coord(f16_tag, int lane, int i) {
  return detail::a_coord_k16(lane, i);
}
/// (row, col) in the 16 x 8 A of tf32 element i (0..3): a0 (g, t), a1 (g+8, t), a2 (g, t+4),
/// a3 (g+8, t+4). Rows alternate first here, columns first in the 16-bit layout.
KFA_MMA_FUNCTION constexpr Coord a_coord(tf32_tag, int lane, int i) {
  return {group_id(lane) + 8 * (i & 1), thread_in_group(lane) + 4 * (i >> 1)};
}

/// (k, n) in the 16 x 8 B of bf16 element i (0..3) of lane's fragment.
KFA_MMA_FUNCTION constexpr Coord b_coord(bf16_tag, int lane, int i) {
  return detail::b_coord_k16(lane, i);
}
/// (k, n) in the 16 x 8 B of f16 element i (0..3) of lane's fragment.
KFA_MMA_FUNCTION constexpr Coord b_coord(f16_tag, int lane, int i) {
  return detail::b_coord_k16(lane, i);
}
/// (k, n) in the 8 x 8 B of tf32 element i (0..1): b0 (t, g), b1 (t+4, g).
KFA_MMA_FUNCTION constexpr Coord b_coord(tf32_tag, int lane, int i) {
  return {thread_in_group(lane) + 4 * i, group_id(lane)};
}

/// (row, col) in the 16 x 8 C or D of accumulator element i (0..3), every tag: c0,c1 at
/// (g, 2t..2t+1), c2,c3 at (g+8, 2t..2t+1).
KFA_MMA_FUNCTION constexpr Coord c_coord(int lane, int i) {
  return {group_id(lane) + 8 * (i >> 1), 2 * thread_in_group(lane) + (i & 1)};
}

// Rounding. All three conversions round to nearest, ties to even, by the same integer
// arithmetic on host and device, so that the host emulation in the tests and the GPU see
// the same operands bit for bit. The device could use cvt.rn.{bf16x2,f16x2}.f32 (one
// instruction for two elements) but its NaN payloads are not specified to match; tf32 has
// only cvt.rna (ties away from zero) before sm_90. A tuned kernel converts once, when it
// stages a tile, so this cost is not in its inner loop.

/// \cond kfa_internal
namespace detail {
KFA_MMA_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KFA_MMA_FUNCTION float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace detail
/// \endcond

/// x rounded to bfloat16 (nearest, ties to even), as its 16 bits. Overflow goes to infinity
/// by the rounding rule; a NaN stays a NaN (quiet, sign and upper payload kept).
KFA_MMA_FUNCTION std::uint16_t to_bits(bf16_tag, float x) {
  const std::uint32_t u = detail::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  // Adding 0x7fff plus the lowest kept bit carries into the kept bits exactly when the
  // dropped half is above one half, or equal to it with the kept value odd.
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// x rounded to IEEE binary16 (nearest, ties to even), as its 16 bits: subnormal halves
/// below 2^-14, infinity from 65520 up (the tie above the largest half, 65504, goes to the
/// even neighbour, infinity), a NaN stays a NaN (quiet, sign and upper payload kept).
KFA_MMA_FUNCTION std::uint16_t to_bits(f16_tag, float x) {
  const std::uint32_t u = detail::bits_of(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t h = 0;  // |x| <= 2^-25 rounds to zero (2^-25 is a tie, to the even 0)
  if (a > 0x7f800000u) {
    h = 0x7e00u | ((a >> 13) & 0x3ffu);  // NaN
  } else if (a >= 0x477ff000u) {
    h = 0x7c00u;  // 65520 and up, infinity included
  } else if (a >= 0x38800000u) {
    // A normal half: rebias the exponent (127 -> 15) and drop 13 bits. A carry out of the
    // mantissa on rounding up is the right encoding of the next binade.
    h = (a - 0x38000000u) >> 13;
    const std::uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  } else if (a > 0x33000000u) {
    // A subnormal half, counted in units of 2^-24: the float's exponent is 102..112 here,
    // so the significand shifts right by 14..24. Rounding up to 0x400 gives 2^-14, exact.
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (a >> 23);
    h = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) ++h;
  }
  return static_cast<std::uint16_t>(sign | h);
}

/// x rounded to tf32 (nearest, ties to even; the tensor core reads the upper 19 bits of the
/// register), as float bits with the 13 low mantissa bits zero. Overflow goes to infinity; a
/// NaN stays a NaN (quiet). PTX's cvt.rna.tf32.f32 rounds ties away from zero instead: the two
/// differ only on exact ties, and this one is the same rule as the 16-bit types.
KFA_MMA_FUNCTION std::uint32_t to_bits(tf32_tag, float x) {
  const std::uint32_t u = detail::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x400000u) & 0xffffe000u;
  return (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
}

/// x as hi + lo, both tf32 (3xTF32, cuda/warp_forward_tf32x3.hpp): hi is x rounded to tf32 and
/// lo the rest x - hi (exact in float) rounded to tf32, so hi + lo keeps about 22 of float's 24
/// significant bits. The device rounds by cvt.rna.tf32.f32 (one instruction, ties away from
/// zero), the host by to_bits (ties to even): either is a split of x, which is what the
/// products need. For finite x below the largest float by more than one tf32 step (where hi
/// would round to infinity).
KFA_MMA_FUNCTION void split_tf32(float x, std::uint32_t& hi, std::uint32_t& lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
  const float rest = x - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(rest));
#else
  hi = to_bits(tf32_tag{}, x);
  lo = to_bits(tf32_tag{}, x - detail::float_of(hi));
#endif
}

/// The float value of bfloat16 bits (exact).
KFA_MMA_FUNCTION float to_float(bf16_tag, std::uint16_t bits) {
  return detail::float_of(static_cast<std::uint32_t>(bits) << 16);
}

/// The float value of binary16 bits (exact), subnormals, infinities and NaN included.
KFA_MMA_FUNCTION float to_float(f16_tag, std::uint16_t bits) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
  const std::uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
  if (e == 0x1fu) return detail::float_of(sign | 0x7f800000u | (m << 13));
  if (e == 0) {  // m * 2^-24, exact in float; the sign put back by bits for -0
    const float v = static_cast<float>(m) * 0x1p-24f;
    return detail::float_of(sign | detail::bits_of(v));
  }
  return detail::float_of(sign | ((e + 112u) << 23) | (m << 13));
}

/// The float value of tf32 bits (they are float bits).
KFA_MMA_FUNCTION float to_float(tf32_tag, std::uint32_t bits) {
  return detail::float_of(bits);
}

/// x as the tensor core sees it after rounding to Tag, as a float (exact).
template <class Tag>
KFA_MMA_FUNCTION float rounded(Tag tag, float x) {
  return to_float(tag, to_bits(tag, x));
}

/// Two elements rounded to bfloat16 in one register: lo (the lower-indexed element) in the
/// low 16 bits, as mma reads a .bf16x2 operand.
KFA_MMA_FUNCTION std::uint32_t pack2(bf16_tag tag, float lo, float hi) {
  return static_cast<std::uint32_t>(to_bits(tag, lo)) |
         (static_cast<std::uint32_t>(to_bits(tag, hi)) << 16);
}

/// Two elements rounded to binary16 in one register, lo in the low 16 bits.
KFA_MMA_FUNCTION std::uint32_t pack2(f16_tag tag, float lo, float hi) {
  return static_cast<std::uint32_t>(to_bits(tag, lo)) |
         (static_cast<std::uint32_t>(to_bits(tag, hi)) << 16);
}

/// Element half (0: low, 1: high) of a packed 16-bit register, as a float (exact).
template <class Tag>
KFA_MMA_FUNCTION float unpack(Tag tag, std::uint32_t reg, int half) {
  static_assert(MmaShape<Tag>::per_register == 2, "unpack is for 16-bit operand types");
  return to_float(tag, static_cast<std::uint16_t>(half ? reg >> 16 : reg & 0xffffu));
}

/// \cond kfa_internal
namespace detail {
// Element (r, c) of a strided tile, 0 outside rows x cols. Offsets are int: tiles live in
// shared memory or are addressed from a tile's corner.
KFA_MMA_FUNCTION float element(const float* p, int rs, int cs, int rows, int cols, Coord at) {
  if (at.row >= rows || at.col >= cols) return 0.0f;
  const int offset = at.row * rs + at.col * cs;
  return p[offset];
}

KFA_MMA_FUNCTION std::uint32_t to_register(bf16_tag tag, const float* v) {
  return pack2(tag, v[0], v[1]);
}
KFA_MMA_FUNCTION std::uint32_t to_register(f16_tag tag, const float* v) {
  return pack2(tag, v[0], v[1]);
}
KFA_MMA_FUNCTION std::uint32_t to_register(tf32_tag tag, const float* v) {
  return to_bits(tag, v[0]);
}
}  // namespace detail
/// \endcond

/// Lane's fragment of the A block whose element (r, c) is a[r * rs + c * cs] for r < rows and
/// c < cols and zero elsewhere (rows, cols may be below m, k at the edges of a matrix),
/// rounded to Tag. A transposed operand is rs = 1, cs = its leading dimension.
///
/// One scalar load per element, so any alignment and stride work. Bank conflicts from shared
/// memory, for the warp's 32 loads of one element index: with 16-bit operands the lanes read
/// g * s + 2t, where s is the stride along the dimension the eight groups walk (rs of a
/// row-major A, cs of B = K^T), or g + 2t * s the other way round (a transposed A, a
/// row-major B). A leading dimension s = 4 (mod 8), such as 64 + 4, makes the first two-way
/// (the least it can be: a group's lanes read every other word) and the second
/// conflict-free; s a multiple of 32 makes the first eight-way. tf32 reads g * s + t or
/// g + t * s: s = 4 (mod 8) is conflict-free for the first, two-way for the second. A tuned
/// kernel stages 16-bit tiles and loads them with ldmatrix instead.
template <class Tag>
KFA_MMA_FUNCTION FragA<Tag> load_a(Tag tag, const float* a, int rs, int cs, int rows, int cols,
                                   int lane) {
  constexpr int per = MmaShape<Tag>::per_register;
  FragA<Tag> f{};
  for (int j = 0; j < 4; ++j) {
    float v[2] = {0.0f, 0.0f};
    for (int e = 0; e < per; ++e)
      v[e] = detail::element(a, rs, cs, rows, cols, a_coord(tag, lane, j * per + e));
    f.x[j] = detail::to_register(tag, v);
  }
  return f;
}

/// Lane's fragment of the B block (k x n) whose element (p, j) is b[p * rs + j * cs] for
/// p < rows_k and j < cols_n and zero elsewhere, rounded to Tag. B = K^T from row-major K
/// (FlashAttention's S = Q K^T) is rs = 1, cs = ldk; B = V row-major is rs = ldv, cs = 1.
template <class Tag>
KFA_MMA_FUNCTION FragB<Tag> load_b(Tag tag, const float* b, int rs, int cs, int rows_k, int cols_n,
                                   int lane) {
  constexpr int per = MmaShape<Tag>::per_register;
  FragB<Tag> f{};
  for (int j = 0; j < 2; ++j) {
    float v[2] = {0.0f, 0.0f};
    for (int e = 0; e < per; ++e)
      v[e] = detail::element(b, rs, cs, rows_k, cols_n, b_coord(tag, lane, j * per + e));
    f.x[j] = detail::to_register(tag, v);
  }
  return f;
}

/// An accumulator of zeros.
KFA_MMA_FUNCTION FragC zero_c() {
  return FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
}

/// An accumulator with every element equal to value.
KFA_MMA_FUNCTION FragC fill_c(float value) {
  return FragC{{value, value, value, value}};
}

/// Lane's fragment of the 16 x 8 accumulator block whose element (r, c) is c[r * ldc + c] for
/// r < rows and c < cols and zero elsewhere.
KFA_MMA_FUNCTION FragC load_c(const float* c, int ldc, int rows, int cols, int lane) {
  FragC f{};
  for (int i = 0; i < 4; ++i)
    f.x[i] = detail::element(c, ldc, 1, rows, cols, c_coord(lane, i));
  return f;
}

/// Writes lane's elements of a 16 x 8 block to c[r * ldc + c], only those with r < rows and
/// c < cols. The warp's stores of one element index go to g * ldc + 2t: two-way bank
/// conflicts at best, with ldc = 4 (mod 8), as for load_a.
KFA_MMA_FUNCTION void store_c(const FragC& d, float* c, int ldc, int rows, int cols, int lane) {
  for (int i = 0; i < 4; ++i) {
    const Coord at = c_coord(lane, i);
    if (at.row < rows && at.col < cols) c[at.row * ldc + at.col] = d.x[i];
  }
}

/// The A fragment (16 x 16, rounded to Tag) of the block whose columns 0-7 are held in the
/// accumulator `left` and columns 8-15 in `right`: the C layout of two side-by-side 16 x 8
/// blocks is the 16-bit A layout, so FlashAttention's P = exp(S - m) goes from the S product
/// into the P V product in the same lane, with no shared memory and no shuffle. Not for
/// tf32, whose A layout differs from C's.
template <class Tag>
KFA_MMA_FUNCTION FragA<Tag> a_from_c(Tag tag, const FragC& left, const FragC& right) {
  static_assert(MmaShape<Tag>::per_register == 2, "a_from_c needs a 16-bit operand type");
  return FragA<Tag>{{pack2(tag, left.x[0], left.x[1]), pack2(tag, left.x[2], left.x[3]),
                     pack2(tag, right.x[0], right.x[1]), pack2(tag, right.x[2], right.x[3])}};
}

#if defined(__CUDACC__)
/// \cond kfa_internal
namespace detail {
// Reached only in a device build below sm_80, which has no bf16 or tf32 mma and no
// m16n8k16 shape: stop the kernel rather than return garbage.
__device__ inline void mma_unsupported() {
#if defined(__CUDA_ARCH__)
  __trap();
#endif
}
}  // namespace detail
/// \endcond

/// d = a b + d on the tensor cores, bfloat16 operands, float accumulation (sm_80 and newer).
/// A warp-wide instruction: all 32 lanes of the warp must call it together, converged, each
/// with its own fragments.
__device__ inline void mma(FragC& d, const FragA<bf16_tag>& a, const FragB<bf16_tag>& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
  (void)d, (void)a, (void)b;
  detail::mma_unsupported();
#endif
}

/// d = a b + d on the tensor cores, binary16 operands, float accumulation (sm_80 and newer);
/// all 32 lanes converged, as for bfloat16.
__device__ inline void mma(FragC& d, const FragA<f16_tag>& a, const FragB<f16_tag>& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
  (void)d, (void)a, (void)b;
  detail::mma_unsupported();
#endif
}

/// d = a b + d on the tensor cores, tf32 operands (m16n8k8), float accumulation (sm_80 and
/// newer); all 32 lanes converged, as for bfloat16.
__device__ inline void mma(FragC& d, const FragA<tf32_tag>& a, const FragB<tf32_tag>& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
  (void)d, (void)a, (void)b;
  detail::mma_unsupported();
#endif
}
#endif  // __CUDACC__

}  // namespace kfa::backends::cuda
