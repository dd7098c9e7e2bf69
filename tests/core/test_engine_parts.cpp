// The parts EngineImpl composes, each alone: ExecutionTrace (the order stage-3 prefetch
// follows), DeferredFrees (buffers freed once the device is past them) and ChunkPipeline
// (construction's chunks filled on the caller's thread while the writer stores the previous one),
// SharedReady (groups that become ready at one point share one event).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "src/core/chunk_pipeline.hpp"
#include "src/core/deferred_frees.hpp"
#include "src/core/execution_trace.hpp"
#include "src/core/shared_ready.hpp"
#include "src/device/host_device.hpp"
#include "zoe/error.hpp"

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

// Ten chunks through two slots: every store runs on one other thread, in order, and reads the
// values its chunk was filled with; chunk k+1 is filled while chunk k's store still runs, and
// the filling of chunk k+2 waits for it (two slots: no third chunk in host memory).
TEST(ChunkPipeline, FillsTheNextChunkWhileTheWriterStoresThePreviousOneInOrder) {
  ChunkPipeline p(4);
  std::vector<float> stored;  // written by the stores only, read after finish()
  std::vector<std::thread::id> writers;
  std::promise<void> second_filled;
  std::shared_future<void> gate = second_filled.get_future().share();
  for (int k = 0; k < 10; ++k) {
    std::span<float> chunk;
    if (k == 2) {
      // Store 0 is held until chunk 1 is filled, so this acquire (slot 0 again) cannot return yet.
      auto third = std::async(std::launch::async, [&] { return p.acquire(); });
      EXPECT_EQ(third.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
          << "chunk 2 was handed out while chunk 0's store held its slot";
      second_filled.set_value();
      chunk = third.get();
    } else {
      chunk = p.acquire();
    }
    ASSERT_EQ(chunk.size(), 4u);
    for (float& x : chunk) x = static_cast<float>(k);
    p.submit([&, k, chunk] {
      if (k == 0) gate.wait();  // chunk 1 is filled meanwhile
      writers.push_back(std::this_thread::get_id());
      for (float x : chunk) ASSERT_EQ(x, static_cast<float>(k));
      stored.push_back(chunk[0]);
    });
  }
  std::atomic<bool> flushed{false};
  p.run([&] { flushed = true; });  // work without a slot, after every store
  p.finish();
  EXPECT_EQ(stored, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(flushed.load());
  EXPECT_EQ(p.completed(), 11u);
  ASSERT_EQ(writers.size(), 10u);
  for (std::thread::id id : writers) {
    EXPECT_EQ(id, writers[0]) << "stores ran on more than one thread";
    EXPECT_NE(id, std::this_thread::get_id()) << "a store ran on the filling thread";
  }
}

// A store that throws (a disk error in the middle of construction): the later stores and work
// are skipped, the error surfaces at the next acquire of its slot (or finish), and nothing hangs.
TEST(ChunkPipeline, AStoreErrorSurfacesAndTheLaterStoresAreSkipped) {
  ChunkPipeline p(2);
  std::atomic<int> ran{0};
  int acquired = 0;
  try {
    for (int k = 0; k < 10; ++k) {
      p.acquire();
      ++acquired;
      p.submit([&, k] {
        if (k == 1) throw std::runtime_error("sector 42 is gone");
        ++ran;
      });
    }
    ADD_FAILURE() << "no acquire rethrew the store's error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "sector 42 is gone");
  }
  // Chunk 3 reuses chunk 1's slot, so its acquire waits for that store and throws at the latest.
  EXPECT_GE(acquired, 2);
  EXPECT_LE(acquired, 3);
  EXPECT_THROW(p.finish(), std::runtime_error);
  p.abandon();  // the error is dropped, nothing is queued: returns at once
  EXPECT_EQ(ran.load(), 1) << "a store after the failed one ran";
  EXPECT_EQ(p.completed(), 1u);

  // The same error, reported by finish() when no acquire came after it.
  ChunkPipeline q(2);
  q.acquire();
  q.submit([] { throw std::runtime_error("write failed"); });
  std::atomic<bool> flushed{false};
  q.run([&] { flushed = true; });
  EXPECT_THROW(q.finish(), std::runtime_error);
  EXPECT_FALSE(flushed.load());
}

// The filling side fails (an initializer throws): abandon() returns once the store in flight
// has finished, so nothing the pipeline runs outlives the caller's buffers.
TEST(ChunkPipeline, AbandonWaitsForTheStoreInFlightAndMisuseIsRefused) {
  std::atomic<bool> done{false};
  {
    ChunkPipeline p(1);
    p.acquire();
    p.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      done = true;
    });
    p.acquire();  // filled, then the caller fails: never submitted
    p.abandon();
    EXPECT_TRUE(done.load());
    EXPECT_THROW(p.submit([] {}), UsageError) << "abandon() returned the unsubmitted slot";
    p.acquire();
    EXPECT_THROW(p.acquire(), UsageError) << "a second slot while one is being filled";
  }
  EXPECT_THROW(ChunkPipeline(4, 0), UsageError);
}

// Groups recorded at one shared point: the waiter waits for it once (one wait task on its
// stream, however many groups), and is ordered after the point; a group that forgot its point
// waits on its own event.
TEST(SharedReady, TheWaiterWaitsOnceAPointAndAForgottenGroupUsesItsOwnEvent) {
  HostDevice dev;
  auto producer = dev.create_stream(), waiter = dev.create_stream();
  SharedReady ready(dev, waiter.get());
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> produced{0}, seen{-1};
  dev.host_func(*producer, [open] { open.wait(); });
  dev.host_func(*producer, [&] { produced = 1; });
  const std::vector<int> groups{0, 1, 2};
  ready.record(groups, *producer);
  auto own = dev.create_event();  // never recorded: complete
  const std::uint64_t before = host_queue(*waiter).last_ticket();
  for (int gi : groups) ready.wait(gi, *own);
  EXPECT_EQ(host_queue(*waiter).last_ticket(), before + 1) << "one wait for the three groups";
  dev.host_func(*waiter, [&] { seen = produced.load(); });
  ready.forget(1);
  ready.wait(1, *own);  // its own event: complete, nothing queued
  EXPECT_EQ(host_queue(*waiter).last_ticket(), before + 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(seen.load(), -1) << "the waiter ran before the shared point";
  gate.set_value();
  dev.synchronize(*waiter);
  EXPECT_EQ(seen.load(), 1);
}
