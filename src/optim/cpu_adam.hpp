// CPU Adam / AdamW over fp32 master weights and fp32 exp_avg / exp_avg_sq, with a
// gradient in fp32, bf16 or fp16 and an optional bf16/fp16 copy of the updated weights.
// Math (torch.optim.Adam / AdamW; Kingma & Ba 2015 Alg. 1; Loshchilov & Hutter 2019 Alg. 2):
//   g  = grad * grad_scale                  (grad_scale = clip_coef / loss_scale / ...)
//   Adam:  g += weight_decay * p            AdamW: p -= lr * weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// `step` (t >= 1) is an argument, so a resumed run reproduces an uninterrupted one bitwise.
// Thread-safety: a CpuAdam may be used from one thread at a time; it runs its own
// oneTBB arena. Results are bitwise identical for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "zoe/dtype.hpp"

namespace zoe::optim {

enum class Isa { scalar, avx2, avx512 };
std::string_view isa_name(Isa isa);
/// Best ISA this CPU supports (CPUID), lowered by env ZOE_ISA=scalar|avx2|avx512.
Isa active_isa();

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = true;  // true: AdamW, false: Adam (L2 added to the gradient)
};

class CpuAdam {
 public:
  /// threads: size of the oneTBB arena (0 = all hardware threads). isa: forced path.
  explicit CpuAdam(int threads = 0);
  CpuAdam(int threads, Isa isa);
  ~CpuAdam();
  Isa isa() const;
  int threads() const;

  /// One update of n elements. grad has n elements of grad_dtype. If out_half is not null it
  /// receives the updated weights as out_dtype (bf16 or fp16, round to nearest even).
  void step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, float* exp_avg,
            float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n, void* out_half = nullptr,
            DType out_dtype = DType::bf16);
  /// Sum of float(x[i])^2 in fp64, deterministic for any thread count.
  double sum_squares(const void* x, DType dtype, std::size_t n);
  /// True if every x[i] is finite.
  bool all_finite(const void* x, DType dtype, std::size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe::optim
