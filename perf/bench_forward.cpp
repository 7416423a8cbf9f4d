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
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

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

// Decoding: a few queries against a long key/value cache (B = 1, H = 32, D = 128), unsplit,
// with the automatic split count (num_splits = 0) and with forced counts. Inputs are filled on
// the device by a hash: the cache reaches 8 GiB at Nk = 262144.
template <class View>
void fill_hash(const View& t, unsigned salt) {
  const std::size_t n = t.span();
  auto* p = t.data();
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::size_t>>(0, n),
      KOKKOS_LAMBDA(std::size_t e) {
        std::uint64_t x = (e + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ULL;
        x ^= x >> 29;
        p[e] = static_cast<typename View::value_type>(double(x >> 11) * 0x1.0p-52 - 1.0);
      });
}

void BM_decode(benchmark::State& state) {
  const int B = 1, H = 32, D = 128, Nq = state.range(0), Nk = state.range(1);
  kfa::Params p;
  p.num_splits = static_cast<int>(state.range(2));
  Kokkos::View<float****, Exec::memory_space> q("q", B, H, Nq, D), o("o", B, H, Nq, D);
  Kokkos::View<float****, Exec::memory_space> k(
      Kokkos::view_alloc(std::string("k"), Kokkos::WithoutInitializing), B, H, Nk, D),
      v(Kokkos::view_alloc(std::string("v"), Kokkos::WithoutInitializing), B, H, Nk, D);
  Kokkos::View<float***, Exec::memory_space> lse("lse", B, H, Nq);
  fill_hash(q, 1);
  fill_hash(k, 2);
  fill_hash(v, 3);
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
  state.counters["FLOP/s"] = benchmark::Counter(kfa::forward_flops(B, H, Nq, Nk, D, p),
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  // K and V are read once per query tile: the bandwidth a decode step draws.
  state.counters["KV_B/s"] = benchmark::Counter(2.0 * B * H * double(Nk) * D * sizeof(float),
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1024);
}
BENCHMARK(BM_decode)
    ->ArgNames({"Nq", "Nk", "splits"})
    ->ArgsProduct({{1, 16}, {4096, 16384, 65536, 262144}, {1, 0, 8, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

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
