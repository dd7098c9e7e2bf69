// SmallBlocks (see small_blocks.hpp).
#include "src/device/small_blocks.hpp"

#include <algorithm>
#include <cstdlib>

#include "src/device/host_elementwise.hpp"

namespace zoe {

SmallBlocks::SmallBlocks(std::size_t alignment)
    : alignment_(alignment),
      carving_(kMaxSlabBytes / 2 / alignment + 1, nullptr),
      next_capacity_(carving_.size(), 0),
      free_(carving_.size()) {}

SmallBlocks::~SmallBlocks() {
  for (const std::unique_ptr<Slab>& s : slabs_) std::free(s->base);
}

SmallBlocks::Slab* SmallBlocks::new_slab(std::size_t rounded) {
  std::size_t& capacity = next_capacity_[rounded / alignment_];
  if (capacity == 0) capacity = std::max<std::size_t>(1, kGranule / rounded);  // the class's first slab
  const std::size_t bytes = (capacity * rounded + kGranule - 1) / kGranule * kGranule;
  void* base = std::aligned_alloc(kGranule, bytes);
  if (!base) return nullptr;
  auto slab = std::make_unique<Slab>();
  slab->base = static_cast<char*>(base);
  slab->block_bytes = rounded;
  slab->capacity = bytes / rounded;
  slab->state = std::make_unique<std::uint32_t[]>(slab->capacity);  // all kFree
  for (std::size_t g = 0; g < bytes / kGranule; ++g) granules_[granule_of(slab->base) + g] = slab.get();
  capacity = std::min(2 * capacity, std::max<std::size_t>(1, kMaxSlabBytes / rounded));  // the next one
  slabs_.push_back(std::move(slab));
  return slabs_.back().get();
}

void* SmallBlocks::take(std::size_t rounded, std::size_t bytes, bool* carved) {
  const std::size_t k = rounded / alignment_;
  *carved = false;
  void* p = nullptr;
  Slab* s = nullptr;
  if (std::vector<void*>& list = free_[k]; !list.empty()) {
    p = list.back();
    list.pop_back();
    s = &slab_of(p);
    // The next take of this class gets the block now on top: thousands of small modules take
    // one each, a call apart, and it is written first (a gradient zeroed, a parameter
    // gathered). Its lines are asked for now, so they arrive while the caller uses this one.
    if (!list.empty()) host_ops::prefetch_write(list.back(), rounded);
  } else {
    s = carving_[k];
    if (!s || s->carved == s->capacity) {
      s = new_slab(rounded);
      if (!s) return nullptr;
      carving_[k] = s;
    }
    p = s->base + s->carved++ * rounded;
    *carved = true;
  }
  state_of(*s, p) = static_cast<std::uint32_t>(bytes + 1);
  return p;
}

SmallBlocks::Found SmallBlocks::release(void* p, bool reuse, std::size_t* bytes, std::size_t* rounded) {
  auto it = granules_.find(granule_of(p));
  if (it == granules_.end()) return Found::foreign;
  Slab& s = *it->second;
  const auto offset = static_cast<std::size_t>(static_cast<char*>(p) - s.base);
  if (offset % s.block_bytes != 0 || offset / s.block_bytes >= s.carved) return Found::foreign;
  std::uint32_t& state = state_of(s, p);
  if (state == kFree) return Found::free;
  if (state == kRetired) return Found::retired;
  *bytes = state - 1;
  *rounded = s.block_bytes;
  state = reuse ? kFree : kRetired;
  if (reuse) free_[s.block_bytes / alignment_].push_back(p);
  return Found::live;
}

void SmallBlocks::retire_free_lists() {
  for (std::vector<void*>& list : free_) {
    for (void* p : list) state_of(slab_of(p), p) = kRetired;
    list.clear();
  }
}

}  // namespace zoe
