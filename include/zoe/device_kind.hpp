// The kinds of device a rank computes on.
#pragma once

namespace zoe {

/// host: device memory is host memory (the CPU-only backend). cuda: an NVIDIA GPU.
enum class DeviceKind { host, cuda };

/// "host" or "cuda".
constexpr const char* device_kind_name(DeviceKind k) noexcept { return k == DeviceKind::host ? "host" : "cuda"; }

}  // namespace zoe
