#pragma once
/// \file host/amx.hpp
/// bfloat16 pair products on Intel AMX tiles (TDPBF16PS): the engine of the host's
/// TileOps::gemm_bf16x2 where the CPU has AMX-BF16 and the build targets it (-march=native,
/// the KFA_NATIVE option, on such a CPU).
///
/// A TDPBF16PS multiplies a 16 x 32 bfloat16 tile of A by a 32 x 16 one of B (as 16 rows of
/// 16 pair words: the pair layout of bf16x2.hpp) into a 16 x 16 float tile of C, float
/// accumulation: 16384 FLOPs an instruction, 3.0-3.4 TFLOP/s on one core of the Xeon these
/// pages were measured on, against 0.23 for AVX-512 FMA in float (bench_tile_products'
/// amx_peak and fma_peak, perf/results/2026-11-27-tile-engines-bf16.md).
///
/// The tiles' shapes are set per thread by LDTILECFG; a Scope (STTILECFG, LDTILECFG, then
/// TILERELEASE: about 55 ns, amx_scope on the same page) would add 7-10 % to each of the
/// forward's products (0.53-0.80 us there), so a Scope sets them once for a whole sweep of a
/// query tile and at its end gives the thread back the configuration it found: another
/// library's, which may count on it staying loaded across calls, or none (then the tiles are
/// released). The tile data is not kept, as the ABI lets callees clobber it. gemm_bf16x2 takes
/// the tiles only inside a Scope.
///
/// Linux hands out the tile data state on request, per process (arch_prctl
/// ARCH_REQ_XCOMP_PERM, kernel 5.16 and later); available() asks once and says no where it is
/// refused, as where the CPU lacks AMX-BF16: the other paths then run.

// With AVX-512 BF16 and BW as well, which the pair products' packings and edges use (the
// conditions of KFA_HOST_AVX512_BF16, host/traits.hpp; every AMX-BF16 CPU has them), so that
// this one macro says whether the host's pair products have the tiles.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) &&                \
    defined(__AVX512BW__) && defined(__linux__) && defined(__GNUC__) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(__SYCL_DEVICE_ONLY__)
/// Defined where this header has AMX tile products (and the pair products take them).
#define KFA_HOST_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#endif

namespace kfa::backends::host::amx {

#ifdef KFA_HOST_AMX
/// Whether this process multiplies bfloat16 pairs on AMX tiles: the CPU has AMX-TILE and
/// AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), the kernel grants the tile state, and
/// KFA_HOST_AMX is not "0" in the environment (the tests run the other paths so; any other
/// value leaves it to the CPU). Decided once per process.
inline bool available() {
  static const bool ok = [] {
    const char* force = std::getenv("KFA_HOST_AMX");
    if (force && std::strcmp(force, "0") == 0) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 22) & 1U) || !((d >> 24) & 1U)) return false;
    constexpr long req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;  // asm/prctl.h
    return syscall(SYS_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return ok;
}

/// LDTILECFG's 64 bytes: palette 1, tiles 0-7 of 16 rows of 64 bytes, the others unused.
struct alignas(64) Config {
  std::uint8_t palette, start_row, reserved[14];  ///< palette 1; no interrupted load to restart
  std::uint16_t colsb[16];                        ///< bytes of a row, per tile
  std::uint8_t rows[16];                          ///< rows, per tile
};
/// The configuration every Scope loads.
inline constexpr Config config = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/// Scopes open on this thread (they nest; the outermost configures and restores).
inline thread_local int open_scopes = 0;
/// The configuration the outermost Scope found on this thread (palette 0: none).
inline thread_local Config found{};
/// Calls of gemm on this thread: the tests read it to see that the tiles were taken.
inline thread_local long products = 0;

/// Whether the calling thread is inside a Scope that configured the tiles.
inline bool active() {
  return open_scopes > 0;
}

/// Configures the tiles for gemm on the calling thread (when asked and available()) for its
/// lifetime: palette 1, all eight tiles 16 rows of 64 bytes.
class Scope {
 public:
  /// Configures when `wanted` and available(); otherwise does nothing.
  explicit Scope(bool wanted) : on_(wanted && available()) {
    // A constant in static storage: GCC 12's _tile_loadconfig tells the compiler it reads 8
    // bytes, and stores to a local configuration beyond them were dropped (a crash).
    if (on_ && open_scopes++ == 0) {
      _tile_storeconfig(&found);  // 64 bytes, where GCC 12's asm names 8: the barrier
      asm volatile("" ::: "memory");
      _tile_loadconfig(&config);
    }
  }
  ~Scope() {
    if (on_ && --open_scopes == 0) {
      if (found.palette != 0)
        _tile_loadconfig(&found);
      else
        _tile_release();
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
};

/// One block of MI x NJ C tiles (each 16 x 16; MI, NJ 1 or 2) over depth k16 pair words (a
/// multiple of 16): C tiles 0-3 (tile 2i + j), A tiles 4 and 5, B tiles 6 and 7, so that each
/// step loads MI + NJ tiles for MI * NJ products. Strides in bytes; C loaded first when `load`,
/// else zeroed. The tile numbers are literals: the intrinsics paste them into the assembly.
template <int MI, int NJ>
inline void block(int k16, const unsigned char* a, std::ptrdiff_t a_ld, const unsigned char* b,
                  std::ptrdiff_t b_ld, unsigned char* c, std::ptrdiff_t c_ld, bool load) {
  // GCC 12's tile loads and stores are asm statements that name no memory: these barriers
  // make the compiler finish every store to A, B and C before them (the packings write A and
  // B just before) and read C afresh after them.
  asm volatile("" ::: "memory");
  if (load) {
    _tile_loadd(0, c, c_ld);
    if constexpr (NJ > 1) _tile_loadd(1, c + 64, c_ld);
    if constexpr (MI > 1) _tile_loadd(2, c + 16 * c_ld, c_ld);
    if constexpr (MI > 1 && NJ > 1) _tile_loadd(3, c + 16 * c_ld + 64, c_ld);
  } else {
    _tile_zero(0);
    if constexpr (NJ > 1) _tile_zero(1);
    if constexpr (MI > 1) _tile_zero(2);
    if constexpr (MI > 1 && NJ > 1) _tile_zero(3);
  }
  for (int p = 0; p < k16; p += 16) {
    const std::ptrdiff_t ak = static_cast<std::ptrdiff_t>(4) * p, bk = p * b_ld;
    _tile_loadd(4, a + ak, a_ld);
    if constexpr (MI > 1) _tile_loadd(5, a + 16 * a_ld + ak, a_ld);
    _tile_loadd(6, b + bk, b_ld);
    if constexpr (NJ > 1) _tile_loadd(7, b + bk + 64, b_ld);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NJ > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MI > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MI > 1 && NJ > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_ld);
  if constexpr (NJ > 1) _tile_stored(1, c + 64, c_ld);
  if constexpr (MI > 1) _tile_stored(2, c + 16 * c_ld, c_ld);
  if constexpr (MI > 1 && NJ > 1) _tile_stored(3, c + 16 * c_ld + 64, c_ld);
  asm volatile("" ::: "memory");
}

/// C (+)= scale (A B) of TileOps::gemm_bf16x2 on its first m16 rows and n16 columns to depth
/// k16 pair words (all multiples of 16), for A with unit column stride (rows a_rs words apart);
/// inside a Scope. Blocks of 2 x 2 tiles, B's column pairs outer. Where the result is not what
/// the tiles hold (a scale other than 1, or accumulate with one), the tiles go to a buffer on
/// the stack and vector code finishes.
inline void gemm(int m16, int n16, int k16, const void* a, int a_rs, const void* b, int ldb,
                 float* c, int ldc, float scale, bool accumulate) {
  ++products;
  const bool load = accumulate && scale == 1.0f;  // the tiles add to C themselves
  const bool buffered = accumulate && !load;
  alignas(64) float buffer[32 * 32];
  const auto* ab = static_cast<const unsigned char*>(a);
  const auto* bb = static_cast<const unsigned char*>(b);
  const std::ptrdiff_t a_ld = static_cast<std::ptrdiff_t>(4) * a_rs,
                       b_ld = static_cast<std::ptrdiff_t>(4) * ldb;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int j0 = 0; j0 < n16; j0 += 32) {
    const int nj = j0 + 32 <= n16 ? 2 : 1;
    for (int i0 = 0; i0 < m16; i0 += 32) {
      const int mi = i0 + 32 <= m16 ? 2 : 1;
      float* cij = c + static_cast<std::ptrdiff_t>(i0) * ldc + j0;
      float* out = buffered ? buffer : cij;
      const std::ptrdiff_t o_ld = buffered ? 32 * 4 : static_cast<std::ptrdiff_t>(4) * ldc;
      const unsigned char* ai = ab + i0 * a_ld;
      const unsigned char* bj = bb + static_cast<std::ptrdiff_t>(4) * j0;
      auto* o = reinterpret_cast<unsigned char*>(out);
      if (mi == 2 && nj == 2)
        block<2, 2>(k16, ai, a_ld, bj, b_ld, o, o_ld, load);
      else if (mi == 2)
        block<2, 1>(k16, ai, a_ld, bj, b_ld, o, o_ld, load);
      else if (nj == 2)
        block<1, 2>(k16, ai, a_ld, bj, b_ld, o, o_ld, load);
      else
        block<1, 1>(k16, ai, a_ld, bj, b_ld, o, o_ld, load);
      if (load || (!buffered && scale == 1.0f)) continue;
      for (int r = 0; r < 16 * mi; ++r)
        for (int v = 0; v < nj; ++v) {
          float* cr = cij + static_cast<std::ptrdiff_t>(r) * ldc + 16 * v;
          if (buffered)
            _mm512_storeu_ps(cr, _mm512_fmadd_ps(sc, _mm512_load_ps(buffer + 32 * r + 16 * v),
                                                 _mm512_loadu_ps(cr)));
          else
            _mm512_storeu_ps(cr, _mm512_mul_ps(sc, _mm512_loadu_ps(cr)));
        }
    }
  }
}
#endif

}  // namespace kfa::backends::host::amx
