// Google Benchmark of kfa::backward: the three ways to get dQ (argument dq: 0 atomic adds from
// the key-tile teams, 1 the query-outer recomputation, 2 the one-kernel symmetric pass),
// forward + backward together, and the cost of dropout (regenerating the Philox mask) in each
// pass.
// FLOPs in flash-attn's convention (docs/performance.md): backward = 2.5 x forward, visible pairs
// only.
#include <kfa/kfa.hpp>

#include "common.hpp"
#include "fma_peak.hpp"

namespace {

using kfa_bench::Exec;

constexpr int kBatch = 1, kHeads = 2;

kfa::DqMode dq_mode(std::int64_t arg) {
  return arg == 0   ? kfa::DqMode::atomic
         : arg == 1 ? kfa::DqMode::query_pass
                    : kfa::DqMode::symmetric;
}

void BM_backward(benchmark::State& state) {
  const int N = state.range(0), D = state.range(1);
  kfa::Params p;
  p.causal = state.range(2) != 0;
  p.dq_mode = dq_mode(state.range(3));
  kfa_bench::Tensors<float> t(kBatch, kHeads, N, D, true);
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
  p.dq_mode = dq_mode(state.range(3));
  kfa_bench::Tensors<float> t(kBatch, kHeads, N, D, true);
  kfa_bench::time_iterations(state, [&] {
    kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
    kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
  });
  state.counters["FLOP/s"] =
      kfa_bench::flop_rate(3.5 * kfa::forward_flops(kBatch, kHeads, N, N, D, p));
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "D", "causal", "dq"})
      ->ArgsProduct({{1024, 2048, 4096, 8192}, {64, 128}, {0, 1}, {0, 1, 2}})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_backward)->Apply(shapes);
BENCHMARK(BM_forward_backward)->Apply(shapes);

// Forward (pass 0) or backward (pass 1) with dropout p = percent / 100, side by side with
// p = 0 in one run: the price of one Philox4x32-10 call per four visible scores.
void BM_dropout(benchmark::State& state) {
  const int N = state.range(0), D = state.range(1);
  const bool backward = state.range(2) != 0;
  kfa::Params p;
  p.dropout = state.range(3) / 100.0;
  p.seed = 42;
  kfa_bench::Tensors<float> t(kBatch, kHeads, N, D, true);
  kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
  kfa_bench::time_iterations(state, [&] {
    if (backward)
      kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
    else
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
  });
  const double flops = kfa::forward_flops(kBatch, kHeads, N, N, D, p);
  state.counters["FLOP/s"] = kfa_bench::flop_rate(backward ? 2.5 * flops : flops);
}
BENCHMARK(BM_dropout)
    ->ArgNames({"N", "D", "backward", "percent"})
    ->ArgsProduct({{2048, 4096}, {64, 128}, {0, 1}, {0, 10}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  kfa_bench::register_fma_peak();
  return kfa_bench::run_main(argc, argv);
}
