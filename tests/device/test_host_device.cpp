// HostDevice: byte accounting, stream ordering and overlap, CUDA event semantics,
// error propagation, and the trainer-on-the-calling-thread usage of compute_stream().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "src/device/host_device.hpp"
#include "src/device/host_stream.hpp"
#include "zoe/engine.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace std::chrono_literals;

namespace {
// A task that blocks its stream until open() is called (or 10 s pass, so a broken
// implementation fails instead of hanging).
struct Gate {
  std::promise<void> promise;
  std::shared_future<void> future = promise.get_future().share();
  std::function<void()> task() {
    auto f = future;
    return [f] { f.wait_for(10s); };
  }
  void open() { promise.set_value(); }
};
}  // namespace

TEST(HostDevice, MemoryAccountingAndAlignment) {
  HostDevice dev;
  void* a = dev.allocate(1000);
  void* b = dev.allocate(3000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 256, 0u);
  EXPECT_EQ(dev.memory_stats().current_bytes, 4000);
  EXPECT_EQ(dev.memory_stats().peak_bytes, 4000);
  dev.deallocate(b);
  EXPECT_EQ(dev.memory_stats().current_bytes, 1000);
  EXPECT_EQ(dev.memory_stats().peak_bytes, 4000);
  dev.reset_peak();
  EXPECT_EQ(dev.memory_stats().peak_bytes, 1000);
  void* c = dev.allocate(0);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(dev.memory_stats().current_bytes, 1000);
  dev.deallocate(c);
  dev.deallocate(a);
  dev.deallocate(nullptr);
  EXPECT_EQ(dev.memory_stats().current_bytes, 0);
  int not_ours = 0;
  EXPECT_THROW(dev.deallocate(&not_ours), UsageError);
}

TEST(HostDevice, CapacityRaisesOutOfMemory) {
  HostDevice dev(10000);
  void* a = dev.allocate(6000);
  EXPECT_THROW(dev.allocate(5000), OutOfMemoryError);
  void* b = dev.allocate(4000);
  EXPECT_EQ(dev.memory_stats().current_bytes, 10000);
  dev.deallocate(a);
  dev.deallocate(b);
}

TEST(HostDevice, FreedLargeBlocksAreReusedAndAMissReleasesTheCache) {
  if (!HostDevice::kCachesBlocks) GTEST_SKIP() << "the block cache is off under AddressSanitizer";
  HostDevice dev;
  const std::size_t big = 2 * HostDevice::kCacheMinBytes + 100;  // rounds up to 256 bytes
  const std::size_t rounded = (big + 255) / 256 * 256;
  void* a = dev.allocate(big);
  void* b = dev.allocate(big);
  void* small = dev.allocate(1000);  // live peak: 2 big blocks + 1024 bytes
  dev.deallocate(small);
  dev.deallocate(a);
  dev.deallocate(b);
  EXPECT_EQ(dev.cached_bytes(), 2 * rounded);  // small blocks are in free lists of their own
  if (HostDevice::kCachesBlocks) EXPECT_EQ(dev.small_cached_bytes(), 1024u);
  EXPECT_EQ(dev.memory_stats().current_bytes, 0);  // cached bytes are not in use
  // The same rounded size comes back from the cache, most recently freed first.
  EXPECT_EQ(dev.allocate(big - 50), b);
  EXPECT_EQ(dev.cached_bytes(), rounded);
  EXPECT_EQ(dev.memory_stats().current_bytes, static_cast<std::int64_t>(big - 50));
  // Small blocks are outside the cache's account: even past the live peak they release nothing
  // (a step's small read-back buffer must not unmap a cached gathered buffer) ...
  small = dev.allocate(1000);
  void* small2 = dev.allocate(3000);
  EXPECT_EQ(dev.cached_bytes(), rounded);
  // ... a cacheable miss past the peak releases cached blocks until live + cached fit again.
  const std::size_t other = HostDevice::kCacheMinBytes + 4096;  // a size the cache does not hold
  void* c = dev.allocate(other);
  EXPECT_EQ(dev.cached_bytes(), 0u);
  dev.deallocate(c);
  EXPECT_EQ(dev.cached_bytes(), other);
  dev.deallocate(small);
  dev.deallocate(small2);
  // Past the live peak, a miss releases the cache, largest first, as far as it must (here: all).
  dev.deallocate(b);
  EXPECT_EQ(dev.cached_bytes(), rounded + other);
  void* d = dev.allocate(3 * HostDevice::kCacheMinBytes);
  EXPECT_EQ(dev.cached_bytes(), 0u);
  dev.deallocate(d);
  EXPECT_EQ(dev.cached_bytes(), 3 * HostDevice::kCacheMinBytes);
}

// Blocks below kCacheMinBytes come back from free lists of their own, by rounded size, and
// stay reserved: a model of many small modules allocates nothing from the system per step.
TEST(HostDevice, FreedSmallBlocksAreReusedBySize) {
  if (!HostDevice::kCachesBlocks) GTEST_SKIP() << "the block cache is off under AddressSanitizer";
  HostDevice dev;
  void* a = dev.allocate(1000);  // 1024 rounded
  void* b = dev.allocate(3000);  // 3072
  dev.deallocate(a);
  dev.deallocate(b);
  // A block in a free list is still the device's memory, but not allocated: a second free is refused.
  EXPECT_THROW(dev.deallocate(a), UsageError);
  EXPECT_TRUE(dev.is_device_memory(a, 1000));
  EXPECT_EQ(dev.small_cached_bytes(), 1024u + 3072u);
  EXPECT_EQ(dev.cached_bytes(), 0u);
  EXPECT_EQ(dev.memory_stats().current_bytes, 0);
  EXPECT_EQ(dev.memory_stats().reserved_bytes, 1024 + 3072);
  EXPECT_EQ(dev.allocate(1020), a);  // the same rounded size
  EXPECT_EQ(dev.allocate(2900), b);
  EXPECT_EQ(dev.small_cached_bytes(), 0u);
  EXPECT_EQ(dev.memory_stats().current_bytes, 1020 + 2900);
  void* c = dev.allocate(1000);  // none left of its size: a new block
  EXPECT_NE(c, a);
  EXPECT_EQ(dev.memory_stats().reserved_bytes, 1024 + 3072 + 1024);
  dev.deallocate(a);
  dev.deallocate(b);
  dev.deallocate(c);
  // zoe.debug_poison releases them, as it does the large ones.
  dev.set_poison_freed(0);
  EXPECT_EQ(dev.small_cached_bytes(), 0u);
}

// Small blocks come from 2 MiB slabs of one size class: more blocks than a slab holds are all
// distinct, aligned and reserved one by one; a free finds its block's state in its slab (a
// second free and an address inside a block are refused); under the poison mode a freed small
// block is poisoned and never handed out again.
TEST(HostDevice, SmallBlocksSpanSlabsAndKeepTheirStates) {
  if (!HostDevice::kCachesBlocks) GTEST_SKIP() << "the block cache is off under AddressSanitizer";
  HostDevice dev;
  constexpr std::size_t kBlocks = 3000;  // 1 KiB each: one and a half slabs
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < kBlocks; ++i) blocks.push_back(dev.allocate(1000));
  std::vector<void*> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a block handed out twice";
  for (void* b : blocks) ASSERT_EQ(reinterpret_cast<std::uintptr_t>(b) % HostDevice::kAlignment, 0u);
  for (void* b : blocks) std::memset(b, 1, 1000);  // each block is usable memory
  EXPECT_EQ(dev.memory_stats().current_bytes, static_cast<std::int64_t>(kBlocks * 1000));
  EXPECT_EQ(dev.memory_stats().reserved_bytes, static_cast<std::int64_t>(kBlocks * 1024));
  int not_ours = 0;
  EXPECT_THROW(dev.deallocate(static_cast<char*>(blocks[5]) + 256), UsageError);  // inside a block
  EXPECT_THROW(dev.deallocate(&not_ours), UsageError);
  for (void* b : blocks) dev.deallocate(b);
  EXPECT_THROW(dev.deallocate(blocks[kBlocks - 1]), UsageError);  // freed already
  EXPECT_EQ(dev.memory_stats().current_bytes, 0);
  EXPECT_EQ(dev.small_cached_bytes(), kBlocks * 1024);
  for (std::size_t i = 0; i < kBlocks; ++i) EXPECT_EQ(dev.allocate(900), blocks[kBlocks - 1 - i]);  // newest first
  EXPECT_EQ(dev.memory_stats().reserved_bytes, static_cast<std::int64_t>(kBlocks * 1024));  // nothing new
  for (void* b : blocks) dev.deallocate(b);
  dev.set_poison_freed(0);
  void* p = dev.allocate(1000);
  EXPECT_EQ(std::find(blocks.begin(), blocks.end(), p), blocks.end()) << "a listed block came back after set_poison_freed";
  dev.deallocate(p);
  const auto* f = static_cast<const float*>(p);
  EXPECT_TRUE(std::isnan(f[0]) && std::isnan(f[249]));
  EXPECT_TRUE(dev.is_device_memory(p, 1000));  // retired, still the device's
  EXPECT_THROW(dev.deallocate(p), UsageError);
  EXPECT_NE(dev.allocate(1000), p);
}

// Allocated (torch's memory_allocated) counts the requested bytes of live blocks; reserved
// (memory_reserved) every block the device holds, 256-byte rounded, cached ones included.
TEST(HostDevice, AllocatedAndReservedPeaksAreCountedApart) {
  HostDevice dev;
  const auto round = [](std::size_t b) { return static_cast<std::int64_t>((b + 255) / 256 * 256); };
  const std::size_t big = 2 * HostDevice::kCacheMinBytes + 100, small = 1000;
  void* a = dev.allocate(big);
  void* s = dev.allocate(small);
  DeviceMemoryStats m = dev.memory_stats();
  EXPECT_EQ(m.current_bytes, static_cast<std::int64_t>(big + small));
  EXPECT_EQ(m.reserved_bytes, round(big) + round(small));
  EXPECT_EQ(m.reserved_peak_bytes, round(big) + round(small));
  dev.deallocate(a);
  m = dev.memory_stats();
  EXPECT_EQ(m.current_bytes, static_cast<std::int64_t>(small));
  EXPECT_EQ(m.peak_bytes, static_cast<std::int64_t>(big + small));
  // The freed block stays reserved in the cache (not under ASan, which frees it).
  const std::int64_t cached = HostDevice::kCachesBlocks ? round(big) : 0;
  EXPECT_EQ(m.reserved_bytes, cached + round(small));
  EXPECT_EQ(m.reserved_peak_bytes, round(big) + round(small));
  // A cache hit takes nothing new from the system.
  a = dev.allocate(big);
  EXPECT_EQ(dev.memory_stats().reserved_bytes, round(big) + round(small));
  dev.deallocate(a);
  // A miss past the live peak releases the cache first: the reserved peak is the new block's.
  const std::size_t larger = 3 * HostDevice::kCacheMinBytes;
  void* b = dev.allocate(larger);
  m = dev.memory_stats();
  EXPECT_EQ(m.reserved_bytes, round(larger) + round(small));
  EXPECT_EQ(m.reserved_peak_bytes, round(larger) + round(small));
  EXPECT_EQ(m.peak_bytes, static_cast<std::int64_t>(larger + small));
  dev.deallocate(b);
  dev.reset_peak();
  m = dev.memory_stats();
  EXPECT_EQ(m.peak_bytes, static_cast<std::int64_t>(small));
  EXPECT_EQ(m.reserved_peak_bytes, m.reserved_bytes);
  EXPECT_EQ(m.reserved_bytes, (HostDevice::kCachesBlocks ? round(larger) : 0) + round(small));
  dev.deallocate(s);
}

TEST(HostDevice, CachedBlocksDoNotCountAgainstCapacity) {
  HostDevice dev(3 * HostDevice::kCacheMinBytes);
  void* a = dev.allocate(2 * HostDevice::kCacheMinBytes);
  dev.deallocate(a);
  // The freed block is cached, yet the whole capacity is available again.
  void* b = dev.allocate(3 * HostDevice::kCacheMinBytes);
  EXPECT_EQ(dev.memory_stats().current_bytes, static_cast<std::int64_t>(3 * HostDevice::kCacheMinBytes));
  EXPECT_THROW(dev.allocate(1), OutOfMemoryError);
  dev.deallocate(b);
}

TEST(HostDevice, StreamRunsInOrder) {
  HostDevice dev;
  auto s = dev.create_stream();
  std::vector<int> order;
  for (int i = 0; i < 200; ++i) {
    if (i % 50 == 0) dev.host_func(*s, [] { std::this_thread::sleep_for(2ms); });
    dev.host_func(*s, [&order, i] { order.push_back(i); });
  }
  // A copy queued after host funcs sees their writes.
  std::vector<int> src(3, 7), dst(3, 0);
  dev.host_func(*s, [&] { src[1] = 42; });
  dev.copy(dst.data(), src.data(), 3 * sizeof(int), *s);
  dev.synchronize(*s);
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(dst, (std::vector<int>{7, 42, 7}));
}

TEST(HostDevice, DifferentStreamsOverlap) {
  // Stream a blocks until stream b has run a task: only possible if they run concurrently.
  HostDevice dev;
  auto a = dev.create_stream();
  auto b = dev.create_stream();
  std::promise<void> b_ran;
  auto f = b_ran.get_future();
  std::atomic<bool> a_saw_b{false};
  dev.host_func(*a, [&] { a_saw_b = f.wait_for(10s) == std::future_status::ready; });
  dev.host_func(*b, [&] { b_ran.set_value(); });
  dev.synchronize(*a);
  dev.synchronize(*b);
  EXPECT_TRUE(a_saw_b);
}

TEST(HostDevice, EventRecordWaitQuerySynchronize) {
  HostDevice dev;
  auto a = dev.create_stream();
  auto b = dev.create_stream();
  auto ev = dev.create_event();
  EXPECT_TRUE(dev.query(*ev));  // never recorded: complete
  dev.synchronize(*ev);

  Gate gate;
  std::atomic<int> a_value{0}, b_saw{-1};
  dev.host_func(*a, gate.task());
  dev.host_func(*a, [&] { a_value = 1; });
  dev.record(*ev, *a);
  dev.wait(*b, *ev);
  dev.host_func(*b, [&] { b_saw = a_value.load(); });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(dev.query(*ev));
  EXPECT_EQ(b_saw.load(), -1);  // b waits for a's event
  gate.open();
  dev.synchronize(*ev);
  EXPECT_TRUE(dev.query(*ev));
  EXPECT_EQ(a_value.load(), 1);
  dev.synchronize(*b);
  EXPECT_EQ(b_saw.load(), 1);
}

TEST(HostDevice, ReRecordMovesTheEvent) {
  HostDevice dev;
  auto a = dev.create_stream();
  auto ev = dev.create_event();
  dev.record(*ev, *a);
  dev.synchronize(*ev);
  EXPECT_TRUE(dev.query(*ev));
  Gate gate;
  dev.host_func(*a, gate.task());
  EXPECT_TRUE(dev.query(*ev));  // still the old point
  dev.record(*ev, *a);
  EXPECT_FALSE(dev.query(*ev));  // moved behind the gate
  // A wait captured now keeps the point even if the event is re-recorded later.
  auto b = dev.create_stream();
  std::atomic<bool> b_ran{false};
  dev.wait(*b, *ev);
  dev.host_func(*b, [&] { b_ran = true; });
  dev.record(*ev, *b);  // re-record on another stream
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_ran.load());
  gate.open();
  dev.synchronize(*ev);
  EXPECT_TRUE(b_ran.load());
}

// A stream that already waits for ticket t of a queue needs no wait for an earlier ticket of it
// (one queue completes in order): many groups whose events share a point cost one wait task.
TEST(HostDevice, AWaitCoveredByAnEarlierOneQueuesNothing) {
  auto a = std::make_shared<HostQueue>("a"), c = std::make_shared<HostQueue>("c");
  HostQueue b("b");
  Gate gate;
  std::atomic<int> a_done{0}, b_saw{-1};
  a->enqueue(gate.task());
  const std::uint64_t t2 = a->enqueue([&] { a_done = 2; });
  const std::uint64_t t3 = a->enqueue([&] { a_done = 3; });
  EXPECT_TRUE(b.enqueue_wait(a, t3));
  EXPECT_FALSE(b.enqueue_wait(a, t2));  // covered by the wait for t3
  EXPECT_FALSE(b.enqueue_wait(a, t3));
  const std::uint64_t before = b.last_ticket();
  EXPECT_TRUE(b.enqueue_wait(c, c->enqueue([] {})));  // another queue: a wait of its own
  EXPECT_EQ(b.last_ticket(), before + 1);
  b.enqueue([&] { b_saw = a_done.load(); });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(b_saw.load(), -1);  // still behind a's gate
  gate.open();
  b.synchronize();
  EXPECT_EQ(b_saw.load(), 3);
  EXPECT_TRUE(b.enqueue_wait(a, a->enqueue([] {})));  // a later ticket: waited for again
  b.synchronize();
}

// Device::stream_waits_for / compute_waits_for on the host device: no event is recorded; a
// producer with queued work is waited for once (a second wait is covered), a producer whose
// work has run costs no task, and compute_waits_for blocks for the work and rethrows its error.
TEST(HostDevice, AStreamWaitsForAnotherStreamWithoutAnEvent) {
  HostDevice dev;
  auto a = dev.create_stream(), b = dev.create_stream();
  auto scratch = dev.create_event();
  auto ticket = [](Stream& s) { return static_cast<HostStream&>(s).queue()->last_ticket(); };
  Gate gate;
  std::atomic<int> a_done{0}, b_saw{-1};
  dev.host_func(*a, gate.task());
  dev.host_func(*a, [&] { a_done = 1; });
  const std::uint64_t b0 = ticket(*b);
  dev.stream_waits_for(*b, *a, *scratch);
  EXPECT_EQ(ticket(*b), b0 + 1);  // one wait task
  dev.stream_waits_for(*b, *a, *scratch);
  EXPECT_EQ(ticket(*b), b0 + 1);  // covered by the first
  dev.host_func(*b, [&] { b_saw = a_done.load(); });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(b_saw.load(), -1);  // behind a's gate
  gate.open();
  dev.synchronize(*b);
  EXPECT_EQ(b_saw.load(), 1);
  const std::uint64_t b1 = ticket(*b);
  dev.stream_waits_for(*b, *a, *scratch);  // a's work has run: nothing to queue
  EXPECT_EQ(ticket(*b), b1);
  EXPECT_TRUE(dev.query(*scratch));  // never recorded

  std::atomic<bool> slow_done{false};
  dev.host_func(*a, [&] {
    std::this_thread::sleep_for(20ms);
    slow_done = true;
  });
  dev.compute_waits_for(*a, *scratch);
  EXPECT_TRUE(slow_done.load());
  dev.host_func(*a, [] { throw IoError("/y", 0, 512, 5, "read", __FILE__, __LINE__); });
  EXPECT_THROW(dev.compute_waits_for(*a, *scratch), IoError);
  EXPECT_THROW(dev.synchronize(*a), IoError);  // kept for the stream's own synchronize
}

TEST(HostDevice, TaskErrorIsRethrownAtSynchronize) {
  HostDevice dev;
  auto s = dev.create_stream();
  std::atomic<bool> later_ran{false};
  dev.host_func(*s, [] { throw IoError("/x", 4096, 512, 5, "read", __FILE__, __LINE__); });
  dev.host_func(*s, [] { throw std::runtime_error("second error is not the one reported"); });
  dev.host_func(*s, [&] { later_ran = true; });
  auto ev = dev.create_event();
  dev.record(*ev, *s);
  EXPECT_THROW(dev.synchronize(*ev), IoError);  // event sync reports it but keeps it
  try {
    dev.synchronize(*s);
    FAIL() << "synchronize did not rethrow";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), "/x");
    EXPECT_EQ(e.offset(), 4096);
  }
  EXPECT_TRUE(later_ran.load());
  dev.synchronize(*s);  // reported once
}

TEST(HostDevice, ComputeStreamFromTheTrainersThread) {
  // The trainer writes on its own thread, the engine queues work on compute_stream(),
  // the trainer reads after synchronize or an event.
  auto devp = make_host_device();
  Device& dev = *devp;
  EXPECT_EQ(dev.kind(), DeviceKind::host);
  EXPECT_EQ(dev.name(), "host");
  auto* x = static_cast<float*>(dev.allocate(1024 * sizeof(float)));
  for (int i = 0; i < 1024; ++i) x[i] = float(i);  // trainer's write
  dev.scale(x, DType::f32, 1024, 0.5f, dev.compute_stream());
  auto ev = dev.create_event();
  dev.record(*ev, dev.compute_stream());
  dev.synchronize(*ev);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(x[i], float(i) * 0.5f);
  auto side = dev.create_stream();
  dev.wait(*side, *ev);
  dev.scale(x, DType::f32, 1024, 4.0f, *side);
  auto ev2 = dev.create_event();
  dev.record(*ev2, *side);
  dev.wait(dev.compute_stream(), *ev2);
  dev.fill(x, DType::f32, 1, -1.0f, dev.compute_stream());
  dev.synchronize(dev.compute_stream());
  EXPECT_EQ(x[0], -1.0f);
  EXPECT_EQ(x[3], 6.0f);
  dev.deallocate(x);
}

TEST(HostDevice, ForeignStreamIsRejected) {
  HostDevice a, b;
  struct NotAHostStream : Stream {} foreign;
  EXPECT_THROW(a.host_func(foreign, [] {}), UsageError);
  auto sb = b.create_stream();
  a.host_func(*sb, [] {});  // streams are not bound to a device instance
  a.synchronize(*sb);
}

TEST(HostDevice, BestAvailableFallsBackToHost) {
  auto dev = best_available_device(0);
  ASSERT_NE(dev, nullptr);
  // This machine has no GPU; on a GPU machine the CUDA device is the right answer.
  EXPECT_TRUE(dev->kind() == DeviceKind::host || dev->name().rfind("cuda:0", 0) == 0) << dev->name();
}
