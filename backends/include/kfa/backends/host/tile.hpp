#pragma once
/// \file host/tile.hpp
/// Tile products and row operations for host execution spaces, written so the compiler
/// vectorises them: register-blocked small matrix products and a branch-free exp.
///
/// Host teams are one thread (host/traits.hpp), so these functions ignore the team and loop
/// over the whole tile. Every loop that matters has compile-time trip counts and unit stride:
///  - gemm: an MR x NR block of C lives in local arrays that the compiler keeps in vector
///    registers for the whole k loop (NR = two vector registers of Acc, MR rows), each step
///    one broadcast of A per row and two loads of B, as in a BLAS micro-kernel. Edges fall
///    back to a plain loop.
///  - row_max / row_exp_sum: lane arrays of one vector register hold partial maxima and sums,
///    so no floating-point reassociation (-ffast-math) is needed to vectorise the reductions.
///  - exp: glibc's vector exp is only used under -ffast-math, which would also break the -inf
///    handling of masks; exp_float and exp_double below are Cephes' approximations (about
///    1 ulp) in a form the compiler vectorises.
/// Build with -march=native (the KFA_NATIVE option) to let the compiler use AVX2/AVX-512.

#include <kfa/backends/generic/tile.hpp>
#include <kfa/backends/host/amx.hpp>
#include <kfa/backends/host/traits.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__AVX__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#include <immintrin.h>
/// Set while this header uses AVX intrinsics (undefined at its end).
#define KFA_HOST_AVX 1
#if defined(__AVX512F__)
/// Set while this header uses AVX-512 intrinsics (undefined at its end).
#define KFA_HOST_AVX512 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
/// Set while this header uses AVX2 and FMA intrinsics (undefined at its end): the softmax's
/// exponential and dropout's generator and weights on 8 lanes where AVX-512 is absent.
#define KFA_HOST_AVX2 1
#endif
#endif

namespace kfa::backends::host {

#ifdef KFA_HOST_AVX512_BF16
/// FLOP/s of VDPBF16PS over FMA on this core (zmm, 12 independent chains each; after an
/// untimed warm-up of both, rounds alternate and the fastest of five counts): about 2 where
/// both issue every cycle and a VDPBF16PS does two products a lane (the AVX-512 EPYC of the
/// earlier pages ran bf16 1.3-2.1x float), 0.5 on the Intel Xeon of
/// perf/results/2026-11-26-bf16-path-probe.md (117 against 233 GFLOP/s).
inline double dpbf16_over_fma() {
  constexpr int steps = 4096;  // 49152 instructions a run: tens of microseconds
  volatile float sink = 0.0f;
  volatile float one = 1.0f, tiny = 0x1p-20f;  // opaque operands: nothing folds
  const float a_value = one, b_value = tiny;
  const auto run_fma = [&] {
    __m512 c[12];
    const __m512 a = _mm512_set1_ps(a_value), b = _mm512_set1_ps(b_value);
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i)
      c[i] = _mm512_set1_ps(float(i));
    for (int n = 0; n < steps; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i)
        c[i] = _mm512_fmadd_ps(a, b, c[i]);
    }
    __m512 t = c[0];
#pragma GCC unroll 11
    for (int i = 1; i < 12; ++i)
      t = _mm512_add_ps(t, c[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, t);
    sink = sink + lanes[0];
  };
  const auto run_dp = [&] {
    __m512 c[12];
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a_value), _mm512_set1_ps(a_value));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b_value), _mm512_set1_ps(b_value));
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i)
      c[i] = _mm512_set1_ps(float(i));
    for (int n = 0; n < steps; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i)
        c[i] = _mm512_dpbf16_ps(c[i], a, b);
    }
    __m512 t = c[0];
#pragma GCC unroll 11
    for (int i = 1; i < 12; ++i)
      t = _mm512_add_ps(t, c[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, t);
    sink = sink + lanes[0];
  };
  const auto seconds = [](auto&& body) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  run_fma();  // warm-up: 512-bit units and clocks settle before anything is timed
  run_dp();
  double fma = 1e30, dp = 1e30;
  for (int round = 0; round < 5; ++round) {
    const double f = seconds(run_fma), d = seconds(run_dp);
    fma = f < fma ? f : fma;
    dp = d < dp ? d : dp;
  }
  // Per instruction FMA does 16 products, VDPBF16PS 32.
  return (32.0 / dp) / (16.0 / fma);
}

/// Whether the bfloat16 forward multiplies its inputs in pairs (TileTraits::bf16x2_products,
/// on AMX tiles or VDPBF16PS) rather than widening them to float tiles for the FMA products:
/// where the AMX tiles are available (amx.hpp), or where VDPBF16PS runs at least as many FLOPs
/// as FMA (dpbf16_over_fma >= 1; on a Xeon without the tiles in use it ran at half, and the
/// bf16 forward at 0.62x the float one). Decided once per process, the same for every call
/// after; KFA_HOST_BF16_PAIRS=1 or 0 in the environment forces it (the tests run both paths
/// so), any other value leaves it to the CPU. The paths round differently (P to bfloat16, or
/// not; the tiles and VDPBF16PS sum the pairs in their own orders), so results are bitwise
/// repeatable for a given choice: pin it with the variables (and KFA_HOST_AMX) where runs on
/// other machines must match.
inline bool bf16x2_pays() {
  static const bool pays = [] {
    const char* force = std::getenv("KFA_HOST_BF16_PAIRS");
    if (force && std::strcmp(force, "1") == 0) return true;
    if (force && std::strcmp(force, "0") == 0) return false;
#ifdef KFA_HOST_AMX
    if (amx::available()) return true;  // 13-15x FMA's FLOPs (amx_peak): no probe needed
#endif
    return dpbf16_over_fma() >= 1.0;
  }();
  return pays;
}
#endif

/// Bytes of the widest vector register the compiler may use for this translation unit.
constexpr int widest_vector_bytes() {
#if defined(__AVX512F__)
  return 64;
#elif defined(__AVX__)
  return 32;
#else
  return 16;
#endif
}
/// widest_vector_bytes(), as a constant.
inline constexpr int vector_bytes = widest_vector_bytes();

/// Lanes of Acc in one vector register.
template <class Acc>
inline constexpr int lanes = vector_bytes / static_cast<int>(sizeof(Acc));

/// Micro-kernel shapes, MR rows by NR columns, for the column blocks gemm cuts C into: blocks
/// of four vector registers first, then two, then one. With 32 registers (AVX-512): 6 x 4
/// accumulators (6 broadcasts and 4 loads feed 24 FMAs per step; 8 x 2 measured 0.91 of the
/// FMA peak on 64 x 64 x 64 products, libxsmm's 6 x 4 0.98), then 8 x 2 and 8 x 1. With 16
/// (AVX2, SSE): 6 x 2, the shape of the AVX2 BLAS kernels (12 accumulators, 2 loads and a
/// broadcast: 15 registers), then 8 x 1 (no four-register block). With the register pin in
/// micro_kernel it took 64 x 64 tile products on a Zen 3 from 38-56 to 62-86 GFLOP/s, where
/// 4 x 2 had 8 accumulators (perf/results/2026-11-28-host-avx2.md).
inline constexpr bool wide_blocks = vector_bytes == 64;
/// Rows of the micro-kernel of a column block `regs` vector registers wide (see wide_blocks).
KOKKOS_INLINE_FUNCTION constexpr int micro_rows(int regs) {
  return wide_blocks ? (regs == 4 ? 6 : 8) : (regs == 2 ? 6 : 8);
}

// GCC and Clang on the host: the micro-kernel in their vector extension, so that the
// accumulators are vector registers by construction. From plain loops GCC 12 picks the
// direction of vectorisation itself and for double (8 lanes, 8 rows) vectorised along the
// rows, spilling every accumulator: 6x slower. Device compilers and others use the loops.
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) && \
    !defined(__SYCL_DEVICE_ONLY__)
/// Set while this header uses GCC/Clang vector extensions (undefined at its end).
#define KFA_HOST_VECTOR_EXTENSION 1
/// One vector register of Acc; loaded and stored with memcpy (tiles are not vector-aligned).
template <class Acc>
using vec_t [[gnu::vector_size(vector_bytes)]] = Acc;
#endif

/// exp(x) for float, vectorisable: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes'
/// degree-6 polynomial, 2^n built in the exponent bits. Returns 0 below -87 (exp(-87) is
/// 1.6e-38, near the smallest normal float) and for -inf, saturates at exp(88) above 88
/// (softmax's arguments are <= 0 up to rounding), and keeps NaN.
KOKKOS_INLINE_FUNCTION float exp_float(float x) {
  const float lo = -87.0f, hi = 88.0f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // Round x / ln2 to the nearest integer: adding 1.5 * 2^23 leaves the integer in the low
  // mantissa bits, read from there as an integer (no float-to-int conversion, so a NaN x
  // stays defined behaviour whatever the math flags; it gives NaN through p).
  const float shifter = 12582912.0f;
  const float t = xc * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  std::int32_t t_bits;
  std::memcpy(&t_bits, &t, sizeof t_bits);
  const std::int32_t ni = t_bits - 0x4B400000;  // the bits of the shifter
  float r = xc - n * 0.693359375f;              // ln2 in two parts: the first is exact in n * it
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::int32_t bits = static_cast<std::int32_t>(static_cast<std::uint32_t>(ni + 127) << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? 0.0f : p * scale;
}

/// exp(x) for double, vectorisable: the same reduction with ln2 in two parts, exp(r) by
/// Cephes' rational approximation 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2)) (about 1 ulp). Returns 0
/// below -708 (near the smallest normal double) and for -inf, saturates at exp(709) above 709,
/// keeps NaN.
KOKKOS_INLINE_FUNCTION double exp_double(double x) {
  const double lo = -708.0, hi = 709.0;
  double xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const double shifter = 6755399441055744.0;  // 1.5 * 2^52, as in exp_float
  const double t = xc * 1.4426950408889634074 + shifter;
  const double n = t - shifter;
  std::int64_t t_bits;
  std::memcpy(&t_bits, &t, sizeof t_bits);
  const std::int64_t ni = t_bits - 0x4338000000000000LL;
  double r = xc - n * 6.93145751953125e-1;
  r = r - n * 1.42860682030941723212e-6;
  const double rr = r * r;
  const double px = r * ((1.26177193074810590878e-4 * rr + 3.02994407707441961300e-2) * rr +
                         9.99999999999999999910e-1);
  const double qx = ((3.00198505138664455042e-6 * rr + 2.52448340349684104192e-3) * rr +
                     2.27265548208155028766e-1) *
                        rr +
                    2.00000000000000000009e0;
  const double e = 1.0 + 2.0 * (px / (qx - px));
  const std::int64_t bits = static_cast<std::int64_t>(static_cast<std::uint64_t>(ni + 1023) << 52);
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? 0.0 : e * scale;
}

/// exp for the accumulation type: glibc's scalar exp costs more than the tile products
/// around it, so both float and double use the vectorisable versions.
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc exp(Acc x) {
  if constexpr (std::is_same_v<Acc, float>)
    return exp_float(x);
  else
    return exp_double(x);
}

#ifdef KFA_HOST_AVX512
/// vmaxps (NaN or equal operands: the second). Through the masked form with a full mask: GCC
/// 12's _mm512_max_ps passes _mm512_undefined_ps(), which it then reports as maybe
/// uninitialised wherever it is inlined.
inline __m512 max16(__m512 a, __m512 b) {
  return _mm512_mask_max_ps(b, static_cast<__mmask16>(0xFFFF), a, b);
}

/// 2^y on 16 lanes for the softmax's column loop, which passes y = (x - m) log2(e): f =
/// y - floor(y) in [0, 1] (vreduceps; exact for y <= -1, rounded as 1 + y is between -1 and
/// 0), 2^f by a degree-6 polynomial (about 1e-8 relative with its coefficients in float),
/// and vscalefps multiplies by 2^floor(y) itself: 11 instructions where exp_float's steps on
/// 16 lanes took 17 (clamps, ln2 in two parts, the rounding trick); at most 1.24 ulp from
/// exp2 measured on a 1.7e-4 grid of [-126, 2]. 0 below 2^-126 (no subnormal P), at -inf and
/// in the lanes `lanes` leaves out (no overflow raised for a hidden score far above the
/// maximum); NaN kept.
inline __m512 exp2_16(__m512 y, __mmask16 lanes = 0xFFFF) {
  // Round down (01), precision exception off (8). vreduceps is AVX-512 DQ; with F alone the
  // same f from vrndscaleps and a subtraction.
#ifdef __AVX512DQ__
  const __m512 f = _mm512_reduce_ps(y, 0x09);
#else
  const __m512 f = _mm512_sub_ps(y, _mm512_roundscale_ps(y, 0x09));
#endif
  __m512 p = _mm512_set1_ps(2.1612952696e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.2467834167e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6754534170e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5485278368e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022930861e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314706326e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  // NaN compares unordered and is kept; -inf and y < -126 give 0.
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(lanes, y, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, y);
}
#endif

#ifdef KFA_HOST_AVX2
/// exp2_16 on the 8 lanes of AVX2 (the softmax's column loop where AVX-512 is absent): f =
/// y - floor(y) rounded to nearest (exp2_16 without AVX-512 DQ does the same; vreduceps rounds
/// it down, which moves f by an ulp for y in (-0.5, 0)), the same polynomial, and 2^floor(y)
/// built in the exponent bits: floor(y) + 2^23 + 127 in float holds floor(y) + 127 in its low
/// mantissa bits, which one shift moves into the exponent field. y is clamped to [-127, 127]
/// first: at -127 the field is 0, so 0 below 2^-126 and at -inf; above 127 y is taken as 127
/// (finite, as exp_float saturates). NaN passes both clamps (vmaxps and vminps give their
/// second operand, y, where one is NaN) and stays NaN. Within 2 ulp of exp2 like exp2_16.
/// 13 instructions where a conversion to integers and a range compare made 16, with the same
/// results (perf/results/2026-11-29-softmax-exp2.md).
inline __m256 exp2_8(__m256 y) {
  y = _mm256_max_ps(_mm256_set1_ps(-127.0f), y);
  y = _mm256_min_ps(_mm256_set1_ps(127.0f), y);
  const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(y, n);
  __m256 p = _mm256_set1_ps(2.1612952696e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.2467834167e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6754534170e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5485278368e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022930861e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314706326e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  // In [2^23, 2^24), where floats are the integers: the sum is exact.
  const __m256 biased = _mm256_add_ps(n, _mm256_set1_ps(8388608.0f + 127.0f));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(biased), 23)));
}

/// exp2_8 with the lanes whose bits are clear in `lanes` set to 0 (each lane all ones or all
/// zeros): a hidden score far above the maximum, or a lane past the row's end, raises nothing.
inline __m256 exp2_8(__m256 y, __m256 lanes) {
  return _mm256_and_ps(lanes, exp2_8(y));
}

/// The lanes [0, count) of 8 set to all ones, for masked loads and exp2_8.
inline __m256i first_lanes8(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

#ifdef KFA_HOST_AVX512_BF16
/// The pair words of 16 columns of two rows: lane c packs lo[c] (low half) and hi[c], each
/// rounded by VCVTNE2PS2BF16 (ties to even, as bf16_round; denormals flush to 0). The
/// conversion gives lo's words in 0..15 and hi's in 16..31; one word permute interleaves them.
inline __m512i bf16x2_round(__m512 lo, __m512 hi) {
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/// One MR x 16 V block of the pair products (TileOps::gemm_bf16x2) on VDPBF16PS: each step
/// broadcasts a pair word of A per row and loads V vectors of pair words of B; each
/// instruction does 16 x 2 products with float accumulation. Offsets are in 4-byte words.
/// With ColMax, col_max[j] also becomes the maximum of itself and the block's column j of C,
/// as micro_kernel's.
template <int MR, int V, bool ColMax = false>
inline void bf16x2_kernel(int k2, const unsigned char* a, int a_rs, int a_cs,
                          const unsigned char* b, int ldb, float* c, int ldc, float scale,
                          bool accumulate, float* col_max = nullptr) {
  // Every loop over the block unrolled in full, as in micro_kernel (else GCC 12 keeps acc on
  // the stack around the k2 loop).
  __m512 acc[MR][V];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[i][v] = _mm512_setzero_ps();
  for (int p = 0; p < k2; ++p) {
    __m512bh bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = (__m512bh)_mm512_loadu_si512(
          b + 4 * (static_cast<std::ptrdiff_t>(p) * ldb + static_cast<std::ptrdiff_t>(16) * v));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const std::uint32_t w = bf16x2_load(
          a, static_cast<std::ptrdiff_t>(i) * a_rs + static_cast<std::ptrdiff_t>(p) * a_cs);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc + static_cast<std::ptrdiff_t>(16) * v;
      __m512 out = _mm512_mul_ps(sc, acc[i][v]);
      if (accumulate) out = _mm512_add_ps(out, _mm512_loadu_ps(ci));
      _mm512_storeu_ps(ci, out);
      acc[i][v] = out;
    }
  if constexpr (ColMax) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      __m512 top = _mm512_loadu_ps(col_max + static_cast<std::ptrdiff_t>(16) * v);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        top = max16(acc[i][v], top);  // a NaN element is skipped
      _mm512_storeu_ps(col_max + static_cast<std::ptrdiff_t>(16) * v, top);
    }
  }
}
#endif

/// An m x n block of C (+)= A B by plain loops: the edges the micro-kernel blocks leave, and
/// whole blocks where the vector extension is not available.
template <class Acc>
KOKKOS_INLINE_FUNCTION void edge_kernel(int m, int n, int k, const Acc* a, int a_rs, int a_cs,
                                        const Acc* b, int ldb, Acc* c, int ldc, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    Acc* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
    if (!accumulate)
      for (int j = 0; j < n; ++j)
        ci[j] = Acc(0);
    for (int p = 0; p < k; ++p) {
      const Acc ai =
          a[static_cast<std::ptrdiff_t>(i) * a_rs + static_cast<std::ptrdiff_t>(p) * a_cs];
      const Acc* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
      for (int j = 0; j < n; ++j)
        ci[j] += ai * bp[j];
    }
  }
}

/// col_max[j] = the maximum of itself and column j of the m x n block c (x > top ? x : top: a
/// NaN x is skipped).
template <class Acc>
KOKKOS_INLINE_FUNCTION void col_max_of(int m, int n, const Acc* c, int ldc, Acc* col_max) {
  for (int i = 0; i < m; ++i) {
    const Acc* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
    for (int j = 0; j < n; ++j)
      col_max[j] = ci[j] > col_max[j] ? ci[j] : col_max[j];
  }
}

/// One MR x NR block of C (+)= A B; see TileOps::gemm for the operands. With ColMax,
/// col_max[j] also becomes the maximum of itself and the block's column j of C (TileOps::
/// gemm_col_max), taken from the registers.
template <int MR, int NR, class Acc, bool ColMax = false>
KOKKOS_INLINE_FUNCTION void micro_kernel(int k, const Acc* a, int a_rs, int a_cs, const Acc* b,
                                         int ldb, Acc* c, int ldc, bool accumulate,
                                         Acc* col_max = nullptr) {
#ifdef KFA_HOST_VECTOR_EXTENSION
  using vec = vec_t<Acc>;
  constexpr int L = lanes<Acc>, V = NR / L;
  // Every loop over the block unrolled in full: GCC 12 otherwise kept acc as an array on the
  // stack around the k loop (24 zeroing stores before it, 24 spills and reloads after; about a
  // tenth of a call's instructions at depth 64, counted in the disassembly).
  vec acc[MR][V];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[i][v] = vec{};
  for (int p = 0; p < k; ++p) {
    const Acc* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
    const Acc* ap = a + static_cast<std::ptrdiff_t>(p) * a_cs;
    vec bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      vec t;
      std::memcpy(&t, bp + v * L, sizeof(vec));  // an unaligned vector load
#ifdef KFA_HOST_AVX
      // With 16 registers GCC 12 folds the load into every FMA that uses it (MR loads of B
      // per step instead of V, plus the broadcasts: the load ports, not the FMA pipes, set
      // the pace). An empty asm that takes the vector in a register keeps it there.
      if constexpr (!wide_blocks) asm("" : "+x"(t));
#endif
      // Loaded and pinned in a temporary, not in bv[v]: with the memcpy and the asm on bv[v],
      // GCC 12 kept bv in memory in some translation units (two stores to the stack every
      // step, the forward 1.6x slower in perf/bench_forward than in perf/bench_attention;
      // perf/results/2026-11-29-host-query-tile.md). (A may_alias vector type for the load
      // would do too, but Clang ignores alignment attributes on alias templates and loads it
      // aligned.)
      bv[v] = t;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const Acc ai = ap[static_cast<std::ptrdiff_t>(i) * a_rs];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[i][v] += ai * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    Acc* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      vec out = acc[i][v];
      if (accumulate) {
        vec prev;
        std::memcpy(&prev, ci + v * L, sizeof(vec));
        out += prev;
      }
      std::memcpy(ci + v * L, &out, sizeof(vec));
      acc[i][v] = out;  // C itself, for ColMax (a dead store without it)
    }
  }
  if constexpr (ColMax) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      vec top;
      std::memcpy(&top, col_max + v * L, sizeof(vec));
      // x > top ? x : top, lane by lane: a NaN x is skipped, as in col_softmax's maxima.
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        top = acc[i][v] > top ? acc[i][v] : top;
      std::memcpy(col_max + v * L, &top, sizeof(vec));
    }
  }
#else
  // Without the vector extension: the plain loops of the edges, for a full block.
  edge_kernel(MR, NR, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
  if constexpr (ColMax) col_max_of(MR, NR, c, ldc, col_max);
#endif
}

#ifdef KFA_HOST_AVX
/// Transposes the 8 x 8 float block whose rows are x[0..7] in place (unpacks, shuffles and
/// lane permutes: 24 register operations for 64 elements).
inline void transpose8(__m256 (&x)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    const int a = 4 * i;
    u[a] = _mm256_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    x[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

#ifdef KFA_HOST_AVX512
/// Transposes the 16 x 16 matrix of 32-bit words whose rows are x[0..15] in place: pairs of
/// words, then of quadwords, unpacked within 128-bit lanes, then two rounds of lane shuffles
/// (64 register operations for 256 words).
inline void transpose16(__m512i (&x)[16]) {
  // The masked forms with full masks: the plain ones pass GCC 12 an undefined operand that it
  // then reports as maybe uninitialised (as max16's).
  const __mmask16 all16 = 0xFFFF;
  const __mmask8 all8 = 0xFF;
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // t[i], t[i + 1]: rows i, i + 1 in word pairs
    t[i] = _mm512_maskz_unpacklo_epi32(all16, x[i], x[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(all16, x[i], x[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // x[g + e]: rows g..g+3 of column e of each lane
    x[g] = _mm512_maskz_unpacklo_epi64(all8, t[g], t[g + 2]);
    x[g + 1] = _mm512_maskz_unpackhi_epi64(all8, t[g], t[g + 2]);
    x[g + 2] = _mm512_maskz_unpacklo_epi64(all8, t[g + 1], t[g + 3]);
    x[g + 3] = _mm512_maskz_unpackhi_epi64(all8, t[g + 1], t[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // lanes 0 and 2, then 1 and 3, of rows 0-7 and 8-15
    const __m512i v0 = _mm512_maskz_shuffle_i32x4(all16, x[e], x[4 + e], 0x88);
    const __m512i v1 = _mm512_maskz_shuffle_i32x4(all16, x[e], x[4 + e], 0xdd);
    const __m512i v2 = _mm512_maskz_shuffle_i32x4(all16, x[8 + e], x[12 + e], 0x88);
    const __m512i v3 = _mm512_maskz_shuffle_i32x4(all16, x[8 + e], x[12 + e], 0xdd);
    t[e] = _mm512_maskz_shuffle_i32x4(all16, v0, v2, 0x88);       // column e: lane 0 of each
    t[8 + e] = _mm512_maskz_shuffle_i32x4(all16, v0, v2, 0xdd);   // column 8 + e: lane 2
    t[4 + e] = _mm512_maskz_shuffle_i32x4(all16, v1, v3, 0x88);   // column 4 + e: lane 1
    t[12 + e] = _mm512_maskz_shuffle_i32x4(all16, v1, v3, 0xdd);  // column 12 + e: lane 3
  }
  for (int i = 0; i < 16; ++i)
    x[i] = t[i];
}
#endif

/// f(rows, i0) for the row blocks of a column block m rows tall: blocks of MR rows, then one
/// of the m % MR rows left; `rows` is a std::integral_constant, so that f can instantiate the
/// micro-kernel of exactly that many rows.
template <int MR, class F>
KOKKOS_INLINE_FUNCTION void for_row_blocks(int m, const F& f) {
  int i0 = 0;
  for (; i0 + MR <= m; i0 += MR)
    f(std::integral_constant<int, MR>{}, i0);
  if constexpr (MR > 1) {
    const int r = m - i0;
    if (r == MR - 1)
      f(std::integral_constant<int, MR - 1>{}, i0);
    else if (r > 0)
      for_row_blocks<MR - 1>(r, [&](auto rows, int i) { f(rows, i0 + i); });
  }
}

/// take(tops[u], j) for the rows j of [j0, j1) in four chains, row j0 + 4 q + u to chain u (the
/// last j1 - j0 mod 4 rows to chain 0): col_softmax's maxima down its columns, where one chain
/// waits for each maximum's latency.
template <class Vec, class Take>
inline void four_chains(int j0, int j1, Vec (&tops)[4], const Take& take) {
  int j = j0;
  for (; j + 4 <= j1; j += 4)
    for (int u = 0; u < 4; ++u)
      take(tops[u], j + u);
  for (; j < j1; ++j)
    take(tops[0], j);
}

/// f(regs, j0) for the column blocks of a tile n columns wide: blocks of four vector registers
/// of Acc (AVX-512 only, see wide_blocks), then two, then one; `regs` is a
/// std::integral_constant. Returns the first column no block covers.
template <class Acc, class F>
KOKKOS_INLINE_FUNCTION int for_column_blocks(int n, const F& f) {
  constexpr int L = lanes<Acc>;
  int j0 = 0;
  if constexpr (wide_blocks)
    for (; j0 + 4 * L <= n; j0 += 4 * L)
      f(std::integral_constant<int, 4>{}, j0);
  for (; j0 + 2 * L <= n; j0 += 2 * L)
    f(std::integral_constant<int, 2>{}, j0);
  if (j0 + L <= n) {
    f(std::integral_constant<int, 1>{}, j0);
    j0 += L;
  }
  return j0;
}

}  // namespace kfa::backends::host

namespace kfa::backends {

/// Host tile operations: the whole tile on the team's one thread, vectorised by the compiler.
/// Tiles hold accum_t<T> whatever the value type T (narrow types were converted on load).
template <class ExecSpace, class T>
struct TileOps<
    ExecSpace, T,
    std::enable_if_t<Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible>> {
  using Acc = accum_t<T>;  ///< the element type of the tiles
  // Every function here does the whole tile on the calling thread: right only for teams of
  // one thread, which the host traits choose.
  static_assert(TileTraits<ExecSpace, T>::team_size == 1,
                "host TileOps assume one-thread teams (host/traits.hpp)");

  /// Rows of A per gemm call that fill whole micro-kernel blocks at the widths attention uses
  /// (two blocks of 6 rows: host::micro_rows for Dv of 64 and more): the forward splits P V
  /// into groups of this many query rows on tiles a mask's edge crosses, each to the keys its
  /// rows see.
  static constexpr int gemm_row_group = 12;

  /// Query columns per S^T = K_j Q_i^T product on tiles a mask's edge crosses: one vector of
  /// Acc, gemm's narrowest column block. The forward computes each key row of such a tile
  /// only for the groups of this many query columns that have a row seeing it.
  static constexpr int gemm_column_group = host::lanes<Acc>;

  /// Whether gemm_bf16x2's pair products outrun the float ones on this CPU (host::bf16x2_pays;
  /// false where the build has no AVX-512 BF16).
  static bool bf16x2_pays() {
#ifdef KFA_HOST_AVX512_BF16
    return host::bf16x2_pays();
#else
    return false;
#endif
  }

  /// Whether gemm_bf16x2 runs on AMX tiles in a PairScope (host/amx.hpp): then it wants A with
  /// unit column stride (the tiles load rows), and callers lay A out so
  /// (pack_bf16x2_columns).
  static bool bf16x2_tiles() {
#ifdef KFA_HOST_AMX
    return host::amx::available();
#else
    return false;
#endif
  }

#ifdef KFA_HOST_AMX
  /// Opened around a run of gemm_bf16x2 calls on one thread (a query tile's sweep): configures
  /// the AMX tiles when constructed with true and they are available, releases them at its end.
  using PairScope = host::amx::Scope;
#else
  using PairScope = typename PortableTileOps<float>::PairScope;  ///< nothing to configure
#endif

  /// PortableTileOps::philox16: with AVX-512 the 16 blocks in the lanes of four registers, a
  /// round's two 32 x 32 -> 64-bit products as VPMULUDQ on the even and the odd lanes; with
  /// AVX2 the same in two halves of 8.
  static void philox16(std::uint32_t (&w)[4][16], std::uint32_t k0, std::uint32_t k1) {
#ifdef KFA_HOST_AVX512
    const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
    // hi and lo words of x * m in each 32-bit lane. The zero-masking forms with a full mask:
    // GCC 12's plain ones pass _mm512_undefined_epi32(), reported as maybe uninitialised (as
    // in host::max16).
    const auto mul = [](__m512i x, __m512i m, __m512i& lo) {
      constexpr __mmask8 all = 0xFF;
      const __m512i even = _mm512_maskz_mul_epu32(all, x, m);
      const __m512i odd = _mm512_maskz_mul_epu32(all, _mm512_maskz_srli_epi64(all, x, 32), m);
      lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_maskz_slli_epi64(all, odd, 32));
      return _mm512_mask_blend_epi32(0xAAAA, _mm512_maskz_srli_epi64(all, even, 32), odd);
    };
    __m512i c0 = _mm512_loadu_si512(w[0]), c1 = _mm512_loadu_si512(w[1]);
    __m512i c2 = _mm512_loadu_si512(w[2]), c3 = _mm512_loadu_si512(w[3]);
    for (int round = 0; round < 10; ++round) {
      __m512i lo0, lo1;
      const __m512i hi0 = mul(c0, m0, lo0), hi1 = mul(c2, m1, lo1);
      // 0x96: a ^ b ^ c
      c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32(static_cast<int>(k0)), 0x96);
      c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32(static_cast<int>(k1)), 0x96);
      c1 = lo1;
      c3 = lo0;
      k0 += 0x9E3779B9u;  // the key schedule of philox4x32_10
      k1 += 0xBB67AE85u;
    }
    _mm512_storeu_si512(w[0], c0);
    _mm512_storeu_si512(w[1], c1);
    _mm512_storeu_si512(w[2], c2);
    _mm512_storeu_si512(w[3], c3);
#elif defined(KFA_HOST_AVX2)
    // The same rounds on AVX2: the 16 blocks as two halves of 8 lanes, VPMULUDQ likewise.
    const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
    const auto mul = [](__m256i x, __m256i m, __m256i& lo) {
      const __m256i even = _mm256_mul_epu32(x, m);
      const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
      lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
      return _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    };
    const auto load = [&](int e, std::ptrdiff_t h) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[e] + 8 * h));
    };
    for (std::ptrdiff_t h = 0; h < 2; ++h) {
      std::uint32_t a = k0, b = k1;
      __m256i c0 = load(0, h), c1 = load(1, h), c2 = load(2, h), c3 = load(3, h);
      for (int round = 0; round < 10; ++round) {
        __m256i lo0, lo1;
        const __m256i hi0 = mul(c0, m0, lo0), hi1 = mul(c2, m1, lo1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(a)));
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(b)));
        c1 = lo1;
        c3 = lo0;
        a += 0x9E3779B9u;  // the key schedule of philox4x32_10
        b += 0xBB67AE85u;
      }
      const __m256i out[4] = {c0, c1, c2, c3};
      for (int e = 0; e < 4; ++e)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[e] + 8 * h), out[e]);
    }
#else
    philox4x32_10_x16(w, k0, k1);
#endif
  }

  /// PortableTileOps::weigh16: float with AVX-512 (or AVX2, in halves) as one multiply by the
  /// weights an unsigned compare picks, without a branch per element (which mispredicted the
  /// dropped ones).
  static void weigh16(Acc* x, int n, const std::uint32_t (&w)[16], std::uint32_t threshold,
                      Acc scale) {
#ifdef KFA_HOST_AVX512
    if constexpr (std::is_same_v<Acc, float>) {
      const __mmask16 lanes = n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1U << n) - 1U);
      const __mmask16 kept = _mm512_mask_cmpge_epu32_mask(
          lanes, _mm512_loadu_si512(w), _mm512_set1_epi32(static_cast<int>(threshold)));
      // x times 0 in the dropped lanes (NaN stays NaN, as in the loop); lanes past n are not
      // stored.
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, x),
                                     _mm512_maskz_mov_ps(kept, _mm512_set1_ps(scale)));
      _mm512_mask_storeu_ps(x, lanes, v);
      return;
    }
#elif defined(KFA_HOST_AVX2)
    if constexpr (std::is_same_v<Acc, float>) {
      // Two halves of 8; unsigned w >= threshold as max(w, threshold) == w.
      const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold));
      const __m256 s = _mm256_set1_ps(scale);
      for (std::ptrdiff_t h = 0; h < 2 && 8 * h < n; ++h) {
        const __m256i wh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * h));
        const __m256 kept = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(wh, t), wh));
        float* xh = x + 8 * h;
        const int left = n - 8 * static_cast<int>(h);
        if (left >= 8) {  // plain loads and stores (masked stores are slow on Zen)
          _mm256_storeu_ps(xh, _mm256_mul_ps(_mm256_loadu_ps(xh), _mm256_and_ps(kept, s)));
        } else {
          const __m256i lanes = host::first_lanes8(left);
          _mm256_maskstore_ps(xh, lanes,
                              _mm256_mul_ps(_mm256_maskload_ps(xh, lanes), _mm256_and_ps(kept, s)));
        }
      }
      return;
    }
#endif
    PortableTileOps<Acc>::weigh16(x, n, w, threshold, scale);
  }

  /// PortableTileOps::weights64: float with AVX-512 (or AVX2, in halves) as four masked moves
  /// and a transpose of the four word vectors in registers (a scalar loop over the 64 keys held 23
  /// % of a backward with dropout's samples, 2026-11-27-host-backward.md).
  static void weights64(const std::uint32_t (&w)[4][16], std::uint32_t threshold, Acc scale,
                        Acc (&z)[64]) {
#ifdef KFA_HOST_AVX512
    if constexpr (std::is_same_v<Acc, float>) {
      const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
      const __m512 s = _mm512_set1_ps(scale);
      __m512 v[4];  // v[e][l]: the weight of key 4 l + e
      for (int e = 0; e < 4; ++e)
        v[e] = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(_mm512_loadu_si512(w[e]), t), s);
      // 4 x 4 transposes within each 128-bit lane: aX holds in lane k the keys of l = 4k + X.
      // Zero-masking forms with full masks, as in philox16 (GCC 12's plain shuffles and
      // unpacks pass an undefined vector it then warns about).
      constexpr __mmask16 all = 0xFFFF;
      constexpr __mmask8 all8 = 0xFF;
      const __m512 lo01 = _mm512_maskz_unpacklo_ps(all, v[0], v[1]);
      const __m512 hi01 = _mm512_maskz_unpackhi_ps(all, v[0], v[1]);
      const __m512 lo23 = _mm512_maskz_unpacklo_ps(all, v[2], v[3]);
      const __m512 hi23 = _mm512_maskz_unpackhi_ps(all, v[2], v[3]);
      const auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
      const auto ps = [](__m512d x) { return _mm512_castpd_ps(x); };
      const __m512 a0 = ps(_mm512_maskz_unpacklo_pd(all8, pd(lo01), pd(lo23)));
      const __m512 a1 = ps(_mm512_maskz_unpackhi_pd(all8, pd(lo01), pd(lo23)));
      const __m512 a2 = ps(_mm512_maskz_unpacklo_pd(all8, pd(hi01), pd(hi23)));
      const __m512 a3 = ps(_mm512_maskz_unpackhi_pd(all8, pd(hi01), pd(hi23)));
      // Then the 4 x 4 transpose of the 128-bit lanes: output k holds l = 4k .. 4k + 3.
      const __m512 b0 = _mm512_maskz_shuffle_f32x4(all, a0, a1, 0x44);
      const __m512 b1 = _mm512_maskz_shuffle_f32x4(all, a2, a3, 0x44);
      const __m512 b2 = _mm512_maskz_shuffle_f32x4(all, a0, a1, 0xEE);
      const __m512 b3 = _mm512_maskz_shuffle_f32x4(all, a2, a3, 0xEE);
      _mm512_storeu_ps(z + 0, _mm512_maskz_shuffle_f32x4(all, b0, b1, 0x88));
      _mm512_storeu_ps(z + 16, _mm512_maskz_shuffle_f32x4(all, b0, b1, 0xDD));
      _mm512_storeu_ps(z + 32, _mm512_maskz_shuffle_f32x4(all, b2, b3, 0x88));
      _mm512_storeu_ps(z + 48, _mm512_maskz_shuffle_f32x4(all, b2, b3, 0xDD));
      return;
    }
#elif defined(KFA_HOST_AVX2)
    if constexpr (std::is_same_v<Acc, float>) {
      // Per half h (l = 8h .. 8h + 7): the weights of the four words, then the 4 x 8 transpose
      // that puts key 4 l + e at z[32 h + 4 (l - 8h) + e].
      const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold));
      const __m256 s = _mm256_set1_ps(scale);
      for (std::ptrdiff_t h = 0; h < 2; ++h) {
        __m256 v[4];
        for (int e = 0; e < 4; ++e) {
          const __m256i we = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[e] + 8 * h));
          v[e] = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(we, t), we)),
                               s);
        }
        const __m256 lo01 = _mm256_unpacklo_ps(v[0], v[1]), hi01 = _mm256_unpackhi_ps(v[0], v[1]);
        const __m256 lo23 = _mm256_unpacklo_ps(v[2], v[3]), hi23 = _mm256_unpackhi_ps(v[2], v[3]);
        const auto pd = [](__m256 x) { return _mm256_castps_pd(x); };
        const auto ps = [](__m256d x) { return _mm256_castpd_ps(x); };
        // aX: keys of l = X (low 128 bits) and l = X + 4 (high), relative to 8h.
        const __m256 a0 = ps(_mm256_unpacklo_pd(pd(lo01), pd(lo23)));
        const __m256 a1 = ps(_mm256_unpackhi_pd(pd(lo01), pd(lo23)));
        const __m256 a2 = ps(_mm256_unpacklo_pd(pd(hi01), pd(hi23)));
        const __m256 a3 = ps(_mm256_unpackhi_pd(pd(hi01), pd(hi23)));
        float* zh = z + 32 * h;
        _mm256_storeu_ps(zh + 0, _mm256_permute2f128_ps(a0, a1, 0x20));
        _mm256_storeu_ps(zh + 8, _mm256_permute2f128_ps(a2, a3, 0x20));
        _mm256_storeu_ps(zh + 16, _mm256_permute2f128_ps(a0, a1, 0x31));
        _mm256_storeu_ps(zh + 24, _mm256_permute2f128_ps(a2, a3, 0x31));
      }
      return;
    }
#endif
    PortableTileOps<Acc>::weights64(w, threshold, scale, z);
  }

  /// f(r, c) over a rows x cols tile as two loops: no division per element, and unit-stride
  /// inner loops the compiler vectorises where f allows.
  template <class Member, class F>
  static KOKKOS_INLINE_FUNCTION void for_each_element(const Member& /*team*/, int rows, int cols,
                                                      const F& f) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        f(r, c);
  }

  /// C (+)= A B as PortableTileOps::gemm: column blocks of four, two and one vector registers
  /// (host::micro_rows), micro-kernels down each, plain loops for the last columns.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm(const Member& /*team*/, int m, int n, int k, const Acc* a,
                                          int a_rs, int a_cs, const Acc* b, int ldb, Acc* c,
                                          int ldc, bool accumulate) {
    gemm_blocks<false>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate, nullptr);
  }

  /// C = A B as gemm (not accumulated), and col_max[j] = the maximum of column j of C for j in
  /// [0, n) (-inf where every element is NaN: a NaN is skipped, as col_softmax skips it), taken
  /// from the micro-kernels' registers: the forward's S^T = K_j Q_i^T hands col_softmax_max
  /// the tile's maxima without the pass over S^T that col_softmax makes for them.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm_col_max(const Member& /*team*/, int m, int n, int k,
                                                  const Acc* a, int a_rs, int a_cs, const Acc* b,
                                                  int ldb, Acc* c, int ldc, Acc* col_max) {
    for (int j = 0; j < n; ++j)
      col_max[j] = -infinity<Acc>();
    gemm_blocks<true>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, false, col_max);
  }

  /// PortableTileOps::gemm_bf16x2: inside a PairScope that configured the AMX tiles and for A
  /// with unit column stride, the first m - m % 16 rows and n - n % 16 columns to depth
  /// k2 - k2 % 16 on the tiles (host/amx.hpp), the rest as below; otherwise on VDPBF16PS where
  /// the CPU has it (the blocking of gemm), the last n % 16 columns, and CPUs without it, on the
  /// portable loops.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm_bf16x2(const Member& team, int m, int n, int k2,
                                                 const void* a, int a_rs, int a_cs, const void* b,
                                                 int ldb, float* c, int ldc, float scale,
                                                 bool accumulate) {
#ifdef KFA_HOST_AMX
    const int m16 = m - m % 16, n16 = n - n % 16, k16 = k2 - k2 % 16;
    if (a_cs == 1 && m16 > 0 && n16 > 0 && k16 > 0 && host::amx::active()) {
      const auto* ab = static_cast<const unsigned char*>(a);
      const auto* bb = static_cast<const unsigned char*>(b);
      host::amx::gemm(m16, n16, k16, a, a_rs, b, ldb, c, ldc, scale, accumulate);
      if (k16 < k2)  // the depth the tiles left, added to their block
        gemm_bf16x2_vector(team, m16, n16, k2 - k16, ab + static_cast<std::ptrdiff_t>(4) * k16,
                           a_rs, 1, bb + static_cast<std::ptrdiff_t>(4) * k16 * ldb, ldb, c, ldc,
                           scale, true);
      if (n16 < n)
        gemm_bf16x2_vector(team, m16, n - n16, k2, a, a_rs, 1,
                           bb + static_cast<std::ptrdiff_t>(4) * n16, ldb, c + n16, ldc, scale,
                           accumulate);
      if (m16 < m)
        gemm_bf16x2_vector(team, m - m16, n, k2, ab + static_cast<std::ptrdiff_t>(4) * m16 * a_rs,
                           a_rs, 1, b, ldb, c + static_cast<std::ptrdiff_t>(m16) * ldc, ldc, scale,
                           accumulate);
      return;
    }
#endif
    gemm_bf16x2_vector(team, m, n, k2, a, a_rs, a_cs, b, ldb, c, ldc, scale, accumulate);
  }

  /// gemm_bf16x2 on VDPBF16PS where the CPU has it (the blocking of gemm); the last n % 16
  /// columns, and CPUs without it, on the portable loops.
  /// With ColMax, col_max[j] also becomes the maximum of itself and column j of C (for
  /// gemm_bf16x2_col_max).
  template <bool ColMax = false, class Member>
  static KOKKOS_INLINE_FUNCTION void gemm_bf16x2_vector(const Member& team, int m, int n, int k2,
                                                        const void* a, int a_rs, int a_cs,
                                                        const void* b, int ldb, float* c, int ldc,
                                                        float scale, bool accumulate,
                                                        float* col_max = nullptr) {
    int j_end = 0;
#ifdef KFA_HOST_AVX512_BF16
    const auto* ab = static_cast<const unsigned char*>(a);
    const auto* bb = static_cast<const unsigned char*>(b);
    j_end = host::for_column_blocks<float>(n, [&](auto regs, int j0) {
      constexpr int V = decltype(regs)::value;
      host::for_row_blocks<host::micro_rows(V)>(m, [&](auto rows, int i0) {
        host::bf16x2_kernel<decltype(rows)::value, V, ColMax>(
            k2, ab + 4 * static_cast<std::ptrdiff_t>(i0) * a_rs, a_rs, a_cs,
            bb + static_cast<std::ptrdiff_t>(4) * j0, ldb,
            c + static_cast<std::ptrdiff_t>(i0) * ldc + j0, ldc, scale, accumulate,
            ColMax ? col_max + j0 : nullptr);
      });
    });
#endif
    if (j_end < n) {
      PortableTileOps<float>::gemm_bf16x2(
          team, m, n - j_end, k2, a, a_rs, a_cs,
          static_cast<const unsigned char*>(b) + static_cast<std::ptrdiff_t>(4) * j_end, ldb,
          c + j_end, ldc, scale, accumulate);
      if constexpr (ColMax) host::col_max_of(m, n - j_end, c + j_end, ldc, col_max + j_end);
    }
  }

  /// C = scale (A B) as gemm_bf16x2 (not accumulated), and col_max[j] = the maximum of column
  /// j of C, as gemm_col_max: from the registers on VDPBF16PS, by a pass over C where the
  /// product ran on AMX tiles.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void gemm_bf16x2_col_max(const Member& team, int m, int n, int k2,
                                                         const void* a, int a_rs, int a_cs,
                                                         const void* b, int ldb, float* c, int ldc,
                                                         float scale, float* col_max) {
    for (int j = 0; j < n; ++j)
      col_max[j] = -infinity<float>();
#ifdef KFA_HOST_AMX
    if (host::amx::active()) {
      gemm_bf16x2(team, m, n, k2, a, a_rs, a_cs, b, ldb, c, ldc, scale, false);
      host::col_max_of(m, n, c, ldc, col_max);
      return;
    }
#endif
    gemm_bf16x2_vector<true>(team, m, n, k2, a, a_rs, a_cs, b, ldb, c, ldc, scale, false, col_max);
  }

  /// PortableTileOps::pack_bf16x2_rows: on AVX-512 BF16, 16 columns of two rows at a time
  /// (host::bf16x2_round).
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void pack_bf16x2_rows(const Member& team, const float* s, int lds,
                                                      int rows, int n, void* out, int ldo) {
    int c_end = 0;
#ifdef KFA_HOST_AVX512_BF16
    c_end = n - n % 16;
    auto* o = static_cast<unsigned char*>(out);
    for (int r = 0; 2 * r < rows; ++r) {
      const float* s0 = s + static_cast<std::ptrdiff_t>(2 * r) * lds;
      const bool pair = 2 * r + 1 < rows;
      for (int c = 0; c < c_end; c += 16) {
        const __m512 hi = pair ? _mm512_loadu_ps(s0 + lds + c) : _mm512_setzero_ps();
        _mm512_storeu_si512(o + 4 * (static_cast<std::ptrdiff_t>(r) * ldo + c),
                            host::bf16x2_round(_mm512_loadu_ps(s0 + c), hi));
      }
    }
#endif
    if (c_end < n)
      PortableTileOps<float>::pack_bf16x2_rows(
          team, s + c_end, lds, rows, n - c_end,
          static_cast<unsigned char*>(out) + static_cast<std::ptrdiff_t>(4) * c_end, ldo);
  }

  /// PortableTileOps::pack_bf16x2_columns: on AVX-512 BF16, blocks of 32 rows (16 pair words)
  /// by 16 columns: each row pair to pair words (host::bf16x2_round), the 16 x 16 words then
  /// transposed in registers (host::transpose16); the edges on the portable loops.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void pack_bf16x2_columns(const Member& team, const float* s,
                                                         int lds, int rows, int n, void* out,
                                                         int ldo) {
    int w_end = 0, c_end = 0;  // pair words and columns the blocks cover
#ifdef KFA_HOST_AVX512_BF16
    w_end = rows / 32 * 16;
    c_end = n - n % 16;
    auto* o = static_cast<unsigned char*>(out);
    for (int w0 = 0; w0 < w_end; w0 += 16)
      for (int c = 0; c < c_end; c += 16) {
        __m512i x[16];  // x[i]: pair word w0 + i of columns c..c+15
        for (int i = 0; i < 16; ++i) {
          const float* s0 = s + static_cast<std::ptrdiff_t>(2 * (w0 + i)) * lds + c;
          x[i] = host::bf16x2_round(_mm512_loadu_ps(s0), _mm512_loadu_ps(s0 + lds));
        }
        host::transpose16(x);  // x[i]: words w0..w0+15 of column c + i
        for (int i = 0; i < 16; ++i)
          _mm512_storeu_si512(o + 4 * (static_cast<std::ptrdiff_t>(c + i) * ldo + w0), x[i]);
      }
#endif
    const auto rest = [&](int r0, int c0, int c1) {  // rows [r0, rows) of columns [c0, c1)
      if (r0 < rows && c0 < c1)
        PortableTileOps<float>::pack_bf16x2_columns(
            team, s + static_cast<std::ptrdiff_t>(r0) * lds + c0, lds, rows - r0, c1 - c0,
            static_cast<unsigned char*>(out) + 4 * (static_cast<std::ptrdiff_t>(c0) * ldo + r0 / 2),
            ldo);
    };
    rest(2 * w_end, 0, c_end);
    rest(0, c_end, n);
  }

  /// PortableTileOps::interleave_bf16x2_rows: on AVX-512 BF16 (with BW), 32 columns of two
  /// rows at a time by two two-source word permutes.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void interleave_bf16x2_rows(const Member& team, const void* v,
                                                            std::ptrdiff_t ldv, int rows, int n,
                                                            void* out, int ldo) {
    int c_end = 0;
#ifdef KFA_HOST_AVX512_BF16
    c_end = n - n % 32;
    // Words of row 2r are 0..31 of the pair of sources, row 2r+1's are 32..63.
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                        8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi =
        _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                         22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    const auto* in = static_cast<const unsigned char*>(v);
    auto* o = static_cast<unsigned char*>(out);
    for (int r = 0; 2 * r < rows; ++r) {
      const unsigned char* v0 = in + 2 * (static_cast<std::ptrdiff_t>(2 * r) * ldv);
      const bool pair = 2 * r + 1 < rows;
      for (int c = 0; c < c_end; c += 32) {
        const __m512i x0 = _mm512_loadu_si512(v0 + static_cast<std::ptrdiff_t>(2) * c);
        const __m512i x1 = pair ? _mm512_loadu_si512(v0 + 2 * (ldv + c)) : _mm512_setzero_si512();
        unsigned char* w = o + 4 * (static_cast<std::ptrdiff_t>(r) * ldo + c);
        _mm512_storeu_si512(w, _mm512_permutex2var_epi16(x0, lo, x1));
        _mm512_storeu_si512(w + 64, _mm512_permutex2var_epi16(x0, hi, x1));
      }
    }
#endif
    if (c_end < n)
      PortableTileOps<float>::interleave_bf16x2_rows(
          team, static_cast<const unsigned char*>(v) + static_cast<std::ptrdiff_t>(2) * c_end, ldv,
          rows, n - c_end,
          static_cast<unsigned char*>(out) + static_cast<std::ptrdiff_t>(4) * c_end, ldo);
  }

  /// max of x[c0, c1), for c0 < c1, with one vector of partial maxima.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION Acc row_max(const Member& /*member*/, const Acc* x, int c0,
                                            int c1) {
    constexpr int L = host::lanes<Acc>;
    Acc lane[L];
    for (int j = 0; j < L; ++j)
      lane[j] = -infinity<Acc>();
    int c = c0;
    for (; c + L <= c1; c += L)
      for (int j = 0; j < L; ++j)
        lane[j] = x[c + j] > lane[j] ? x[c + j] : lane[j];
    Acc mx = -infinity<Acc>();
    for (; c < c1; ++c)
      mx = x[c] > mx ? x[c] : mx;
    for (int j = 0; j < L; ++j)
      mx = lane[j] > mx ? lane[j] : mx;
    return mx;
  }

  /// x[c] = exp(x[c] - shift) on [c0, c1) with the vectorisable exp; returns their sum. float
  /// with AVX-512 and a finite shift: col_softmax's base-2 exponential (host::exp2_16), 16
  /// lanes at a time and the last ones masked (the backward's P = exp(S - LSE) through
  /// exp_float at 256 bits: about 5 % of a causal backward, 2026-11-27-host-backward.md).
  template <class Member>
  static KOKKOS_INLINE_FUNCTION Acc row_exp_sum(const Member& /*member*/, Acc* x, int c0, int c1,
                                                Acc shift) {
#ifdef KFA_HOST_AVX512
    if constexpr (std::is_same_v<Acc, float>)
      if (shift > -infinity<float>() && shift < infinity<float>()) {
        // (x - shift) first, then log2(e), as in col_softmax: the argument's error relative to
        // x - shift, not to shift.
        const __m512 s = _mm512_set1_ps(shift), log2e = _mm512_set1_ps(1.44269504088896341f);
        __m512 sum = _mm512_setzero_ps();
        for (int c = c0; c < c1; c += 16) {
          const __mmask16 lanes =
              c1 - c >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1U << (c1 - c)) - 1U);
          const __m512 y =
              _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + c), s), log2e);
          const __m512 p = host::exp2_16(y, lanes);  // 0 in the lanes past c1
          _mm512_mask_storeu_ps(x + c, lanes, p);
          sum = _mm512_add_ps(sum, p);
        }
        // The lanes added in order (GCC 12's _mm512_reduce_add_ps warns as in host::max16).
        float lane[16];
        _mm512_storeu_ps(lane, sum);
        float total = 0.0f;
        for (float part : lane)
          total += part;
        return total;
      }
#elif defined(KFA_HOST_AVX2)
    if constexpr (std::is_same_v<Acc, float>)
      if (shift > -infinity<float>() && shift < infinity<float>()) {
        // The AVX-512 form above on 8 lanes (host::exp2_8), the last ones masked.
        const __m256 s = _mm256_set1_ps(shift), log2e = _mm256_set1_ps(1.44269504088896341f);
        __m256 sum = _mm256_setzero_ps();
        const auto y_of = [&](__m256 v) { return _mm256_mul_ps(_mm256_sub_ps(v, s), log2e); };
        int c = c0;
        for (; c + 8 <= c1; c += 8) {  // plain loads and stores (masked stores are slow on Zen)
          const __m256 p = host::exp2_8(y_of(_mm256_loadu_ps(x + c)));
          _mm256_storeu_ps(x + c, p);
          sum = _mm256_add_ps(sum, p);
        }
        if (c < c1) {
          const __m256i lanes = host::first_lanes8(c1 - c);
          const __m256 p =
              host::exp2_8(y_of(_mm256_maskload_ps(x + c, lanes)), _mm256_castsi256_ps(lanes));
          _mm256_maskstore_ps(x + c, lanes, p);  // 0 past c1, not stored
          sum = _mm256_add_ps(sum, p);
        }
        float lane[8];
        _mm256_storeu_ps(lane, sum);
        float total = 0.0f;
        for (float part : lane)
          total += part;
        return total;
      }
#endif
    constexpr int L = host::lanes<Acc>;
    Acc lane[L];
    for (int j = 0; j < L; ++j)
      lane[j] = Acc(0);
    int c = c0;
    for (; c + L <= c1; c += L)
      for (int j = 0; j < L; ++j) {
        const Acc p = host::exp(x[c + j] - shift);
        x[c + j] = p;
        lane[j] += p;
      }
    Acc sum = 0;
    for (; c < c1; ++c) {
      x[c] = host::exp(x[c] - shift);
      sum += x[c];
    }
    for (int j = 0; j < L; ++j)
      sum += lane[j];
    return sum;
  }

  /// PortableTileOps::stage_transposed: with AVX, float rows eight at a time, 8 x 8 blocks
  /// loaded by rows and stored by columns after an in-register transpose (the element loop
  /// stores one element per cycle at best); with AVX2 the same for the bytes of a boolean mask
  /// (Visibility), eight bytes of a row widened to 0 or -inf in one register. Other types and
  /// the edges element by element.
  template <class Member, class Row, class Convert = Widen>
  static KOKKOS_INLINE_FUNCTION void stage_transposed(const Member& /*team*/, int rows, int c0,
                                                      int c1, const Row& row, Acc* dst, int ldd,
                                                      Convert convert = {},
                                                      bool accumulate = false) {
    using Src = std::remove_cv_t<std::remove_pointer_t<decltype(row(0))>>;
    int r0 = 0;
#ifdef KFA_HOST_AVX
    constexpr bool floats =
        std::is_same_v<Src, float> && std::is_same_v<Convert, Widen>;  // 8 floats of a row
#ifdef __AVX2__
    constexpr bool bytes = sizeof(Src) == 1 && std::is_integral_v<Src> &&
                           std::is_same_v<Convert, Visibility>;  // 8 bytes of a row
#else
    constexpr bool bytes = false;
#endif
    if constexpr (std::is_same_v<Acc, float> && (floats || bytes)) {
      for (; r0 + 8 <= rows; r0 += 8) {
        const Src* src[8];
        for (int i = 0; i < 8; ++i)
          src[i] = row(r0 + i);
        int c = c0;
        for (; c + 8 <= c1; c += 8) {
          __m256 x[8];
          for (int i = 0; i < 8; ++i) {
            if constexpr (floats) {
              x[i] = _mm256_loadu_ps(src[i] + c);
            } else {
#ifdef __AVX2__
              // Bytes widened to 32 bits; lanes of hidden (zero) bytes become the bits of -inf.
              const __m256i w = _mm256_cvtepu8_epi32(
                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src[i] + c)));
              x[i] = _mm256_castsi256_ps(
                  _mm256_and_si256(_mm256_cmpeq_epi32(w, _mm256_setzero_si256()),
                                   _mm256_castps_si256(_mm256_set1_ps(-infinity<float>()))));
#endif
            }
          }
          host::transpose8(x);
          for (int i = 0; i < 8; ++i) {
            float* d = dst + static_cast<std::ptrdiff_t>(c + i) * ldd + r0;
            _mm256_storeu_ps(d, accumulate ? _mm256_add_ps(_mm256_loadu_ps(d), x[i]) : x[i]);
          }
        }
        for (; c < c1; ++c)
          for (int i = 0; i < 8; ++i) {
            Acc& d = dst[static_cast<std::ptrdiff_t>(c) * ldd + r0 + i];
            const Acc y = convert.template to<Acc>(src[i][c]);
            d = accumulate ? d + y : y;
          }
      }
    }
#endif
    for (; r0 < rows; ++r0) {
      const Src* src = row(r0);
      for (int c = c0; c < c1; ++c) {
        Acc& d = dst[static_cast<std::ptrdiff_t>(c) * ldd + r0];
        const Acc y = convert.template to<Acc>(src[c]);
        d = accumulate ? d + y : y;
      }
    }
  }

  /// PortableTileOps::prefetch_rows: a prefetch of each cache line of [c0, c1) of every row, so
  /// that rows far apart in memory (a mask tile: one row per query) arrive while the tile
  /// before is computed; the hardware prefetcher follows few such streams at once.
  template <class Row>
  static KOKKOS_INLINE_FUNCTION void prefetch_rows(int rows, int c0, int c1, const Row& row) {
#ifdef KFA_HOST_VECTOR_EXTENSION
    for (int r = 0; r < rows; ++r) {
      const char* first = reinterpret_cast<const char*>(row(r) + c0);
      const char* last = reinterpret_cast<const char*>(row(r) + c1);
      for (const char* p = first; p < last; p += 64)
        __builtin_prefetch(p);
    }
#else
    (void)rows, (void)c0, (void)c1, (void)row;
#endif
  }

  /// PortableTileOps::col_abs_sum: columns four vector registers at a time, then one, the
  /// tile's partial sums in lane arrays (rows outer, lanes inner: unit stride, vectorised without
  /// reassociation); the last n % lanes columns one by one.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_abs_sum(const Member& /*team*/, Acc* s, int lds,
                                                 const Acc* w, int j0, int j1, int n, Acc* l) {
    constexpr int L = host::lanes<Acc>;
    const auto columns = [&](int c0, auto width, auto weighted) {
      constexpr int W = decltype(width)::value;
      Acc sum[W];
      for (int c = 0; c < W; ++c)
        sum[c] = Acc(0);
      for (int j = j0; j < j1; ++j) {
        const std::ptrdiff_t e = static_cast<std::ptrdiff_t>(j) * lds + c0;
        for (int c = 0; c < W; ++c) {
          Acc x = s[e + c];
          if constexpr (decltype(weighted)::value) {
            x *= w[e + c];
            s[e + c] = x;
          }
          sum[c] += backends::abs(x);
        }
      }
      for (int c = 0; c < W; ++c)
        l[c0 + c] += sum[c];
    };
    const auto all = [&](auto weighted) {
      int c0 = 0;
      for (; c0 + 4 * L <= n; c0 += 4 * L)  // four independent chains of additions
        columns(c0, std::integral_constant<int, 4 * L>{}, weighted);
      for (; c0 + L <= n; c0 += L)
        columns(c0, std::integral_constant<int, L>{}, weighted);
      for (; c0 < n; ++c0)
        columns(c0, std::integral_constant<int, 1>{}, weighted);
    };
    if (w)
      all(std::true_type{});
    else
      all(std::false_type{});
  }

  /// PortableTileOps::col_softmax with the vectorisable exp. On AVX-512, float columns 16 at a
  /// time: maximum, shift and sum in registers, exp2_16. Elsewhere, and for the last n % 16
  /// columns, loops the compiler vectorises across columns (rows outer, columns inner).
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_softmax(const Member& /*team*/, Acc* s, int lds, int j0,
                                                 int j1, int n, Acc* m, Acc* l, Acc* alpha) {
    col_softmax_seen<false>(s, lds, j0, j1, n, m, l, alpha, nullptr, 0);
  }

  /// col_softmax with the tile's maxima given: on entry alpha[c] holds the maximum of column c
  /// over rows [j0, j1) of s (gemm_col_max, from -inf), so that the vector blocks skip their
  /// pass over s for it; the same m, l, alpha and P as col_softmax. The last columns, which
  /// no vector block covers, take their maxima from s again.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_softmax_max(const Member& /*team*/, Acc* s, int lds,
                                                     int j0, int j1, int n, Acc* m, Acc* l,
                                                     Acc* alpha) {
    col_softmax_seen<false, true>(s, lds, j0, j1, n, m, l, alpha, nullptr, 0);
  }

#if defined(KFA_HOST_AVX512) && defined(__AVX512BW__) && defined(__AVX512VBMI__) && \
    defined(__GFNI__)
  /// Whether visibility_words and col_softmax's form with them exist (float; AVX-512BW, VBMI
  /// and GFNI).
  static constexpr bool has_visibility_words = std::is_same_v<Acc, float>;

  /// A boolean mask's tile as words for col_softmax: bit r % 16 of w[(r / 16) * ldw + c] is
  /// whether row r (a query; row(r) points at its key 0, unit stride) sees key c, for
  /// r < rows and c in [c0, c1); the bits of rows past `rows` are 0. Per 16 rows and 64 keys:
  /// each row's 64 bytes become 64 bits in one compare (vptestmb); the 16 x 64 bit matrix is
  /// then transposed by bytes (vpermb), by 8 x 8 bit blocks (GFNI's affine transform with the
  /// data as the matrix) and interleaved into 16-bit words (vpermt2b): about 60 instructions
  /// for 1024 scores, where writing -inf into S^T (stage_transposed) costs a pass over the tile.
  template <class Row>
  static void visibility_words(int rows, int c0, int c1, const Row& row, std::uint16_t* w,
                               int ldw) {
    alignas(64) static constexpr unsigned char by_keys[64] = {
        // [8k + r] = 8 (7 - r) + k
        56, 48, 40, 32, 24, 16, 8,  0,  57, 49, 41, 33, 25, 17, 9,  1,  58, 50, 42, 34, 26, 18,
        10, 2,  59, 51, 43, 35, 27, 19, 11, 3,  60, 52, 44, 36, 28, 20, 12, 4,  61, 53, 45, 37,
        29, 21, 13, 5,  62, 54, 46, 38, 30, 22, 14, 6,  63, 55, 47, 39, 31, 23, 15, 7};
    alignas(64) static constexpr unsigned char pairs[2][64] = {
        // [2c] = c, [2c + 1] = 64 + c
        {0,  64, 1,  65, 2,  66, 3,  67, 4,  68, 5,  69, 6,  70, 7,  71, 8,  72, 9,  73, 10, 74,
         11, 75, 12, 76, 13, 77, 14, 78, 15, 79, 16, 80, 17, 81, 18, 82, 19, 83, 20, 84, 21, 85,
         22, 86, 23, 87, 24, 88, 25, 89, 26, 90, 27, 91, 28, 92, 29, 93, 30, 94, 31, 95},
        { 32,
          96,
          33,
          97,
          34,
          98,
          35,
          99,
          36,
          100,
          37,
          101,
          38,
          102,
          39,
          103,
          40,
          104,
          41,
          105,
          42,
          106,
          43,
          107,
          44,
          108,
          45,
          109,
          46,
          110,
          47,
          111,
          48,
          112,
          49,
          113,
          50,
          114,
          51,
          115,
          52,
          116,
          53,
          117,
          54,
          118,
          55,
          119,
          56,
          120,
          57,
          121,
          58,
          122,
          59,
          123,
          60,
          124,
          61,
          125,
          62,
          126,
          63,
          127 }};
    const __m512i to_keys = _mm512_load_si512(by_keys);
    const __m512i lo_words = _mm512_load_si512(pairs[0]), hi_words = _mm512_load_si512(pairs[1]);
    // Byte j of each qword 1 << j: the affine transform then gives bit k of byte j of a qword
    // = bit j of its byte 7 - k, the 8 x 8 transpose (rows reversed by to_keys).
    const __m512i unit = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ULL));
    for (int g = 0; g * 16 < rows; ++g) {
      const int nr = rows - g * 16 < 16 ? rows - g * 16 : 16;
      std::uint16_t* wg = w + static_cast<std::ptrdiff_t>(g) * ldw;
      for (int c = c0; c < c1; c += 64) {
        const int n = c1 - c < 64 ? c1 - c : 64;
        const __mmask64 in = n == 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
        alignas(64) std::uint64_t bits[16] = {};
        for (int i = 0; i < nr; ++i) {
          const __m512i b = _mm512_maskz_loadu_epi8(in, row(g * 16 + i) + c);
          bits[i] = _mm512_test_epi8_mask(b, b);  // bit j: key c + j is visible to the row
        }
        // Byte c of each: the 8 rows' bits of key c (rows 0-7, then 8-15). maskz: GCC 12
        // warns of vpermb's undefined pass-through operand, as of vpsrlq's.
        const __m512i lo = _mm512_gf2p8affine_epi64_epi8(
            unit, _mm512_maskz_permutexvar_epi8(~__mmask64(0), to_keys, _mm512_load_si512(bits)),
            0);
        const __m512i hi = _mm512_gf2p8affine_epi64_epi8(
            unit,
            _mm512_maskz_permutexvar_epi8(~__mmask64(0), to_keys, _mm512_load_si512(bits + 8)), 0);
        const __m512i first = _mm512_permutex2var_epi8(lo, lo_words, hi);   // keys 0-31
        const __m512i second = _mm512_permutex2var_epi8(lo, hi_words, hi);  // keys 32-63
        if (n == 64) {
          _mm512_storeu_si512(wg + c, first);
          _mm512_storeu_si512(wg + c + 32, second);
        } else {
          const __mmask32 a = n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
          const __mmask32 b = n <= 32 ? 0 : (__mmask32(1) << (n - 32)) - 1;
          _mm512_mask_storeu_epi16(wg + c, a, first);
          _mm512_mask_storeu_epi16(wg + c + 32, b, second);
        }
      }
    }
  }

  /// col_softmax with a boolean mask's words (visibility_words, key rows of s at the same
  /// indices): a hidden score counts as -inf whatever s holds, without a pass that writes -inf
  /// into s: the maximum skips it and its P is 0.
  template <class Member>
  static KOKKOS_INLINE_FUNCTION void col_softmax(const Member& /*team*/, Acc* s, int lds, int j0,
                                                 int j1, int n, Acc* m, Acc* l, Acc* alpha,
                                                 const std::uint16_t* seen, int ldw) {
    col_softmax_seen<true>(s, lds, j0, j1, n, m, l, alpha, seen, ldw);
  }
#endif

 private:
  /// gemm's blocking; with ColMax, col_max[j] also becomes the maximum of itself and column j
  /// of C (gemm_col_max).
  template <bool ColMax>
  static KOKKOS_INLINE_FUNCTION void gemm_blocks(int m, int n, int k, const Acc* a, int a_rs,
                                                 int a_cs, const Acc* b, int ldb, Acc* c, int ldc,
                                                 bool accumulate, Acc* col_max) {
    const int j_end = host::for_column_blocks<Acc>(n, [&](auto regs, int j0) {
      constexpr int NR = decltype(regs)::value * host::lanes<Acc>;
      host::for_row_blocks<host::micro_rows(decltype(regs)::value)>(m, [&](auto rows, int i0) {
        host::micro_kernel<decltype(rows)::value, NR, Acc, ColMax>(
            k, a + static_cast<std::ptrdiff_t>(i0) * a_rs, a_rs, a_cs, b + j0, ldb,
            c + static_cast<std::ptrdiff_t>(i0) * ldc + j0, ldc, accumulate,
            ColMax ? col_max + j0 : nullptr);
      });
    });
    if (j_end < n) {
      host::edge_kernel(m, n - j_end, k, a, a_rs, a_cs, b + j_end, ldb, c + j_end, ldc, accumulate);
      if constexpr (ColMax) host::col_max_of(m, n - j_end, c + j_end, ldc, col_max + j_end);
    }
  }

  /// col_softmax, with the visibility words `seen` (Seen) or without them, and with the tile's
  /// maxima in alpha (GivenMax, col_softmax_max) or not.
  template <bool Seen, bool GivenMax = false>
  static void col_softmax_seen(Acc* s, int lds, int j0, int j1, int n, Acc* m, Acc* l, Acc* alpha,
                               const std::uint16_t* seen, int ldw) {
    int c0 = 0;
#ifdef KFA_HOST_AVX512
    if constexpr (std::is_same_v<Acc, float>) {
      const __m512 minus_inf = _mm512_set1_ps(-infinity<float>());
      for (; c0 + 16 <= n; c0 += 16) {
        const __m512 m_old = _mm512_loadu_ps(m + c0);
        __m512 top = m_old;
        const auto visible = [&](int j) {
          if constexpr (Seen)
            return static_cast<__mmask16>(seen[static_cast<std::ptrdiff_t>(c0 / 16) * ldw + j]);
          else
            return static_cast<__mmask16>(0xFFFF);
        };
        // Four chains of maxima, merged at the end: one chain waits for each VMAXPS (4
        // cycles) and was the sweep's hottest loop with the products on AMX tiles. The same
        // maximum whatever the order (a NaN score is skipped in every chain alike).
        __m512 tops[4] = {top, minus_inf, minus_inf, minus_inf};
        const auto take = [&](__m512& t, int j) {
          const __m512 x = _mm512_loadu_ps(s + static_cast<std::ptrdiff_t>(j) * lds + c0);
          t = _mm512_mask_mov_ps(t, visible(j), host::max16(x, t));
        };
        if constexpr (GivenMax) {
          top = host::max16(_mm512_loadu_ps(alpha + c0), top);
        } else {
          host::four_chains(j0, j1, tops, take);
          top = host::max16(host::max16(tops[0], tops[1]), host::max16(tops[2], tops[3]));
        }
        // In base 2, 2^((x - m') log2(e)): x - m' first (exact near the maximum), so that the
        // argument's error is relative to x - m', as in exp's own reduction, not to m' (a
        // rounded m' log2(e) would put |m'| 2^-24 into every P and the LSE).
        const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
        const __m512 shift = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(top, minus_inf, _CMP_EQ_OQ),
                                                  top, _mm512_setzero_ps());
        const auto exp_of = [&](__m512 x, __mmask16 lanes) {
          return host::exp2_16(_mm512_mul_ps(_mm512_sub_ps(x, shift), log2e), lanes);
        };
        __m512 sum = _mm512_setzero_ps();
        for (int j = j0; j < j1; ++j) {
          float* x = s + static_cast<std::ptrdiff_t>(j) * lds + c0;
          const __m512 p = exp_of(_mm512_loadu_ps(x), visible(j));  // hidden lanes: 0
          _mm512_storeu_ps(x, p);
          sum = _mm512_add_ps(sum, p);
        }
        const __m512 a = exp_of(m_old, 0xFFFF);
        _mm512_storeu_ps(alpha + c0, a);
        _mm512_storeu_ps(l + c0, _mm512_fmadd_ps(a, _mm512_loadu_ps(l + c0), sum));
        _mm512_storeu_ps(m + c0, top);
      }
    }
#elif defined(KFA_HOST_AVX2)
    // The AVX-512 loop above on 8 columns (queries) at a time, without the words (mask_words
    // needs AVX-512): four chains of maxima, then 2^((x - m') log2(e)) by host::exp2_8.
    if constexpr (std::is_same_v<Acc, float> && !Seen) {
      (void)seen, (void)ldw;
      const __m256 minus_inf = _mm256_set1_ps(-infinity<float>());
      const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
      for (; c0 + 8 <= n; c0 += 8) {
        const __m256 m_old = _mm256_loadu_ps(m + c0);
        // vmaxps gives its second operand where either is NaN: a NaN score is skipped, as in
        // max16.
        __m256 tops[4] = {m_old, minus_inf, minus_inf, minus_inf};
        const auto take = [&](__m256& t, int j) {
          t = _mm256_max_ps(_mm256_loadu_ps(s + static_cast<std::ptrdiff_t>(j) * lds + c0), t);
        };
        __m256 top;
        if constexpr (GivenMax) {
          top = _mm256_max_ps(_mm256_loadu_ps(alpha + c0), m_old);
        } else {
          host::four_chains(j0, j1, tops, take);
          top = _mm256_max_ps(_mm256_max_ps(tops[0], tops[1]), _mm256_max_ps(tops[2], tops[3]));
        }
        const __m256 shift =
            _mm256_andnot_ps(_mm256_cmp_ps(top, minus_inf, _CMP_EQ_OQ), top);  // 0 at -inf
        const auto exp_of = [&](__m256 x) {
          return host::exp2_8(_mm256_mul_ps(_mm256_sub_ps(x, shift), log2e));
        };
        __m256 sum = _mm256_setzero_ps();
        for (int jj = j0; jj < j1; ++jj) {
          float* x = s + static_cast<std::ptrdiff_t>(jj) * lds + c0;
          const __m256 p = exp_of(_mm256_loadu_ps(x));
          _mm256_storeu_ps(x, p);
          sum = _mm256_add_ps(sum, p);
        }
        const __m256 a = exp_of(m_old);
        _mm256_storeu_ps(alpha + c0, a);
        _mm256_storeu_ps(l + c0, _mm256_fmadd_ps(a, _mm256_loadu_ps(l + c0), sum));
        _mm256_storeu_ps(m + c0, top);
      }
    }
#endif
    if (c0 >= n) return;
    if constexpr (Seen)  // the last columns: hidden scores written as -inf, then the rule as
                         // without
      for (int j = j0; j < j1; ++j)
        for (int c = c0; c < n; ++c)
          if (!((seen[static_cast<std::ptrdiff_t>(c / 16) * ldw + j] >> (c % 16)) & 1U))
            s[static_cast<std::ptrdiff_t>(j) * lds + c] = -infinity<Acc>();
    // alpha holds the maxima until it holds the factors; the shift is 0 where m' is -inf.
    for (int c = c0; c < n; ++c)
      alpha[c] = m[c];
    for (int j = j0; j < j1; ++j) {
      const Acc* sj = s + static_cast<std::ptrdiff_t>(j) * lds;
      for (int c = c0; c < n; ++c)
        alpha[c] = sj[c] > alpha[c] ? sj[c] : alpha[c];
    }
    for (int c = c0; c < n; ++c) {
      const Acc top = alpha[c], shift = top == -infinity<Acc>() ? Acc(0) : top;
      alpha[c] = host::exp(m[c] - shift);
      l[c] *= alpha[c];
      m[c] = top;
    }
    for (int j = j0; j < j1; ++j) {
      Acc* sj = s + static_cast<std::ptrdiff_t>(j) * lds;
      for (int c = c0; c < n; ++c) {
        const Acc p = host::exp(sj[c] - (m[c] == -infinity<Acc>() ? Acc(0) : m[c]));
        sj[c] = p;
        l[c] += p;
      }
    }
  }
};

}  // namespace kfa::backends

#undef KFA_HOST_VECTOR_EXTENSION
#undef KFA_HOST_AVX512
#undef KFA_HOST_AVX2
#undef KFA_HOST_AVX
