// CUDA kernels of the Device's elementwise ops and of the deterministic rank reduction.
// The per-element math is the ZOE_HD code the host device runs (elementwise.hpp,
// reduce.hpp); only the launch shapes live here.
#include <cuda_runtime.h>

#include "kernels/elementwise.hpp"
#include "kernels/elementwise_cuda.hpp"
#include "kernels/reduce.hpp"

namespace zoe::kernels::cuda {
namespace {
constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 8192;  // grid-stride loops cover the rest

unsigned blocks_for(std::size_t n) {
  std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

#define ZOE_GRID_STRIDE(i, n)                                                               \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

__global__ void fill_kernel(void* dst, DType t, std::size_t n, float value) {
  ZOE_GRID_STRIDE(i, n) store_f32(dst, t, i, value);
}
__global__ void cast_kernel(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  ZOE_GRID_STRIDE(i, n) store_f32(dst, dt, i, load_f32(src, st, i));
}
__global__ void scale_kernel(void* x, DType t, std::size_t n, float factor) {
  ZOE_GRID_STRIDE(i, n) store_f32(x, t, i, scale_value(load_f32(x, t, i), factor));
}
__global__ void accumulate_kernel(const void* src, DType st, float* acc, std::size_t n) {
  ZOE_GRID_STRIDE(i, n) acc[i] = accumulate_value(acc[i], load_f32(src, st, i));
}

// Fixed tree reduction of kThreads doubles in shared memory; result in s[0].
__device__ void block_tree_sum(double* s) {
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    __syncthreads();
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
  }
  __syncthreads();
}

// Block b takes chunks b, b + gridDim.x, ... of kSumSquaresChunk elements; thread t sums
// its elements of each chunk (t, t + blockDim.x, ...) in order into one fp64 register.
__global__ void sum_squares_pass1(const void* x, DType t, std::size_t n, double* partials) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (std::size_t c = blockIdx.x; c * kSumSquaresChunk < n; c += gridDim.x) {
    std::size_t begin = c * kSumSquaresChunk;
    std::size_t end = begin + kSumSquaresChunk < n ? begin + kSumSquaresChunk : n;
    for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += square_f64(load_f32(x, t, i));
  }
  s[threadIdx.x] = acc;
  block_tree_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

__global__ void sum_squares_pass2(const double* partials, double* out) {
  __shared__ double s[kSumSquaresBlocks];
  s[threadIdx.x] = partials[threadIdx.x];
  block_tree_sum(s);
  if (threadIdx.x == 0) *out = s[0];
}

__global__ void reduce_ranks_kernel(const void* base, DType t, int world, std::size_t count, void* out, bool avg) {
  ZOE_GRID_STRIDE(i, count) store_f32(out, t, i, reduce_ranks_strided(base, t, world, count, i, avg));
}

__global__ void reduce_ranks_f64_kernel(const double* base, int world, std::size_t count, double* out) {
  ZOE_GRID_STRIDE(i, count) out[i] = reduce_ranks_strided_f64(base, world, count, i);
}

int last_error() { return static_cast<int>(cudaGetLastError()); }
}  // namespace

int fill(void* dst, DType t, std::size_t n, float value, void* stream) {
  if (n == 0) return 0;
  fill_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, t, n, value);
  return last_error();
}

int cast(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n, void* stream) {
  if (n == 0) return 0;
  cast_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(src, src_t, dst, dst_t, n);
  return last_error();
}

int scale(void* x, DType t, std::size_t n, float factor, void* stream) {
  if (n == 0) return 0;
  scale_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, t, n, factor);
  return last_error();
}

int accumulate(const void* src, DType src_t, float* acc, std::size_t n, void* stream) {
  if (n == 0) return 0;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(src, src_t, acc, n);
  return last_error();
}

int sum_squares(const void* x, DType t, std::size_t n, double* out, double* partials, void* stream) {
  static_assert(kSumSquaresBlocks <= 1024 && (kSumSquaresBlocks & (kSumSquaresBlocks - 1)) == 0,
                "pass 2 runs one thread per partial in a power-of-two tree");
  sum_squares_pass1<<<kSumSquaresBlocks, kThreads, 0, as_stream(stream)>>>(x, t, n, partials);
  sum_squares_pass2<<<1, kSumSquaresBlocks, 0, as_stream(stream)>>>(partials, out);
  return last_error();
}

int reduce_ranks(const void* base, DType t, int world, std::size_t count, void* out, bool avg, void* stream) {
  if (count == 0) return 0;
  reduce_ranks_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(base, t, world, count, out, avg);
  return last_error();
}

int reduce_ranks_f64(const double* base, int world, std::size_t count, double* out, void* stream) {
  if (count == 0) return 0;
  reduce_ranks_f64_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(base, world, count, out);
  return last_error();
}

}  // namespace zoe::kernels::cuda
