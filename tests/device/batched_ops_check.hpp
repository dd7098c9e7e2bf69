// The batched device operations (Device::copy_batch, sum_squares_batch, adam_step_batch) against the same operations one tensor at a time, on any device: bitwise
// equal results, and the same count of pageable copies. Shared by the host device's tests and
// the CUDA device's (on a GPU).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/adam_math.hpp"
#include "kernels/half.hpp"
#include "src/device/device.hpp"

namespace zoe::testing_batched {

// Tensors of these lengths (none a multiple of a vector width; one empty).
inline const std::vector<std::size_t>& lengths() {
  static const std::vector<std::size_t> n = {1, 7, 0, 256, 1000, 33'333};
  return n;
}

inline void check_batched_ops(Device& dev) {
  auto s = dev.create_stream();
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::size_t total = 0;
  std::vector<std::size_t> at;
  for (std::size_t n : lengths()) at.push_back(total), total += n;
  std::vector<float> host(total);
  for (float& x : host) x = dist(gen);

  // copy_batch: host -> device (pageable), device -> device (reversed order), device -> host.
  auto* a = static_cast<float*>(dev.allocate(total * 4));
  auto* b = static_cast<float*>(dev.allocate(total * 4));
  std::vector<CopyRegion> in, across, out;
  std::vector<float> back(total, -1.0f);
  for (std::size_t k = 0; k < at.size(); ++k) {
    const std::size_t bytes = lengths()[k] * 4;
    in.push_back({a + at[k], host.data() + at[k], bytes});
    across.push_back({b + (total - at[k] - lengths()[k]), a + at[k], bytes});  // tensor k to the mirrored place
    out.push_back({back.data() + at[k], b + (total - at[k] - lengths()[k]), bytes});
  }
  const std::int64_t pageable0 = dev.pageable_copy_count();
  dev.copy_batch(in, CopyPlaces::any, *s);
  dev.copy_batch(across, CopyPlaces::within_device, *s);
  dev.copy_batch(out, CopyPlaces::any, *s);
  dev.synchronize(*s);
  for (std::size_t k = 0; k < at.size(); ++k)
    ASSERT_EQ(std::memcmp(back.data() + at[k], host.data() + at[k], lengths()[k] * 4), 0) << "tensor " << k;
  // One pageable copy per non-empty host region, as copy() of each counts.
  std::int64_t regions = 0;
  for (std::size_t n : lengths()) regions += n ? 2 : 0;
  EXPECT_EQ(dev.pageable_copy_count() - pageable0, regions);

  // sum_squares_batch against one at a time (a NaN in tensor 4: its sum is NaN both ways, the
  // engine's finite check).
  const float nan = std::nanf("");
  dev.copy(a + at[4] + 3, &nan, 4, *s);
  std::vector<TensorRegion> xs;
  for (std::size_t k = 0; k < at.size(); ++k) xs.push_back({a + at[k], lengths()[k]});
  auto* sums = static_cast<double*>(dev.allocate(2 * xs.size() * 8));
  dev.sum_squares_batch(xs, DType::f32, sums, *s);
  for (std::size_t k = 0; k < xs.size(); ++k) dev.sum_squares(xs[k].data, DType::f32, xs[k].n, sums + xs.size() + k, *s);
  std::vector<double> sums_back(2 * xs.size());
  dev.copy(sums_back.data(), sums, sums_back.size() * 8, *s);
  dev.synchronize(*s);
  for (std::size_t k = 0; k < xs.size(); ++k) {
    if (k != 4) EXPECT_EQ(std::memcmp(&sums_back[k], &sums_back[xs.size() + k], 8), 0) << "sum of squares, tensor " << k;
    EXPECT_EQ(std::isfinite(sums_back[k]), k != 4) << "tensor " << k;
    EXPECT_EQ(std::isfinite(sums_back[xs.size() + k]), k != 4) << "tensor " << k;
  }
  EXPECT_GT(sums_back[5], 0.0);

  // adam_step_batch against adam_step per tensor, each with its own coefficients, bf16
  // gradients and outputs: two copies of the same states, updated both ways, three steps.
  for (DType t : {DType::f32, DType::bf16}) {
    const std::size_t esz = t == DType::f32 ? 4 : 2;
    auto* states = static_cast<float*>(dev.allocate(2 * 3 * total * 4));  // [copy][p | m | v]
    auto* grads = static_cast<char*>(dev.allocate(total * esz));
    auto* outs = static_cast<char*>(dev.allocate(2 * total * esz));
    std::vector<float> init(3 * total, 0.0f);
    std::copy(host.begin(), host.end(), init.begin());
    dev.copy(states, init.data(), init.size() * 4, *s);
    dev.copy(states + 3 * total, init.data(), init.size() * 4, *s);
    for (std::int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g32(total);
      for (float& x : g32) x = dist(gen);
      std::vector<std::uint16_t> g16(total);
      for (std::size_t i = 0; i < total; ++i) g16[i] = kernels::f32_to_bf16(g32[i]);
      dev.copy(grads, t == DType::f32 ? static_cast<const void*>(g32.data()) : g16.data(), total * esz, *s);
      std::vector<AdamTensor> batch;
      for (std::size_t k = 0; k < at.size(); ++k) {
        const auto c = kernels::adam_coeffs(1e-3 * static_cast<double>(k + 1), 0.9, 0.999, 1e-8, 0.01 * static_cast<double>(k),
                                            k % 2 == 0, step, 0.5f);
        float* p = states + at[k];
        batch.push_back({c, p, p + total, p + 2 * total, grads + at[k] * esz, outs + at[k] * esz, lengths()[k]});
        float* q = states + 3 * total + at[k];
        dev.adam_step(c, q, q + total, q + 2 * total, grads + at[k] * esz, t, outs + (total + at[k]) * esz, t, lengths()[k], *s);
      }
      dev.adam_step_batch(batch, t, t, *s);
      dev.synchronize(*s);  // the copy of this step's gradients reads g32 / g16
    }
    std::vector<float> both(6 * total);
    std::vector<char> outs_back(2 * total * esz);
    dev.copy(both.data(), states, both.size() * 4, *s);
    dev.copy(outs_back.data(), outs, outs_back.size(), *s);
    dev.synchronize(*s);
    EXPECT_EQ(std::memcmp(both.data(), both.data() + 3 * total, 3 * total * 4), 0) << "master / exp_avg / exp_avg_sq, " << dtype_name(t);
    EXPECT_EQ(std::memcmp(outs_back.data(), outs_back.data() + total * esz, total * esz), 0) << "outputs, " << dtype_name(t);
    EXPECT_NE(std::memcmp(both.data(), host.data(), total * 4), 0) << "the masters moved";
    for (void* q : {static_cast<void*>(states), static_cast<void*>(grads), static_cast<void*>(outs)}) dev.deallocate(q);
  }
  for (void* q : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(sums)}) dev.deallocate(q);
}

}  // namespace zoe::testing_batched
