// Google Benchmark of kfa::forward. Manual time: fence before and after each timed call.
// FLOPs follow flash-attn's convention (docs/performance.md): 4 * B * Hq * Nq * Nk * D for the
// forward, counting only the visible (query, key) pairs when a mask is on.
#include <kfa/kfa.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "fma_peak.hpp"

namespace {

using kfa_bench::Exec;

template <class T>
void BM_forward(benchmark::State& state) {
  const int B = 1, H = state.range(0), N = state.range(1), D = state.range(2);
  kfa::Params p;
  p.causal = state.range(3) != 0;
  kfa_bench::Tensors<T> t(B, H, N, D, false);
  kfa_bench::time_iterations(state, [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p); });
  state.counters["FLOP/s"] = kfa_bench::flop_rate(kfa::forward_flops(B, H, N, N, D, p));
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

// The cost of a score term on the forward, each against the same pass without one in the same
// benchmark: term 0 none, 1 ALiBi (kfa::masks::Alibi, the standard slopes), 2 a dense bias of
// one head broadcast over the heads (kfa::masks::Bias), 3 a boolean mask of one head, density
// 0.5, broadcast likewise (kfa::masks::Dense).
template <class T>
void BM_forward_term(benchmark::State& state) {
  const int B = 1, H = state.range(0), N = state.range(1), D = state.range(2);
  const auto term = state.range(4);
  kfa::Params p;
  p.causal = state.range(3) != 0;
  kfa_bench::Tensors<T> t(B, H, N, D, false);
  using Acc = typename decltype(t.lse)::value_type;
  Kokkos::View<Acc*, Exec::memory_space> slopes("slopes", H);
  auto hs = Kokkos::create_mirror_view(slopes);
  const auto standard = kfa::masks::alibi_slopes(H);
  for (int h = 0; h < H; ++h)
    hs(h) = static_cast<Acc>(standard[static_cast<std::size_t>(h)]);
  Kokkos::deep_copy(slopes, hs);
  const int nb = term == 2 ? N : 0, nm = term == 3 ? N : 0;  // allocated when used
  Kokkos::View<Acc****, Kokkos::LayoutRight, Exec::memory_space> bias("bias", 1, 1, nb, nb);
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Exec::memory_space> mask("mask", 1, 1, nm,
                                                                               nm);
  if (term == 2) kfa_bench::fill_hash(bias, 4);
  if (term == 3) {
    auto hm = Kokkos::create_mirror_view(mask);
    std::mt19937_64 gen(7);
    for (std::size_t e = 0; e < hm.span(); ++e)
      hm.data()[e] = static_cast<std::uint8_t>(gen() & 1U);
    Kokkos::deep_copy(mask, hm);
  }
  if (term == 0)
    kfa_bench::time_iterations(state, [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p); });
  else if (term == 1)
    kfa_bench::time_iterations(state, [&] {
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p, kfa::masks::Alibi{slopes});
    });
  else if (term == 2)
    kfa_bench::time_iterations(
        state, [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p, kfa::masks::Bias{bias}); });
  else
    kfa_bench::time_iterations(state, [&] {
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p, kfa::masks::Dense{mask});
    });
  state.counters["FLOP/s"] = kfa_bench::flop_rate(kfa::forward_flops(B, H, N, N, D, p));
}

BENCHMARK_TEMPLATE(BM_forward_term, float)
    ->ArgNames({"H", "N", "D", "causal", "term"})
    ->ArgsProduct({{4}, {2048, 4096}, {64}, {0, 1}, {0, 1, 2, 3}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_forward, float)->Apply(shapes);
BENCHMARK_TEMPLATE(BM_forward, double)->Apply(shapes);
// 16-bit storage on the host: bf16 on the pair products where the CPU has AVX-512 BF16 and they
// outrun FMA (host::bf16x2_pays; KFA_HOST_BF16_PAIRS forces it), else widened to float tiles
// as half always is.
BENCHMARK_TEMPLATE(BM_forward, kfa::bf16)->Apply(shapes);
BENCHMARK_TEMPLATE(BM_forward, kfa::half)->Apply(shapes);

// Decoding: a few queries against a long key/value cache (B = 1, H = 32, D = 128), unsplit,
// with the automatic split count (num_splits = 0) and with forced counts. The cache reaches
// 8 GiB at Nk = 262144. The H = 1 cases have fewer teams than a multi-threaded host has
// threads: the shape where splitting is meant to pay.
void BM_decode(benchmark::State& state) {
  const int B = 1, D = 128, H = state.range(0), Nq = state.range(1), Nk = state.range(2);
  kfa::Params p;
  p.num_splits = static_cast<int>(state.range(3));
  auto uninit = [](const char* label) {
    return Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing);
  };
  // LayoutRight: kfa needs a unit head_dim stride on every space.
  using View4 = Kokkos::View<float****, Kokkos::LayoutRight, Exec::memory_space>;
  View4 q("q", B, H, Nq, D), o("o", B, H, Nq, D), k(uninit("k"), B, H, Nk, D),
      v(uninit("v"), B, H, Nk, D);
  Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space> lse("lse", B, H, Nq);
  kfa_bench::fill_hash(q, 1);
  kfa_bench::fill_hash(k, 2);
  kfa_bench::fill_hash(v, 3);
  kfa_bench::time_iterations(state, [&] { kfa::forward(Exec(), q, k, v, o, lse, p); });
  state.counters["FLOP/s"] = kfa_bench::flop_rate(kfa::forward_flops(B, H, Nq, Nk, D, p));
  // K and V are read once per query tile: the bandwidth a decode step draws.
  state.counters["KV_B/s"] = benchmark::Counter(2.0 * B * H * double(Nk) * D * sizeof(float),
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1024);
}
BENCHMARK(BM_decode)
    ->ArgNames({"H", "Nq", "Nk", "splits"})
    ->ArgsProduct({{32}, {1, 16}, {4096, 16384, 65536, 262144}, {1, 0, 8, 32}})
    ->ArgsProduct({{1}, {1}, {65536, 262144}, {1, 0, 8, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Packed variable-length batches (kfa::varlen): 8 self-attention sequences of random lengths
// (fixed seed) summing to 16384, against the padded batch of 8 sequences of the longest length,
// the call a caller without varlen makes: as it is (padded = 1; every padding key visible) and
// with its padding keys hidden by key padding (padded = 2; the kernels skip the key tiles past
// each length, the padding query rows remain). FLOP/s counts each call's own visible pairs
// (the rate of the work it does); seq_FLOP/s counts the sequences' own pairs, the pairs every
// call must compute, so that it compares the calls per pair a user needs (the times compare
// them too).
std::vector<int> varlen_lengths() {
  std::mt19937_64 gen(2026);
  std::uniform_real_distribution<double> w(0.1, 1.0);
  std::vector<double> x(8);
  double sum = 0;
  for (double& e : x)
    sum += e = w(gen);
  std::vector<int> n(8);
  int total = 0;
  for (std::size_t s = 0; s + 1 < n.size(); ++s)
    total += n[s] = static_cast<int>(x[s] / sum * 16384);
  n.back() = 16384 - total;
  return n;
}

void BM_varlen(benchmark::State& state) {
  const int H = state.range(0), D = state.range(1);
  kfa::Params p;
  p.causal = state.range(2) != 0;
  const std::vector<int> n = varlen_lengths();
  const int B = static_cast<int>(n.size()), longest = *std::max_element(n.begin(), n.end());
  double flops = 0, needed = 0;  // the call's visible pairs, the sequences' own
  for (const int len : n)
    needed += kfa::forward_flops(1, H, len, len, D, p);
  if (state.range(3) == 1) {
    kfa_bench::Tensors<float> t(B, H, longest, D, false);
    kfa_bench::time_iterations(state, [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p); });
    flops = kfa::forward_flops(B, H, longest, longest, D, p);
  } else if (state.range(3) == 2) {
    kfa_bench::Tensors<float> t(B, H, longest, D, false);
    Kokkos::View<std::int32_t*, Exec::memory_space> lengths("lengths", n.size());
    auto hl = Kokkos::create_mirror_view(lengths);
    for (std::size_t s = 0; s < n.size(); ++s) {
      hl(s) = n[s];
      // Every row of the padded batch (padding rows too) sees the sequence's keys: causal
      // rows i < n[s] see i + 1 of them, rows past it all n[s].
      const double rows = longest, keys = n[s];
      const double pairs = p.causal ? keys * (keys + 1) / 2 + (rows - keys) * keys : rows * keys;
      flops += 4.0 * H * D * pairs;
    }
    Kokkos::deep_copy(lengths, hl);
    kfa_bench::time_iterations(state, [&] {
      kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p, kfa::masks::KeyPadding{lengths});
    });
  } else {
    using Packed = Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space>;
    Packed q("q", 16384, H, D), k("k", 16384, H, D), v("v", 16384, H, D), o("o", 16384, H, D);
    Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> lse("lse", H, 16384);
    kfa_bench::fill_hash(q, 1);
    kfa_bench::fill_hash(k, 2);
    kfa_bench::fill_hash(v, 3);
    Kokkos::View<std::int32_t*, Exec::memory_space> cu("cu", n.size() + 1);
    auto hc = Kokkos::create_mirror_view(cu);
    hc(0) = 0;
    for (std::size_t s = 0; s < n.size(); ++s) {
      hc(s + 1) = hc(s) + n[s];
      flops += kfa::forward_flops(1, H, n[s], n[s], D, p);
    }
    Kokkos::deep_copy(cu, hc);
    kfa_bench::time_iterations(state,
                               [&] { kfa::varlen::forward(Exec(), q, k, v, cu, cu, o, lse, p); });
  }
  state.counters["FLOP/s"] = kfa_bench::flop_rate(flops);
  state.counters["seq_FLOP/s"] = kfa_bench::flop_rate(needed);
  state.counters["longest"] = longest;
}
BENCHMARK(BM_varlen)
    ->ArgNames({"H", "D", "causal", "padded"})
    ->ArgsProduct({{2}, {64}, {0, 1}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  kfa_bench::register_fma_peak();
  return kfa_bench::run_main(argc, argv);
}
