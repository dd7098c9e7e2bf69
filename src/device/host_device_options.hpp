// How a HostDevice models device memory and transfers (HostDeviceOptions), and the
// environment switch that picks the model for every host device a process builds.
//
// unified: device memory is host memory the engine's host code may touch; copies are
//   memmoves on the stream's thread (the host device as it always was).
// discrete: device memory is an arena that host code may reach only through Device copies
//   (check_host_accessible throws for it), and copies between the arena and host memory run
//   on copy-engine threads with a modelled bandwidth and latency: a CPU-only machine runs the
//   control flow of a GPU with its own memory (see docs/architecture.md).
// Thread-safety: plain values; host_device_options_from_environment reads the environment
// and may be called from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace zoe {

/// Where the host device's "device memory" lives, as seen by the engine's host code.
enum class HostMemoryModel {
  unified,   // host memory: host code may read and write it directly
  discrete,  // a separate arena: reached only through Device copies
};

/// "unified" or "discrete".
const char* host_memory_model_name(HostMemoryModel m) noexcept;

struct HostDeviceOptions {
  HostMemoryModel memory = HostMemoryModel::unified;
  /// Bound on allocated bytes (0 = unbounded): allocate() beyond it throws OutOfMemoryError.
  std::size_t capacity_bytes = 0;
  /// discrete only: bandwidth of each copy engine (host-to-device and device-to-host) in
  /// GB/s (1e9 bytes per second), 0 (not modelled: a copy takes its memmove time only) or in
  /// [0.01, 1e6].
  double copy_gbps = 0;
  /// discrete only: fixed time per copy between arena and host, in microseconds, [0, 1e6].
  double copy_latency_us = 0;
};

/// The options the process's host devices use by default (make_host_device, make_local_ranks,
/// make_gloo_local_ranks): ZOE_HOST_MEMORY=unified|discrete (default unified),
/// ZOE_HOST_COPY_GBPS and ZOE_HOST_COPY_LATENCY_US (numbers, default 0). The test suite's
/// `discrete` entries set ZOE_HOST_MEMORY=discrete. Throws ConfigError naming the variable
/// for an unknown model or a value outside the ranges above.
HostDeviceOptions host_device_options_from_environment();

/// Throws UsageError if `o`'s bandwidth or latency is outside the ranges above.
void validate(const HostDeviceOptions& o);

}  // namespace zoe
