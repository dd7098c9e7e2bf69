#include "src/core/deferred_frees.hpp"

#include <limits>

namespace zoe::core {

void DeferredFrees::after_side(DeviceBuffer buffer, std::int64_t gathered_elements, std::shared_ptr<void> hold) {
  if (!buffer && !hold) return;
  if (poison_ && buffer)
    device_.fill(buffer.data(), buffer.dtype(), static_cast<std::size_t>(buffer.numel()),
                 std::numeric_limits<float>::quiet_NaN(), side_);
  releasing_elements_ += gathered_elements;
  Pending p{std::move(buffer), device_.create_event(), gathered_elements, std::move(hold)};
  device_.record(*p.after, side_);
  pending_.push_back(std::move(p));
  ++queued_;
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
  pending_.push_back(Pending{std::move(buffer), std::move(event), 0, std::move(hold)});
  ++queued_;
}

void DeferredFrees::after_stream(Stream& stream, DeviceBuffer buffer, std::shared_ptr<void> hold) {
  if (!buffer && !hold) return;
  std::shared_ptr<Event> event = device_.create_event();
  device_.record(*event, stream);
  after(std::move(buffer), std::move(event), std::move(hold));
}

void DeferredFrees::pop() {
  releasing_elements_ -= pending_.front().gathered_elements;
  pending_.pop_front();
  ++done_;
}

void DeferredFrees::reap(bool wait_all) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    if (wait_all) {
      device_.synchronize(*p.after);
    } else if (!device_.query(*p.after)) {
      break;
    }
    pop();
  }
}

bool DeferredFrees::reap_oldest() {
  if (pending_.empty()) return false;
  device_.synchronize(*pending_.front().after);
  pop();
  return true;
}

void DeferredFrees::reap_before(std::uint64_t point) {
  while (!pending_.empty() && done_ < point) {
    device_.synchronize(*pending_.front().after);
    pop();
  }
}

void DeferredFrees::show_poison() {
  auto e = device_.create_event();
  device_.record(*e, side_);
  device_.compute_waits(*e);
}

}  // namespace zoe::core
