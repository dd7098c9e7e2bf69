// The parts EngineImpl composes, each alone: ExecutionTrace (the order stage-3 prefetch
// follows) and DeferredFrees (buffers freed once the device is past them).
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <vector>

#include "src/core/deferred_frees.hpp"
#include "src/core/execution_trace.hpp"
#include "src/device/host_device.hpp"

using namespace zoe;
using namespace zoe::core;

namespace {
std::vector<TraceEntry> upcoming(const ExecutionTrace& t) { return {t.upcoming().begin(), t.upcoming().end()}; }
}  // namespace

TEST(ExecutionTrace, PredictsTheLastStepsOrderUntilItDiffers) {
  ExecutionTrace t;
  const std::vector<TraceEntry> order{{0, false}, {1, false}, {1, true}, {0, true}};
  for (const TraceEntry& e : order) EXPECT_FALSE(t.record(e));  // first step: nothing to predict
  EXPECT_FALSE(t.predicting());
  t.end_step();
  EXPECT_TRUE(t.predicting());
  EXPECT_EQ(upcoming(t), order);
  EXPECT_FALSE(t.record(order[0]));
  EXPECT_EQ(upcoming(t), std::vector<TraceEntry>(order.begin() + 1, order.end()));
  EXPECT_EQ(t.position(), 1u);
  // A different call ends the prediction (reported once) and nothing is upcoming.
  EXPECT_TRUE(t.record({1, true}));
  EXPECT_FALSE(t.predicting());
  EXPECT_TRUE(upcoming(t).empty());
  EXPECT_FALSE(t.record({0, true}));
  // The next step predicts this step's order, the one that actually ran.
  t.end_step();
  EXPECT_EQ(upcoming(t), (std::vector<TraceEntry>{{0, false}, {1, true}, {0, true}}));
  // Running past the recorded order ends the prediction too.
  for (const TraceEntry& e : upcoming(t)) EXPECT_FALSE(t.record(e));
  EXPECT_TRUE(t.record({0, false}));
  t.end_step();
  t.end_step();  // a step without calls: nothing to predict
  EXPECT_FALSE(t.predicting());
}

TEST(DeferredFrees, FreesOnceTheSideStreamIsPastTheFreeAndCountsReleasingElements) {
  HostDevice device;
  MemoryLedger ledger;
  auto side = device.create_stream();
  DeferredFrees frees(device, *side, /*poison=*/false);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  device.host_func(*side, [open] { open.wait(); });  // the side stream is busy until the gate opens
  frees.after_side(DeviceBuffer(device, ledger, MemKind::buffer, DType::f32, 256), 256);
  EXPECT_EQ(ledger.get(Tier::device, MemKind::buffer), 1024);
  EXPECT_EQ(frees.releasing_elements(), 256);
  frees.reap(false);  // not past it yet: kept
  EXPECT_EQ(ledger.get(Tier::device, MemKind::buffer), 1024);
  gate.set_value();
  frees.reap(true);
  EXPECT_EQ(ledger.get(Tier::device, MemKind::buffer), 0);
  EXPECT_EQ(frees.releasing_elements(), 0);
  EXPECT_FALSE(frees.reap_oldest());  // nothing pending
}

TEST(DeferredFrees, PoisonFillsTheBufferWithNanBeforeItIsFreed) {
  HostDevice device;
  MemoryLedger ledger;
  auto side = device.create_stream();
  DeferredFrees frees(device, *side, /*poison=*/true);
  DeviceBuffer b(device, ledger, MemKind::buffer, DType::f32, 64);
  device.fill(b.data(), DType::f32, 64, 1.0f, *side);
  const float* stale = static_cast<const float*>(b.data());
  frees.after_side(std::move(b));
  int nan_count = 0;
  device.host_func(*side, [&] {  // still allocated here: the free waits for this point of the stream
    for (int i = 0; i < 64; ++i) nan_count += std::isnan(stale[i]) ? 1 : 0;
  });
  device.synchronize(*side);
  EXPECT_EQ(nan_count, 64);
  EXPECT_TRUE(frees.reap_oldest());
  EXPECT_EQ(ledger.get(Tier::device, MemKind::buffer), 0);
}
