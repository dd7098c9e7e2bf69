// Parsing of human-written quantities for zoe-estimate: parameter counts ("7.5e9", "7.5B",
// "175B", "350M") and byte sizes ("80GB", "80GiB", "1.5TB", "0"). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zoe::estimate {

/// A count with an optional decimal suffix K (1e3), M (1e6), B or G (1e9), T (1e12),
/// case-insensitive; the number may be a decimal or use an exponent. Rounded to the nearest
/// integer. Throws ConfigError(name) unless the result is an integer in [1, 2^62].
std::int64_t parse_count(std::string_view text, const std::string& name);

/// Bytes with an optional unit: B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB
/// (powers of 1024); also K, M, G, T meaning KB..TB. Case-insensitive. No unit = bytes.
/// Throws ConfigError(name) unless the result is an integer in [0, 2^62].
std::int64_t parse_bytes(std::string_view text, const std::string& name);

}  // namespace zoe::estimate
