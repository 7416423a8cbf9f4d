// kfa: command-line driver of the kfa library.
//
//   kfa forward  --in IN.h5 --out OUT.h5 [pass flags]        reads /q /k /v, writes /o /lse
//   kfa backward --in IN.h5 --out OUT.h5 [pass flags]
//                reads /q /k /v /o /lse /do (and /dlse when present), writes /dq /dk /dv
//   kfa forward|backward --random B,H,N,D [--heads-kv H] [--seqlen-k N] [--head-dim-v DV]
//               [--dtype float|double|bf16|half] [--data-seed S] [--repeat R] [--json]
//               [--check] [pass flags]
//   pass flags: one a field of kfa::Params (kfa::for_each_field: --causal, --align, --window-left,
//               --window-right, --scale, --softcap, --dropout, --seed, --offset, --splits
//               (forward), --deterministic (backward)) and --window LEFT,RIGHT for both windows
//   kfa forward|backward --multiscale ...: multi-scale attention (kfa::msa): forward reads /q /k
//               /v and /mask (heads_q, seqlen_q, seqlen_k) when present, writes /o /rsum;
//               backward reads /q /k /v [/mask] /o /rsum /do, writes /dq /dk /dv. --random draws
//               the decay mask M[h,i,j] = gamma_h^|i-j|, gamma_h spread over (0.5, 0.999).
//               --scale defaults to 1; --softcap and --dropout do not apply
//   kfa dropout-mask --shape B,H,NQ,NK --dropout P --seed N [--offset N] --out MASK.h5 [--json]
//                writes /keep (uint8, 1 = kept): the mask forward and backward apply
//   kfa layernorm forward|backward (--in IN.h5 --out OUT.h5 | --random ROWS,D) [--eps E]
//               [--unbiased] [--dtype ..] [--repeat R] [--json] [--check]: kfa::layer_norm;
//               forward reads /x (ROWS, D), /residual if present, /gamma /beta (D), writes /y
//               /mean /rstd; backward also reads /dy and writes /dx /dgamma /dbeta
//               (layernorm.cpp)
//   kfa mha forward|backward --heads H [--heads-kv HKV] [--residual-layernorm] [--eps E]
//               (--in IN.h5 --out OUT.h5 | --random B,L,DMODEL) [pass flags] ...: the attention
//               block of kfa::nn (mha.cpp; built with KFA_ENABLE_NN, else refused)
//   kfa --version: kfa's version and options, the Kokkos it was compiled with
// Score terms (kfa/masks.hpp, softmax passes): /alibi_slopes (heads_q) or --alibi (the standard
// slopes 2^(-8 (h + 1) / heads_q)) for ALiBi; /bias (batch or 1, heads_q or 1, seqlen_q,
// seqlen_k) for an additive bias, whose gradient the backward writes as /dbias; /mask (uint8,
// batch or 1, heads_q or 1, seqlen_q, seqlen_k; 0 hides the key) for a boolean mask and
// /key_lengths (integers, batch; key j of batch b visible iff j < length) for key padding.
// Under --multiscale /mask is the float weight tensor instead. One score term per pass.
// Varlen (kfa::varlen): /cu_seqlens_q and /cu_seqlens_k (integers, batch + 1 offsets) with
// packed /q (total_q, heads_q, D), /k /v (total_k, heads_kv, D); /o like /q, /lse (heads_q,
// total_q); ALiBi (/alibi_slopes or --alibi) within each sequence; no /bias, /mask or
// /key_lengths (a padded batch's tensors) and no --multiscale.
// backward --random times the backward alone: the forward it needs runs once, untimed.
// A backward from a file must be given the --dropout, --seed and --offset of its forward.
//
// Inputs are checked before any compute: file headers (shapes, int extents, the memory the run
// needs), NaN/Inf in /q /k /v /do (refused unless --allow-nonfinite), datasets no pass reads,
// OUT's folder and name; free space before writing.
//
// Exit status: 0 success; 1 when --check finds the tolerance rule broken; 2 bad input or usage
// (one line "kfa: error: ..." on stderr). The output file appears only when the run succeeds.
#include <kfa/kfa.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "h5io.hpp"
#include "layernorm.hpp"
#include "mha.hpp"
#include "report.hpp"
#include "terms.hpp"
#include "views.hpp"

namespace {

using kfa_apps::Dataset;
using kfa_apps::Dims;
using kfa_apps::DType;
using kfa_apps::InputError;
using kfa_apps::NamedCheck;
using kfa_apps::Verdict;
using Exec = Kokkos::DefaultExecutionSpace;

const char* kUsage =
    "usage: kfa forward|backward (--in IN.h5 --out OUT.h5 | --random B,H,N,D [--heads-kv H]\n"
    "                   [--seqlen-k N] [--head-dim-v DV] [--dtype float|double|bf16|half]\n"
    "                   [--data-seed S])\n"
    "                   [--repeat R] [--json] [--check] [--allow-nonfinite] [pass flags]\n"
    "       kfa forward|backward --multiscale ... (same flags): multi-scale attention\n"
    "       kfa dropout-mask --shape B,H,NQ,NK --dropout P --seed N [--offset N] --out MASK.h5\n"
    "                   [--json]\n"
    "       kfa layernorm forward|backward ...: layer norm (see kfa layernorm --help)\n"
    "       kfa mha forward|backward ...: the attention block (see kfa mha --help)\n"
    "       kfa --version\n"
    "  forward:  reads /q /k /v, writes /o /lse; /v (and /o, /do, /dv) may have a head dim\n"
    "            of its own (Dv), /q and /k share D\n"
    "  backward: reads /q /k /v /o /lse /do (and /dlse if present), writes /dq /dk /dv;\n"
    "            give it the --dropout, --seed and --offset of the forward\n"
    "  score terms: /alibi_slopes (heads_q) or --alibi (slopes 2^(-8 (h+1) / heads_q)) add\n"
    "            ALiBi, -slope_h |i + shift - j|; /bias (B or 1, H or 1, NQ, NK) adds a bias to\n"
    "            the scores and makes the backward write its gradient /dbias; /mask (uint8,\n"
    "            B or 1, H or 1, NQ, NK; 0 = hidden) hides keys, /key_lengths (integers, B)\n"
    "            hides keys j >= length of each batch; one score term per pass\n"
    "  varlen:   /cu_seqlens_q and /cu_seqlens_k (integers, B+1 offsets from 0 to the total)\n"
    "            with packed /q (TOTAL_Q, H, D), /k /v (TOTAL_K, HKV, D), /o like /q and /lse\n"
    "            /dlse (H, TOTAL_Q): each sequence its own attention (kfa::varlen); of the\n"
    "            score terms ALiBi only, from each sequence's own positions\n"
    "  --multiscale: O = (S V) / max(rowsum |S|, 1), S = scale (Q K^T) * M; forward reads\n"
    "            /q /k /v [/mask (H, NQ, NK)], writes /o /rsum; backward reads /q /k /v [/mask]\n"
    "            /o /rsum /do, writes /dq /dk /dv; --random uses the decay mask\n"
    "            M[h,i,j] = gamma_h^|i-j|, gamma_h spread over (0.5, 0.999); --scale defaults to "
    "1\n"
    "  dropout-mask: writes /keep (uint8, 1 = kept), the mask forward and backward apply\n"
    "  --data-seed S: seeds the inputs of --random (--seed is dropout's)\n"
    "  --dtype: the tensors' type; bf16 and half are kfa::bf16 and kfa::half (16-bit on every\n"
    "           build), lse float32. Files give their own type (float32, float64, bfloat16,\n"
    "           float16)\n"
    "  --random B,H,N,D: a random problem of batch B, H query heads, sequence length N and\n"
    "           head dimension D (--heads-kv: key/value heads, --seqlen-k: key length,\n"
    "           --head-dim-v: v's head dimension, D by default)\n"
    "  --check: compare with the float64 reference under the tolerance rule (exit 1 if broken)\n"
    "  --json: one JSON object of the run on the last line of stdout\n"
    "  --allow-nonfinite: run on inputs holding NaN or Inf (refused otherwise)\n"
    "  --version: kfa's version and options, the Kokkos it was compiled with\n"
    "  --kokkos-FLAG=VALUE: passed to Kokkos after a check (threads: --kokkos-threads=N on\n"
    "           Kokkos 3.4, --kokkos-num-threads=N from 3.7)\n"
    "exit status: 0 success, 1 --check failed, 2 bad input or usage (one line on stderr)\n"
    "pass flags:\n";

// ---- Command line -------------------------------------------------------------------------

struct Options : kfa_apps::RunOptions {
  std::vector<long long> shape;  // dropout-mask: B,H,NQ,NK
  bool layernorm = false;        // kfa layernorm forward|backward
  kfa_cli::LayerNormOptions ln;  // its own options
  bool alibi = false;            // forward/backward: ALiBi with the standard slopes
  bool mha = false;              // kfa mha forward|backward
  kfa_cli::MhaOptions mha_opts;  // its own options
};

// The fields of the list kfa dropout-mask reads.
bool mask_field(const kfa::Field& f) {
  for (const char* name : {"dropout", "seed", "offset"})
    if (std::string_view(f.name) == name) return true;
  return false;
}

// The flags kfa dropout-mask takes, as the usage writes them.
std::vector<std::string> mask_flags() {
  std::vector<std::string> flags{"--shape"};
  const kfa::Params p;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto&) {
    if (mask_field(f)) flags.emplace_back(f.flag);
  });
  flags.insert(flags.end(), {"--out", "--json"});
  return flags;
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc >= 2 && std::string_view(argv[1]) == "layernorm") {
    o.layernorm = true;
    kfa_cli::parse_layer_norm(argc, argv, o, o.ln);
    return o;
  }
  if (argc >= 2 && std::string_view(argv[1]) == "mha") {
#ifdef KFA_CLI_NN
    o.mha = true;
    kfa_cli::parse_mha(argc, argv, o, o.mha_opts);
    return o;
#else
    throw InputError(
        "kfa mha is not built: this kfa was configured without KFA_ENABLE_NN (kfa::nn, which "
        "needs Kokkos Kernels)");
#endif
  }
  const auto own = [&](const std::string& flag, const kfa_apps::FlagValue& value) {
    const bool mask_cmd = o.command == "dropout-mask";
    if (mask_cmd) {
      const auto flags = mask_flags();
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) {
        std::string list;
        for (const std::string& f : flags)
          list += (list.empty() ? "" : ", ") + f;
        throw InputError("'" + flag + "' does not apply to dropout-mask (it takes " + list + ")");
      }
    }
    if (flag == "--alibi") {
      if (mask_cmd) throw InputError("--alibi applies to forward and backward only");
      o.alibi = true;
      return true;
    }
    if (flag != "--shape") return false;
    if (!mask_cmd) throw InputError("--shape applies to dropout-mask only");
    o.shape = kfa_apps::parse_dims(flag, value(), "B,H,NQ,NK",
                                   {"batch", "heads", "seqlen_q", "seqlen_k"});
    return true;
  };
  kfa_apps::parse_command_line(argc, argv, "kfa", {"forward", "backward", "dropout-mask"}, own, o);
  if (o.action != kfa_apps::Action::run) return o;
  if (o.command == "dropout-mask") {
    if (o.shape.empty()) throw InputError("dropout-mask needs --shape B,H,NQ,NK");
    if (o.out.empty()) throw InputError("dropout-mask needs --out MASK.h5");
    kfa_apps::check_output_path(o.out);
    kfa_apps::check_dropout_seed(o);
    return o;
  }
  kfa_apps::check_sources(o);
  if (o.multiscale && o.alibi) throw InputError("--alibi does not apply to --multiscale");
  kfa_apps::check_multiscale(o);
  return o;
}

// ---- The problem ----------------------------------------------------------------------------

struct Problem : kfa_apps::Terms {  // the score terms, and:
  Dataset q, k, v;
  Dataset o, lse, dout, dlse;  // backward from a file: the forward's outputs and the gradients
  Dataset mask;                // --multiscale: M, or empty (M = 1); lse then holds /rsum
  const char* stat = "/lse";   // the name of the forward's row statistic
  Dataset cu_q, cu_k;          // varlen: the offsets of the packed sequences (batch + 1)
};

void check_file_shapes(const Problem& p) {
  const char* names[] = {"batch", "heads", "seqlen", "head_dim"};
  for (const auto* d : {&p.q, &p.k, &p.v}) {
    const char* ds = d == &p.q ? "/q" : d == &p.k ? "/k" : "/v";
    for (int i = 0; i < 4; ++i)
      if (d->dims[i] == 0)
        throw InputError(std::string("dataset ") + ds + " has " + names[i] + " 0");
    if (d->dtype != p.q.dtype)
      throw InputError(std::string("dataset ") + ds + " is " + name(d->dtype) + " but /q is " +
                       name(p.q.dtype) + "; all inputs must share one type");
  }
}

// The backward's extra inputs: /o and /do of /q's (batch, heads, seqlen) and /v's head dim
// (both shapes named when not), of /q's type; /lse and /dlse (batch, heads, seqlen) of /q.
// The library checks /q against /k and /v.
void check_backward_shapes(const Problem& p) {
  const char* names[] = {"batch", "heads", "seqlen", "head_dim"};
  auto expect = [&](const Dataset& d, const char* ds, int rank) {
    for (int i = 0; i < rank; ++i)
      if (d.dims[i] != p.q.dims[i])
        throw InputError(std::string("dataset ") + ds + " has " + names[i] + " " +
                         std::to_string(d.dims[i]) + " but /q has " + std::to_string(p.q.dims[i]));
  };
  for (const auto& [d, ds] : {std::pair{&p.o, "/o"}, {&p.dout, "/do"}}) {
    expect(*d, ds, 3);
    if (d->dims[3] != p.v.dims[3])
      throw InputError(std::string("dataset ") + ds + " is " + kfa_apps::shape_of(d->dims) +
                       " but /v is " + kfa_apps::shape_of(p.v.dims) + ": its head_dim " +
                       std::to_string(d->dims[3]) + " must be /v's " + std::to_string(p.v.dims[3]));
  }
  expect(p.lse, p.stat, 3);
  if (!p.dlse.dims.empty()) expect(p.dlse, "/dlse", 3);
  for (const auto& [d, ds] : {std::pair{&p.o, "/o"}, {&p.dout, "/do"}})
    if (d->dtype != p.q.dtype)
      throw InputError(std::string("dataset ") + ds + " is " + name(d->dtype) + " but /q is " +
                       name(p.q.dtype) + "; all inputs must share one type");
}

Dataset random_tensor(std::vector<hsize_t> dims, DType t, std::mt19937_64& gen) {
  Dataset d;
  d.dims = std::move(dims);
  d.dtype = t;
  d.data.resize(d.size());
  std::uniform_real_distribution<double> dist(-1, 1);
  for (auto& x : d.data)
    x = kfa_apps::rounded(t, dist(gen));
  return d;
}

// Refuses a problem that cannot fit in this machine's memory before allocating anything.
void check_memory(DType dtype, double q_elems, double kv_elems, double head_dim, bool backward,
                  const std::string& what) {
  const double elem = double(kfa_apps::element_bytes(dtype));
  // q, o, k, v in the kernel's type plus the double copies the program keeps, and the LSE;
  // the backward adds dout, dq, dk, dv.
  const double tensors = backward ? 4 * q_elems + 4 * kv_elems : 2 * q_elems + 2 * kv_elems;
  kfa_apps::require_memory(tensors * (elem + 8) + q_elems / head_dim * 24, what);
}

// The factor that counts /q's and /k's elements at the wider of their head dim and /v's, as
// --random counts every tensor: v, o, dout and dv have /v's head dim.
double wider_of(const Problem& p) {
  const double d = double(p.q.dims.back()), dv = double(p.v.dims.back());
  return dv > d ? dv / d : 1.0;
}

template <class T>
using DeviceTensor = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;

// The LSE of a pass on tensors of value type T: float or wider (kfa::backends::accum_t), and
// its type in a file.
template <class T>
using Lse = kfa::backends::accum_t<T>;
template <class T>
using DeviceLse = Kokkos::View<Lse<T>***, Kokkos::LayoutRight, Exec::memory_space>;
DType lse_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

template <class T>
DeviceTensor<T> to_device(const Dataset& d, const char* label) {
  return kfa_apps::dataset_to_view<DeviceTensor<T>>(d, label);
}

template <class T>
Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space> to_device3(const Dataset& d,
                                                                       const char* label) {
  return kfa_apps::dataset_to_view<Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>>(
      d, label);
}

kfa::reference::Tensor4 to_reference(const Dataset& d) {
  kfa::reference::Tensor4 t("kfa::ref", d.dims[0], d.dims[1], d.dims[2], d.dims[3]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

kfa::reference::Tensor3 to_reference3(const Dataset& d) {
  if (d.dims.empty()) return {};
  kfa::reference::Tensor3 t("kfa::ref", d.dims[0], d.dims[1], d.dims[2]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

template <class Q, class K, class V>
Dims dims_of(const Q& q, const K& k, const V& v) {
  return {static_cast<long long>(q.extent(0)), static_cast<long long>(q.extent(1)),
          static_cast<long long>(k.extent(1)), static_cast<long long>(q.extent(2)),
          static_cast<long long>(k.extent(2)), static_cast<long long>(q.extent(3)),
          static_cast<long long>(v.extent(3))};
}

// The dropout keep-mask of o.params for a problem of sizes d on the host, for the reference;
// empty without dropout.
kfa::reference::Keep4 keep_mask(const Options& o, const Dims& d) {
  if (!(o.params.dropout > 0)) return {};
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Exec::memory_space> keep(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::keep")), d.batch, d.heads_q,
      d.seqlen_q, d.seqlen_k);
  kfa::dropout_mask(Exec(), keep, o.params);
  kfa::reference::Keep4 h(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("keep")),
                          d.batch, d.heads_q, d.seqlen_q, d.seqlen_k);
  Kokkos::deep_copy(h, keep);
  return h;
}

// Prints the run's summary, and its JSON line under --json; returns the exit status.
// A varlen run gives its flops (summed over its sequences; d's seqlens are the totals).
int report(const Options& o, const Dims& d, DType t, const kfa_apps::Timing& tm,
           const std::optional<Verdict>& verdict, const char* written,
           std::optional<double> varlen_flops = std::nullopt) {
  const double flops = varlen_flops ? *varlen_flops : kfa_apps::pass_flops(o, d);
  const double gflops = flops / tm.median_s * 1e-9;
  const char* kind = o.multiscale ? "multiscale" : varlen_flops ? "varlen (Nq, Nk: totals)" : "";
  std::printf("%s\n", kfa_apps::describe("kfa", o, d, t, kind).c_str());
  std::printf("time: median %.6f s, min %.6f s over %lld run%s; %.2f GFLOP/s\n", tm.median_s,
              tm.min_s, o.repeat, o.repeat == 1 ? "" : "s", gflops);
  if (verdict) std::printf("%s\n", kfa_apps::summary("the float64 reference", *verdict).c_str());
  if (!o.out.empty()) std::printf("wrote %s to %s\n", written, o.out.c_str());
  if (o.json) {
    auto j = kfa_apps::pass_json(o, d, t)
                 .add("multiscale", o.multiscale)
                 .add("varlen", varlen_flops.has_value())
                 .figure("median_s", tm.median_s, 9)
                 .figure("min_s", tm.min_s, 9)
                 .figure("gflops", gflops, 6);
    kfa_apps::add_check(j, verdict);
    std::printf("%s\n", j.str().c_str());
  }
  return !verdict || verdict->ok() ? 0 : 1;
}

// The dataset as a device tensor; its host copy is released at once unless `keep` (the check
// reads it later): the program's peak memory stays near the device tensors' own.
template <class T>
DeviceTensor<T> upload(Dataset& d, const char* label, bool keep) {
  auto v = to_device<T>(d, label);
  if (!keep) std::vector<double>().swap(d.data);
  return v;
}

// A pass's q, k and v on the device (see upload), and the problem's sizes.
template <class T>
struct Inputs {
  DeviceTensor<T> q, k, v;
  Dims d;
};

template <class T>
Inputs<T> upload_inputs(const Options& o, Problem& p) {
  Inputs<T> in{upload<T>(p.q, "kfa::q", o.check),
               upload<T>(p.k, "kfa::k", o.check),
               upload<T>(p.v, "kfa::v", o.check),
               {}};
  in.d = dims_of(in.q, in.k, in.v);
  return in;
}

// The score terms' device views hold the accumulation type (float, or double for double).
template <class T>
using DeviceBias = Kokkos::View<Lse<T>****, Kokkos::LayoutRight, Exec::memory_space>;

template <class T>
int run_forward(const Options& o, Problem& p) {
  const Inputs<T> in = upload_inputs<T>(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  const Dims& d = in.d;
  DeviceTensor<T> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::o")),
                      q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  DeviceLse<T> lse(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::lse")),
                   q.extent(0), q.extent(1), q.extent(2));

  kfa_apps::Timing tm;
  kfa_apps::with_term<Lse<T>>(p, {}, [&](const auto&... term) {
    tm = kfa_apps::time_pass(o.repeat,
                             [&] { kfa::forward(Exec(), q, k, v, out, lse, o.params, term...); });
  });

  // The outputs come back to the host only when something reads them.
  Dataset o_ds, lse_ds;
  if (o.check || !o.out.empty()) {
    o_ds = kfa_apps::view_to_dataset(out, o.dtype);
    lse_ds = kfa_apps::view_to_dataset(lse, lse_dtype(o.dtype));
  }

  std::optional<Verdict> verdict;
  if (o.check) {
    const auto c = kfa::reference::check_forward<T>(
        to_reference(p.q), to_reference(p.k), to_reference(p.v), o.params, to_reference(o_ds),
        to_reference3(lse_ds), keep_mask(o, d), kfa_apps::reference_terms(p));
    verdict = Verdict{{{"O", "o", c.o}, {"LSE", "lse", c.lse}}};
  }
  if (!o.out.empty()) kfa_apps::write_atomic(o.out, {{"/o", &o_ds}, {"/lse", &lse_ds}});
  return report(o, d, o.dtype, tm, verdict, "/o and /lse");
}

template <class T>
int run_backward(const Options& o, Problem& p) {
  const Inputs<T> in = upload_inputs<T>(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  const Dims& d = in.d;
  auto dout = upload<T>(p.dout, "kfa::do", o.check);
  DeviceTensor<T> out, dq, dk, dv;
  DeviceLse<T> lse, dlse;
  if (p.o.dims.empty()) {  // --random: the forward it needs, once and untimed
    out = DeviceTensor<T>(std::string("kfa::o"), d.batch, d.heads_q, d.seqlen_q, d.dv());
    lse = decltype(lse)(std::string("kfa::lse"), d.batch, d.heads_q, d.seqlen_q);
    kfa_apps::with_term<Lse<T>>(p, {}, [&](const auto&... term) {
      kfa::forward(Exec(), q, k, v, out, lse, o.params, term...);
    });
  } else {
    out = to_device<T>(p.o, "kfa::o");
    lse = to_device3<Lse<T>>(p.lse, "kfa::lse");
  }
  if (!p.dlse.dims.empty()) dlse = to_device3<Lse<T>>(p.dlse, "kfa::dlse");
  dq = DeviceTensor<T>(std::string("kfa::dq"), d.batch, d.heads_q, d.seqlen_q, d.head_dim);
  dk = DeviceTensor<T>(std::string("kfa::dk"), d.batch, d.heads_kv, d.seqlen_k, d.head_dim);
  dv = DeviceTensor<T>(std::string("kfa::dv"), d.batch, d.heads_kv, d.seqlen_k, d.dv());
  DeviceBias<T> dbias;  // the bias's gradient, shaped like it
  if (!p.bias.dims.empty())
    dbias = DeviceBias<T>(std::string("kfa::dbias"), p.bias.dims[0], p.bias.dims[1], p.bias.dims[2],
                          p.bias.dims[3]);
  kfa_apps::Timing tm;
  kfa_apps::with_term<Lse<T>>(p, dbias, [&](const auto&... term) {
    tm = kfa_apps::time_pass(o.repeat, [&] {
      if (dlse.size() > 0)
        kfa::backward(Exec(), q, k, v, out, lse, dout, dlse, dq, dk, dv, o.params, term...);
      else
        kfa::backward(Exec(), q, k, v, out, lse, dout, dq, dk, dv, o.params, term...);
    });
  });

  Dataset dq_ds, dk_ds, dv_ds, dbias_ds;
  if (o.check || !o.out.empty()) {
    dq_ds = kfa_apps::view_to_dataset(dq, o.dtype);
    dk_ds = kfa_apps::view_to_dataset(dk, o.dtype);
    dv_ds = kfa_apps::view_to_dataset(dv, o.dtype);
    if (dbias.size() > 0) dbias_ds = kfa_apps::view_to_dataset(dbias, lse_dtype(o.dtype));
  }
  std::optional<Verdict> verdict;
  if (o.check) {
    // Against the reference gradients of the reference forward: a file whose /o and /lse do
    // not come from q, k, v fails here rather than passing silently.
    const auto c = kfa::reference::check_backward<T>(
        to_reference(p.q), to_reference(p.k), to_reference(p.v), o.params, to_reference(p.dout),
        to_reference3(p.dlse), to_reference(dq_ds), to_reference(dk_ds), to_reference(dv_ds),
        keep_mask(o, d), kfa_apps::reference_terms(p));
    verdict = Verdict{{{"dQ", "dq", c.dq}, {"dK", "dk", c.dk}, {"dV", "dv", c.dv}}};
    if (dbias.size() > 0)
      verdict->checks.push_back(
          {"dbias", "dbias",
           kfa::reference::check_dbias<T>(to_reference(p.q), to_reference(p.k), to_reference(p.v),
                                          o.params, to_reference(p.dout), to_reference3(p.dlse),
                                          to_reference(dbias_ds), keep_mask(o, d),
                                          kfa_apps::reference_terms(p))});
  }
  if (!o.out.empty()) {
    std::vector<std::pair<std::string, const Dataset*>> w{
        {"/dq", &dq_ds}, {"/dk", &dk_ds}, {"/dv", &dv_ds}};
    if (dbias.size() > 0) w.emplace_back("/dbias", &dbias_ds);
    kfa_apps::write_atomic(o.out, w);
  }
  return report(o, d, o.dtype, tm, verdict,
                dbias.size() > 0 ? "/dq /dk /dv /dbias" : "/dq /dk /dv");
}

template <class T>
using DeviceMask = Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>;

kfa::reference::Mask3 to_reference_mask(const Dataset& d) {
  if (d.dims.empty()) return {};
  kfa::reference::Mask3 t("kfa::ref::mask", d.dims[0], d.dims[1], d.dims[2]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

template <class T>
int run_forward_msa(const Options& o, Problem& p) {
  const Inputs<T> in = upload_inputs<T>(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  const bool has_mask = !p.mask.dims.empty();
  const DeviceMask<T> mask =
      has_mask ? to_device3<T>(p.mask, "kfa::mask") : DeviceMask<T>("kfa::mask", 0, 0, 0);
  DeviceTensor<T> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::o")),
                      q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  DeviceLse<T> rsum(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::rsum")),
                    q.extent(0), q.extent(1), q.extent(2));
  const auto mp = kfa_apps::msa_params(o);
  const kfa_apps::Timing tm = kfa_apps::time_pass(o.repeat, [&] {
    if (has_mask)
      kfa::msa::forward(Exec(), q, k, v, mask, out, rsum, mp);
    else
      kfa::msa::forward(Exec(), q, k, v, out, rsum, mp);
  });
  Dataset o_ds, r_ds;
  if (o.check || !o.out.empty()) {
    o_ds = kfa_apps::view_to_dataset(out, o.dtype);
    r_ds = kfa_apps::view_to_dataset(rsum, lse_dtype(o.dtype));
  }
  std::optional<Verdict> verdict;
  if (o.check) {
    const auto c = kfa::reference::msa_check_forward<T>(
        to_reference(p.q), to_reference(p.k), to_reference(p.v), to_reference_mask(p.mask), mp,
        to_reference(o_ds), to_reference3(r_ds));
    verdict = Verdict{{{"O", "o", c.o}, {"rsum", "rsum", c.lse}}};
  }
  if (!o.out.empty()) kfa_apps::write_atomic(o.out, {{"/o", &o_ds}, {"/rsum", &r_ds}});
  return report(o, in.d, o.dtype, tm, verdict, "/o and /rsum");
}

template <class T>
int run_backward_msa(const Options& o, Problem& p) {
  const Inputs<T> in = upload_inputs<T>(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  const Dims& d = in.d;
  const bool has_mask = !p.mask.dims.empty();
  const DeviceMask<T> mask =
      has_mask ? to_device3<T>(p.mask, "kfa::mask") : DeviceMask<T>("kfa::mask", 0, 0, 0);
  auto dout = upload<T>(p.dout, "kfa::do", o.check);
  const auto mp = kfa_apps::msa_params(o);
  DeviceTensor<T> out;
  DeviceLse<T> rsum;
  if (p.o.dims.empty()) {  // --random: the forward it needs, once and untimed
    out = DeviceTensor<T>(std::string("kfa::o"), d.batch, d.heads_q, d.seqlen_q, d.dv());
    rsum = decltype(rsum)(std::string("kfa::rsum"), d.batch, d.heads_q, d.seqlen_q);
    if (has_mask)
      kfa::msa::forward(Exec(), q, k, v, mask, out, rsum, mp);
    else
      kfa::msa::forward(Exec(), q, k, v, out, rsum, mp);
  } else {
    out = to_device<T>(p.o, "kfa::o");
    rsum = to_device3<Lse<T>>(p.lse, "kfa::rsum");
  }
  DeviceTensor<T> dq(std::string("kfa::dq"), d.batch, d.heads_q, d.seqlen_q, d.head_dim),
      dk(std::string("kfa::dk"), d.batch, d.heads_kv, d.seqlen_k, d.head_dim),
      dv(std::string("kfa::dv"), d.batch, d.heads_kv, d.seqlen_k, d.dv());
  const kfa_apps::Timing tm = kfa_apps::time_pass(o.repeat, [&] {
    if (has_mask)
      kfa::msa::backward(Exec(), q, k, v, mask, out, rsum, dout, dq, dk, dv, mp);
    else
      kfa::msa::backward(Exec(), q, k, v, out, rsum, dout, dq, dk, dv, mp);
  });
  Dataset dq_ds, dk_ds, dv_ds;
  if (o.check || !o.out.empty()) {
    dq_ds = kfa_apps::view_to_dataset(dq, o.dtype);
    dk_ds = kfa_apps::view_to_dataset(dk, o.dtype);
    dv_ds = kfa_apps::view_to_dataset(dv, o.dtype);
  }
  std::optional<Verdict> verdict;
  if (o.check) {
    const auto c = kfa::reference::msa_check_backward<T>(
        to_reference(p.q), to_reference(p.k), to_reference(p.v), to_reference_mask(p.mask), mp,
        to_reference(p.dout), to_reference(dq_ds), to_reference(dk_ds), to_reference(dv_ds));
    verdict = Verdict{{{"dQ", "dq", c.dq}, {"dK", "dk", c.dk}, {"dV", "dv", c.dv}}};
  }
  if (!o.out.empty())
    kfa_apps::write_atomic(o.out, {{"/dq", &dq_ds}, {"/dk", &dk_ds}, {"/dv", &dv_ds}});
  return report(o, d, o.dtype, tm, verdict, "/dq /dk /dv");
}

// ---- Varlen: packed sequences (kfa::varlen) -------------------------------------------------

template <class T>
using DevicePacked = Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>;
template <class T>
using DeviceRows = Kokkos::View<Lse<T>**, Kokkos::LayoutRight, Exec::memory_space>;
using DeviceCu = Kokkos::View<std::int32_t*, Exec::memory_space>;

// Calls f() or f(kfa::masks::Alibi{slopes}) as the problem has ALiBi slopes or not: the one
// score term kfa::varlen takes.
template <class T, class F>
void with_alibi(const Problem& p, const F& f) {
  if (p.slopes.dims.empty()) return f();
  using Slopes = Kokkos::View<Lse<T>*, Kokkos::LayoutRight, Exec::memory_space>;
  f(kfa::masks::Alibi{kfa_apps::dataset_to_view<Slopes>(p.slopes, "kfa::alibi_slopes")});
}

std::vector<int> offsets_of(const Dataset& d) {
  return std::vector<int>(d.data.begin(), d.data.end());
}

DeviceCu cu_to_device(const Dataset& d, const char* label) {
  DeviceCu cu(std::string(label), d.data.size());
  auto h = Kokkos::create_mirror_view(cu);
  for (std::size_t s = 0; s < d.data.size(); ++s)
    h(s) = static_cast<std::int32_t>(d.data[s]);
  Kokkos::deep_copy(cu, h);
  return cu;
}

kfa::reference::Packed3 to_packed(const Dataset& d) {
  kfa::reference::Packed3 t("kfa::ref", d.dims[0], d.dims[1], d.dims[2]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

kfa::reference::Tensor2 to_rows(const Dataset& d) {
  if (d.dims.empty()) return {};
  kfa::reference::Tensor2 t("kfa::ref", d.dims[0], d.dims[1]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

// The sizes a varlen run reports (seqlens: the totals), its flops summed over the sequences,
// and the padded batch's sizes (longest lengths) that its dropout keep-mask has.
struct VarlenSizes {
  Dims d, padded;
  double flops = 0;
};

VarlenSizes varlen_sizes(const Options& o, const Problem& p) {
  VarlenSizes z;
  const auto cq = offsets_of(p.cu_q), ck = offsets_of(p.cu_k);
  const long long B = static_cast<long long>(cq.size()) - 1;
  const long long Hq = p.q.dims[1], Hk = p.k.dims[1], D = p.q.dims[2], Dv = p.v.dims[2];
  z.d = {B, Hq, Hk, static_cast<long long>(p.q.dims[0]), static_cast<long long>(p.k.dims[0]),
         D, Dv};
  z.padded = {B, Hq, Hk, 0, 0, D, Dv};
  const auto flops = o.pass() == kfa::Passes::backward ? kfa::backward_flops : kfa::forward_flops;
  for (long long s = 0; s < B; ++s) {
    const int nq = cq[s + 1] - cq[s], nk = ck[s + 1] - ck[s];
    z.padded.seqlen_q = std::max<long long>(z.padded.seqlen_q, nq);
    z.padded.seqlen_k = std::max<long long>(z.padded.seqlen_k, nk);
    z.flops += flops(1, int(Hq), nq, nk, int(D), o.params, int(Dv));
  }
  return z;
}

template <class T>
int run_forward_varlen(const Options& o, Problem& p) {
  const auto q = kfa_apps::dataset_to_view<DevicePacked<T>>(p.q, "kfa::q");
  const auto k = kfa_apps::dataset_to_view<DevicePacked<T>>(p.k, "kfa::k");
  const auto v = kfa_apps::dataset_to_view<DevicePacked<T>>(p.v, "kfa::v");
  const DeviceCu cq = cu_to_device(p.cu_q, "kfa::cu_seqlens_q"),
                 ck = cu_to_device(p.cu_k, "kfa::cu_seqlens_k");
  DevicePacked<T> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::o")),
                      q.extent(0), q.extent(1), v.extent(2));
  DeviceRows<T> lse(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::lse")),
                    q.extent(1), q.extent(0));
  kfa_apps::Timing tm;
  with_alibi<T>(p, [&](const auto&... term) {
    tm = kfa_apps::time_pass(o.repeat, [&] {
      kfa::varlen::forward(Exec(), q, k, v, cq, ck, out, lse, o.params, term...);
    });
  });
  const VarlenSizes z = varlen_sizes(o, p);
  Dataset o_ds, lse_ds;
  if (o.check || !o.out.empty()) {
    o_ds = kfa_apps::view_to_dataset(out, o.dtype);
    lse_ds = kfa_apps::view_to_dataset(lse, lse_dtype(o.dtype));
  }
  std::optional<Verdict> verdict;
  if (o.check) {
    const auto c = kfa::reference::varlen::check_forward<T>(
        to_packed(p.q), to_packed(p.k), to_packed(p.v), offsets_of(p.cu_q), offsets_of(p.cu_k),
        o.params, to_packed(o_ds), to_rows(lse_ds), keep_mask(o, z.padded), p.slopes.data);
    verdict = Verdict{{{"O", "o", c.o}, {"LSE", "lse", c.lse}}};
  }
  if (!o.out.empty()) kfa_apps::write_atomic(o.out, {{"/o", &o_ds}, {"/lse", &lse_ds}});
  return report(o, z.d, o.dtype, tm, verdict, "/o and /lse", z.flops);
}

template <class T>
int run_backward_varlen(const Options& o, Problem& p) {
  const auto q = kfa_apps::dataset_to_view<DevicePacked<T>>(p.q, "kfa::q");
  const auto k = kfa_apps::dataset_to_view<DevicePacked<T>>(p.k, "kfa::k");
  const auto v = kfa_apps::dataset_to_view<DevicePacked<T>>(p.v, "kfa::v");
  const auto out = kfa_apps::dataset_to_view<DevicePacked<T>>(p.o, "kfa::o");
  const auto dout = kfa_apps::dataset_to_view<DevicePacked<T>>(p.dout, "kfa::do");
  const auto lse = kfa_apps::dataset_to_view<DeviceRows<T>>(p.lse, "kfa::lse");
  const DeviceCu cq = cu_to_device(p.cu_q, "kfa::cu_seqlens_q"),
                 ck = cu_to_device(p.cu_k, "kfa::cu_seqlens_k");
  DeviceRows<T> dlse;
  if (!p.dlse.dims.empty()) dlse = kfa_apps::dataset_to_view<DeviceRows<T>>(p.dlse, "kfa::dlse");
  DevicePacked<T> dq(std::string("kfa::dq"), q.extent(0), q.extent(1), q.extent(2)),
      dk(std::string("kfa::dk"), k.extent(0), k.extent(1), k.extent(2)),
      dv(std::string("kfa::dv"), v.extent(0), v.extent(1), v.extent(2));
  kfa_apps::Timing tm;
  with_alibi<T>(p, [&](const auto&... term) {
    tm = kfa_apps::time_pass(o.repeat, [&] {
      if (dlse.size() > 0)
        kfa::varlen::backward(Exec(), q, k, v, out, lse, dout, dlse, cq, ck, dq, dk, dv, o.params,
                              term...);
      else
        kfa::varlen::backward(Exec(), q, k, v, out, lse, dout, cq, ck, dq, dk, dv, o.params,
                              term...);
    });
  });
  const VarlenSizes z = varlen_sizes(o, p);
  Dataset dq_ds, dk_ds, dv_ds;
  if (o.check || !o.out.empty()) {
    dq_ds = kfa_apps::view_to_dataset(dq, o.dtype);
    dk_ds = kfa_apps::view_to_dataset(dk, o.dtype);
    dv_ds = kfa_apps::view_to_dataset(dv, o.dtype);
  }
  std::optional<Verdict> verdict;
  if (o.check) {
    // Against the reference gradients of q, k, v, as the padded backward's --check.
    const auto c = kfa::reference::varlen::check_backward<T>(
        to_packed(p.q), to_packed(p.k), to_packed(p.v), offsets_of(p.cu_q), offsets_of(p.cu_k),
        o.params, to_packed(p.dout), to_rows(p.dlse), to_packed(dq_ds), to_packed(dk_ds),
        to_packed(dv_ds), keep_mask(o, z.padded), p.slopes.data);
    verdict = Verdict{{{"dQ", "dq", c.dq}, {"dK", "dk", c.dk}, {"dV", "dv", c.dv}}};
  }
  if (!o.out.empty())
    kfa_apps::write_atomic(o.out, {{"/dq", &dq_ds}, {"/dk", &dk_ds}, {"/dv", &dv_ds}});
  return report(o, z.d, o.dtype, tm, verdict, "/dq /dk /dv", z.flops);
}

// Reads a varlen problem: headers and their shapes first, then the data. The offsets' order
// and totals are the library's to check (kfa::Error before any kernel).
void read_varlen(Options& o, const kfa_apps::H5File& in, Problem& p) {
  const std::string file = " in '" + o.in + "'";
  for (const char* ds : {"/cu_seqlens_q", "/cu_seqlens_k"})
    if (!in.has(ds))
      throw InputError(std::string("dataset ") + ds + " is missing" + file +
                       "; a varlen problem needs /cu_seqlens_q and /cu_seqlens_k");
  if (o.multiscale) throw InputError("--multiscale does not take varlen (/cu_seqlens_q)" + file);
  for (const char* ds : {"/bias", "/mask", "/key_lengths"})
    if (in.has(ds))
      throw InputError(std::string("dataset ") + ds + file +
                       ": a varlen problem (/cu_seqlens_q) takes no " + ds +
                       " (a padded batch's tensor, with no packed layout); of the score terms it "
                       "takes ALiBi (/alibi_slopes or --alibi)");
  if (in.has("/alibi_slopes")) {
    if (o.alibi)
      throw InputError("--alibi and dataset /alibi_slopes" + file + " were both given; give one");
    p.slopes = in.header("/alibi_slopes", 1);
  }
  const bool bwd = o.command == "backward";
  p.q = in.header("/q", 3);
  p.k = in.header("/k", 3);
  p.v = in.header("/v", 3);
  kfa_apps::check_term_shapes(p, p.q.dims, p.k.dims);  // slopes: (heads_q), dims[1] of /q
  for (const auto& [d, ds] : {std::pair{&p.k, "/k"}, {&p.v, "/v"}})
    if (d->dtype != p.q.dtype)
      throw InputError(std::string("dataset ") + ds + " is " + name(d->dtype) + " but /q is " +
                       name(p.q.dtype) + "; all inputs must share one type");
  if (bwd) {
    p.o = in.header("/o", 3);
    p.dout = in.header("/do", 3);
    p.lse = in.header("/lse", 2);
    if (in.has("/dlse")) p.dlse = in.header("/dlse", 2);
    // (total_q, heads_q) of /q and /v's head dim.
    const std::vector<hsize_t> like_o{p.q.dims[0], p.q.dims[1], p.v.dims[2]};
    for (const auto& [d, ds] : {std::pair{&p.o, "/o"}, {&p.dout, "/do"}})
      if (d->dims != like_o || d->dtype != p.q.dtype)
        throw InputError(std::string("dataset ") + ds + " has shape " +
                         kfa_apps::shape_of(d->dims) + " (" + name(d->dtype) + ") but /q has " +
                         kfa_apps::shape_of(p.q.dims) + " and /v " + kfa_apps::shape_of(p.v.dims) +
                         " (" + name(p.q.dtype) + "): it must be (total_q, heads_q) of /q with " +
                         "/v's head dim");
    const std::vector<hsize_t> rows{p.q.dims[1], p.q.dims[0]};
    for (const auto& [d, ds] : {std::pair{&p.lse, "/lse"}, {&p.dlse, "/dlse"}})
      if (!d->dims.empty() && d->dims != rows)
        throw InputError(std::string("dataset ") + ds + " has shape " +
                         kfa_apps::shape_of(d->dims) + " but /q has shape " +
                         kfa_apps::shape_of(p.q.dims) + ": it must be (heads, total) of /q");
  }
  check_memory(p.q.dtype, double(p.q.size()) * wider_of(p), double(p.k.size()) * wider_of(p),
               double(p.q.dims[2]), bwd,
               "dataset /q " + kfa_apps::shape_of(p.q.dims) + " with /k " +
                   kfa_apps::shape_of(p.k.dims) + " (" + name(p.q.dtype) + ")" + file);
  for (auto [d, ds] : {std::pair{&p.cu_q, "/cu_seqlens_q"}, {&p.cu_k, "/cu_seqlens_k"}}) {
    *d = in.read_integers(ds, 1, false);
    for (std::size_t s = 0; s < d->data.size(); ++s)
      if (!(d->data[s] >= 0 && d->data[s] <= 2147483647.0))
        throw InputError(std::string("dataset ") + ds + " holds " +
                         std::to_string(static_cast<long long>(d->data[s])) + " at (" +
                         std::to_string(s) + "), outside int32's offsets [0, 2^31)");
  }
  p.q = in.read("/q", 3);
  p.k = in.read("/k", 3);
  p.v = in.read("/v", 3);
  if (bwd) {
    p.o = in.read("/o", 3);
    p.dout = in.read("/do", 3);
    p.lse = in.read("/lse", 2);
    if (in.has("/dlse")) p.dlse = in.read("/dlse", 2);
  }
  if (!p.slopes.dims.empty()) p.slopes = in.read("/alibi_slopes", 1);
  if (o.alibi) p.slopes = kfa_apps::standard_slopes(p.q.dims[1]);
  if (!o.allow_nonfinite)
    for (const auto& [d, ds] : {std::pair{&p.q, "/q"},
                                {&p.k, "/k"},
                                {&p.v, "/v"},
                                {&p.dout, "/do"},
                                {&p.slopes, "/alibi_slopes"}})
      kfa_apps::refuse_non_finite(*d, std::string("dataset ") + ds + file);
  o.dtype = p.q.dtype;
}

// kfa dropout-mask: the keep-mask of --dropout/--seed/--offset for --shape, as /keep.
int run_dropout_mask(const Options& o) {
  const long long B = o.shape[0], H = o.shape[1], Nq = o.shape[2], Nk = o.shape[3];
  for (long long n : o.shape)
    if (n > 2147483647LL)
      throw InputError("--shape values must fit in int, got " + std::to_string(n));
  // The mask on the device and its host copy (one buffer when they share memory).
  kfa_apps::require_memory(2.0 * double(B) * double(H) * double(Nq) * double(Nk), "the mask");
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Exec::memory_space> keep(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::keep")), B, H, Nq, Nk);
  kfa::dropout_mask(Exec(), keep, o.params);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), keep);
  Dataset d;
  d.dtype = DType::u8;
  d.dims = {hsize_t(B), hsize_t(H), hsize_t(Nq), hsize_t(Nk)};
  d.bytes.assign(h.data(), h.data() + h.span());
  std::size_t kept = 0;
  for (std::uint8_t x : d.bytes)
    kept += x;
  const double fraction = d.bytes.empty() ? 1.0 : double(kept) / double(d.bytes.size());
  kfa_apps::write_atomic(o.out, {{"/keep", &d}});
  std::printf("kfa dropout-mask: B=%lld H=%lld Nq=%lld Nk=%lld %s\n", B, H, Nq, Nk,
              kfa_apps::describe_params(o.params, mask_field).c_str());
  std::printf("kept fraction %.6f (expected %.6f); wrote /keep to %s\n", fraction,
              1 - o.params.dropout, o.out.c_str());
  if (o.json)
    std::printf("%s\n", kfa_apps::JsonLine()
                            .add("command", o.command)
                            .add("batch", B)
                            .add("heads_q", H)
                            .add("seqlen_q", Nq)
                            .add("seqlen_k", Nk)
                            .params(o.params, mask_field)
                            .figure("kept_fraction", fraction, 9)
                            .str()
                            .c_str());
  return 0;
}

int main_pass(Options o) {
  if (o.layernorm) return kfa_cli::run_layer_norm(o, o.ln);
#ifdef KFA_CLI_NN
  if (o.mha) return kfa_cli::run_mha(o, o.mha_opts);
#endif
  if (o.command == "dropout-mask") return run_dropout_mask(o);
  Problem p;
  if (!o.random.empty()) {
    const hsize_t B = o.random[0], H = o.random[1], N = o.random[2], D = o.random[3];
    const hsize_t Hk = o.heads_kv.value_or(H), Nk = o.seqlen_k.value_or(N);
    const hsize_t Dv = o.head_dim_v.value_or(D);
    std::mt19937_64 gen(o.data_seed);
    const bool bwd = o.command == "backward";
    const double wide = double(std::max(D, Dv));  // every tensor counted at the wider dim
    check_memory(o.dtype, double(B) * H * N * wide, double(B) * Hk * Nk * wide, double(D), bwd,
                 "the problem");
    p.q = random_tensor({B, H, N, D}, o.dtype, gen);
    p.k = random_tensor({B, Hk, Nk, D}, o.dtype, gen);
    p.v = random_tensor({B, Hk, Nk, Dv}, o.dtype, gen);
    if (bwd) p.dout = random_tensor({B, H, N, Dv}, o.dtype, gen);
    if (o.multiscale) {
      kfa_apps::require_memory(16.0 * double(H) * double(N) * double(Nk), "the --multiscale mask");
      p.mask = kfa_apps::decay_mask(H, N, Nk, o.dtype);
    }
    if (o.alibi) p.slopes = kfa_apps::standard_slopes(H);
  } else {
    kfa_apps::H5File in(o.in);
    kfa_apps::check_known_datasets(in.names(), o.in, o.multiscale, !o.multiscale, true, "kfa");
    if (in.has("/cu_seqlens_q") || in.has("/cu_seqlens_k")) {
      read_varlen(o, in, p);
      return kfa_apps::with_value_type(o.dtype, [&](auto v) {
        using T = decltype(v);
        return o.command == "backward" ? run_backward_varlen<T>(o, p) : run_forward_varlen<T>(o, p);
      });
    }
    if (o.multiscale) p.stat = "/rsum";
    // Every header first: shapes, types and the memory they need are checked before anything
    // is allocated or read.
    const bool bwd = o.command == "backward";
    p.q = in.header("/q", 4);
    p.k = in.header("/k", 4);
    p.v = in.header("/v", 4);
    check_file_shapes(p);
    if (bwd) {
      p.o = in.header("/o", 4);
      p.lse = in.header(p.stat, 3);
      p.dout = in.header("/do", 4);
      if (in.has("/dlse")) p.dlse = in.header("/dlse", 3);
      check_backward_shapes(p);
    }
    if (in.has("/alibi_slopes")) {
      if (o.alibi)
        throw InputError("--alibi and dataset /alibi_slopes in '" + o.in +
                         "' were both given; give one");
      p.slopes = in.header("/alibi_slopes", 1);
    }
    if (in.has("/bias")) p.bias = in.header("/bias", 4);
    kfa_apps::check_term_shapes(p, p.q.dims, p.k.dims);
    check_memory(p.q.dtype, double(p.q.size()) * wider_of(p), double(p.k.size()) * wider_of(p),
                 double(p.q.dims[3]), bwd,
                 "dataset /q " + kfa_apps::shape_of(p.q.dims) + " with /k " +
                     kfa_apps::shape_of(p.k.dims) + " (" + name(p.q.dtype) + ") in '" + o.in + "'");
    p.q = in.read("/q", 4);
    p.k = in.read("/k", 4);
    p.v = in.read("/v", 4);
    if (o.multiscale && in.has("/mask")) {
      p.mask = in.read("/mask", 3);
      if (p.mask.dtype != p.q.dtype)
        throw InputError(std::string("dataset /mask is ") + name(p.mask.dtype) + " but /q is " +
                         name(p.q.dtype) + "; all inputs must share one type");
    }
    if (bwd) {
      p.o = in.read("/o", 4);
      p.lse = in.read(p.stat, 3);
      p.dout = in.read("/do", 4);
      if (in.has("/dlse")) p.dlse = in.read("/dlse", 3);
    }
    if (!p.slopes.dims.empty()) p.slopes = in.read("/alibi_slopes", 1);
    if (!p.bias.dims.empty()) p.bias = in.read("/bias", 4);
    // Softmax's boolean mask (--multiscale reads its float /mask above) and key padding.
    if (!o.multiscale && in.has("/mask")) {
      try {
        p.dense = in.read_integers("/mask", 4, true);
      } catch (const InputError& e) {
        throw InputError(std::string(e.what()) +
                         " (a float /mask is the weight tensor of --multiscale)");
      }
    }
    if (!o.multiscale && in.has("/key_lengths"))
      p.lengths = in.read_integers("/key_lengths", 1, false);
    if (o.alibi) p.slopes = kfa_apps::standard_slopes(p.q.dims[1]);
    kfa_apps::check_term_shapes(p, p.q.dims, p.k.dims);
    if (!o.allow_nonfinite)
      for (const auto& [d, ds] : {std::pair{&p.q, "/q"},
                                  {&p.k, "/k"},
                                  {&p.v, "/v"},
                                  {&p.dout, "/do"},
                                  {&p.slopes, "/alibi_slopes"},
                                  {&p.bias, "/bias"}})
        kfa_apps::refuse_non_finite(*d, std::string("dataset ") + ds + " in '" + o.in + "'");
    o.dtype = p.q.dtype;
  }
  return kfa_apps::with_value_type(o.dtype, [&](auto v) {
    using T = decltype(v);
    if (o.multiscale)
      return o.command == "backward" ? run_backward_msa<T>(o, p) : run_forward_msa<T>(o, p);
    return o.command == "backward" ? run_backward<T>(o, p) : run_forward<T>(o, p);
  });
}

void fail(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "kfa: error: %s\n", msg.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  try {
    opts = parse(argc, argv);  // before Kokkos, so usage errors print nothing else
  } catch (const InputError& e) {
    fail(e.what());
    return 2;
  }
  if (opts.action == kfa_apps::Action::help) {
    if (opts.layernorm) std::cout << kfa_cli::kLayerNormUsage;
#ifdef KFA_CLI_NN
    else if (opts.mha)
      std::cout << kfa_cli::kMhaUsage;
#endif
    else
      std::cout << kUsage << kfa_apps::pass_flags_usage();
    return 0;
  }
  if (opts.action == kfa_apps::Action::version) {
    std::cout << kfa_apps::version_text("kfa");
    return 0;
  }
  std::optional<Kokkos::ScopeGuard> kokkos;
  try {
    kokkos.emplace(argc, argv);
  } catch (const std::exception& e) {
    fail(std::string("cannot initialise Kokkos: ") + e.what());
    return 2;
  }
  try {
    return main_pass(opts);
  } catch (const kfa_apps::WriteError& e) {
    // The temporary file is gone; end here. HDF5 1.10's exit handler can crash after a failed
    // write (SIGSEGV), so neither it nor Kokkos' finalisation runs: nothing is left to save.
    fail(e.what());
    std::fflush(stderr);
    std::_Exit(2);
  } catch (const kfa::Error& e) {
    fail(kfa_apps::message_of(e));
  } catch (const InputError& e) {
    fail(e.what());
  } catch (const std::bad_alloc&) {
    fail("out of memory: the problem is too large for this machine");
  } catch (const std::exception& e) {
    // Kokkos reports allocation failures as std::runtime_error.
    fail(std::string("cannot run the problem: ") + e.what());
  }
  return 2;
}
