#include "src/device/host_device_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "src/common/check.hpp"

namespace zoe {
namespace {
double env_number(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(x) || x < 0)
    ZOE_THROW_CONFIG(name, "expected a number >= 0, got '", v, "'");
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
  o.copy_gbps = env_number("ZOE_HOST_COPY_GBPS");
  o.copy_latency_us = env_number("ZOE_HOST_COPY_LATENCY_US");
  return o;
}

void validate(const HostDeviceOptions& o) {
  ZOE_CHECK_USAGE(std::isfinite(o.copy_gbps) && o.copy_gbps >= 0, "HostDeviceOptions: copy_gbps must be a finite ",
                  "number >= 0 (0 = not modelled), got ", o.copy_gbps);
  ZOE_CHECK_USAGE(std::isfinite(o.copy_latency_us) && o.copy_latency_us >= 0,
                  "HostDeviceOptions: copy_latency_us must be a finite number >= 0, got ", o.copy_latency_us);
}

}  // namespace zoe
