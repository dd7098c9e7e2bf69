// KernelOps: the host twin of CudaOps (cuda_ops.hpp). Every non-GEMM op runs the CUDA
// kernels' own functions from kernel_math.hpp (the embedding and LayerNorm through
// HostOpsBase, whose ops.hpp loops are those functions), called for every element / row / column the
// way the kernels' threads call them (in plain loops here), and the GEMMs are the same
// row-major products CudaOps asks of cuBLAS (Eigen here). So a test that trains, checks
// gradients against finite differences or compares with CpuOps through KernelOps covers the
// GPU path's math on a machine without a GPU; the GPU test (tests/gpt/test_cuda_ops.cpp)
// then only has to show CudaOps equals KernelOps.
// Interface: as cpu_ops.hpp describes (host memory). Thread-safety: one object per thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "examples/gpt/cpu_ops.hpp"
#include "examples/gpt/kernel_math.hpp"
#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/ops.hpp"

namespace gpt {

template <class T>
class KernelOps : public HostOpsBase<T> {
 public:
  /// Rows per head chunk (>= 1) and the training head's precision: bf16 rounds the three head
  /// GEMMs' operands to bfloat16 (nearest even) and accumulates in T: the most rounding that
  /// CudaOps' CUBLAS_COMPUTE_32F_FAST_16BF allows cuBLAS (it may also pick TF32).
  void configure_head(int chunk_rows, HeadPrecision precision) {
    chunk_ = std::max(1, chunk_rows);
    precision_ = precision;
  }

  void add(const T* x, std::size_t n, T* y) {
    for (std::size_t i = 0; i < n; ++i) kernels::add_element<T>(static_cast<std::int64_t>(i), x, y);
  }

  void linear_forward(const T* x, const T* W, const T* b, int N, int in, int out, T* y) {
    gemm(false, false, N, out, in, T(1), x, in, W, out, T(0), y, out);
    const std::int64_t n = static_cast<std::int64_t>(N) * out;
    for (std::int64_t i = 0; i < n; ++i) kernels::bias_add_element<T>(i, b, out, y);
  }
  void linear_backward(const T* dy, const T* x, const T* W, int N, int in, int out, T* dx, T* dW,
                       T* db) {
    if (dx) gemm(false, true, N, in, out, T(1), dy, out, W, out, T(1), dx, in);
    gemm(true, false, in, out, N, T(1), x, in, dy, out, T(1), dW, out);
    for (int c = 0; c < out; ++c) kernels::bias_grad_column<T>(c, dy, N, out, db);
  }
  void gelu_forward(const T* x, std::int64_t n, T* y) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = kernels::gelu_value<T>(x[i]);
  }
  void gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
    for (std::int64_t i = 0; i < n; ++i) dx[i] += kernels::gelu_backward_value<T>(dy[i], x[i]);
  }
  // Per batch b, the heads as one strided batch (CudaOps: cublasSgemmStridedBatched).
  void attention_forward(const T* qkv, int B, int Tn, int C, int H, T* out, T* att) {
    const int d = C / H;
    const T scale = T(1) / kernels::hd_sqrt(static_cast<T>(d));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const T* q = qkv + static_cast<std::int64_t>(b) * Tn * 3 * C + h * d;
        T* p = att + (static_cast<std::int64_t>(b) * H + h) * Tn * Tn;
        gemm(false, true, Tn, Tn, d, scale, q, 3 * C, q + C, 3 * C, T(0), p, Tn);
        for (int t = 0; t < Tn; ++t)
          kernels::causal_softmax_row<T>(p + static_cast<std::int64_t>(t) * Tn, t, Tn);
        gemm(false, false, Tn, d, Tn, T(1), p, Tn, q + 2 * C, 3 * C, T(0),
             out + static_cast<std::int64_t>(b) * Tn * C + h * d, C);
      }
  }
  void attention_backward(const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int H,
                          T* dqkv) {
    const int d = C / H;
    const T scale = T(1) / kernels::hd_sqrt(static_cast<T>(d));
    dS_.resize(static_cast<std::size_t>(Tn) * Tn);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const std::int64_t off = static_cast<std::int64_t>(b) * Tn * 3 * C + h * d;
        const T* q = qkv + off;
        T* dq = dqkv + off;
        const T* dO = dout + static_cast<std::int64_t>(b) * Tn * C + h * d;
        const T* p = att + (static_cast<std::int64_t>(b) * H + h) * Tn * Tn;
        gemm(true, false, Tn, d, Tn, T(1), p, Tn, dO, C, T(1), dq + 2 * C, 3 * C);      // dV
        gemm(false, true, Tn, Tn, d, T(1), dO, C, q + 2 * C, 3 * C, T(0), dS_.data(), Tn);  // dP
        for (int t = 0; t < Tn; ++t)
          kernels::causal_softmax_backward_row<T>(dS_.data() + static_cast<std::int64_t>(t) * Tn,
                                                  p + static_cast<std::int64_t>(t) * Tn, t, Tn,
                                                  scale);
        gemm(false, false, Tn, d, Tn, T(1), dS_.data(), Tn, q + C, 3 * C, T(1), dq, 3 * C);  // dQ
        gemm(true, false, Tn, d, Tn, T(1), dS_.data(), Tn, q, 3 * C, T(1), dq + C, 3 * C);   // dK
      }
  }

  /// Mean cross-entropy of the tied head, fp32 (T) multiplies.
  double head_loss(const T* x, const T* wte, const std::int32_t* targets, int N, int C, int V) {
    return head(x, wte, targets, N, C, V, nullptr, nullptr, false);
  }
  /// The mean loss and its gradients added into dx and dwte, in the head's training precision.
  double head_loss_and_grad(const T* x, const T* wte, const std::int32_t* targets, int N, int C,
                            int V, T* dx, T* dwte) {
    return head(x, wte, targets, N, C, V, dx, dwte, precision_ == HeadPrecision::bf16);
  }
  /// out [N, V] = x wte^T.
  void head_logits(const T* x, const T* wte, int N, int C, int V, T* out) {
    gemm(false, true, N, V, C, T(1), x, C, wte, C, T(0), out, V);
  }

 private:
  // Row-major C[M, N] = alpha op(A) op(B) + beta C with leading dimensions (elements per row);
  // op(A) is [M, K], op(B) is [K, N]. beta = 0 ignores C's old contents (as cuBLAS does).
  static void gemm(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda,
                   const T* B, int ldb, T beta, T* C, int ldc) {
    using Stride = Eigen::OuterStride<>;
    ops::StridedMap<T> Cm(C, M, N, Stride(ldc));
    auto run = [&](const auto& a, const auto& b) {
      if (beta == T(0)) {
        Cm.noalias() = alpha * (a * b);
      } else {
        Cm *= beta;
        Cm.noalias() += alpha * (a * b);
      }
    };
    const ops::CStridedMap<T> Am(A, ta ? K : M, ta ? M : K, Stride(lda));
    const ops::CStridedMap<T> Bm(B, tb ? N : K, tb ? K : N, Stride(ldb));
    if (ta && tb) run(Am.transpose(), Bm.transpose());
    else if (ta) run(Am.transpose(), Bm);
    else if (tb) run(Am, Bm.transpose());
    else run(Am, Bm);
  }

  static void round_to_bf16(const T* src, std::int64_t n, std::vector<T>& dst) {
    dst.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      dst[i] = static_cast<T>(bf16_bits_to_float(to_bf16_bits(static_cast<float>(src[i]))));
  }

  // Per chunk of rows: logits = X wte^T, the warp-per-row cross-entropy (lanes and butterfly
  // as the CUDA kernel), then dx += G wte and dwte += G^T X.
  double head(const T* x, const T* wte, const std::int32_t* targets, int N, int C, int V, T* dx,
              T* dwte, bool bf16) {
    const int chunk = std::min(chunk_, N);
    logits_.resize(static_cast<std::size_t>(chunk) * V);
    const T* w = wte;
    if (bf16) {
      round_to_bf16(wte, static_cast<std::int64_t>(V) * C, wte16_);
      w = wte16_.data();
    }
    double loss = 0;
    for (int r0 = 0; r0 < N; r0 += chunk) {
      const int R = std::min(chunk, N - r0);
      const T* X = x + static_cast<std::int64_t>(r0) * C;
      if (bf16) {
        round_to_bf16(X, static_cast<std::int64_t>(R) * C, x16_);
        X = x16_.data();
      }
      gemm(false, true, R, V, C, T(1), X, C, w, C, T(0), logits_.data(), V);
      for (int r = 0; r < R; ++r)
        loss += cross_entropy_row(logits_.data() + static_cast<std::int64_t>(r) * V, V,
                                  targets[r0 + r], dx ? N : 0);
      if (!dx) continue;
      const T* G = logits_.data();
      if (bf16) {
        round_to_bf16(G, static_cast<std::int64_t>(R) * V, g16_);
        G = g16_.data();
      }
      gemm(false, false, R, C, V, T(1), G, V, w, C, T(1), dx + static_cast<std::int64_t>(r0) * C, C);
      gemm(true, false, V, C, R, T(1), G, V, X, C, T(1), dwte, C);
    }
    return loss / N;
  }

  // One row by the 32 lanes of a warp, emulated: lane partials, then the butterfly.
  // n_rows > 0: the row becomes the gradient of the mean over n_rows rows.
  static double cross_entropy_row(T* row, int V, int y, int n_rows) {
    using namespace kernels;
    T mx_lanes[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) mx_lanes[l] = lane_max<T>(row, V, l);
    const T mx = butterfly_combine(mx_lanes, [](T a, T b) { return hd_max(a, b); });
    const T target_logit = row[y];
    double sum_lanes[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) sum_lanes[l] = lane_exp_sum<T>(row, V, l, mx);
    const double sum = butterfly_combine(sum_lanes, [](double a, double b) { return a + b; });
    if (n_rows > 0)
      for (int l = 0; l < kWarpLanes; ++l) lane_cross_entropy_grad<T>(row, V, l, y, sum, n_rows);
    return cross_entropy_loss<T>(sum, mx, target_logit);
  }

  int chunk_ = 256;
  HeadPrecision precision_ = HeadPrecision::fp32;
  std::vector<T> dS_, logits_, wte16_, x16_, g16_;
};

}  // namespace gpt
