// Google Benchmark of kfa::forward. Manual time: fence before and after each timed call.
// FLOPs follow flash-attn's convention (PERF.md): 4 * B * Hq * Nq * Nk * D for the forward,
// counting only the visible (query, key) pairs when a mask is on.
#include <kfa/kfa.hpp>

#include <benchmark/benchmark.h>
#include <Kokkos_Core.hpp>

#ifdef KFA_HAVE_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif

#include <chrono>
#include <random>
#include <sstream>

#ifndef KFA_GIT_REVISION
#define KFA_GIT_REVISION "unknown"
#endif

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

template <class T>
void BM_forward(benchmark::State& state) {
  const int B = 1, H = state.range(0), N = state.range(1), D = state.range(2);
  kfa::Params p;
  p.causal = state.range(3) != 0;
  Kokkos::View<T****, Exec::memory_space> q("q", B, H, N, D), k("k", B, H, N, D),
      v("v", B, H, N, D), o("o", B, H, N, D);
  Kokkos::View<float***, Exec::memory_space> lse("lse", B, H, N);
  {
    auto h = Kokkos::create_mirror_view(q);
    std::mt19937 gen(1);
    std::uniform_real_distribution<T> dist(-1, 1);
    for (auto* t : {&q, &k, &v}) {
      for (std::size_t e = 0; e < h.span(); ++e)
        h.data()[e] = dist(gen);
      Kokkos::deep_copy(*t, h);
    }
  }
  kfa::forward(Exec(), q, k, v, o, lse, p);  // warm-up
  Kokkos::fence();
  for (auto _ : state) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    kfa::forward(Exec(), q, k, v, o, lse, p);
    Kokkos::fence();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double flops = kfa::forward_flops(B, H, N, N, D, p);
  state.counters["FLOP/s"] = benchmark::Counter(
      flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["N"] = N;
  state.counters["D"] = D;
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"H", "N", "D", "causal"});
  for (int causal : {0, 1})
    for (int d : {64, 128})
      for (int n : {512, 1024, 2048, 4096})
        b->Args({4, n, d, causal});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_forward, float)->Apply(shapes);

#ifdef KFA_HAVE_KOKKOSKERNELS
// The machine's sgemm rate through Kokkos Kernels (a vendor BLAS where one is configured):
// the ceiling the forward's GFLOP/s are quoted against, measured in the same run.
void BM_sgemm(benchmark::State& state) {
  const int n = state.range(0);
  Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> a("a", n, n), b("b", n, n),
      c("c", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
  Kokkos::fence();
  for (auto _ : state) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_sgemm)->Arg(2048)->UseManualTime()->Unit(benchmark::kMillisecond);
#endif
BENCHMARK_TEMPLATE(BM_forward, double)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    std::ostringstream cfg;
    Kokkos::print_configuration(cfg);
    benchmark::AddCustomContext("kfa_git_revision", KFA_GIT_REVISION);
    benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION));
    benchmark::AddCustomContext("kokkos_execution_space", Exec::name());
    benchmark::AddCustomContext("kokkos_configuration", cfg.str());
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  return 0;
}
