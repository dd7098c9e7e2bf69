// zoe-gpt's flag checks. CLI11's PositiveNumber/NonNegativeNumber print their range as
// "0.000000 to 1797...(309 digits)" and accept a negative count for an unsigned option (a seed
// of -1 became 2^64 - 1); these say what is meant: "--steps: must be an integer >= 1, got '0'".
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace gpt {

/// An integer flag in [lo, hi] (the whole text an integer, no sign for lo >= 0).
inline CLI::Validator integer_in(std::int64_t lo, std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  const std::string range = hi == std::numeric_limits<std::int64_t>::max()
                                ? ">= " + std::to_string(lo)
                                : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
          return "must be an integer " + range + ", got '" + text.substr(0, 40) + "'";
        return {};
      },
      "INT " + range);
}

/// A finite real flag in [lo, hi].
inline CLI::Validator real_in(double lo, double hi) {
  const std::string range = "in [" + CLI::detail::to_string(lo) + ", " +
                            (std::isinf(hi) ? std::string("inf)") : CLI::detail::to_string(hi) + "]");
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < lo || v > hi)
          return "must be a finite number " + range + ", got '" + text.substr(0, 40) + "'";
        return {};
      },
      "REAL " + range);
}

}  // namespace gpt
