// The STREAM-style bound loop (4 reads + 3 writes per element), AVX-512 / AVX2 / scalar by CPUID.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "bench/adam/bench_loops.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {
namespace {

volatile float g_zero = 0.0f;  // read at run time, so the loop cannot be optimised away

template <bool NT>
__attribute__((target("avx512f"))) void pass_avx512(float* p, float* m, float* v, const float* g, std::size_t b,
                                                    std::size_t e, float zero) {
  const __m512 z = _mm512_set1_ps(zero);
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(g + i), z);
    const __m512 a = _mm512_add_ps(_mm512_loadu_ps(p + i), d);
    const __m512 c = _mm512_add_ps(_mm512_loadu_ps(m + i), d);
    const __m512 w = _mm512_add_ps(_mm512_loadu_ps(v + i), d);
    if constexpr (NT) {
      _mm512_stream_ps(p + i, a);
      _mm512_stream_ps(m + i, c);
      _mm512_stream_ps(v + i, w);
    } else {
      _mm512_storeu_ps(p + i, a);
      _mm512_storeu_ps(m + i, c);
      _mm512_storeu_ps(v + i, w);
    }
  }
  if constexpr (NT) _mm_sfence();
  for (; i < e; ++i) p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
}

template <bool NT>
__attribute__((target("avx2"))) void pass_avx2(float* p, float* m, float* v, const float* g, std::size_t b,
                                               std::size_t e, float zero) {
  const __m256 z = _mm256_set1_ps(zero);
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(g + i), z);
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(p + i), d);
    const __m256 c = _mm256_add_ps(_mm256_loadu_ps(m + i), d);
    const __m256 w = _mm256_add_ps(_mm256_loadu_ps(v + i), d);
    if constexpr (NT) {
      _mm256_stream_ps(p + i, a);
      _mm256_stream_ps(m + i, c);
      _mm256_stream_ps(v + i, w);
    } else {
      _mm256_storeu_ps(p + i, a);
      _mm256_storeu_ps(m + i, c);
      _mm256_storeu_ps(v + i, w);
    }
  }
  if constexpr (NT) _mm_sfence();
  for (; i < e; ++i) p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
}

void pass_scalar(float* p, float* m, float* v, const float* g, std::size_t b, std::size_t e, float zero) {
  for (std::size_t i = b; i < e; ++i) p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
}

}  // namespace

void stream_bound_pass(tbb::task_arena& arena, float* p, float* m, float* v, const float* g, std::size_t n,
                       bool nontemporal) {
  const float zero = g_zero;
  const optim::Isa isa = optim::active_isa();
  // NT stores need 64-byte alignment; chunks keep the base alignment.
  const bool nt = nontemporal && reinterpret_cast<std::uintptr_t>(p) % 64 == 0 &&
                  reinterpret_cast<std::uintptr_t>(m) % 64 == 0 && reinterpret_cast<std::uintptr_t>(v) % 64 == 0;
  auto body = [&](std::size_t b, std::size_t e) {
    if (isa == optim::Isa::avx512) nt ? pass_avx512<true>(p, m, v, g, b, e, zero) : pass_avx512<false>(p, m, v, g, b, e, zero);
    else if (isa == optim::Isa::avx2) nt ? pass_avx2<true>(p, m, v, g, b, e, zero) : pass_avx2<false>(p, m, v, g, b, e, zero);
    else pass_scalar(p, m, v, g, b, e, zero);
  };
  const std::size_t chunk = optim::CpuAdam::kChunk, chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t c = r.begin(); c != r.end(); ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
    });
  });
}

}  // namespace zoe::bench
