#include "report.hpp"

#include <kfa/config.hpp>
#include <kfa/flops.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string_view>

namespace kfa_apps {

FieldFilter read_by(kfa::Passes pass) {
  return [pass](const kfa::Field& f) { return kfa::reads(f, pass); };
}

std::string describe_params(const kfa::Params& p, const FieldFilter& show) {
  std::string s;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto& m) {
    if (!show(f)) return;
    // The description is for people: an unbounded window side reads "none", not -1 (the JSON
    // line keeps the field's value).
    const std::string_view name = f.name;
    std::string value = text_of(m);
    if ((name == "window_left" || name == "window_right") && value == "-1") value = "none";
    s += (s.empty() ? "" : " ") + std::string(f.name) + "=" + value;
  });
  return s;
}

std::string JsonLine::quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

JsonLine& JsonLine::raw(const std::string& key, const std::string& value) {
  body_ += (body_.empty() ? "" : ",") + quoted(key) + ":" + value;
  return *this;
}

namespace {
std::string to_digits(double x, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

// JSON has no inf or NaN: a non-finite figure (an infinite error, say) is written as null.
std::string json_number(double x, int digits) {
  return std::isfinite(x) ? to_digits(x, digits) : "null";
}
}  // namespace

JsonLine& JsonLine::figure(const std::string& key, double x, int digits) {
  return raw(key, json_number(x, digits));
}

JsonLine& JsonLine::figures(const std::string& key, const std::vector<double>& xs, int digits) {
  std::string a;
  for (double x : xs)
    a += (a.empty() ? "" : ",") + json_number(x, digits);
  return raw(key, "[" + a + "]");
}

JsonLine& JsonLine::params(const kfa::Params& p, const FieldFilter& show) {
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto& m) {
    if (show(f)) add(f.name, m);
  });
  return *this;
}

std::string describe(const char* program, const RunOptions& o, const Dims& d, DType dtype,
                     const std::string& extra) {
  std::ostringstream os;
  os << program << " " << o.command << ": B=" << d.batch << " Hq=" << d.heads_q
     << " Hkv=" << d.heads_kv << " Nq=" << d.seqlen_q << " Nk=" << d.seqlen_k << " D=" << d.head_dim
     << (d.dv() != d.head_dim ? " Dv=" + std::to_string(d.dv()) : "") << " " << name(dtype) << " "
     << describe_params(o.params, read_by(o.pass())) << (extra.empty() ? "" : " ") << extra
     << " on " << Kokkos::DefaultExecutionSpace::name();
  return os.str();
}

JsonLine pass_json(const RunOptions& o, const Dims& d, DType dtype) {
  JsonLine j;
  j.add("command", o.command)
      .add("dtype", name(dtype))
      .add("batch", d.batch)
      .add("heads_q", d.heads_q)
      .add("heads_kv", d.heads_kv)
      .add("seqlen_q", d.seqlen_q)
      .add("seqlen_k", d.seqlen_k)
      .add("head_dim", d.head_dim)
      .add("head_dim_v", d.dv())
      .params(o.params, read_by(kfa::Passes::both))
      .add("repeat", o.repeat)
      .add("execution_space", Kokkos::DefaultExecutionSpace::name());
  return j;
}

double pass_flops(const RunOptions& o, const Dims& d) {
  const auto flops = o.pass() == kfa::Passes::backward ? kfa::backward_flops : kfa::forward_flops;
  return flops(int(d.batch), int(d.heads_q), int(d.seqlen_q), int(d.seqlen_k), int(d.head_dim),
               o.params, int(d.dv()));
}

bool Verdict::ok() const {
  for (const NamedCheck& c : checks)
    if (!c.check.ok()) return false;
  return true;
}

std::string summary(const std::string& against, const Verdict& v) {
  std::string s = "check against " + against + ":";
  for (std::size_t i = 0; i < v.checks.size(); ++i) {
    const NamedCheck& c = v.checks[i];
    s += (i ? ", " : " ") + c.label + " err " + to_digits(c.check.err, 3) + " (bound " +
         to_digits(c.check.bound, 3) + ")";
  }
  return s + (v.ok() ? ": PASS" : ": FAIL");
}

void add_check(JsonLine& j, const std::optional<Verdict>& v) {
  j.add("check", !v ? "not run" : v->ok() ? "pass" : "fail");
  if (v)
    for (const NamedCheck& c : v->checks)
      j.figure("err_" + c.key, c.check.err, 6).figure("bound_" + c.key, c.check.bound, 6);
}

double median(const std::vector<double>& sorted) {
  const std::size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

std::string message_of(const kfa::Error& e) {
  const std::string msg = e.what();
  return msg.rfind("kfa: ", 0) == 0 ? msg.substr(5) : msg;
}

std::string version_text(const char* program) {
  std::string spaces;
  for (const char* s : {
#ifdef KOKKOS_ENABLE_SERIAL
           "Serial",
#endif
#ifdef KOKKOS_ENABLE_OPENMP
           "OpenMP",
#endif
#ifdef KOKKOS_ENABLE_THREADS
           "Threads",
#endif
#ifdef KOKKOS_ENABLE_CUDA
           "Cuda",
#endif
#ifdef KOKKOS_ENABLE_HIP
           "HIP",
#endif
#ifdef KOKKOS_ENABLE_SYCL
           "SYCL",
#endif
           ""})
    if (*s) spaces += (spaces.empty() ? "" : ", ") + std::string(s);
#ifdef KFA_ENABLE_MPI
  const char* mpi = "on";
#else
  const char* mpi = "off";
#endif
#ifdef KFA_CUDA_TF32
  const char* tf32 = "on";
#else
  const char* tf32 = "off";
#endif
  std::ostringstream os;
  os << program << " " << KFA_VERSION_STRING << "\n"
     << "configured: kfa::mpi " << mpi << ", CUDA tf32 " << tf32 << ", Kokkos "
     << KFA_CONFIGURED_KOKKOS_VERSION << " (" << KFA_CONFIGURED_KOKKOS_BACKENDS << ")\n"
     << "Kokkos " << KOKKOS_VERSION / 10000 << "." << KOKKOS_VERSION / 100 % 100 << "."
     << KOKKOS_VERSION % 100 << ": execution spaces " << spaces << "; default "
     << Kokkos::DefaultExecutionSpace::name() << "\n";
  return os.str();
}

}  // namespace kfa_apps
