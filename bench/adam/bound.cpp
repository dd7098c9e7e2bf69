// The STREAM-style bound loop (4 reads + 3 writes per element, optionally one 16-bit write),
// AVX-512 / AVX2 / scalar by CPUID, ordinary or non-temporal stores per stream, with or without
// the software prefetch CpuAdam's kernels may issue (same distance, same four streams).
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "bench/adam/bench_loops.hpp"
#include "src/optim/adam_kernels.hpp"

namespace zoe::bench {
namespace {

volatile float g_zero = 0.0f;  // read at run time, so the loop cannot be optimised away

constexpr std::size_t kAhead = optim::detail::kPrefetchElements;

// What CpuAdam's kernels prefetch per 64-byte line of p: the same line kAhead elements on in
// p, m, v and g.
inline void prefetch_ahead(const float* p, const float* m, const float* v, const float* g, std::size_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(m + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead), _MM_HINT_T0);
}

// NT: p, m, v streamed; Out: 16-bit copy written; NTOut: that copy streamed; PF: prefetch.
template <bool NT, bool Out, bool NTOut, bool PF>
__attribute__((target("avx512f,avx512bw"))) void pass_avx512(float* p, float* m, float* v, const float* g,
                                                             std::uint16_t* out, std::size_t b, std::size_t e,
                                                             float zero) {
  const __m512 z = _mm512_set1_ps(zero);
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    if constexpr (PF) prefetch_ahead(p, m, v, g, i);
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
    if constexpr (Out) {
      const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(a), 16));
      if constexpr (NTOut) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), h);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
    }
  }
  if constexpr (NT || NTOut) _mm_sfence();
  for (; i < e; ++i) {
    p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
    if constexpr (Out) out[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, p[i]) >> 16);
  }
}

template <bool NT, bool Out, bool NTOut, bool PF>
__attribute__((target("avx2"))) void pass_avx2(float* p, float* m, float* v, const float* g, std::uint16_t* out,
                                               std::size_t b, std::size_t e, float zero) {
  const __m256 z = _mm256_set1_ps(zero);
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    if constexpr (PF) {
      if (i % 16 == 0) prefetch_ahead(p, m, v, g, i);  // once per 64-byte line, as the kernel
    }
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
    if constexpr (Out) {
      const __m256i s = _mm256_srli_epi32(_mm256_castps_si256(a), 16);
      const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(s, s), 0x08));
      if constexpr (NTOut) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), h);
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
  }
  if constexpr (NT || NTOut) _mm_sfence();
  for (; i < e; ++i) {
    p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
    if constexpr (Out) out[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, p[i]) >> 16);
  }
}

void pass_scalar(float* p, float* m, float* v, const float* g, std::uint16_t* out, std::size_t b, std::size_t e,
                 float zero) {
  for (std::size_t i = b; i < e; ++i) {
    p[i] += g[i] * zero, m[i] += g[i] * zero, v[i] += g[i] * zero;
    if (out) out[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, p[i]) >> 16);
  }
}

using Pass = void (*)(float*, float*, float*, const float*, std::uint16_t*, std::size_t, std::size_t, float);

// The pass for (isa, nt, out, nt_out, prefetch): the one instantiation with those flags.
template <bool NT, bool Out, bool NTOut, bool PF>
Pass pass_for(optim::Isa isa) {
  if (isa == optim::Isa::avx512) return pass_avx512<NT, Out, NTOut, PF>;
  if (isa == optim::Isa::avx2) return pass_avx2<NT, Out, NTOut, PF>;
  return pass_scalar;
}

template <bool PF>
Pass pick_stores(optim::Isa isa, bool nt, bool out, bool nt_out) {
  if (!out) return nt ? pass_for<true, false, false, PF>(isa) : pass_for<false, false, false, PF>(isa);
  if (nt) return pass_for<true, true, true, PF>(isa);
  return nt_out ? pass_for<false, true, true, PF>(isa) : pass_for<false, true, false, PF>(isa);
}

Pass pick(optim::Isa isa, bool nt, bool out, bool nt_out, bool prefetch) {
  return prefetch ? pick_stores<true>(isa, nt, out, nt_out) : pick_stores<false>(isa, nt, out, nt_out);
}

bool aligned(const void* x, std::size_t a) { return reinterpret_cast<std::uintptr_t>(x) % a == 0; }

}  // namespace

void stream_bound_pass(tbb::task_arena& arena, float* p, float* m, float* v, const float* g, std::uint16_t* out,
                       std::size_t n, optim::Stores stores) {
  const float zero = g_zero;
  // Same alignment rule as CpuAdam::step; chunks keep the base alignment.
  const bool can_stream = aligned(p, 64) && aligned(m, 64) && aligned(v, 64) && (!out || aligned(out, 32));
  const bool nt = stores.in_place == optim::StoreKind::nontemporal && can_stream;
  const bool nt_out = out && (nt || (stores.half_out == optim::StoreKind::nontemporal && aligned(out, 32)));
  const Pass pass = pick(optim::active_isa(), nt, out != nullptr, nt_out, stores.prefetch);
  const std::size_t chunk = optim::CpuAdam::kChunk, chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t c = r.begin(); c != r.end(); ++c) pass(p, m, v, g, out, c * chunk, std::min(n, (c + 1) * chunk), zero);
    });
  });
}

}  // namespace zoe::bench
