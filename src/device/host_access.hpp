// The process-wide host-access check: every live Device whose memory the engine's host code
// may not touch (the discrete HostDevice, CudaDevice) is listed here, so code that is handed
// raw pointers but holds no Device (the offload tiers' entry points, src/offload) can still
// refuse device memory. Each device adds itself on construction and removes itself before
// it is destroyed.
// Thread-safety: every function may be called from any thread (one mutex; a check holds it
// while it asks each device).
#pragma once

#include <cstddef>

namespace zoe {

class Device;

/// Lists `device` (not owned) until remove_host_access_guard(device).
void add_host_access_guard(const Device* device);
void remove_host_access_guard(const Device* device);

/// Calls check_host_accessible(ptr, bytes, what) of every listed device: throws UsageError
/// naming `what`, the address and the size if [ptr, ptr + bytes) lies in the memory of any
/// of them. A null ptr or bytes == 0 passes. Costs one relaxed load when none is listed.
void check_host_accessible_in_process(const void* ptr, std::size_t bytes, const char* what);

}  // namespace zoe
