// Independent scalar reference for the optimizer tests: torch 1.13's _single_tensor_adam[w]
// written out again here (it does not call the library or kernels/adam_math.hpp).
// Compiled with -ffp-contract=off, so every line is the separately rounded IEEE float
// operation torch's scalar loop performs.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

struct RefHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  bool decoupled = true;
};

/// The float constants of step t, computed as torch's Python code does (double, rounded once).
struct RefCoeffs {
  RefCoeffs(const RefHyper& h, std::int64_t t) {
    const double bias_correction1 = 1 - std::pow(h.beta1, double(t));
    const double bias_correction2 = 1 - std::pow(h.beta2, double(t));
    step_size_neg = float(-(h.lr / bias_correction1));
    bc2_sqrt = float(std::sqrt(bias_correction2));
    beta1 = float(h.beta1), beta2 = float(h.beta2);
    alpha1 = float(1 - h.beta1), alpha2 = float(1 - h.beta2);
  }
  float step_size_neg, bc2_sqrt, beta1, beta2, alpha1, alpha2;
};

/// One element of a torch step: p, m, v in place (fp32), gradient g (already float, before scale).
inline void ref_adam_element(const RefHyper& h, const RefCoeffs& k, float scale, float& p, float& m, float& v,
                             float g) {
  float grad = g * scale;
  if (!h.decoupled && h.weight_decay != 0) grad = grad + float(h.weight_decay) * p;
  if (h.decoupled) p = p * float(1 - h.lr * h.weight_decay);
  m = m * k.beta1;
  m = m + k.alpha1 * grad;
  v = v * k.beta2;
  v = v + k.alpha2 * grad * grad;
  float denom = std::sqrt(v) / k.bc2_sqrt;
  denom = denom + float(h.eps);
  p = p + k.step_size_neg * m / denom;
}

/// One torch step t (>= 1) over p, m, v with gradient g (already float, before scale).
inline void ref_adam_step(const RefHyper& h, std::int64_t t, float scale, std::vector<float>& p, std::vector<float>& m,
                          std::vector<float>& v, const std::vector<float>& g) {
  const RefCoeffs k(h, t);
  for (std::size_t i = 0; i < p.size(); ++i) ref_adam_element(h, k, scale, p[i], m[i], v[i], g[i]);
}

/// bf16 bits -> float: the bits are the float's upper half (exact).
inline float ref_bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bf16 bits, round to nearest, ties to even, as torch's tensor.to(torch.bfloat16): keep
/// the upper half, add one unit if the dropped lower half is above one half, or exactly one half
/// and the kept half is odd (a carry into the exponent is right: up to inf past the largest
/// finite value). NaN: the upper half with the quiet bit set (sign and payload top kept).
inline std::uint16_t ref_float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  std::uint16_t upper = static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t lower = u & 0xffffu;
  if (std::isnan(f)) return static_cast<std::uint16_t>(upper | 0x0040u);
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
  return upper;
}

/// One step with exp_avg and exp_avg_sq stored in bf16 (m16, v16: bf16 bits): m and v widened,
/// the fp32 step above (the weight updated with the fp32 m and v of this step), then m and v
/// rounded to nearest even and stored.
inline void ref_adam_step_bf16_states(const RefHyper& h, std::int64_t t, float scale, std::vector<float>& p,
                                      std::vector<std::uint16_t>& m16, std::vector<std::uint16_t>& v16,
                                      const std::vector<float>& g) {
  const RefCoeffs k(h, t);
  for (std::size_t i = 0; i < p.size(); ++i) {
    float m = ref_bf16_to_float(m16[i]), v = ref_bf16_to_float(v16[i]);
    ref_adam_element(h, k, scale, p[i], m, v, g[i]);
    m16[i] = ref_float_to_bf16(m);
    v16[i] = ref_float_to_bf16(v);
  }
}
