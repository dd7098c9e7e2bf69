// DeferredFrees: device buffers the engine is done with while the device may still read them.
// Each waits for an event (recorded on the side stream at the time of the free, or one given)
// and is freed once that event has completed, oldest first. A released stage-3 gather buffer
// counts as "releasing" until then, so stage3_max_live_parameters bounds gathered plus
// not-yet-returned elements. A free may also hold something else alive until then (a pinned
// read buffer the freed copy came from).
//
// zoe.debug_poison: a buffer freed after the side stream is first filled with NaN there, and
// show_poison() makes those fills visible to the trainer's compute, so a stale view reads NaN.
//
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "src/core/device_buffer.hpp"
#include "src/device/device.hpp"

namespace zoe::core {

class DeferredFrees {
 public:
  /// `device` and `side` (the engine's collective stream) must outlive this.
  DeferredFrees(Device& device, Stream& side, bool poison) : device_(device), side_(side), poison_(poison) {}

  /// Frees `buffer` (and drops `hold`) once the side stream has reached this point;
  /// `gathered_elements` of a released stage-3 gather count as releasing until then.
  void after_side(DeviceBuffer buffer, std::int64_t gathered_elements = 0, std::shared_ptr<void> hold = {});
  /// Frees every one of `buffers` once the side stream has reached this point: one event for
  /// all (a bucket's gradient buffers).
  void after_side(std::vector<DeviceBuffer> buffers);
  /// Frees `buffer` (and drops `hold`) once `event` has completed.
  void after(DeviceBuffer buffer, std::shared_ptr<Event> event, std::shared_ptr<void> hold = {});
  /// Frees `buffer` (and drops `hold`) once `stream` has reached this point.
  void after_stream(Stream& stream, DeviceBuffer buffer, std::shared_ptr<void> hold = {});
  /// Frees every buffer whose event has completed, oldest first (stopping at the first that has
  /// not); `wait_all`: waits for and frees all of them.
  void reap(bool wait_all);
  /// Waits for the oldest pending free and performs it; false when none is pending.
  bool reap_oldest();
  /// A point in the order of frees: every free queued so far comes before it.
  std::uint64_t mark() const { return queued_; }
  /// Waits for and performs every pending free queued before `point` (a mark()).
  void reap_before(std::uint64_t point);
  /// zoe.debug_poison: makes the NaN fills queued so far visible to the trainer's compute.
  void show_poison();

  bool poison() const { return poison_; }
  /// Elements of released stage-3 gather buffers not yet returned.
  std::int64_t releasing_elements() const { return releasing_elements_; }

 private:
  struct Pending {
    DeviceBuffer buffer;
    std::unique_ptr<Event> own;    // recorded here (after_side, after_stream): back to spare_ once done
    std::shared_ptr<Event> given;  // or the caller's (after)
    std::int64_t gathered_elements = 0;
    std::shared_ptr<void> hold;
    Event& event() const { return own ? *own : *given; }
  };
  void pop();
  // An event recorded at the current end of `stream`: a spare one if any (thousands of small
  // modules free a buffer per module and call: no allocation each time).
  std::unique_ptr<Event> event_at(Stream& stream);

  Device& device_;
  Stream& side_;
  const bool poison_;
  std::deque<Pending> pending_;
  std::vector<std::unique_ptr<Event>> spare_;  // events of frees performed, for reuse
  std::int64_t releasing_elements_ = 0;
  std::uint64_t queued_ = 0;  // frees queued so far
  std::uint64_t done_ = 0;    // frees performed so far (the front of pending_ is number done_)
};

}  // namespace zoe::core
