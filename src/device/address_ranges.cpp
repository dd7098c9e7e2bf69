#include "src/device/address_ranges.hpp"

#include <algorithm>

namespace zoe {

bool AddressRanges::insert(const void* p, std::size_t bytes) {
  if (!p || bytes == 0 || overlaps(p, bytes)) return false;
  ranges_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  total_bytes_ += bytes;
  return true;
}

bool AddressRanges::erase(const void* p) {
  auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges_.end()) return false;
  for (Span& r : recent_)
    if (r.begin == it->first) r = Span{};
  total_bytes_ -= it->second;
  ranges_.erase(it);
  return true;
}

bool AddressRanges::overlaps(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = a + std::max<std::size_t>(bytes, 1);
  for (const Span& r : recent_)
    if (a < r.end && end > r.begin) return true;
  // The last range that begins before `end` is the only candidate (ranges are disjoint).
  auto it = ranges_.lower_bound(end);
  if (it == ranges_.begin()) return false;
  --it;
  if (it->first + it->second <= a) return false;
  recent_[1] = recent_[0];
  recent_[0] = Span{it->first, it->first + it->second};
  return true;
}

bool AddressRanges::contains(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return false;
  --it;
  return a - it->first + bytes <= it->second;
}

}  // namespace zoe
