#pragma once
// Command-line pieces shared by the kfa programs: number parsing with errors that name the
// flag, and the flags that describe an attention pass (masks, softcap, scale, dropout).

#include <kfa/params.hpp>

#include <functional>
#include <string>
#include <vector>

#include "h5io.hpp"

namespace kfa_apps {

/// An integer >= min for `flag`; throws InputError naming the flag otherwise.
long long parse_int(const std::string& flag, const std::string& text, long long min);

/// A finite number for `flag`; throws InputError naming the flag otherwise.
double parse_double(const std::string& flag, const std::string& text);

/// float (float32) or double (float64) for `flag`; throws InputError naming the flag otherwise.
DType parse_dtype(const std::string& flag, const std::string& text);

/// "a,b,c" -> {"a", "b", "c"}; a trailing comma gives a trailing empty part.
std::vector<std::string> split(const std::string& s);

/// Four positive integers for `flag`, written `form` (e.g. "B,H,N,D") and named by `names` in
/// errors.
std::vector<long long> parse_dims(const std::string& flag, const std::string& text,
                                  const char* form, const char* const (&names)[4]);

/// Reads one of the pass flags into p: --causal, --align bottom-right|top-left,
/// --window LEFT,RIGHT, --scale S, --softcap C, --dropout P, --seed N, --offset N. Returns false
/// when `flag` is not one of them; `value` fetches the flag's argument.
bool parse_pass_flag(const std::string& flag, const std::function<std::string()>& value,
                     kfa::Params& p);

/// The pass flags' usage lines.
extern const char* const kPassFlagsUsage;

/// The shortest decimal that reads back as exactly x, so a JSON line reproduces the run.
std::string exact(double x);

}  // namespace kfa_apps
