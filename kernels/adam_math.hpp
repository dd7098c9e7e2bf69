// The elementwise Adam / AdamW update, written once for host and device (ZOE_HD):
// the CPU optimizer's scalar path and tails call it, its AVX2 / AVX-512 paths repeat the
// same operations in the same order (src/optim/adam_*.cpp), and a GPU Adam kernel calls it.
//
// Math: torch.optim.Adam / AdamW 1.13, `_single_tensor_adam[w]` (Kingma & Ba 2015, Alg. 1;
// Loshchilov & Hutter 2019, Alg. 2, decoupled weight decay), operation for operation:
//   g  = grad * grad_scale                     (zoe's fused pre-scale; 1.0f is exact)
//   Adam:  g = g + wd * p                      (grad.add(param, alpha=wd); skipped if wd == 0)
//   AdamW: p = p * (1 - lr * wd)               (param.mul_(1 - lr * wd))
//   m  = m * beta1 + (1 - beta1) * g           (exp_avg.mul_(beta1).add_(grad, alpha=1-beta1))
//   v  = v * beta2 + ((1 - beta2) * g) * g     (exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2))
//   d  = sqrt(v) / sqrt(1 - beta2^t) + eps     ((exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps))
//   p  = p + (-(lr / (1 - beta1^t)) * m) / d   (param.addcdiv_(exp_avg, denom, value=-step_size))
// The scalar coefficients are computed in double like torch's Python code and rounded to
// float once, as torch passes them to its float kernels. Every operation is one IEEE-754
// binary32 multiply, add, divide or square root, each correctly rounded, so any
// implementation that keeps this order and does not contract a*b+c into an FMA (compile with
// -ffp-contract=off; nvcc: --fmad=false) produces bitwise identical results.
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hd.hpp"

namespace zoe::kernels {

/// The float constants of one Adam step (all dimensionless except lr-derived ones, which are in
/// parameter units per step). Built on the host by adam_coeffs().
struct AdamCoeffs {
  float grad_scale;             // multiplies every gradient element first
  float l2;                     // Adam: weight_decay (0 means no L2 term); AdamW: 0
  float decay;                  // AdamW: 1 - lr * weight_decay; Adam: 1 (exact no-op)
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;          // -lr / (1 - beta1^t)
};

/// Coefficients for step t >= 1 (1-based, as torch's state["step"] after its increment).
/// Host only. Arguments are the double hyper-parameters torch's Python code sees.
/// bias_correction false: Adam without the moment bias correction (DeepSpeed's
/// bias_correction=False of FusedAdam / DeepSpeedCPUAdam: bias_correction1 = 1 and
/// bias_correction2 = 1, so p = p - lr * m / (sqrt(v) + eps); Kingma & Ba 2015, Alg. 1 without
/// its lines m^ = m / (1 - beta1^t), v^ = v / (1 - beta2^t)). The coefficients are then exactly
/// 1.0f and -lr, so the one update above (on every path: scalar, SIMD, GPU) needs no change.
inline AdamCoeffs adam_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay,
                              bool decoupled, std::int64_t step, float grad_scale, bool bias_correction = true) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bias_correction2 = bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  AdamCoeffs c{};
  c.grad_scale = grad_scale;
  c.l2 = decoupled ? 0.0f : static_cast<float>(weight_decay);
  c.decay = decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(eps);
  c.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return c;
}

/// One element's update: p (master weight), m (exp_avg), v (exp_avg_sq) in place, from the raw
/// gradient `grad` (already widened to float, before grad_scale).
ZOE_HD void adam_update(const AdamCoeffs& c, float grad, float& p, float& m, float& v) {
  float g = grad * c.grad_scale;
  if (c.l2 != 0.0f) g = g + c.l2 * p;
  p = p * c.decay;
  m = m * c.beta1 + c.one_minus_beta1 * g;
  v = v * c.beta2 + (c.one_minus_beta2 * g) * g;
  const float denom = sqrtf(v) / c.bias_correction2_sqrt + c.eps;
  p = p + (c.neg_step_size * m) / denom;
}

}  // namespace zoe::kernels
