#include "src/core/shared_ready.hpp"

namespace zoe::core {

void SharedReady::record(std::span<const int> groups, Stream& side) {
  if (events_.empty())
    for (std::uint32_t k = 0; k < kEvents; ++k) events_.push_back(device_.create_event());
  const std::uint32_t p = ++last_point_;
  device_.record(*events_[p % kEvents], side);
  for (int gi : groups) {
    if (point_of_.size() <= static_cast<std::size_t>(gi)) point_of_.resize(static_cast<std::size_t>(gi) + 1, 0);
    point_of_[static_cast<std::size_t>(gi)] = p;
  }
}

void SharedReady::wait(int gi, Event& own) {
  const std::uint32_t p = static_cast<std::size_t>(gi) < point_of_.size() ? point_of_[static_cast<std::size_t>(gi)] : 0;
  if (p != 0 && p == waited_point_) return;  // the waiter is already after this point
  Event& e = p == 0 ? own : *events_[p % kEvents];
  if (waiter_) {
    device_.wait(*waiter_, e);
  } else {
    device_.compute_waits(e);
  }
  if (p != 0) waited_point_ = p;
}

}  // namespace zoe::core
