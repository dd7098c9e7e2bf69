// An owned, accounted allocation of device memory (host memory on the host device).
// Move-only; frees on destruction. The caller makes sure no queued work still uses the
// memory when it is destroyed (see DeferredFrees). Not thread-safe.
#pragma once

#include <cstddef>
#include <utility>

#include "src/core/memory_ledger.hpp"
#include "src/device/device.hpp"
#include "zoe/dtype.hpp"

namespace zoe::core {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates numel elements of dtype (at least one byte). Throws OutOfMemoryError.
  DeviceBuffer(Device& device, MemoryLedger& ledger, MemKind kind, DType dtype, std::int64_t numel)
      : device_(&device), ledger_(&ledger), kind_(kind), dtype_(dtype), numel_(numel),
        bytes_(static_cast<std::size_t>(numel) * dtype_size(dtype)) {
    ptr_ = device.allocate(bytes_ ? bytes_ : 1);
    ledger.add(Tier::device, kind, static_cast<std::int64_t>(bytes_));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      device_ = std::exchange(o.device_, nullptr);
      ledger_ = o.ledger_;
      kind_ = o.kind_;
      dtype_ = o.dtype_;
      numel_ = std::exchange(o.numel_, 0);
      bytes_ = std::exchange(o.bytes_, 0);
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  explicit operator bool() const { return ptr_ != nullptr; }
  void* data() const { return ptr_; }
  /// Address of element i.
  void* at(std::int64_t i) const { return static_cast<char*>(ptr_) + i * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return numel_; }
  std::size_t bytes() const { return bytes_; }

  void release() {
    if (ptr_) {
      device_->deallocate(ptr_);
      ledger_->sub(Tier::device, kind_, static_cast<std::int64_t>(bytes_));
      ptr_ = nullptr;
    }
  }

 private:
  Device* device_ = nullptr;
  MemoryLedger* ledger_ = nullptr;
  MemKind kind_ = MemKind::buffer;
  DType dtype_ = DType::f32;
  std::int64_t numel_ = 0;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace zoe::core
