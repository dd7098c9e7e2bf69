// Gradient buffers handed to the trainer and their reduction.
//  stage 0: grad_full persistent; all-reduced after the last micro-batch's backward.
//  stage 1: grad_full persistent; reduce-scattered into grad_shard after the last one.
//  stages 2-3: grad_full lives for one micro-batch; reduce-scattered as soon as every module
//    using the group finished its backward (overlapping the rest of backward on the side
//    stream) and accumulated into the persistent grad_shard.
// A group's reduction is one bucket (the module's flat buffer).
#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

void EngineImpl::prepare_grads(ModuleInfo& m) {
  if (stage < 2) return;  // persistent buffers, zeroed after each step
  bool filled = false;
  for (int gi : m.groups) {
    Group& g = groups[gi];
    if (g.grad_full) continue;
    g.grad_full = alloc(MemKind::buffer, dtype, g.layout->padded_numel());
    device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *side);
    filled = true;
  }
  if (filled) {
    auto e = device.create_event();
    device.record(*e, *side);
    ready_for_compute(*e);
  }
}

void EngineImpl::finish_backward(ModuleInfo& m) {
  ++m.backward_count;
  side_waits_for_compute();
  for (int gi : m.groups) {
    Group& g = groups[gi];
    if (--g.pending_users > 0) continue;
    g.pending_users = static_cast<int>(g.users.size());
    ++g.micro_batches;
    if (stage >= 2 || g.micro_batches == config.gradient_accumulation_steps) reduce_group(g);
  }
}

void EngineImpl::reduce_group(Group& g) {
  const FlatLayout& L = *g.layout;
  const std::int64_t S = L.shard_numel();
  switch (stage) {
    case 0:
      all_reduce(g.grad_full.data(), L.padded_numel(), dtype);
      break;
    case 1:
      g.grad_shard = alloc(MemKind::buffer, dtype, S);
      reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, dtype);
      break;
    default:
      if (g.micro_batches == 1) {
        reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, dtype);
      } else {
        DeviceBuffer part = alloc(MemKind::buffer, dtype, S);
        reduce_scatter(g.grad_full.data(), part.data(), S, dtype);
        if (dtype == DType::f32) {
          device.accumulate(part.data(), dtype, static_cast<float*>(g.grad_shard.data()), S, *side);
        } else {
          // Accumulate in fp32 and round once to the compute dtype.
          DeviceBuffer acc = alloc(MemKind::buffer, DType::f32, S);
          device.cast(g.grad_shard.data(), dtype, acc.data(), DType::f32, S, *side);
          device.accumulate(part.data(), dtype, static_cast<float*>(acc.data()), S, *side);
          device.cast(acc.data(), DType::f32, g.grad_shard.data(), dtype, S, *side);
          free_after_side(std::move(acc));
        }
        free_after_side(std::move(part));
      }
      free_after_side(std::move(g.grad_full));
      break;
  }
}

}  // namespace zoe::core
