// The "plain -O3 loop" baseline: AdamW written the obvious way, compiled with the project's
// default flags only (no ISA flags, so at most what the compiler auto-vectorises for x86-64).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "bench/adam/bench_loops.hpp"
#include "kernels/half.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {
namespace {

void plain_range(std::int64_t step, float* p, float* m, float* v, const float* g, std::uint16_t* out,
                 std::size_t b, std::size_t e) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  const float bc1 = 1.0f - std::pow(beta1, float(step)), bc2 = 1.0f - std::pow(beta2, float(step));
  for (std::size_t i = b; i < e; ++i) {
    p[i] -= lr * wd * p[i];
    m[i] = beta1 * m[i] + (1 - beta1) * g[i];
    v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
    p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + eps);
    if (out) out[i] = kernels::f32_to_bf16(p[i]);
  }
}

void plain_range(std::int64_t step, float* p, std::uint16_t* m16, std::uint16_t* v16, const float* g,
                 std::uint16_t* out, std::size_t b, std::size_t e) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  const float bc1 = 1.0f - std::pow(beta1, float(step)), bc2 = 1.0f - std::pow(beta2, float(step));
  for (std::size_t i = b; i < e; ++i) {
    p[i] -= lr * wd * p[i];
    const float m = beta1 * kernels::bf16_to_f32(m16[i]) + (1 - beta1) * g[i];
    const float v = beta2 * kernels::bf16_to_f32(v16[i]) + (1 - beta2) * g[i] * g[i];
    p[i] -= lr / bc1 * m / (std::sqrt(v / bc2) + eps);
    m16[i] = kernels::f32_to_bf16(m);
    v16[i] = kernels::f32_to_bf16(v);
    if (out) out[i] = kernels::f32_to_bf16(p[i]);
  }
}

template <class S>
void plain_pass(tbb::task_arena& arena, std::int64_t step, float* p, S* m, S* v, const float* g, std::uint16_t* out,
                std::size_t n) {
  const std::size_t chunk = optim::CpuAdam::kChunk, chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t c = r.begin(); c != r.end(); ++c)
        plain_range(step, p, m, v, g, out, c * chunk, std::min(n, (c + 1) * chunk));
    });
  });
}

}  // namespace

void plain_adam_pass(tbb::task_arena& arena, std::int64_t step, float* p, float* m, float* v, const float* g,
                     std::uint16_t* out, std::size_t n) {
  plain_pass(arena, step, p, m, v, g, out, n);
}

void plain_adam_pass(tbb::task_arena& arena, std::int64_t step, float* p, std::uint16_t* m, std::uint16_t* v,
                     const float* g, std::uint16_t* out, std::size_t n) {
  plain_pass(arena, step, p, m, v, g, out, n);
}

}  // namespace zoe::bench
