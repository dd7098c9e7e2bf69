// Owning, aligned, uninitialised host byte buffer. Alignment 4096 by default
// (O_DIRECT needs it); buffers of >= 2 MiB are madvise(MADV_HUGEPAGE)d so large
// I/O buffers are physically contiguous (the disk merges 1 MiB I/Os into 4 MiB).
// Not thread-safe for concurrent move/reset; the bytes are the caller's to share.
#pragma once

#include <cstddef>
#include <span>

namespace zoe {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// Allocates `bytes` (rounded up to `alignment`). Throws OutOfMemoryError.
  explicit AlignedBuffer(std::size_t bytes, std::size_t alignment = 4096);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  template <class T>
  std::span<T> as() const noexcept { return {static_cast<T*>(data_), size_ / sizeof(T)}; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace zoe
