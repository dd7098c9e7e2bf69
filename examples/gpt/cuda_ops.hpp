// CudaOps: the GPT model's compute backend on an NVIDIA GPU (cuBLAS GEMMs plus the kernels of
// cuda_ops.cu, whose per-element / per-row / per-column math is kernel_math.hpp's, shared with
// the host twin KernelOps). cpu_ops.hpp says what an Ops provides; this one works on device
// pointers and queues everything on one CUDA stream.
//
// This header has no CUDA types (streams travel as void*), so C++20 host code includes it; the
// implementation is compiled by nvcc (C++17) into zoe_gpt_cuda, which defines
// ZOE_GPT_HAVE_CUDA=1 for its users. Only the CUDA runtime (static) and cuBLAS are linked, never
// the driver library: binaries start on machines without a GPU, where cuda_usable() says why
// none can be used and constructing a CudaOps throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "examples/gpt/lm_head.hpp"  // HeadPrecision
#include "examples/gpt/storage_dtype.hpp"  // Storage16

namespace gpt {

/// True when this process can use a CUDA device (cudaGetDeviceCount succeeds with >= 1 device).
/// Otherwise false, and when `why` is not null *why = "<cudaError name>: <CUDA's error text>"
/// (e.g. "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime
/// version" on a machine without a driver), or "cudaGetDeviceCount found no CUDA device".
/// Never throws. Thread-safe.
bool cuda_usable(std::string* why);

namespace cuda {

/// A buffer of `size()` elements of U in device memory (cudaMalloc on the calling thread's
/// current device; CudaOps' constructor makes its device current). Move-only.
/// Instantiated for float, double and std::int32_t.
/// Thread-safety: one thread at a time per Array.
template <class U>
class Array {
 public:
  Array() = default;
  ~Array();  // cudaFree (which waits for the device's queued work); errors are ignored there
  Array(Array&& other) noexcept;
  Array& operator=(Array&& other) noexcept;
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;

  /// Makes size() == n elements. The allocation never shrinks; when n exceeds it, the old
  /// memory is freed (cudaFree waits for queued work) and a new one of n elements allocated:
  /// the contents are then NOT kept (unspecified values). Throws zoe::CudaError naming the
  /// byte count if cudaMalloc fails.
  void resize(std::size_t n);
  U* data() { return ptr_; }
  const U* data() const { return ptr_; }
  /// Elements (not bytes).
  std::size_t size() const { return size_; }

 private:
  U* ptr_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;  // elements allocated at ptr_
};

}  // namespace cuda

/// The GPU backend of GptModel (fp32). Every method has CpuOps<float>'s semantics and ops.hpp's
/// shapes (row-major, N = B*T rows, C channels, HF Conv1D weights W[in, out], every backward
/// ADDS into its gradient outputs), with all pointers (except upload's source and download's
/// destination) into device memory of this object's device. Work is queued on the stream given
/// at construction, in call order; only download and head_loss* wait for it (they return host
/// values). GEMMs are cuBLAS in full fp32 (default math mode, no TF32) except the bf16
/// training head. Errors: a failing CUDA call throws zoe::CudaError, a failing cuBLAS call
/// zoe::Error, both naming the call and CUDA's / cuBLAS's error text; a failure of queued work
/// may surface at a later call (CUDA reports asynchronous errors late).
/// Thread-safety: one CudaOps per thread; a CudaOps must be used on the thread that created it
/// or on one that made the same device current. Move-only; a moved-from CudaOps may only be
/// destroyed or assigned to.
class CudaOps {
 public:
  using Scalar = float;
  template <class U>
  using Array = cuda::Array<U>;

  /// Makes device `ordinal` current (cudaSetDevice) and creates this object's cuBLAS handle
  /// bound to `stream` (a cudaStream_t of that device, e.g. zoe::Engine::compute_place().stream;
  /// nullptr = the legacy default stream). Throws zoe::CudaError (no such device, no driver:
  /// the message carries CUDA's error text) or zoe::Error (cuBLAS could not start).
  CudaOps(int ordinal, void* stream);
  ~CudaOps();
  CudaOps(CudaOps&& other) noexcept;
  CudaOps& operator=(CudaOps&& other) noexcept;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  /// Rows per chunk of the head (>= 1, clamped to N; device scratch chunk_rows*V floats) and the
  /// training head's precision: bf16 = CUBLAS_COMPUTE_32F_FAST_16BF, which lets cuBLAS
  /// down-convert the fp32 operands to bfloat16 (or TF32, its choice) and accumulate in fp32.
  /// Evaluation always multiplies in fp32.
  /// Throws zoe::Error if chunk_rows < 1.
  void configure_head(int chunk_rows, HeadPrecision precision);

  /// dst = the n elements at `host` (pageable host memory; resize + asynchronous H2D copy that
  /// returns once the source has been staged, so the caller may reuse it at once).
  void upload(const float* host, std::size_t n, Array<float>& dst);
  void upload(const std::int32_t* host, std::size_t n, Array<std::int32_t>& dst);
  /// host[0, n) = src[0, n) (D2H copy, then waits for the stream).
  void download(const float* src, std::size_t n, float* host);
  /// b = n zeros (resize + cudaMemsetAsync).
  void zero(Array<float>& b, std::size_t n);
  /// dst[0, n) = src[0, n) (device to device).
  void copy(const float* src, std::size_t n, float* dst);
  /// y[0, n) += x[0, n).
  void add(const float* x, std::size_t n, float* y);
  /// As HostOpsBase's (cpu_ops.hpp): bf16/fp16 device buffers <-> fp32 working copies.
  void widen(kernels::Storage16 s, const std::uint16_t* src, std::size_t n, float* dst);
  void narrow_add(kernels::Storage16 s, const float* src, std::size_t n, float scale, std::uint16_t* dst);

  /// out [B*Tn, C] = wte[tokens] + wpe[t]. tokens [B*Tn] (device) in [0, V) (the caller checks).
  void embedding_forward(const std::int32_t* tokens, int B, int Tn, int C, const float* wte,
                         const float* wpe, float* out);
  /// dwte[tokens[n]] += dout[n]; dwpe[n mod Tn] += dout[n] (one thread per column, rows in
  /// order: deterministic, no atomics).
  void embedding_backward(const std::int32_t* tokens, int B, int Tn, int C, const float* dout,
                          float* dwte, float* dwpe);
  /// LayerNorm (eps 1e-5) of x [N, C] with w, b [C] into out [N, C]; saves mean, rstd [N].
  void layernorm_forward(const float* x, const float* w, const float* b, int N, int C, float* out,
                         float* mean, float* rstd);
  /// dx [N, C], dw, db [C] += the LayerNorm gradients of dout [N, C].
  void layernorm_backward(const float* dout, const float* x, const float* w, const float* mean,
                          const float* rstd, int N, int C, float* dx, float* dw, float* db);
  /// y [N, out] = x [N, in] W [in, out] + b [out].
  void linear_forward(const float* x, const float* W, const float* b, int N, int in, int out,
                      float* y);
  /// dx [N, in] += dy W^T (skipped when dx is null); dW [in, out] += x^T dy; db [out] += column
  /// sums of dy [N, out].
  void linear_backward(const float* dy, const float* x, const float* W, int N, int in, int out,
                       float* dx, float* dW, float* db);
  /// y [n] = GELU(x) (tanh approximation).
  void gelu_forward(const float* x, std::int64_t n, float* y);
  /// dx [n] += dy * GELU'(x).
  void gelu_backward(const float* dy, const float* x, std::int64_t n, float* dx);
  /// Causal self-attention: qkv [B, Tn, 3C] (q | k | v), H heads of d = C/H; out [B, Tn, C],
  /// att [B, H, Tn, Tn] = the softmax probabilities P (zeros above the diagonal).
  void attention_forward(const float* qkv, int B, int Tn, int C, int H, float* out, float* att);
  /// dqkv [B, Tn, 3C] += the attention gradients of dout [B, Tn, C], from qkv and att (P).
  /// Uses a device scratch of B*H*Tn*Tn floats (kept for reuse).
  void attention_backward(const float* dout, const float* qkv, const float* att, int B, int Tn,
                          int C, int H, float* dqkv);

  /// Mean softmax cross-entropy (nats) of logits = x [N, C] wte^T [C, V] against targets [N]
  /// (device, in [0, V)), fp32 multiplies, chunked over rows; the per-row losses (fp64) are
  /// summed on the host in row order. Waits for the stream.
  double head_loss(const float* x, const float* wte, const std::int32_t* targets, int N, int C,
                   int V);
  /// As head_loss in the head's training precision, also adding the gradients of the mean loss:
  /// with G = (softmax(logits) - onehot(y)) / N, dx [N, C] += G wte and dwte [V, C] += G^T x.
  double head_loss_and_grad(const float* x, const float* wte, const std::int32_t* targets, int N,
                            int C, int V, float* dx, float* dwte);
  /// out [N, V] = x [N, C] wte^T (fp32).
  void head_logits(const float* x, const float* wte, int N, int C, int V, float* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt
