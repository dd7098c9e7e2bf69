#include "src/config/quantity.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "src/common/check.hpp"

namespace zoe::estimate {
namespace {
constexpr double kMax = 4611686018427387904.0;  // 2^62

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "7.5gib" into 7.5 and "gib"; throws unless the number part is a finite number.
double split(const std::string& s, std::string& unit, std::string_view text, const std::string& name) {
  const char* begin = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) ZOE_THROW_CONFIG(name, "expected a number with an optional unit, got '", text, "'");
  unit = std::string(end);
  return v;
}

std::int64_t to_integer(double v, std::string_view text, const std::string& name, double min) {
  const double r = std::round(v);
  if (!(r >= min && r <= kMax)) ZOE_THROW_CONFIG(name, "out of range [", min, ", 2^62]: '", text, "'");
  return static_cast<std::int64_t>(r);
}
}  // namespace

std::int64_t parse_count(std::string_view text, const std::string& name) {
  std::string unit;
  const double v = split(lower(text), unit, text, name);
  double scale = 1;
  if (unit == "k") scale = 1e3;
  else if (unit == "m") scale = 1e6;
  else if (unit == "b" || unit == "g") scale = 1e9;
  else if (unit == "t") scale = 1e12;
  else if (!unit.empty()) ZOE_THROW_CONFIG(name, "unknown suffix '", unit, "' in '", text, "' (use K, M, B, T)");
  return to_integer(v * scale, text, name, 1);
}

std::int64_t parse_bytes(std::string_view text, const std::string& name) {
  std::string unit;
  const double v = split(lower(text), unit, text, name);
  double scale = 0;
  struct Unit { const char* name; double scale; };
  static const Unit units[] = {
      {"", 1}, {"b", 1},
      {"k", 1e3}, {"kb", 1e3}, {"m", 1e6}, {"mb", 1e6}, {"g", 1e9}, {"gb", 1e9}, {"t", 1e12}, {"tb", 1e12},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& u : units)
    if (unit == u.name) scale = u.scale;
  if (scale == 0) ZOE_THROW_CONFIG(name, "unknown unit '", unit, "' in '", text, "' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  return to_integer(v * scale, text, name, 0);
}

}  // namespace zoe::estimate
