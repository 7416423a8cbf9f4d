// Google Benchmark of the multi-head attention block (kfa::nn::mha_forward, mha_backward):
// forward, and forward + backward, at B = 1, L = 4096, d_model = 512, H = 8 (hd = 64), float,
// with and without the causal mask and the residual layer norm. FLOPs: the attention's in
// kfa's convention (kfa::forward_flops, backward 2.5 times) plus 2 m n k per gemm (QKV and
// output projections; twice that backward, for the weight and input gradients). The block's
// PyTorch counterpart is perf/torch_mha.py (perf/results/2026-11-25-mha.md).
#include <kfa/flops.hpp>
#include <kfa/mha.hpp>

#include <cmath>
#include <random>

#include "common.hpp"

namespace {

using kfa_bench::Exec;
using Mem = Exec::memory_space;
using Rows = Kokkos::View<float***, Kokkos::LayoutRight, Mem>;

template <class V>
void fill(const V& v, std::mt19937_64& gen, double amp) {
  auto h = Kokkos::create_mirror_view(v);
  std::uniform_real_distribution<float> dist(-amp, amp);
  for (std::size_t e = 0; e < h.span(); ++e)
    h.data()[e] = dist(gen);
  Kokkos::deep_copy(v, h);
}

// range: L, d_model, heads, causal, residual layer norm, backward (0 forward, 1 forward +
// backward).
void BM_mha(benchmark::State& state) {
  const int B = 1, L = state.range(0), d = state.range(1), H = state.range(2);
  const bool bwd = state.range(5) != 0;
  kfa::nn::MhaParams p;
  p.heads_q = p.heads_kv = H;
  p.attention.causal = state.range(3) != 0;
  p.residual_layer_norm = state.range(4) != 0;
  std::mt19937_64 gen(1);
  Rows x("x", B, L, d), y("y", B, L, d), dy("dy", B, L, d), dx("dx", B, L, d);
  fill(x, gen, 1);
  fill(dy, gen, 1);
  kfa::nn::MhaWeights<float, Mem> w("w", d, p), g("g", d, p);
  const double amp = 1 / std::sqrt(double(d));
  fill(w.w_qkv, gen, amp);
  fill(w.w_o, gen, amp);
  fill(w.b_qkv, gen, 0.5);
  fill(w.b_o, gen, 0.5);
  if (p.residual_layer_norm) {
    fill(w.gamma, gen, 1);
    fill(w.beta, gen, 0.5);
  }
  kfa::nn::MhaSaved<float, Mem> saved;
  kfa_bench::time_iterations(state, [&] {
    kfa::nn::mha_forward(Exec(), x, w, y, saved, p);
    if (bwd) kfa::nn::mha_backward(Exec(), x, w, saved, dy, dx, g, p);
  });
  const int hd = d / H;
  const double rows = double(B) * L,
               linear = 2 * rows * d * (3.0 * H * hd) + 2 * rows * (double(H) * hd) * d;
  const double flops = kfa::forward_flops(B, H, L, L, hd, p.attention) + linear +
                       (bwd ? kfa::backward_flops(B, H, L, L, hd, p.attention) + 2 * linear : 0);
  state.counters["FLOP/s"] = kfa_bench::flop_rate(flops);
  // The saved state: O(L) (qkv, o, z, lse, statistics), no (L, L) matrix.
  const double saved_bytes = 4.0 * (saved.qkv.size() + saved.o.size() + saved.z.size() +
                                    saved.lse.size() + saved.mean.size() + saved.rstd.size());
  state.counters["saved_MiB"] = saved_bytes / (1 << 20);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"L", "d", "H", "causal", "ln", "bwd"});
  for (int bwd : {0, 1})
    for (int causal : {0, 1})
      b->Args({4096, 512, 8, causal, 1, bwd});
  b->Args({4096, 512, 8, 0, 0, 0});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_mha)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
  return kfa_bench::run_main(argc, argv);
}
