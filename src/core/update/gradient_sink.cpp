#include "src/core/update/gradient_sink.hpp"

#include "src/common/check.hpp"

namespace zoe::core {

GradientSink::GradientSink(Device& device, offload::OptimizerStates& states, const GradientSinkOptions& options)
    : device_(device), states_(states), options_(options), copy_(device.create_stream()) {
  if (options.largest_numel > 0) {
    offload::PinnedPoolOptions po;
    po.buffer_count = static_cast<std::size_t>(std::max(1, options.staging_count));
    po.buffer_bytes = static_cast<std::size_t>(options.largest_numel) * dtype_size(options.dtype);
    po.budget = options.pinned_budget;
    po.holder = "gradient sink staging";
    po.lock = options.pin_memory;
    po.register_fn = [&device](void* p, std::size_t bytes) { return device.register_host_memory(p, bytes); };
    po.unregister_fn = [&device](void* p) { device.unregister_host_memory(p); };
    pool_ = std::make_unique<offload::PinnedPool>(po);
  }
}

GradientSink::~GradientSink() {
  try {
    io_.synchronize();
  } catch (...) {
  }
  try {
    device_.synchronize(*copy_);
  } catch (...) {
  }
}

std::shared_ptr<Event> GradientSink::add(int id, const void* src, std::int64_t numel, bool first, bool last,
                                         Event& ready, std::shared_ptr<GroupDone> after) {
  const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(options_.dtype);
  ZOE_CHECK_USAGE(pool_ && bytes <= pool_->buffer_bytes(), "gradient offload: sub-group ", id, " of ", numel,
                  " elements exceeds the staging buffers (", pool_ ? pool_->buffer_bytes() : 0, " bytes)");
  auto buffer = std::make_shared<offload::PinnedBuffer>(pool_->acquire_wait());  // the I/O worker returns them
  device_.wait(*copy_, ready);
  device_.copy(buffer->data(), src, bytes, *copy_);
  auto copied = std::shared_ptr<Event>(device_.create_event());
  device_.record(*copied, *copy_);
  const DType dt = options_.dtype;
  io_.enqueue([this, id, buffer, copied, first, last, dt, bytes, after = std::move(after)] {
    device_.synchronize(*copied);
    if (after) after->wait();
    device_.check_host_accessible(buffer->data(), bytes, "the reduced gradient handed to the offload tier");
    states_.add_grad(id, buffer->data(), dt, first, last);
    buffer->release();
  });
  return copied;
}

void GradientSink::zero(int id, std::shared_ptr<GroupDone> after) {
  io_.enqueue([this, id, after = std::move(after)] {
    if (after) after->wait();
    states_.zero_grad(id);
  });
}

void GradientSink::signal(std::shared_ptr<GroupDone> latch) {
  // The queue runs its tasks in order and goes on after an error, so this task runs after
  // every write queued before it; it asks the queue whether any of them failed.
  const std::uint64_t before = io_.last_ticket();
  io_.enqueue([this, before, latch = std::move(latch)] {
    try {
      io_.rethrow_error_up_to(before);
    } catch (...) {
      latch->set_failed();
      return;
    }
    latch->set();
  });
}

void GradientSink::drain() { io_.synchronize(); }

}  // namespace zoe::core
