// AVX-512 kernels (F/BW/VL/DQ; AVX512_BF16's vcvtneps2bf16 when the CPU has it). This file alone
// is compiled with the AVX-512 -m flags and is called only after CPUID allows it. The update
// repeats kernels/adam_math.hpp's operations in its order with separate multiplies and adds
// (-ffp-contract=off), so it is bitwise equal to the scalar path. With bf16 states the moments
// are widened on load and rounded (round to nearest even, as kernels::f32_to_bf16) after the
// weight update, 32 elements per iteration so each moment's store is one whole 64-byte line.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "src/optim/adam_kernels.hpp"

namespace zoe::optim::detail {
namespace {

enum class Out { none, bf16, f16 };

template <DType G>
__m512 load_grad16(const void* grad, std::size_t i) {
  if constexpr (G == DType::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (G == DType::bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

// fp32 -> bf16 by integer round-to-nearest-even, exactly kernels::f32_to_bf16.
__m256i bf16_round_int(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet_nan));
}

// fp32 -> bf16 with vcvtneps2bf16 (RNE, NaN -> quiet NaN). That instruction treats denormal
// inputs as zero, so lanes with |x| < 2^-126 take the integer path: same bits as f32_to_bf16.
__m256i bf16_round_cvt(__m512 x) {
  __m256i r = (__m256i)_mm512_cvtneps_pbh(x);
  const __m512i abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 tiny = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(0x00800000));
  if (tiny) r = _mm256_mask_blend_epi16(tiny, r, bf16_round_int(x));
  return r;
}

// bf16_round_cvt with the denormal test done by vfpclassps (one instruction instead of a mask
// and a compare): the same bits. Zeros need no fix (vcvtneps2bf16 keeps their sign).
__m256i bf16_round_cvt_fpclass(__m512 x) {
  __m256i r = (__m256i)_mm512_cvtneps_pbh(x);
  const __mmask16 tiny = _mm512_fpclass_ps_mask(x, 0x20);  // denormal
  if (tiny) r = _mm256_mask_blend_epi16(tiny, r, bf16_round_int(x));
  return r;
}

// 32 lanes (lo: 0-15, hi: 16-31) -> 32 bf16, exactly kernels::f32_to_bf16 per lane: with Cvt
// one vcvtne2ps2bf16, denormal lanes redone by the integer path (as bf16_round_cvt_fpclass).
template <bool Cvt>
__m512i bf16_round32(__m512 lo, __m512 hi) {
  auto join = [](__m256i l, __m256i h) { return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1); };
  if constexpr (Cvt) {
    __m512i r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __mmask32 tiny = _mm512_kunpackw(_mm512_fpclass_ps_mask(hi, 0x20), _mm512_fpclass_ps_mask(lo, 0x20));
    if (tiny) r = _mm512_mask_blend_epi16(tiny, r, join(bf16_round_int(lo), bf16_round_int(hi)));
    return r;
  } else {
    return join(bf16_round_int(lo), bf16_round_int(hi));
  }
}

// The bf16 copy of the weights p[begin, end) (end - begin a multiple of 16) redone by the integer
// rounding where a weight is denormal (vcvtneps2bf16 flushed those to zero).
void fix_denormal_copy(const float* p, std::uint16_t* out, std::size_t begin, std::size_t end) {
  for (std::size_t j = begin; j < end; j += 16) {
    const __m512 x = _mm512_loadu_ps(p + j);
    const __mmask16 tiny = _mm512_fpclass_ps_mask(x, 0x20);
    if (tiny) _mm256_mask_storeu_epi16(out + j, tiny, bf16_round_int(x));
  }
}

// 32 bf16 to a 64-byte line (dst 64-byte aligned when Stream).
template <bool Stream>
void store_bf16x32(std::uint16_t* dst, __m512i h) {
  if constexpr (Stream) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), h);
  else _mm512_storeu_si512(dst, h);
}

template <bool Stream>
void store16(float* dst, __m512 x) {
  if constexpr (Stream) _mm512_stream_ps(dst, x);
  else _mm512_storeu_ps(dst, x);
}

template <bool Stream>
void store_half16(std::uint16_t* dst, __m256i h) {
  if constexpr (Stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
}

// SB: bf16 states (m, v loaded as bf16 and widened, stored rounded like the bf16 copy after the
// weight update used their fp32 values); else fp32 states. Bf16Cvt: vcvtneps2bf16 for every bf16
// rounding (copy and states), else the integer rounding; same bits.
template <DType G, Out O, bool Stream, bool StreamOut, bool Bf16Cvt, bool Prefetch, bool SB>
void adam_range(const AdamArgs& a, std::size_t begin, std::size_t end) {
  const kernels::AdamCoeffs& c = a.c;
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale), l2 = _mm512_set1_ps(c.l2);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1), one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(c.bias_correction2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  const bool has_l2 = c.l2 != 0.0f;
  using S = std::conditional_t<SB, std::uint16_t, float>;
  constexpr DType state_dtype = SB ? DType::bf16 : DType::f32;
  auto bf16_round = [](__m512 x) {
    if constexpr (!Bf16Cvt) return bf16_round_int(x);
    else if constexpr (SB) return bf16_round_cvt_fpclass(x);
    else return bf16_round_cvt(x);
  };
  float* __restrict p_ptr = a.p;
  S* __restrict m_ptr = static_cast<S*>(a.m);
  S* __restrict v_ptr = static_cast<S*>(a.v);
  auto* __restrict out = static_cast<std::uint16_t*>(a.out);
  std::size_t i = begin;
  const char* grad_bytes = static_cast<const char*>(a.grad);
  constexpr std::size_t grad_size = G == DType::f32 ? 4 : 2;
  [[maybe_unused]] __mmask16 denormal_p = 0;  // some weight of the 32-element loop is denormal
  [[maybe_unused]] const std::size_t begin32 = i;
  if constexpr (SB) {
    // bf16 states, 32 elements per iteration: each moment's (and a bf16 copy's) 32 values are
    // rounded together (one vcvtne2ps2bf16 with Bf16Cvt) and stored as one 64-byte line.
    auto update16 = [&](std::size_t j, __m512& p, __m512& m, __m512& v) __attribute__((always_inline)) {
      __m512 g = _mm512_mul_ps(load_grad16<G>(a.grad, j), grad_scale);
      p = _mm512_loadu_ps(p_ptr + j);
      m = load_grad16<DType::bf16>(m_ptr, j);
      v = load_grad16<DType::bf16>(v_ptr, j);
      if (has_l2) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
      p = _mm512_mul_ps(p, decay);
      m = _mm512_add_ps(_mm512_mul_ps(m, beta1), _mm512_mul_ps(one_minus_beta1, g));
      v = _mm512_add_ps(_mm512_mul_ps(v, beta2), _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
      const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2_sqrt), eps);
      p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
      store16<Stream>(p_ptr + j, p);
      if constexpr (O == Out::f16)
        store_half16<StreamOut>(out + j, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    };
    for (; i + 32 <= end; i += 32) {
      if constexpr (Prefetch) {
        for (std::size_t j : {i, i + 16}) {
          _mm_prefetch(reinterpret_cast<const char*>(p_ptr + j + kPrefetchElements), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(m_ptr + j + kPrefetchElements), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v_ptr + j + kPrefetchElements), _MM_HINT_T0);
          _mm_prefetch(grad_bytes + (j + kPrefetchElements) * grad_size, _MM_HINT_T0);
        }
      }
      __m512 p0, m0, v0, p1, m1, v1;
      update16(i, p0, m0, v0);
      update16(i + 16, p1, m1, v1);
      store_bf16x32<Stream>(m_ptr + i, bf16_round32<Bf16Cvt>(m0, m1));
      store_bf16x32<Stream>(v_ptr + i, bf16_round32<Bf16Cvt>(v0, v1));
      if constexpr (O == Out::bf16) {
        // The copy's denormal test is not branched on here: p ends a long dependency chain (sqrt,
        // two divides), and a branch on it cost about a tenth of the loop's time (weights in
        // cache, Zen 5); denormal lanes are noted and redone from the stored weights after the
        // loop (fix_denormal_copy).
        __m512i h;
        if constexpr (Bf16Cvt) {
          h = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
          denormal_p |= _mm512_fpclass_ps_mask(p0, 0x20) | _mm512_fpclass_ps_mask(p1, 0x20);
        } else {
          h = bf16_round32<false>(p0, p1);
        }
        if constexpr (StreamOut) {  // out is 32-byte aligned only: two half-line streams
          _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), _mm512_castsi512_si256(h));
          _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + 16), _mm512_extracti64x4_epi64(h, 1));
        } else {
          _mm512_storeu_si512(out + i, h);
        }
      }
    }
  }
  [[maybe_unused]] const std::size_t end32 = i;
  for (; i + 16 <= end; i += 16) {  // 16 fp32 = one 64-byte line per array and iteration
    if constexpr (Prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(grad_bytes + (i + kPrefetchElements) * grad_size, _MM_HINT_T0);
    }
    __m512 g = _mm512_mul_ps(load_grad16<G>(a.grad, i), grad_scale);
    __m512 p = _mm512_loadu_ps(p_ptr + i);
    __m512 m = load_grad16<state_dtype>(m_ptr, i);
    __m512 v = load_grad16<state_dtype>(v_ptr, i);
    if (has_l2) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
    p = _mm512_mul_ps(p, decay);
    m = _mm512_add_ps(_mm512_mul_ps(m, beta1), _mm512_mul_ps(one_minus_beta1, g));
    v = _mm512_add_ps(_mm512_mul_ps(v, beta2), _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2_sqrt), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
    store16<Stream>(p_ptr + i, p);
    if constexpr (SB) {
      store_half16<Stream>(m_ptr + i, bf16_round(m));
      store_half16<Stream>(v_ptr + i, bf16_round(v));
    } else {
      store16<Stream>(m_ptr + i, m);
      store16<Stream>(v_ptr + i, v);
    }
    if constexpr (O == Out::bf16) store_half16<StreamOut>(out + i, bf16_round(p));
    if constexpr (O == Out::f16)
      store_half16<StreamOut>(out + i, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if constexpr (Stream || StreamOut) _mm_sfence();  // order the weakly-ordered stores before the task ends
  if constexpr (SB && O == Out::bf16 && Bf16Cvt)
    if (denormal_p) fix_denormal_copy(p_ptr, out, begin32, end32);
  if (i < end) adam_scalar_range(a, i, end);
}

template <DType G, Out O, bool Stream, bool StreamOut, bool Bf16Cvt, bool SB>
void adam_pick_prefetch(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch) adam_range<G, O, Stream, StreamOut, Bf16Cvt, true, SB>(a, begin, end);
  else adam_range<G, O, Stream, StreamOut, Bf16Cvt, false, SB>(a, begin, end);
}

// fp32 states: the conversion matters for a bf16 copy only; bf16 states: always.
template <DType G, Out O, bool Stream, bool StreamOut>
void adam_pick_cvt(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.bf16_states) {
    if (a.bf16_convert) adam_pick_prefetch<G, O, Stream, StreamOut, true, true>(a, begin, end);
    else adam_pick_prefetch<G, O, Stream, StreamOut, false, true>(a, begin, end);
  } else if constexpr (O == Out::bf16) {
    if (a.bf16_convert) adam_pick_prefetch<G, O, Stream, StreamOut, true, false>(a, begin, end);
    else adam_pick_prefetch<G, O, Stream, StreamOut, false, false>(a, begin, end);
  } else {
    adam_pick_prefetch<G, O, Stream, StreamOut, false, false>(a, begin, end);
  }
}

template <DType G, Out O>
void adam_pick_store(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if constexpr (O == Out::none) {
    if (a.stream) adam_pick_cvt<G, O, true, false>(a, begin, end);
    else adam_pick_cvt<G, O, false, false>(a, begin, end);
  } else {
    // In-place streaming with an ordinary half copy is never chosen (CpuAdam's candidates).
    if (a.stream) adam_pick_cvt<G, O, true, true>(a, begin, end);
    else if (a.stream_out) adam_pick_cvt<G, O, false, true>(a, begin, end);
    else adam_pick_cvt<G, O, false, false>(a, begin, end);
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

// The lanes of one chunk's sum (kernels::kSumSquaresChunk's order): element i of the chunk goes
// to lane i % 32, acc[0] holding lanes 0-7, acc[1] 8-15, acc[2] 16-23, acc[3] 24-31, so 32
// consecutive elements are one add into each accumulator (four independent chains).
struct ChunkLanes {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  /// Adds the squares of the chunk's 16 elements from `half` * 16 of a 32-element step.
  void add(__m512 x, int half) {
    const __m512d dl = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d dh = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    acc[2 * half] = _mm512_add_pd(acc[2 * half], _mm512_mul_pd(dl, dl));
    acc[2 * half + 1] = _mm512_add_pd(acc[2 * half + 1], _mm512_mul_pd(dh, dh));
  }
  /// The chunk's sum: its lanes left to right (chunk_sum_of_lanes, the scalar path's).
  double sum() const {
    alignas(64) double lanes[32];
    for (int k = 0; k < 4; ++k) _mm512_store_pd(lanes + 8 * k, acc[k]);
    return chunk_sum_of_lanes(lanes);
  }
};
static_assert(kernels::kSumSquaresLanes == 32);

// KernelTable::chunk_sums: each whole chunk in 32 lanes (ChunkLanes), 32 elements a step; a
// partial chunk at the end of the range goes to the scalar loop.
template <DType S>
void chunk_sums_t(const void* x, std::size_t begin, std::size_t end, double* sums) {
  constexpr std::size_t C = kGradSumChunk;
  std::size_t b = begin;
  for (; b + C <= end; b += C) {
    ChunkLanes lanes;
    for (std::size_t k = 0; k < C; k += 32) {
      lanes.add(load_grad16<S>(x, b + k), 0);
      lanes.add(load_grad16<S>(x, b + k + 16), 1);
    }
    sums[(b - begin) / C] = lanes.sum();
  }
  if (b < end) chunk_sums_scalar(x, S, b, end, sums + (b - begin) / C);
}

void chunk_sums(const void* x, DType dtype, std::size_t begin, std::size_t end, double* sums) {
  switch (dtype) {
    case DType::f32: chunk_sums_t<DType::f32>(x, begin, end, sums); return;
    case DType::bf16: chunk_sums_t<DType::bf16>(x, begin, end, sums); return;
    case DType::f16: chunk_sums_t<DType::f16>(x, begin, end, sums); return;
  }
}

// Each whole chunk in 32 lanes (ChunkLanes, the order kernels::kSumSquaresChunk documents), 32
// elements a step: loaded, added (fp32), stored (whole 64-byte lines, in order: non-temporal
// stores stay write-combined), squared into the lanes. Finiteness needs no test per element: a
// square of a finite fp32 is finite in fp64 (< 2^256) and a chunk sum of them too, while an inf
// or NaN element makes its chunk sum inf or NaN for good (squares are >= 0, so no inf - inf);
// CpuAdam::add_grad checks the sums. A partial chunk at the end goes to the scalar loop.
template <DType S, bool First, bool Stream>
bool add_grad_t(const void* src, float* grad, std::size_t begin, std::size_t end, double* sums) {
  constexpr std::size_t C = kGradSumChunk;
  std::size_t b = begin;
  for (; b + C <= end; b += C) {
    ChunkLanes lanes;
    for (std::size_t k = 0; k < C; k += 32) {
      for (int half = 0; half < 2; ++half) {
        const std::size_t i = b + k + 16 * static_cast<std::size_t>(half);
        __m512 x = load_grad16<S>(src, i);
        if constexpr (!First) x = _mm512_add_ps(_mm512_loadu_ps(grad + i), x);
        if constexpr (Stream) _mm512_stream_ps(grad + i, x);
        else _mm512_storeu_ps(grad + i, x);
        lanes.add(x, half);
      }
    }
    sums[(b - begin) / C] = lanes.sum();
  }
  if constexpr (Stream) _mm_sfence();  // order the weakly-ordered stores before the task ends
  if (b == end) return true;
  return add_grad_scalar(src, S, grad, First, false, b, end, sums + (b - begin) / C);
}

template <DType S>
bool add_grad_pick(const void* src, float* grad, bool first, bool stream, std::size_t begin, std::size_t end,
                   double* sums) {
  if (first) return stream ? add_grad_t<S, true, true>(src, grad, begin, end, sums)
                           : add_grad_t<S, true, false>(src, grad, begin, end, sums);
  return stream ? add_grad_t<S, false, true>(src, grad, begin, end, sums)
                : add_grad_t<S, false, false>(src, grad, begin, end, sums);
}

bool add_grad(const void* src, DType src_dtype, float* grad, bool first, bool stream, std::size_t begin,
              std::size_t end, double* sums) {
  switch (src_dtype) {
    case DType::f32: return add_grad_pick<DType::f32>(src, grad, first, stream, begin, end, sums);
    case DType::bf16: return add_grad_pick<DType::bf16>(src, grad, first, stream, begin, end, sums);
    case DType::f16: return add_grad_pick<DType::f16>(src, grad, first, stream, begin, end, sums);
  }
  return true;
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table{adam, chunk_sums, add_grad};
  return table;
}

}  // namespace zoe::optim::detail
