// The STREAM-style bound loop (4 reads + 3 writes per element, optionally one 16-bit write),
// AVX-512 / AVX2 / scalar by CPUID, ordinary or non-temporal stores per stream, with or without
// the software prefetch CpuAdam's kernels may issue (same distance, same four streams). With bf16
// states the moment streams m and v are 16-bit (read 2 + written 2 bytes each per element).
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <type_traits>

#include "bench/adam/bench_loops.hpp"
#include "src/optim/adam_kernels.hpp"

namespace zoe::bench {
namespace {

volatile float g_zero = 0.0f;  // read at run time, so the loop cannot be optimised away

constexpr std::size_t kAhead = optim::detail::kPrefetchElements;

// What CpuAdam's kernels prefetch per 64-byte line of p: the element kAhead on in p, m, v and g
// (with bf16 states m and v are 16-bit, so the same element is 512 bytes on there).
template <class S>
inline void prefetch_ahead(const float* p, const S* m, const S* v, const float* g, std::size_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(m + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead), _MM_HINT_T0);
}

// The scalar element: x = x + g * zero on p, m, v (16-bit m, v: widened, added, the top half
// kept, which is exact since the sum is the bf16 value itself), and the copy's top 16 bits of p.
template <class S, bool Out>
inline void element(float* p, S* m, S* v, const float* g, std::uint16_t* out, std::size_t i, float zero) {
  const float d = g[i] * zero;
  p[i] += d;
  if constexpr (std::is_same_v<S, float>) {
    m[i] += d, v[i] += d;
  } else {
    auto add = [d](std::uint16_t& x) {
      x = static_cast<std::uint16_t>(
          __builtin_bit_cast(std::uint32_t, __builtin_bit_cast(float, std::uint32_t{x} << 16) + d) >> 16);
    };
    add(m[i]), add(v[i]);
  }
  if constexpr (Out) out[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, p[i]) >> 16);
}

#define ZOE_AVX512 __attribute__((target("avx512f,avx512bw")))
#define ZOE_AVX2 __attribute__((target("avx2")))

// 16-bit lanes: bf16 bits <-> fp32 (widen exact; narrow keeps the top half), 16-bit stores.
ZOE_AVX512 inline __m512 widen16(const std::uint16_t* src) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
ZOE_AVX512 inline __m256i narrow16(__m512 x) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16));
}
ZOE_AVX512 inline __m512i narrow32(__m512 lo, __m512 hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(narrow16(lo)), narrow16(hi), 1);
}
template <bool NT>
ZOE_AVX512 inline void store_half16(std::uint16_t* dst, __m256i h) {
  if constexpr (NT) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
}
ZOE_AVX2 inline __m256 widen8(const std::uint16_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
ZOE_AVX2 inline __m128i narrow8(__m256 x) {
  const __m256i s = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(s, s), 0x08));
}
template <bool NT>
ZOE_AVX2 inline void store_half8(std::uint16_t* dst, __m128i h) {
  if constexpr (NT) _mm_stream_si128(reinterpret_cast<__m128i*>(dst), h);
  else _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
}

// S: float (fp32 states) or std::uint16_t (bf16 states); NT: p, m, v streamed; Out: 16-bit copy
// written; NTOut: that copy streamed; PF: prefetch.
template <class S, bool NT, bool Out, bool NTOut, bool PF>
ZOE_AVX512 void pass_avx512(float* p, void* mv, void* vv, const float* g, std::uint16_t* out, std::size_t b,
                            std::size_t e, float zero) {
  S* m = static_cast<S*>(mv);
  S* v = static_cast<S*>(vv);
  const __m512 z = _mm512_set1_ps(zero);
  std::size_t i = b;
  if constexpr (!std::is_same_v<S, float>) {
    // bf16 states: 32 elements per iteration with whole-line stores of m, v and the copy, as
    // CpuAdam's AVX-512 kernel does (the copy streamed as two half lines: it is only 32-byte aligned).
    for (; i + 32 <= e; i += 32) {
      if constexpr (PF) prefetch_ahead(p, m, v, g, i), prefetch_ahead(p, m, v, g, i + 16);
      const __m512 d0 = _mm512_mul_ps(_mm512_loadu_ps(g + i), z);
      const __m512 d1 = _mm512_mul_ps(_mm512_loadu_ps(g + i + 16), z);
      const __m512 a0 = _mm512_add_ps(_mm512_loadu_ps(p + i), d0);
      const __m512 a1 = _mm512_add_ps(_mm512_loadu_ps(p + i + 16), d1);
      const __m512i c = narrow32(_mm512_add_ps(widen16(m + i), d0), _mm512_add_ps(widen16(m + i + 16), d1));
      const __m512i w = narrow32(_mm512_add_ps(widen16(v + i), d0), _mm512_add_ps(widen16(v + i + 16), d1));
      if constexpr (NT) {
        _mm512_stream_ps(p + i, a0);
        _mm512_stream_ps(p + i + 16, a1);
        _mm512_stream_si512(reinterpret_cast<__m512i*>(m + i), c);
        _mm512_stream_si512(reinterpret_cast<__m512i*>(v + i), w);
      } else {
        _mm512_storeu_ps(p + i, a0);
        _mm512_storeu_ps(p + i + 16, a1);
        _mm512_storeu_si512(m + i, c);
        _mm512_storeu_si512(v + i, w);
      }
      if constexpr (Out) {
        const __m512i h = narrow32(a0, a1);
        if constexpr (NTOut) {
          _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), _mm512_castsi512_si256(h));
          _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + 16), _mm512_extracti64x4_epi64(h, 1));
        } else {
          _mm512_storeu_si512(out + i, h);
        }
      }
    }
  }
  for (; i + 16 <= e; i += 16) {
    if constexpr (PF) prefetch_ahead(p, m, v, g, i);
    const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(g + i), z);
    const __m512 a = _mm512_add_ps(_mm512_loadu_ps(p + i), d);
    if constexpr (std::is_same_v<S, float>) {
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
    } else {
      const __m256i c = narrow16(_mm512_add_ps(widen16(m + i), d));
      const __m256i w = narrow16(_mm512_add_ps(widen16(v + i), d));
      if constexpr (NT) _mm512_stream_ps(p + i, a);
      else _mm512_storeu_ps(p + i, a);
      store_half16<NT>(m + i, c);
      store_half16<NT>(v + i, w);
    }
    if constexpr (Out) {
      const __m256i h = narrow16(a);
      if constexpr (NTOut) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), h);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
    }
  }
  if constexpr (NT || NTOut) _mm_sfence();
  for (; i < e; ++i) element<S, Out>(p, m, v, g, out, i, zero);
}

template <class S, bool NT, bool Out, bool NTOut, bool PF>
ZOE_AVX2 void pass_avx2(float* p, void* mv, void* vv, const float* g, std::uint16_t* out, std::size_t b,
                        std::size_t e, float zero) {
  S* m = static_cast<S*>(mv);
  S* v = static_cast<S*>(vv);
  const __m256 z = _mm256_set1_ps(zero);
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    if constexpr (PF) {
      if (i % 16 == 0) prefetch_ahead(p, m, v, g, i);  // once per 64-byte line of p, as the kernel
    }
    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(g + i), z);
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(p + i), d);
    if constexpr (std::is_same_v<S, float>) {
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
    } else {
      const __m128i c = narrow8(_mm256_add_ps(widen8(m + i), d));
      const __m128i w = narrow8(_mm256_add_ps(widen8(v + i), d));
      if constexpr (NT) _mm256_stream_ps(p + i, a);
      else _mm256_storeu_ps(p + i, a);
      store_half8<NT>(m + i, c);
      store_half8<NT>(v + i, w);
    }
    if constexpr (Out) {
      const __m128i h = narrow8(a);
      if constexpr (NTOut) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), h);
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
  }
  if constexpr (NT || NTOut) _mm_sfence();
  for (; i < e; ++i) element<S, Out>(p, m, v, g, out, i, zero);
}

template <class S>
void pass_scalar(float* p, void* mv, void* vv, const float* g, std::uint16_t* out, std::size_t b, std::size_t e,
                 float zero) {
  S* m = static_cast<S*>(mv);
  S* v = static_cast<S*>(vv);
  for (std::size_t i = b; i < e; ++i) {
    if (out) element<S, true>(p, m, v, g, out, i, zero);
    else element<S, false>(p, m, v, g, out, i, zero);
  }
}

using Pass = void (*)(float*, void*, void*, const float*, std::uint16_t*, std::size_t, std::size_t, float);

// The pass for (isa, states, nt, out, nt_out, prefetch): the one instantiation with those flags.
template <class S, bool NT, bool Out, bool NTOut, bool PF>
Pass pass_for(optim::Isa isa) {
  if (isa == optim::Isa::avx512) return pass_avx512<S, NT, Out, NTOut, PF>;
  if (isa == optim::Isa::avx2) return pass_avx2<S, NT, Out, NTOut, PF>;
  return pass_scalar<S>;
}

template <class S, bool PF>
Pass pick_stores(optim::Isa isa, bool nt, bool out, bool nt_out) {
  if (!out) return nt ? pass_for<S, true, false, false, PF>(isa) : pass_for<S, false, false, false, PF>(isa);
  if (nt) return pass_for<S, true, true, true, PF>(isa);
  return nt_out ? pass_for<S, false, true, true, PF>(isa) : pass_for<S, false, true, false, PF>(isa);
}

template <class S>
Pass pick(optim::Isa isa, bool nt, bool out, bool nt_out, bool prefetch) {
  return prefetch ? pick_stores<S, true>(isa, nt, out, nt_out) : pick_stores<S, false>(isa, nt, out, nt_out);
}

bool aligned(const void* x, std::size_t a) { return reinterpret_cast<std::uintptr_t>(x) % a == 0; }

template <class S>
void run_bound(tbb::task_arena& arena, float* p, S* m, S* v, const float* g, std::uint16_t* out, std::size_t n,
               optim::Stores stores) {
  const float zero = g_zero;
  // Same alignment rule as CpuAdam::step; chunks keep the base alignment.
  const bool can_stream = aligned(p, 64) && aligned(m, 64) && aligned(v, 64) && (!out || aligned(out, 32));
  const bool nt = stores.in_place == optim::StoreKind::nontemporal && can_stream;
  const bool nt_out = out && (nt || (stores.half_out == optim::StoreKind::nontemporal && aligned(out, 32)));
  const Pass pass = pick<S>(optim::active_isa(), nt, out != nullptr, nt_out, stores.prefetch);
  const std::size_t chunk = optim::CpuAdam::kChunk, chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t c = r.begin(); c != r.end(); ++c) pass(p, m, v, g, out, c * chunk, std::min(n, (c + 1) * chunk), zero);
    });
  });
}

}  // namespace

void stream_bound_pass(tbb::task_arena& arena, float* p, float* m, float* v, const float* g, std::uint16_t* out,
                       std::size_t n, optim::Stores stores) {
  run_bound(arena, p, m, v, g, out, n, stores);
}

void stream_bound_pass(tbb::task_arena& arena, float* p, std::uint16_t* m, std::uint16_t* v, const float* g,
                       std::uint16_t* out, std::size_t n, optim::Stores stores) {
  run_bound(arena, p, m, v, g, out, n, stores);
}

}  // namespace zoe::bench
