// zoe::TorchModel: a libtorch C++ model (torch::nn::Module) trained through a zoe::Engine.
// Library zoe_torch (target zoe::torch), built when CMake finds libtorch; libzoe itself has no
// torch dependency. docs/torch.md shows a complete trainer (examples/torch_llama).
//
// libtorch's C++ frontend has no module hooks, so the wrapper drives each chosen submodule
// ("part") itself, as DeepSpeed's ZeRO-3 does in Python with the same pieces:
//  - at construction every parameter of the root module is registered with the Engine under its
//    named_parameters() name, with its current values as initial value (torch's own init kept),
//    frozen when requires_grad is false; each part becomes one zoe module, the parameters under
//    no part one more module named "<rest>". A tensor registered under two names (tied weights)
//    is one zoe parameter listed in each module using it (its gradients add up). The torch
//    parameters' storage is then released: outside run() each keeps its shape and the compute
//    dtype but no memory, and any operator on it (a part called directly, an optimizer or
//    clip_grad_norm_ over module->parameters(), printing it) throws UsageError naming the
//    parameter, its part and the operator (libtorch has no module hooks to catch the call
//    itself; the released tensors carry libtorch's PrivateUse1 backend key, whose fallback
//    refuses them, so a process with a PrivateUse1 backend of its own cannot use zoe_torch).
//  - run(part, fn, inputs) opens the part's forward (Engine::begin_forward: gathered at stage 3),
//    points the torch parameters at zoe's buffers (Tensor::set_data, no copy), calls fn, points
//    them back at empty tensors and closes the forward. The outputs hang off one autograd
//    node of the part. When torch's backward reaches that node it opens the part's backward
//    (begin_backward: gathered again at stage 3, zeroed gradient buffers), points each trainable
//    parameter's .grad at zoe's gradient buffer, runs the part's backward (torch's AccumulateGrad
//    adds into zoe's buffer in place), and closes it (end_backward) before handing the input
//    gradients on: every parameter of the part has its gradient when end_backward runs.
//  - stages 0-2 keep the forward's autograd graph (zoe's parameter buffers persist until step()).
//    Stage 3 frees the gathered buffer after the forward, so the part's forward is recomputed in
//    its backward (activation checkpointing, by necessity: torch's saved tensors would point into
//    freed memory); TorchPart::checkpoint asks for the same at stages 0-2 (activation memory of
//    the part: its inputs only). A recomputed fn must be deterministic (no dropout): the
//    recomputation does not replay torch's random generator.
//  - engine.step() replaces torch::optim (zoe's Adam/AdamW, on the engine's tiers); fp16 loss
//    scaling: multiply the loss by engine.loss_scale() before backward.
//
// Limits: CPU tensors (Debian's libtorch is CPU-only; on a CUDA libtorch the adapter would have to
// set torch's current stream from Engine::compute_place(), which it does not do yet: the
// constructor throws UsageError for an engine on a CUDA device). Parts do not nest (fn must not
// call run()). Not thread-safe: one thread drives a TorchModel and its engine, including backward
// (CPU autograd runs on the calling thread).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zoe/engine.hpp"

namespace zoe {

/// One submodule of the root that becomes a zoe module.
struct TorchPart {
  /// Its name in root.named_modules() ("layers.3", "model.embed_tokens"); not empty.
  std::string name;
  /// Recompute its forward in backward at every stage (always done at stage 3).
  bool checkpoint = false;
};

/// Handle of a wrapped part (index in the order given; the "<rest>" part, if any, is last).
struct TorchPartId {
  std::uint32_t index = 0;
};

/// A part's forward: the part's outputs computed from `inputs` and the part's own parameters
/// (read through the torch module, e.g. `layer->forward(inputs[0])`). It must not capture other
/// tensors that require grad (their gradients would be lost) nor call TorchModel::run.
using TorchForward = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

class TorchModel {
 public:
  /// Registers every parameter of `root` with `engine` and one zoe module per part (in the order
  /// given, then "<rest>" for the parameters under no part, if any). Before the engine's first
  /// forward. Parameter values are read now (any dtype, converted to fp32; CPU tensors).
  /// Throws UsageError naming the part for an empty or unknown part name (with the known names),
  /// a part given twice or nested in another part, a part without parameters, an engine not on
  /// the host device; the Engine's errors for anything it refuses (e.g. after its first forward).
  /// `root` is kept alive by the TorchModel; do not move it to another device or dtype after.
  TorchModel(Engine& engine, std::shared_ptr<torch::nn::Module> root, const std::vector<TorchPart>& parts);
  /// The torch parameters stay empty: read the trained values first (parameter_values(), or
  /// Engine::export_safetensors). Autograd nodes still alive then refuse their backward.
  ~TorchModel();
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  /// The names of root's direct children of `container` (a ModuleList / Sequential), prefixed:
  /// children_of(*root, "layers") = {"layers.0", "layers.1", ...}. Throws UsageError naming it
  /// when root has no submodule `container`.
  static std::vector<std::string> children_of(const torch::nn::Module& root, const std::string& container);

  /// The part named `name` ("<rest>" for the rest). Throws UsageError naming it (with the names).
  TorchPartId part(const std::string& name) const;
  /// Its zoe module and its name.
  ModuleId module(TorchPartId part) const;
  const std::string& part_name(TorchPartId part) const;
  std::size_t part_count() const;

  /// Runs `fn(inputs)` as the forward of `part` (see the file comment) and returns its outputs:
  /// when grad mode is on and something requires a gradient (an input or a trainable parameter
  /// of the part), they are attached to the part's autograd node; otherwise a plain forward
  /// (evaluation). Inputs and outputs are CPU tensors of any shape and dtype; inputs must not be
  /// modified in place before the backward (a recomputed part checks their version: UsageError).
  /// Throws UsageError naming the part: for a part id out of range; when called inside another
  /// part's fn (nesting, naming both); when the part already ran a forward with gradients whose
  /// backward has not run (a submodule used twice in one forward, i.e. shared weights, is
  /// refused there; register the shared tensor under two parts instead). The Engine's errors
  /// (UsageError naming the module) for calls out of order. Errors of fn pass through (torch's
  /// c10::Error). The part's backward, run from torch's backward, throws the same kinds.
  std::vector<at::Tensor> run(TorchPartId part, const TorchForward& fn, const std::vector<at::Tensor>& inputs);
  /// One input, one output.
  at::Tensor run(TorchPartId part, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);

  /// The full fp32 value of every registered parameter (named_parameters() names, registration
  /// order; a tied tensor under its first name), read from the engine (Engine::read_parameter:
  /// a collective, every rank calls it; between steps). CPU float tensors of the torch shapes.
  std::vector<std::pair<std::string, at::Tensor>> parameter_values();

  /// The torch module given at construction.
  torch::nn::Module& root() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace zoe
