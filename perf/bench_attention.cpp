// kfa against the unfused baseline (perf/unfused.hpp: Kokkos Kernels gemm, softmax, gemm) in
// one run, so every figure has its partner measured beside it (docs/performance.md): forward,
// backward and forward + backward; float, double and bf16 (kfa only); causal and not; B = 1,
// H = 4, N = 512 ... 16384, D = 64 and 128. Names pair up as
// BM_kfa_<pass><T>/N:n/D:d/causal:c and BM_unfused_<pass><T>/N:n/D:d/causal:c, registered
// side by side so each pair also runs back to back. FLOPs in flash-attn's convention for both
// (visible pairs only; backward 2.5 x and forward + backward 3.5 x the forward), so GFLOP/s ratios
// are speed ratios.
//
// The backward cases time the backward alone after one untimed forward: kfa recomputes P from
// the LSE, the baseline reads the P its forward kept.
//
// The baseline holds B * H * N^2 values (twice that with the backward): cases whose buffers
// would pass KFA_BENCH_MEMORY_GIB (default 12) GiB are reported as skipped, not run.
//
// perf/compare_attention.py runs a chosen subset on one core, adds PyTorch and the peak memory
// of each, and writes the tables and plots of perf/results/.
#include <kfa/kfa.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "common.hpp"
#include "fma_peak.hpp"
#include "unfused.hpp"

namespace {

using kfa_bench::Exec;

constexpr int kBatch = 1, kHeads = 4;

enum class Pass { forward, backward, forward_backward };
enum class Impl { kfa, unfused };

/// The memory the baseline may take, from KFA_BENCH_MEMORY_GIB.
double memory_budget_bytes() {
  const char* env = std::getenv("KFA_BENCH_MEMORY_GIB");
  return (env && *env ? std::atof(env) : 12.0) * double(1 << 30);
}

/// Times the forward, the backward after one untimed forward, or both in turn.
template <class Fwd, class Bwd>
void time_pass(benchmark::State& state, Pass pass, const Fwd& fwd, const Bwd& bwd) {
  if (pass == Pass::forward) {
    kfa_bench::time_iterations(state, fwd);
  } else if (pass == Pass::backward) {
    fwd();
    kfa_bench::time_iterations(state, bwd);
  } else {
    kfa_bench::time_iterations(state, [&] {
      fwd();
      bwd();
    });
  }
}

template <class T>
void BM_attention(benchmark::State& state, Impl impl, Pass pass, int N, int D, bool causal) {
  kfa::Params p;
  p.causal = causal;
  const bool backward = pass != Pass::forward;
  constexpr bool narrow = kfa::backends::is_narrow_float<T>::value;
  if (narrow && impl == Impl::unfused) {
    state.SkipWithError("skipped: the unfused baseline (Kokkos Kernels gemm) has no 16-bit types");
    return;
  }
  if (impl == Impl::unfused) {
    const double need =
        kfa_bench::unfused::Attention<T>::matrix_bytes(kBatch, kHeads, N, N, backward);
    if (need > memory_budget_bytes()) {
      char why[96];
      std::snprintf(why, sizeof why, "skipped: N x N buffers need %.2f GiB > KFA_BENCH_MEMORY_GIB",
                    need / double(1 << 30));
      state.SkipWithError(why);
      return;
    }
  }
  kfa_bench::Tensors<T> t(kBatch, kHeads, N, D, backward);
  if (impl == Impl::kfa) {
    time_pass(
        state, pass, [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p); },
        [&] { kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p); });
  } else if constexpr (!narrow) {
    kfa_bench::unfused::Attention<T, Exec> a(kBatch, kHeads, N, N, D, causal);
    time_pass(
        state, pass, [&] { a.forward(t.q, t.k, t.v, t.o, t.lse); },
        [&] { a.backward(t.q, t.k, t.v, t.o, t.dout, t.dq, t.dk, t.dv); });
  }
  const double factor[] = {1.0, 2.5, 3.5};
  state.counters["FLOP/s"] = kfa_bench::flop_rate(factor[static_cast<int>(pass)] *
                                                  kfa::forward_flops(kBatch, kHeads, N, N, D, p));
}

template <class T>
void register_type(const char* type) {
  const std::pair<Pass, const char*> passes[] = {
      {Pass::forward, "fwd"}, {Pass::backward, "bwd"}, {Pass::forward_backward, "fwd_bwd"}};
  const std::pair<Impl, const char*> impls[] = {{Impl::kfa, "kfa"}, {Impl::unfused, "unfused"}};
  for (const auto& [pass, pass_name] : passes)
    for (int causal : {0, 1})
      for (int d : {64, 128})
        for (int n : {512, 1024, 2048, 4096, 8192, 16384})
          for (const auto& [impl, impl_name] : impls) {
            const std::string name = std::string("BM_") + impl_name + "_" + pass_name + "<" + type +
                                     ">/N:" + std::to_string(n) + "/D:" + std::to_string(d) +
                                     "/causal:" + std::to_string(causal);
            benchmark::RegisterBenchmark(name.c_str(), BM_attention<T>, impl, pass, n, d,
                                         causal != 0)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
          }
}

}  // namespace

int main(int argc, char** argv) {
  kfa_bench::register_fma_peak();
  register_type<float>("float");
  register_type<double>("double");
  register_type<kfa::bf16>("bf16");  // kfa only: the pair products where they pay (host/tile.hpp)
  return kfa_bench::run_main(argc, argv);
}
