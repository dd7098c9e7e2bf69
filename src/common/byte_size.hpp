// A size in bytes as log lines say it: whole bytes below 1 KiB, else the largest binary unit
// (KiB, MiB, GiB, TiB) with one decimal below 10 of it ("512 B", "3.4 KiB", "12 MiB", "1.5 GiB"),
// so a small model's tiers do not all read "0 MiB". Thread-safe (no state). Errors: none.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace zoe::detail {

inline std::string byte_size(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit + 1 < 4) {
    v /= 1024.0;
    ++unit;
  }
  char b[32];
  std::snprintf(b, sizeof b, v < 10.0 ? "%.1f %s" : "%.0f %s", v, kUnits[unit]);
  return b;
}

}  // namespace zoe::detail
