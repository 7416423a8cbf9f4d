// Which engine should do the host tile products: kfa's own register-blocked micro-kernel
// (backends/host/tile.hpp) against libxsmm's JIT kernels, oneDNN (dnnl_sgemm and a matmul
// primitive) and OpenBLAS, on the two products of a key tile in the transposed-score layout:
//
//   scores (a): S^T (Bc x Br) = K_j (Bc x D, row-major, ld D) * Q^T (D x Br, row-major, ld Br)
//   output (b): O (Br x D) += P (Br x Bc) * V_j (Bc x D, row-major, ld D), P stored as
//               P^T (Bc x Br, row-major, ld Br), i.e. A column-major; beta = 1.
//
// Operands are small and cache-resident and one attention call makes thousands of these
// products, so each benchmark times one product per iteration, call overhead included. Every
// engine's result is checked once against a double-precision loop before it is timed. The FMA
// peak probe (12 independent chains of vector FMAs) in the same binary gives the ceiling the
// GFLOP/s are quoted against (docs/performance.md; perf/tile_engines_table.py makes the table).
//
// The bfloat16 forward's two products (type bf16: bfloat16 inputs, float accumulation and
// C) are compared the same way, in the pair layout it hands kfa's TileOps::gemm_bf16x2 on AMX
// tiles and VDPBF16PS, against a oneDNN bf16 matmul primitive on plain row-major bfloat16 (see
// Bf16Problem below).
//
// Between the two products the forward takes the online-softmax step of the tile
// (TileOps::col_softmax: column maxima, P = exp(S - m') in place, l and the rescale factors),
// timed here too (softmax/...), in scores per second, at the same tiles: on one core the
// largest part of the forward besides the products (about a seventh of it at D = 64 on a
// Zen 3, docs/performance.md).
//
// Engines absent at configure time are not compiled in; the context line "absent_engines"
// names them. Run single-threaded and pinned:
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 taskset -c 0 ./bench_tile_products
#include <benchmark/benchmark.h>
#include <Kokkos_Core.hpp>

#include <kfa/backends/bf16x2.hpp>
#include <kfa/backends/host/tile.hpp>

#include "fma_peak.hpp"

#ifdef KFA_BENCH_HAVE_OPENBLAS
#include <cblas.h>
extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}
#endif
#ifdef KFA_BENCH_HAVE_LIBXSMM
#include <libxsmm.h>
#endif
#ifdef KFA_BENCH_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#ifndef KFA_GIT_REVISION
#define KFA_GIT_REVISION "unknown"
#endif

namespace {

/// A FLOP/s counter for `flops` per iteration.
benchmark::Counter flop_rate(double flops) {
  return benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                            benchmark::Counter::kIs1000);
}

/// Where the operands lie relative to each other. The rate of a small product that streams
/// A, B and C through L1 depends on it (L1 sets and 4 KiB aliasing): in a first run kfa's D = 128
/// rate moved by 10% with the heap layout alone. So the operands are placed, the same way for
/// every engine:
///  - page: A, B and C each start on a 4 KiB boundary, as tiles whose sizes are multiples of
///    4 KiB (all those here) do when they lie one after another in a scratch pad;
///  - staggered: A, B and C start 0, 1344 and 2752 bytes past a 4 KiB boundary (21 and 43
///    cache lines), spreading their first rows over the L1 sets.
enum class Placement { page, staggered };

/// n elements of T inside an arena (no ownership).
template <class T>
struct Span {
  T* p = nullptr;
  std::size_t n = 0;
  T* data() const { return p; }
  T& operator[](std::size_t i) const { return p[i]; }
};

/// One 4 KiB aligned allocation holding operands of the given sizes, each at the next 4 KiB
/// boundary plus its offset in bytes (a multiple of 64).
template <class T>
class Arena {
 public:
  Arena(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& offsets)
      : counts_(counts) {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::size_t start = (bytes + 4095) / 4096 * 4096 + offsets.at(i);
      starts_.push_back(start);
      bytes = start + counts[i] * sizeof(T);
    }
    mem_.reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
    if (!mem_) throw std::bad_alloc();
  }
  Span<T> operator[](std::size_t i) const {
    return {reinterpret_cast<T*>(mem_.get() + starts_[i]), counts_[i]};
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> mem_;
  std::vector<std::size_t> counts_, starts_;
};

/// A uniform value in [-1, 1) from a hash of the index e (as perf/common.hpp's fill_hash).
double hash_value(std::size_t e, unsigned salt) {
  std::uint64_t x = (e + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return double(x >> 11) * 0x1.0p-52 - 1.0;
}

/// Uniform values in [-1, 1) from a hash of the index.
template <class T>
void fill_hash(const Span<T>& buf, unsigned salt) {
  for (std::size_t e = 0; e < buf.n; ++e)
    buf[e] = static_cast<T>(hash_value(e, salt));
}

enum class Product { scores, output };

/// One product C (+)= A B in row-major terms: A is m x k, row-major with leading dimension
/// lda, or column-major (a_col_major) with leading dimension lda; B is k x n row-major (ldb),
/// C is m x n row-major (ldc); accumulate means beta = 1. C0 (C's initial values) lies after
/// them.
template <class T>
struct Problem {
  int m, n, k, lda, ldb, ldc;
  bool a_col_major, accumulate;
  Arena<T> arena;
  Span<T> a, b, c, c0;

  Problem(Product product, Placement placement, int br, int bc, int d)
      : m(product == Product::scores ? bc : br),
        n(product == Product::scores ? br : d),
        k(product == Product::scores ? d : bc),
        lda(product == Product::scores ? d : br),
        ldb(product == Product::scores ? br : d),
        ldc(product == Product::scores ? br : d),
        a_col_major(product == Product::output),
        accumulate(product == Product::output),
        arena({std::size_t(m) * k, std::size_t(k) * n, std::size_t(m) * n, std::size_t(m) * n},
              placement == Placement::page ? std::vector<std::size_t>{0, 0, 0, 0}
                                           : std::vector<std::size_t>{0, 1344, 2752, 0}),
        a(arena[0]),
        b(arena[1]),
        c(arena[2]),
        c0(arena[3]) {
    fill_hash(a, 1);
    fill_hash(b, 2);
    fill_hash(c0, 3);
    reset();
  }
  /// A(i, p) = a[i * a_rs + p * a_cs].
  int a_rs() const { return a_col_major ? 1 : lda; }
  int a_cs() const { return a_col_major ? lda : 1; }
  T a_at(int i, int p) const {
    return a[static_cast<std::size_t>(i) * a_rs() + static_cast<std::size_t>(p) * a_cs()];
  }
  /// C back to its initial values (those the accumulating product adds to).
  void reset() const {
    for (std::size_t e = 0; e < c.n; ++e)
      c[e] = c0[e];
  }
  double flops() const { return 2.0 * m * n * k; }

  /// Empty when C matches the double-precision product within the worst-case rounding bound
  /// of a (k + 1)-term sum in T, whatever the order of the terms and with or without FMA:
  /// |c - ref| <= (k + 2) eps (|c0| + sum_p |A(i,p) B(p,j)|); otherwise the first bad entry.
  std::string check() const {
    const double eps = std::numeric_limits<T>::epsilon();
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = accumulate ? double(c0[std::size_t(i) * ldc + j]) : 0.0;
        double mag = std::abs(ref);
        for (int p = 0; p < k; ++p) {
          const double t = double(a_at(i, p)) * double(b[std::size_t(p) * ldb + j]);
          ref += t;
          mag += std::abs(t);
        }
        const double got = c[std::size_t(i) * ldc + j];
        if (!(std::abs(got - ref) <= (k + 2) * eps * mag)) {
          std::ostringstream msg;
          msg << "C(" << i << "," << j << ") = " << got << ", double reference " << ref
              << " (bound " << (k + 2) * eps * mag << ")";
          return msg.str();
        }
      }
    return {};
  }
};

/// The bfloat16 forward's products on pair words (TileOps::gemm_bf16x2, backends/bf16x2.hpp)
/// in the layout it gives the AMX tiles: A with unit column stride, B as pair words.
///
///   scores: A = K_j (Bc x D bfloat16, row-major, so rows of D/2 pair words), B = Q^T as pair
///           words (D/2 rows of Br words), C = scale (A B) (float, ld Br), scale 0.125;
///   output: A = P (Br x Bc bfloat16, row-major: rows of Bc/2 pair words), B = V_j interleaved
///           into pair words (Bc/2 rows of D words), C += A B (float, ld D).
///
/// B also lies in plain row-major bfloat16 (k x n, ld n): the same values in the layout oneDNN
/// takes. A is the same memory for both (a row of bfloat16 is a row of pair words). The arena
/// holds A, B (pairs), C, C0 and B (plain), bytes; staggered placement puts plain B where the
/// pairs' B is, 1344 bytes past its 4 KiB boundary.
struct Bf16Problem {
  int m, n, k, ldc;  ///< k: bfloat16 elements of the reduction (k / 2 pair words)
  bool accumulate;
  float scale;
  Arena<unsigned char> arena;
  Span<unsigned char> a, b, c, c0, b_plain;  ///< b: B as pair words; c, c0: float

  Bf16Problem(Product product, Placement placement, int br, int bc, int d)
      : m(product == Product::scores ? bc : br),
        n(product == Product::scores ? br : d),
        k(product == Product::scores ? d : bc),
        ldc(n),
        accumulate(product == Product::output),
        scale(product == Product::scores ? 0.125f : 1.0f),
        arena({std::size_t(m) * k * 2, std::size_t(k) * n * 2, std::size_t(m) * n * 4,
               std::size_t(m) * n * 4, std::size_t(k) * n * 2},
              placement == Placement::page ? std::vector<std::size_t>{0, 0, 0, 0, 0}
                                           : std::vector<std::size_t>{0, 1344, 2752, 0, 1344}),
        a(arena[0]),
        b(arena[1]),
        c(arena[2]),
        c0(arena[3]),
        b_plain(arena[4]) {
    using kfa::backends::bf16_round;
    for (std::size_t e = 0; e < std::size_t(m) * k; ++e)
      store_bf16(a.data(), e, bf16_round(float(hash_value(e, 1))));
    for (std::size_t e = 0; e < std::size_t(k) * n; ++e)
      store_bf16(b_plain.data(), e, bf16_round(float(hash_value(e, 2))));
    for (int p = 0; p < k / 2; ++p)
      for (int j = 0; j < n; ++j)
        kfa::backends::bf16x2_store(
            b.data(), std::ptrdiff_t(p) * n + j,
            kfa::backends::bf16x2_pack(
                kfa::backends::bf16_load(b_plain.data(), (2 * p) * n + j),
                kfa::backends::bf16_load(b_plain.data(), (2 * p + 1) * n + j)));
    for (std::size_t e = 0; e < std::size_t(m) * n; ++e)
      c0_float()[e] = float(hash_value(e, 3));
    reset();
  }
  static void store_bf16(void* p, std::size_t i, std::uint16_t h) {
    std::memcpy(static_cast<unsigned char*>(p) + 2 * i, &h, sizeof h);
  }
  float* c_float() const { return reinterpret_cast<float*>(c.data()); }
  float* c0_float() const { return reinterpret_cast<float*>(c0.data()); }
  double a_at(int i, int p) const {
    return kfa::backends::bf16_widen(kfa::backends::bf16_load(a.data(), std::ptrdiff_t(i) * k + p));
  }
  double b_at(int p, int j) const {
    return kfa::backends::bf16_widen(
        kfa::backends::bf16_load(b_plain.data(), std::ptrdiff_t(p) * n + j));
  }
  /// C back to its initial values (those the accumulating product adds to).
  void reset() const { std::memcpy(c.data(), c0.data(), c.n); }
  double flops() const { return 2.0 * m * n * k; }

  /// Empty when C matches the double-precision product of the bfloat16 values within the
  /// worst-case rounding bound of a float sum of k + 1 terms (products of two bfloat16 are
  /// exact in float) and the scaling: |c - ref| <= (k + 2) eps_float (|c0| + |scale| sum_p
  /// |A(i,p) B(p,j)|); otherwise the first bad entry.
  std::string check() const {
    const double eps = std::numeric_limits<float>::epsilon();
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        const double init = accumulate ? double(c0_float()[std::size_t(i) * ldc + j]) : 0.0;
        double sum = 0.0, mag = 0.0;
        for (int p = 0; p < k; ++p) {
          const double t = a_at(i, p) * b_at(p, j);
          sum += t;
          mag += std::abs(t);
        }
        const double ref = init + double(scale) * sum;
        const double bound = (k + 2) * eps * (std::abs(init) + std::abs(double(scale)) * mag);
        const double got = c_float()[std::size_t(i) * ldc + j];
        if (!(std::abs(got - ref) <= bound)) {
          std::ostringstream msg;
          msg << "C(" << i << "," << j << ") = " << got << ", double reference " << ref
              << " (bound " << bound << ")";
          return msg.str();
        }
      }
    return {};
  }
};

/// Checks one call of `call` against the reference, then times one call per iteration.
template <class Pr, class Call>
void run_checked(benchmark::State& state, const Pr& pr, const Call& call) {
  pr.reset();
  call();
  if (const std::string err = pr.check(); !err.empty()) {
    state.SkipWithError(err.c_str());
    return;
  }
  pr.reset();
  benchmark::DoNotOptimize(pr.a.data());
  benchmark::DoNotOptimize(pr.b.data());
  benchmark::DoNotOptimize(pr.c.data());
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = flop_rate(pr.flops());
}

// ---- engines --------------------------------------------------------------------------------

/// kfa's host TileOps<DefaultHostExecutionSpace, T>::gemm (the team argument is unused on the
/// host) compiled as a function of its own: the header's code with nothing around it.
template <class T>
[[gnu::noinline]] void kfa_gemm_standalone(int m, int n, int k, const T* a, int a_rs, int a_cs,
                                           const T* b, int ldb, T* c, int ldc, bool accumulate) {
  using Ops = kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, T>;
  static_assert(std::is_same_v<typename Ops::Acc, T>);
  Ops::gemm(0, m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
}

/// kfa: TileOps::gemm either as its own function (kfa) or inlined into the timed loop
/// (kfa_inline), as kfa's kernels inline it. The two differ where the compiler, with more live
/// values around the inlined copy, keeps the micro-kernel's row offsets on the stack instead
/// of in registers: the generated code, not the placement of the data, decides.
template <class T, bool inlined>
void BM_kfa(benchmark::State& state, Product product, Placement placement, int br, int bc, int d) {
  using Ops = kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, T>;
  const Problem<T> pr(product, placement, br, bc, d);
  const int a_rs = pr.a_rs(), a_cs = pr.a_cs();
  if constexpr (inlined) {
    const int member = 0;
    run_checked(state, pr, [&] {
      Ops::gemm(member, pr.m, pr.n, pr.k, pr.a.data(), a_rs, a_cs, pr.b.data(), pr.ldb, pr.c.data(),
                pr.ldc, pr.accumulate);
    });
  } else {
    run_checked(state, pr, [&] {
      kfa_gemm_standalone(pr.m, pr.n, pr.k, pr.a.data(), a_rs, a_cs, pr.b.data(), pr.ldb,
                          pr.c.data(), pr.ldc, pr.accumulate);
    });
  }
  // The micro-kernel of the widest column block (host/tile.hpp): MR rows by NR columns.
  constexpr int regs = kfa::backends::host::wide_blocks ? 4 : 2;
  state.SetLabel("MR=" + std::to_string(kfa::backends::host::micro_rows(regs)) +
                 " NR=" + std::to_string(regs * kfa::backends::host::lanes<T>));
}

#ifdef KFA_HOST_AVX512_BF16
/// The host TileOps (the same for every value type; the bfloat16 forward's is
/// TileOps<Host, bf16>) and its team member: gemm_bf16x2's portable edge loops take a real one.
using HostOps = kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, float>;
using HostMember = Kokkos::TeamPolicy<Kokkos::DefaultHostExecutionSpace>::member_type;

/// kfa's host TileOps::gemm_bf16x2 compiled as a function of its own, as kfa_gemm_standalone.
[[gnu::noinline]] void kfa_gemm_bf16x2_standalone(const HostMember& team, int m, int n, int k2,
                                                  const void* a, int a_rs, const void* b, int ldb,
                                                  float* c, int ldc, float scale, bool accumulate) {
  HostOps::gemm_bf16x2(team, m, n, k2, a, a_rs, 1, b, ldb, c, ldc, scale, accumulate);
}

/// kfa's pair products: inside a PairScope opened once before the check and the timed loop, as
/// the forward opens one for a query tile's sweep (kfa_amx: the AMX tiles, TDPBF16PS), or
/// without one (kfa_dpbf16: AVX-512 VDPBF16PS), on the same operands. The check and the timed
/// loop run inside one team of one thread (a host team runs on the calling thread).
template <bool tiles>
void BM_kfa_bf16x2(benchmark::State& state, Product product, Placement placement, int br, int bc,
                   int d) {
  const Bf16Problem pr(product, placement, br, bc, d);
  if (tiles && !HostOps::bf16x2_tiles()) {
    state.SkipWithError("no AMX tiles here (CPU, kernel or KFA_HOST_AMX=0)");
    return;
  }
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Kokkos::DefaultHostExecutionSpace>(1, 1), [&](const HostMember& team) {
        const typename HostOps::PairScope scope(tiles);
        run_checked(state, pr, [&] {
          kfa_gemm_bf16x2_standalone(team, pr.m, pr.n, pr.k / 2, pr.a.data(), pr.k / 2, pr.b.data(),
                                     pr.n, pr.c_float(), pr.ldc, pr.scale, pr.accumulate);
        });
      });
  if constexpr (tiles) {
    state.SetLabel("AMX TDPBF16PS, 2 x 2 tiles of 16 x 16");
  } else {
    constexpr int regs = kfa::backends::host::wide_blocks ? 4 : 2;
    state.SetLabel("VDPBF16PS MR=" + std::to_string(kfa::backends::host::micro_rows(regs)) +
                   " NR=" + std::to_string(regs * 16));
  }
}
#endif

#ifdef KFA_BENCH_HAVE_OPENBLAS
/// OpenBLAS cblas_?gemm, row-major, A transposed when it is stored column-major.
template <class T>
void BM_openblas(benchmark::State& state, Product product, Placement placement, int br, int bc,
                 int d) {
  const Problem<T> pr(product, placement, br, bc, d);
  const CBLAS_TRANSPOSE ta = pr.a_col_major ? CblasTrans : CblasNoTrans;
  const T beta = pr.accumulate ? T(1) : T(0);
  run_checked(state, pr, [&] {
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, pr.m, pr.n, pr.k, 1.0f, pr.a.data(), pr.lda,
                  pr.b.data(), pr.ldb, beta, pr.c.data(), pr.ldc);
    else
      cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, pr.m, pr.n, pr.k, 1.0, pr.a.data(), pr.lda,
                  pr.b.data(), pr.ldb, beta, pr.c.data(), pr.ldc);
  });
}
#endif

#ifdef KFA_BENCH_HAVE_LIBXSMM
/// libxsmm's JIT kernel, dispatched once outside the timed loop. libxsmm is column-major: the
/// row-major C = A B is the column-major C^T = B^T A^T, so B goes first (no transpose: row-major
/// B is column-major B^T) and A second, transposed when A is stored column-major.
template <class T>
void BM_libxsmm(benchmark::State& state, Product product, Placement placement, int br, int bc,
                int d) {
  const Problem<T> pr(product, placement, br, bc, d);
  const libxsmm_blasint m = pr.n, n = pr.m, k = pr.k, lda = pr.ldb, ldb = pr.lda, ldc = pr.ldc;
  const T alpha = 1, beta = pr.accumulate ? T(1) : T(0);
  const int flags = pr.a_col_major ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  const int prefetch = LIBXSMM_PREFETCH_NONE;
  using Kernel =
      std::conditional_t<std::is_same_v<T, float>, libxsmm_smmfunction, libxsmm_dmmfunction>;
  Kernel kernel;
  if constexpr (std::is_same_v<T, float>)
    kernel = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  else
    kernel = libxsmm_dmmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  if (kernel == nullptr) {
    state.SkipWithError("libxsmm dispatch returned no kernel for this shape and flags");
    return;
  }
  run_checked(state, pr, [&] { kernel(pr.b.data(), pr.a.data(), pr.c.data()); });
  state.SetLabel(libxsmm_get_target_arch());
}
#endif

#ifdef KFA_BENCH_HAVE_DNNL
/// dnnl_sgemm: oneDNN's row-major BLAS-like entry point (float only in oneDNN 2.6).
void BM_dnnl_sgemm(benchmark::State& state, Product product, Placement placement, int br, int bc,
                   int d) {
  const Problem<float> pr(product, placement, br, bc, d);
  const char ta = pr.a_col_major ? 'T' : 'N';
  const float beta = pr.accumulate ? 1.0f : 0.0f;
  run_checked(state, pr, [&] {
    dnnl_sgemm(ta, 'N', pr.m, pr.n, pr.k, 1.0f, pr.a.data(), pr.lda, pr.b.data(), pr.ldb, beta,
               pr.c.data(), pr.ldc);
  });
}

/// Times one dnnl::matmul primitive on pr, created once outside the timed loop for src a_md
/// (at a), weights w_md and dst c_md (at c): the scale an output scale where it is not 1,
/// beta = 1 a sum post-op where pr accumulates. Each iteration is one execute on a CPU stream and
/// its wait, the argument map built once, the result checked first; the benchmark is labelled
/// with the implementation oneDNN chose. weights(pd, eng, strm) gives the weights' memory.
template <class Pr, class Weights>
void time_dnnl_matmul(benchmark::State& state, const Pr& pr, const dnnl::memory::desc& a_md,
                      void* a, const dnnl::memory::desc& w_md, const dnnl::memory::desc& c_md,
                      float* c, float scale, const Weights& weights) {
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    dnnl::primitive_attr attr;
    if (scale != 1.0f) attr.set_output_scales(0, {scale});
    if (pr.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng);
    const dnnl::matmul prim(pd);
    const std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(a_md, eng, a)},
                                                     {DNNL_ARG_WEIGHTS, weights(pd, eng, strm)},
                                                     {DNNL_ARG_DST, dnnl::memory(c_md, eng, c)}};
    run_checked(state, pr, [&] {
      prim.execute(strm, args);
      strm.wait();
    });
    state.SetLabel(pd.impl_info_str());
  } catch (const dnnl::error& e) {
    state.SkipWithError(e.what());
  }
}

/// A dnnl::matmul on float (time_dnnl_matmul), A's strides describing its storage. oneDNN 2.6
/// has no f64 data type, so float only.
void BM_dnnl_matmul(benchmark::State& state, Product product, Placement placement, int br, int bc,
                    int d) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const Problem<float> pr(product, placement, br, bc, d);
  const dnnl::memory::desc a_md(dims{pr.m, pr.k}, dt::f32, dims{pr.a_rs(), pr.a_cs()});
  const dnnl::memory::desc b_md(dims{pr.k, pr.n}, dt::f32, dims{pr.ldb, 1});
  const dnnl::memory::desc c_md(dims{pr.m, pr.n}, dt::f32, dims{pr.ldc, 1});
  time_dnnl_matmul(state, pr, a_md, pr.a.data(), b_md, c_md, pr.c.data(), 1.0f,
                   [&](const auto&, const dnnl::engine& eng, dnnl::stream&) {
                     return dnnl::memory(b_md, eng, pr.b.data());
                   });
}

/// A dnnl::matmul on bfloat16 src and weights with float dst (time_dnnl_matmul): src is A
/// (row-major, as kfa's). oneDNN takes no pair words: the weights are B in plain row-major
/// bfloat16 (dnnl_matmul_bf16: its natural layout, not the forward's, which the primitive must
/// rearrange for the tiles on every call), or, `packed` (dnnl_matmul_bf16_packed), in the layout
/// the primitive asks for (format any), reordered from the plain B once outside the timed loop:
/// the product alone, as where B is reused.
template <bool packed>
void BM_dnnl_matmul_bf16(benchmark::State& state, Product product, Placement placement, int br,
                         int bc, int d) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const Bf16Problem pr(product, placement, br, bc, d);
  const dnnl::memory::desc a_md(dims{pr.m, pr.k}, dt::bf16, dims{pr.k, 1});
  const dnnl::memory::desc plain_md(dims{pr.k, pr.n}, dt::bf16, dims{pr.n, 1});
  const dnnl::memory::desc b_md =
      packed ? dnnl::memory::desc(dims{pr.k, pr.n}, dt::bf16, dnnl::memory::format_tag::any)
             : plain_md;
  const dnnl::memory::desc c_md(dims{pr.m, pr.n}, dt::f32, dims{pr.ldc, 1});
  time_dnnl_matmul(
      state, pr, a_md, pr.a.data(), b_md, c_md, pr.c_float(), pr.scale,
      [&](const dnnl::matmul::primitive_desc& pd, const dnnl::engine& eng, dnnl::stream& strm) {
        dnnl::memory plain(plain_md, eng, pr.b_plain.data());
        if (!packed) return plain;
        dnnl::memory weights(pd.weights_desc(), eng);
        dnnl::reorder(plain, weights).execute(strm, plain, weights);
        strm.wait();
        return weights;
      });
}
#endif

// ---- AMX peak probe -------------------------------------------------------------------------

#ifdef KFA_HOST_AMX
/// The core's AMX peak for bfloat16 pairs: TDPBF16PS on four independent C tiles from A and B
/// tiles already loaded, 16 x 16 x 32 x 2 FLOPs each, inside a PairScope (the tiles'
/// configuration of the pair products). The ceiling the kfa_amx rates are read against.
void BM_amx_peak(benchmark::State& state) {
  if (!kfa::backends::host::amx::available()) {
    state.SkipWithError("no AMX tiles here (CPU, kernel or KFA_HOST_AMX=0)");
    return;
  }
  constexpr long steps = 1 << 12;
  alignas(64) std::uint16_t ones[16 * 32];
  for (auto& w : ones)
    w = 0x3f80;  // bfloat16 1
  const kfa::backends::host::amx::Scope scope(true);
  asm volatile("" ::: "memory");  // the stores above before the tile loads (amx.hpp)
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (auto _ : state)
    for (long s = 0; s < steps; ++s) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  state.counters["FLOP/s"] = flop_rate(4.0 * 16 * 16 * 32 * 2 * steps);
}

/// What a PairScope costs, opened and closed once per iteration on a thread with no tiles
/// configured: STTILECFG, LDTILECFG of the pair products' shapes, TILERELEASE (the forward opens
/// one per query tile's sweep).
void BM_amx_scope(benchmark::State& state) {
  if (!kfa::backends::host::amx::available()) {
    state.SkipWithError("no AMX tiles here (CPU, kernel or KFA_HOST_AMX=0)");
    return;
  }
  for (auto _ : state) {
    const kfa::backends::host::amx::Scope scope(true);
    benchmark::ClobberMemory();
  }
}
#endif

// ---- the online-softmax step ----------------------------------------------------------------

/// TileOps::col_softmax on an S^T tile (bc keys x br queries, row stride ldq = br + 8 floats),
/// as the key-major forward calls it after S^T = K_j Q_i^T: checked once against a double loop
/// (P, the new maxima and sums, the rescale factors), then timed one step per iteration on the
/// tile it left behind (P taken as the next scores: the same instructions whatever the values,
/// none of them -inf). Counter `scores/s`: br * bc per step.
void BM_col_softmax(benchmark::State& state, int br, int bc) {
  using Ops = kfa::backends::TileOps<Kokkos::DefaultHostExecutionSpace, float>;
  const int ldq = br + 8;
  std::vector<float> s(static_cast<std::size_t>(bc) * ldq), m(br), l(br), alpha(br);
  const auto score = [](std::size_t e, unsigned salt) {  // in [-8, 8)
    return static_cast<float>(8.0 * hash_value(e, salt));
  };
  for (std::size_t e = 0; e < s.size(); ++e)
    s[e] = score(e, 4);
  for (int c = 0; c < br; ++c) {
    m[c] = c % 3 == 0 ? -std::numeric_limits<float>::infinity() : score(c, 5);  // first tile or not
    l[c] = c % 3 == 0 ? 0.0f : 1.0f + static_cast<float>(c);
  }
  const std::vector<float> s0 = s, m0 = m, l0 = l;
  const int member = 0;
  Ops::col_softmax(member, s.data(), ldq, 0, bc, br, m.data(), l.data(), alpha.data());
  // Relative bound for P and alpha: x - m' (within 16 of each other here) and y = (x - m')
  // log2(e) (below 24 in size) are rounded to float, up to 2^-21 and 2^-20 absolute: under
  // 1.8 2^-20 in y, ln 2 times that (1.2e-6) relative in 2^y, and exp2's own 2 ulp on top:
  // under 1.5e-6, checked at 4e-6. l sums bc of them in float. `close` is false for NaN.
  const auto close = [](double x, double ref, double rel) {
    return std::abs(x - ref) <= rel * ref;
  };
  for (int c = 0; c < br; ++c) {
    double top = m0[c];
    for (int j = 0; j < bc; ++j)
      top = std::max(top, static_cast<double>(s0[static_cast<std::size_t>(j) * ldq + c]));
    const double a = std::exp(static_cast<double>(m0[c]) - top);
    double sum = a * l0[c];
    bool ok = m[c] == static_cast<float>(top) && close(alpha[c], a, 4e-6);
    for (int j = 0; j < bc; ++j) {
      const std::size_t e = static_cast<std::size_t>(j) * ldq + c;
      const double p = std::exp(static_cast<double>(s0[e]) - top);
      ok = ok && close(s[e], p, 4e-6);
      sum += p;
    }
    if (!ok || !close(l[c], sum, 1e-5)) {
      state.SkipWithError(
          ("col_softmax differs from the double loop at query " + std::to_string(c)).c_str());
      return;
    }
  }
  for (int j = 0; j < bc; ++j)  // the rows' padding past the br queries is not the step's
    for (int c = br; c < ldq; ++c)
      if (s[static_cast<std::size_t>(j) * ldq + c] != s0[static_cast<std::size_t>(j) * ldq + c]) {
        state.SkipWithError("col_softmax wrote past the tile's queries");
        return;
      }
  benchmark::DoNotOptimize(s.data());
  for (auto _ : state) {
    Ops::col_softmax(member, s.data(), ldq, 0, bc, br, m.data(), l.data(), alpha.data());
    benchmark::ClobberMemory();
  }
  state.counters["scores/s"] =
      benchmark::Counter(static_cast<double>(br) * bc * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// ---- registration and main ------------------------------------------------------------------

const char* name_of(Product p) {
  return p == Product::scores ? "scores" : "output";
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "double";
}

using BenchFn = void (*)(benchmark::State&, Product, Placement, int, int, int);

template <class T>
void register_all() {
  // The FMA peak of perf/fma_peak.hpp (the probe bench_attention runs) under this file's
  // names, in CPU time like the products here.
  benchmark::RegisterBenchmark((std::string("fma_peak/") + type_name<T>()).c_str(),
                               kfa_bench::BM_fma_peak<T>);
  std::vector<std::pair<const char*, BenchFn>> engines{{"kfa", BM_kfa<T, false>},
                                                       {"kfa_inline", BM_kfa<T, true>}};
#ifdef KFA_BENCH_HAVE_LIBXSMM
  engines.emplace_back("libxsmm", BM_libxsmm<T>);
#endif
#ifdef KFA_BENCH_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) {
    engines.emplace_back("dnnl_sgemm", BM_dnnl_sgemm);
    engines.emplace_back("dnnl_matmul", BM_dnnl_matmul);
  }
#endif
#ifdef KFA_BENCH_HAVE_OPENBLAS
  engines.emplace_back("openblas", BM_openblas<T>);
#endif
  const int bc = 64;
  for (Placement placement : {Placement::page, Placement::staggered})
    for (Product product : {Product::scores, Product::output})
      for (int d : {64, 128})
        for (int br : {64, 96, 128})
          for (const auto& [engine, fn] : engines) {
            std::ostringstream name;
            name << name_of(product) << '/' << type_name<T>() << "/Br:" << br << "/Bc:" << bc
                 << "/D:" << d << '/' << (placement == Placement::page ? "page" : "staggered")
                 << '/' << engine;
            benchmark::RegisterBenchmark(name.str().c_str(), fn, product, placement, br, bc, d);
          }
}

/// The bfloat16 products (Bf16Problem) at the host forward's tiles: Br = 64, Bc = 128 up to
/// D = 64 and 64 at D = 128 (host/traits.hpp), and the other Bc of each D.
void register_bf16() {
#ifdef KFA_HOST_AMX
  benchmark::RegisterBenchmark("amx_peak/bf16", BM_amx_peak);
  benchmark::RegisterBenchmark("amx_scope/bf16", BM_amx_scope);
#endif
  std::vector<std::pair<const char*, BenchFn>> engines;
#ifdef KFA_HOST_AMX
  engines.emplace_back("kfa_amx", BM_kfa_bf16x2<true>);
#endif
#ifdef KFA_HOST_AVX512_BF16
  engines.emplace_back("kfa_dpbf16", BM_kfa_bf16x2<false>);
#endif
#ifdef KFA_BENCH_HAVE_DNNL
  engines.emplace_back("dnnl_matmul_bf16", BM_dnnl_matmul_bf16<false>);
  engines.emplace_back("dnnl_matmul_bf16_packed", BM_dnnl_matmul_bf16<true>);
#endif
  const int br = 64;
  for (Placement placement : {Placement::page, Placement::staggered})
    for (Product product : {Product::scores, Product::output})
      for (int d : {64, 128})
        for (int bc : {64, 128})
          for (const auto& [engine, fn] : engines) {
            std::ostringstream name;
            name << name_of(product) << "/bf16/Br:" << br << "/Bc:" << bc << "/D:" << d << '/'
                 << (placement == Placement::page ? "page" : "staggered") << '/' << engine;
            benchmark::RegisterBenchmark(name.str().c_str(), fn, product, placement, br, bc, d);
          }
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    std::string absent;
#ifdef KFA_BENCH_HAVE_OPENBLAS
    openblas_set_num_threads(1);
    benchmark::AddCustomContext(
        "openblas", std::string(openblas_get_config()) + " core " + openblas_get_corename());
#else
    absent += "openblas ";
#endif
#ifdef KFA_BENCH_HAVE_LIBXSMM
    libxsmm_init();
    benchmark::AddCustomContext(
        "libxsmm", std::string(LIBXSMM_VERSION) + " target " + libxsmm_get_target_arch());
#else
    absent += "libxsmm ";
#endif
#ifdef KFA_BENCH_HAVE_DNNL
    {
      const dnnl_version_t* v = dnnl_version();
      std::ostringstream s;
      const char* omp = std::getenv("OMP_NUM_THREADS");
      s << v->major << '.' << v->minor << '.' << v->patch << " (" << v->hash << ") cpu_runtime "
        << v->cpu_runtime << (v->cpu_runtime == DNNL_RUNTIME_OMP ? " (OpenMP)" : "")
        << ", OMP_NUM_THREADS=" << (omp ? omp : "unset");
      benchmark::AddCustomContext("onednn", s.str());
    }
#else
    absent += "onednn ";
#endif
#ifndef KFA_HOST_AMX
    absent += "kfa_amx ";
#endif
#ifndef KFA_HOST_AVX512_BF16
    absent += "kfa_dpbf16 ";
#else
    benchmark::AddCustomContext("kfa_amx_tiles",
                                HostOps::bf16x2_tiles() ? "available" : "not available");
#endif
    benchmark::AddCustomContext("absent_engines", absent.empty() ? "none" : absent);
    benchmark::AddCustomContext("kfa_git_revision", KFA_GIT_REVISION);
    benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION));
    benchmark::AddCustomContext("kokkos_host_space", Kokkos::DefaultHostExecutionSpace::name());
    register_all<float>();
    register_all<double>();
    // The forward's query tiles (96 rows without AVX-512, 64 with, 192 for long keys) against
    // its key tiles (128 keys up to D = 64, 64 up to 128: host/traits.hpp).
    for (int br : {64, 96, 192})
      for (int bc : {64, 128})
        benchmark::RegisterBenchmark(
            ("softmax/float/Br:" + std::to_string(br) + "/Bc:" + std::to_string(bc)).c_str(),
            BM_col_softmax, br, bc);
    register_bf16();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
#ifdef KFA_BENCH_HAVE_LIBXSMM
    libxsmm_finalize();
#endif
  }
  Kokkos::finalize();
  return 0;
}
