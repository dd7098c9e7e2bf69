// CpuAdam::sum_squares and all_finite on every ISA path, against references in this file.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/optim/test_support.hpp"

namespace zoe::optim::test {
namespace {

// The documented order: per chunk of CpuAdam::kChunk, 32 fp64 lanes (element j of the chunk into
// lane j % 32), lanes added 0..31, chunk partials added in chunk order.
double ref_sum_squares_documented_order(const std::vector<float>& x) {
  double total = 0.0;
  for (std::size_t c = 0; c < x.size(); c += CpuAdam::kChunk) {
    double lanes[CpuAdam::kSumLanes] = {};
    for (std::size_t j = 0; c + j < x.size() && j < CpuAdam::kChunk; ++j)
      lanes[j % CpuAdam::kSumLanes] += double(x[c + j]) * double(x[c + j]);
    double partial = 0.0;
    for (double l : lanes) partial += l;
    total += partial;
  }
  return total;
}

long double ref_sum_squares_exactish(const std::vector<float>& x) {
  long double s = 0;
  for (float f : x) s += static_cast<long double>(f) * f;
  return s;
}

TEST(SumSquares, EveryIsaEveryDtypeMatchesDocumentedOrderBitwise) {
  // oneTBB caps its workers at the core count; lift the cap so 8 threads really run.
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{1025},
                        CpuAdam::kChunk + 5, (std::size_t{1} << 20) + 3}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<float> x = uniform(n, -3.0f, 3.0f, 3 + unsigned(n));
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

TEST(AllFinite, FindsEveryNonFiniteAtEveryPosition) {
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
      EXPECT_TRUE(adam.all_finite(data(), dt, n)) << isa_name(isa) << " " << dtype_name(dt);
      EXPECT_TRUE(adam.all_finite(data(), dt, 0));
      for (float s : specials) {
        for (std::size_t pos : positions) {
          const float keep = x[pos];
          const std::uint16_t keep_h = h[pos];
          x[pos] = s;
          if (dt != DType::f32) h[pos] = to_half({s}, dt, nullptr)[0];
          EXPECT_FALSE(adam.all_finite(data(), dt, n))
              << isa_name(isa) << " " << dtype_name(dt) << " value " << s << " at " << pos;
          EXPECT_EQ(adam.all_finite(data(), dt, pos), true) << "prefix before the special value";
          x[pos] = keep;
          h[pos] = keep_h;
        }
      }
      // The largest finite values are finite.
      x.assign(n, std::numeric_limits<float>::max());
      h.assign(n, dt == DType::bf16 ? 0x7f7f : 0x7bff);
      EXPECT_TRUE(adam.all_finite(data(), dt, n)) << isa_name(isa) << " " << dtype_name(dt);
      x = uniform(n, -60000.0f, 60000.0f, 5);
      h = to_half(x, dt == DType::f32 ? DType::bf16 : dt, nullptr);
    }
  }
}

}  // namespace
}  // namespace zoe::optim::test
