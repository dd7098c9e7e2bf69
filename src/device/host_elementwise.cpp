#include "src/device/host_elementwise.hpp"

#include <algorithm>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "kernels/elementwise.hpp"
#include "src/common/sanitizers.hpp"

namespace zoe::host_ops {
namespace k = zoe::kernels;

namespace {
// Calls fn(std::integral_constant<DType, t>{}) so loops see the dtype as a compile-time
// constant and the per-element dtype switch of load_f32/store_f32 folds away.
template <class Fn>
void with_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(std::integral_constant<DType, DType::f32>{});
    case DType::bf16: return fn(std::integral_constant<DType, DType::bf16>{});
    case DType::f16: return fn(std::integral_constant<DType, DType::f16>{});
  }
}
}  // namespace

void fill(void* dst, DType dtype, std::size_t n, float value) {
  with_dtype(dtype, [&](auto t) {
    for (std::size_t i = 0; i < n; ++i) k::store_f32(dst, t, i, value);
  });
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n) {
  with_dtype(src_dtype, [&](auto s) {
    with_dtype(dst_dtype, [&](auto d) {
      for (std::size_t i = 0; i < n; ++i) k::store_f32(dst, d, i, k::load_f32(src, s, i));
    });
  });
}

void scale(void* x, DType dtype, std::size_t n, float factor) {
  with_dtype(dtype, [&](auto t) {
    for (std::size_t i = 0; i < n; ++i) k::store_f32(x, t, i, k::scale_value(k::load_f32(x, t, i), factor));
  });
}

void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n) {
  with_dtype(src_dtype, [&](auto t) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = k::accumulate_value(acc[i], k::load_f32(src, t, i));
  });
}

double sum_squares(const void* x, DType dtype, std::size_t n) {
  constexpr std::size_t C = k::kSumSquaresChunk, L = k::kSumSquaresLanes;
  double total = 0.0;
  with_dtype(dtype, [&](auto t) {
    for (std::size_t c = 0; c < n; c += C) {
      const std::size_t m = std::min(C, n - c);
      double lanes[L] = {};
      std::size_t i = 0;
      for (; i + L <= m; i += L)
        for (std::size_t l = 0; l < L; ++l) lanes[l] += k::square_f64(k::load_f32(x, t, c + i + l));
      for (; i < m; ++i) lanes[i % L] += k::square_f64(k::load_f32(x, t, c + i));
      double chunk = 0.0;
      for (double v : lanes) chunk += v;
      total += chunk;
    }
  });
  return total;
}

void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
               DType grad_dtype, void* out, DType out_dtype, std::size_t n) {
  constexpr std::size_t kGrain = 1 << 15;  // elements per task: ~0.5 MiB of states
  const AdamIsa isa = best_adam_isa();
  auto body = [&](std::size_t begin, std::size_t end) {
    adam_range(isa, c, master + begin, exp_avg + begin, exp_avg_sq + begin,
               static_cast<const char*>(grad) + begin * dtype_size(grad_dtype), grad_dtype,
               out ? static_cast<char*>(out) + begin * dtype_size(out_dtype) : nullptr, out_dtype, end - begin);
  };
  if (n <= kGrain) return body(0, n);  // one grain: no task to spawn (many small groups)
  sanitizers::ForkJoin edges;  // what libtbb synchronises, stated for ThreadSanitizer
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kGrain), [&](const tbb::blocked_range<std::size_t>& r) {
    edges.body_begins();
    body(r.begin(), r.end());
    edges.body_ends();
  });
  edges.joined();
}

namespace {
constexpr std::size_t kLine = 64;
}  // namespace

void prefetch_read(const void* p, std::size_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (std::size_t b = 0; b < std::min(bytes, kPrefetchBytes); b += kLine) __builtin_prefetch(c + b, 0);
}

void prefetch_write(const void* p, std::size_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (std::size_t b = 0; b < std::min(bytes, kPrefetchBytes); b += kLine) __builtin_prefetch(c + b, 1);
}

void prefetch_adam(const float* master, const float* exp_avg, const float* exp_avg_sq, const void* grad,
                   DType grad_dtype, const void* out, DType out_dtype, std::size_t n) {
  prefetch_read(grad, n * dtype_size(grad_dtype));
  prefetch_write(master, n * sizeof(float));
  prefetch_write(exp_avg, n * sizeof(float));
  prefetch_write(exp_avg_sq, n * sizeof(float));
  if (out) prefetch_write(out, n * dtype_size(out_dtype));
}

}  // namespace zoe::host_ops
