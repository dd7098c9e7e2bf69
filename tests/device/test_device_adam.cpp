// The device optimizer (Device::adam_step) on the host device: bitwise equal to the CPU
// optimizer (src/optim, torch-exact and tested against torch) over several steps, for every
// gradient / output dtype, Adam and AdamW with weight decay, and a length that is no
// multiple of any chunk. The CUDA kernel runs the same per-element code
// (tests/device/test_cuda_device.cpp compares it with this host loop on a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <random>
#include <vector>

#include "kernels/adam_math.hpp"
#include "kernels/half.hpp"
#include "kernels/elementwise.hpp"
#include "src/device/host_device.hpp"
#include "src/device/host_elementwise.hpp"
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

// Each build of the host device's loop (host_ops::AdamIsa: baseline, AVX2, AVX-512; the
// compiler vectorizes them) against kernels::adam_update run element by element here: the same
// bits for every gradient and output dtype, no output, Adam (L2) and AdamW, lengths around every
// vector width, and values that take the rare paths (zeros, denormals, the largest floats,
// infinities, NaN).
class DeviceAdamIsa : public ::testing::TestWithParam<host_ops::AdamIsa> {};

TEST_P(DeviceAdamIsa, EveryBuildGivesTheElementwiseBits) {
  const host_ops::AdamIsa isa = GetParam();
  if (!host_ops::adam_isa_available(isa)) GTEST_SKIP() << "this CPU cannot run the build";
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-42f, 3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN};
  auto value = [&](std::size_t i) { return i % 37 == 5 ? specials[(i / 37) % std::size(specials)] : dist(gen); };
  int checked = 0;
  for (std::size_t n : {1u, 7u, 15u, 16u, 17u, 31u, 33u, 64u, 129u, 1000u}) {
    for (DType gd : {DType::f32, DType::bf16, DType::f16}) {
      for (int out_kind = 0; out_kind < 4; ++out_kind) {  // none, f32, bf16, f16
        const DType od = out_kind == 2 ? DType::bf16 : out_kind == 3 ? DType::f16 : DType::f32;
        for (bool decoupled : {false, true}) {
          const kernels::AdamCoeffs c = kernels::adam_coeffs(1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled, 3, 0.5f);
          std::vector<float> p(n), m(n), v(n), g32(n);
          std::vector<std::uint16_t> g16(n);
          for (std::size_t i = 0; i < n; ++i) {
            p[i] = value(i);
            m[i] = dist(gen) * 0.1f;
            v[i] = std::abs(dist(gen)) * 0.01f;
            g32[i] = value(i + 3);
            g16[i] = gd == DType::bf16 ? kernels::f32_to_bf16(g32[i]) : kernels::f32_to_f16(g32[i]);
          }
          const void* grad = gd == DType::f32 ? static_cast<const void*>(g32.data()) : g16.data();
          std::vector<float> rp = p, rm = m, rv = v, out32(n, 7.0f), rout32(n, 7.0f);
          std::vector<std::uint16_t> out16(n, 7), rout16(n, 7);
          void* out = out_kind == 0 ? nullptr : od == DType::f32 ? static_cast<void*>(out32.data()) : out16.data();
          for (std::size_t i = 0; i < n; ++i) {
            kernels::adam_update(c, kernels::load_f32(grad, gd, i), rp[i], rm[i], rv[i]);
            if (out_kind == 1) rout32[i] = rp[i];
            if (out_kind >= 2) kernels::store_f32(rout16.data(), od, i, rp[i]);
          }
          host_ops::adam_range(isa, c, p.data(), m.data(), v.data(), grad, gd, out, od, n);
          const std::string at = "n " + std::to_string(n) + ", grad " + std::string(dtype_name(gd)) + ", out " +
                                 std::to_string(out_kind) + (decoupled ? ", AdamW" : ", Adam");
          ASSERT_EQ(std::memcmp(p.data(), rp.data(), n * 4), 0) << "master, " << at;
          ASSERT_EQ(std::memcmp(m.data(), rm.data(), n * 4), 0) << "exp_avg, " << at;
          ASSERT_EQ(std::memcmp(v.data(), rv.data(), n * 4), 0) << "exp_avg_sq, " << at;
          ASSERT_EQ(std::memcmp(out32.data(), rout32.data(), n * 4), 0) << "fp32 output, " << at;
          ASSERT_EQ(std::memcmp(out16.data(), rout16.data(), n * 2), 0) << "16-bit output, " << at;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 10 * 3 * 4 * 2);
}

INSTANTIATE_TEST_SUITE_P(Builds, DeviceAdamIsa,
                         ::testing::Values(host_ops::AdamIsa::baseline, host_ops::AdamIsa::avx2, host_ops::AdamIsa::avx512),
                         [](const auto& info) {
                           switch (info.param) {
                             case host_ops::AdamIsa::avx512: return std::string("avx512");
                             case host_ops::AdamIsa::avx2: return std::string("avx2");
                             case host_ops::AdamIsa::baseline: break;
                           }
                           return std::string("baseline");
                         });
