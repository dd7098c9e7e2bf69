// SharedReady: groups that become ready at one point of a stream share one event: the groups
// of one coalesced all-gather (ready for the trainer's compute), the groups of one batched
// device update (ready for the side stream's next all-gather). One record for them all instead
// of one per group, and the waiter waits for each point once instead of once per group. With
// thousands of small modules the per-group records and waits were a cache miss each (a
// separate event object per group); the shared point stays in cache.
// A group without a shared point uses its own event (Group::param_ready, update_done).
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/device/device.hpp"

namespace zoe::core {

class SharedReady {
 public:
  /// `waiter`: the stream that waits (wait()); null = the trainer's compute stream.
  SharedReady(Device& device, Stream* waiter) : device_(device), waiter_(waiter) {}

  /// Records one point on `side` at which every group of `groups` (indices) is ready.
  void record(std::span<const int> groups, Stream& side);
  /// Group `gi`'s own event decides again.
  void forget(int gi) {
    if (static_cast<std::size_t>(gi) < point_of_.size()) point_of_[static_cast<std::size_t>(gi)] = 0;
  }
  /// Orders the waiter after group `gi` is ready: after its shared point (waited for once per
  /// point), or after `own` (its own event) when it has none.
  void wait(int gi, Event& own);

 private:
  // Points are numbered from 1; point p uses events_[p % kEvents]. A slot is recorded again
  // kEvents points later; a group that still names the older point then waits for the newer
  // one of the same stream, which is later, so never too early (only a coalesced gather that
  // long ago and still unwaited would wait a little longer).
  static constexpr std::uint32_t kEvents = 16;
  Device& device_;
  Stream* waiter_;
  std::vector<std::unique_ptr<Event>> events_;
  std::vector<std::uint32_t> point_of_;  // per group: its shared point, 0 = none
  std::uint32_t last_point_ = 0;         // the latest recorded
  std::uint32_t waited_point_ = 0;       // the latest the waiter waited for
};

}  // namespace zoe::core
