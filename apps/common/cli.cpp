#include "cli.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "h5io.hpp"

namespace kfa_apps {

const char* const kPassFlagsUsage =
    "  [--causal] [--align bottom-right|top-left] [--window LEFT,RIGHT]\n"
    "  [--scale S] [--softcap C] [--dropout P --seed N [--offset N]]\n";

long long parse_int(const std::string& flag, const std::string& text, long long min) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw InputError(flag + " expects an integer, got '" + text + "'");
  if (v < min) throw InputError(flag + " must be >= " + std::to_string(min) + ", got " + text);
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
  throw InputError(flag + " expects float or double, got '" + text + "'");
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

bool parse_pass_flag(const std::string& flag, const std::function<std::string()>& value,
                     kfa::Params& p) {
  if (flag == "--causal") {
    p.causal = true;
  } else if (flag == "--align") {
    const std::string t = value();
    if (t == "bottom-right")
      p.align = kfa::Align::bottom_right;
    else if (t == "top-left")
      p.align = kfa::Align::top_left;
    else
      throw InputError("--align expects bottom-right or top-left, got '" + t + "'");
  } else if (flag == "--window") {
    const auto parts = split(value());
    if (parts.size() != 2)
      throw InputError("--window expects LEFT,RIGHT (two integers, -1 = unbounded)");
    p.window_left = static_cast<int>(parse_int("--window LEFT", parts[0], -1));
    p.window_right = static_cast<int>(parse_int("--window RIGHT", parts[1], -1));
  } else if (flag == "--scale") {
    const std::string t = value();
    p.scale = parse_double(flag, t);
    if (p.scale <= 0) throw InputError("--scale must be > 0, got " + t);
  } else if (flag == "--softcap") {
    const std::string t = value();
    p.softcap = parse_double(flag, t);
    if (p.softcap < 0) throw InputError("--softcap must be >= 0 (0 = off), got " + t);
  } else if (flag == "--dropout") {
    const std::string t = value();
    p.dropout = parse_double(flag, t);
    if (!(p.dropout >= 0 && p.dropout < 1))
      throw InputError("--dropout must be in [0, 1), got " + t);
  } else if (flag == "--seed") {
    p.seed = static_cast<std::uint64_t>(parse_int(flag, value(), 0));
  } else if (flag == "--offset") {
    p.offset = static_cast<std::uint64_t>(parse_int(flag, value(), 0));
  } else {
    return false;
  }
  return true;
}

std::string exact(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace kfa_apps
