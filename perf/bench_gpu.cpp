// The GPU comparison's kfa side: the shapes of the FlashAttention papers' benchmarks, 16k tokens
// and 16 heads at every N (batch = tokens / N), N = 1024 ... 16384, D = 64 and 128, causal and
// not; forward, backward (alone, after one untimed forward) and forward + backward; float, and
// bf16 and half where Kokkos makes them 16-bit types (kfa::backends::is_narrow_float: CUDA,
// HIP and SYCL builds; a host-only Kokkos defines both as float, and those cases are left
// out). The narrow types keep their LSE in float. perf/compare_gpu.py runs this and
// perf/torch_attention.py's SDPA on the same cases and writes the table.
//
// Names: BM_kfa_<pass><type>/B:b/H:h/N:n/D:d/causal:c with pass fwd, bwd or fwd_bwd and type
// float, bf16 or half; a FLOP/s counter in flash-attn's convention (kfa::forward_flops: visible
// pairs only; backward 2.5 x, forward + backward 3.5 x the forward), the count
// torch_attention.py uses for SDPA.
//
// Own flags, taken out before Kokkos and Google Benchmark see the rest:
//   --tokens=T      tokens per case (batch = max(1, T / N)), default 16384;
//   --heads=H       heads, default 16;
//   --n=N1,N2,...   sequence lengths, default 1024,2048,4096,8192,16384;
//   --d=D1,D2,...   head dims, default 64,128;
//   --dropout=P     dropout probability in [0, 1) for every case (seed 1), default 0: the
//                   same names, and the probability in the context (gpu_suite_dropout).
// Smaller values make a quick run on a CPU build; the names carry the B and H used.
//
// Needs Google Benchmark only (no Kokkos Kernels), so a CUDA build of kfa has it.
#include <kfa/backends/portability.hpp>
#include <kfa/kfa.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace {

using kfa_bench::Exec;

enum class Pass { forward, backward, forward_backward };

struct Shape {
  int tokens = 16384, heads = 16;
  std::vector<int> n = {1024, 2048, 4096, 8192, 16384}, d = {64, 128};
  double dropout = 0;
};

template <class T>
void run_case(benchmark::State& state, Pass pass, int B, int H, int N, int D, bool causal,
              double dropout) {
  kfa::Params p;
  p.causal = causal;
  p.dropout = dropout;
  p.seed = 1;
  kfa_bench::Tensors<T> t(B, H, N, D, pass != Pass::forward);
  const auto fwd = [&] { kfa::forward(Exec(), t.q, t.k, t.v, t.o, t.lse, p); };
  const auto bwd = [&] {
    kfa::backward(Exec(), t.q, t.k, t.v, t.o, t.lse, t.dout, t.dq, t.dk, t.dv, p);
  };
  if (pass == Pass::forward) {
    kfa_bench::time_iterations(state, fwd);
  } else if (pass == Pass::backward) {
    fwd();  // the backward reads the forward's o and lse
    kfa_bench::time_iterations(state, bwd);
  } else {
    kfa_bench::time_iterations(state, [&] {
      fwd();
      bwd();
    });
  }
  const double factor[] = {1.0, 2.5, 3.5};
  state.counters["FLOP/s"] =
      kfa_bench::flop_rate(factor[static_cast<int>(pass)] * kfa::forward_flops(B, H, N, N, D, p));
}

/// One case; a case kfa or Kokkos refuses (kfa::Error, an allocation that fails) is reported
/// as an error of that case instead of ending the run.
template <class T>
void BM_kfa(benchmark::State& state, Pass pass, int B, int H, int N, int D, bool causal,
            double dropout) {
  try {
    run_case<T>(state, pass, B, H, N, D, causal, dropout);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

template <class T>
void register_type(const char* type, const Shape& shape) {
  const std::pair<Pass, const char*> passes[] = {
      {Pass::forward, "fwd"}, {Pass::backward, "bwd"}, {Pass::forward_backward, "fwd_bwd"}};
  for (const auto& [pass, pass_name] : passes)
    for (int causal : {0, 1})
      for (int d : shape.d)
        for (int n : shape.n) {
          const int b = std::max(1, shape.tokens / n);
          const std::string name = std::string("BM_kfa_") + pass_name + "<" + type +
                                   ">/B:" + std::to_string(b) +
                                   "/H:" + std::to_string(shape.heads) + "/N:" + std::to_string(n) +
                                   "/D:" + std::to_string(d) + "/causal:" + std::to_string(causal);
          benchmark::RegisterBenchmark(name.c_str(), BM_kfa<T>, pass, b, shape.heads, n, d,
                                       causal != 0, shape.dropout)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
        }
}

/// Registers T's cases only where kfa takes T as a 16-bit type (inside a template, so the
/// discarded branch is never instantiated where the trait is false).
template <class T>
void register_narrow(const char* type, const Shape& shape) {
  if constexpr (kfa::backends::is_narrow_float<T>::value) register_type<T>(type, shape);
}

/// The positive integers of a comma-separated list.
std::vector<int> int_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p) break;
    if (v > 0) out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

/// Takes --tokens=, --heads=, --n=, --d= and --dropout= out of argv; exits with status 2 on a
/// dropout outside [0, 1).
Shape parse_shape(int& argc, char** argv) {
  Shape shape;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokens=", 9) == 0) {
      shape.tokens = std::atoi(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--heads=", 8) == 0) {
      shape.heads = std::atoi(argv[i] + 8);
    } else if (std::strncmp(argv[i], "--n=", 4) == 0) {
      shape.n = int_list(argv[i] + 4);
    } else if (std::strncmp(argv[i], "--d=", 4) == 0) {
      shape.d = int_list(argv[i] + 4);
    } else if (std::strncmp(argv[i], "--dropout=", 10) == 0) {
      char* end = nullptr;
      shape.dropout = std::strtod(argv[i] + 10, &end);
      if (end == argv[i] + 10 || *end != '\0' || !(shape.dropout >= 0 && shape.dropout < 1)) {
        std::fprintf(stderr, "bench_gpu: --dropout must be a number in [0, 1), got '%s'\n",
                     argv[i] + 10);
        std::exit(2);
      }
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[kept] = nullptr;  // argv[argc] stays the terminator Kokkos and Google Benchmark expect
  shape.tokens = std::max(1, shape.tokens);
  shape.heads = std::max(1, shape.heads);
  return shape;
}

}  // namespace

int main(int argc, char** argv) {
  const Shape shape = parse_shape(argc, argv);
  register_type<float>("float", shape);
#ifdef KOKKOS_BHALF_T_IS_FLOAT  // bhalf_t exists from Kokkos 3.6
  register_narrow<Kokkos::Experimental::bhalf_t>("bf16", shape);
#endif
#ifdef KOKKOS_HALF_T_IS_FLOAT
  register_narrow<Kokkos::Experimental::half_t>("half", shape);
#endif
  benchmark::AddCustomContext("gpu_suite_tokens", std::to_string(shape.tokens));
  benchmark::AddCustomContext("gpu_suite_heads", std::to_string(shape.heads));
  benchmark::AddCustomContext("gpu_suite_dropout", std::to_string(shape.dropout));
  return kfa_bench::run_main(argc, argv);
}
