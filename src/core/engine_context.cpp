#include "src/core/engine_context.hpp"

#include <algorithm>

#include "src/common/log.hpp"
#include "src/core/flat_layout.hpp"

namespace zoe::core {

namespace {
// zoe.debug_poison on the host device: freed blocks kept poisoned before going back to the system.
constexpr std::size_t kPoisonQuarantineBytes = std::size_t{256} << 20;
}  // namespace

ReadbackArea::~ReadbackArea() {
  if (registered_) device_.unregister_host_memory(buffer_.data());
}

std::byte* ReadbackArea::get(std::size_t bytes) {
  if (buffer_.size() < bytes) {
    if (registered_) device_.unregister_host_memory(buffer_.data());
    buffer_ = AlignedBuffer(std::max<std::size_t>(bytes, 4096));
    registered_ = device_.register_host_memory(buffer_.data(), buffer_.size());
  }
  return static_cast<std::byte*>(buffer_.data());
}

EngineContext::EngineContext(const Config& c, RankContext r)
    : config(c), handles(std::move(r)), device(*handles.device), comm(*handles.comm), rank(comm.rank()),
      world(comm.world_size()), policy(c.zero_optimization.stage), dtype(c.compute_dtype()),
      side(device.create_stream()), frees(device, *side, c.zoe.debug_poison), readback(device),
      compute_mark(device.create_event()), side_mark(device.create_event()) {
  // Freed blocks are poisoned and quarantined too where the device can (the host device), so a
  // stale view never reads a later buffer's values (the setting stays on the device).
  if (frees.poison()) device.set_poison_freed(kPoisonQuarantineBytes);
}

EngineContext::~EngineContext() {
  try {
    device.synchronize(*side);
  } catch (...) {
  }
  frees.reap(true);
}

DeviceBuffer EngineContext::alloc(MemKind kind, DType dt, std::int64_t numel) {
  return DeviceBuffer(device, ledger, kind, dt, numel);
}

void EngineContext::ready_for_compute(Event& event) { device.compute_waits(event); }

void EngineContext::side_waits_for_compute() { device.stream_waits_for(*side, device.compute_stream(), *compute_mark); }

void EngineContext::compute_waits_for_side() { device.compute_waits_for(*side, *side_mark); }

std::int64_t EngineContext::sub_group_numel() const {
  return std::max<std::int64_t>(FlatLayout::kAlign,
                                config.zero_optimization.sub_group_size / FlatLayout::kAlign * FlatLayout::kAlign);
}

DType EngineContext::grad_dtype() const {
  return policy.shards_grads && config.gradient_accumulation_steps > 1 ? DType::f32 : dtype;
}

double EngineContext::pre_divisor() const {
  return config.prescale_gradients ? world : config.gradient_predivide_factor;
}

}  // namespace zoe::core
