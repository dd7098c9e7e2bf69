// The GPT-2 operations, forward and backward, on row-major buffers with Eigen (GEMMs through
// Eigen::Map, no copies). Templated on the scalar: float for training, double for the
// finite-difference gradient checks of tests/gpt.
//
// Conventions: N = B*T rows (token positions), C channels. Every backward ADDS into its
// gradient outputs (input and parameter gradients alike), so residual branches and tied
// weights accumulate without extra buffers; callers zero them first. Weights use the Hugging
// Face GPT-2 (Conv1D) layout W[in, out], y = x W + b.
// The embedding, LayerNorm and attention-softmax loops call the CUDA kernels' own functions
// (kernel_math.hpp) and the bias gradient gives bias_grad_column's bits, so the CPU trainer and
// the GPU backend share that math; the GEMMs, GELU (Eigen's vectorized tanh) and the head differ
// by backend. No result depends on where a buffer lies (see linear_backward).
// Thread-safety: pure functions of their arguments; Eigen GEMMs use the OpenMP threads of the
// calling thread (omp_set_num_threads), attention parallelizes over (batch, head) the same way.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "examples/gpt/kernel_math.hpp"

namespace gpt::ops {

template <class T>
using MatR = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<MatR<T>>;
template <class T>
using CMap = Eigen::Map<const MatR<T>>;
template <class T>
using VecMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T>
using CVecMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;
// A column block of a row-major matrix (rows of `stride` elements).
template <class T>
using StridedMap = Eigen::Map<MatR<T>, 0, Eigen::OuterStride<>>;
template <class T>
using CStridedMap = Eigen::Map<const MatR<T>, 0, Eigen::OuterStride<>>;

// ---------------------------------------------------------------------------------------------
// Embedding: out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].
// tokens [B*T] in [0, V); wte [V, C]; wpe [>= T, C]; out [B*T, C].
template <class T>
void embedding_forward(const std::int32_t* tokens, int B, int Tn, int C, const T* wte,
                       const T* wpe, T* out) {
  const std::int64_t n = static_cast<std::int64_t>(B) * Tn * C;
  for (std::int64_t i = 0; i < n; ++i)
    kernels::embedding_forward_element<T>(i, tokens, Tn, C, wte, wpe, out);
}
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t].
template <class T>
void embedding_backward(const std::int32_t* tokens, int B, int Tn, int C, const T* dout, T* dwte,
                        T* dwpe) {
  for (int c = 0; c < C; ++c)
    kernels::embedding_backward_column<T>(c, tokens, B * Tn, Tn, C, dout, dwte, dwpe);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (Ba et al. 2016), eps = 1e-5 as GPT-2: out = (x - mean) * rstd * w + b per row.
// x, out [N, C]; w, b [C]; saves mean, rstd [N] for the backward.
using kernels::kLayerNormEps;

template <class T>
void layernorm_forward(const T* x, const T* w, const T* bias, int N, int C, T* out, T* mean,
                       T* rstd) {
  for (int n = 0; n < N; ++n) kernels::layernorm_forward_row<T>(n, x, w, bias, C, out, mean, rstd);
}
// With xhat = (x-mean)*rstd and g = dout*w:
// dx += rstd * (g - mean(g) - xhat * mean(g*xhat)); dw += dout*xhat; db += dout.
template <class T>
void layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int N, int C, T* dx, T* dw, T* db) {
  for (int n = 0; n < N; ++n) kernels::layernorm_backward_row<T>(n, dout, x, w, mean, rstd, C, dx);
  for (int c = 0; c < C; ++c)
    kernels::layernorm_param_grad_column<T>(c, dout, x, mean, rstd, N, C, dw, db);
}

// ---------------------------------------------------------------------------------------------
// Linear (HF Conv1D): y = x W + b. x [N, in], W [in, out], b [out], y [N, out] (overwritten).
template <class T>
void linear_forward(const T* x, const T* W, const T* bias, int N, int in, int out, T* y) {
  Map<T> Y(y, N, out);
  Y.noalias() = CMap<T>(x, N, in) * CMap<T>(W, in, out);
  Y.rowwise() += CVecMap<T>(bias, out);
}
// dx += dy W^T; dW += x^T dy; db += column sums of dy.
// The column sums add the rows in order, the bits of kernel_math.hpp's bias_grad_column
// (KernelOps, CudaOps): a running row-vector sum, elementwise, so its bits do not depend on where
// the buffers lie. Eigen's dY.colwise().sum() did: it sums the columns it loads as aligned
// packets four rows at a time, pairwise, and those before the destination's first 64-byte
// boundary one row after another; the trainer's fp32 gradient copies are std::vectors whose
// address modulo 64 follows the heap, so two identical fp16 runs could differ (issue 19).
template <class T>
void linear_backward(const T* dy, const T* x, const T* W, int N, int in, int out, T* dx, T* dW,
                     T* db) {
  CMap<T> dY(dy, N, out);
  if (dx) Map<T>(dx, N, in).noalias() += dY * CMap<T>(W, in, out).transpose();
  Map<T>(dW, in, out).noalias() += CMap<T>(x, N, in).transpose() * dY;
  Eigen::Matrix<T, 1, Eigen::Dynamic> sums = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(out);
  for (int n = 0; n < N; ++n) sums += dY.row(n);
  VecMap<T>(db, out) += sums;
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. for "gelu_new" in GPT-2):
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). n elements.
// Eigen's packet tanh: vectorized (a rational approximation in float, accurate to a few ulp),
// where std::tanh per element cost as much as the block's GEMMs.
template <class T>
void gelu_forward(const T* x, std::int64_t n, T* y) {
  const T k = std::sqrt(T(2) / T(M_PI));
  const auto v = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n);
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(y, n) =
      T(0.5) * v * (T(1) + (k * (v + T(0.044715) * v * v * v)).tanh());
}
// dx += dy * dy/dx, dy/dx = 0.5(1+tanh u) + 0.5 x (1-tanh^2 u) k (1 + 3*0.044715 x^2).
template <class T>
void gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  const T k = std::sqrt(T(2) / T(M_PI));
  constexpr std::int64_t kBlock = 512;  // tanh kept on the stack, block by block
  Eigen::Array<T, kBlock, 1> th_buf;
  for (std::int64_t i = 0; i < n; i += kBlock) {
    const std::int64_t m = std::min(kBlock, n - i);
    const auto v = Eigen::Map<const A>(x + i, m);
    auto th = th_buf.head(m);
    th = (k * (v + T(0.044715) * v * v * v)).tanh();
    Eigen::Map<A>(dx + i, m) += Eigen::Map<const A>(dy + i, m) *
                                (T(0.5) * (T(1) + th) +
                                 T(0.5) * v * (T(1) - th * th) * k * (T(1) + T(3 * 0.044715) * v * v));
  }
}

// Below ~1 MFLOP per call, waking OpenMP threads costs more than it saves.
inline bool parallel_worth_it(int B, int H, int Tn, int d) {
  return static_cast<std::int64_t>(B) * H * Tn * Tn * d > (1 << 20);
}

// ---------------------------------------------------------------------------------------------
// Causal multi-head self-attention (Vaswani et al. 2017, eq. 1), per (batch b, head h):
//   P = softmax(mask(Q K^T / sqrt(d))), O = P V, d = C / H,
// where Q, K, V are the column blocks [h*d, (h+1)*d) of qkv's thirds.
// qkv [B, T, 3C] (q | k | v), out [B, T, C] (heads side by side), att [B, H, T, T] (P, zeros
// above the diagonal, saved for the backward).
template <class T>
void attention_forward(const T* qkv, int B, int Tn, int C, int H, T* out, T* att) {
  const int d = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth_it(B, H, Tn, d))
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const T* base = qkv + static_cast<std::int64_t>(b) * Tn * 3 * C;
      CStridedMap<T> Q(base + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      CStridedMap<T> K(base + C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      CStridedMap<T> V(base + 2 * C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      Map<T> P(att + (static_cast<std::int64_t>(b) * H + h) * Tn * Tn, Tn, Tn);
      P.noalias() = (Q * K.transpose()) * scale;
      for (int t = 0; t < Tn; ++t)
        kernels::causal_softmax_row<T>(P.data() + static_cast<std::int64_t>(t) * Tn, t, Tn);
      StridedMap<T> O(out + static_cast<std::int64_t>(b) * Tn * C + h * d, Tn, d,
                      Eigen::OuterStride<>(C));
      O.noalias() = P * V;
    }
}
// dV += P^T dO; dP = dO V^T; dS = P .* (dP - rowsum(dP .* P)) * scale; dQ += dS K; dK += dS^T Q.
// dout [B, T, C]; dqkv [B, T, 3C] (added into).
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int H,
                        T* dqkv) {
  const int d = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth_it(B, H, Tn, d))
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const std::int64_t off = static_cast<std::int64_t>(b) * Tn * 3 * C;
      CStridedMap<T> Q(qkv + off + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      CStridedMap<T> K(qkv + off + C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      CStridedMap<T> V(qkv + off + 2 * C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      StridedMap<T> dQ(dqkv + off + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      StridedMap<T> dK(dqkv + off + C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      StridedMap<T> dV(dqkv + off + 2 * C + h * d, Tn, d, Eigen::OuterStride<>(3 * C));
      CStridedMap<T> dO(dout + static_cast<std::int64_t>(b) * Tn * C + h * d, Tn, d,
                        Eigen::OuterStride<>(C));
      CMap<T> P(att + (static_cast<std::int64_t>(b) * H + h) * Tn * Tn, Tn, Tn);
      dV.noalias() += P.transpose() * dO;
      MatR<T> dS = dO * V.transpose();  // dP, then turned into dS in place
      for (int t = 0; t < Tn; ++t)
        kernels::causal_softmax_backward_row<T>(dS.data() + static_cast<std::int64_t>(t) * Tn,
                                                P.data() + static_cast<std::int64_t>(t) * Tn, t,
                                                Tn, scale);
      dQ.noalias() += dS * K;
      dK.noalias() += dS.transpose() * Q;
    }
}

// ---------------------------------------------------------------------------------------------
// The language-model head with softmax cross-entropy, fused and chunked over rows so the
// [N, V] logits never exist at once:
//   logits = x wte^T (lm_head tied to wte), loss = mean_n (logsumexp(logits_n) - logits_n[y_n]).
// x [N, C]; wte [V, C]; targets [N] in [0, V). Returns the mean loss. When dx and dwte are given
// it also adds the gradients of the mean loss: with G = (softmax(logits) - onehot(y)) / N,
// dx += G wte and dwte += G^T x. `scratch` is resized to chunk*V elements plus 64 bytes
// (reused across calls); the logits start at its first 64-byte boundary, because Eigen's
// vectorized exp and sum treat a row's unaligned head with scalar code: a fixed alignment makes
// the result a function of the values only, the same bits in every process (checkpoint/resume).
template <class T>
double lm_head_cross_entropy(const T* x, const T* wte, const std::int32_t* targets, int N, int C,
                             int V, T* dx, T* dwte, std::vector<T>& scratch, int chunk = 256) {
  constexpr std::size_t kAlign = 64;
  chunk = std::max(1, std::min(chunk, N));
  scratch.resize(static_cast<std::size_t>(chunk) * V + kAlign / sizeof(T));
  const auto address = reinterpret_cast<std::uintptr_t>(scratch.data());
  T* logits = scratch.data() + ((kAlign - address % kAlign) % kAlign) / sizeof(T);
  CMap<T> W(wte, V, C);
  double loss = 0;
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int R = std::min(chunk, N - r0);
    CMap<T> X(x + static_cast<std::int64_t>(r0) * C, R, C);
    Map<T> L(logits, R, V);
    L.noalias() = X * W.transpose();
    for (int r = 0; r < R; ++r) {
      // Vectorized (Eigen's packet exp): V exps per row dominate once the GEMMs are fast.
      auto row = L.row(r).array();
      const int y = targets[r0 + r];
      const T mx = row.maxCoeff();
      const T target_logit = row(y);
      row = (row - mx).exp();  // softmax numerators
      const T sum = row.sum();
      loss += std::log(static_cast<double>(sum)) + static_cast<double>(mx - target_logit);
      if (dx) {
        row *= T(1) / (sum * N);
        row(y) -= T(1) / N;
      }
    }
    if (dx) {
      Map<T>(dx + static_cast<std::int64_t>(r0) * C, R, C).noalias() += L * W;
      Map<T>(dwte, V, C).noalias() += L.transpose() * X;
    }
  }
  return loss / N;
}

// Logits of the rows of x (for sampling): out [N, V] = x wte^T.
template <class T>
void lm_head_logits(const T* x, const T* wte, int N, int C, int V, T* out) {
  Map<T>(out, N, V).noalias() = CMap<T>(x, N, C) * CMap<T>(wte, V, C).transpose();
}

}  // namespace gpt::ops
