// kfa mha forward|backward: kfa::nn::mha_forward on a file's /x (B, L, d_model), /w_qkv
// (d_model, (H + 2 HKV) hd), /w_o (H hd, d_model), /b_qkv and /b_o when present (absent: that
// bias is off), and /gamma /beta (d_model) with --residual-layernorm, writing /y; the backward
// recomputes the forward and, from /dy (B, L, d_model), writes /dx and the gradient of every
// weight the block has (/dw_qkv /db_qkv /dw_o /db_o /dgamma /dbeta). Or on a random problem
// (--random B,L,DMODEL: every weight and bias drawn).
#include "mha.hpp"

#include <kfa/dropout.hpp>
#include <kfa/mha.hpp>
#include <kfa/mha_reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "h5io.hpp"
#include "report.hpp"
#include "views.hpp"

namespace kfa_cli {

using kfa_apps::Dataset;
using kfa_apps::DType;
using kfa_apps::InputError;
using Exec = Kokkos::DefaultExecutionSpace;

const char* const kMhaUsage =
    "usage: kfa mha forward|backward --heads H [--heads-kv HKV] [--residual-layernorm] [--eps E]\n"
    "                   (--in IN.h5 --out OUT.h5 | --random B,L,DMODEL [--dtype float|double]\n"
    "                   [--data-seed S]) [--repeat R] [--json] [--check] [--allow-nonfinite]\n"
    "                   [pass flags of kfa forward|backward]\n"
    "  the attention block of kfa::nn: QKV = x W_qkv + b_qkv, H query and HKV key/value heads\n"
    "  of hd = DMODEL / H columns (q heads, then k, then v), O = attention(Q, K, V),\n"
    "  Z = O W_o + b_o, y = layer_norm(Z + x) with --residual-layernorm, else Z\n"
    "  forward:  reads /x (B, L, DMODEL), /w_qkv (DMODEL, (H + 2 HKV) hd), /w_o (H hd, DMODEL),\n"
    "            /b_qkv ((H + 2 HKV) hd) and /b_o (DMODEL) when present (absent: no such bias),\n"
    "            /gamma /beta (DMODEL) with --residual-layernorm; writes /y\n"
    "  backward: reads the same and /dy (B, L, DMODEL), recomputes the forward, writes /dx\n"
    "            /dw_qkv /dw_o, /db_qkv /db_o for the biases given, /dgamma /dbeta with the\n"
    "            layer norm\n"
    "  --heads H: query heads (DMODEL must be a multiple); --heads-kv HKV: key/value heads, a\n"
    "            divisor of H (default H)\n"
    "  --residual-layernorm: the residual and layer norm step; --eps E its eps (default 1e-5)\n"
    "  --random B,L,DMODEL: x, every weight and bias (and dy) drawn from --data-seed\n"
    "  pass flags: the attention's, as kfa forward|backward (--causal, --window, --softcap,\n"
    "            --dropout with --seed, ...; see kfa --help)\n"
    "  --dtype: float or double (the block's gemms); files give their own type\n"
    "  --check: compare with the float64 reference of the whole block under the tolerance rule\n"
    "           (exit 1 if broken)\n"
    "  --json: one JSON object of the run on the last line of stdout\n"
    "exit status: 0 success, 1 --check failed, 2 bad input or usage (one line on stderr)\n";

namespace {

// Besides kfa_apps::kRunFlags and the attention's pass flags: --random, --heads-kv are its
// own, --seqlen-k and --multiscale are refused.
std::string taken_flags() {
  return kfa_apps::with_run_flags("--heads, --heads-kv, --residual-layernorm, --eps, --random") +
         " and the attention's pass flags";
}

struct Problem {
  Dataset x, w_qkv, b_qkv, w_o, b_o, gamma, beta, dy;
};

std::string shape(const Dataset& d) {
  return kfa_apps::shape_of(d.dims);
}

// The sizes a problem's /x and the head counts give.
struct Sizes {
  hsize_t B = 0, L = 0, d = 0, hd = 0, width = 0, inner = 0;
};

// d_model against the head counts, then every dataset's shape against /x and the head counts
// (both shapes named) and one type for all.
Sizes check_shapes(const Problem& p, const MhaOptions& m) {
  Sizes s;
  const auto& x = p.x.dims;
  if (x[0] == 0 || x[1] == 0 || x[2] == 0)
    throw InputError("dataset /x has shape " + shape(p.x) + "; B, L and d_model must be >= 1");
  for (hsize_t n : x)
    if (n > INT_MAX)
      throw InputError("dataset /x has shape " + shape(p.x) + "; each extent must fit in int");
  s.B = x[0];
  s.L = x[1];
  s.d = x[2];
  const hsize_t h = m.heads, hkv = m.heads_kv;
  if (s.d % h != 0)
    throw InputError("d_model = " + std::to_string(s.d) + " (/x of shape " + shape(p.x) +
                     ") is not divisible by --heads " + std::to_string(h));
  s.hd = s.d / h;
  s.width = (h + 2 * hkv) * s.hd;
  s.inner = h * s.hd;
  const std::string heads = "--heads " + std::to_string(h) + " --heads-kv " + std::to_string(hkv);
  const auto expect = [&](const Dataset& d, const char* name, const std::vector<hsize_t>& want,
                          const char* what) {
    if (d.dims.empty() || d.dims == want) return;
    throw InputError(std::string("dataset ") + name + " has shape " + shape(d) + " but must be " +
                     kfa_apps::shape_of(want) + " = " + what + " for /x of shape " + shape(p.x) +
                     " and " + heads);
  };
  expect(p.w_qkv, "/w_qkv", {s.d, s.width}, "(d_model, (H + 2 HKV) head_dim)");
  expect(p.b_qkv, "/b_qkv", {s.width}, "((H + 2 HKV) head_dim)");
  expect(p.w_o, "/w_o", {s.inner, s.d}, "(H head_dim, d_model)");
  expect(p.b_o, "/b_o", {s.d}, "(d_model)");
  expect(p.gamma, "/gamma", {s.d}, "(d_model)");
  expect(p.beta, "/beta", {s.d}, "(d_model)");
  expect(p.dy, "/dy", x, "the shape of /x");
  for (const auto& [d, name] : {std::pair{&p.w_qkv, "/w_qkv"},
                                {&p.b_qkv, "/b_qkv"},
                                {&p.w_o, "/w_o"},
                                {&p.b_o, "/b_o"},
                                {&p.gamma, "/gamma"},
                                {&p.beta, "/beta"},
                                {&p.dy, "/dy"}})
    if (!d->dims.empty() && d->dtype != p.x.dtype)
      throw InputError(std::string("dataset ") + name + " is " + kfa_apps::name(d->dtype) +
                       " but /x is " + kfa_apps::name(p.x.dtype) +
                       "; all inputs must share one type");
  if (p.x.dtype != DType::f32 && p.x.dtype != DType::f64)
    throw InputError(std::string("dataset /x is ") + kfa_apps::name(p.x.dtype) +
                     "; kfa mha computes in float32 or float64 (the block's gemms)");
  return s;
}

// What a run holds at once, in the kernel's type and as doubles: the row tensors (x, y, dy,
// dx, z, the attention's output and its gradient), QKV and its gradient, the weights and
// their gradients.
void check_memory(const Sizes& s, DType t, bool bwd, const std::string& what) {
  const double rows = double(s.B) * double(s.L), elem = double(kfa_apps::element_bytes(t)) + 8;
  const double row_elems = rows * (double(s.d) * (bwd ? 6 : 3) + double(s.inner) * (bwd ? 2 : 1) +
                                   double(s.width) * (bwd ? 2 : 1));
  const double weights = 2 * double(s.d) * double(s.width + s.inner + 4);
  kfa_apps::require_memory((row_elems + weights) * elem, what);
}

// Every header is checked before anything is read: the datasets the pass reads (and no
// other), ranks, shapes and one type, and the memory the run needs.
Problem read_problem(const kfa_apps::RunOptions& o, const MhaOptions& m) {
  const bool bwd = o.command == "backward", ln = m.residual_layer_norm;
  kfa_apps::H5File in(o.in);
  for (const std::string& n : in.names()) {
    const bool always = n == "/x" || n == "/w_qkv" || n == "/b_qkv" || n == "/w_o" || n == "/b_o";
    if (!ln && (n == "/gamma" || n == "/beta"))
      throw InputError("'" + o.in + "' holds " + n +
                       ", which kfa mha reads only with --residual-layernorm: add the flag, or "
                       "remove the dataset (it would be silently ignored)");
    if (!always && n != "/gamma" && n != "/beta" && (n != "/dy" || !bwd))
      throw InputError("'" + o.in + "' holds " + n + ", which kfa mha " + o.command +
                       " does not read (forward reads /x /w_qkv /w_o, /b_qkv /b_o, and /gamma "
                       "/beta with --residual-layernorm; backward also /dy): remove it, or it "
                       "would be silently ignored");
  }
  Problem p;
  p.x = in.header("/x", 3);
  p.w_qkv = in.header("/w_qkv", 2);
  p.w_o = in.header("/w_o", 2);
  if (in.has("/b_qkv")) p.b_qkv = in.header("/b_qkv", 1);
  if (in.has("/b_o")) p.b_o = in.header("/b_o", 1);
  if (ln) {
    p.gamma = in.header("/gamma", 1);
    p.beta = in.header("/beta", 1);
  }
  if (bwd) p.dy = in.header("/dy", 3);
  const Sizes s = check_shapes(p, m);
  check_memory(s, p.x.dtype, bwd, "dataset /x " + shape(p.x) + " in '" + o.in + "'");
  for (const auto& [d, name, rank] : {std::tuple{&p.x, "/x", 3},
                                      {&p.w_qkv, "/w_qkv", 2},
                                      {&p.b_qkv, "/b_qkv", 1},
                                      {&p.w_o, "/w_o", 2},
                                      {&p.b_o, "/b_o", 1},
                                      {&p.gamma, "/gamma", 1},
                                      {&p.beta, "/beta", 1},
                                      {&p.dy, "/dy", 3}})
    if (!d->dims.empty()) {
      *d = in.read(name, rank);
      if (!o.allow_nonfinite)
        kfa_apps::refuse_non_finite(*d, std::string("dataset ") + name + " in '" + o.in + "'");
    }
  return p;
}

// The dropout keep-mask of the attention (B, H, L, L) on the host, for the reference; empty
// without dropout.
kfa::reference::Keep4 keep_mask(const kfa::Params& params, const Sizes& s, int heads) {
  if (!(params.dropout > 0)) return {};
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Exec::memory_space> keep(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::keep")), s.B, heads, s.L,
      s.L);
  kfa::dropout_mask(Exec(), keep, params);
  kfa::reference::Keep4 h(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("keep")), s.B,
                          heads, s.L, s.L);
  Kokkos::deep_copy(h, keep);
  return h;
}

template <class T>
int run(const kfa_apps::RunOptions& o, const MhaOptions& m, const Problem& p, const Sizes& s) {
  using Mem = Exec::memory_space;
  using Weights = kfa::nn::MhaWeights<T, Mem>;
  using Rows = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  const bool bwd = o.command == "backward";
  kfa::nn::MhaParams mp;
  mp.heads_q = m.heads;
  mp.heads_kv = m.heads_kv;
  mp.attention = o.params;
  mp.qkv_bias = !p.b_qkv.dims.empty();
  mp.out_bias = !p.b_o.dims.empty();
  mp.residual_layer_norm = m.residual_layer_norm;
  mp.ln.eps = m.eps;
  const auto x = kfa_apps::dataset_to_view<Rows>(p.x, "kfa::x");
  Weights w;
  w.w_qkv = kfa_apps::dataset_to_view<typename Weights::matrix>(p.w_qkv, "kfa::w_qkv");
  w.w_o = kfa_apps::dataset_to_view<typename Weights::matrix>(p.w_o, "kfa::w_o");
  const auto vec = [](const Dataset& d, const char* label) {
    return d.dims.empty() ? typename Weights::vector()
                          : kfa_apps::dataset_to_view<typename Weights::vector>(d, label);
  };
  w.b_qkv = vec(p.b_qkv, "kfa::b_qkv");
  w.b_o = vec(p.b_o, "kfa::b_o");
  w.gamma = vec(p.gamma, "kfa::gamma");
  w.beta = vec(p.beta, "kfa::beta");
  Rows y(std::string("kfa::y"), s.B, s.L, s.d);
  kfa::nn::MhaSaved<T, Mem> saved;
  const auto forward = [&] { kfa::nn::mha_forward(Exec(), x, w, y, saved, mp); };
  Rows dy, dx;
  Weights g;
  kfa_apps::Timing tm;
  if (bwd) {
    dy = kfa_apps::dataset_to_view<Rows>(p.dy, "kfa::dy");
    dx = Rows(std::string("kfa::dx"), s.B, s.L, s.d);
    g = Weights("kfa::grad", static_cast<int>(s.d), mp);
    forward();  // once, untimed: the backward times alone
    tm = kfa_apps::time_pass(o.repeat,
                             [&] { kfa::nn::mha_backward(Exec(), x, w, saved, dy, dx, g, mp); });
  } else {
    tm = kfa_apps::time_pass(o.repeat, forward);
  }
  Exec().fence();
  std::vector<std::pair<std::string, Dataset>> out;
  if (o.check || !o.out.empty()) {
    if (bwd) {
      out.emplace_back("/dx", kfa_apps::view_to_dataset(dx, o.dtype));
      out.emplace_back("/dw_qkv", kfa_apps::view_to_dataset(g.w_qkv, o.dtype));
      if (mp.qkv_bias) out.emplace_back("/db_qkv", kfa_apps::view_to_dataset(g.b_qkv, o.dtype));
      out.emplace_back("/dw_o", kfa_apps::view_to_dataset(g.w_o, o.dtype));
      if (mp.out_bias) out.emplace_back("/db_o", kfa_apps::view_to_dataset(g.b_o, o.dtype));
      if (mp.residual_layer_norm) {
        out.emplace_back("/dgamma", kfa_apps::view_to_dataset(g.gamma, o.dtype));
        out.emplace_back("/dbeta", kfa_apps::view_to_dataset(g.beta, o.dtype));
      }
    } else {
      out.emplace_back("/y", kfa_apps::view_to_dataset(y, o.dtype));
    }
  }
  std::optional<kfa_apps::Verdict> verdict;
  if (o.check) {
    namespace ref = kfa::reference;
    ref::MhaSpec spec;
    spec.batch = static_cast<int>(s.B);
    spec.seqlen = static_cast<int>(s.L);
    spec.heads_q = m.heads;
    spec.heads_kv = m.heads_kv;
    spec.attention = o.params;
    spec.residual_layer_norm = m.residual_layer_norm;
    spec.eps = m.eps;
    const ref::MhaTensors in{
        kfa_apps::reference_rows(p.x),       kfa_apps::reference_rows(p.dy),
        kfa_apps::reference_rows(p.w_qkv),   kfa_apps::reference_rows(p.w_o),
        kfa_apps::reference_vector(p.b_qkv), kfa_apps::reference_vector(p.b_o),
        kfa_apps::reference_vector(p.gamma), kfa_apps::reference_vector(p.beta)};
    ref::MhaResult got;
    const auto find = [&](const char* name) -> const Dataset* {
      for (const auto& [n, d] : out)
        if (n == name) return &d;
      return nullptr;
    };
    const auto two = [&](const char* name) {
      const Dataset* d = find(name);
      return d ? kfa_apps::reference_rows(*d) : ref::Tensor2();
    };
    const auto one = [&](const char* name) {
      const Dataset* d = find(name);
      return d ? kfa_apps::reference_vector(*d) : ref::Tensor1();
    };
    got.y = two("/y");
    got.dx = two("/dx");
    got.dw_qkv = two("/dw_qkv");
    got.dw_o = two("/dw_o");
    got.db_qkv = one("/db_qkv");
    got.db_o = one("/db_o");
    got.dgamma = one("/dgamma");
    got.dbeta = one("/dbeta");
    verdict = kfa_apps::Verdict{};
    for (const auto& [name, c] : ref::mha_check<T>(spec, in, got, keep_mask(o.params, s, m.heads)))
      verdict->checks.push_back({name, name, c});
  }
  std::string written;
  if (!o.out.empty()) {
    std::vector<std::pair<std::string, const Dataset*>> files;
    for (const auto& [name, d] : out) {
      files.emplace_back(name, &d);
      written += (written.empty() ? "" : " ") + name;
    }
    kfa_apps::write_atomic(o.out, files);
  }
  const std::string params = kfa_apps::describe_params(o.params, kfa_apps::read_by(o.pass()));
  std::printf(
      "kfa mha %s: B=%llu L=%llu d_model=%llu Hq=%d Hkv=%d hd=%llu %s qkv_bias=%s out_bias=%s "
      "residual_layernorm=%s eps=%s %s on %s\n",
      o.command.c_str(), static_cast<unsigned long long>(s.B), static_cast<unsigned long long>(s.L),
      static_cast<unsigned long long>(s.d), m.heads, m.heads_kv,
      static_cast<unsigned long long>(s.hd), kfa_apps::name(o.dtype), mp.qkv_bias ? "yes" : "no",
      mp.out_bias ? "yes" : "no", m.residual_layer_norm ? "yes" : "no",
      kfa_apps::exact(m.eps).c_str(), params.c_str(), Exec::name());
  std::printf("time: median %.6f s, min %.6f s over %lld run%s\n", tm.median_s, tm.min_s, o.repeat,
              o.repeat == 1 ? "" : "s");
  if (verdict) std::printf("%s\n", kfa_apps::summary("the float64 reference", *verdict).c_str());
  if (!o.out.empty()) std::printf("wrote %s to %s\n", written.c_str(), o.out.c_str());
  if (o.json) {
    auto j = kfa_apps::JsonLine()
                 .add("command", std::string("mha"))
                 .add("pass", o.command)
                 .add("dtype", std::string(kfa_apps::name(o.dtype)))
                 .add("batch", static_cast<long long>(s.B))
                 .add("seqlen", static_cast<long long>(s.L))
                 .add("d_model", static_cast<long long>(s.d))
                 .add("heads_q", static_cast<long long>(m.heads))
                 .add("heads_kv", static_cast<long long>(m.heads_kv))
                 .add("qkv_bias", mp.qkv_bias)
                 .add("out_bias", mp.out_bias)
                 .add("residual_layernorm", m.residual_layer_norm)
                 .add("eps", m.eps)
                 .params(o.params, kfa_apps::read_by(o.pass()))
                 .add("repeat", o.repeat)
                 .add("execution_space", std::string(Exec::name()))
                 .figure("median_s", tm.median_s, 9)
                 .figure("min_s", tm.min_s, 9);
    kfa_apps::add_check(j, verdict);
    std::printf("%s\n", j.str().c_str());
  }
  return !verdict || verdict->ok() ? 0 : 1;
}

}  // namespace

void parse_mha(int argc, char** argv, kfa_apps::RunOptions& o, MhaOptions& m) {
  std::vector<char*> args(argv, argv + argc);
  args.erase(args.begin() + 1);  // "mha": forward or backward is the command
  const auto own = [&](const std::string& flag, const kfa_apps::FlagValue& value) {
    if (flag == "--heads" || flag == "--heads-kv") {
      const long long n = kfa_apps::parse_int(flag, value(), 1);
      if (n > INT_MAX) throw InputError(flag + " must fit in int");
      (flag == "--heads" ? m.heads : m.heads_kv) = static_cast<int>(n);
      return true;
    }
    if (flag == "--residual-layernorm") {
      m.residual_layer_norm = true;
      return true;
    }
    if (flag == "--eps") {
      m.eps = kfa_apps::parse_double(flag, value());
      m.eps_given = true;
      if (m.eps < 0) throw InputError("--eps must be >= 0, got " + kfa_apps::exact(m.eps));
      return true;
    }
    if (flag == "--random") {
      const std::string text = value();
      const std::vector<std::string> parts = kfa_apps::split(text);
      if (parts.size() != 3)
        throw InputError("--random expects B,L,DMODEL (three positive integers), got '" + text +
                         "'");
      m.random = {kfa_apps::parse_int("--random B", parts[0], 1),
                  kfa_apps::parse_int("--random L", parts[1], 1),
                  kfa_apps::parse_int("--random DMODEL", parts[2], 1)};
      for (long long n : m.random)
        if (n > INT_MAX) throw InputError("--random values must fit in int");
      return true;
    }
    if (std::find(kfa_apps::kRunFlags.begin(), kfa_apps::kRunFlags.end(), flag) !=
        kfa_apps::kRunFlags.end())
      return false;
    if (flag != "--seqlen-k" && flag != "--multiscale") {
      o.seed_given = o.seed_given || flag == "--seed";
      if (kfa_apps::parse_pass_flag(flag, value, o.params, o.pass())) return true;
    }
    throw InputError("'" + flag + "' does not apply to kfa mha (it takes " + taken_flags() + ")");
  };
  kfa_apps::parse_command_line(static_cast<int>(args.size()), args.data(), "kfa mha",
                               {"forward", "backward"}, own, o);
  if (o.action != kfa_apps::Action::run) return;
  if (m.heads == 0) throw InputError("kfa mha needs --heads H (the query heads)");
  if (m.heads_kv == 0) m.heads_kv = m.heads;
  if (m.heads % m.heads_kv != 0)
    throw InputError("--heads-kv " + std::to_string(m.heads_kv) + " must divide --heads " +
                     std::to_string(m.heads));
  if (m.eps_given && !m.residual_layer_norm)
    throw InputError("--eps is the layer norm's: it needs --residual-layernorm");
  if (o.dtype != DType::f32 && o.dtype != DType::f64)
    throw InputError(std::string("--dtype ") + kfa_apps::name(o.dtype) +
                     ": kfa mha computes in float or double (the block's gemms)");
  const bool file_mode = !o.in.empty() || !o.out.empty();
  if (file_mode && !m.random.empty())
    throw InputError("--random cannot be combined with --in/--out");
  if (!file_mode && m.random.empty())
    throw InputError("give --in IN.h5 --out OUT.h5 or --random B,L,DMODEL");
  if (file_mode) kfa_apps::check_sources(o);
  kfa_apps::check_dropout_seed(o);
  if (!m.random.empty() && m.random[2] % m.heads != 0)
    throw InputError("--random DMODEL " + std::to_string(m.random[2]) +
                     " is not divisible by --heads " + std::to_string(m.heads));
}

int run_mha(kfa_apps::RunOptions o, const MhaOptions& m) {
  Problem p;
  if (!m.random.empty()) {
    const hsize_t B = m.random[0], L = m.random[1], d = m.random[2];
    const hsize_t hd = d / hsize_t(m.heads), width = (m.heads + 2 * m.heads_kv) * hd;
    const bool bwd = o.command == "backward";
    Sizes s;
    s.B = B;
    s.L = L;
    s.d = d;
    s.hd = hd;
    s.width = width;
    s.inner = m.heads * hd;
    check_memory(s, o.dtype, bwd, "the problem");
    std::mt19937_64 gen(o.data_seed);
    const double amp = 2 / std::sqrt(double(d));  // keeps the projections of order 1
    p.x = kfa_apps::random_dataset({B, L, d}, o.dtype, gen, 0, 1);
    p.w_qkv = kfa_apps::random_dataset({d, width}, o.dtype, gen, 0, amp);
    p.b_qkv = kfa_apps::random_dataset({width}, o.dtype, gen, 0, 0.5);
    p.w_o = kfa_apps::random_dataset({s.inner, d}, o.dtype, gen, 0, amp);
    p.b_o = kfa_apps::random_dataset({d}, o.dtype, gen, 0, 0.5);
    if (m.residual_layer_norm) {
      p.gamma = kfa_apps::random_dataset({d}, o.dtype, gen, 1, 0.5);
      p.beta = kfa_apps::random_dataset({d}, o.dtype, gen, 0, 0.5);
    }
    if (bwd) p.dy = kfa_apps::random_dataset({B, L, d}, o.dtype, gen, 0, 1);
  } else {
    p = read_problem(o, m);
    o.dtype = p.x.dtype;
  }
  const Sizes s = check_shapes(p, m);
  if (o.dtype == DType::f64) return run<double>(o, m, p, s);
  return run<float>(o, m, p, s);
}

}  // namespace kfa_cli
