#include "src/core/flat_layout.hpp"

#include <algorithm>

#include "src/common/check.hpp"

namespace zoe::core {

FlatLayout::FlatLayout(const std::vector<std::int64_t>& numels, int world_size)
    : world_size_(world_size), numels_(numels) {
  ZOE_CHECK(world_size >= 1, "world_size ", world_size);
  std::int64_t cursor = 0;
  for (std::int64_t n : numels) {
    ZOE_CHECK(n >= 0, "negative numel ", n);
    offsets_.push_back(cursor);
    if (n > 0) live_ranges_.push_back({cursor, cursor + n});
    live_ += n;
    cursor += (n + kAlign - 1) / kAlign * kAlign;
  }
  std::int64_t unit = kAlign * world_size;
  std::int64_t padded = std::max<std::int64_t>(unit, (cursor + unit - 1) / unit * unit);
  shard_ = padded / world_size;
}

std::int64_t FlatLayout::live_in_shard(int rank) const {
  std::int64_t b = shard_begin(rank), e = b + shard_, live = 0;
  for (const Range& r : live_ranges_) live += std::max<std::int64_t>(0, std::min(e, r.end) - std::max(b, r.begin));
  return live;
}

}  // namespace zoe::core
