#pragma once
// What the kfa programs print: the run description, the JSON line, the check's verdict and
// --version. The pass parameters in each are written from the one list of kfa::Params' fields
// (kfa::for_each_field), so both programs report every field the same way.

#include <kfa/params.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cli.hpp"

namespace kfa_apps {

/// A value as the programs print it: bool as true/false, an enum by its kfa::EnumNames name,
/// an integer in decimal, a double exactly (exact()).
template <class T>
std::string text_of(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_enum_v<T>)
    return kfa::name_of(v);
  else if constexpr (std::is_floating_point_v<T>)
    return exact(v);
  else
    return std::to_string(v);
}

/// Which fields of the list a line shows.
using FieldFilter = std::function<bool(const kfa::Field&)>;

/// The fields `pass` reads; every field for Passes::both.
FieldFilter read_by(kfa::Passes pass);

/// "name=value" for each field of p that `show` keeps, separated by spaces.
std::string describe_params(const kfa::Params& p, const FieldFilter& show);

/// One JSON object on one line, written key by key in the order given.
class JsonLine {
 public:
  /// "key":v with v as text_of writes it, strings and enum names quoted.
  template <class T>
  JsonLine& add(const std::string& key, const T& v) {
    if constexpr (std::is_convertible_v<T, std::string>)
      return raw(key, quoted(v));
    else if constexpr (std::is_enum_v<T>)
      return raw(key, quoted(text_of(v)));
    else
      return raw(key, text_of(v));
  }
  /// A measured value, to `digits` significant digits (it is not reread to reproduce a run).
  JsonLine& figure(const std::string& key, double x, int digits);
  /// An array of measured values, to `digits` significant digits.
  JsonLine& figures(const std::string& key, const std::vector<double>& xs, int digits);
  /// Every field of p that `show` keeps, under its name.
  JsonLine& params(const kfa::Params& p, const FieldFilter& show);
  /// The object, without a newline.
  std::string str() const { return "{" + body_ + "}"; }

 private:
  static std::string quoted(const std::string& s);
  JsonLine& raw(const std::string& key, const std::string& value);
  std::string body_;
};

/// The sizes of an attention problem.
struct Dims {
  long long batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  long long head_dim_v = 0;  ///< v's head dim Dv; 0: head_dim
  /// v's head dim.
  long long dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

/// The run description: "PROGRAM COMMAND: B=.. Hq=.. Hkv=.. Nq=.. Nk=.. D=.. [Dv=..] DTYPE"
/// (Dv where v's head dim differs from D), the fields
/// the command's pass reads as name=value, `extra` (the program's own, may be empty) and the
/// execution space.
std::string describe(const char* program, const RunOptions& o, const Dims& d, DType dtype,
                     const std::string& extra);

/// The fields a pass's JSON line starts with: command, dtype, the sizes (batch, heads_q,
/// heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v), every field of the list, repeat and
/// execution_space.
JsonLine pass_json(const RunOptions& o, const Dims& d, DType dtype);

/// The FLOPs of the command's pass on a problem of sizes d (kfa::forward_flops or
/// kfa::backward_flops).
double pass_flops(const RunOptions& o, const Dims& d);

/// One output under --check: its name in the summary, its JSON key (err_KEY, bound_KEY) and
/// the tolerance rule's result.
struct NamedCheck {
  std::string label, key;
  kfa::reference::Check check;
};

/// --check's verdict over a pass's outputs.
struct Verdict {
  std::vector<NamedCheck> checks;
  /// Whether the rule holds on every output.
  bool ok() const;
};

/// "check against AGAINST: O err .. (bound ..), LSE err .. (bound ..): PASS" (or FAIL).
std::string summary(const std::string& against, const Verdict& v);

/// "check": "not run", "pass" or "fail", and err_KEY and bound_KEY of each output checked.
void add_check(JsonLine& j, const std::optional<Verdict>& v);

/// The median of times sorted in increasing order (not empty).
double median(const std::vector<double>& sorted);

/// Wall times of a timed pass.
struct Timing {
  double median_s = 0;  ///< median over the repeats
  double min_s = 0;     ///< fastest repeat
};

/// Runs pass() once untimed (warm-up; its output is the one written), then `repeat` times
/// between fences, and returns the median and minimum wall time of the repeats.
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
  return {median(times), times.front()};
}

/// kfa::Error's message without its "kfa: " prefix (the programs put their own name first).
std::string message_of(const kfa::Error& e);

/// What `PROGRAM --version` prints: kfa's version and configuration (<kfa/config.hpp>), the
/// Kokkos the program was compiled with, its execution spaces and the default one.
std::string version_text(const char* program);

}  // namespace kfa_apps
