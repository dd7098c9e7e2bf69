// DeviceUpdateBatch: the device sub-groups' Adam updates of several groups queued as one
// Device::adam_step_batch (multi-tensor apply, as apex's and PyTorch's foreach optimizers),
// each group's follow-up work on the update stream (zeroing its gradients, recording its
// update_done event, freeing what it read) queued after the batch, in group order; groups
// with nothing but device sub-groups share one "done" point per batch instead (SharedReady).
//
// Why: a step over thousands of small groups queued one device operation per group and run;
// on the host device each is a task for the update stream's thread. A batch closes once it
// holds kElements elements, so a group's event waits for at most that much work besides its
// own (the next forward's first module waits on its group's event); a larger group is a batch
// of its own, as before.
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/core/shared_ready.hpp"
#include "src/device/device.hpp"

namespace zoe::core {

class DeviceUpdateBatch {
 public:
  /// Elements (all tensors together) at which a batch is issued.
  static constexpr std::int64_t kElements = std::int64_t{1} << 20;

  /// Updates on `stream` with gradients of `grad_dtype` and outputs of `out_dtype`; `done`
  /// gets one point per batch for the groups that share it (then()).
  DeviceUpdateBatch(Device& device, Stream& stream, DType grad_dtype, DType out_dtype, SharedReady& done)
      : device_(device), stream_(stream), grad_dtype_(grad_dtype), out_dtype_(out_dtype), done_(done) {}

  /// One run's update, queued with the batch.
  void add(const AdamTensor& t);
  /// Work for the update stream after this batch's updates (a group's follow-up: fills,
  /// event records, frees); issues the batch when it is full. Call after the group's add()s.
  /// `group` >= 0: that group's update is done at the batch's shared point in `done`, recorded
  /// after every follow-up (its follow-up records no event of its own).
  void then(std::function<void()> after, int group = -1);
  /// Queues what is pending: the batch's updates, then the follow-ups in order. No-op when empty.
  void issue();

 private:
  Device& device_;
  Stream& stream_;
  DType grad_dtype_, out_dtype_;
  std::vector<AdamTensor> tensors_;
  SharedReady& done_;
  std::vector<std::function<void()>> afters_;
  std::vector<int> sharing_;  // the groups done at this batch's shared point
  std::int64_t elements_ = 0;
};

}  // namespace zoe::core
