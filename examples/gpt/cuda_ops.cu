// CudaOps (cuda_ops.hpp): cuBLAS GEMMs and the GPT kernels. Every kernel is a launch shape
// around one kernel_math.hpp function (one thread per element / row / column, one warp per row of
// the cross-entropy), the same functions KernelOps runs on the host, so the CPU tests of
// KernelOps cover this file's math; what lives here is only the indexing, the launches and the
// GEMM operands.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt/cuda_ops.hpp"
#include "examples/gpt/error.hpp"
#include "examples/gpt/gemm_layout.hpp"
#include "examples/gpt/kernel_math.hpp"
#include "examples/gpt/storage_dtype.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {

std::string cuda_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}
[[noreturn]] void throw_cuda(cudaError_t err, const std::string& what, const char* file,
                             int line) {
  // A failed call also becomes the runtime's last error, which no successful call resets: clear
  // it, or the next launch check (cudaGetLastError) would report this failure again.
  cudaGetLastError();
  throw zoe::CudaError("CudaOps: " + what + ": " + cuda_text(err), static_cast<int>(err), file,
                       line);
}
[[noreturn]] void throw_cublas(cublasStatus_t st, const std::string& what, const char* file,
                               int line) {
  throw zoe::Error("CudaOps: " + what + ": " + cublasGetStatusName(st) + ": " +
                       cublasGetStatusString(st),
                   file, line);
}
// CUDA / cuBLAS call checks; the trailing arguments (streamed) name the call.
#define GPT_CUDA_CHECK(call, ...)                                                              \
  do {                                                                                         \
    const cudaError_t gpt_err_ = (call);                                                       \
    if (gpt_err_ != cudaSuccess)                                                               \
      throw_cuda(gpt_err_, ::gpt::detail::concat(__VA_ARGS__), __FILE__, __LINE__);            \
  } while (0)
#define GPT_CUBLAS_CHECK(call, ...)                                                            \
  do {                                                                                         \
    const cublasStatus_t gpt_st_ = (call);                                                     \
    if (gpt_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      throw_cublas(gpt_st_, ::gpt::detail::concat(__VA_ARGS__), __FILE__, __LINE__);           \
  } while (0)
// After a kernel launch: a bad configuration shows up in cudaGetLastError.
#define GPT_CUDA_LAUNCHED(name) GPT_CUDA_CHECK(cudaGetLastError(), "launching ", name)

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(b, 1, kMaxBlocks));
}

#define GPT_GRID_STRIDE(i, n)                                                                \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;   \
       i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------------------------------------
// Kernels: launch shapes around kernel_math.hpp.
namespace km = gpt::kernels;

__global__ void embedding_forward_kernel(std::int64_t n, const std::int32_t* tokens, int Tn,
                                         int C, const float* wte, const float* wpe, float* out) {
  GPT_GRID_STRIDE(i, n) km::embedding_forward_element(i, tokens, Tn, C, wte, wpe, out);
}
__global__ void embedding_backward_kernel(const std::int32_t* tokens, int N, int Tn, int C,
                                          const float* dout, float* dwte, float* dwpe) {
  GPT_GRID_STRIDE(c, C)
  km::embedding_backward_column(static_cast<int>(c), tokens, N, Tn, C, dout, dwte, dwpe);
}
__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b, int N,
                                         int C, float* out, float* mean, float* rstd) {
  GPT_GRID_STRIDE(n, N) km::layernorm_forward_row(static_cast<int>(n), x, w, b, C, out, mean, rstd);
}
__global__ void layernorm_backward_kernel(const float* dout, const float* x, const float* w,
                                          const float* mean, const float* rstd, int N, int C,
                                          float* dx) {
  GPT_GRID_STRIDE(n, N)
  km::layernorm_backward_row(static_cast<int>(n), dout, x, w, mean, rstd, C, dx);
}
__global__ void layernorm_param_grad_kernel(const float* dout, const float* x, const float* mean,
                                            const float* rstd, int N, int C, float* dw,
                                            float* db) {
  GPT_GRID_STRIDE(c, C)
  km::layernorm_param_grad_column(static_cast<int>(c), dout, x, mean, rstd, N, C, dw, db);
}
__global__ void bias_add_kernel(std::int64_t n, const float* bias, int out, float* y) {
  GPT_GRID_STRIDE(i, n) km::bias_add_element(i, bias, out, y);
}
__global__ void bias_grad_kernel(const float* dy, int N, int out, float* db) {
  GPT_GRID_STRIDE(c, out) km::bias_grad_column(static_cast<int>(c), dy, N, out, db);
}
__global__ void add_kernel(std::int64_t n, const float* x, float* y) {
  GPT_GRID_STRIDE(i, n) km::add_element(i, x, y);
}
__global__ void widen_kernel(std::int64_t n, km::Storage16 s, const std::uint16_t* src, float* dst) {
  GPT_GRID_STRIDE(i, n) km::widen_element(i, s, src, dst);
}
__global__ void narrow_add_kernel(std::int64_t n, km::Storage16 s, const float* src, float scale,
                                  std::uint16_t* dst) {
  GPT_GRID_STRIDE(i, n) km::narrow_add_element(i, s, src, scale, dst);
}
__global__ void gelu_forward_kernel(std::int64_t n, const float* x, float* y) {
  GPT_GRID_STRIDE(i, n) y[i] = km::gelu_value(x[i]);
}
__global__ void gelu_backward_kernel(std::int64_t n, const float* dy, const float* x, float* dx) {
  GPT_GRID_STRIDE(i, n) dx[i] += km::gelu_backward_value(dy[i], x[i]);
}
// rows = B*H*Tn rows of Tn scores, row r is query t = r mod Tn of its (batch, head).
__global__ void causal_softmax_kernel(std::int64_t rows, int Tn, float* att) {
  GPT_GRID_STRIDE(r, rows) km::causal_softmax_row(att + r * Tn, static_cast<int>(r % Tn), Tn);
}
__global__ void causal_softmax_backward_kernel(std::int64_t rows, int Tn, float scale, float* datt,
                                               const float* att) {
  GPT_GRID_STRIDE(r, rows)
  km::causal_softmax_backward_row(datt + r * Tn, att + r * Tn, static_cast<int>(r % Tn), Tn,
                                  scale);
}

// One warp per logits row (R rows of V): the row's loss into row_loss[r] and, when `grad`,
// the row turned into the gradient of the mean over n_rows rows. The lane partials are combined
// by __shfl_xor_sync in rounds 16, 8, 4, 2, 1, exactly as kernel_math's butterfly_combine.
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = kThreads / km::kWarpLanes;

__global__ void cross_entropy_kernel(float* logits, int R, int V, const std::int32_t* targets,
                                     int n_rows, bool grad, double* row_loss) {
  const int lane = static_cast<int>(threadIdx.x) % km::kWarpLanes;
  const std::int64_t warp =
      blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / km::kWarpLanes;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = warp; r < R; r += warps) {  // warp-uniform: every lane takes the row
    float* row = logits + r * V;
    const int y = targets[r];
    const float target_logit = row[y];
    float mx = km::lane_max(row, V, lane);
    for (int s = km::kWarpLanes / 2; s >= 1; s /= 2)
      mx = km::hd_max(mx, __shfl_xor_sync(kFullMask, mx, s));
    __syncwarp();  // every lane has read z_y before its owner overwrites it with exp
    double sum = km::lane_exp_sum(row, V, lane, mx);
    for (int s = km::kWarpLanes / 2; s >= 1; s /= 2) sum = sum + __shfl_xor_sync(kFullMask, sum, s);
    if (lane == 0) row_loss[r] = km::cross_entropy_loss(sum, mx, target_logit);
    if (grad) km::lane_cross_entropy_grad(row, V, lane, y, sum, n_rows);
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

// ---------------------------------------------------------------------------------------------
bool cuda_usable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // the failure is also the runtime's last error: clear it
    if (why) *why = cuda_text(err);
    return false;
  }
  if (count < 1) {
    if (why) *why = "cudaGetDeviceCount found no CUDA device";
    return false;
  }
  return true;
}

namespace cuda {

template <class U>
Array<U>::~Array() {
  if (ptr_) cudaFree(ptr_);
}
template <class U>
Array<U>::Array(Array&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}
template <class U>
Array<U>& Array<U>::operator=(Array&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}
template <class U>
void Array<U>::resize(std::size_t n) {
  if (n > capacity_) {
    if (ptr_) GPT_CUDA_CHECK(cudaFree(ptr_), "cudaFree of a ", capacity_ * sizeof(U), "-byte array");
    ptr_ = nullptr;
    size_ = capacity_ = 0;
    void* p = nullptr;
    GPT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(U)), "cudaMalloc(", n * sizeof(U), " bytes)");
    ptr_ = static_cast<U*>(p);
    capacity_ = n;
  }
  size_ = n;
}

template class Array<float>;
template class Array<double>;
template class Array<std::int32_t>;

}  // namespace cuda

// ---------------------------------------------------------------------------------------------
struct CudaOps::Impl {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int chunk = 256;
  HeadPrecision precision = HeadPrecision::fp32;
  cuda::Array<float> logits;      // the head's [chunk, V] logits, then G
  cuda::Array<double> row_loss;   // the head's per-row losses [N]
  cuda::Array<float> dscores;     // attention backward's dP / dS [B, H, T, T]
  std::vector<double> host_loss;  // row_loss downloaded

  ~Impl() {
    if (blas) cublasDestroy(blas);
  }

  // Row-major C [M, N] = alpha op(A) op(B) + beta C, `batch` times (gemm_layout.hpp's
  // RowMajorGemm: lda, ldb, ldc are stored row strides, sA, sB, sC element strides between the
  // batch's matrices), as the column-major cuBLAS call of column_major_gemm. The arguments are
  // those of KernelOps' gemm, call for call. `bf16`: cuBLAS may down-convert the operands to
  // bfloat16 (or TF32), fp32 accumulation; otherwise full fp32 (no TF32).
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            std::int64_t sA, const float* B, int ldb, std::int64_t sB, float beta, float* C,
            int ldc, std::int64_t sC, int batch = 1, bool bf16 = false) {
    const ColumnMajorGemm g =
        column_major_gemm(RowMajorGemm{ta, tb, M, N, K, A, lda, sA, B, ldb, sB, ldc, sC});
    const cublasOperation_t op1 = g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op2 = g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
    if (batch == 1) {
      GPT_CUBLAS_CHECK(cublasGemmEx(blas, op1, op2, g.m, g.n, g.k, &alpha, g.first, CUDA_R_32F,
                                    g.ld_first, g.second, CUDA_R_32F, g.ld_second, &beta, C,
                                    CUDA_R_32F, g.ldc, compute, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx (row-major ", M, "x", N, "x", K, ")");
    } else {
      GPT_CUBLAS_CHECK(
          cublasGemmStridedBatchedEx(blas, op1, op2, g.m, g.n, g.k, &alpha, g.first, CUDA_R_32F,
                                     g.ld_first, g.stride_first, g.second, CUDA_R_32F,
                                     g.ld_second, g.stride_second, &beta, C, CUDA_R_32F, g.ldc,
                                     g.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx (row-major ", batch, " x ", M, "x", N, "x", K, ")");
    }
  }

  // The fused head (ops::lm_head_cross_entropy's math): chunks of rows, logits by cuBLAS, the
  // warp-per-row cross-entropy, then dx += G wte and dwte += G^T x when dx is given.
  double head(const float* x, const float* wte, const std::int32_t* targets, int N, int C, int V,
              float* dx, float* dwte, bool bf16) {
    GPT_CHECK(N >= 1 && C >= 1 && V >= 1, "CudaOps head: N ", N, ", C ", C, ", V ", V,
              " must be >= 1");
    const int rows = std::max(1, std::min(chunk, N));
    logits.resize(static_cast<std::size_t>(rows) * V);
    row_loss.resize(static_cast<std::size_t>(N));
    const bool grad = dx != nullptr;
    for (int r0 = 0; r0 < N; r0 += rows) {
      const int R = std::min(rows, N - r0);
      const float* X = x + static_cast<std::int64_t>(r0) * C;
      gemm(false, true, R, V, C, 1.f, X, C, 0, wte, C, 0, 0.f, logits.data(), V, 0, 1, bf16);
      const std::int64_t blocks = (R + kWarpsPerBlock - 1) / kWarpsPerBlock;
      cross_entropy_kernel<<<static_cast<unsigned>(std::min(blocks, kMaxBlocks)), kThreads, 0,
                             stream>>>(logits.data(), R, V, targets + r0, N, grad,
                                       row_loss.data() + r0);
      GPT_CUDA_LAUNCHED("cross_entropy_kernel");
      if (grad) {
        gemm(false, false, R, C, V, 1.f, logits.data(), V, 0, wte, C, 0, 1.f,
             dx + static_cast<std::int64_t>(r0) * C, C, 0, 1, bf16);
        gemm(true, false, V, C, R, 1.f, logits.data(), V, 0, X, C, 0, 1.f, dwte, C, 0, 1, bf16);
      }
    }
    host_loss.resize(static_cast<std::size_t>(N));
    GPT_CUDA_CHECK(cudaMemcpyAsync(host_loss.data(), row_loss.data(), N * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync of ", N, " row losses");
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the head");
    double sum = 0;
    for (double l : host_loss) sum += l;  // row order
    return sum / N;
  }
};

CudaOps::CudaOps(int ordinal, void* stream) : impl_(std::make_unique<Impl>()) {
  impl_->ordinal = ordinal;
  impl_->stream = as_stream(stream);
  GPT_CUDA_CHECK(cudaSetDevice(ordinal), "cudaSetDevice(", ordinal, ")");
  GPT_CUBLAS_CHECK(cublasCreate(&impl_->blas), "cublasCreate on cuda:", ordinal);
  GPT_CUBLAS_CHECK(cublasSetStream(impl_->blas, impl_->stream), "cublasSetStream");
  // Full fp32 GEMMs: TF32 tensor cores only if asked for (they are not).
  GPT_CUBLAS_CHECK(cublasSetMathMode(impl_->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}
CudaOps::~CudaOps() = default;
CudaOps::CudaOps(CudaOps&& other) noexcept = default;
CudaOps& CudaOps::operator=(CudaOps&& other) noexcept = default;

void CudaOps::configure_head(int chunk_rows, HeadPrecision precision) {
  GPT_CHECK(chunk_rows >= 1, "CudaOps: head chunk of ", chunk_rows, " rows, need >= 1");
  impl_->chunk = chunk_rows;
  impl_->precision = precision;
}

void CudaOps::upload(const float* host, std::size_t n, Array<float>& dst) {
  dst.resize(n);
  if (n == 0) return;
  GPT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, n * sizeof(float), cudaMemcpyHostToDevice,
                                 impl_->stream),
                 "cudaMemcpyAsync (upload of ", n * sizeof(float), " bytes)");
}
void CudaOps::upload(const std::int32_t* host, std::size_t n, Array<std::int32_t>& dst) {
  dst.resize(n);
  if (n == 0) return;
  GPT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, n * sizeof(std::int32_t),
                                 cudaMemcpyHostToDevice, impl_->stream),
                 "cudaMemcpyAsync (upload of ", n * sizeof(std::int32_t), " bytes)");
}
void CudaOps::download(const float* src, std::size_t n, float* host) {
  if (n > 0)
    GPT_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost,
                                   impl_->stream),
                   "cudaMemcpyAsync (download of ", n * sizeof(float), " bytes)");
  GPT_CUDA_CHECK(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize after a download");
}
void CudaOps::zero(Array<float>& b, std::size_t n) {
  b.resize(n);
  if (n == 0) return;
  GPT_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, n * sizeof(float), impl_->stream),
                 "cudaMemsetAsync (", n * sizeof(float), " bytes)");
}
void CudaOps::copy(const float* src, std::size_t n, float* dst) {
  if (n == 0) return;
  GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                 impl_->stream),
                 "cudaMemcpyAsync (device copy of ", n * sizeof(float), " bytes)");
}
void CudaOps::add(const float* x, std::size_t n, float* y) {
  if (n == 0) return;
  const auto m = static_cast<std::int64_t>(n);
  add_kernel<<<blocks_for(m), kThreads, 0, impl_->stream>>>(m, x, y);
  GPT_CUDA_LAUNCHED("add_kernel");
}

void CudaOps::widen(kernels::Storage16 s, const std::uint16_t* src, std::size_t n, float* dst) {
  if (n == 0) return;
  const auto m = static_cast<std::int64_t>(n);
  widen_kernel<<<blocks_for(m), kThreads, 0, impl_->stream>>>(m, s, src, dst);
  GPT_CUDA_LAUNCHED("widen_kernel");
}
void CudaOps::narrow_add(kernels::Storage16 s, const float* src, std::size_t n, float scale,
                         std::uint16_t* dst) {
  if (n == 0) return;
  const auto m = static_cast<std::int64_t>(n);
  narrow_add_kernel<<<blocks_for(m), kThreads, 0, impl_->stream>>>(m, s, src, scale, dst);
  GPT_CUDA_LAUNCHED("narrow_add_kernel");
}

void CudaOps::embedding_forward(const std::int32_t* tokens, int B, int Tn, int C,
                                const float* wte, const float* wpe, float* out) {
  const std::int64_t n = static_cast<std::int64_t>(B) * Tn * C;
  embedding_forward_kernel<<<blocks_for(n), kThreads, 0, impl_->stream>>>(n, tokens, Tn, C, wte,
                                                                          wpe, out);
  GPT_CUDA_LAUNCHED("embedding_forward_kernel");
}
void CudaOps::embedding_backward(const std::int32_t* tokens, int B, int Tn, int C,
                                 const float* dout, float* dwte, float* dwpe) {
  embedding_backward_kernel<<<blocks_for(C), kThreads, 0, impl_->stream>>>(tokens, B * Tn, Tn, C,
                                                                           dout, dwte, dwpe);
  GPT_CUDA_LAUNCHED("embedding_backward_kernel");
}
void CudaOps::layernorm_forward(const float* x, const float* w, const float* b, int N, int C,
                                float* out, float* mean, float* rstd) {
  layernorm_forward_kernel<<<blocks_for(N), kThreads, 0, impl_->stream>>>(x, w, b, N, C, out,
                                                                          mean, rstd);
  GPT_CUDA_LAUNCHED("layernorm_forward_kernel");
}
void CudaOps::layernorm_backward(const float* dout, const float* x, const float* w,
                                 const float* mean, const float* rstd, int N, int C, float* dx,
                                 float* dw, float* db) {
  layernorm_backward_kernel<<<blocks_for(N), kThreads, 0, impl_->stream>>>(dout, x, w, mean, rstd,
                                                                           N, C, dx);
  GPT_CUDA_LAUNCHED("layernorm_backward_kernel");
  layernorm_param_grad_kernel<<<blocks_for(C), kThreads, 0, impl_->stream>>>(dout, x, mean, rstd,
                                                                             N, C, dw, db);
  GPT_CUDA_LAUNCHED("layernorm_param_grad_kernel");
}
void CudaOps::linear_forward(const float* x, const float* W, const float* b, int N, int in,
                             int out, float* y) {
  impl_->gemm(false, false, N, out, in, 1.f, x, in, 0, W, out, 0, 0.f, y, out, 0);
  const std::int64_t n = static_cast<std::int64_t>(N) * out;
  bias_add_kernel<<<blocks_for(n), kThreads, 0, impl_->stream>>>(n, b, out, y);
  GPT_CUDA_LAUNCHED("bias_add_kernel");
}
void CudaOps::linear_backward(const float* dy, const float* x, const float* W, int N, int in,
                              int out, float* dx, float* dW, float* db) {
  if (dx) impl_->gemm(false, true, N, in, out, 1.f, dy, out, 0, W, out, 0, 1.f, dx, in, 0);
  impl_->gemm(true, false, in, out, N, 1.f, x, in, 0, dy, out, 0, 1.f, dW, out, 0);
  bias_grad_kernel<<<blocks_for(out), kThreads, 0, impl_->stream>>>(dy, N, out, db);
  GPT_CUDA_LAUNCHED("bias_grad_kernel");
}
void CudaOps::gelu_forward(const float* x, std::int64_t n, float* y) {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, impl_->stream>>>(n, x, y);
  GPT_CUDA_LAUNCHED("gelu_forward_kernel");
}
void CudaOps::gelu_backward(const float* dy, const float* x, std::int64_t n, float* dx) {
  if (n == 0) return;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, impl_->stream>>>(n, dy, x, dx);
  GPT_CUDA_LAUNCHED("gelu_backward_kernel");
}

// Per batch b, strided-batched over the H heads: head h's Q, K, V are the d-column blocks at
// qkv + b*Tn*3C + {0, C, 2C} + h*d (row stride 3C, batch stride d), its P the [Tn, Tn] block
// (b*H + h) of att, its output the d-column block at out + b*Tn*C + h*d (row stride C).
void CudaOps::attention_forward(const float* qkv, int B, int Tn, int C, int H, float* out,
                                float* att) {
  GPT_CHECK(H >= 1 && C % H == 0, "CudaOps attention: C ", C, " is not a multiple of H ", H);
  const int d = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const std::int64_t TT = static_cast<std::int64_t>(Tn) * Tn;
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<std::int64_t>(b) * Tn * 3 * C;
    float* P = att + static_cast<std::int64_t>(b) * H * TT;
    impl_->gemm(false, true, Tn, Tn, d, scale, base, 3 * C, d, base + C, 3 * C, d, 0.f, P, Tn, TT,
                H);
  }
  const std::int64_t rows = static_cast<std::int64_t>(B) * H * Tn;
  causal_softmax_kernel<<<blocks_for(rows), kThreads, 0, impl_->stream>>>(rows, Tn, att);
  GPT_CUDA_LAUNCHED("causal_softmax_kernel");
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<std::int64_t>(b) * Tn * 3 * C;
    const float* P = att + static_cast<std::int64_t>(b) * H * TT;
    impl_->gemm(false, false, Tn, d, Tn, 1.f, P, Tn, TT, base + 2 * C, 3 * C, d, 0.f,
                out + static_cast<std::int64_t>(b) * Tn * C, C, d, H);
  }
}
// dV += P^T dO; dP = dO V^T (scratch); dS = softmax backward of dP (scaled); dQ += dS K;
// dK += dS^T Q.
void CudaOps::attention_backward(const float* dout, const float* qkv, const float* att, int B,
                                 int Tn, int C, int H, float* dqkv) {
  GPT_CHECK(H >= 1 && C % H == 0, "CudaOps attention: C ", C, " is not a multiple of H ", H);
  const int d = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const std::int64_t TT = static_cast<std::int64_t>(Tn) * Tn;
  impl_->dscores.resize(static_cast<std::size_t>(B) * H * TT);
  float* dS_all = impl_->dscores.data();
  for (int b = 0; b < B; ++b) {
    const std::int64_t off = static_cast<std::int64_t>(b) * Tn * 3 * C;
    const float* P = att + static_cast<std::int64_t>(b) * H * TT;
    const float* dO = dout + static_cast<std::int64_t>(b) * Tn * C;
    impl_->gemm(true, false, Tn, d, Tn, 1.f, P, Tn, TT, dO, C, d, 1.f, dqkv + off + 2 * C, 3 * C,
                d, H);
    impl_->gemm(false, true, Tn, Tn, d, 1.f, dO, C, d, qkv + off + 2 * C, 3 * C, d, 0.f,
                dS_all + static_cast<std::int64_t>(b) * H * TT, Tn, TT, H);
  }
  const std::int64_t rows = static_cast<std::int64_t>(B) * H * Tn;
  causal_softmax_backward_kernel<<<blocks_for(rows), kThreads, 0, impl_->stream>>>(
      rows, Tn, scale, dS_all, att);
  GPT_CUDA_LAUNCHED("causal_softmax_backward_kernel");
  for (int b = 0; b < B; ++b) {
    const std::int64_t off = static_cast<std::int64_t>(b) * Tn * 3 * C;
    const float* dS = dS_all + static_cast<std::int64_t>(b) * H * TT;
    impl_->gemm(false, false, Tn, d, Tn, 1.f, dS, Tn, TT, qkv + off + C, 3 * C, d, 1.f,
                dqkv + off, 3 * C, d, H);
    impl_->gemm(true, false, Tn, d, Tn, 1.f, dS, Tn, TT, qkv + off, 3 * C, d, 1.f,
                dqkv + off + C, 3 * C, d, H);
  }
}

double CudaOps::head_loss(const float* x, const float* wte, const std::int32_t* targets, int N,
                          int C, int V) {
  return impl_->head(x, wte, targets, N, C, V, nullptr, nullptr, /*bf16=*/false);
}
double CudaOps::head_loss_and_grad(const float* x, const float* wte, const std::int32_t* targets,
                                   int N, int C, int V, float* dx, float* dwte) {
  return impl_->head(x, wte, targets, N, C, V, dx, dwte,
                     impl_->precision == HeadPrecision::bf16);
}
void CudaOps::head_logits(const float* x, const float* wte, int N, int C, int V, float* out) {
  impl_->gemm(false, true, N, V, C, 1.f, x, C, 0, wte, C, 0, 0.f, out, V, 0);
}

}  // namespace gpt
