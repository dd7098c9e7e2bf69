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
// Memory: fp32 copies of the largest module's parameters and gradients (wte's module: 2*V*C*4 B).
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
    if (params_.size() < params.size()) params_.resize(params.size());
    if (grads_.size() < grads.size()) grads_.resize(grads.size());
    ModuleView<float> v;
    for (std::size_t i = 0; i < params.size(); ++i) {
      params_[i].resize(params[i].n);
      ops_.widen(storage_, params[i].data, params[i].n, params_[i].data());
      v.params.push_back(params_[i].data());
    }
    for (std::size_t i = 0; i < grads.size(); ++i) {
      ops_.zero(grads_[i], grads[i].n);
      v.grads.push_back(grads_[i].data());
    }
    return v;
  }
  void close(const std::vector<Buffer16>& grads, float scale) override {
    GPT_CHECK(grads.size() <= grads_.size(), "ModuleCopies::close: ", grads.size(),
              " gradients, but open() was given ", grads_.size());
    for (std::size_t i = 0; i < grads.size(); ++i)
      ops_.narrow_add(storage_, grads_[i].data(), grads[i].n, scale, grads[i].data);
  }

 private:
  Ops& ops_;
  kernels::Storage16 storage_;
  std::vector<Array> params_, grads_;
};

}  // namespace gpt
