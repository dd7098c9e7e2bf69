// AVX2 + F16C kernels. This file alone is compiled with -mavx2 -mf16c and is called only after
// CPUID allows it. Same operations in the same order as kernels/adam_math.hpp, no FMA
// contraction (-ffp-contract=off), so bitwise equal to the scalar path. With bf16 states the
// moments are widened on load and rounded (round to nearest even, as kernels::f32_to_bf16) after
// the weight update, 16 per store.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "src/optim/adam_kernels.hpp"

namespace zoe::optim::detail {
namespace {

enum class Out { none, bf16, f16 };

template <DType G>
__m256 load8(const void* x, std::size_t i) {
  if constexpr (G == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(x) + i));
    if constexpr (G == DType::bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

// fp32 -> bf16 by integer round-to-nearest-even, exactly kernels::f32_to_bf16.
__m128i bf16_round(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, nan);
  // Narrow 8 x u32 (each <= 0xffff) to 8 x u16: pack within 128-bit lanes, then gather qwords 0, 2.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

// bf16 states, 16 at a time. fp32 -> bf16 round to nearest even as 8 x u32 lanes (<= 0xffff):
// without NaN handling (the caller checked there is no NaN), and with it (exactly bf16_round).
__m256i bf16_round_u32_no_nan(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
__m256i bf16_round_u32(__m256 x) {
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(bf16_round_u32_no_nan(x), quiet_nan, nan);
}
// Lanes 0-7 from lo, 8-15 from hi, narrowed to 16 x u16 in order (packus interleaves 128-bit halves).
__m256i pack_bf16x16(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

template <bool Stream>
void store_bf16x16(std::uint16_t* dst, __m256i h) {
  if constexpr (Stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
}

template <bool Stream>
void store8(float* dst, __m256 x) {
  if constexpr (Stream) _mm256_stream_ps(dst, x);
  else _mm256_storeu_ps(dst, x);
}

template <bool Stream>
void store_half8(std::uint16_t* dst, __m128i h) {
  if constexpr (Stream) _mm_stream_si128(reinterpret_cast<__m128i*>(dst), h);
  else _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
}

// SB: bf16 states (m, v loaded as bf16 and widened, rounded to bf16 and stored after the weight
// update used their fp32 values); else fp32 states.
template <DType G, Out O, bool Stream, bool StreamOut, bool Prefetch, bool SB>
void adam_range(const AdamArgs& a, std::size_t begin, std::size_t end) {
  const kernels::AdamCoeffs& c = a.c;
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale), l2 = _mm256_set1_ps(c.l2);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 bc2_sqrt = _mm256_set1_ps(c.bias_correction2_sqrt), eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  const bool has_l2 = c.l2 != 0.0f;
  using S = std::conditional_t<SB, std::uint16_t, float>;
  constexpr DType state_dtype = SB ? DType::bf16 : DType::f32;
  float* __restrict p_ptr = a.p;
  S* __restrict m_ptr = static_cast<S*>(a.m);
  S* __restrict v_ptr = static_cast<S*>(a.v);
  auto* __restrict out = static_cast<std::uint16_t*>(a.out);
  const char* grad_bytes = static_cast<const char*>(a.grad);
  constexpr std::size_t grad_size = G == DType::f32 ? 4 : 2;
  // Elements [j, j + 8): the update, the weights and their copy stored; fp32 states stored too,
  // bf16 states returned in m, v (fp32) for the caller to round. Always inlined: an out-of-line
  // copy would reload the captured constants on every call.
  auto update8 = [&](std::size_t j, __m256& m, __m256& v) __attribute__((always_inline)) {
    __m256 g = _mm256_mul_ps(load8<G>(a.grad, j), grad_scale);
    __m256 p = _mm256_loadu_ps(p_ptr + j);
    m = load8<state_dtype>(m_ptr, j);
    v = load8<state_dtype>(v_ptr, j);
    if (has_l2) g = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
    p = _mm256_mul_ps(p, decay);
    m = _mm256_add_ps(_mm256_mul_ps(m, beta1), _mm256_mul_ps(one_minus_beta1, g));
    v = _mm256_add_ps(_mm256_mul_ps(v, beta2), _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom));
    store8<Stream>(p_ptr + j, p);
    if constexpr (!SB) {
      store8<Stream>(m_ptr + j, m);
      store8<Stream>(v_ptr + j, v);
    }
    if constexpr (O == Out::bf16) store_half8<StreamOut>(out + j, bf16_round(p));
    if constexpr (O == Out::f16)
      store_half8<StreamOut>(out + j, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  };
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {  // 16 fp32 = one 64-byte line per array and iteration
    if constexpr (Prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(grad_bytes + (i + kPrefetchElements) * grad_size, _MM_HINT_T0);
    }
    __m256 m0, v0, m1, v1;
    update8(i, m0, v0);
    update8(i + 8, m1, v1);
    if constexpr (SB) {
      // 16 bf16 per moment, one 32-byte store each. NaN moments are rare: one unordered compare
      // of m against v finds any, and only then does the rounding take NaN's separate path.
      const __m256 nan = _mm256_or_ps(_mm256_cmp_ps(m0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(m1, v1, _CMP_UNORD_Q));
      __m256i mh, vh;
      if (_mm256_testz_ps(nan, nan)) {
        mh = pack_bf16x16(bf16_round_u32_no_nan(m0), bf16_round_u32_no_nan(m1));
        vh = pack_bf16x16(bf16_round_u32_no_nan(v0), bf16_round_u32_no_nan(v1));
      } else {
        mh = pack_bf16x16(bf16_round_u32(m0), bf16_round_u32(m1));
        vh = pack_bf16x16(bf16_round_u32(v0), bf16_round_u32(v1));
      }
      store_bf16x16<Stream>(m_ptr + i, mh);
      store_bf16x16<Stream>(v_ptr + i, vh);
    }
  }
  if (i + 8 <= end) {
    __m256 m, v;
    update8(i, m, v);
    if constexpr (SB) {
      store_half8<Stream>(m_ptr + i, bf16_round(m));
      store_half8<Stream>(v_ptr + i, bf16_round(v));
    }
    i += 8;
  }
  if constexpr (Stream || StreamOut) _mm_sfence();  // order the weakly-ordered stores before the task ends
  if (i < end) adam_scalar_range(a, i, end);
}

template <DType G, Out O, bool Stream, bool StreamOut, bool Prefetch>
void adam_pick_states(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.bf16_states) adam_range<G, O, Stream, StreamOut, Prefetch, true>(a, begin, end);
  else adam_range<G, O, Stream, StreamOut, Prefetch, false>(a, begin, end);
}

template <DType G, Out O, bool Stream, bool StreamOut>
void adam_pick_prefetch(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch) adam_pick_states<G, O, Stream, StreamOut, true>(a, begin, end);
  else adam_pick_states<G, O, Stream, StreamOut, false>(a, begin, end);
}

template <DType G, Out O>
void adam_pick_store(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if constexpr (O == Out::none) {
    if (a.stream) adam_pick_prefetch<G, O, true, false>(a, begin, end);
    else adam_pick_prefetch<G, O, false, false>(a, begin, end);
  } else {
    // In-place streaming with an ordinary half copy is never chosen (CpuAdam's candidates).
    if (a.stream) adam_pick_prefetch<G, O, true, true>(a, begin, end);
    else if (a.stream_out) adam_pick_prefetch<G, O, false, true>(a, begin, end);
    else adam_pick_prefetch<G, O, false, false>(a, begin, end);
  }
}

template <DType G>
void adam_pick_out(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (!a.out) adam_pick_store<G, Out::none>(a, begin, end);
  else if (a.out_dtype == DType::bf16) adam_pick_store<G, Out::bf16>(a, begin, end);
  else adam_pick_store<G, Out::f16>(a, begin, end);
}

void adam(const AdamArgs& a, std::size_t begin, std::size_t end) {
  switch (a.grad_dtype) {
    case DType::f32: adam_pick_out<DType::f32>(a, begin, end); break;
    case DType::bf16: adam_pick_out<DType::bf16>(a, begin, end); break;
    case DType::f16: adam_pick_out<DType::f16>(a, begin, end); break;
  }
}

// Squares 8 floats into lanes [0, 4) and [4, 8) of two fp64 accumulators (exact products).

}  // namespace

const KernelTable& avx2_kernels() {
  // add_grad: the scalar loop (its fp64 sums are in index order per chunk; only the AVX-512
  // path has the chunk-transposed vector version).
  static const KernelTable table{adam, chunk_sums_scalar, add_grad_scalar};
  return table;
}

}  // namespace zoe::optim::detail
