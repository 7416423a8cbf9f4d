// Google Benchmark of kfa::backward: the two ways to get dQ (atomic adds from the key-tile
// teams, or the deterministic query-outer recomputation) and forward + backward together.
// FLOPs in flash-attn's convention (PERF.md): backward = 2.5 x forward, visible pairs only.
#include <kfa/kfa.hpp>

#include "common.hpp"

namespace {

using kfa_bench::Exec;

struct Tensors {
  Kokkos::View<float****, Exec::memory_space> q, k, v, o, dout, dq, dk, dv;
  Kokkos::View<float***, Exec::memory_space> lse;
  Tensors(int B, int H, int N, int D)
      : q("q", B, H, N, D),
        k("k", B, H, N, D),
        v("v", B, H, N, D),
        o("o", B, H, N, D),
        dout("do", B, H, N, D),
        dq("dq", B, H, N, D),
        dk("dk", B, H, N, D),
        dv("dv", B, H, N, D),
        lse("lse", B, H, N) {
    kfa_bench::fill_hash(q, 1);
    kfa_bench::fill_hash(k, 2);
    kfa_bench::fill_hash(v, 3);
    kfa_bench::fill_hash(dout, 4);
  }
};

constexpr int kBatch = 1, kHeads = 2;

void BM_backward(benchmark::State& state) {
  const int N = state.range(0), D = state.range(1);
  kfa::Params p;
  p.causal = state.range(2) != 0;
  p.deterministic = state.range(3) != 0;
  Tensors t(kBatch, kHeads, N, D);
  kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
  kfa_bench::time_iterations(state, [&] {
    kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
  });
  state.counters["FLOP/s"] = kfa_bench::flop_rate(kfa::backward_flops(kBatch, kHeads, N, N, D, p));
}

void BM_forward_backward(benchmark::State& state) {
  const int N = state.range(0), D = state.range(1);
  kfa::Params p;
  p.causal = state.range(2) != 0;
  p.deterministic = state.range(3) != 0;
  Tensors t(kBatch, kHeads, N, D);
  kfa_bench::time_iterations(state, [&] {
    kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
    kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
  });
  state.counters["FLOP/s"] =
      kfa_bench::flop_rate(3.5 * kfa::forward_flops(kBatch, kHeads, N, N, D, p));
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "D", "causal", "deterministic"})
      ->ArgsProduct({{1024, 2048, 4096, 8192}, {64, 128}, {0, 1}, {0, 1}})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_backward)->Apply(shapes);
BENCHMARK(BM_forward_backward)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
  return kfa_bench::run_main(argc, argv);
}
