// AddressRanges: a set of disjoint address ranges [begin, begin + bytes), looked up by any
// address inside them. The host device keeps its blocks (device memory) and the ranges
// registered with register_host_memory in two of these, to tell device, registered and
// pageable memory apart and to check host accesses (O(log n) per lookup; the two ranges
// found last are remembered, so a run of copies into or out of one buffer looks it up once).
// Thread-safety: none; the owner locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace zoe {

class AddressRanges {
 public:
  /// Adds [p, p + bytes). Returns false (and adds nothing) for bytes == 0, a null p, or a
  /// range that overlaps one already in the set.
  bool insert(const void* p, std::size_t bytes);
  /// Removes the range that begins at p; false if none does.
  bool erase(const void* p);
  /// True if [p, p + bytes) shares at least one byte with a range of the set (bytes == 0:
  /// if p lies inside one).
  bool overlaps(const void* p, std::size_t bytes) const;
  /// True if [p, p + bytes) lies entirely inside one range of the set.
  bool contains(const void* p, std::size_t bytes) const;
  std::size_t size() const noexcept { return ranges_.size(); }
  /// The sum of the ranges' bytes.
  std::size_t total_bytes() const noexcept { return total_bytes_; }

 private:
  /// [begin, end) of a range in the set.
  struct Span {
    std::uintptr_t begin = 0, end = 0;
  };
  std::map<std::uintptr_t, std::size_t> ranges_;  // begin -> bytes
  std::size_t total_bytes_ = 0;
  mutable Span recent_[2];  // the ranges overlaps() found last, most recent first (empty: 0, 0)
};

}  // namespace zoe
