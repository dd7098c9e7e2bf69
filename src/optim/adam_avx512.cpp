// AVX-512 kernels (F/BW/VL/DQ; AVX512_BF16's vcvtneps2bf16 when the CPU has it). This file alone
// is compiled with the AVX-512 -m flags and is called only after CPUID allows it. The update
// repeats kernels/adam_math.hpp's operations in its order with separate multiplies and adds
// (-ffp-contract=off), so it is bitwise equal to the scalar path.
#include <immintrin.h>

#include <cstdint>

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

template <DType G, Out O, bool Stream, bool StreamOut, bool Bf16Cvt, bool Prefetch>
void adam_range(const AdamArgs& a, std::size_t begin, std::size_t end) {
  const kernels::AdamCoeffs& c = a.c;
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale), l2 = _mm512_set1_ps(c.l2);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1), one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(c.bias_correction2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  const bool has_l2 = c.l2 != 0.0f;
  float* __restrict p_ptr = a.p;
  float* __restrict m_ptr = a.m;
  float* __restrict v_ptr = a.v;
  auto* __restrict out = static_cast<std::uint16_t*>(a.out);
  std::size_t i = begin;
  const char* grad_bytes = static_cast<const char*>(a.grad);
  constexpr std::size_t grad_size = G == DType::f32 ? 4 : 2;
  for (; i + 16 <= end; i += 16) {  // 16 fp32 = one 64-byte line per array and iteration
    if constexpr (Prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v_ptr + i + kPrefetchElements), _MM_HINT_T0);
      _mm_prefetch(grad_bytes + (i + kPrefetchElements) * grad_size, _MM_HINT_T0);
    }
    __m512 g = _mm512_mul_ps(load_grad16<G>(a.grad, i), grad_scale);
    __m512 p = _mm512_loadu_ps(p_ptr + i);
    __m512 m = _mm512_loadu_ps(m_ptr + i);
    __m512 v = _mm512_loadu_ps(v_ptr + i);
    if (has_l2) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
    p = _mm512_mul_ps(p, decay);
    m = _mm512_add_ps(_mm512_mul_ps(m, beta1), _mm512_mul_ps(one_minus_beta1, g));
    v = _mm512_add_ps(_mm512_mul_ps(v, beta2), _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2_sqrt), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
    store16<Stream>(p_ptr + i, p);
    store16<Stream>(m_ptr + i, m);
    store16<Stream>(v_ptr + i, v);
    if constexpr (O == Out::bf16) store_half16<StreamOut>(out + i, Bf16Cvt ? bf16_round_cvt(p) : bf16_round_int(p));
    if constexpr (O == Out::f16)
      store_half16<StreamOut>(out + i, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if constexpr (Stream || StreamOut) _mm_sfence();  // order the weakly-ordered stores before the task ends
  if (i < end) adam_scalar_range(a, i, end);
}

template <DType G, Out O, bool Stream, bool StreamOut, bool Bf16Cvt>
void adam_pick_prefetch(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.prefetch) adam_range<G, O, Stream, StreamOut, Bf16Cvt, true>(a, begin, end);
  else adam_range<G, O, Stream, StreamOut, Bf16Cvt, false>(a, begin, end);
}

template <DType G, Out O, bool Stream, bool StreamOut>
void adam_pick_cvt(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (O == Out::bf16 && a.bf16_convert) adam_pick_prefetch<G, O, Stream, StreamOut, true>(a, begin, end);
  else adam_pick_prefetch<G, O, Stream, StreamOut, false>(a, begin, end);
}

template <DType G, Out O>
void adam_pick_store(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if constexpr (O == Out::none) {
    if (a.stream) adam_pick_prefetch<G, O, true, false, false>(a, begin, end);
    else adam_pick_prefetch<G, O, false, false, false>(a, begin, end);
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

// Squares 16 floats into lanes [0, 8) and [8, 16) of two fp64 accumulators (exact products).
void add_squares16(__m512 x, __m512d& lo, __m512d& hi) {
  const __m512d dlo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d dhi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
  lo = _mm512_add_pd(lo, _mm512_mul_pd(dlo, dlo));
  hi = _mm512_add_pd(hi, _mm512_mul_pd(dhi, dhi));
}

template <DType D>
double sum_squares_t(const void* x, std::size_t begin, std::size_t end) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __m512d acc2 = _mm512_setzero_pd(), acc3 = _mm512_setzero_pd();
  std::size_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes) {
    add_squares16(load_grad16<D>(x, i), acc0, acc1);
    add_squares16(load_grad16<D>(x, i + 16), acc2, acc3);
  }
  alignas(64) double acc[kSumLanes];
  _mm512_store_pd(acc, acc0);
  _mm512_store_pd(acc + 8, acc1);
  _mm512_store_pd(acc + 16, acc2);
  _mm512_store_pd(acc + 24, acc3);
  sum_squares_scalar_lanes(acc, x, D, i, end);
  return reduce_lanes(acc);
}

double sum_squares(const void* x, DType dtype, std::size_t begin, std::size_t end) {
  switch (dtype) {
    case DType::f32: return sum_squares_t<DType::f32>(x, begin, end);
    case DType::bf16: return sum_squares_t<DType::bf16>(x, begin, end);
    case DType::f16: return sum_squares_t<DType::f16>(x, begin, end);
  }
  return 0.0;
}

bool all_finite(const void* x, DType dtype, std::size_t begin, std::size_t end) {
  std::size_t i = begin;
  if (dtype == DType::f32) {
    const auto* f = static_cast<const float*>(x);
    const __m512i exp = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (; i + 16 <= end; i += 16)
      bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(f + i)), exp), exp);
    if (bad) return false;
  } else {
    const auto* h = static_cast<const std::uint16_t*>(x);
    const __m512i exp = _mm512_set1_epi16(static_cast<short>(dtype == DType::bf16 ? 0x7f80 : 0x7c00));
    __mmask32 bad = 0;
    for (; i + 32 <= end; i += 32)
      bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(h + i), exp), exp);
    if (bad) return false;
  }
  return all_finite_scalar(x, dtype, i, end);
}

// 8 rows of 8 doubles -> 8 columns: c[k] lane j = r[j] lane k.
void transpose8x8(const __m512d r[8], __m512d c[8]) {
  __m512d t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm512_unpacklo_pd(r[2 * k], r[2 * k + 1]);      // r0[0] r1[0] r0[2] r1[2] ...
    t[2 * k + 1] = _mm512_unpackhi_pd(r[2 * k], r[2 * k + 1]);  // r0[1] r1[1] r0[3] r1[3] ...
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    __m512d* tt = t + 4 * h;
    __m512d* uu = u + 4 * h;
    uu[0] = _mm512_shuffle_f64x2(tt[0], tt[2], 0x88);  // (r0 r1)[0], [4], (r2 r3)[0], [4]
    uu[1] = _mm512_shuffle_f64x2(tt[1], tt[3], 0x88);  // [1], [5]
    uu[2] = _mm512_shuffle_f64x2(tt[0], tt[2], 0xdd);  // [2], [6]
    uu[3] = _mm512_shuffle_f64x2(tt[1], tt[3], 0xdd);  // [3], [7]
  }
  for (int k = 0; k < 4; ++k) {
    c[k] = _mm512_shuffle_f64x2(u[k], u[4 + k], 0x88);
    c[k + 4] = _mm512_shuffle_f64x2(u[k], u[4 + k], 0xdd);
  }
}

template <DType S>
__m256 load_src8(const void* src, std::size_t i) {
  if constexpr (S == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(src) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(src) + i));
    if constexpr (S == DType::bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

template <DType S>
__m512 load_src16(const void* src, std::size_t i) {
  if constexpr (S == DType::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(src) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(src) + i));
    if constexpr (S == DType::bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

// Blocks of 8 whole chunks: lane j of the fp64 accumulator sums chunk j, one element of each
// chunk per add, in index order (16 elements = one 64-byte line of each chunk loaded and stored,
// squared, transposed in two 8x8 halves), so each lane's sum is the scalar loop's. Whole lines
// per stream keep non-temporal stores write-combined (half lines over 8 streams ran 4x slower).
// Finiteness needs no test per element: a square of a finite fp32 is finite in fp64 (< 2^256)
// and a chunk sum of them too, while an inf or NaN element makes its chunk sum inf or NaN for
// good (squares are >= 0, so no inf - inf); CpuAdam::add_grad checks the sums. The rest of the
// range goes to the scalar loop.
template <DType S, bool First, bool Stream>
bool add_grad_t(const void* src, float* grad, std::size_t begin, std::size_t end, double* sums) {
  constexpr std::size_t C = kGradSumChunk;
  std::size_t b = begin;
  for (; b + 8 * C <= end; b += 8 * C) {
    __m512d acc = _mm512_setzero_pd();
    for (std::size_t k = 0; k < C; k += 16) {
      __m512d lo[8], hi[8], c[8];
      for (int j = 0; j < 8; ++j) {
        const std::size_t i = b + j * C + k;
        __m512 x = load_src16<S>(src, i);
        if constexpr (!First) x = _mm512_add_ps(_mm512_loadu_ps(grad + i), x);
        if constexpr (Stream) _mm512_stream_ps(grad + i, x);
        else _mm512_storeu_ps(grad + i, x);
        const __m512d dl = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        const __m512d dh = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
        lo[j] = _mm512_mul_pd(dl, dl);
        hi[j] = _mm512_mul_pd(dh, dh);
      }
      transpose8x8(lo, c);
      for (int e = 0; e < 8; ++e) acc = _mm512_add_pd(acc, c[e]);
      transpose8x8(hi, c);
      for (int e = 0; e < 8; ++e) acc = _mm512_add_pd(acc, c[e]);
    }
    _mm512_storeu_pd(sums + (b - begin) / C, acc);
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
  static const KernelTable table{adam, sum_squares, all_finite, add_grad};
  return table;
}

}  // namespace zoe::optim::detail
