// Shared helpers of the optimizer tests: deterministic inputs, the ISAs this CPU runs, bit compares.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/half.hpp"
#include "src/optim/cpu_adam.hpp"
#include "tests/optim/adam_reference.hpp"

namespace zoe::optim::test {

/// The library's hyper-parameters for the reference's.
inline AdamHyper to_hyper(const RefHyper& r) {
  AdamHyper h;
  h.lr = r.lr;
  h.beta1 = r.beta1;
  h.beta2 = r.beta2;
  h.eps = r.eps;
  h.weight_decay = r.weight_decay;
  h.decoupled = r.decoupled;
  return h;
}

/// Every ISA path this CPU can run (scalar always); the others are reported once if missing.
inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa_supported(isa)) isas.push_back(isa);
    else std::printf("note: ISA path %s not checked: this CPU lacks it\n", std::string(isa_name(isa)).c_str());
  }
  return isas;
}

/// n floats uniform in [lo, hi), from a fixed seed.
inline std::vector<float> uniform(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (auto& f : x) f = dist(rng);
  return x;
}

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline std::uint64_t bits_f64(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

/// Index of the first element whose bits differ, or -1.
inline long first_bit_difference(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (bits(a[i]) != bits(b[i])) return static_cast<long>(i);
  return -1;
}

/// fp32 values -> half bits of dtype (round to nearest even) and the exact floats they hold.
inline std::vector<std::uint16_t> to_half(const std::vector<float>& x, DType dtype, std::vector<float>* exact) {
  std::vector<std::uint16_t> h(x.size());
  if (exact) exact->resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    h[i] = dtype == DType::bf16 ? kernels::f32_to_bf16(x[i]) : kernels::f32_to_f16(x[i]);
    if (exact) (*exact)[i] = dtype == DType::bf16 ? kernels::bf16_to_f32(h[i]) : kernels::f16_to_f32(h[i]);
  }
  return h;
}

}  // namespace zoe::optim::test
