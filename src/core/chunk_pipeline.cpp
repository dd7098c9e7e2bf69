#include "src/core/chunk_pipeline.hpp"

#include <utility>

#include "src/common/check.hpp"

namespace zoe::core {

ChunkPipeline::ChunkPipeline(std::size_t slot_floats, int slot_count) {
  ZOE_CHECK_USAGE(slot_count >= 1, "ChunkPipeline needs at least one slot, got ", slot_count);
  slots_.resize(static_cast<std::size_t>(slot_count));
  for (Slot& s : slots_) s.data.resize(slot_floats);
}

ChunkPipeline::~ChunkPipeline() { abandon(); }

std::span<float> ChunkPipeline::acquire() {
  ZOE_CHECK_USAGE(filling_ == SIZE_MAX, "ChunkPipeline::acquire: slot ", filling_, " is still being filled");
  Slot& s = slots_[next_];
  if (s.state == SlotState::queued) {
    writer_.wait_for(s.ticket);  // its store has run (or was skipped)
    s.state = SlotState::free;
  }
  writer_.rethrow_error_up_to(writer_.last_ticket());
  s.state = SlotState::filling;
  filling_ = next_;
  next_ = (next_ + 1) % slots_.size();
  return s.data;
}

void ChunkPipeline::submit(std::function<void()> store) {
  ZOE_CHECK_USAGE(filling_ != SIZE_MAX, "ChunkPipeline::submit without an acquired slot");
  Slot& s = slots_[filling_];
  s.ticket = enqueue(std::move(store));
  s.state = SlotState::queued;
  filling_ = SIZE_MAX;
}

void ChunkPipeline::run(std::function<void()> work) { enqueue(std::move(work)); }

std::uint64_t ChunkPipeline::enqueue(std::function<void()> work) {
  return writer_.enqueue([this, work = std::move(work)] {
    if (failed_.load()) return;  // a store before it failed
    try {
      work();
    } catch (...) {
      failed_.store(true);
      throw;  // kept by the queue: acquire() / finish() rethrow it
    }
    completed_.fetch_add(1);
  });
}

void ChunkPipeline::finish() {
  if (filling_ != SIZE_MAX) slots_[filling_].state = SlotState::free;  // filled but never submitted
  filling_ = SIZE_MAX;
  writer_.synchronize();
  for (Slot& s : slots_) s.state = SlotState::free;
}

void ChunkPipeline::abandon() noexcept {
  try {
    finish();
  } catch (...) {
  }
}

}  // namespace zoe::core
