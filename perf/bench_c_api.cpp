// Google Benchmark of the C interface's overhead: the same forward and backward (float,
// B = 1, H = 4, D = 64) called through kfa::forward / kfa::backward on Views and through
// kfa_forward_f32 / kfa_backward_f32 on the Views' memory (the Fortran module adds one call
// per pass to the C one). N = 4096 is the comparison the interface is held to; N = 16 makes
// the fixed cost of a call (the wrapping and the checks) visible on its own. Run with
// --benchmark_enable_random_interleaving and repetitions so the two interfaces alternate
// (perf/results/2026-11-25-c-api.md).
#include <kfa/kfa.h>
#include <kfa/kfa.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "common.hpp"

namespace {

using kfa_bench::Exec;

constexpr int kBatch = 1, kHeads = 4, kHeadDim = 64;
constexpr kfa_memory kMemory =
    std::is_same_v<Exec, Kokkos::DefaultHostExecutionSpace> ? KFA_MEMORY_HOST : KFA_MEMORY_DEVICE;

template <class View>
kfa_tensor tensor_of(const View& v) {
  const auto d = View::rank == 4 ? static_cast<std::int64_t>(v.extent(3)) : 0;
  return kfa_tensor_contiguous(v.data(), v.extent(0), v.extent(1), v.extent(2), d);
}

void ok(kfa_status s) {
  if (s != KFA_OK) {
    std::fprintf(stderr, "%s\n", kfa_last_error());
    std::abort();
  }
}

// range(0): N; range(1): 0 C++, 1 C; range(2): 0 forward, 1 backward; range(3): causal.
void BM_interface(benchmark::State& state) {
  const int N = state.range(0);
  const bool through_c = state.range(1) != 0, backward = state.range(2) != 0;
  kfa_params cp = kfa_params_default();
  cp.causal = static_cast<int>(state.range(3));
  kfa::Params p;
  p.causal = cp.causal != 0;
  kfa_bench::Tensors<float> t(kBatch, kHeads, N, kHeadDim, backward);
  const kfa_tensor q = tensor_of(t.q), k = tensor_of(t.k), v = tensor_of(t.v), o = tensor_of(t.o),
                   lse = tensor_of(t.lse), dout = tensor_of(t.dout), dq = tensor_of(t.dq),
                   dk = tensor_of(t.dk), dv = tensor_of(t.dv);
  if (backward) kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
  kfa_bench::time_iterations(state, [&] {
    if (!backward && through_c)
      ok(kfa_forward_f32(&q, &k, &v, &o, &lse, &cp, kMemory));
    else if (!backward)
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
    else if (through_c)
      ok(kfa_backward_f32(&q, &k, &v, &o, &lse, &dout, nullptr, &dq, &dk, &dv, &cp, kMemory));
    else
      kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
  });
  state.counters["FLOP/s"] =
      kfa_bench::flop_rate(backward ? kfa::backward_flops(kBatch, kHeads, N, N, kHeadDim, p)
                                    : kfa::forward_flops(kBatch, kHeads, N, N, kHeadDim, p));
}

BENCHMARK(BM_interface)
    ->ArgNames({"N", "c", "backward", "causal"})
    ->ArgsProduct({{16, 4096}, {0, 1}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  return kfa_bench::run_main(argc, argv);
}
