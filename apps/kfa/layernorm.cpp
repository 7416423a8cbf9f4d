// kfa layernorm forward|backward: kfa::layer_norm on a file's /x (rows, D), optional /residual
// (rows, D), /gamma and /beta (D), writing /y, /mean and /rstd; the backward recomputes the
// forward and, from /dy (rows, D), writes /dx (which is also dL/dresidual), /dgamma and /dbeta.
// Or on a random problem (--random ROWS,D: x, gamma, beta and dy drawn, no residual).
#include "layernorm.hpp"

#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
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

const char* const kLayerNormUsage =
    "usage: kfa layernorm forward|backward (--in IN.h5 --out OUT.h5 | --random ROWS,D\n"
    "                   [--dtype float|double|bf16|half] [--data-seed S]) [--eps E] [--unbiased]\n"
    "                   [--repeat R] [--json] [--check] [--allow-nonfinite]\n"
    "  y = (z - mean) / sqrt(var + eps) * gamma + beta per row, z = x + residual\n"
    "  forward:  reads /x (ROWS, D), /residual (ROWS, D) if present, /gamma /beta (D);\n"
    "            writes /y, /mean and /rstd (ROWS)\n"
    "  backward: reads the same and /dy (ROWS, D), recomputes the forward, writes /dx (also\n"
    "            the gradient of /residual), /dgamma and /dbeta\n"
    "  --eps E: added to the variance (default 1e-5)\n"
    "  --unbiased: var = M2 / (D - 1) (default M2 / D, PyTorch's)\n"
    "  --random ROWS,D: x, gamma, beta (and dy) drawn from --data-seed; no residual\n"
    "  --check: compare with the float64 reference under the tolerance rule (exit 1 if broken)\n"
    "  --json: one JSON object of the run on the last line of stdout\n"
    "exit status: 0 success, 1 --check failed, 2 bad input or usage (one line on stderr)\n";

namespace {

// Besides kfa_apps::kRunFlags every other shared flag (the attention pass flags, --heads-kv,
// --seqlen-k) is refused.
std::string taken_flags() {
  return kfa_apps::with_run_flags("--eps, --unbiased, --random");
}

struct Problem {
  Dataset x, residual, gamma, beta, dy;
};

// Every header is checked before anything is read: ranks, one type, shapes against /x (both
// shapes named), and no dataset the pass would not read.
Problem read_problem(const kfa_apps::RunOptions& o) {
  const bool bwd = o.command == "backward";
  kfa_apps::H5File in(o.in);
  for (const std::string& n : in.names())
    if (n != "/x" && n != "/residual" && n != "/gamma" && n != "/beta" && (n != "/dy" || !bwd))
      throw InputError("'" + o.in + "' holds " + n + ", which kfa layernorm " + o.command +
                       " does not read (forward reads /x /gamma /beta and /residual; backward "
                       "also /dy): remove it, or it would be silently ignored");
  Problem p;
  p.x = in.header("/x", 2);
  p.gamma = in.header("/gamma", 1);
  p.beta = in.header("/beta", 1);
  if (in.has("/residual")) p.residual = in.header("/residual", 2);
  if (bwd) p.dy = in.header("/dy", 2);
  const auto shape = [](const Dataset& d) { return kfa_apps::shape_of(d.dims); };
  if (p.x.dims[0] == 0 || p.x.dims[1] == 0)
    throw InputError("dataset /x has shape " + shape(p.x) + "; ROWS and D must be >= 1");
  if (p.x.dims[0] > INT_MAX || p.x.dims[1] > INT_MAX)
    throw InputError("dataset /x has shape " + shape(p.x) + "; ROWS and D must fit in int");
  const std::vector<std::pair<const Dataset*, const char*>> rows = {{&p.residual, "/residual"},
                                                                    {&p.dy, "/dy"}},
                                                            vecs = {{&p.gamma, "/gamma"},
                                                                    {&p.beta, "/beta"}};
  for (const auto& [d, name] : rows)
    if (!d->dims.empty() && d->dims != p.x.dims)
      throw InputError(std::string("dataset ") + name + " has shape " + shape(*d) +
                       " but /x has shape " + shape(p.x));
  for (const auto& [d, name] : vecs)
    if (d->dims[0] != p.x.dims[1])
      throw InputError(std::string("dataset ") + name + " has shape " + shape(*d) +
                       " but must be (" + std::to_string(p.x.dims[1]) +
                       ") = (D) from /x of shape " + shape(p.x));
  for (const auto& [d, name] : {std::pair{&p.residual, "/residual"},
                                {&p.gamma, "/gamma"},
                                {&p.beta, "/beta"},
                                {&p.dy, "/dy"}})
    if (!d->dims.empty() && d->dtype != p.x.dtype)
      throw InputError(std::string("dataset ") + name + " is " + kfa_apps::name(d->dtype) +
                       " but /x is " + kfa_apps::name(p.x.dtype) +
                       "; all inputs must share one type");
  // x, residual, dy, y (and dx) in the kernel's type and as doubles, plus the statistics.
  const double row_elems = double(p.x.size());
  kfa_apps::require_memory(row_elems * (bwd ? 5 : 3) * (8 + 8) + double(p.x.dims[0]) * 32,
                           "dataset /x " + shape(p.x) + " in '" + o.in + "'");
  const bool has_res = !p.residual.dims.empty();
  p.x = in.read("/x", 2);
  p.gamma = in.read("/gamma", 1);
  p.beta = in.read("/beta", 1);
  if (has_res) p.residual = in.read("/residual", 2);
  if (bwd) p.dy = in.read("/dy", 2);
  if (!o.allow_nonfinite)
    for (const auto& [d, name] : {std::pair{&p.x, "/x"},
                                  {&p.residual, "/residual"},
                                  {&p.gamma, "/gamma"},
                                  {&p.beta, "/beta"},
                                  {&p.dy, "/dy"}})
      if (!d->dims.empty())
        kfa_apps::refuse_non_finite(*d, std::string("dataset ") + name + " in '" + o.in + "'");
  return p;
}

template <class T>
int run(const kfa_apps::RunOptions& o, const LayerNormOptions& ln, const Problem& p) {
  using Rows = Kokkos::View<T**, Kokkos::LayoutRight, Exec::memory_space>;
  using Vec = Kokkos::View<T*, Exec::memory_space>;
  using S = kfa::backends::accum_t<T>;
  using Stat = Kokkos::View<S*, Exec::memory_space>;
  const bool bwd = o.command == "backward", has_res = !p.residual.dims.empty();
  const std::size_t rows = p.x.dims[0], D = p.x.dims[1];
  const auto x = kfa_apps::dataset_to_view<Rows>(p.x, "kfa::x");
  const Rows res = has_res ? kfa_apps::dataset_to_view<Rows>(p.residual, "kfa::residual") : Rows();
  const auto gamma = kfa_apps::dataset_to_view<Vec>(p.gamma, "kfa::gamma");
  const auto beta = kfa_apps::dataset_to_view<Vec>(p.beta, "kfa::beta");
  Rows y(std::string("kfa::y"), rows, D);
  Stat mean(std::string("kfa::mean"), rows), rstd(std::string("kfa::rstd"), rows);
  const auto forward = [&] {
    kfa::layer_norm(Exec(), x, res, gamma, beta, y, mean, rstd, ln.params);
  };
  Rows dy, dx;
  Vec dgamma, dbeta;
  kfa_apps::Timing tm;
  if (bwd) {
    dy = kfa_apps::dataset_to_view<Rows>(p.dy, "kfa::dy");
    dx = Rows(std::string("kfa::dx"), rows, D);
    dgamma = Vec(std::string("kfa::dgamma"), D);
    dbeta = Vec(std::string("kfa::dbeta"), D);
    forward();  // once, untimed: the backward times alone
    tm = kfa_apps::time_pass(o.repeat, [&] {
      kfa::layer_norm_backward(Exec(), x, res, gamma, mean, rstd, dy, dx, dgamma, dbeta, ln.params);
    });
  } else {
    tm = kfa_apps::time_pass(o.repeat, forward);
  }
  const DType stat_type = o.dtype == DType::f64 ? DType::f64 : DType::f32;
  std::vector<std::pair<std::string, Dataset>> out;
  if (o.check || !o.out.empty()) {
    if (bwd) {
      out = {{"/dx", kfa_apps::view_to_dataset(dx, o.dtype)},
             {"/dgamma", kfa_apps::view_to_dataset(dgamma, o.dtype)},
             {"/dbeta", kfa_apps::view_to_dataset(dbeta, o.dtype)}};
    } else {
      out = {{"/y", kfa_apps::view_to_dataset(y, o.dtype)},
             {"/mean", kfa_apps::view_to_dataset(mean, stat_type)},
             {"/rstd", kfa_apps::view_to_dataset(rstd, stat_type)}};
    }
  }
  std::optional<kfa_apps::Verdict> verdict;
  if (o.check) {
    namespace ref = kfa::reference;
    const auto px = kfa_apps::reference_rows(p.x), pres = kfa_apps::reference_rows(p.residual),
               pdy = kfa_apps::reference_rows(p.dy);
    const auto pg = kfa_apps::reference_vector(p.gamma), pb = kfa_apps::reference_vector(p.beta);
    const double eps = ln.params.eps;
    const bool unb = ln.params.unbiased;
    // Each output of the reference in precision P (double: the oracle).
    const auto reference = [&](auto precision) {
      using P = decltype(precision);
      std::vector<ref::Tensor2> r2 = {ref::Tensor2("y", rows, D), ref::Tensor2("dx", rows, D)};
      std::vector<ref::Tensor1> r1 = {ref::Tensor1("mean", rows), ref::Tensor1("rstd", rows),
                                      ref::Tensor1("dgamma", D), ref::Tensor1("dbeta", D)};
      ref::layer_norm<P>(px, pres, pg, pb, eps, unb, r2[0], r1[0], r1[1]);
      if (bwd) ref::layer_norm_backward<P>(px, pres, pg, eps, unb, pdy, r2[1], r1[2], r1[3]);
      return std::pair{r2, r1};
    };
    const auto ref64 = reference(double());
    const auto naive = std::is_same_v<T, double> ? ref64 : reference(T());
    const auto got2 = [&](std::size_t i) { return kfa_apps::reference_rows(out[i].second); };
    const auto got1 = [&](std::size_t i) { return kfa_apps::reference_vector(out[i].second); };
    using ref::apply_rule;
    if (bwd)
      verdict = kfa_apps::Verdict{
          {{"dx", "dx", apply_rule<T>(got2(0), naive.first[1], ref64.first[1])},
           {"dgamma", "dgamma", apply_rule<T>(got1(1), naive.second[2], ref64.second[2])},
           {"dbeta", "dbeta", apply_rule<T>(got1(2), naive.second[3], ref64.second[3])}}};
    else
      verdict = kfa_apps::Verdict{
          {{"y", "y", apply_rule<T>(got2(0), naive.first[0], ref64.first[0])},
           {"mean", "mean", apply_rule<T>(got1(1), naive.second[0], ref64.second[0])},
           {"rstd", "rstd", apply_rule<T>(got1(2), naive.second[1], ref64.second[1])}}};
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
  std::printf("kfa layernorm %s: rows=%zu D=%zu %s eps=%s unbiased=%s residual=%s on %s\n",
              o.command.c_str(), rows, D, kfa_apps::name(o.dtype),
              kfa_apps::exact(ln.params.eps).c_str(), ln.params.unbiased ? "true" : "false",
              has_res ? "yes" : "no", Exec::name());
  std::printf("time: median %.6f s, min %.6f s over %lld run%s\n", tm.median_s, tm.min_s, o.repeat,
              o.repeat == 1 ? "" : "s");
  if (verdict) std::printf("%s\n", kfa_apps::summary("the float64 reference", *verdict).c_str());
  if (!o.out.empty()) std::printf("wrote %s to %s\n", written.c_str(), o.out.c_str());
  if (o.json) {
    auto j = kfa_apps::JsonLine()
                 .add("command", std::string("layernorm"))
                 .add("pass", o.command)
                 .add("dtype", std::string(kfa_apps::name(o.dtype)))
                 .add("rows", static_cast<long long>(rows))
                 .add("d", static_cast<long long>(D))
                 .add("residual", has_res)
                 .add("eps", ln.params.eps)
                 .add("unbiased", ln.params.unbiased)
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

void parse_layer_norm(int argc, char** argv, kfa_apps::RunOptions& o, LayerNormOptions& ln) {
  std::vector<char*> args(argv, argv + argc);
  args.erase(args.begin() + 1);  // "layernorm": forward or backward is the command
  const auto own = [&](const std::string& flag, const kfa_apps::FlagValue& value) {
    if (flag == "--eps") {
      ln.params.eps = kfa_apps::parse_double(flag, value());
      if (ln.params.eps < 0)
        throw InputError("--eps must be >= 0, got " + kfa_apps::exact(ln.params.eps));
      return true;
    }
    if (flag == "--unbiased") {
      ln.params.unbiased = true;
      return true;
    }
    if (flag == "--random") {
      const std::string text = value();
      const std::vector<std::string> parts = kfa_apps::split(text);
      if (parts.size() != 2)
        throw InputError("--random expects ROWS,D (two positive integers), got '" + text + "'");
      ln.random = {kfa_apps::parse_int("--random ROWS", parts[0], 1),
                   kfa_apps::parse_int("--random D", parts[1], 1)};
      for (long long n : ln.random)
        if (n > INT_MAX) throw InputError("--random values must fit in int");
      return true;
    }
    if (std::find(kfa_apps::kRunFlags.begin(), kfa_apps::kRunFlags.end(), flag) !=
        kfa_apps::kRunFlags.end())
      return false;
    throw InputError("'" + flag + "' does not apply to kfa layernorm (it takes " + taken_flags() +
                     ")");
  };
  kfa_apps::parse_command_line(static_cast<int>(args.size()), args.data(), "kfa layernorm",
                               {"forward", "backward"}, own, o);
  if (o.action != kfa_apps::Action::run) return;
  const bool file_mode = !o.in.empty() || !o.out.empty();
  if (file_mode && !ln.random.empty())
    throw InputError("--random cannot be combined with --in/--out");
  if (!file_mode && ln.random.empty())
    throw InputError("give --in IN.h5 --out OUT.h5 or --random ROWS,D");
  if (file_mode) kfa_apps::check_sources(o);
  if (ln.params.unbiased && !ln.random.empty() && ln.random[1] < 2)
    throw InputError("--unbiased divides by D - 1 and needs D >= 2");
}

int run_layer_norm(kfa_apps::RunOptions o, const LayerNormOptions& ln) {
  Problem p;
  if (!ln.random.empty()) {
    const hsize_t rows = ln.random[0], D = ln.random[1];
    const bool bwd = o.command == "backward";
    kfa_apps::require_memory(double(rows) * double(D) * (bwd ? 5 : 3) * 16, "the problem");
    std::mt19937_64 gen(o.data_seed);
    p.x = kfa_apps::random_dataset({rows, D}, o.dtype, gen, 0, 1);
    p.gamma = kfa_apps::random_dataset({D}, o.dtype, gen, 1, 0.5);
    p.beta = kfa_apps::random_dataset({D}, o.dtype, gen, 0, 0.5);
    if (bwd) p.dy = kfa_apps::random_dataset({rows, D}, o.dtype, gen, 0, 1);
  } else {
    p = read_problem(o);
    o.dtype = p.x.dtype;
  }
  if (ln.params.unbiased && p.x.dims[1] < 2)
    throw InputError("--unbiased divides by D - 1 and needs D >= 2; /x has shape " +
                     kfa_apps::shape_of(p.x.dims));
  return kfa_apps::with_value_type(o.dtype, [&](auto v) { return run<decltype(v)>(o, ln, p); });
}

}  // namespace kfa_cli
