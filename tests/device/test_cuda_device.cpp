// CudaDevice (built when zoe has CUDA). Without a GPU or driver, constructing it must
// raise CudaError carrying the CUDA error text; with a GPU, its kernels must match the
// host device's elementwise ops (same ZOE_HD math) and its events must order streams.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/half.hpp"
#include "src/device/cuda_device.hpp"
#include "src/device/host_access.hpp"
#include "src/device/host_elementwise.hpp"
#include "tests/device/batched_ops_check.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using ::testing::HasSubstr;

namespace {
struct Opened {
  std::unique_ptr<CudaDevice> device;
  std::string error;
  int code = 0;
};
Opened open_gpu() {
  Opened o;
  try {
    o.device = std::make_unique<CudaDevice>(0);
  } catch (const CudaError& e) {
    o.error = e.what();
    o.code = e.code();
  }
  return o;
}
}  // namespace

TEST(CudaDevice, OpensOrRaisesCudaErrorWithTheCudaText) {
  Opened o = open_gpu();
  if (o.device) {
    EXPECT_THAT(o.device->name(), HasSubstr("cuda:0 ("));
    EXPECT_EQ(o.device->kind(), DeviceKind::cuda);
    EXPECT_EQ(o.device->ordinal(), 0);
    // The trainer's kernels go on this stream (Engine::compute_place).
    EXPECT_EQ(o.device->native_handle(o.device->compute_stream()),
              CudaDevice::native(o.device->compute_stream()));
  } else {
    std::printf("no usable GPU here: %s\n", o.error.c_str());
    EXPECT_NE(o.code, 0);
    EXPECT_THAT(o.error, HasSubstr("cudaGetDeviceCount failed"));
    EXPECT_THAT(o.error, HasSubstr("(CUDA error " + std::to_string(o.code) + ")"));
    EXPECT_THAT(o.error, HasSubstr("cudaError"));  // the CUDA error name, e.g. cudaErrorInsufficientDriver
  }
  EXPECT_THROW(CudaDevice(1 << 20), CudaError);  // never a valid ordinal
}

TEST(CudaDeviceOnGpu, KernelsMatchTheHostDevice) {
  Opened o = open_gpu();
  if (!o.device) GTEST_SKIP() << "needs a GPU; here: " << o.error;
  CudaDevice& dev = *o.device;
  const std::size_t n = 1'000'003;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(gen);
  auto s = dev.create_stream();
  auto* dx = static_cast<float*>(dev.allocate(n * 4));
  auto* dh = static_cast<std::uint16_t*>(dev.allocate(n * 2));
  auto* dacc = static_cast<float*>(dev.allocate(n * 4));
  auto* dsum = static_cast<double*>(dev.allocate(8));
  auto* dbsum = static_cast<double*>(dev.allocate(8));  // the bf16 data's sum (its finite check)
  EXPECT_EQ(dev.memory_stats().current_bytes, std::int64_t(n * 10 + 8 + 8));
  // The pool reserves at least what is allocated (its granularity rounds up).
  EXPECT_GE(dev.memory_stats().reserved_bytes, dev.memory_stats().current_bytes);
  EXPECT_GE(dev.memory_stats().reserved_peak_bytes, dev.memory_stats().reserved_bytes);
  dev.copy(dx, x.data(), n * 4, *s);
  dev.cast(dx, DType::f32, dh, DType::bf16, n, *s);
  dev.scale(dh, DType::bf16, n, 0.3f, *s);
  dev.fill(dacc, DType::f32, n, 0.5f, *s);
  dev.accumulate(dh, DType::bf16, dacc, n, *s);
  dev.sum_squares(dx, DType::f32, n, dsum, *s);
  dev.sum_squares(dh, DType::bf16, n, dbsum, *s);
  std::vector<std::uint16_t> h(n);
  std::vector<float> acc(n);
  double sum = 0;
  double bsum = 0;
  dev.copy(h.data(), dh, n * 2, *s);
  dev.copy(acc.data(), dacc, n * 4, *s);
  dev.copy(&sum, dsum, 8, *s);
  dev.copy(&bsum, dbsum, 8, *s);
  dev.synchronize(*s);

  std::vector<std::uint16_t> rh(n);
  std::vector<float> racc(n);
  host_ops::cast(x.data(), DType::f32, rh.data(), DType::bf16, n);
  host_ops::scale(rh.data(), DType::bf16, n, 0.3f);
  host_ops::fill(racc.data(), DType::f32, n, 0.5f);
  host_ops::accumulate(rh.data(), DType::bf16, racc.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], rh[i]) << i;
    ASSERT_EQ(acc[i], racc[i]) << i;
  }
  double ref = host_ops::sum_squares(x.data(), DType::f32, n);
  EXPECT_NEAR(sum, ref, ref * 1e-12);  // a different fixed order than the host's
  const double bref = host_ops::sum_squares(rh.data(), DType::bf16, n);
  EXPECT_NEAR(bsum, bref, bref * 1e-12);
  EXPECT_TRUE(std::isfinite(bsum));

  // Determinism: a second run gives the same bits.
  double again = 0;
  dev.sum_squares(dx, DType::f32, n, dsum, *s);
  dev.copy(&again, dsum, 8, *s);
  dev.synchronize(*s);
  EXPECT_EQ(again, sum);

  // Events order streams; a host_func error surfaces at synchronize.
  auto s2 = dev.create_stream();
  auto ev = dev.create_event();
  EXPECT_TRUE(dev.query(*ev));
  dev.fill(dx, DType::f32, n, 2.0f, *s);
  dev.record(*ev, *s);
  dev.wait(*s2, *ev);
  dev.sum_squares(dx, DType::f32, n, dsum, *s2);
  dev.copy(&again, dsum, 8, *s2);
  dev.host_func(*s2, [] { throw IoError("/gpu", 0, 1, 5, "read", __FILE__, __LINE__); });
  EXPECT_THROW(dev.synchronize(*s2), IoError);
  EXPECT_EQ(again, 4.0 * double(n));
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dh), static_cast<void*>(dacc),
                  static_cast<void*>(dsum), static_cast<void*>(dbsum)})
    dev.deallocate(p);
  EXPECT_EQ(dev.memory_stats().current_bytes, 0);
  // Freed memory stays in the pool (release threshold UINT64_MAX): still reserved, as torch's
  // memory_reserved after a free; reset_peak brings the reserved peak down to it.
  const DeviceMemoryStats after = dev.memory_stats();
  EXPECT_GE(after.reserved_bytes, std::int64_t(n * 10));
  dev.reset_peak();
  EXPECT_EQ(dev.memory_stats().peak_bytes, 0);
  EXPECT_EQ(dev.memory_stats().reserved_peak_bytes, dev.memory_stats().reserved_bytes);
}

TEST(CudaDeviceOnGpu, AdamKernelMatchesTheHostDeviceBitwise) {
  Opened o = open_gpu();
  if (!o.device) GTEST_SKIP() << "needs a GPU; here: " << o.error;
  CudaDevice& dev = *o.device;
  const std::size_t n = 1'000'003;
  std::mt19937 gen(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g32(n);
    for (auto& x : p) x = dist(gen);
    const std::size_t esz = t == DType::f32 ? 4 : 2;
    std::vector<std::uint16_t> out_host(n * 2), out_dev(n * 2);
    auto s = dev.create_stream();
    auto* d = static_cast<float*>(dev.allocate(3 * n * 4));
    auto* dg = dev.allocate(n * esz);
    auto* dout = dev.allocate(n * esz);
    dev.copy(d, p.data(), n * 4, *s);
    dev.fill(d + n, DType::f32, 2 * n, 0.0f, *s);
    for (std::int64_t step = 1; step <= 3; ++step) {
      for (auto& x : g32) x = dist(gen);
      std::vector<std::uint16_t> g16(n);
      host_ops::cast(g32.data(), DType::f32, g16.data(), t == DType::f32 ? DType::bf16 : t, n);
      const void* grad = t == DType::f32 ? static_cast<const void*>(g32.data()) : g16.data();
      auto c = kernels::adam_coeffs(1e-3, 0.9, 0.999, 1e-8, 0.01, step % 2 == 1, step, 0.5f);
      dev.copy(dg, grad, n * esz, *s);
      dev.adam_step(c, d, d + n, d + 2 * n, dg, t, dout, t, n, *s);
      host_ops::adam_step(c, p.data(), m.data(), v.data(), grad, t, out_host.data(), t, n);
    }
    std::vector<float> states(3 * n);
    dev.copy(states.data(), d, 3 * n * 4, *s);
    dev.copy(out_dev.data(), dout, n * esz, *s);
    dev.synchronize(*s);
    ASSERT_EQ(std::memcmp(states.data(), p.data(), n * 4), 0) << "master, dtype " << dtype_name(t);
    ASSERT_EQ(std::memcmp(states.data() + n, m.data(), n * 4), 0) << "exp_avg";
    ASSERT_EQ(std::memcmp(states.data() + 2 * n, v.data(), n * 4), 0) << "exp_avg_sq";
    ASSERT_EQ(std::memcmp(out_dev.data(), out_host.data(), n * esz), 0) << "output";
    for (void* q : {static_cast<void*>(d), dg, dout}) dev.deallocate(q);
  }
}

TEST(CudaDeviceOnGpu, BatchedOpsEqualOneAtATime) {
  Opened o = open_gpu();
  if (!o.device) GTEST_SKIP() << "needs a GPU; here: " << o.error;
  testing_batched::check_batched_ops(*o.device);
}

TEST(CudaDeviceOnGpu, CountsPageableCopiesAndKeepsHostCodeOutOfDeviceMemory) {
  Opened o = open_gpu();
  if (!o.device) GTEST_SKIP() << "needs a GPU; here: " << o.error;
  CudaDevice& dev = *o.device;
  auto s = dev.create_stream();
  std::vector<float> pageable(1000, 1.0f), pinned(1000, 2.0f), back(1000, 0.0f);
  auto* a = static_cast<float*>(dev.allocate(4000));
  auto* b = static_cast<float*>(dev.allocate(4000));
  EXPECT_EQ(dev.pageable_copy_count(), 0);
  for (int i = 0; i < 3; ++i) dev.copy(a, pageable.data(), 4000, *s);
  EXPECT_EQ(dev.pageable_copy_count(), 3);
  dev.copy(b, a, 4000, *s);  // device -> device
  std::vector<float> w(1000);
  dev.copy(w.data(), pageable.data(), 4000, *s);  // host -> host
  EXPECT_EQ(dev.pageable_copy_count(), 3);
  ASSERT_TRUE(dev.register_host_memory(pinned.data(), 4000));
  dev.copy(a, pinned.data(), 4000, *s);
  dev.copy(pinned.data(), b, 4000, *s);
  EXPECT_EQ(dev.pageable_copy_count(), 3) << "registered memory is pinned";
  dev.copy(back.data(), a, 4000, *s);
  EXPECT_EQ(dev.pageable_copy_count(), 4);
  dev.synchronize(*s);
  dev.unregister_host_memory(pinned.data());
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_EQ(pinned[0], 1.0f);
  EXPECT_THROW(dev.check_host_accessible(a, 4000, "x"), UsageError);
  EXPECT_THROW(dev.check_host_accessible(a + 999, 4, "x"), UsageError);
  EXPECT_NO_THROW(dev.check_host_accessible(pageable.data(), 4000, "x"));
  EXPECT_NO_THROW(dev.check_host_accessible(pinned.data(), 4000, "x"));
  try {
    dev.check_host_accessible(b, 16, "ParamShards::write");
    FAIL() << "no error for device memory";
  } catch (const UsageError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("ParamShards::write"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("16 bytes"));
  }
  EXPECT_THROW(check_host_accessible_in_process(a, 4, "x"), UsageError);
  dev.deallocate(a);
  dev.deallocate(b);
}
