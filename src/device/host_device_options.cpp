#include "src/device/host_device_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "src/common/check.hpp"

namespace zoe {
namespace {
// The modelled copies' range: a latency over a second per copy, or a rate under 10 MB/s,
// stalls a step for hours (the probe: 1e14 us hung zoe-gpt, and 1e30 overflowed the clock into
// no latency at all).
constexpr double kMaxLatencyUs = 1e6, kMinGbps = 0.01, kMaxGbps = 1e6;

double env_number(const char* name, double lo, double hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(x) || (x != 0 && (x < lo || x > hi)))
    ZOE_THROW_CONFIG(name, "expected 0 (not modelled) or a number in [", lo, ", ", hi, "], got '", v, "'");
  return x;
}
}  // namespace

const char* host_memory_model_name(HostMemoryModel m) noexcept {
  return m == HostMemoryModel::discrete ? "discrete" : "unified";
}

HostDeviceOptions host_device_options_from_environment() {
  HostDeviceOptions o;
  if (const char* v = std::getenv("ZOE_HOST_MEMORY"); v && *v) {
    const std::string s = v;
    if (s == "discrete") o.memory = HostMemoryModel::discrete;
    else if (s != "unified") ZOE_THROW_CONFIG("ZOE_HOST_MEMORY", "expected unified or discrete, got '", s, "'");
  }
  o.copy_gbps = env_number("ZOE_HOST_COPY_GBPS", kMinGbps, kMaxGbps);
  o.copy_latency_us = env_number("ZOE_HOST_COPY_LATENCY_US", 0.0, kMaxLatencyUs);
  return o;
}

void validate(const HostDeviceOptions& o) {
  ZOE_CHECK_USAGE(o.copy_gbps == 0 || (o.copy_gbps >= kMinGbps && o.copy_gbps <= kMaxGbps),
                  "HostDeviceOptions: copy_gbps must be 0 (not modelled) or in [", kMinGbps, ", ", kMaxGbps, "], got ",
                  o.copy_gbps);
  ZOE_CHECK_USAGE(o.copy_latency_us >= 0 && o.copy_latency_us <= kMaxLatencyUs,
                  "HostDeviceOptions: copy_latency_us must be in [0, ", kMaxLatencyUs, "], got ", o.copy_latency_us);
}

}  // namespace zoe
