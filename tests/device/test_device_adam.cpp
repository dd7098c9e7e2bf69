// The device optimizer (Device::adam_step) on the host device: bitwise equal to the CPU
// optimizer (src/optim, torch-exact and tested against torch) over several steps, for every
// gradient / output dtype, Adam and AdamW with weight decay, and a length that is no
// multiple of any chunk. The CUDA kernel runs the same per-element code
// (tests/device/test_cuda_device.cpp compares it with this host loop on a GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/adam_math.hpp"
#include "kernels/half.hpp"
#include "src/device/host_device.hpp"
#include "src/optim/cpu_adam.hpp"

using namespace zoe;

namespace {

struct States {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> out16;
  std::vector<float> out32;
};

}  // namespace

class DeviceAdam : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(DeviceAdam, BitwiseEqualToTheCpuOptimizer) {
  const auto [dtype, decoupled] = GetParam();
  const std::size_t n = 100'003;
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> init(n);
  for (float& x : init) x = dist(gen);
  States dev{init, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), std::vector<std::uint16_t>(n),
             std::vector<float>(n)};
  States cpu = dev;
  const optim::AdamHyper hyper{1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled};
  HostDevice device;
  auto stream = device.create_stream();
  optim::CpuAdam adam(2);
  for (std::int64_t step = 1; step <= 5; ++step) {
    // Gradients in the compute dtype: fp32 values, or their bf16/fp16 bits.
    std::vector<float> g32(n);
    for (float& x : g32) x = dist(gen) * 4.0f;
    std::vector<std::uint16_t> g16(n);
    if (dtype == DType::bf16)
      for (std::size_t i = 0; i < n; ++i) g16[i] = kernels::f32_to_bf16(g32[i]);
    if (dtype == DType::f16)
      for (std::size_t i = 0; i < n; ++i) g16[i] = kernels::f32_to_f16(g32[i]);
    const void* grad = dtype == DType::f32 ? static_cast<const void*>(g32.data()) : g16.data();
    const float grad_scale = 0.25f;
    void* out = dtype == DType::f32 ? static_cast<void*>(dev.out32.data()) : dev.out16.data();
    device.adam_step(kernels::adam_coeffs(hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay,
                                          hyper.decoupled, step, grad_scale),
                     dev.p.data(), dev.m.data(), dev.v.data(), grad, dtype, out, dtype, n, *stream);
    device.synchronize(*stream);
    adam.step(hyper, step, grad_scale, cpu.p.data(), cpu.m.data(), cpu.v.data(), grad, dtype, n,
              dtype == DType::f32 ? nullptr : cpu.out16.data(), dtype);
    ASSERT_EQ(std::memcmp(dev.p.data(), cpu.p.data(), n * 4), 0) << "master, step " << step;
    ASSERT_EQ(std::memcmp(dev.m.data(), cpu.m.data(), n * 4), 0) << "exp_avg, step " << step;
    ASSERT_EQ(std::memcmp(dev.v.data(), cpu.v.data(), n * 4), 0) << "exp_avg_sq, step " << step;
    if (dtype == DType::f32) {
      ASSERT_EQ(std::memcmp(dev.out32.data(), dev.p.data(), n * 4), 0) << "fp32 output is the master weight";
    } else {
      ASSERT_EQ(std::memcmp(dev.out16.data(), cpu.out16.data(), n * 2), 0) << "16-bit output, step " << step;
    }
  }
  // The states moved: a test that compares two untouched arrays would pass vacuously.
  EXPECT_NE(std::memcmp(dev.p.data(), init.data(), n * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeviceAdam,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Bool()));

TEST(DeviceAdam, NullOutputOnlyUpdatesStates) {
  HostDevice device;
  auto stream = device.create_stream();
  float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
  device.adam_step(kernels::adam_coeffs(0.1, 0.9, 0.999, 1e-8, 0.0, true, 1, 1.0f), &p, &m, &v, &g, DType::f32,
                   nullptr, DType::f32, 1, *stream);
  device.synchronize(*stream);
  // Step 1 of Adam moves p by -lr * sign(g) (up to eps): m/(1-b1) = g, sqrt(v/(1-b2)) = |g|.
  EXPECT_NEAR(p, 0.9f, 1e-6f);
  EXPECT_FLOAT_EQ(m, 0.05f);
}
