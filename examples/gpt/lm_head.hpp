// The trainer's lm_head (tied to wte) with softmax cross-entropy, on oneDNN matmuls: the
// model's hot loop (2·C·V flops per token forward, 6·C·V with the backward, V = 50,257).
//
// Same math as ops::lm_head_cross_entropy (the reference, Eigen, any scalar type):
//   logits = x wte^T,  loss = mean_n (logsumexp(logits_n) - logits_n[y_n]),
//   G = (softmax(logits) - onehot(y)) / N,  dx += G wte,  dwte += G^T x,
// chunked over rows so the [N, V] logits never exist at once. Evaluation (loss) always
// multiplies in fp32. Training (loss_and_grad) multiplies in the head's precision:
//  - fp32: fp32 operands, fp32 accumulation.
//  - bf16: x, wte and G rounded to bfloat16 (round to nearest even), products accumulated in
//    fp32 (AVX512_BF16's dot products, about 3x the fp32 GEMM on this machine), the softmax
//    and the loss in fp32: the mixed precision of bf16 autocast training (Kalamkar et al. 2019,
//    "A Study of BFLOAT16 for Deep Learning Training").
// The result is a function of the operands' values only (64-byte aligned scratch, fixed
// primitives, the calling thread's OpenMP thread count), so runs and resumed runs repeat bitwise.
// Thread-safety: one LmHead per thread; oneDNN uses the calling thread's OpenMP threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace gpt {

enum class HeadPrecision { fp32, bf16 };
/// "fp32" or "bf16".
std::string head_precision_name(HeadPrecision p);
/// Parses "fp32" or "bf16"; throws zoe::Error naming `field` and the value otherwise.
HeadPrecision parse_head_precision(const std::string& value, const std::string& field);

/// Rounds fp32 to bfloat16 bits, round to nearest even (finite inputs). What the bf16 head
/// feeds its matmuls; exposed for the tests' reference.
inline std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

class LmHead {
 public:
  /// `chunk_rows` (>= 1): rows per chunk; scratch is about chunk_rows·V·6 bytes (fp32 logits
  /// plus bf16 G). Throws zoe::Error if chunk_rows < 1.
  LmHead(HeadPrecision training_precision, int chunk_rows);
  ~LmHead();
  LmHead(const LmHead&) = delete;
  LmHead& operator=(const LmHead&) = delete;

  HeadPrecision precision() const { return precision_; }

  /// Mean cross-entropy (nats) in fp32 multiplies. x [N, C] fp32 (ln_f output), wte [V, C],
  /// targets [N] in [0, V) (the caller checks the range). N, C, V >= 1.
  double loss(const float* x, const float* wte, const std::int32_t* targets, int N, int C, int V);
  /// The mean loss and its gradients in the head's precision, ADDED into dx [N, C] and
  /// dwte [V, C] (fp32). Same arguments as loss().
  double loss_and_grad(const float* x, const float* wte, const std::int32_t* targets, int N, int C,
                       int V, float* dx, float* dwte);

 private:
  struct Impl;
  double run(const float* x, const float* wte, const std::int32_t* targets, int N, int C, int V,
             float* dx, float* dwte, bool bf16);

  HeadPrecision precision_;
  int chunk_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt
