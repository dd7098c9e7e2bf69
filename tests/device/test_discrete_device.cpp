// The discrete host device (HostDeviceOptions::memory = discrete): copies between its arena
// and host memory run asynchronously on the copy engines, in stream order, for at least the
// modelled time; host code is kept out of the arena (check_host_accessible, also process-wide);
// pageable copies are counted exactly in both models; the block cache still works; the
// environment switch and the rank factory build discrete devices. Only lower bounds of time
// are asserted (a sleep never ends early) and overlap is shown by event order with margins of
// hundreds of milliseconds; measured speeds belong in bench/.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/comm/local_ranks.hpp"
#include "src/device/address_ranges.hpp"
#include "src/device/host_access.hpp"
#include "src/device/host_device.hpp"
#include "zoe/engine.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {
HostDeviceOptions discrete(double gbps = 0, double latency_us = 0) {
  return {.memory = HostMemoryModel::discrete, .copy_gbps = gbps, .copy_latency_us = latency_us};
}
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(AddressRanges, InsertLookupErase) {
  AddressRanges r;
  alignas(64) static char mem[1024];
  EXPECT_TRUE(r.insert(mem + 100, 100));  // [100, 200)
  EXPECT_TRUE(r.insert(mem + 300, 50));   // [300, 350)
  EXPECT_FALSE(r.insert(mem + 150, 100)) << "overlaps [100, 200)";
  EXPECT_FALSE(r.insert(mem + 50, 51)) << "its last byte is 100";
  EXPECT_FALSE(r.insert(nullptr, 8));
  EXPECT_FALSE(r.insert(mem, 0));
  EXPECT_TRUE(r.insert(mem + 200, 100)) << "adjacent, not overlapping";
  EXPECT_EQ(r.size(), 3u);
  EXPECT_TRUE(r.overlaps(mem + 100, 1));
  EXPECT_TRUE(r.overlaps(mem + 199, 1));
  EXPECT_TRUE(r.overlaps(mem + 90, 11));
  EXPECT_FALSE(r.overlaps(mem + 90, 10));
  EXPECT_FALSE(r.overlaps(mem + 350, 10));
  EXPECT_TRUE(r.overlaps(mem + 349, 0)) << "bytes == 0: the address itself";
  EXPECT_TRUE(r.contains(mem + 100, 100));
  EXPECT_TRUE(r.contains(mem + 320, 30));
  EXPECT_FALSE(r.contains(mem + 150, 100)) << "spans two ranges";
  EXPECT_FALSE(r.contains(mem + 320, 31));
  EXPECT_FALSE(r.contains(mem + 10, 1));
  EXPECT_TRUE(r.erase(mem + 200));
  EXPECT_FALSE(r.erase(mem + 200));
  EXPECT_FALSE(r.erase(mem + 101)) << "only by its first address";
  EXPECT_FALSE(r.overlaps(mem + 250, 1));
  EXPECT_EQ(r.size(), 2u);
}

TEST(DiscreteHostDevice, NameKindAndOptions) {
  HostDevice d(discrete(12.5, 3));
  EXPECT_EQ(d.name(), "host (discrete)");
  EXPECT_EQ(d.kind(), DeviceKind::host);
  EXPECT_EQ(d.memory_model(), HostMemoryModel::discrete);
  ASSERT_NE(d.h2d_engine(), nullptr);
  ASSERT_NE(d.d2h_engine(), nullptr);
  EXPECT_EQ(d.h2d_engine()->model().gbps, 12.5);
  EXPECT_EQ(d.d2h_engine()->model().latency_us, 3);
  HostDevice u;
  EXPECT_EQ(u.name(), "host");
  EXPECT_EQ(u.memory_model(), HostMemoryModel::unified);
  EXPECT_EQ(u.h2d_engine(), nullptr);
  EXPECT_STREQ(host_memory_model_name(HostMemoryModel::discrete), "discrete");
  EXPECT_STREQ(host_memory_model_name(HostMemoryModel::unified), "unified");
  EXPECT_THROW(HostDevice(discrete(-1, 0)), UsageError);
  EXPECT_THROW(HostDevice(discrete(0, std::nan(""))), UsageError);
  EXPECT_THROW(HostDevice(discrete(0, 1e14)), UsageError);
  EXPECT_THROW(HostDevice(discrete(1e-9, 0)), UsageError);
  // 1 ms latency + 2e6 bytes at 2 GB/s = 1 ms: 2 ms.
  EXPECT_EQ((CopyModel{2.0, 1000.0}.duration(2'000'000)), 2ms);
  EXPECT_EQ((CopyModel{0.0, 0.0}.duration(1 << 30)), 0ns);
}

TEST(DiscreteHostDevice, CopiesRoundTripThroughTheCopyEngines) {
  HostDevice d(discrete());
  const std::size_t n = 100'000;
  std::vector<float> h(n), back(n, -1.0f);
  std::iota(h.begin(), h.end(), 0.0f);
  auto* a = static_cast<float*>(d.allocate(n * 4));
  auto* b = static_cast<float*>(d.allocate(n * 4));
  auto s = d.create_stream();
  d.copy(a, h.data(), n * 4, *s);  // host -> device: h2d engine
  d.scale(a, DType::f32, n, 2.0f, *s);
  d.copy(b, a, n * 4, *s);  // device -> device: on the stream's thread
  d.copy(back.data(), b, n * 4, *s);  // device -> host: d2h engine
  d.synchronize(*s);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 2.0f * float(i)) << i;
  EXPECT_EQ(d.h2d_engine()->copies(), 1);
  EXPECT_EQ(d.h2d_engine()->bytes(), std::int64_t(n * 4));
  EXPECT_EQ(d.d2h_engine()->copies(), 1);
  std::vector<float> other(n);
  d.copy(other.data(), h.data(), n * 4, *s);  // host -> host: neither engine
  d.synchronize(*s);
  EXPECT_EQ(other, h);
  EXPECT_EQ(d.h2d_engine()->copies() + d.d2h_engine()->copies(), 2);
  d.deallocate(a);
  d.deallocate(b);
}

TEST(DiscreteHostDevice, ACopyIsAsynchronous) {
  HostDevice d(discrete(0, 1'000'000));  // 1 s per copy
  std::vector<int> h(1024, 7);
  auto* a = static_cast<int*>(d.allocate(h.size() * 4));
  auto s = d.create_stream();
  d.fill(a, DType::f32, h.size(), 0.0f, *s);
  d.synchronize(*s);
  auto done = d.create_event();
  const auto t0 = Clock::now();
  d.copy(a, h.data(), h.size() * 4, *s);
  d.record(*done, *s);
  EXPECT_FALSE(d.query(*done)) << "copy() waited for the copy";
  EXPECT_EQ(d.h2d_engine()->copies(), 0) << "the bytes move after the modelled latency";
  d.synchronize(*done);
  EXPECT_GE(seconds_since(t0), 1.0);
  EXPECT_EQ(d.h2d_engine()->copies(), 1);
  EXPECT_EQ(a[0], 7);
  EXPECT_EQ(a[1023], 7);
  d.deallocate(a);
}

TEST(DiscreteHostDevice, ACopyOverlapsWorkOnOtherStreamsAndEventsOrderIt) {
  HostDevice d(discrete(0, 1'000'000));  // 1 s per copy
  const std::size_t n = 4096;
  std::vector<float> h(n, 3.0f), back(n, 0.0f);
  auto* a = static_cast<float*>(d.allocate(n * 4));
  auto* b = static_cast<float*>(d.allocate(n * 4));
  auto copy_stream = d.create_stream();
  Stream& compute = d.compute_stream();
  d.copy(a, h.data(), n * 4, *copy_stream);
  auto copied = d.create_event();
  d.record(*copied, *copy_stream);
  // Compute on another stream runs while the copy is in flight.
  d.fill(b, DType::f32, n, 1.0f, compute);
  d.synchronize(compute);
  EXPECT_FALSE(d.query(*copied)) << "the fill waited for a copy on another stream";
  EXPECT_EQ(b[0], 1.0f);
  // Work that waits for the copy's event sees its bytes.
  d.wait(compute, *copied);
  d.accumulate(a, DType::f32, b, n, compute);  // b = 1 + 3
  d.copy(back.data(), b, n * 4, compute);  // then 1 s down
  d.synchronize(compute);
  EXPECT_TRUE(d.query(*copied));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 4.0f) << i;
  d.deallocate(a);
  d.deallocate(b);
}

TEST(DiscreteHostDevice, CopyEnginesPerDirectionShareBandwidthWithinOne) {
  // 0.05 GB/s: 32 MB take 640 ms, 4 KB take 82 us.
  HostDevice d(discrete(0.05, 0));
  const std::size_t big = 32'000'000, small = 4096;
  std::vector<std::byte> hbig(big), hsmall(small);
  void* dbig = d.allocate(big);
  void* dsmall = d.allocate(small);
  auto up = d.create_stream();
  auto down = d.create_stream();
  auto up_done = d.create_event();
  const auto t0 = Clock::now();
  d.copy(dbig, hbig.data(), big, *up);
  d.record(*up_done, *up);
  d.copy(hsmall.data(), dsmall, small, *down);  // the other direction: its own engine
  d.synchronize(*down);
  EXPECT_FALSE(d.query(*up_done)) << "device-to-host waited for a host-to-device copy";
  d.synchronize(*up);
  EXPECT_GE(seconds_since(t0), 0.64);
  // Two copies in one direction on two streams take the sum of their times: one engine.
  const auto t1 = Clock::now();
  auto up2 = d.create_stream();
  d.copy(dbig, hbig.data(), big / 2, *up);
  d.copy(static_cast<char*>(dbig) + big / 2, hbig.data(), big / 2, *up2);
  d.synchronize(*up);
  d.synchronize(*up2);
  EXPECT_GE(seconds_since(t1), 0.64);
  EXPECT_EQ(d.h2d_engine()->copies(), 3);
  EXPECT_EQ(d.d2h_engine()->copies(), 1);
  d.deallocate(dbig);
  d.deallocate(dsmall);
}

TEST(DiscreteHostDevice, LatencyIsPaidPerCopy) {
  HostDevice d(discrete(0, 5000));  // 5 ms
  auto* a = static_cast<char*>(d.allocate(64));
  char h[64] = {};
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) d.copy(a + i, h + i, 1, d.compute_stream());
  d.synchronize(d.compute_stream());
  EXPECT_GE(seconds_since(t0), 0.05);
  EXPECT_EQ(d.h2d_engine()->copies(), 10);
  d.deallocate(a);
}

TEST(DiscreteHostDevice, ModelKernelOccupiesItsStreamOnly) {
  HostDevice d(discrete());
  auto other = d.create_stream();
  auto done = d.create_event();
  const auto t0 = Clock::now();
  d.model_kernel(d.compute_stream(), 1.0);
  d.record(*done, d.compute_stream());
  auto* x = static_cast<float*>(d.allocate(64));
  d.fill(x, DType::f32, 16, 2.0f, *other);
  d.synchronize(*other);
  EXPECT_FALSE(d.query(*done));
  d.synchronize(*done);
  EXPECT_GE(seconds_since(t0), 1.0);
  EXPECT_THROW(d.model_kernel(*other, -1.0), UsageError);
  EXPECT_THROW(d.model_kernel(*other, std::nan("")), UsageError);
  d.deallocate(x);
}

TEST(DiscreteHostDevice, HostCodeMayNotTouchTheArena) {
  HostDevice d(discrete());
  auto* a = static_cast<char*>(d.allocate(1000));
  std::vector<char> host(1000);
  EXPECT_THROW(d.check_host_accessible(a, 1000, "x"), UsageError);
  EXPECT_THROW(d.check_host_accessible(a + 999, 1, "x"), UsageError) << "the last byte";
  EXPECT_THROW(d.check_host_accessible(a + 500, 10, "x"), UsageError) << "inside";
  EXPECT_THROW(d.check_host_accessible(a - 16, 17, "x"), UsageError) << "a range ending in it";
  EXPECT_NO_THROW(d.check_host_accessible(host.data(), host.size(), "x"));
  EXPECT_NO_THROW(d.check_host_accessible(nullptr, 8, "x"));
  EXPECT_NO_THROW(d.check_host_accessible(a, 0, "x")) << "zero bytes touch nothing";
  const std::string msg = message_of([&] { d.check_host_accessible(a + 8, 16, "OptimizerStates::add_grad"); });
  EXPECT_NE(msg.find("OptimizerStates::add_grad"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("host (discrete)"), std::string::npos) << msg;
  // Pinned (registered) host memory is host memory.
  std::vector<char> pinned(4096);
  ASSERT_TRUE(d.register_host_memory(pinned.data(), pinned.size()));
  EXPECT_NO_THROW(d.check_host_accessible(pinned.data(), pinned.size(), "x"));
  d.unregister_host_memory(pinned.data());
  // The process-wide check sees every discrete device, and forgets a destroyed one.
  EXPECT_THROW(check_host_accessible_in_process(a, 4, "x"), UsageError);
  EXPECT_NO_THROW(check_host_accessible_in_process(host.data(), 4, "x"));
  {
    auto d2 = std::make_unique<HostDevice>(discrete());
    void* b = d2->allocate(256);
    EXPECT_THROW(check_host_accessible_in_process(b, 4, "x"), UsageError);
    d2->deallocate(b);
  }
  d.deallocate(a);
  // A freed block stays the device's while its free list holds it; under ASan (no caching) it
  // goes back to the system and is no longer device memory.
  if (HostDevice::kCachesBlocks) {
    EXPECT_THROW(d.check_host_accessible(a, 1000, "x"), UsageError);
    EXPECT_THROW(check_host_accessible_in_process(a, 1000, "x"), UsageError);
  } else {
    EXPECT_NO_THROW(d.check_host_accessible(a, 1000, "x"));
    EXPECT_NO_THROW(check_host_accessible_in_process(a, 1000, "x"));
  }
  // The unified device lets host code touch its memory.
  HostDevice u;
  auto* c = u.allocate(1000);
  EXPECT_NO_THROW(u.check_host_accessible(c, 1000, "x"));
  EXPECT_NO_THROW(check_host_accessible_in_process(c, 1000, "x"));
  EXPECT_TRUE(u.is_device_memory(c, 1000));
  u.deallocate(c);
}

TEST(DiscreteHostDevice, TheBlockCacheKeepsArenaBlocks) {
  if (!HostDevice::kCachesBlocks) GTEST_SKIP() << "no block cache under AddressSanitizer";
  HostDevice d(discrete());
  const std::size_t n = 2 * HostDevice::kCacheMinBytes;
  auto* a = static_cast<char*>(d.allocate(n));
  d.deallocate(a);
  EXPECT_EQ(d.cached_bytes(), n);
  EXPECT_TRUE(d.is_device_memory(a, n)) << "a cached block is still device memory";
  EXPECT_THROW(d.check_host_accessible(a, 16, "x"), UsageError);
  auto* b = static_cast<char*>(d.allocate(n));
  EXPECT_EQ(b, a) << "the cache hands the block back";
  EXPECT_EQ(d.cached_bytes(), 0u);
  std::vector<char> h(n, 5), back(n, 0);
  d.copy(b, h.data(), n, d.compute_stream());
  d.copy(back.data(), b, n, d.compute_stream());
  d.synchronize(d.compute_stream());
  EXPECT_EQ(back, h);
  EXPECT_EQ(d.h2d_engine()->copies(), 1) << "a reused block still routes through the engines";
  EXPECT_EQ(d.d2h_engine()->copies(), 1);
  EXPECT_EQ(d.memory_stats().current_bytes, std::int64_t(n));
  d.deallocate(b);
}

// The pageable count, the same in both models.
class PageableCount : public ::testing::TestWithParam<HostMemoryModel> {};

TEST_P(PageableCount, CountsCopiesBetweenDeviceAndUnregisteredHostMemory) {
  HostDevice d(HostDeviceOptions{.memory = GetParam()});
  std::vector<float> v(1000, 1.0f);
  auto* a = static_cast<float*>(d.allocate(4000));
  auto* b = static_cast<float*>(d.allocate(4000));
  Stream& s = d.compute_stream();
  EXPECT_EQ(d.pageable_copy_count(), 0);
  for (int i = 0; i < 3; ++i) d.copy(a, v.data(), 4000, s);
  EXPECT_EQ(d.pageable_copy_count(), 3) << "counted when queued";
  d.copy(v.data() + 10, a + 10, 400, s);  // device -> pageable, part of both
  EXPECT_EQ(d.pageable_copy_count(), 4);
  d.copy(b, a, 4000, s);                   // device -> device
  std::vector<float> w(1000);
  d.copy(w.data(), v.data(), 4000, s);     // host -> host
  EXPECT_EQ(d.pageable_copy_count(), 4);
  std::vector<float> pinned(1001, 2.0f);  // one float past the registered 4000 bytes (read below)
  ASSERT_TRUE(d.register_host_memory(pinned.data(), 4000));
  EXPECT_FALSE(d.register_host_memory(pinned.data() + 10, 100)) << "already registered";
  EXPECT_FALSE(d.register_host_memory(a, 100)) << "device memory";
  EXPECT_FALSE(d.register_host_memory(nullptr, 100));
  for (int i = 0; i < 3; ++i) d.copy(a, pinned.data(), 4000, s);
  d.copy(pinned.data() + 500, b, 2000, s);
  EXPECT_EQ(d.pageable_copy_count(), 4) << "registered memory is not pageable";
  d.copy(a, pinned.data() + 500, 2004, s);  // runs past the registered range
  EXPECT_EQ(d.pageable_copy_count(), 5);
  d.unregister_host_memory(pinned.data());
  d.unregister_host_memory(v.data());  // never registered: ignored
  d.copy(a, pinned.data(), 4000, s);
  EXPECT_EQ(d.pageable_copy_count(), 6) << "unregistered again";
  d.synchronize(s);
  EXPECT_EQ(a[0], 2.0f);
  d.deallocate(a);
  d.deallocate(b);
}

INSTANTIATE_TEST_SUITE_P(BothModels, PageableCount,
                         ::testing::Values(HostMemoryModel::unified, HostMemoryModel::discrete),
                         [](const auto& info) { return std::string(host_memory_model_name(info.param)); });

TEST(DiscreteHostDevice, TheEnvironmentPicksTheModel) {
  ::unsetenv("ZOE_HOST_MEMORY");
  EXPECT_EQ(host_device_options_from_environment().memory, HostMemoryModel::unified);
  EXPECT_EQ(make_host_device()->name(), "host");
  {
    ScopedEnv m("ZOE_HOST_MEMORY", "discrete");
    ScopedEnv g("ZOE_HOST_COPY_GBPS", "25");
    ScopedEnv l("ZOE_HOST_COPY_LATENCY_US", "7.5");
    HostDeviceOptions o = host_device_options_from_environment();
    EXPECT_EQ(o.memory, HostMemoryModel::discrete);
    EXPECT_EQ(o.copy_gbps, 25.0);
    EXPECT_EQ(o.copy_latency_us, 7.5);
    EXPECT_EQ(make_host_device()->name(), "host (discrete)");
    auto ranks = make_local_ranks(2, 10.0);
    ASSERT_EQ(ranks.size(), 2u);
    for (auto& r : ranks) EXPECT_EQ(r.device->name(), "host (discrete)");
  }
  {
    ScopedEnv m("ZOE_HOST_MEMORY", "unified");
    EXPECT_EQ(host_device_options_from_environment().memory, HostMemoryModel::unified);
  }
  {
    ScopedEnv m("ZOE_HOST_MEMORY", "discrte");
    try {
      host_device_options_from_environment();
      FAIL() << "no error for a misspelt model";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "ZOE_HOST_MEMORY");
      EXPECT_NE(std::string(e.what()).find("unified or discrete"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv g("ZOE_HOST_COPY_GBPS", "-3");
    EXPECT_THROW(host_device_options_from_environment(), ConfigError);
  }
  {
    ScopedEnv g("ZOE_HOST_COPY_LATENCY_US", "5us");
    EXPECT_THROW(host_device_options_from_environment(), ConfigError);
  }
  // Past the modelled range (a probe: 1e14 us hung zoe-gpt, 1e30 overflowed into no latency).
  for (const auto& [name, value] : {std::pair{"ZOE_HOST_COPY_LATENCY_US", "1e14"}, std::pair{"ZOE_HOST_COPY_LATENCY_US", "1e30"},
                                    std::pair{"ZOE_HOST_COPY_GBPS", "1e-9"}, std::pair{"ZOE_HOST_COPY_GBPS", "1e300"}}) {
    ScopedEnv g(name, value);
    try {
      host_device_options_from_environment();
      ADD_FAILURE() << "no error for " << name << "=" << value;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), name);
      EXPECT_NE(std::string(e.what()).find(std::string("got '") + value + "'"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv g("ZOE_HOST_COPY_LATENCY_US", "1e6");  // the bound itself: 1 s per copy
    EXPECT_EQ(host_device_options_from_environment().copy_latency_us, 1e6);
  }
}

TEST(DiscreteHostDevice, RanksOnDiscreteDevicesRunCollectives) {
  auto ranks = make_local_ranks_on(2, discrete(), 30.0);
  ASSERT_EQ(ranks.size(), 2u);
  std::vector<float> sums(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    auto* dev = dynamic_cast<HostDevice*>(ctx.device.get());
    ASSERT_NE(dev, nullptr);
    EXPECT_EQ(dev->memory_model(), HostMemoryModel::discrete);
    EXPECT_EQ(ctx.device->name(), "host (discrete)");
    // An all-reduce of device buffers, brought up and down through the copy engines.
    Stream& s = dev->compute_stream();
    float mine = float(ctx.rank + 1), out = 0;
    auto* x = static_cast<float*>(dev->allocate(4));
    auto* y = static_cast<float*>(dev->allocate(4));
    dev->copy(x, &mine, 4, s);
    ctx.comm->all_reduce(x, y, 1, DType::f32, ReduceOp::sum, s);
    dev->copy(&out, y, 4, s);
    dev->synchronize(s);
    sums[ctx.rank] = out;
    dev->deallocate(x);
    dev->deallocate(y);
  });
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
  EXPECT_THROW(make_local_ranks_on(1, discrete(-1.0), 30.0), UsageError);
  EXPECT_THROW(make_local_ranks_on(0, discrete(), 30.0), UsageError);
}
