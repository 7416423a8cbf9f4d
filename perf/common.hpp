#pragma once
// What the kfa benchmarks share: device-side input filling, a timed call between fences, the
// sgemm rate the GFLOP/s are quoted beside (a peer; the ceiling is the FMA peak of
// fma_peak.hpp, docs/performance.md), and the main that records the revision and the Kokkos
// configuration in the benchmark context.
#include <benchmark/benchmark.h>
#include <Kokkos_Core.hpp>

#ifdef KFA_HAVE_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#ifndef KFA_GIT_REVISION
#define KFA_GIT_REVISION "unknown"
#endif

namespace kfa_bench {

using Exec = Kokkos::DefaultExecutionSpace;

/// Fills a view with uniform values in [-1, 1) from a hash of the index, on the device: fast
/// for multi-GiB caches and identical on every backend. Types other than double (float, and the
/// 16-bit half_t and bhalf_t) are rounded from the float value.
template <class View>
void fill_hash(const View& t, unsigned salt) {
  using T = typename View::non_const_value_type;
  using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const std::size_t n = t.span();
  auto* p = t.data();
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::size_t>>(0, n),
      KOKKOS_LAMBDA(std::size_t e) {
        std::uint64_t x = (e + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ULL;
        x ^= x >> 29;
        p[e] = static_cast<T>(static_cast<Wide>(double(x >> 11) * 0x1.0p-52 - 1.0));
      });
  Kokkos::fence();
}

/// The tensors of one attention problem, (B, H, N, D) LayoutRight (kfa needs a unit
/// head_dim stride, which the default layout of a GPU space does not give), inputs filled by
/// fill_hash; dO and the gradients only when `backward`. The LSE is double for double and float
/// otherwise (kfa keeps a 16-bit type's LSE in float).
template <class T>
struct Tensors {
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;
  using Lse = std::conditional_t<std::is_same_v<T, double>, double, float>;
  View4 q, k, v, o, dout, dq, dk, dv;
  Kokkos::View<Lse***, Kokkos::LayoutRight, Exec::memory_space> lse;
  Tensors(int B, int H, int N, int D, bool backward)
      : q("q", B, H, N, D),
        k("k", B, H, N, D),
        v("v", B, H, N, D),
        o("o", B, H, N, D),
        lse("lse", B, H, N) {
    kfa_bench::fill_hash(q, 1);
    kfa_bench::fill_hash(k, 2);
    kfa_bench::fill_hash(v, 3);
    if (!backward) return;
    dout = View4("do", B, H, N, D);
    dq = View4("dq", B, H, N, D);
    dk = View4("dk", B, H, N, D);
    dv = View4("dv", B, H, N, D);
    kfa_bench::fill_hash(dout, 4);
  }
};

/// Runs call() once to warm up, then once per benchmark iteration between fences, reporting
/// the wall time of each as the manual iteration time.
template <class Call>
void time_iterations(benchmark::State& state, const Call& call) {
  call();
  Kokkos::fence();
  for (auto _ : state) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    Kokkos::fence();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

/// A FLOP/s counter for `flops` per iteration.
inline benchmark::Counter flop_rate(double flops) {
  return benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                            benchmark::Counter::kIs1000);
}

#ifdef KFA_HAVE_KOKKOSKERNELS
/// The machine's sgemm rate through Kokkos Kernels (a vendor BLAS where one is configured),
/// measured in the same run: what a BLAS reaches on this core, quoted beside the attention
/// GFLOP/s; their ceiling is BM_fma_peak (fma_peak.hpp).
inline void BM_sgemm(benchmark::State& state) {
  const int n = state.range(0);
  Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> a("a", n, n), b("b", n, n),
      c("c", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  time_iterations(state, [&] { KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c); });
  state.counters["FLOP/s"] = flop_rate(2.0 * n * n * n);
}
#endif

/// main() of a kfa benchmark: Kokkos around Google Benchmark, with the context recorded.
inline int run_main(int argc, char** argv) {
#ifdef KFA_HAVE_KOKKOSKERNELS
  benchmark::RegisterBenchmark("BM_sgemm", BM_sgemm)
      ->Arg(2048)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
#endif
  Kokkos::initialize(argc, argv);
  {
    std::ostringstream cfg;
    Kokkos::print_configuration(cfg);
    benchmark::AddCustomContext("kfa_git_revision", KFA_GIT_REVISION);
    benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION));
    benchmark::AddCustomContext("kokkos_execution_space", Exec::name());
    benchmark::AddCustomContext("kokkos_configuration", cfg.str());
#ifdef KFA_HOST_AVX512_BF16
    // The host bf16 forward's products (host::bf16x2_pays, on AMX tiles where
    // TileOps::bf16x2_tiles) and, from a fresh probe, the VDPBF16PS / FMA FLOP ratio that
    // decides them where neither KFA_HOST_BF16_PAIRS nor the tiles do.
    const bool tiles = kfa::backends::TileOps<Exec, kfa::bf16>::bf16x2_tiles();
    benchmark::AddCustomContext("kfa_host_bf16_products", !kfa::backends::host::bf16x2_pays()
                                                              ? "float (widened tiles)"
                                                          : tiles ? "pairs (AMX tiles)"
                                                                  : "pairs (VDPBF16PS)");
    benchmark::AddCustomContext("kfa_host_dpbf16_over_fma",
                                std::to_string(kfa::backends::host::dpbf16_over_fma()));
#endif
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  return 0;
}

}  // namespace kfa_bench
