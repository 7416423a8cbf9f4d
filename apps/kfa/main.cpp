// kfa: command-line driver of the kfa library.
//
//   kfa forward  --in IN.h5 --out OUT.h5 [mask flags]        reads /q /k /v, writes /o /lse
//   kfa backward --in IN.h5 --out OUT.h5 [mask flags] [--deterministic]
//                reads /q /k /v /o /lse /do (and /dlse when present), writes /dq /dk /dv
//   kfa forward|backward --random B,H,N,D [--heads-kv H] [--seqlen-k N]
//               [--dtype float|double] [--data-seed S] [--repeat R] [--json] [--check]
//               [mask flags]
//   mask flags: [--causal] [--align bottom-right|top-left] [--window LEFT,RIGHT]
//               [--scale S] [--softcap C] [--dropout P --seed N [--offset N]]
//               [--splits N (forward)]
//   kfa dropout-mask --shape B,H,NQ,NK --dropout P --seed N [--offset N] --out MASK.h5 [--json]
//                writes /keep (uint8, 1 = kept): the mask forward and backward apply
// backward --random times the backward alone: the forward it needs runs once, untimed.
// A backward from a file must be given the --dropout, --seed and --offset of its forward.
//
// Exit status: 0 success; 1 when --check finds the tolerance rule broken; 2 bad input or usage
// (one line "kfa: error: ..." on stderr). The output file appears only when the run succeeds.
#include <kfa/kfa.hpp>
#include <kfa/reference.hpp>

#include <unistd.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "h5io.hpp"
#include "views.hpp"

namespace {

using kfa_apps::Dataset;
using kfa_apps::DType;
using kfa_apps::exact;
using kfa_apps::InputError;
using kfa_apps::parse_dims;
using kfa_apps::parse_dtype;
using kfa_apps::parse_int;
using Exec = Kokkos::DefaultExecutionSpace;

const char* kUsage =
    "usage: kfa forward|backward (--in IN.h5 --out OUT.h5 | --random B,H,N,D [--heads-kv H]\n"
    "                   [--seqlen-k N] [--dtype float|double] [--data-seed S])\n"
    "                   [--repeat R] [--json] [--check]\n"
    "                   [--causal] [--align bottom-right|top-left] [--window LEFT,RIGHT]\n"
    "                   [--scale S] [--softcap C] [--dropout P --seed N [--offset N]]\n"
    "                   [--splits N] [--deterministic]\n"
    "       kfa dropout-mask --shape B,H,NQ,NK --dropout P --seed N [--offset N] --out MASK.h5\n"
    "                   [--json]\n"
    "  forward:  reads /q /k /v, writes /o /lse\n"
    "  backward: reads /q /k /v /o /lse /do (and /dlse if present), writes /dq /dk /dv;\n"
    "            give it the --dropout, --seed and --offset of the forward\n"
    "  dropout-mask: writes /keep (uint8, 1 = kept), the mask forward and backward apply\n"
    "  --dropout P: probability of dropping an attention weight, in [0, 1)\n"
    "  --seed N, --offset N: dropout seed and stream (integers >= 0); --data-seed seeds --random\n"
    "  --splits N: forward split-KV chunks (0 = automatic, 1 = none)\n"
    "  --deterministic: backward without atomics, bitwise repeatable\n";

// ---- Command line -------------------------------------------------------------------------

struct Options {
  std::string command;  // forward, backward or dropout-mask
  std::string in, out;
  std::vector<long long> random;  // B,H,N,D
  std::vector<long long> shape;   // dropout-mask: B,H,NQ,NK
  std::optional<long long> heads_kv, seqlen_k;
  DType dtype = DType::f32;
  unsigned long long data_seed = 0;
  long long repeat = 1;
  bool json = false, check = false;
  kfa::Params params;
};

// Flags kfa dropout-mask takes; the rest describe an attention pass.
bool dropout_mask_flag(const std::string& flag) {
  for (const char* f : {"--shape", "--dropout", "--seed", "--offset", "--out", "--json"})
    if (flag == f) return true;
  return false;
}

Options parse(int argc, char** argv) {
  if (argc < 2) throw InputError("missing command (see kfa --help)");
  const std::string command = argv[1];
  if (command == "--help" || command == "-h") {
    std::cout << kUsage;
    std::exit(0);
  }
  if (command != "forward" && command != "backward" && command != "dropout-mask")
    throw InputError("unknown command '" + command +
                     "' (expected: forward, backward or dropout-mask)");
  Options o;
  o.command = command;
  const bool mask_cmd = command == "dropout-mask";
  for (int a = 2; a < argc; ++a) {
    const std::string flag = argv[a];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos' own flags, read by Kokkos
    auto value = [&]() -> std::string {
      if (a + 1 >= argc) throw InputError(flag + " expects a value");
      return argv[++a];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (mask_cmd && !dropout_mask_flag(flag))
      throw InputError("'" + flag +
                       "' does not apply to dropout-mask (it takes --shape, --dropout, --seed, "
                       "--offset, --out, --json)");
    if (!mask_cmd && flag == "--shape") throw InputError("--shape applies to dropout-mask only");
    if (kfa_apps::parse_pass_flag(flag, value, o.params)) continue;
    if (flag == "--in") {
      o.in = value();
    } else if (flag == "--out") {
      o.out = value();
    } else if (flag == "--random") {
      o.random = parse_dims(flag, value(), "B,H,N,D", {"batch", "heads", "seqlen", "head_dim"});
    } else if (flag == "--shape") {
      o.shape = parse_dims(flag, value(), "B,H,NQ,NK", {"batch", "heads", "seqlen_q", "seqlen_k"});
    } else if (flag == "--heads-kv") {
      o.heads_kv = parse_int(flag, value(), 1);
    } else if (flag == "--seqlen-k") {
      o.seqlen_k = parse_int(flag, value(), 1);
    } else if (flag == "--dtype") {
      o.dtype = parse_dtype(flag, value());
    } else if (flag == "--data-seed") {
      o.data_seed = static_cast<unsigned long long>(parse_int(flag, value(), 0));
    } else if (flag == "--repeat") {
      o.repeat = parse_int(flag, value(), 1);
    } else if (flag == "--json") {
      o.json = true;
    } else if (flag == "--check") {
      o.check = true;
    } else if (flag == "--splits") {
      if (command != "forward") throw InputError("--splits applies to forward only");
      // Capped at the number of key tiles by the library; clamp first so the int cannot wrap.
      o.params.num_splits = static_cast<int>(std::min(parse_int(flag, value(), 0), 1LL << 30));
    } else if (flag == "--deterministic") {
      if (command != "backward") throw InputError("--deterministic applies to backward only");
      o.params.deterministic = true;
    } else {
      throw InputError("unknown option '" + flag + "' (see kfa --help)");
    }
  }
  if (mask_cmd) {
    if (o.shape.empty()) throw InputError("dropout-mask needs --shape B,H,NQ,NK");
    if (o.out.empty()) throw InputError("dropout-mask needs --out MASK.h5");
    return o;
  }
  const bool file_mode = !o.in.empty() || !o.out.empty();
  if (file_mode && !o.random.empty())
    throw InputError("--random cannot be combined with --in/--out");
  if (!file_mode && o.random.empty())
    throw InputError("give --in IN.h5 --out OUT.h5 or --random B,H,N,D");
  if (file_mode && (o.in.empty() || o.out.empty()))
    throw InputError(o.in.empty() ? "--out needs --in" : "--in needs --out");
  if (!o.random.empty() && o.heads_kv && o.random[1] % *o.heads_kv != 0)
    throw InputError("--heads-kv " + std::to_string(*o.heads_kv) +
                     " must divide the heads of --random (" + std::to_string(o.random[1]) + ")");
  if (file_mode && (o.heads_kv || o.seqlen_k))
    throw InputError("--heads-kv and --seqlen-k apply to --random only");
  return o;
}

// ---- The problem ----------------------------------------------------------------------------

struct Problem {
  Dataset q, k, v;
  Dataset o, lse, dout, dlse;  // backward from a file: the forward's outputs and the gradients
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

// The backward's extra inputs: /o and /do shaped like /q and of its type, /lse and /dlse
// (batch, heads, seqlen) of /q. The library checks /q against /k and /v.
void check_backward_shapes(const Problem& p) {
  const char* names[] = {"batch", "heads", "seqlen", "head_dim"};
  auto expect = [&](const Dataset& d, const char* ds, int rank) {
    for (int i = 0; i < rank; ++i)
      if (d.dims[i] != p.q.dims[i])
        throw InputError(std::string("dataset ") + ds + " has " + names[i] + " " +
                         std::to_string(d.dims[i]) + " but /q has " + std::to_string(p.q.dims[i]));
  };
  expect(p.o, "/o", 4);
  expect(p.dout, "/do", 4);
  expect(p.lse, "/lse", 3);
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
    x = t == DType::f32 ? double(float(dist(gen))) : dist(gen);
  return d;
}

// Refuses a run whose `what` needs more than 90 % of this machine's memory, before allocating.
void require_memory(double bytes, const char* what) {
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && bytes > 0.9 * phys) {
    std::ostringstream os;
    os.precision(3);
    os << what << " needs about " << bytes / (1 << 30) << " GiB but this machine has "
       << phys / (1 << 30) << " GiB of memory";
    throw InputError(os.str());
  }
}

// Refuses a random problem that cannot fit in this machine's memory before allocating anything.
void check_memory(DType dtype, double q_elems, double kv_elems, double head_dim, bool backward) {
  const double elem = dtype == DType::f32 ? 4 : 8;
  // q, o, k, v in the kernel's type plus the double copies the program keeps, and the LSE;
  // the backward adds dout, dq, dk, dv.
  const double tensors = backward ? 4 * q_elems + 4 * kv_elems : 2 * q_elems + 2 * kv_elems;
  require_memory(tensors * (elem + 8) + q_elems / head_dim * 24, "the problem");
}

template <class T>
using DeviceTensor = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;

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

struct Timing {
  double median_s = 0, min_s = 0;
};

// Runs pass() once untimed (warm-up; its output is the one written), then `repeat` times
// between fences, and returns the median and minimum wall time of the repeats.
template <class Pass>
Timing time_pass(long long repeat, const Pass& pass) {
  pass();
  Kokkos::fence();
  std::vector<double> times;
  for (long long r = 0; r < repeat; ++r) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    Kokkos::fence();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  Timing tm{times[times.size() / 2], times.front()};
  if (times.size() % 2 == 0)
    tm.median_s = 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
  return tm;
}

std::string describe(const Options& o, const char* dtype, int B, int Hq, int Hk, int Nq, int Nk,
                     int D) {
  const auto& pr = o.params;
  std::ostringstream os;
  os << "kfa " << o.command << ": B=" << B << " Hq=" << Hq << " Hkv=" << Hk << " Nq=" << Nq
     << " Nk=" << Nk << " D=" << D << " " << dtype << " causal=" << (pr.causal ? "yes" : "no")
     << " align=" << (pr.align == kfa::Align::bottom_right ? "bottom-right" : "top-left")
     << " window=(" << pr.window_left << "," << pr.window_right << ")";
  if (pr.softcap > 0) os << " softcap=" << pr.softcap;
  if (pr.dropout > 0)
    os << " dropout=" << pr.dropout << " seed=" << pr.seed << " offset=" << pr.offset;
  if (o.command == "backward") os << (pr.deterministic ? " deterministic" : " atomic-dq");
  os << " on " << Exec::name();
  return os.str();
}

// The fields every --json line starts with.
std::string json_head(const Options& o, const char* dtype, int B, int Hq, int Hk, int Nq, int Nk,
                      int D, const Timing& tm, double gflops) {
  const auto& pr = o.params;
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "{\"command\":\"%s\",\"dtype\":\"%s\",\"batch\":%d,\"heads_q\":%d,\"heads_kv\":%d,"
      "\"seqlen_q\":%d,\"seqlen_k\":%d,\"head_dim\":%d,\"causal\":%s,\"align\":\"%s\","
      "\"window_left\":%d,\"window_right\":%d,\"softcap\":%g,\"dropout\":%s,"
      "\"seed\":%llu,\"offset\":%llu,\"num_splits\":%d,\"deterministic\":%s,\"repeat\":%lld,"
      "\"median_s\":%.9g,\"min_s\":%.9g,\"gflops\":%.6g,\"execution_space\":\"%s\"",
      o.command.c_str(), dtype, B, Hq, Hk, Nq, Nk, D, pr.causal ? "true" : "false",
      pr.align == kfa::Align::bottom_right ? "bottom-right" : "top-left", pr.window_left,
      pr.window_right, pr.softcap, exact(pr.dropout).c_str(),
      static_cast<unsigned long long>(pr.seed), static_cast<unsigned long long>(pr.offset),
      pr.num_splits, pr.deterministic ? "true" : "false", o.repeat, tm.median_s, tm.min_s, gflops,
      Exec::name());
  return buf;
}

// The dropout keep-mask of o.params for a (B, Hq, Nq, Nk) problem on the host, for the
// reference; empty without dropout.
kfa::reference::Keep4 keep_mask(const Options& o, int B, int Hq, int Nq, int Nk) {
  if (!(o.params.dropout > 0)) return {};
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Exec::memory_space> keep(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::keep")), B, Hq, Nq, Nk);
  kfa::dropout_mask(Exec(), keep, o.params);
  kfa::reference::Keep4 h(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("keep")), B,
                          Hq, Nq, Nk);
  Kokkos::deep_copy(h, keep);
  return h;
}

struct CheckResult {
  bool ran = false, ok = true;
  kfa::reference::ForwardCheck c;
};

// The dataset as a device tensor; its host copy is released at once unless `keep` (the check
// reads it later): the program's peak memory stays near the device tensors' own.
template <class T>
DeviceTensor<T> upload(Dataset& d, const char* label, bool keep) {
  auto v = to_device<T>(d, label);
  if (!keep) std::vector<double>().swap(d.data);
  return v;
}

template <class T>
int run_forward(const Options& o, Problem& p) {
  const DType t = o.dtype;
  auto q = upload<T>(p.q, "kfa::q", o.check);
  auto k = upload<T>(p.k, "kfa::k", o.check);
  auto v = upload<T>(p.v, "kfa::v", o.check);
  DeviceTensor<T> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::o")),
                      q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space> lse(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::lse")), q.extent(0),
      q.extent(1), q.extent(2));

  const Timing tm = time_pass(o.repeat, [&] { kfa::forward(Exec(), q, k, v, out, lse, o.params); });

  // The outputs come back to the host only when something reads them.
  Dataset o_ds, lse_ds;
  if (o.check || !o.out.empty()) {
    o_ds = kfa_apps::view_to_dataset(out, t);
    lse_ds = kfa_apps::view_to_dataset(lse, t);
  }

  CheckResult chk;
  if (o.check) {
    chk.ran = true;
    kfa::reference::Tensor3 lse_h("kfa::lse", lse_ds.dims[0], lse_ds.dims[1], lse_ds.dims[2]);
    std::copy(lse_ds.data.begin(), lse_ds.data.end(), lse_h.data());
    chk.c = kfa::reference::check_forward<T>(
        to_reference(p.q), to_reference(p.k), to_reference(p.v), o.params, to_reference(o_ds),
        lse_h, keep_mask(o, q.extent(0), q.extent(1), q.extent(2), k.extent(2)));
    chk.ok = chk.c.ok();
  }
  if (!o.out.empty()) kfa_apps::write_atomic(o.out, {{"/o", &o_ds}, {"/lse", &lse_ds}});

  const int B = q.extent(0), Hq = q.extent(1), Hk = k.extent(1), Nq = q.extent(2), Nk = k.extent(2),
            D = q.extent(3);
  const double gflops = kfa::forward_flops(B, Hq, Nq, Nk, D, o.params) / tm.median_s * 1e-9;
  std::printf("%s\n", describe(o, name(t), B, Hq, Hk, Nq, Nk, D).c_str());
  std::printf("time: median %.6f s, min %.6f s over %lld runs; %.2f GFLOP/s\n", tm.median_s,
              tm.min_s, o.repeat, gflops);
  if (chk.ran)
    std::printf(
        "check against the float64 reference: O err %.3g (bound %.3g), LSE err %.3g (bound %.3g): "
        "%s\n",
        chk.c.o.err, chk.c.o.bound, chk.c.lse.err, chk.c.lse.bound, chk.ok ? "PASS" : "FAIL");
  if (!o.out.empty()) std::printf("wrote /o and /lse to %s\n", o.out.c_str());
  if (o.json) {
    std::printf("%s,\"check\":\"%s\"",
                json_head(o, name(t), B, Hq, Hk, Nq, Nk, D, tm, gflops).c_str(),
                !chk.ran ? "not run"
                : chk.ok ? "pass"
                         : "fail");
    if (chk.ran)
      std::printf(",\"err_o\":%.6g,\"bound_o\":%.6g,\"err_lse\":%.6g,\"bound_lse\":%.6g",
                  chk.c.o.err, chk.c.o.bound, chk.c.lse.err, chk.c.lse.bound);
    std::printf("}\n");
  }
  return chk.ok ? 0 : 1;
}

template <class T>
int run_backward(const Options& o, Problem& p) {
  const DType t = o.dtype;
  auto q = upload<T>(p.q, "kfa::q", o.check);
  auto k = upload<T>(p.k, "kfa::k", o.check);
  auto v = upload<T>(p.v, "kfa::v", o.check);
  auto dout = upload<T>(p.dout, "kfa::do", o.check);
  const int B = q.extent(0), Hq = q.extent(1), Hk = k.extent(1), Nq = q.extent(2), Nk = k.extent(2),
            D = q.extent(3);
  DeviceTensor<T> out, dq, dk, dv;
  Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space> lse, dlse;
  if (p.o.dims.empty()) {  // --random: the forward it needs, once and untimed
    out = DeviceTensor<T>(std::string("kfa::o"), B, Hq, Nq, D);
    lse = decltype(lse)(std::string("kfa::lse"), B, Hq, Nq);
    kfa::forward(Exec(), q, k, v, out, lse, o.params);
  } else {
    out = to_device<T>(p.o, "kfa::o");
    lse = to_device3<T>(p.lse, "kfa::lse");
  }
  if (!p.dlse.dims.empty()) dlse = to_device3<T>(p.dlse, "kfa::dlse");
  dq = DeviceTensor<T>(std::string("kfa::dq"), B, Hq, Nq, D);
  dk = DeviceTensor<T>(std::string("kfa::dk"), B, Hk, Nk, D);
  dv = DeviceTensor<T>(std::string("kfa::dv"), B, Hk, Nk, D);
  const Timing tm = time_pass(o.repeat, [&] {
    if (dlse.size() > 0)
      kfa::backward(Exec(), q, k, v, out, lse, dout, dlse, dq, dk, dv, o.params);
    else
      kfa::backward(Exec(), q, k, v, out, lse, dout, dq, dk, dv, o.params);
  });

  Dataset dq_ds, dk_ds, dv_ds;
  if (o.check || !o.out.empty()) {
    dq_ds = kfa_apps::view_to_dataset(dq, t);
    dk_ds = kfa_apps::view_to_dataset(dk, t);
    dv_ds = kfa_apps::view_to_dataset(dv, t);
  }
  bool ran = false, ok = true;
  kfa::reference::BackwardCheck c;
  if (o.check) {
    // Against the reference gradients of the reference forward: a file whose /o and /lse do
    // not come from q, k, v fails here rather than passing silently.
    ran = true;
    c = kfa::reference::check_backward<T>(to_reference(p.q), to_reference(p.k), to_reference(p.v),
                                          o.params, to_reference(p.dout), to_reference3(p.dlse),
                                          to_reference(dq_ds), to_reference(dk_ds),
                                          to_reference(dv_ds), keep_mask(o, B, Hq, Nq, Nk));
    ok = c.ok();
  }
  if (!o.out.empty())
    kfa_apps::write_atomic(o.out, {{"/dq", &dq_ds}, {"/dk", &dk_ds}, {"/dv", &dv_ds}});

  const double gflops = kfa::backward_flops(B, Hq, Nq, Nk, D, o.params) / tm.median_s * 1e-9;
  std::printf("%s\n", describe(o, name(t), B, Hq, Hk, Nq, Nk, D).c_str());
  std::printf("time: median %.6f s, min %.6f s over %lld runs; %.2f GFLOP/s\n", tm.median_s,
              tm.min_s, o.repeat, gflops);
  if (ran)
    std::printf(
        "check against the float64 reference: dQ err %.3g (bound %.3g), dK err %.3g (bound %.3g), "
        "dV err %.3g (bound %.3g): %s\n",
        c.dq.err, c.dq.bound, c.dk.err, c.dk.bound, c.dv.err, c.dv.bound, ok ? "PASS" : "FAIL");
  if (!o.out.empty()) std::printf("wrote /dq /dk /dv to %s\n", o.out.c_str());
  if (o.json) {
    std::printf("%s,\"check\":\"%s\"",
                json_head(o, name(t), B, Hq, Hk, Nq, Nk, D, tm, gflops).c_str(),
                !ran ? "not run"
                : ok ? "pass"
                     : "fail");
    if (ran)
      std::printf(
          ",\"err_dq\":%.6g,\"bound_dq\":%.6g,\"err_dk\":%.6g,\"bound_dk\":%.6g,\"err_dv\":%.6g,"
          "\"bound_dv\":%.6g",
          c.dq.err, c.dq.bound, c.dk.err, c.dk.bound, c.dv.err, c.dv.bound);
    std::printf("}\n");
  }
  return ok ? 0 : 1;
}

// kfa dropout-mask: the keep-mask of --dropout/--seed/--offset for --shape, as /keep.
int run_dropout_mask(const Options& o) {
  const long long B = o.shape[0], H = o.shape[1], Nq = o.shape[2], Nk = o.shape[3];
  for (long long n : o.shape)
    if (n > 2147483647LL)
      throw InputError("--shape values must fit in int, got " + std::to_string(n));
  // The mask on the device and its host copy (one buffer when they share memory).
  require_memory(2.0 * double(B) * double(H) * double(Nq) * double(Nk), "the mask");
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
  const auto& pr = o.params;
  std::printf("kfa dropout-mask: B=%lld H=%lld Nq=%lld Nk=%lld dropout=%g seed=%llu offset=%llu\n",
              B, H, Nq, Nk, pr.dropout, static_cast<unsigned long long>(pr.seed),
              static_cast<unsigned long long>(pr.offset));
  std::printf("kept fraction %.6f (expected %.6f); wrote /keep to %s\n", fraction, 1 - pr.dropout,
              o.out.c_str());
  if (o.json)
    std::printf(
        "{\"command\":\"dropout-mask\",\"batch\":%lld,\"heads_q\":%lld,\"seqlen_q\":%lld,"
        "\"seqlen_k\":%lld,\"dropout\":%s,\"seed\":%llu,\"offset\":%llu,"
        "\"kept_fraction\":%.9g}\n",
        B, H, Nq, Nk, exact(pr.dropout).c_str(), static_cast<unsigned long long>(pr.seed),
        static_cast<unsigned long long>(pr.offset), fraction);
  return 0;
}

int main_pass(Options o) {
  if (o.command == "dropout-mask") return run_dropout_mask(o);
  Problem p;
  if (!o.random.empty()) {
    const hsize_t B = o.random[0], H = o.random[1], N = o.random[2], D = o.random[3];
    const hsize_t Hk = o.heads_kv.value_or(H), Nk = o.seqlen_k.value_or(N);
    std::mt19937_64 gen(o.data_seed);
    const bool bwd = o.command == "backward";
    check_memory(o.dtype, double(B) * H * N * D, double(B) * Hk * Nk * D, double(D), bwd);
    p.q = random_tensor({B, H, N, D}, o.dtype, gen);
    p.k = random_tensor({B, Hk, Nk, D}, o.dtype, gen);
    p.v = random_tensor({B, Hk, Nk, D}, o.dtype, gen);
    if (bwd) p.dout = random_tensor({B, H, N, D}, o.dtype, gen);
  } else {
    kfa_apps::H5File in(o.in);
    p.q = in.read("/q", 4);
    p.k = in.read("/k", 4);
    p.v = in.read("/v", 4);
    check_file_shapes(p);
    if (o.command == "backward") {
      p.o = in.read("/o", 4);
      p.lse = in.read("/lse", 3);
      p.dout = in.read("/do", 4);
      if (in.has("/dlse")) p.dlse = in.read("/dlse", 3);
      check_backward_shapes(p);
    }
    o.dtype = p.q.dtype;
  }
  if (o.command == "backward")
    return o.dtype == DType::f32 ? run_backward<float>(o, p) : run_backward<double>(o, p);
  return o.dtype == DType::f32 ? run_forward<float>(o, p) : run_forward<double>(o, p);
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
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    return main_pass(opts);
  } catch (const kfa::Error& e) {
    const std::string msg = e.what();
    fail(msg.rfind("kfa: ", 0) == 0 ? msg.substr(5) : msg);
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
