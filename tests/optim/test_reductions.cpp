// CpuAdam::sum_squares (and its finite check) and add_grad on every ISA path, against references
// in this file.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/elementwise.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/optim/store_pick.hpp"
#include "src/device/host_elementwise.hpp"
#include "tests/optim/test_support.hpp"
#include "zoe/error.hpp"

namespace zoe::optim::test {
namespace {

// The documented order (kernels::kSumSquaresChunk's: host_ops::sum_squares' and the host
// device's), written out: per chunk of kSumSquaresChunk elements, element j of the chunk into
// fp64 lane j % kSumSquaresLanes; the lanes added left to right; the chunk sums in chunk order.
double ref_sum_squares_documented_order(const std::vector<float>& x) {
  constexpr std::size_t C = kernels::kSumSquaresChunk, L = kernels::kSumSquaresLanes;
  double total = 0.0;
  for (std::size_t c = 0; c < x.size(); c += C) {
    double lanes[L] = {};
    for (std::size_t j = c; j < x.size() && j < c + C; ++j) lanes[(j - c) % L] += double(x[j]) * double(x[j]);
    double chunk = 0.0;
    for (double l : lanes) chunk += l;
    total += chunk;
  }
  return total;
}

long double ref_sum_squares_exactish(const std::vector<float>& x) {
  long double s = 0;
  for (float f : x) s += static_cast<long double>(f) * f;
  return s;
}

// The sizes include 14,240 (a sub-group whose bf16 gradient sums rounded differently on the
// tier and on the device while CpuAdam summed 32 lanes over 16,384 elements and the device each
// 4,096 in index order), and values over 40 binades, so the fp64 sums round and any other order
// shows (over [-3, 3] alone bf16 squares add exactly).
TEST(SumSquares, EveryIsaEveryDtypeMatchesDocumentedOrderBitwise) {
  // oneTBB caps its workers at the core count; lift the cap so 8 threads really run.
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{1025},
                        std::size_t{14240}, CpuAdam::kChunk + 5, (std::size_t{1} << 20) + 3}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<float> x = uniform(n, -3.0f, 3.0f, 3 + unsigned(n));
      const std::vector<float> scale = uniform(n, 0.0f, 1.0f, 5 + unsigned(n));
      const int binades = dt == DType::f16 ? 12 : 40;  // (fp16 has fewer)
      for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(x[i], -static_cast<int>(scale[i] * binades));
      std::vector<std::uint16_t> h;
      if (dt != DType::f32) h = to_half(x, dt, &x);  // x becomes the exact half values
      const void* data = dt == DType::f32 ? static_cast<const void*>(x.data()) : h.data();
      const double want = ref_sum_squares_documented_order(x);
      const long double close = ref_sum_squares_exactish(x);
      for (Isa isa : runnable_isas()) {
        for (int threads : {1, 2, 8}) {
          CpuAdam adam(threads, isa);
          const double got = adam.sum_squares(data, dt, n);
          EXPECT_EQ(got, want) << isa_name(isa) << " " << dtype_name(dt) << " n=" << n << " threads=" << threads;
          EXPECT_EQ(got, host_ops::sum_squares(data, dt, n)) << "host_ops' order, " << isa_name(isa) << " " << dtype_name(dt) << " n=" << n;
          EXPECT_LE(std::fabs(static_cast<long double>(got) - close), 1e-13L * (close + 1)) << n;
        }
      }
    }
  }
}

TEST(SumSquares, NanAndInfPropagate) {
  std::vector<float> x(1000, 1.0f);
  x[997] = std::numeric_limits<float>::infinity();
  for (Isa isa : runnable_isas()) {
    CpuAdam adam(2, isa);
    EXPECT_TRUE(std::isinf(adam.sum_squares(x.data(), DType::f32, x.size()))) << isa_name(isa);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(adam.sum_squares(x.data(), DType::f32, x.size()))) << isa_name(isa);
    x[3] = 1.0f;
  }
}

// The finite check of a sum of squares (the gradient tier keeps a 16-bit gradient as it arrives
// and takes its finiteness from its sum): non-finite exactly when an element is, at every
// position, on every ISA path and dtype; the largest finite values sum to a finite fp64.
TEST(SumSquares, IsNonFiniteExactlyWhenAnElementIs) {
  const std::size_t n = CpuAdam::kChunk * 2 + 37;  // two full chunks and a tail that is not a SIMD multiple
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  const std::size_t positions[] = {0, 15, 16, 31, 32, CpuAdam::kChunk - 1, CpuAdam::kChunk + 40, n - 37, n - 1};
  for (Isa isa : runnable_isas()) {
    CpuAdam adam(2, isa);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<float> x = uniform(n, -60000.0f, 60000.0f, 5);  // large but finite in fp16 too
      std::vector<std::uint16_t> h = to_half(x, dt == DType::f32 ? DType::bf16 : dt, nullptr);
      auto data = [&]() -> const void* { return dt == DType::f32 ? static_cast<const void*>(x.data()) : h.data(); };
      EXPECT_TRUE(std::isfinite(adam.sum_squares(data(), dt, n))) << isa_name(isa) << " " << dtype_name(dt);
      for (float s : specials) {
        for (std::size_t pos : positions) {
          const float keep = x[pos];
          const std::uint16_t keep_h = h[pos];
          x[pos] = s;
          if (dt != DType::f32) h[pos] = to_half({s}, dt, nullptr)[0];
          EXPECT_FALSE(std::isfinite(adam.sum_squares(data(), dt, n)))
              << isa_name(isa) << " " << dtype_name(dt) << " value " << s << " at " << pos;
          EXPECT_TRUE(std::isfinite(adam.sum_squares(data(), dt, pos))) << "prefix before the special value";
          x[pos] = keep;
          h[pos] = keep_h;
        }
      }
      // The largest finite values are finite.
      x.assign(n, std::numeric_limits<float>::max());
      h.assign(n, dt == DType::bf16 ? 0x7f7f : 0x7bff);
      EXPECT_TRUE(std::isfinite(adam.sum_squares(data(), dt, n))) << isa_name(isa) << " " << dtype_name(dt);
    }
  }
}

// CpuAdam::add_grad against the offload tier's own arithmetic (host_ops cast / accumulate, then
// sum_squares, as OptimizerStates::add_grad does): bitwise, every ISA, dtype,
// first / accumulate, thread count, sizes around the 4096-element sum chunk and the 8-chunk block.
TEST(AddGrad, EveryIsaEveryDtypeMatchesHostOpsBitwise) {
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  constexpr std::size_t C = 4096;
  for (std::size_t n : {std::size_t{1}, std::size_t{17}, C - 1, C, 8 * C - 3, 8 * C, 8 * C + 1, 16 * C, 17 * C + 5,
                        25 * C - 1,
                        std::size_t{3} << 18}) {
    const std::vector<float> start = uniform(n, -3.0f, 3.0f, 40 + static_cast<unsigned>(n));
    const std::vector<float> g = uniform(n, -1.0f, 1.0f, 41 + static_cast<unsigned>(n));
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<std::uint16_t> half;
      if (dt != DType::f32) half = to_half(g, dt, nullptr);
      const void* src = dt == DType::f32 ? static_cast<const void*>(g.data()) : half.data();
      for (bool first : {true, false}) {
        std::vector<float> want = start;
        if (first) host_ops::cast(src, dt, want.data(), DType::f32, n);
        else host_ops::accumulate(src, dt, want.data(), n);
        const double want_sum = host_ops::sum_squares(want.data(), DType::f32, n);
        for (Isa isa : runnable_isas()) {
          for (int threads : {1, 2, 8}) {
            for (StorePolicy policy : {StorePolicy::ordinary, StorePolicy::nontemporal}) {
              CpuAdam adam(threads, isa);
              adam.set_store_policy(policy);
              AlignedBuffer buf(n * 4, 64);  // 64-byte aligned: the streaming path runs
              float* got = buf.as<float>().data();
              std::copy(start.begin(), start.end(), got);
              const CpuAdam::GradStats st = adam.add_grad(src, dt, got, n, first);
              const std::string ctx = std::string(isa_name(isa)) + " " + std::string(dtype_name(dt)) +
                                      (first ? " first" : " accumulate") + " threads=" + std::to_string(threads) +
                                      " stores " + std::string(store_policy_name(policy)) + " n=" + std::to_string(n);
              EXPECT_EQ(first_bit_difference(got, want.data(), n), -1) << ctx;
              EXPECT_EQ(bits_f64(st.sum_squares), bits_f64(want_sum))
                  << ctx << ": " << st.sum_squares << " vs " << want_sum;
              EXPECT_TRUE(st.finite) << ctx;
            }
          }
        }
      }
    }
  }
}

TEST(AddGrad, NonFiniteAnywhereIsReportedAndPropagatesLikeHostOps) {
  constexpr std::size_t n = 8 * 4096 * 2 + 100;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t at : {std::size_t{0}, std::size_t{4095}, std::size_t{4096 * 7 + 3}, std::size_t{8 * 4096 + 1},
                         n - 1}) {
    for (float bad : {inf, -inf, nan}) {
      std::vector<float> g = uniform(n, -1.0f, 1.0f, 3);
      g[at] = bad;
      std::vector<float> want(n);
      host_ops::cast(g.data(), DType::f32, want.data(), DType::f32, n);
      const double want_sum = host_ops::sum_squares(want.data(), DType::f32, n);
      for (Isa isa : runnable_isas()) {
        CpuAdam adam(2, isa);
        std::vector<float> got(n, 5.0f);
        const CpuAdam::GradStats st = adam.add_grad(g.data(), DType::f32, got.data(), n, true);
        const std::string ctx = std::string(isa_name(isa)) + " bad at " + std::to_string(at);
        EXPECT_FALSE(st.finite) << ctx;
        EXPECT_EQ(first_bit_difference(got.data(), want.data(), n), -1) << ctx;
        EXPECT_EQ(std::isnan(st.sum_squares), std::isnan(want_sum)) << ctx;
        if (!std::isnan(want_sum)) EXPECT_EQ(st.sum_squares, want_sum) << ctx;
      }
    }
  }
  // bf16 / fp16 infinities and quiet NaNs read as the same fp32 value host_ops reads.
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> h = to_half(uniform(n, -1.0f, 1.0f, 9), dt, nullptr);
    h[8 * 4096 + 5] = dt == DType::bf16 ? 0x7f80 : 0x7c00;   // +inf
    h[100] = dt == DType::bf16 ? 0xffc1 : 0xfe01;            // quiet NaN with payload
    std::vector<float> want(n);
    host_ops::cast(h.data(), dt, want.data(), DType::f32, n);
    for (Isa isa : runnable_isas()) {
      CpuAdam adam(2, isa);
      std::vector<float> got(n);
      const CpuAdam::GradStats st = adam.add_grad(h.data(), dt, got.data(), n, true);
      EXPECT_FALSE(st.finite) << isa_name(isa);
      EXPECT_EQ(first_bit_difference(got.data(), want.data(), n), -1) << isa_name(isa) << " " << dtype_name(dt);
      EXPECT_TRUE(std::isnan(st.sum_squares)) << isa_name(isa);
    }
  }
  EXPECT_THROW(CpuAdam(1).add_grad(nullptr, DType::f32, nullptr, 3, true), UsageError);
  EXPECT_TRUE(CpuAdam(1).add_grad(nullptr, DType::f32, nullptr, 0, true).finite);
}

TEST(AddGrad, MeasuredStoresTrialFirstAndAccumulateApart) {
  // StorePolicy::measure: warm-up + kStoreTrialRounds rounds of {ordinary, nontemporal} per
  // class; first and accumulate calls are separate classes. Results stay bitwise host_ops'.
  const std::size_t n = 8 * 4096 * 3 + 7;
  const std::vector<float> g = uniform(n, -1.0f, 1.0f, 77);
  CpuAdam adam(2);
  AlignedBuffer buf(n * 4, 64);
  float* got = buf.as<float>().data();
  std::vector<float> want(n);
  const int calls = 1 + CpuAdam::kStoreTrialRounds * 2;
  for (int k = 0; k < calls; ++k) {
    EXPECT_FALSE(adam.add_grad_store_choice(n, DType::f32, true).decided) << k;
    adam.add_grad(g.data(), DType::f32, got, n, true);
  }
  const CpuAdam::StoreChoice c = adam.add_grad_store_choice(n, DType::f32, true);
  EXPECT_TRUE(c.decided);
  EXPECT_GT(c.gbps[0], 0.0);
  EXPECT_GT(c.gbps[1], 0.0);
  EXPECT_EQ(c.gbps[2], 0.0);  // add_grad has two candidates
  EXPECT_FALSE(c.stores.prefetch);
  // Which of the two: the simplest within the noise margin of the faster (the rule is tested on
  // made-up timings in test_store_pick.cpp; here the timings are real).
  EXPECT_GE(c.margin, detail::kMinStoreMargin);
  EXPECT_FALSE(adam.add_grad_store_choice(n, DType::f32, false).decided);
  host_ops::cast(g.data(), DType::f32, want.data(), DType::f32, n);
  for (int k = 0; k < calls; ++k) {
    const CpuAdam::GradStats st = adam.add_grad(g.data(), DType::f32, got, n, false);
    host_ops::accumulate(g.data(), DType::f32, want.data(), n);
    ASSERT_EQ(first_bit_difference(got, want.data(), n), -1) << "accumulate call " << k;
    EXPECT_EQ(bits_f64(st.sum_squares), bits_f64(host_ops::sum_squares(want.data(), DType::f32, n))) << k;
  }
  EXPECT_TRUE(adam.add_grad_store_choice(n, DType::f32, false).decided);
}

}  // namespace
}  // namespace zoe::optim::test
