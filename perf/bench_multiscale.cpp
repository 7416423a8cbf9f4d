// Google Benchmark of multi-scale attention (kfa::msa) beside softmax attention (kfa::forward,
// kfa::backward) on the same shapes: forward, and forward + backward. FLOPs in the softmax
// path's convention for both (kfa::forward_flops: 4 * D per visible pair forward, backward 2.5
// times that), so the GFLOP/s compare the same work. The multi-scale cases run without a mask
// tensor (M = 1) and with a dense (H, N, N) float decay mask gamma_h^|i-j|, the form retention
// models use (its reads are part of the cost; the mask itself is O(N^2) memory, the pass is
// not: rsum and O are O(N)).
#include <kfa/kfa.hpp>

#include <cmath>

#include "common.hpp"

namespace {

using kfa_bench::Exec;
using Mask = Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space>;

constexpr int kBatch = 1;

Mask decay_mask(int H, int N) {
  Mask m("mask", H, N, N);
  auto h = Kokkos::create_mirror_view(m);
  for (int hh = 0; hh < H; ++hh) {
    const double gamma = 0.5 + 0.499 * (hh + 1) / (H + 1.0);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < N; ++j)
        h(hh, i, j) = static_cast<float>(std::pow(gamma, std::abs(i - j)));
  }
  Kokkos::deep_copy(m, h);
  return m;
}

// range: H, N, D, causal, variant (0 softmax, 1 multi-scale without mask, 2 with the mask),
// backward (0 forward only, 1 forward + backward).
void BM_attention(benchmark::State& state) {
  const int H = state.range(0), N = state.range(1), D = state.range(2);
  const bool causal = state.range(3) != 0, bwd = state.range(5) != 0;
  const int variant = static_cast<int>(state.range(4));
  kfa::Params p;
  p.causal = causal;
  kfa::msa::Params mp;
  mp.causal = causal;
  mp.scale = 1.0 / std::sqrt(double(D));
  kfa_bench::Tensors<float> t(kBatch, H, N, D, bwd);
  const Mask mask = variant == 2 ? decay_mask(H, N) : Mask();
  const auto fwd = [&] {
    if (variant == 0)
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p);
    else if (variant == 1)
      kfa::msa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, mp);
    else
      kfa::msa::forward(Exec(), t.q, t.k, t.v, mask, t.o, t.lse, mp);
  };
  const auto back = [&] {
    if (variant == 0)
      kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
    else if (variant == 1)
      kfa::msa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, mp);
    else
      kfa::msa::backward(Exec(), t.q, t.k, t.v, mask, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, mp);
  };
  kfa_bench::time_iterations(state, [&] {
    fwd();
    if (bwd) back();
  });
  const double flops = kfa::forward_flops(kBatch, H, N, N, D, p) +
                       (bwd ? kfa::backward_flops(kBatch, H, N, N, D, p) : 0.0);
  state.counters["FLOP/s"] = kfa_bench::flop_rate(flops);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"H", "N", "D", "causal", "variant", "bwd"});
  for (int bwd : {0, 1})
    for (int causal : {0, 1})
      for (int variant : {0, 1, 2})
        b->Args({4, 4096, 64, causal, variant, bwd});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_attention)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
  return kfa_bench::run_main(argc, argv);
}
