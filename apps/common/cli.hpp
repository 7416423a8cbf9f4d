#pragma once
// Command-line pieces shared by the kfa programs: number parsing with errors that name the
// flag, the command line both programs share, and the pass flags, read from the one list of
// kfa::Params' fields (kfa::for_each_field), so a new parameter needs no code here.

#include <kfa/params.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "h5io.hpp"

namespace kfa_apps {

/// The run flags of parse_command_line that the subcommands besides the attention passes
/// (kfa layernorm, kfa mha) take: the data, repeats and reports.
inline const std::vector<std::string> kRunFlags = {
    "--in",     "--out",  "--dtype", "--data-seed",
    "--repeat", "--json", "--check", "--allow-nonfinite"};

/// `own`, then kRunFlags, comma-separated: what such a subcommand says it takes.
inline std::string with_run_flags(std::string own) {
  for (const std::string& f : kRunFlags)
    own += ", " + f;
  return own;
}

/// An integer >= min for `flag`; throws InputError naming the flag otherwise.
long long parse_int(const std::string& flag, const std::string& text, long long min);

/// An integer in [0, 2^64) for `flag`; throws InputError naming the flag otherwise.
std::uint64_t parse_uint64(const std::string& flag, const std::string& text);

/// A finite number for `flag`; throws InputError naming the flag otherwise.
double parse_double(const std::string& flag, const std::string& text);

/// float (or float32), double (float64), bf16 (bfloat16) or half (float16) for `flag`; throws
/// InputError naming the flag otherwise.
DType parse_dtype(const std::string& flag, const std::string& text);

/// The value of E named `text` (kfa::EnumNames) for `flag`; throws InputError listing the
/// names otherwise.
template <class E>
E parse_enum(const std::string& flag, const std::string& text) {
  E e{};
  if (!kfa::parse_name(text, e))
    throw InputError(flag + " expects " + kfa::names_of<E>() + ", got '" + text + "'");
  return e;
}

/// "a,b,c" -> {"a", "b", "c"}; a trailing comma gives a trailing empty part.
std::vector<std::string> split(const std::string& s);

/// Four positive integers for `flag`, written `form` (e.g. "B,H,N,D") and named by `names` in
/// errors.
std::vector<long long> parse_dims(const std::string& flag, const std::string& text,
                                  const char* form, const char* const (&names)[4]);

/// Fetches the argument of the flag being read; throws InputError when there is none.
using FlagValue = std::function<std::string()>;

/// Reads one pass flag into p: the flag of any field of kfa::for_each_field, or the shorthand
/// --window LEFT,RIGHT for both window fields. `pass` is the command's pass: a flag of a field
/// the pass does not read is refused ("--splits applies to forward only"); Passes::both takes
/// every flag. Returns false when `flag` is not a pass flag.
bool parse_pass_flag(const std::string& flag, const FlagValue& value, kfa::Params& p,
                     kfa::Passes pass);

/// The pass flags' usage lines, one a field, from the list.
std::string pass_flags_usage();

/// What a command line asks of a program.
enum class Action { run, help, version };

/// The options both programs take: a pass on files or on a random problem, timed, checked.
struct RunOptions {
  Action action = Action::run;
  std::string command;
  std::string in, out;
  std::vector<long long> random;  // B,H,N,D
  std::optional<long long> heads_kv, seqlen_k;
  std::optional<long long> head_dim_v;  ///< --head-dim-v: v's head dim of --random (default D)
  DType dtype = DType::f32;
  std::uint64_t data_seed = 0;
  long long repeat = 1;
  bool json = false, check = false;
  /// --allow-nonfinite: NaN and Inf in the inputs are passed to the kernels (refused otherwise).
  bool allow_nonfinite = false;
  /// Whether --seed was given (--dropout needs it).
  bool seed_given = false;
  /// --multiscale: multi-scale attention (kfa::msa) instead of softmax attention.
  bool multiscale = false;
  kfa::Params params;
  /// The pass the command runs; Passes::both for a command that is neither.
  kfa::Passes pass() const;
};

/// Reads one of a program's own flags; false when `flag` is not one of them.
using FlagReader = std::function<bool(const std::string& flag, const FlagValue& value)>;

/// Parses `PROGRAM COMMAND [flags]` into o: COMMAND is one of `commands`, --help or --version
/// (either may also come among the flags, which ends the parse). Each flag goes to `own`
/// first, then to the shared ones; Kokkos' own (--kokkos-...) are checked against the flags
/// this Kokkos takes and left to Kokkos. Throws InputError for anything else. Leaves the rules
/// between flags to check_sources.
void parse_command_line(int argc, char** argv, const char* program,
                        const std::vector<std::string>& commands, const FlagReader& own,
                        RunOptions& o);

/// The rules between the shared flags of a pass: files or --random, not both, sizes that the
/// programs' int indices hold, an input that is a file and an OUT that can be written, a
/// --seed for --dropout; throws InputError.
void check_sources(const RunOptions& o);

/// Throws InputError when --dropout is given without --seed.
void check_dropout_seed(const RunOptions& o);

/// The rules of a --multiscale run (nothing without it): no --softcap or --dropout, which
/// multi-scale attention has not; an unset --scale becomes 1 (its formula has no scale).
/// Throws InputError.
void check_multiscale(RunOptions& o);

/// The kfa::msa::Params of a --multiscale run: o.params' scale (after check_multiscale),
/// masks, dQ mode and splits.
kfa::msa::Params msa_params(const RunOptions& o);

/// This machine's memory in bytes (0 when unknown).
double physical_memory();

/// Throws InputError when `bytes` is more than 90 % of `available` bytes of memory (this
/// machine's, by default), naming `what`, the bytes needed and the bytes there are.
void require_memory(double bytes, const std::string& what, double available = physical_memory());

/// The shortest decimal that reads back as exactly x, so a JSON line reproduces the run.
std::string exact(double x);

}  // namespace kfa_apps
