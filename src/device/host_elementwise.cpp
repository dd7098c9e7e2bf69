#include "src/device/host_elementwise.hpp"

#include <algorithm>

#include "kernels/elementwise.hpp"

namespace zoe::host_ops {
namespace k = zoe::kernels;

void fill(void* dst, DType dtype, std::size_t n, float value) {
  for (std::size_t i = 0; i < n; ++i) k::store_f32(dst, dtype, i, value);
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) k::store_f32(dst, dst_dtype, i, k::load_f32(src, src_dtype, i));
}

void scale(void* x, DType dtype, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) k::store_f32(x, dtype, i, k::scale_value(k::load_f32(x, dtype, i), factor));
}

void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = k::accumulate_value(acc[i], k::load_f32(src, src_dtype, i));
}

double sum_squares(const void* x, DType dtype, std::size_t n) {
  double total = 0.0;
  for (std::size_t begin = 0; begin < n; begin += k::kSumSquaresChunk) {
    std::size_t end = std::min(n, begin + k::kSumSquaresChunk);
    double chunk = 0.0;
    for (std::size_t i = begin; i < end; ++i) chunk += k::square_f64(k::load_f32(x, dtype, i));
    total += chunk;
  }
  return total;
}

bool all_finite(const void* x, DType dtype, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!k::is_finite_f32(k::load_f32(x, dtype, i))) return false;
  return true;
}

}  // namespace zoe::host_ops
