// The per-element, per-row and per-column math of the GPT trainer's CUDA kernels, written once
// (GPT_HD: __host__ __device__ under nvcc, plain inline elsewhere) and run by both
//  - CudaOps (cuda_ops.cu): one CUDA thread per element / row / column, one warp per row of
//    the cross-entropy, and
//  - KernelOps (kernel_ops.hpp), the host twin: the same functions in plain loops,
// so the CPU tests (tests/gpt/test_kernel_ops.cpp: finite differences in double, agreement
// with the Eigen ops of ops.hpp) cover the GPU path's math without a GPU.
//
// Conventions as ops.hpp: N = B*T rows, C channels, row-major, HF Conv1D weights W[in, out];
// every gradient output is ADDED into. Templated on the scalar (float on the GPU; double too
// on the host, for the finite-difference checks). Functions taking an index compute exactly
// the output(s) that one GPU thread owns, so no two calls write the same element.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define GPT_HD __host__ __device__ __forceinline__
#else
#define GPT_HD inline
#endif

namespace gpt::kernels {

// exp, log, sqrt, tanh in the argument's precision on both sides (a bare exp(float) on the host
// could silently pick the double ::exp).
GPT_HD float hd_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
GPT_HD double hd_exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
GPT_HD double hd_log(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}
GPT_HD float hd_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
GPT_HD double hd_sqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
GPT_HD float hd_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}
GPT_HD double hd_tanh(double x) {
#if defined(__CUDA_ARCH__)
  return ::tanh(x);
#else
  return std::tanh(x);
#endif
}
template <class T>
GPT_HD T hd_max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
GPT_HD T neg_infinity() {
  return -std::numeric_limits<T>::infinity();
}

// ---------------------------------------------------------------------------------------------
// Embedding. Element i = n*C + c of out [N, C]: out = wte[tokens[n], c] + wpe[n mod Tn, c].
template <class T>
GPT_HD void embedding_forward_element(std::int64_t i, const std::int32_t* tokens, int Tn, int C,
                                      const T* wte, const T* wpe, T* out) {
  const std::int64_t n = i / C;
  const std::int64_t c = i % C;
  out[i] = wte[static_cast<std::int64_t>(tokens[n]) * C + c] + wpe[(n % Tn) * C + c];
}
// Column c of the gradients, rows in order (deterministic where tokens repeat, no atomics):
// dwte[tokens[n], c] += dout[n, c]; dwpe[n mod Tn, c] += dout[n, c].
template <class T>
GPT_HD void embedding_backward_column(int c, const std::int32_t* tokens, int N, int Tn, int C,
                                      const T* dout, T* dwte, T* dwpe) {
  for (std::int64_t n = 0; n < N; ++n) {
    const T d = dout[n * C + c];
    dwte[static_cast<std::int64_t>(tokens[n]) * C + c] += d;
    dwpe[(n % Tn) * C + c] += d;
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (Ba et al. 2016), eps 1e-5 as GPT-2. Row n: out = (x - mean) * rstd * w + b,
// saving mean[n] and rstd[n] = 1/sqrt(var + eps) (biased variance).
constexpr double kLayerNormEps = 1e-5;

template <class T>
GPT_HD void layernorm_forward_row(int n, const T* x, const T* w, const T* bias, int C, T* out,
                                  T* mean, T* rstd) {
  const T* xr = x + static_cast<std::int64_t>(n) * C;
  T m = 0;
  for (int c = 0; c < C; ++c) m += xr[c];
  m /= C;
  T v = 0;
  for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
  v /= C;
  const T s = T(1) / hd_sqrt(v + T(kLayerNormEps));
  T* o = out + static_cast<std::int64_t>(n) * C;
  for (int c = 0; c < C; ++c) o[c] = (xr[c] - m) * s * w[c] + bias[c];
  mean[n] = m;
  rstd[n] = s;
}
// Row n of the input gradient. With xhat = (x - mean) rstd and g = dout w:
// dx += rstd (g - mean(g) - xhat mean(g xhat)).
template <class T>
GPT_HD void layernorm_backward_row(int n, const T* dout, const T* x, const T* w, const T* mean,
                                   const T* rstd, int C, T* dx) {
  const std::int64_t off = static_cast<std::int64_t>(n) * C;
  T g_mean = 0, gx_mean = 0;
  for (int c = 0; c < C; ++c) {
    const T xhat = (x[off + c] - mean[n]) * rstd[n];
    const T g = dout[off + c] * w[c];
    g_mean += g;
    gx_mean += g * xhat;
  }
  g_mean /= C;
  gx_mean /= C;
  for (int c = 0; c < C; ++c) {
    const T xhat = (x[off + c] - mean[n]) * rstd[n];
    dx[off + c] += rstd[n] * (dout[off + c] * w[c] - g_mean - xhat * gx_mean);
  }
}
// Column c of the parameter gradients, rows in order: dw[c] += sum_n dout xhat,
// db[c] += sum_n dout.
template <class T>
GPT_HD void layernorm_param_grad_column(int c, const T* dout, const T* x, const T* mean,
                                        const T* rstd, int N, int C, T* dw, T* db) {
  T w_acc = dw[c], b_acc = db[c];
  for (std::int64_t n = 0; n < N; ++n) {
    const T d = dout[n * C + c];
    w_acc += d * ((x[n * C + c] - mean[n]) * rstd[n]);
    b_acc += d;
  }
  dw[c] = w_acc;
  db[c] = b_acc;
}

// ---------------------------------------------------------------------------------------------
// Linear's elementwise parts (the GEMMs are cuBLAS / Eigen). Element i of y [N, out]:
// y += b[i mod out]. Column c of the bias gradient, rows in order: db[c] += sum_n dy[n, c].
template <class T>
GPT_HD void bias_add_element(std::int64_t i, const T* bias, int out, T* y) {
  y[i] += bias[i % out];
}
template <class T>
GPT_HD void bias_grad_column(int c, const T* dy, int N, int out, T* db) {
  T acc = 0;
  for (std::int64_t n = 0; n < N; ++n) acc += dy[n * out + c];
  db[c] += acc;
}
// Residual add, element i: y += x.
template <class T>
GPT_HD void add_element(std::int64_t i, const T* x, T* y) {
  y[i] += x[i];
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2's "gelu_new"):
// y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class T>
GPT_HD T gelu_value(T x) {
  const T k = T(0.79788456080286535588);  // sqrt(2/pi)
  return T(0.5) * x * (T(1) + hd_tanh(k * (x + T(0.044715) * x * x * x)));
}
// dy * dGELU/dx = dy (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 0.044715 x^2)).
template <class T>
GPT_HD T gelu_backward_value(T dy, T x) {
  const T k = T(0.79788456080286535588);
  const T th = hd_tanh(k * (x + T(0.044715) * x * x * x));
  return dy * (T(0.5) * (T(1) + th) +
               T(0.5) * x * (T(1) - th * th) * k * (T(1) + T(3 * 0.044715) * x * x));
}

// ---------------------------------------------------------------------------------------------
// Causal attention's softmax (Vaswani et al. 2017, eq. 1), one row per (batch, head, query t).
// row [Tn]: the scaled scores q_t k_s / sqrt(d) on entry; on return P[t, s] =
// softmax over s <= t, and 0 for s > t (the causal mask).
template <class T>
GPT_HD void causal_softmax_row(T* row, int t, int Tn) {
  T mx = neg_infinity<T>();
  for (int s = 0; s <= t; ++s) mx = hd_max(mx, row[s]);
  T sum = 0;
  for (int s = 0; s <= t; ++s) {
    row[s] = hd_exp(row[s] - mx);
    sum += row[s];
  }
  for (int s = 0; s <= t; ++s) row[s] /= sum;
  for (int s = t + 1; s < Tn; ++s) row[s] = 0;
}
// drow [Tn]: dP[t, :] on entry; on return dS[t, s] = P (dP - sum_s' dP P) scale for s <= t,
// 0 above the diagonal (the gradient with respect to the unscaled scores q k^T).
template <class T>
GPT_HD void causal_softmax_backward_row(T* drow, const T* prow, int t, int Tn, T scale) {
  T dot = 0;
  for (int s = 0; s <= t; ++s) dot += drow[s] * prow[s];
  for (int s = 0; s <= t; ++s) drow[s] = prow[s] * (drow[s] - dot) * scale;
  for (int s = t + 1; s < Tn; ++s) drow[s] = 0;
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy of one logits row [V] with target y, by a warp: lane l (0..31) takes
// elements l, l+32, l+64, ..., and the 32 lane partials are combined by the butterfly
// (rounds 16, 8, 4, 2, 1: lane l adds lane l^r's value), after which every lane holds the
// same value. The CUDA kernel combines with __shfl_xor_sync; the host twin with
// butterfly_combine below: the same additions in the same order.
//   loss = log(sum_v exp(z_v - max)) + max - z_y,
//   with a gradient of the mean over n_rows rows: row <- (softmax(z) - onehot(y)) / n_rows.
constexpr int kWarpLanes = 32;

template <class T>
GPT_HD T lane_max(const T* row, int V, int lane) {
  T m = neg_infinity<T>();
  for (int v = lane; v < V; v += kWarpLanes) m = hd_max(m, row[v]);
  return m;
}
// Replaces the lane's elements by exp(z - mx); returns their sum in fp64.
template <class T>
GPT_HD double lane_exp_sum(T* row, int V, int lane, T mx) {
  double s = 0;
  for (int v = lane; v < V; v += kWarpLanes) {
    const T e = hd_exp(row[v] - mx);
    row[v] = e;
    s += static_cast<double>(e);
  }
  return s;
}
// The row's loss from its combined max and sum of exponentials and its target logit.
template <class T>
GPT_HD double cross_entropy_loss(double exp_sum, T mx, T target_logit) {
  return hd_log(exp_sum) + static_cast<double>(mx - target_logit);
}
// Turns the lane's exponentials into the gradient: e / (sum n_rows), minus 1/n_rows at y.
template <class T>
GPT_HD void lane_cross_entropy_grad(T* row, int V, int lane, int y, double exp_sum, int n_rows) {
  const T inv = T(1) / (static_cast<T>(exp_sum) * static_cast<T>(n_rows));
  for (int v = lane; v < V; v += kWarpLanes) {
    row[v] *= inv;
    if (v == y) row[v] -= T(1) / static_cast<T>(n_rows);
  }
}
// The butterfly over 32 lane values held in an array (the host side of __shfl_xor_sync).
template <class T, class Op>
inline T butterfly_combine(T (&p)[kWarpLanes], Op op) {
  for (int r = kWarpLanes / 2; r >= 1; r /= 2) {
    T q[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) q[l] = op(p[l], p[l ^ r]);
    for (int l = 0; l < kWarpLanes; ++l) p[l] = q[l];
  }
  return p[0];
}

}  // namespace gpt::kernels
