// Mixed precision at the module boundary: the engine keeps a module's compute parameters and
// gradients in bf16 or fp16 (its fp32 master weights and optimizer states stay in the engine);
// the model computes in fp32 on fp32 working copies of the one open module.
//
// open(): each 16-bit parameter is widened into an fp32 copy (exact, so the model multiplies the
// bf16/fp16 values themselves, accumulating in fp32: what a bf16-input, fp32-accumulate GEMM
// does) and each gradient gets a zeroed fp32 buffer the model adds into. close(): every fp32
// gradient, times the loss scale, is rounded once (nearest even) into the engine's 16-bit
// gradient buffer. Scaling there instead of at the loss gives the same bits as scaling the loss
// whenever the scale is a power of two (the dynamic scaler's always are): the backward is linear
// in the loss's gradient and a power-of-two factor is exact in fp32, barring fp32 overflow at
// 2^128, far beyond fp16's 65504 where the rounding turns an oversized gradient into inf for the
// engine's overflow check. Activations stay fp32 (a choice: see docs/gpt.md "Precision").
// Memory: fp32 copies of the largest module's parameters and gradients (wte's module: 2*V*C*4 B),
// in two arenas that grow to that module's size and are reused by every module.
// Thread-safety: one object per thread (it owns the buffers), used with its Ops' thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "examples/gpt/error.hpp"
#include "examples/gpt/model.hpp"
#include "examples/gpt/storage_dtype.hpp"

namespace gpt {

/// A 16-bit buffer of the engine: n elements of bf16 or fp16 bits in the backend's memory.
struct Buffer16 {
  std::uint16_t* data = nullptr;
  std::size_t n = 0;
};

/// The open module's fp32 working copies (see the file comment).
class ModuleCopies {
 public:
  virtual ~ModuleCopies() = default;
  /// fp32 copies of `params` (widened) and zeroed fp32 gradients sized as `grads` (empty during
  /// forward). Valid until the next open(). Throws what the backend's allocation throws.
  virtual ModuleView<float> open(const std::vector<Buffer16>& params, const std::vector<Buffer16>& grads) = 0;
  /// grads[i] = round(grads[i] + scale * fp32 gradient i), for the buffers open() was given.
  virtual void close(const std::vector<Buffer16>& grads, float scale) = 0;
};

/// ModuleCopies in the memory of an Ops (host vectors for CpuOps/KernelOps, device arrays for
/// CudaOps), converted by its widen/narrow_add on its stream. `ops` must outlive this object.
template <class Ops>
class OpsModuleCopies final : public ModuleCopies {
  using Array = typename Ops::template Array<float>;

 public:
  OpsModuleCopies(Ops& ops, kernels::Storage16 storage) : ops_(ops), storage_(storage) {}

  ModuleView<float> open(const std::vector<Buffer16>& params, const std::vector<Buffer16>& grads) override {
    // One arena for the parameters and one for the gradients, laid out anew per module: the
    // copies take the largest module's size once (not once per position in a module, which held
    // wte's copy twice: position 0 of the embeddings, position 2 of the head).
    const std::vector<std::size_t> p_at = layout(params), g_at = layout(grads);
    params_.resize(p_at.back());
    ops_.zero(grads_, g_at.back());
    ModuleView<float> v;
    for (std::size_t i = 0; i < params.size(); ++i) {
      ops_.widen(storage_, params[i].data, params[i].n, params_.data() + p_at[i]);
      v.params.push_back(params_.data() + p_at[i]);
    }
    for (std::size_t i = 0; i < grads.size(); ++i) v.grads.push_back(grads_.data() + g_at[i]);
    open_grads_ = g_at;
    return v;
  }
  void close(const std::vector<Buffer16>& grads, float scale) override {
    GPT_CHECK(grads.size() + 1 <= open_grads_.size(), "ModuleCopies::close: ", grads.size(),
              " gradients, but open() was given ", open_grads_.size() - 1);
    for (std::size_t i = 0; i < grads.size(); ++i)
      ops_.narrow_add(storage_, grads_.data() + open_grads_[i], grads[i].n, scale, grads[i].data);
  }

 private:
  // Offsets of the buffers in an arena, each rounded up to 16 floats (64 bytes, a cache line
  // and an AVX-512 vector); the last entry is the arena's size.
  static std::vector<std::size_t> layout(const std::vector<Buffer16>& buffers) {
    std::vector<std::size_t> at{0};
    for (const Buffer16& b : buffers) at.push_back(at.back() + (b.n + 15) / 16 * 16);
    return at;
  }

  Ops& ops_;
  kernels::Storage16 storage_;
  Array params_, grads_;             // the arenas
  std::vector<std::size_t> open_grads_{0};  // the open module's gradient offsets (layout())
};

}  // namespace gpt
