#include "src/core/update/device_update_batch.hpp"

namespace zoe::core {

void DeviceUpdateBatch::add(const AdamTensor& t) {
  tensors_.push_back(t);
  elements_ += static_cast<std::int64_t>(t.n);
}

void DeviceUpdateBatch::then(std::function<void()> after, int group) {
  afters_.push_back(std::move(after));
  if (group >= 0) sharing_.push_back(group);
  if (elements_ >= kElements) issue();
}

void DeviceUpdateBatch::issue() {
  device_.adam_step_batch(tensors_, grad_dtype_, out_dtype_, stream_);
  tensors_.clear();
  elements_ = 0;
  for (auto& f : afters_) f();  // (they queue work; none adds to the batch)
  afters_.clear();                // the capacity stays: the next step's batch reuses it
  if (!sharing_.empty()) done_.record(sharing_, stream_);
  sharing_.clear();
}

}  // namespace zoe::core
