// Prints the I/O model of kfa/flops.hpp as a markdown table: the bytes kfa's forward and
// backward move between global memory and the chip, next to the unfused algorithm's (S and P
// written and read back: 4 e Nq Nk per head on top of the products' operands), for the host
// tiles of this build (TileTraits of the default host space, backends/host/traits.hpp: the
// forward's rows follow the key count and the ISA) and the CUDA table's (head_dim 64: 32 x 32,
// backward 16; head_dim 128: 16 x 16, backward 8), float. No timing: the model only (the
// kernels' staging is checked against it in tests/test_counters.cpp).
#include <kfa/backends/traits.hpp>
#include <kfa/flops.hpp>

#include <cstdio>
#include <string>

namespace {

/// The unfused forward, per (batch, head): S = Q K^T (Q and K read, S written), P = softmax(S)
/// (S read, P written), O = P V (P and V read, O written); masks do not change it.
double unfused_forward_bytes(int n, int d, int e) {
  return double(e) * (2.0 * n * d + 2.0 * n * d + 4.0 * double(n) * n);
}

struct Tiles {
  std::string name;
  int br, bc, bt;
};

/// The CUDA table's tiles for head_dim d (backends/cuda/traits.hpp).
Tiles cuda_tiles(int d) {
  return d == 64 ? Tiles{"CUDA 32x32", 32, 32, 16} : Tiles{"CUDA 16x16", 16, 16, 8};
}

/// The host tiles of this build for head_dim d and n keys.
Tiles host_tiles(int d, int n) {
  using Traits = kfa::backends::TileTraits<Kokkos::DefaultHostExecutionSpace, float>;
  const int br = Traits::block_q(d, n), bc = Traits::block_k(d);
  return {"host " + std::to_string(br) + "x" + std::to_string(bc), br, bc, Traits::block_bwd(d)};
}

}  // namespace

int main() {
  std::printf(
      "| tiles | D | N | causal | kfa fwd MiB | unfused fwd MiB | unfused / kfa | "
      "kfa bwd atomic MiB | kfa bwd query pass MiB | kfa bwd symmetric MiB |\n");
  std::printf("|---|---:|---:|:---:|---:|---:|---:|---:|---:|---:|\n");
  const double mib = 1024.0 * 1024.0;
  for (int d : {64, 128}) {
    for (bool host : {true, false})
      for (int n : {1024, 4096, 16384}) {
        const Tiles t = host ? host_tiles(d, n) : cuda_tiles(d);
        for (bool causal : {false, true}) {
          kfa::Params p;
          p.causal = causal;
          const double fwd = kfa::forward_traffic(1, 1, n, n, d, 4, 4, p, t.br, t.bc).total();
          const double unf = unfused_forward_bytes(n, d, 4);
          const double atomic =
              kfa::backward_traffic(1, 1, 1, n, n, d, 4, 4, 4, p, t.bt, kfa::DqMode::atomic)
                  .total();
          const double pass =
              kfa::backward_traffic(1, 1, 1, n, n, d, 4, 4, 4, p, t.bt, kfa::DqMode::query_pass)
                  .total();
          const double sym =
              kfa::backward_traffic(1, 1, 1, n, n, d, 4, 4, 4, p, t.bt, kfa::DqMode::symmetric)
                  .total();
          std::printf("| %s | %d | %d | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f |\n",
                      t.name.c_str(), d, n, causal ? "yes" : "no", fwd / mib, unf / mib, unf / fwd,
                      atomic / mib, pass / mib, sym / mib);
        }
      }
  }
  return 0;
}
