// One pass of the unfused baseline (perf/unfused.hpp) on the benchmarks' hashed inputs, then
// exit: the process whose peak memory perf/compare_attention.py sets against kfa's (the kfa
// program with --random) and PyTorch's.
//
//   unfused_attention forward|forward-backward --random B,H,N,D [--causal]
//                     [--dtype float|double]
#include <cstdio>
#include <cstring>
#include <string>

#include "common.hpp"
#include "unfused.hpp"

namespace {

using kfa_bench::Exec;

template <class T>
void run(int B, int H, int N, int D, bool causal, bool backward) {
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;
  View4 q("q", B, H, N, D), k("k", B, H, N, D), v("v", B, H, N, D), o("o", B, H, N, D);
  Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space> lse("lse", B, H, N);
  kfa_bench::fill_hash(q, 1);
  kfa_bench::fill_hash(k, 2);
  kfa_bench::fill_hash(v, 3);
  kfa_bench::unfused::Attention<T, Exec> a(B, H, N, N, D, causal);
  Kokkos::Timer timer;
  a.forward(q, k, v, o, lse);
  if (backward) {
    View4 dout("do", B, H, N, D), dq("dq", B, H, N, D), dk("dk", B, H, N, D), dv("dv", B, H, N, D);
    kfa_bench::fill_hash(dout, 4);
    a.backward(q, k, v, o, dout, dq, dk, dv);
  }
  Kokkos::fence();
  std::printf("unfused %s B=%d H=%d N=%d D=%d%s: %.3f s, N x N buffers %.1f MiB\n",
              backward ? "forward-backward" : "forward", B, H, N, D, causal ? " causal" : "",
              timer.seconds(),
              double(kfa_bench::unfused::Attention<T>::matrix_bytes(B, H, N, N, backward)) /
                  double(1 << 20));
}

int usage() {
  std::fprintf(stderr,
               "usage: unfused_attention forward|forward-backward --random B,H,N,D [--causal] "
               "[--dtype float|double]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  int status = 0;
  {
    int B = 0, H = 0, N = 0, D = 0;
    bool causal = false, dbl = false, ok = argc >= 2;
    const bool backward = ok && std::strcmp(argv[1], "forward-backward") == 0;
    ok = ok && (backward || std::strcmp(argv[1], "forward") == 0);
    for (int a = 2; ok && a < argc; ++a) {
      const std::string flag = argv[a];
      if (flag == "--causal") {
        causal = true;
      } else if (flag == "--random" && a + 1 < argc) {
        ok = std::sscanf(argv[++a], "%d,%d,%d,%d", &B, &H, &N, &D) == 4;
      } else if (flag == "--dtype" && a + 1 < argc) {
        const std::string t = argv[++a];
        dbl = t == "double";
        ok = dbl || t == "float";
      } else {
        ok = false;
      }
    }
    if (!ok || B < 1 || H < 1 || N < 1 || D < 1)
      status = usage();
    else if (dbl)
      run<double>(B, H, N, D, causal, backward);
    else
      run<float>(B, H, N, D, causal, backward);
  }
  Kokkos::finalize();
  return status;
}
