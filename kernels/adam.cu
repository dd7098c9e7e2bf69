// The device optimizer's CUDA kernel: kernels::adam_update (adam_math.hpp, shared with the
// host device and the CPU optimizer) per element, grid-stride. The target is compiled with
// --fmad=false (kernels/CMakeLists.txt) so no multiply-add is contracted and the result is
// bitwise the host's.
#include <cuda_runtime.h>

#include "kernels/adam_math.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/elementwise_cuda.hpp"

namespace zoe::kernels::cuda {
namespace {
constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 8192;

__global__ void adam_kernel(AdamCoeffs c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
                            DType grad_t, void* out, DType out_t, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float p = master[i], m = exp_avg[i], v = exp_avg_sq[i];
    adam_update(c, load_f32(grad, grad_t, i), p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (out) store_f32(out, out_t, i, p);
  }
}
}  // namespace

int adam_step(const AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_t,
              void* out, DType out_t, std::size_t n, void* stream) {
  if (n == 0) return 0;
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  adam_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      c, master, exp_avg, exp_avg_sq, grad, grad_t, out, out_t, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace zoe::kernels::cuda
