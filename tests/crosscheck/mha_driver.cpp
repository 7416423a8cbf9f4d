// The torch cross-check's driver of kfa::nn::mha_forward / mha_backward (torch_mha.py): reads
// /x, /dy (B, L, d_model), /w_qkv, /w_o and, when present, /b_qkv, /b_o, /gamma, /beta from
// IN.h5 (float64 or float32, the type of /x), runs the block forward and backward on the
// default execution space and writes /y, /dx and the gradient of every weight (/dw_qkv, ...)
// to OUT.h5. The options are the arguments; a test tool, not a user program.
//
// usage: mha_driver IN.h5 OUT.h5 HEADS_Q HEADS_KV CAUSAL(0|1)
// (the biases and the residual layer norm are on when their datasets are in IN.h5)
#include <kfa/mha.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "h5io.hpp"

namespace {

using kfa_apps::Dataset;
using kfa_apps::DType;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

template <class V>
void upload(const V& v, const Dataset& d) {
  if (v.size() != d.size()) throw kfa::Error("driver: a dataset does not fit its weight");
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t e = 0; e < d.size(); ++e)
    h.data()[e] = static_cast<typename V::non_const_value_type>(d.data[e]);
  Kokkos::deep_copy(v, h);
}

template <class V>
Dataset download(const V& v, DType t) {
  Dataset d;
  for (unsigned r = 0; r < V::rank; ++r)
    d.dims.push_back(v.extent(r));
  d.dtype = t;
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  d.data.assign(h.data(), h.data() + h.size());
  return d;
}

template <class T>
void run(const kfa_apps::H5File& in, const std::string& out, const kfa::nn::MhaParams& p0) {
  const Dataset x = in.read("/x", 3), dy = in.read("/dy", 3);
  kfa::nn::MhaParams p = p0;
  p.qkv_bias = in.has("/b_qkv");
  p.out_bias = in.has("/b_o");
  p.residual_layer_norm = in.has("/gamma");
  const int B = x.dims[0], L = x.dims[1], d = x.dims[2];
  using Rows = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  Rows xv("x", B, L, d), dyv("dy", B, L, d), y("y", B, L, d), dx("dx", B, L, d);
  upload(xv, x);
  upload(dyv, dy);
  kfa::nn::MhaWeights<T, Mem> w("w", d, p), g("g", d, p);
  upload(w.w_qkv, in.read("/w_qkv", 2));
  upload(w.w_o, in.read("/w_o", 2));
  if (p.qkv_bias) upload(w.b_qkv, in.read("/b_qkv", 1));
  if (p.out_bias) upload(w.b_o, in.read("/b_o", 1));
  if (p.residual_layer_norm) {
    upload(w.gamma, in.read("/gamma", 1));
    upload(w.beta, in.read("/beta", 1));
  }
  kfa::nn::MhaSaved<T, Mem> saved;
  kfa::nn::mha_forward(Exec(), xv, w, y, saved, p);
  kfa::nn::mha_backward(Exec(), xv, w, saved, dyv, dx, g, p);
  Kokkos::fence();
  std::vector<Dataset> keep;
  std::vector<std::pair<std::string, const Dataset*>> outs;
  keep.reserve(8);
  const auto add = [&](const char* name, Dataset ds) {
    keep.push_back(std::move(ds));
    outs.emplace_back(name, &keep.back());
  };
  add("/y", download(y, x.dtype));
  add("/dx", download(dx, x.dtype));
  add("/dw_qkv", download(g.w_qkv, x.dtype));
  add("/dw_o", download(g.w_o, x.dtype));
  if (p.qkv_bias) add("/db_qkv", download(g.b_qkv, x.dtype));
  if (p.out_bias) add("/db_o", download(g.b_o, x.dtype));
  if (p.residual_layer_norm) {
    add("/dgamma", download(g.gamma, x.dtype));
    add("/dbeta", download(g.beta, x.dtype));
  }
  kfa_apps::write_atomic(out, outs);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: mha_driver IN.h5 OUT.h5 HEADS_Q HEADS_KV CAUSAL(0|1)\n");
    return 2;
  }
  Kokkos::ScopeGuard guard(argc, argv);
  try {
    kfa::nn::MhaParams p;
    p.heads_q = std::atoi(argv[3]);
    p.heads_kv = std::atoi(argv[4]);
    p.attention.causal = std::atoi(argv[5]) != 0;
    const kfa_apps::H5File in(argv[1]);
    if (in.header("/x", 3).dtype == DType::f64)
      run<double>(in, argv[2], p);
    else
      run<float>(in, argv[2], p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mha_driver: %s\n", e.what());
    return 2;
  }
  return 0;
}
