#pragma once
// BM_fma_peak<float> and BM_fma_peak<double>: the core's fused multiply-add peak, measured in
// the same run as the attention cases. kfa's speed is judged by its GFLOP/s as a fraction of
// this peak (docs/performance.md): the figure a kernel can approach, where a BLAS's sgemm is
// only a peer and the vendor's nominal peak assumes a clock the core may not hold under load.
// Measuring it beside the kernels means turbo, thermal state and the load on the other cores
// affect both alike, so the ratio holds when the absolute figures move. Not so another process
// on the same core, which takes its time from one case and not another: the run needs the
// core to itself.
//
// The probe: 12 independent accumulators, each updated acc = acc * a + b by one FMA on the
// widest vector the compiler targets, kept in registers, the compiler kept from folding the
// loop by an empty asm. It counts 2 FLOPs per lane per FMA and reports "FLOP/s" like the
// attention cases. Registered by bench_attention, bench_forward and bench_backward, and by
// bench_tile_products as fma_peak/float and fma_peak/double (in CPU time, like its products).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <utility>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace kfa_bench {

// The widest vector the target has: 512-bit under AVX-512, 256-bit under AVX, else 128-bit.
#if defined(__AVX512F__)
inline constexpr std::size_t kFmaVectorBytes = 64;
#elif defined(__AVX__)
inline constexpr std::size_t kFmaVectorBytes = 32;
#else
inline constexpr std::size_t kFmaVectorBytes = 16;
#endif

/// A GCC/Clang vector of T filling kFmaVectorBytes.
template <class T>
struct FmaVector {
  using type [[gnu::vector_size(kFmaVectorBytes)]] = T;
};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__FMA__)
// acc * a + b as one fused instruction through the intrinsics: contracting a * b + c into an
// FMA is the compiler's choice (-ffp-contract), and the probe must not depend on it. Each
// FmaVector<T>::type is the intrinsics' own vector type (__m512 is float x 16 too), so
// overload resolution picks the width and type.
#if defined(__AVX512F__)
inline __m512 fma_step(__m512 acc, __m512 a, __m512 b) {
  return _mm512_fmadd_ps(acc, a, b);
}
inline __m512d fma_step(__m512d acc, __m512d a, __m512d b) {
  return _mm512_fmadd_pd(acc, a, b);
}
#endif
inline __m256 fma_step(__m256 acc, __m256 a, __m256 b) {
  return _mm256_fmadd_ps(acc, a, b);
}
inline __m256d fma_step(__m256d acc, __m256d a, __m256d b) {
  return _mm256_fmadd_pd(acc, a, b);
}
inline __m128 fma_step(__m128 acc, __m128 a, __m128 b) {
  return _mm_fmadd_ps(acc, a, b);
}
inline __m128d fma_step(__m128d acc, __m128d a, __m128d b) {
  return _mm_fmadd_pd(acc, a, b);
}
#else
// Elsewhere the expression, which GCC and Clang contract into an FMA by default (in C++) on
// targets that have one.
template <class V>
inline V fma_step(V acc, V a, V b) {
  return acc * a + b;
}
#endif

/// Keeps x in a vector register and makes its value unknown to the compiler, so the chain is
/// neither folded nor moved out of the loop, at no cost: the asm is empty.
template <class V>
inline void opaque(V& x) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("" : "+v"(x));
#elif defined(__aarch64__)
  asm volatile("" : "+w"(x));
#else
  // No register constraint for vectors known here: through memory, once per step. Slower than
  // the registers, so on such targets the probe reads below the peak.
  benchmark::DoNotOptimize(x);
#endif
}

/// The timed loop over the chains acc...: each a function parameter of its own, not an array
/// element, so that GCC keeps every one in a register (an array of them it leaves on the stack,
/// one load and store per FMA).
template <class V, class... Acc>
void fma_chains(benchmark::State& state, long steps, V a, V b, Acc... acc) {
  for (auto _ : state) {
    for (long s = 0; s < steps; ++s) {
      ((acc = fma_step(acc, a, b), opaque(acc)), ...);
    }
  }
}

template <class T, std::size_t... C>
void fma_peak(benchmark::State& state, std::index_sequence<C...>) {
  using V = typename FmaVector<T>::type;
  constexpr long kSteps = 1L << 16;  // FMAs per chain per benchmark iteration (~0.1 ms)
  constexpr std::size_t kChains = sizeof...(C), kLanes = sizeof(V) / sizeof(T);
  // acc converges to b / (1 - a) = 1e-3: no overflow and no subnormals, whose slow path would
  // measure something else.
  V a = V{} + T(0.999), b = V{} + T(1e-6);
  opaque(a);
  opaque(b);
  fma_chains(state, kSteps, a, b, (V{} + T(C))...);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * kLanes * kChains * kSteps,
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  state.counters["lanes"] = double(kLanes);
  state.counters["chains"] = double(kChains);
}

/// 12 chains: enough FMAs in flight to cover the FMA latency on every FMA pipe (4 cycles x 2
/// pipes on current x86 cores need 8), leaving room, and few enough for 16 vector registers.
template <class T>
void BM_fma_peak(benchmark::State& state) {
  fma_peak<T>(state, std::make_index_sequence<12>());
}

/// Registers BM_fma_peak<float> and BM_fma_peak<double> in wall-clock time, like the manual
/// times of the attention cases.
inline void register_fma_peak() {
  benchmark::RegisterBenchmark("BM_fma_peak<float>", BM_fma_peak<float>)->UseRealTime();
  benchmark::RegisterBenchmark("BM_fma_peak<double>", BM_fma_peak<double>)->UseRealTime();
}

}  // namespace kfa_bench
