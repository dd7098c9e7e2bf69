#include "src/core/deferred_frees.hpp"

#include <limits>

namespace zoe::core {

void DeferredFrees::after_side(DeviceBuffer buffer, std::int64_t gathered_elements, std::shared_ptr<void> hold) {
  if (!buffer && !hold) return;
  if (poison_ && buffer)
    device_.fill(buffer.data(), buffer.dtype(), static_cast<std::size_t>(buffer.numel()),
                 std::numeric_limits<float>::quiet_NaN(), side_);
  releasing_elements_ += gathered_elements;
  pending_.push_back(Pending{std::move(buffer), event_at(side_), nullptr, gathered_elements, std::move(hold)});
  ++queued_;
}

std::unique_ptr<Event> DeferredFrees::event_at(Stream& stream) {
  std::unique_ptr<Event> e;
  if (spare_.empty()) {
    e = device_.create_event();
  } else {
    e = std::move(spare_.back());
    spare_.pop_back();
  }
  device_.record(*e, stream);
  return e;
}

void DeferredFrees::after_side(std::vector<DeviceBuffer> buffers) {
  std::erase_if(buffers, [](const DeviceBuffer& b) { return !b; });
  if (buffers.empty()) return;
  if (poison_)
    for (DeviceBuffer& b : buffers)
      device_.fill(b.data(), b.dtype(), static_cast<std::size_t>(b.numel()), std::numeric_limits<float>::quiet_NaN(), side_);
  after_side(DeviceBuffer(), 0, std::make_shared<std::vector<DeviceBuffer>>(std::move(buffers)));
}

void DeferredFrees::after(DeviceBuffer buffer, std::shared_ptr<Event> event, std::shared_ptr<void> hold) {
  if (!buffer && !hold) return;
  pending_.push_back(Pending{std::move(buffer), nullptr, std::move(event), 0, std::move(hold)});
  ++queued_;
}

void DeferredFrees::after_stream(Stream& stream, DeviceBuffer buffer, std::shared_ptr<void> hold) {
  if (!buffer && !hold) return;
  pending_.push_back(Pending{std::move(buffer), event_at(stream), nullptr, 0, std::move(hold)});
  ++queued_;
}

void DeferredFrees::pop() {
  Pending& p = pending_.front();
  releasing_elements_ -= p.gathered_elements;
  // Its event has completed (the caller waited or asked): a later free may record it again.
  if (p.own) spare_.push_back(std::move(p.own));
  pending_.pop_front();
  ++done_;
}

void DeferredFrees::reap(bool wait_all) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    if (wait_all) {
      device_.synchronize(p.event());
    } else if (!device_.query(p.event())) {
      break;
    }
    pop();
  }
}

bool DeferredFrees::reap_oldest() {
  if (pending_.empty()) return false;
  device_.synchronize(pending_.front().event());
  pop();
  return true;
}

void DeferredFrees::reap_before(std::uint64_t point) {
  while (!pending_.empty() && done_ < point) {
    device_.synchronize(pending_.front().event());
    pop();
  }
}

void DeferredFrees::show_poison() {
  auto e = device_.create_event();
  device_.record(*e, side_);
  device_.compute_waits(*e);
}

}  // namespace zoe::core
