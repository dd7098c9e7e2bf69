// CPU Adam / AdamW over fp32 master weights and fp32 exp_avg / exp_avg_sq, with a
// gradient in fp32, bf16 or fp16 and an optional bf16/fp16 copy of the updated weights.
// Math (torch.optim.Adam / AdamW 1.13; Kingma & Ba 2015 Alg. 1; Loshchilov & Hutter 2019 Alg. 2):
//   g  = grad * grad_scale                  (grad_scale = clip_coef / loss_scale / ...)
//   Adam:  g += weight_decay * p            AdamW: p -= lr * weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// eps is added after the square root of the bias-corrected second moment, as torch does. The
// exact operation order (the one torch's kernels use) is in kernels/adam_math.hpp.
// `step` (t >= 1) is an argument, so a resumed run reproduces an uninterrupted one bitwise.
//
// ISA paths (scalar, AVX2+F16C, AVX-512) and threads: every path performs the same IEEE
// binary32 operations in the same order with no FMA contraction (the library's optim sources are
// compiled with -ffp-contract=off), and every element is independent, so all ISA paths and all
// thread counts give bitwise identical weights, moments and half outputs (tested). Against torch
// itself, whose vector kernels fuse some multiply-adds into FMAs, results agree to ~1 ulp per step.
// sum_squares adds in a fixed order (below) that every path reproduces, so it is bitwise equal
// across ISAs and thread counts too.
//
// Thread-safety: a CpuAdam may be used from one thread at a time; it runs its own oneTBB arena
// of the size given. Distinct CpuAdam objects may be used concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "zoe/dtype.hpp"

namespace zoe::optim {

/// Instruction-set paths. scalar: portable C++. avx2: AVX2 + F16C. avx512: AVX-512 F/BW/VL/DQ,
/// with vcvtneps2bf16 for bf16 outputs when the CPU has AVX512_BF16 (else integer rounding, same
/// result), and vcvtps2ph / vcvtph2ps for fp16.
enum class Isa { scalar, avx2, avx512 };
/// "scalar", "avx2", "avx512".
std::string_view isa_name(Isa isa);
/// True if this CPU (CPUID + OS register state) can run `isa`.
bool isa_supported(Isa isa);
/// Best ISA this CPU supports (CPUID), lowered by env ZOE_ISA=scalar|avx2|avx512. Throws
/// zoe::ConfigError (key "ZOE_ISA") for another value or for an ISA this CPU lacks.
Isa active_isa();

/// Hyper-parameters, in double like torch's Python floats (so 1 - beta2 is computed as torch does;
/// float literals convert implicitly). lr in parameter units per step; betas in [0, 1); eps > 0.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // true: AdamW, false: Adam (L2 added to the gradient)
  bool bias_correction = true;  // false: no moment bias correction (kernels::adam_coeffs)
};

class CpuAdam {
 public:
  /// Element chunk every parallel loop is cut into (a multiple of every SIMD width; independent
  /// of the thread count, which is what makes sum_squares deterministic).
  static constexpr std::size_t kChunk = 16384;
  /// Lanes of sum_squares' fp64 accumulators: element i (counted from its chunk's start) is
  /// added to lane i % kSumLanes; a chunk's partial is lane 0 + lane 1 + ... + lane 31 (in that
  /// order), and the result is partial 0 + partial 1 + ... in chunk order.
  static constexpr std::size_t kSumLanes = 32;

  /// threads: size of the oneTBB arena (0 = all hardware threads). The ISA is active_isa().
  /// Throws zoe::UsageError for threads < 0, zoe::ConfigError for a bad ZOE_ISA or
  /// ZOE_ADAM_STREAM_BYTES.
  explicit CpuAdam(int threads = 0);
  /// As above with a forced ISA; throws zoe::UsageError if this CPU cannot run it.
  CpuAdam(int threads, Isa isa);
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;
  Isa isa() const;
  int threads() const;

  /// One update of n elements in place: master, exp_avg, exp_avg_sq (fp32, n each). grad has n
  /// elements of grad_dtype. If out_half is not null it receives the updated weights as out_dtype
  /// (bf16 or fp16, n elements, round to nearest even, NaN stays NaN). step is t >= 1.
  /// Arrays must not overlap. Updates whose bytes moved exceed the last-level cache (its reported
  /// size clamped to [32, 128] MiB; env ZOE_ADAM_STREAM_BYTES, read by the constructor, overrides
  /// it) and whose fp32 arrays are 64-byte aligned (out_half 32-byte) use non-temporal stores.
  /// Throws zoe::UsageError for step < 1, a null array with n > 0, or out_dtype fp32.
  void step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, float* exp_avg,
            float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n, void* out_half = nullptr,
            DType out_dtype = DType::bf16);
  /// Sum of float(x[i])^2 over n elements of dtype, accumulated in fp64 in the fixed order given
  /// at kSumLanes (squares of floats are exact in fp64), so the result is bitwise the same for
  /// any thread count and ISA. NaN / inf propagate. Throws zoe::UsageError for null x with n > 0.
  double sum_squares(const void* x, DType dtype, std::size_t n);
  /// True if every x[i] (n elements of dtype) is finite (not inf, not NaN); true for n = 0.
  bool all_finite(const void* x, DType dtype, std::size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe::optim
