// The GPT model's compute backends ("Ops") and the one they all follow.
//
// GptModel<T, Ops> (model.hpp) runs the same graph on any Ops: CpuOps (this file: Eigen GEMMs,
// vectorized GELU, OpenMP attention, the oneDNN lm_head; the CPU trainer), KernelOps
// (kernel_ops.hpp: the CUDA kernels' math on the host, for tests) and CudaOps (cuda_ops.hpp:
// cuBLAS plus kernels, for a rank whose engine computes on a GPU).
//
// An Ops provides, on pointers into ITS memory (host memory for CpuOps and KernelOps, device
// memory for CudaOps), with ops.hpp's shapes and conventions (every backward ADDS into its
// gradient outputs):
//   using Scalar;                           the element type (float; double on the host too)
//   template <class U> using Array;         a growable buffer: resize(n), data(), size()
//   upload(host, n, Array<U>&) / download(src, n, host)   host <-> the backend's memory
//   zero(Array<T>&, n) (resize + zero-fill), copy(src, n, dst), add(x, n, y) (y += x)
//   embedding_*, layernorm_*, linear_*, gelu_*, attention_*   as ops.hpp
//   head_loss / head_loss_and_grad / head_logits               as ops::lm_head_cross_entropy
//   configure_head(chunk_rows, precision)                      the head's row chunk and precision
//   widen(Storage16, src16, n, dst) / narrow_add(Storage16, src, n, scale, dst16)
//                                    bf16/fp16 buffers <-> fp32 working copies (storage_dtype.hpp)
// Every call is ordered after the previous ones (on CUDA: queued on the engine's compute
// stream); head_loss* return the loss on the host, so they wait for the work before them.
// Thread-safety: one Ops object per thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/ops.hpp"
#include "examples/gpt/storage_dtype.hpp"

namespace gpt {

/// What the host backends (CpuOps, KernelOps) share: buffers are std::vector in host memory
/// (uploads and downloads are copies), and the embedding and LayerNorm, whose ops.hpp loops
/// already are the CUDA kernels' functions.
template <class T>
class HostOpsBase {
 public:
  using Scalar = T;
  template <class U>
  using Array = std::vector<U>;

  template <class U>
  void upload(const U* host, std::size_t n, Array<U>& dst) {
    dst.assign(host, host + n);
  }
  void download(const T* src, std::size_t n, T* host) { std::copy_n(src, n, host); }
  void zero(Array<T>& b, std::size_t n) { b.assign(n, T(0)); }
  void copy(const T* src, std::size_t n, T* dst) { std::copy_n(src, n, dst); }
  /// dst[i] = float(src[i]), n elements of a bf16/fp16 buffer (exact).
  void widen(kernels::Storage16 s, const std::uint16_t* src, std::size_t n, float* dst) {
    const auto m = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (m > (1 << 18))
    for (std::int64_t i = 0; i < m; ++i) kernels::widen_element(i, s, src, dst);
  }
  /// dst[i] = round(float(dst[i]) + scale * src[i]) into a bf16/fp16 buffer, nearest even.
  void narrow_add(kernels::Storage16 s, const float* src, std::size_t n, float scale, std::uint16_t* dst) {
    const auto m = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (m > (1 << 18))
    for (std::int64_t i = 0; i < m; ++i) kernels::narrow_add_element(i, s, src, scale, dst);
  }

  void embedding_forward(const std::int32_t* tokens, int B, int Tn, int C, const T* wte,
                         const T* wpe, T* out) {
    ops::embedding_forward<T>(tokens, B, Tn, C, wte, wpe, out);
  }
  void embedding_backward(const std::int32_t* tokens, int B, int Tn, int C, const T* dout,
                          T* dwte, T* dwpe) {
    ops::embedding_backward<T>(tokens, B, Tn, C, dout, dwte, dwpe);
  }
  void layernorm_forward(const T* x, const T* w, const T* b, int N, int C, T* out, T* mean,
                         T* rstd) {
    ops::layernorm_forward<T>(x, w, b, N, C, out, mean, rstd);
  }
  void layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                          int N, int C, T* dx, T* dw, T* db) {
    ops::layernorm_backward<T>(dout, x, w, mean, rstd, N, C, dx, dw, db);
  }
};

/// The CPU backend: ops.hpp's Eigen ops, the oneDNN LmHead for float (ops.hpp's reference
/// head for other scalars).
template <class T>
class CpuOps : public HostOpsBase<T> {
 public:
  /// Rows per head chunk (>= 1) and the training head's precision (float only; evaluation and
  /// the double reference always multiply in their own precision).
  void configure_head(int chunk_rows, HeadPrecision precision) {
    chunk_ = chunk_rows;
    precision_ = precision;
    head_.reset();
  }

  void add(const T* x, std::size_t n, T* y) {
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(y, n) +=
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n);
  }

  void linear_forward(const T* x, const T* W, const T* b, int N, int in, int out, T* y) {
    ops::linear_forward<T>(x, W, b, N, in, out, y);
  }
  void linear_backward(const T* dy, const T* x, const T* W, int N, int in, int out, T* dx, T* dW,
                       T* db) {
    ops::linear_backward<T>(dy, x, W, N, in, out, dx, dW, db);
  }
  void gelu_forward(const T* x, std::int64_t n, T* y) { ops::gelu_forward<T>(x, n, y); }
  void gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
    ops::gelu_backward<T>(dy, x, n, dx);
  }
  void attention_forward(const T* qkv, int B, int Tn, int C, int H, T* out, T* att) {
    ops::attention_forward<T>(qkv, B, Tn, C, H, out, att);
  }
  void attention_backward(const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int H,
                          T* dqkv) {
    ops::attention_backward<T>(dout, qkv, att, B, Tn, C, H, dqkv);
  }

  /// Mean cross-entropy of the head (evaluation: fp32 multiplies for float).
  double head_loss(const T* x, const T* wte, const std::int32_t* targets, int N, int C, int V) {
    if constexpr (std::is_same_v<T, float>) return lm_head().loss(x, wte, targets, N, C, V);
    return ops::lm_head_cross_entropy<T>(x, wte, targets, N, C, V, nullptr, nullptr, scratch_,
                                         chunk_);
  }
  /// The mean loss and its gradients, added into dx and dwte (the head's training precision).
  double head_loss_and_grad(const T* x, const T* wte, const std::int32_t* targets, int N, int C,
                            int V, T* dx, T* dwte) {
    if constexpr (std::is_same_v<T, float>)
      return lm_head().loss_and_grad(x, wte, targets, N, C, V, dx, dwte);
    return ops::lm_head_cross_entropy<T>(x, wte, targets, N, C, V, dx, dwte, scratch_, chunk_);
  }
  /// out [N, V] = x wte^T.
  void head_logits(const T* x, const T* wte, int N, int C, int V, T* out) {
    ops::lm_head_logits<T>(x, wte, N, C, V, out);
  }

 private:
  LmHead& lm_head() {
    if (!head_) head_ = std::make_unique<LmHead>(precision_, chunk_);
    return *head_;
  }

  int chunk_ = 256;
  HeadPrecision precision_ = HeadPrecision::fp32;
  std::unique_ptr<LmHead> head_;  // float: the oneDNN head, built on first use
  std::vector<T> scratch_;        // other scalars: the reference head's logits
};

}  // namespace gpt
