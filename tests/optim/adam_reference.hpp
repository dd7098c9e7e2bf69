// Independent scalar reference for the optimizer tests: torch 1.13's _single_tensor_adam[w]
// written out again here (it does not call the library or kernels/adam_math.hpp).
// Compiled with -ffp-contract=off, so every line is the separately rounded IEEE float
// operation torch's scalar loop performs.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

struct RefHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  bool decoupled = true;
};

/// One torch step t (>= 1) over p, m, v with gradient g (already float, before scale).
inline void ref_adam_step(const RefHyper& h, std::int64_t t, float scale, std::vector<float>& p, std::vector<float>& m,
                          std::vector<float>& v, const std::vector<float>& g) {
  const double bias_correction1 = 1 - std::pow(h.beta1, double(t));
  const double bias_correction2 = 1 - std::pow(h.beta2, double(t));
  const float step_size_neg = float(-(h.lr / bias_correction1));
  const float bc2_sqrt = float(std::sqrt(bias_correction2));
  const float beta1 = float(h.beta1), beta2 = float(h.beta2);
  const float alpha1 = float(1 - h.beta1), alpha2 = float(1 - h.beta2);
  for (std::size_t i = 0; i < p.size(); ++i) {
    float grad = g[i] * scale;
    if (!h.decoupled && h.weight_decay != 0) grad = grad + float(h.weight_decay) * p[i];
    if (h.decoupled) p[i] = p[i] * float(1 - h.lr * h.weight_decay);
    m[i] = m[i] * beta1;
    m[i] = m[i] + alpha1 * grad;
    v[i] = v[i] * beta2;
    v[i] = v[i] + alpha2 * grad * grad;
    float denom = std::sqrt(v[i]) / bc2_sqrt;
    denom = denom + float(h.eps);
    p[i] = p[i] + step_size_neg * m[i] / denom;
  }
}
