// Scalar (portable) kernels: the reference path, and the tails of the vector paths.
#include <cstdint>

#include <algorithm>

#include "kernels/adam_math.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/half.hpp"
#include "src/optim/adam_kernels.hpp"

namespace zoe::optim::detail {
namespace {

float load_as_float(const void* x, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(x)[i];
    case DType::bf16: return kernels::bf16_to_f32(static_cast<const std::uint16_t*>(x)[i]);
    case DType::f16: return kernels::f16_to_f32(static_cast<const std::uint16_t*>(x)[i]);
  }
  return 0.0f;
}

template <DType G>
float load_as(const void* x, std::size_t i) {
  if constexpr (G == DType::f32) return static_cast<const float*>(x)[i];
  else if constexpr (G == DType::bf16) return kernels::bf16_to_f32(static_cast<const std::uint16_t*>(x)[i]);
  else return kernels::f16_to_f32(static_cast<const std::uint16_t*>(x)[i]);
}

// One dtype / output / state combination, with the coefficients in a local copy and unaliased
// pointers so the compiler keeps them in registers (and may use SSE2 vectors: same IEEE
// operations). S: the state type, float (fp32 states) or std::uint16_t (bf16 states: widened
// exactly, updated in fp32, the weight updated from those fp32 moments, then rounded to nearest even).
template <DType G, bool HasOut, DType O, class S>
void adam_loop(const AdamArgs& a, std::size_t begin, std::size_t end) {
  const kernels::AdamCoeffs c = a.c;
  float* __restrict pp = a.p;
  S* __restrict mp = static_cast<S*>(a.m);
  S* __restrict vp = static_cast<S*>(a.v);
  std::uint16_t* __restrict out = static_cast<std::uint16_t*>(a.out);
  for (std::size_t i = begin; i < end; ++i) {
    float p = pp[i], m, v;
    if constexpr (sizeof(S) == 4) {
      m = mp[i];
      v = vp[i];
    } else {
      m = kernels::bf16_to_f32(mp[i]);
      v = kernels::bf16_to_f32(vp[i]);
    }
    kernels::adam_update(c, load_as<G>(a.grad, i), p, m, v);
    pp[i] = p;
    if constexpr (sizeof(S) == 4) {
      mp[i] = m;
      vp[i] = v;
    } else {
      mp[i] = kernels::f32_to_bf16(m);
      vp[i] = kernels::f32_to_bf16(v);
    }
    if constexpr (HasOut) out[i] = O == DType::bf16 ? kernels::f32_to_bf16(p) : kernels::f32_to_f16(p);
  }
}

template <DType G, class S>
void adam_pick_out(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (!a.out) adam_loop<G, false, DType::bf16, S>(a, begin, end);
  else if (a.out_dtype == DType::bf16) adam_loop<G, true, DType::bf16, S>(a, begin, end);
  else adam_loop<G, true, DType::f16, S>(a, begin, end);
}

template <class S>
void adam_pick_grad(const AdamArgs& a, std::size_t begin, std::size_t end) {
  switch (a.grad_dtype) {
    case DType::f32: adam_pick_out<DType::f32, S>(a, begin, end); break;
    case DType::bf16: adam_pick_out<DType::bf16, S>(a, begin, end); break;
    case DType::f16: adam_pick_out<DType::f16, S>(a, begin, end); break;
  }
}

void adam_scalar_whole(const AdamArgs& a, std::size_t begin, std::size_t end) {
  adam_scalar_range(a, begin, end);
}

}  // namespace

void adam_scalar_range(const AdamArgs& a, std::size_t begin, std::size_t end) {
  if (a.bf16_states) adam_pick_grad<std::uint16_t>(a, begin, end);
  else adam_pick_grad<float>(a, begin, end);
}

namespace {
// Adds square(x) of element i of a chunk (counted from its start) to its lane, as
// kernels::kSumSquaresChunk documents.
inline void add_to_lane(double* lanes, std::size_t i, float x) { lanes[i % kernels::kSumSquaresLanes] += kernels::square_f64(x); }

// Lane 0 + lane 1 + ... + the last lane, left to right from 0: a chunk's sum.
double chunk_sum(const double* lanes) {
  double s = 0.0;
  for (std::size_t l = 0; l < kernels::kSumSquaresLanes; ++l) s += lanes[l];
  return s;
}

template <DType D>
void chunk_sums_typed(const void* x, std::size_t begin, std::size_t end, double* sums) {
  constexpr std::size_t C = kernels::kSumSquaresChunk;
  for (std::size_t c = begin; c < end; c += C) {
    const std::size_t m = std::min(end - c, C);
    double lanes[kernels::kSumSquaresLanes] = {};
    for (std::size_t i = 0; i < m; ++i) add_to_lane(lanes, i, load_as<D>(x, c + i));
    sums[(c - begin) / C] = chunk_sum(lanes);
  }
}
}  // namespace

void chunk_sums_scalar(const void* x, DType dtype, std::size_t begin, std::size_t end, double* sums) {
  switch (dtype) {
    case DType::f32: chunk_sums_typed<DType::f32>(x, begin, end, sums); return;
    case DType::bf16: chunk_sums_typed<DType::bf16>(x, begin, end, sums); return;
    case DType::f16: chunk_sums_typed<DType::f16>(x, begin, end, sums); return;
  }
}

double chunk_sum_of_lanes(const double* lanes) { return chunk_sum(lanes); }

bool add_grad_scalar(const void* src, DType src_dtype, float* grad, bool first, bool /*stream*/, std::size_t begin,
                     std::size_t end, double* sums) {
  bool finite = true;
  for (std::size_t c = begin; c < end; c += kernels::kSumSquaresChunk) {
    const std::size_t ce = std::min(end, c + kernels::kSumSquaresChunk);
    double lanes[kernels::kSumSquaresLanes] = {};
    for (std::size_t i = c; i < ce; ++i) {
      const float x = load_as_float(src, src_dtype, i);
      const float g = first ? x : kernels::accumulate_value(grad[i], x);
      grad[i] = g;
      add_to_lane(lanes, i - c, g);
      finite = finite && kernels::is_finite_f32(g);
    }
    sums[(c - begin) / kernels::kSumSquaresChunk] = chunk_sum(lanes);
  }
  return finite;
}

const KernelTable& scalar_kernels() {
  static const KernelTable table{adam_scalar_whole, chunk_sums_scalar, add_grad_scalar};
  return table;
}

}  // namespace zoe::optim::detail
