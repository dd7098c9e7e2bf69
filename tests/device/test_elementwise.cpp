// The host device's elementwise ops against direct computations: fill, cast, scale,
// accumulate, sum_squares (fp64, fixed order; non-finite exactly when an element is), for
// fp32/bf16/fp16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/elementwise.hpp"
#include "kernels/half.hpp"
#include "src/device/host_device.hpp"
#include "src/device/host_elementwise.hpp"
#include "zoe/error.hpp"

using namespace zoe;
namespace k = zoe::kernels;

namespace {
std::vector<float> random_floats(std::size_t n, unsigned seed, float scale = 4.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}
// Reference conversions through the independently tested scalar routines.
std::uint16_t to_half(float f, DType t) { return t == DType::bf16 ? k::f32_to_bf16(f) : k::f32_to_f16(f); }
float from_half(std::uint16_t h, DType t) { return t == DType::bf16 ? k::bf16_to_f32(h) : k::f16_to_f32(h); }

class Elementwise : public ::testing::Test {
 protected:
  HostDevice dev;
  std::unique_ptr<Stream> s = dev.create_stream();
};
}  // namespace

TEST_F(Elementwise, FillEveryDtype) {
  std::vector<float> f(33, 0.0f);
  dev.fill(f.data(), DType::f32, 33, 1.1f, *s);
  std::vector<std::uint16_t> b(33), h(33);
  dev.fill(b.data(), DType::bf16, 32, 1.1f, *s);  // last element untouched
  dev.fill(h.data(), DType::f16, 33, 1.1f, *s);
  dev.synchronize(*s);
  for (float x : f) EXPECT_EQ(x, 1.1f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b[i], 0x3f8du);  // 1.1 -> bf16 0x3F8D (1.1015625)
  EXPECT_EQ(b[32], 0u);
  for (auto x : h) EXPECT_EQ(x, 0x3c66u);  // 1.1 -> fp16 0x3C66 (1.0996094)
}

TEST_F(Elementwise, CastRoundTrips) {
  auto x = random_floats(10007, 1);
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[2] = 70000.0f;  // overflows fp16 to inf
  x[3] = 1e-8f;     // fp16 subnormal range
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> half(x.size());
    std::vector<float> back(x.size());
    dev.cast(x.data(), DType::f32, half.data(), t, x.size(), *s);
    dev.cast(half.data(), t, back.data(), DType::f32, x.size(), *s);
    dev.synchronize(*s);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(half[i], to_half(x[i], t)) << dtype_name(t) << " i=" << i;
      float expect = from_half(to_half(x[i], t), t);
      if (std::isnan(expect)) {
        ASSERT_TRUE(std::isnan(back[i]));
      } else {
        ASSERT_EQ(back[i], expect) << i;
      }
    }
  }
  // bf16 -> fp16 goes through fp32 exactly once.
  std::vector<std::uint16_t> b(x.size()), h(x.size());
  dev.cast(x.data(), DType::f32, b.data(), DType::bf16, x.size(), *s);
  dev.cast(b.data(), DType::bf16, h.data(), DType::f16, x.size(), *s);
  dev.synchronize(*s);
  for (std::size_t i = 4; i < x.size(); ++i) ASSERT_EQ(h[i], k::f32_to_f16(k::bf16_to_f32(b[i])));
  EXPECT_THROW(dev.cast(x.data(), DType::f32, x.data(), DType::f32, 4, *s), UsageError);
}

TEST_F(Elementwise, ScaleAndAccumulate) {
  auto x = random_floats(4099, 2);
  std::vector<float> xf = x;
  std::vector<std::uint16_t> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = k::f32_to_bf16(x[i]);
  std::vector<std::uint16_t> xb0 = xb;
  dev.scale(xf.data(), DType::f32, xf.size(), 0.37f, *s);
  dev.scale(xb.data(), DType::bf16, xb.size(), 0.37f, *s);
  std::vector<float> acc(x.size(), 1.5f);
  dev.accumulate(xb0.data(), DType::bf16, acc.data(), acc.size(), *s);
  dev.accumulate(x.data(), DType::f32, acc.data(), acc.size(), *s);
  dev.synchronize(*s);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(xf[i], x[i] * 0.37f);
    ASSERT_EQ(xb[i], k::f32_to_bf16(k::bf16_to_f32(xb0[i]) * 0.37f));
    ASSERT_EQ(acc[i], (1.5f + k::bf16_to_f32(xb0[i])) + x[i]);
  }
}

TEST_F(Elementwise, SumSquaresIsFp64AndDeterministic) {
  // Small integers: every partial sum is exact in fp64, so the result is exact.
  std::vector<float> ints(100003);
  long long exact = 0;
  for (std::size_t i = 0; i < ints.size(); ++i) {
    ints[i] = float(int(i % 201) - 100);
    exact += (long long)(ints[i]) * (long long)(ints[i]);
  }
  double* out = static_cast<double*>(dev.allocate(3 * sizeof(double)));
  dev.sum_squares(ints.data(), DType::f32, ints.size(), out, *s);
  // Random values: within fp64 rounding of a long double reference; identical across streams.
  auto x = random_floats(1'000'003, 3);
  dev.sum_squares(x.data(), DType::f32, x.size(), out + 1, *s);
  auto s2 = dev.create_stream();
  dev.sum_squares(x.data(), DType::f32, x.size(), out + 2, *s2);
  dev.synchronize(*s);
  dev.synchronize(*s2);
  EXPECT_EQ(out[0], double(exact));
  long double ref = 0;
  for (float v : x) ref += (long double)v * v;
  EXPECT_NEAR(out[1], double(ref), double(ref) * 1e-13);
  EXPECT_EQ(std::memcmp(&out[1], &out[2], sizeof(double)), 0);
  // bf16 input squares the widened values; n = 0 gives 0.
  std::vector<std::uint16_t> b = {k::f32_to_bf16(3.0f), k::f32_to_bf16(-0.5f)};
  dev.sum_squares(b.data(), DType::bf16, 2, out, *s);
  dev.sum_squares(b.data(), DType::bf16, 0, out + 1, *s);
  dev.synchronize(*s);
  EXPECT_EQ(out[0], 9.25);
  EXPECT_EQ(out[1], 0.0);
  dev.deallocate(out);
}

// The documented order, written out here: each kernels::kSumSquaresChunk-element chunk in
// kSumSquaresLanes fp64 lanes (element i of the chunk into lane i % lanes, in index order),
// the lanes added left to right, the chunks' sums added to the total in order. sum_squares and
// sum_squares_batch give the same bits for every length around the chunk and lane multiples,
// every dtype, values of every magnitude, inf and NaN included (compared as bytes).
TEST_F(Elementwise, SumSquaresKeepsTheDocumentedOrder) {
  auto reference = [](const void* x, DType t, std::size_t n) {
    double total = 0.0;
    for (std::size_t begin = 0; begin < n; begin += k::kSumSquaresChunk) {
      double lanes[k::kSumSquaresLanes] = {};
      for (std::size_t i = begin; i < std::min(n, begin + k::kSumSquaresChunk); ++i) {
        const double v = k::load_f32(x, t, i);
        lanes[(i - begin) % k::kSumSquaresLanes] += v * v;
      }
      double chunk = 0.0;
      for (double l : lanes) chunk += l;
      total += chunk;
    }
    return total;
  };
  std::mt19937 gen(21);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f), unit(-1.0f, 1.0f);
  auto values = [&](std::size_t n, bool specials) {
    std::vector<float> v(n);
    for (float& x : v) x = unit(gen) * std::exp2(exponent(gen));
    if (specials && n > 10) {
      v[n / 3] = std::numeric_limits<float>::infinity();
      v[n / 2] = std::numeric_limits<float>::quiet_NaN();
    }
    return v;
  };
  const std::size_t C = k::kSumSquaresChunk;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::vector<float>> f32s;
    std::vector<std::vector<std::uint16_t>> halves;
    std::vector<std::size_t> sizes = {0, 1, 7, 31, 32, 33, C - 1, C, C + 1, 4 * C - 1, 4 * C, 4 * C + 1, 9 * C + 17, 100003};
    for (int i = 0; i < 40; ++i) sizes.push_back(std::uniform_int_distribution<std::size_t>(0, C + 300)(gen));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      f32s.push_back(values(sizes[i], i % 7 == 3));
      std::vector<std::uint16_t> h(sizes[i]);
      for (std::size_t j = 0; j < h.size(); ++j) h[j] = to_half(f32s.back()[j], t);
      halves.push_back(std::move(h));
    }
    auto data = [&](std::size_t i) -> const void* { return t == DType::f32 ? static_cast<const void*>(f32s[i].data()) : halves[i].data(); };
    std::vector<TensorRegion> regions;
    for (std::size_t i = 0; i < sizes.size(); ++i) regions.push_back(TensorRegion{data(i), sizes[i]});
    double* out = static_cast<double*>(dev.allocate(sizes.size() * sizeof(double)));
    dev.sum_squares_batch(regions, t, out, *s);
    dev.synchronize(*s);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const double want = reference(data(i), t, sizes[i]);
      const double one = host_ops::sum_squares(data(i), t, sizes[i]);
      EXPECT_EQ(std::memcmp(&one, &want, sizeof(double)), 0) << dtype_name(t) << " n " << sizes[i] << ": " << one << " vs " << want;
      EXPECT_EQ(std::memcmp(&out[i], &want, sizeof(double)), 0) << "batch, " << dtype_name(t) << " n " << sizes[i] << ": " << out[i] << " vs " << want;
    }
    dev.deallocate(out);
  }
}

// The engine's finite check is the fp64 sum of squares: non-finite exactly when an element is.
// The largest values of each dtype square to finite fp64 (fp32: 1.2e77 each), inf and NaN of
// any dtype make it inf or NaN.
TEST_F(Elementwise, SumSquaresIsNonFiniteExactlyWhenAnElementIs) {
  auto* out = static_cast<double*>(dev.allocate(6 * sizeof(double)));
  std::vector<float> f(1000, std::numeric_limits<float>::max());
  dev.sum_squares(f.data(), DType::f32, f.size(), out, *s);
  dev.synchronize(*s);  // the ops are asynchronous: don't change f under them
  f[999] = std::numeric_limits<float>::infinity();
  dev.sum_squares(f.data(), DType::f32, f.size(), out + 1, *s);
  dev.synchronize(*s);
  f[999] = -std::numeric_limits<float>::quiet_NaN();
  dev.sum_squares(f.data(), DType::f32, f.size(), out + 2, *s);
  std::vector<std::uint16_t> b(10, 0x7f7f), h(10, 0x7bff);  // the largest finite bf16, fp16
  dev.sum_squares(b.data(), DType::bf16, 10, out + 3, *s);
  dev.synchronize(*s);
  b[5] = 0x7f80;  // bf16 +inf
  h[9] = 0x7e00;  // fp16 NaN
  dev.sum_squares(b.data(), DType::bf16, 10, out + 4, *s);
  dev.sum_squares(h.data(), DType::f16, 10, out + 5, *s);
  dev.synchronize(*s);
  EXPECT_TRUE(std::isfinite(out[0]));
  const double top = double(std::numeric_limits<float>::max()) * double(std::numeric_limits<float>::max());
  EXPECT_NEAR(out[0] / (1000.0 * top), 1.0, 1e-12);
  EXPECT_EQ(out[1], std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_TRUE(std::isfinite(out[3]));
  EXPECT_EQ(out[4], std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(out[5]));
  dev.deallocate(out);
}
