#include "src/offload/pinned_budget.hpp"

#include <algorithm>
#include <sstream>

#include "src/common/check.hpp"

namespace zoe::offload {

void PinnedBudget::reserve(std::size_t bytes, const std::string& holder) {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& h : held_) total += h.second;
  if (limit_ != 0 && total + bytes > limit_) {
    std::ostringstream held;
    for (const auto& h : held_)
      if (h.second) held << (held.tellp() > 0 ? ", " : "") << h.first << " " << h.second;
    ZOE_THROW(OutOfMemoryError, "zoe.pinned_budget_bytes: ", holder, " needs ", bytes, " bytes of pinned host memory, ",
              "but the budget of ", limit_, " bytes has ", limit_ - total, " left (held: ",
              held.tellp() > 0 ? held.str() : std::string("nothing"), "); raise zoe.pinned_budget_bytes or shrink ",
              "the staging (buffer_count, buffer_size, sub_group_size)");
  }
  auto it = std::find_if(held_.begin(), held_.end(), [&](const auto& h) { return h.first == holder; });
  if (it == held_.end()) {
    held_.emplace_back(holder, bytes);
  } else {
    it->second += bytes;
  }
}

void PinnedBudget::release(std::size_t bytes, const std::string& holder) noexcept {
  if (bytes == 0) return;
  std::lock_guard lock(mutex_);
  auto it = std::find_if(held_.begin(), held_.end(), [&](const auto& h) { return h.first == holder; });
  if (it != held_.end()) it->second -= std::min(it->second, bytes);
}

std::size_t PinnedBudget::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& h : held_) total += h.second;
  return total;
}

}  // namespace zoe::offload
