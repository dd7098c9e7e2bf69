#include "src/common/aligned_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <utility>

#include "src/common/check.hpp"

namespace zoe {

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) {
  if (bytes == 0) return;
  if (bytes >= (2u << 20)) alignment = std::max<std::size_t>(alignment, 2u << 20);
  std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  data_ = std::aligned_alloc(alignment, rounded);
  if (!data_) ZOE_THROW(OutOfMemoryError, "cannot allocate ", rounded, " bytes of aligned host memory");
  if (rounded >= (2u << 20)) madvise(data_, rounded, MADV_HUGEPAGE);  // best effort
  size_ = bytes;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace zoe
