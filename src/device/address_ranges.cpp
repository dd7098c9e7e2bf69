#include "src/device/address_ranges.hpp"

#include <algorithm>

namespace zoe {

bool AddressRanges::insert(const void* p, std::size_t bytes) {
  if (!p || bytes == 0 || overlaps(p, bytes)) return false;
  ranges_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  return true;
}

bool AddressRanges::erase(const void* p) { return ranges_.erase(reinterpret_cast<std::uintptr_t>(p)) == 1; }

bool AddressRanges::overlaps(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = a + std::max<std::size_t>(bytes, 1);
  // The last range that begins before `end` is the only candidate (ranges are disjoint).
  auto it = ranges_.lower_bound(end);
  if (it == ranges_.begin()) return false;
  --it;
  return it->first + it->second > a;
}

bool AddressRanges::contains(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return false;
  --it;
  return a - it->first + bytes <= it->second;
}

}  // namespace zoe
