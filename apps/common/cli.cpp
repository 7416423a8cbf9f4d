#include "cli.hpp"

#include <unistd.h>
#include <Kokkos_Macros.hpp>

#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "h5io.hpp"

namespace kfa_apps {

long long parse_int(const std::string& flag, const std::string& text, long long min) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::out_of_range&) {
    // An integer, too long for any size or count the programs take.
    throw InputError(flag + " is out of range, got " + text);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw InputError(flag + " expects an integer, got '" + text + "'");
  if (v < min) throw InputError(flag + " must be >= " + std::to_string(min) + ", got " + text);
  return v;
}

std::uint64_t parse_uint64(const std::string& flag, const std::string& text) {
  // A sign goes through parse_int, which says "must be >= 0" of a negative number.
  if (!text.empty() && (text[0] == '-' || text[0] == '+'))
    return static_cast<std::uint64_t>(parse_int(flag, text, 0));
  unsigned long long v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec == std::errc::result_out_of_range)
    throw InputError(flag + " must be < 2^64, got " + text);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size())
    throw InputError(flag + " expects an integer, got '" + text + "'");
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    throw InputError(flag + " expects a finite number, got '" + text + "'");
  return v;
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "float" || text == "float32") return DType::f32;
  if (text == "double" || text == "float64") return DType::f64;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "half" || text == "float16") return DType::f16;
  throw InputError(flag + " expects float, double, bf16 or half, got '" + text + "'");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    parts.push_back(item);
  if (!s.empty() && s.back() == ',') parts.push_back("");
  return parts;
}

std::vector<long long> parse_dims(const std::string& flag, const std::string& text,
                                  const char* form, const char* const (&names)[4]) {
  const auto parts = split(text);
  if (parts.size() != 4)
    throw InputError(flag + " expects " + form + " (four integers), got " +
                     std::to_string(parts.size()) + " values");
  std::vector<long long> dims(4);
  for (int i = 0; i < 4; ++i)
    dims[i] = parse_int(flag + " " + names[i], parts[i], 1);
  return dims;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The values the command line accepts for a field, where they are narrower than its type's.
// The library reads scale < 0 as "1/sqrt(head_dim)", which on the command line is leaving
// --scale out; -1 is the only negative window (unbounded); the others fail here with the flag's
// name rather than later with the member's.
struct Range {
  const char* field;
  double lo;
  bool lo_open;
  double hi;  // always open; kInf for none
};
constexpr Range kRanges[] = {
    {"scale", 0, true, kInf},          {"softcap", 0, false, kInf},
    {"dropout", 0, false, 1},          {"window_left", -1, false, kInf},
    {"window_right", -1, false, kInf}, {"num_splits", 0, false, kInf},
};

// What a range asks, as its error says it: "> 0", ">= -1", "in [0, 1)".
std::string rule(const Range& r) {
  const std::string lo = exact(r.lo);
  if (r.hi < kInf)
    return "in " + std::string(r.lo_open ? "(" : "[") + lo + ", " + exact(r.hi) + ")";
  return (r.lo_open ? "> " : ">= ") + lo;
}

void check_range(const kfa::Field& f, const std::string& label, const std::string& text, double v) {
  const Range* found = nullptr;
  for (const Range& r : kRanges)
    if (std::string_view(r.field) == f.name) found = &r;
  if (!found) return;
  const Range& r = *found;
  if (!((r.lo_open ? v > r.lo : v >= r.lo) && v < r.hi))
    throw InputError(label + " must be " + rule(r) + ", got " + text);
}

// Sets member m of field f from the command line: a bool flag takes no value; the rest are read
// by their type and checked against kRanges. `label` names the value in errors.
template <class T>
void set_field(const kfa::Field& f, const std::string& label, const FlagValue& value, T& m) {
  if constexpr (std::is_same_v<T, bool>) {
    m = true;
  } else if constexpr (std::is_enum_v<T>) {
    m = parse_enum<T>(label, value());
  } else {
    const std::string text = value();
    if constexpr (std::is_same_v<T, double>) {
      m = parse_double(label, text);
    } else if constexpr (std::is_same_v<T, std::uint64_t>) {
      m = parse_uint64(label, text);
    } else {
      static_assert(std::is_same_v<T, int>, "a Params member of a type the programs cannot read");
      const long long v = parse_int(label, text, LLONG_MIN);
      if (v < INT_MIN || v > INT_MAX)
        throw InputError(label + " must be in [" + std::to_string(INT_MIN) + ", " +
                         std::to_string(INT_MAX) + "], got " + text);
      m = static_cast<int>(v);
    }
    check_range(f, label, text, static_cast<double>(m));
  }
}

const char* pass_name(kfa::Passes p) {
  return p == kfa::Passes::forward ? "forward" : p == kfa::Passes::backward ? "backward" : "both";
}

// What follows a field's flag in the usage text.
template <class T>
std::string placeholder() {
  if constexpr (std::is_same_v<T, bool>) {
    return "";
  } else if constexpr (std::is_enum_v<T>) {
    std::string s;
    for (const auto& [v, n] : kfa::EnumNames<T>::values)
      s += (s.empty() ? " " : "|") + std::string(n);
    return s;
  } else {
    return std::is_floating_point_v<T> ? " X" : " N";
  }
}

// The shorthand beside the list: one flag for both window fields.
constexpr const char* kWindowFlag = "--window";
constexpr const char* kWindowUsage = "--window LEFT,RIGHT";
constexpr const char* kWindowHelp = "both window fields at once";

}  // namespace

bool parse_pass_flag(const std::string& flag, const FlagValue& value, kfa::Params& p,
                     kfa::Passes pass) {
  if (flag == kWindowFlag) {
    const auto parts = split(value());
    if (parts.size() != 2)
      throw InputError("--window expects LEFT,RIGHT (two integers, -1 = unbounded)");
    const FlagValue left = [&] { return parts[0]; }, right = [&] { return parts[1]; };
    kfa::for_each_field(p, [&](const kfa::Field& f, auto& m) {
      const std::string_view name = f.name;
      if (name == "window_left") set_field(f, "--window LEFT", left, m);
      if (name == "window_right") set_field(f, "--window RIGHT", right, m);
    });
    return true;
  }
  bool found = false;
  kfa::for_each_field(p, [&](const kfa::Field& f, auto& m) {
    if (found || flag != f.flag) return;
    found = true;
    if (!kfa::reads(f, pass))
      throw InputError(flag + " applies to " + pass_name(f.passes) + " only");
    set_field(f, flag, value, m);
  });
  return found;
}

std::string pass_flags_usage() {
  std::ostringstream os;
  auto line = [&](const std::string& flag, const std::string& help) {
    os << "  " << std::left << std::setw(32) << flag << " " << help << "\n";
  };
  const kfa::Params p;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto& m) {
    const std::string only =
        f.passes == kfa::Passes::both ? "" : std::string(pass_name(f.passes)) + " only: ";
    line(f.flag + placeholder<std::decay_t<decltype(m)>>(), only + f.help);
    if (std::string_view(f.name) == "window_right") line(kWindowUsage, kWindowHelp);
  });
  return os.str();
}

kfa::Passes RunOptions::pass() const {
  return command == "forward"    ? kfa::Passes::forward
         : command == "backward" ? kfa::Passes::backward
                                 : kfa::Passes::both;
}

namespace {

std::string one_of(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// Reads one shared flag other than a pass flag; false when `flag` is none of them.
bool parse_run_flag(const std::string& flag, const FlagValue& value, RunOptions& o) {
  if (flag == "--in") {
    o.in = value();
  } else if (flag == "--out") {
    o.out = value();
  } else if (flag == "--random") {
    o.random = parse_dims(flag, value(), "B,H,N,D", {"batch", "heads", "seqlen", "head_dim"});
  } else if (flag == "--heads-kv") {
    o.heads_kv = parse_int(flag, value(), 1);
  } else if (flag == "--seqlen-k") {
    o.seqlen_k = parse_int(flag, value(), 1);
  } else if (flag == "--head-dim-v") {
    o.head_dim_v = parse_int(flag, value(), 1);
  } else if (flag == "--dtype") {
    o.dtype = parse_dtype(flag, value());
  } else if (flag == "--data-seed") {
    o.data_seed = parse_uint64(flag, value());
  } else if (flag == "--repeat") {
    o.repeat = parse_int(flag, value(), 1);
  } else if (flag == "--json") {
    o.json = true;
  } else if (flag == "--check") {
    o.check = true;
  } else if (flag == "--allow-nonfinite") {
    o.allow_nonfinite = true;
  } else if (flag == "--multiscale") {
    o.multiscale = true;
  } else {
    o.seed_given = o.seed_given || flag == "--seed";
    return parse_pass_flag(flag, value, o.params, o.pass());
  }
  return true;
}

// Kokkos' own flags, by the Kokkos the programs were built with, and what their values must
// be. Kokkos reads them itself, but 3.4 aborts on --kokkos-threads=abc (an exception from its
// initialisation) and ignores a flag it does not know, so the programs check them first.
enum class KokkosValue { none, count, index, text };
struct KokkosFlag {
  const char* name;
  KokkosValue value;
};
// Kokkos 3.7 renamed --kokkos-threads, --kokkos-device and --kokkos-ndevices; 4.x no longer
// reads the old names (4.6 warns and ignores them), nor --kokkos-numa.
constexpr KokkosFlag kKokkosFlags[] = {
    {"--kokkos-help", KokkosValue::none},
    {"--kokkos-disable-warnings", KokkosValue::none},
    {"--kokkos-tune-internals", KokkosValue::none},
    {"--kokkos-tools-library", KokkosValue::text},
    {"--kokkos-tools-args", KokkosValue::text},
#if KOKKOS_VERSION < 40000
    {"--kokkos-threads", KokkosValue::count},
    {"--kokkos-numa", KokkosValue::count},
    {"--kokkos-device", KokkosValue::index},
    {"--kokkos-ndevices", KokkosValue::text},
#endif
#if KOKKOS_VERSION >= 30700
    {"--kokkos-num-threads", KokkosValue::count},
    {"--kokkos-device-id", KokkosValue::index},
    {"--kokkos-map-device-id-by", KokkosValue::text},
    {"--kokkos-print-configuration", KokkosValue::none},
    {"--kokkos-tools-libs", KokkosValue::text},
    {"--kokkos-tools-help", KokkosValue::none},
#endif
#if KOKKOS_VERSION >= 30700 && KOKKOS_VERSION < 40000
    {"--kokkos-num-devices", KokkosValue::text},
#endif
};

#if defined(KOKKOS_ENABLE_OPENMP) || defined(KOKKOS_ENABLE_THREADS) || \
    defined(KOKKOS_ENABLE_PTHREAD) || defined(KOKKOS_ENABLE_HPX)
constexpr bool kThreadedHost = true;
#else
constexpr bool kThreadedHost = false;
#endif

void check_kokkos_flag(const std::string& arg, const char* program) {
  const std::size_t eq = arg.find('=');
  const std::string name = arg.substr(0, eq);
  const KokkosFlag* found = nullptr;
  for (const KokkosFlag& f : kKokkosFlags)
    if (name == f.name) found = &f;
  if (!found) {
    std::string known;
    for (const KokkosFlag& f : kKokkosFlags)
      known += (known.empty() ? "" : ", ") + std::string(f.name);
    throw InputError("unknown option '" + arg + "' (this Kokkos " +
                     std::to_string(KOKKOS_VERSION / 10000) + "." +
                     std::to_string(KOKKOS_VERSION / 100 % 100) + " takes " + known + "; see " +
                     program + " --help)");
  }
  if (found->value == KokkosValue::none) {
    if (eq != std::string::npos) throw InputError(name + " takes no value, got '" + arg + "'");
    return;
  }
  if (eq == std::string::npos) throw InputError(name + " expects a value: " + name + "=VALUE");
  const std::string text = arg.substr(eq + 1);
  if (found->value == KokkosValue::text) return;
  const long long v = parse_int(name, text, found->value == KokkosValue::count ? 1 : 0);
  if (v > INT_MAX) throw InputError(name + " must fit in int, got " + text);
  const bool threads = name == "--kokkos-threads" || name == "--kokkos-num-threads";
  if (threads && v > 1 && !kThreadedHost)
    throw InputError(arg + ": this build's Kokkos has no threaded host backend (OpenMP or " +
                     "Threads), so it runs on one thread; leave the flag out");
}

InputError unknown_option(const std::string& flag, const char* program) {
  return InputError("unknown option '" + flag + "' (see " + program + " --help)");
}

Action action_of(const std::string& flag) {
  if (flag == "--help" || flag == "-h") return Action::help;
  if (flag == "--version") return Action::version;
  return Action::run;
}

}  // namespace

void parse_command_line(int argc, char** argv, const char* program,
                        const std::vector<std::string>& commands, const FlagReader& own,
                        RunOptions& o) {
  if (argc < 2) throw InputError(std::string("missing command (see ") + program + " --help)");
  o.command = argv[1];
  o.action = action_of(o.command);
  if (o.action != Action::run) return;
  bool known = false;
  for (const std::string& c : commands)
    known = known || c == o.command;
  if (!known)
    throw InputError("unknown command '" + o.command + "' (expected: " + one_of(commands) + ")");
  for (int a = 2; a < argc; ++a) {
    const std::string flag = argv[a];
    if (flag.rfind("--kokkos-", 0) == 0) {  // Kokkos' own flags, read by Kokkos
      check_kokkos_flag(flag, program);
      continue;
    }
    o.action = action_of(flag);
    if (o.action != Action::run) return;
    const FlagValue value = [&]() -> std::string {
      if (a + 1 >= argc) throw InputError(flag + " expects a value");
      return argv[++a];
    };
    if (!own(flag, value) && !parse_run_flag(flag, value, o)) throw unknown_option(flag, program);
  }
}

void check_dropout_seed(const RunOptions& o) {
  if (o.params.dropout > 0 && !o.seed_given)
    throw InputError(
        "--dropout needs --seed N: the mask is a function of the seed (give the "
        "backward the forward's --seed and --offset)");
}

void check_multiscale(RunOptions& o) {
  if (!o.multiscale) return;
  if (o.params.softcap != 0) throw InputError("--softcap does not apply to --multiscale");
  if (o.params.dropout != 0) throw InputError("--dropout does not apply to --multiscale");
  if (o.params.scale < 0) o.params.scale = 1;  // the multi-scale formula has no scale
}

kfa::msa::Params msa_params(const RunOptions& o) {
  kfa::msa::Params m;
  m.scale = o.params.scale;
  m.causal = o.params.causal;
  m.align = o.params.align;
  m.window_left = o.params.window_left;
  m.window_right = o.params.window_right;
  m.deterministic = o.params.deterministic;
  m.dq_mode = o.params.dq_mode;
  m.num_splits = o.params.num_splits;
  return m;
}

void check_sources(const RunOptions& o) {
  const bool file_mode = !o.in.empty() || !o.out.empty();
  if (file_mode && !o.random.empty())
    throw InputError("--random cannot be combined with --in/--out");
  if (!file_mode && o.random.empty())
    throw InputError("give --in IN.h5 --out OUT.h5 or --random B,H,N,D");
  if (file_mode && (o.in.empty() || o.out.empty()))
    throw InputError(o.in.empty() ? "--out needs --in" : "--in needs --out");
  // The output replaces OUT by a rename at the end, so an OUT that is the input file (by any
  // path: same device and inode) would destroy the input.
  std::error_code ec;
  if (file_mode && std::filesystem::equivalent(o.in, o.out, ec))
    throw InputError("--out " + o.out + " is the input file " + o.in +
                     " (the output would replace it); choose another --out");
  if (file_mode) check_output_path(o.out);
  check_dropout_seed(o);
  if (file_mode && (o.heads_kv || o.seqlen_k))
    throw InputError("--heads-kv and --seqlen-k apply to --random only");
  if (!o.random.empty() && o.heads_kv && o.random[1] % *o.heads_kv != 0)
    throw InputError("--heads-kv " + std::to_string(*o.heads_kv) +
                     " must divide the heads of --random (" + std::to_string(o.random[1]) + ")");
  for (long long n : o.random)
    if (n > INT_MAX) throw InputError("--random values must fit in int");
  if (o.seqlen_k && *o.seqlen_k > INT_MAX) throw InputError("--seqlen-k must fit in int");
  if (file_mode && o.head_dim_v)
    throw InputError("--head-dim-v applies to --random only (a file's /v has its own head dim)");
  if (o.head_dim_v && *o.head_dim_v > INT_MAX) throw InputError("--head-dim-v must fit in int");
}

double physical_memory() {
  const double pages = double(sysconf(_SC_PHYS_PAGES)), page = double(sysconf(_SC_PAGE_SIZE));
  return pages > 0 && page > 0 ? pages * page : 0;
}

void require_memory(double bytes, const std::string& what, double available) {
  if (available > 0 && bytes > 0.9 * available) {
    std::ostringstream os;
    os.precision(3);
    os << what << " needs about " << bytes / (1 << 30) << " GiB but this machine has "
       << available / (1 << 30) << " GiB of memory (" << static_cast<unsigned long long>(bytes)
       << " bytes needed, " << static_cast<unsigned long long>(available) << " there)";
    throw InputError(os.str());
  }
}

std::string exact(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace kfa_apps
