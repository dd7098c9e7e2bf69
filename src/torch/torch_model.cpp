// zoe::TorchModel (include/zoe/torch.hpp): parts of a torch::nn::Module as zoe modules. The only
// translation unit of zoe_torch that includes libtorch's autograd internals.
#include "zoe/torch.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "src/common/check.hpp"
#include "src/torch/released_parameter.hpp"

namespace zoe {

namespace {

using torch::autograd::variable_list;

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::f32: return at::kFloat;
    case DType::bf16: return at::kBFloat16;
    default: return at::kHalf;
  }
}

DType compute_dtype(const Config& c) {
  if (c.bf16.enabled) return DType::bf16;
  if (c.fp16.enabled) return DType::f16;
  return DType::f32;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < 20; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 20) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

/// Where a part is in the current micro-batch: idle -> forward -> graph_pending (its outputs
/// await torch's backward) -> backward -> idle. graph_pending -> abandoned when torch drops the
/// graph without reaching the part (its gradients would silently be missing): the next run()
/// of the part reports it and the part is idle again.
enum class PartPhase : std::uint8_t { idle, forward, graph_pending, backward, abandoned };

}  // namespace

struct PartState {
  std::string name;
  ModuleId module;
  bool checkpoint = false;
  std::vector<at::Tensor> params;  // the torch parameters, in the zoe module's order
  std::vector<bool> trainable;     // requires_grad at construction (not frozen)
  PartPhase phase = PartPhase::idle;
};

struct TorchModel::Impl {
  Impl(Engine& e, std::shared_ptr<torch::nn::Module> r)
      : engine(e), root(std::move(r)), compute(scalar_type(compute_dtype(e.config()))) {}

  Engine& engine;
  std::shared_ptr<torch::nn::Module> root;
  at::ScalarType compute;
  bool stage3 = engine.config().zero_optimization.stage == 3;
  std::vector<PartState> parts;
  struct Registered {
    std::string name;
    at::Tensor tensor;
    ParamId id;
  };
  std::vector<Registered> registered;
  std::optional<std::uint32_t> active;  // the part whose forward or backward runs now
  std::weak_ptr<Impl> self;             // for the autograd nodes (they may outlive the TorchModel)

  /// What each torch parameter holds between runs, made once at construction: its shape, no
  /// memory, and a tag that makes every operator on it throw UsageError naming the parameter and
  /// its part (released_parameter.hpp). set_data shares it, so a run allocates nothing for it.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> released;

  at::Tensor view_of(const TensorView& v) const {
    if (v.numel() == 0 || v.data == nullptr) return at::empty(v.shape, at::TensorOptions().dtype(compute));
    return at::from_blob(v.data, v.shape, at::TensorOptions().dtype(scalar_type(v.dtype)));
  }

  /// Points the part's torch parameters at zoe's buffers (and, with grads, their .grad at zoe's
  /// gradient buffers: torch's AccumulateGrad then adds into them in place).
  void bind(PartState& p, const ModuleTensors& t) {
    for (std::size_t i = 0; i < p.params.size(); ++i) {
      p.params[i].set_data(view_of(t.params[i]));
      if (!t.grads.empty() && p.trainable[i]) p.params[i].mutable_grad() = view_of(t.grads[i]);
    }
  }
  void unbind(PartState& p) {
    for (auto& param : p.params) {
      param.mutable_grad().reset();
      param.set_data(released.at(param.unsafeGetTensorImpl()));
    }
  }

  void check_not_nested(std::uint32_t index, const char* what) const {
    if (active)
      ZOE_THROW(UsageError, "TorchModel: ", what, " of part '", parts[index].name, "' inside part '",
                parts[*active].name, "' (parts do not nest: a part's function must not run another part)");
  }

  std::vector<at::Tensor> run(std::uint32_t index, const TorchForward& fn, const std::vector<at::Tensor>& inputs);
};

namespace {

/// The autograd node of one forward of a part: its outputs' grad_fn, its inputs' consumer.
class PartBackward final : public torch::autograd::Node {
 public:
  PartBackward(std::weak_ptr<TorchModel::Impl> impl, std::uint32_t part, std::string part_name)
      : impl_(std::move(impl)), part_(part), part_name_(std::move(part_name)) {}

  ~PartBackward() override {
    if (done_) return;
    // torch dropped the graph before reaching this part: its forward will have no backward.
    if (auto impl = impl_.lock()) {
      PartState& p = impl->parts[part_];
      if (p.phase == PartPhase::graph_pending) p.phase = PartPhase::abandoned;
    }
  }

  std::string name() const override { return "zoe::TorchPartBackward[" + part_name_ + "]"; }

  void release_variables() override {
    inner_inputs_.clear();
    inner_outputs_.clear();
    saved_inputs_.clear();
    fn_ = nullptr;
  }

  variable_list apply(variable_list&& grads) override;

  // Set by Impl::run.
  bool recompute = false;
  TorchForward fn_;                          // recompute: the part's forward
  std::vector<at::Tensor> saved_inputs_;     // recompute: the inputs (detached)
  std::vector<std::int64_t> saved_versions_;
  std::vector<bool> input_requires_grad_;
  std::vector<at::Tensor> inner_inputs_;     // kept graph: the leaves fn saw
  std::vector<at::Tensor> inner_outputs_;    // kept graph: fn's outputs, with their graph
  std::vector<std::size_t> output_index_;    // this node's input k is output output_index_[k]
  std::vector<std::size_t> grad_inputs_;     // the inputs that require grad (this node's outputs)
  std::vector<const void*> forward_data_;    // kept graph: the parameter buffers of the forward

 private:
  std::weak_ptr<TorchModel::Impl> impl_;
  std::uint32_t part_;
  std::string part_name_;
  bool done_ = false;
};

variable_list PartBackward::apply(variable_list&& grads) {
  auto impl = impl_.lock();
  ZOE_CHECK_USAGE(impl, "TorchModel: backward of part '", part_name_, "' after its TorchModel was destroyed");
  PartState& p = impl->parts[part_];
  ZOE_CHECK_USAGE(!done_ && p.phase == PartPhase::graph_pending, "TorchModel: a second backward through part '",
                  part_name_, "' for one forward (retain_graph=true is not supported: zoe runs one backward "
                  "per forward of a module)");
  impl->check_not_nested(part_, "backward");
  if (recompute)
    for (std::size_t i = 0; i < saved_inputs_.size(); ++i)
      if (saved_inputs_[i].defined() && saved_inputs_[i]._version() != saved_versions_[i])
        ZOE_THROW(UsageError, "TorchModel: input ", i, " of part '", part_name_,
                  "' was modified in place between its forward and its backward (its forward is recomputed "
                  "from the inputs)");
  const ModuleTensors& t = impl->engine.begin_backward(p.module);
  p.phase = PartPhase::backward;
  impl->active = part_;
  try {
    impl->bind(p, t);
    if (!recompute)
      for (std::size_t i = 0; i < forward_data_.size(); ++i)
        ZOE_CHECK(t.params[i].data == forward_data_[i] || t.params[i].numel() == 0, "part '", part_name_,
                  "': the engine moved parameter ", i, " between forward and backward; its kept autograd graph "
                  "would read the old buffer (use TorchPart::checkpoint)");
    std::vector<at::Tensor> ins, outs;
    if (recompute) {
      for (std::size_t i = 0; i < saved_inputs_.size(); ++i) {
        at::Tensor x = saved_inputs_[i].defined() ? saved_inputs_[i].detach() : at::Tensor();
        if (input_requires_grad_[i]) x.requires_grad_(true);
        ins.push_back(std::move(x));
      }
      at::AutoGradMode grad_on(true);
      outs = fn_(ins);
    } else {
      ins = inner_inputs_;
      outs = inner_outputs_;
    }
    std::vector<at::Tensor> roots, root_grads;
    for (std::size_t k = 0; k < output_index_.size(); ++k) {
      std::size_t o = output_index_[k];
      ZOE_CHECK(o < outs.size(), "part '", part_name_, "': its recomputed forward returned ", outs.size(),
                " outputs, fewer than the first time");
      if (grads[k].defined() && outs[o].requires_grad()) {
        roots.push_back(outs[o]);
        root_grads.push_back(grads[k]);
      }
    }
    std::vector<at::Tensor> targets;
    for (std::size_t i = 0; i < p.params.size(); ++i)
      if (p.trainable[i]) targets.push_back(p.params[i]);
    for (std::size_t i : grad_inputs_) targets.push_back(ins[i]);
    if (!roots.empty() && !targets.empty())
      torch::autograd::backward(roots, root_grads, /*retain_graph=*/false, /*create_graph=*/false, targets);
    variable_list input_grads;
    for (std::size_t i : grad_inputs_) {
      input_grads.push_back(ins[i].grad());
      ins[i].mutable_grad().reset();
    }
    impl->unbind(p);
    done_ = true;
    release_variables();
    impl->active.reset();
    p.phase = PartPhase::idle;
    impl->engine.end_backward(p.module);
    return input_grads;
  } catch (...) {
    impl->unbind(p);
    impl->active.reset();
    throw;
  }
}

}  // namespace

std::vector<at::Tensor> TorchModel::Impl::run(std::uint32_t index, const TorchForward& fn,
                                              const std::vector<at::Tensor>& inputs) {
  ZOE_CHECK_USAGE(index < parts.size(), "TorchModel::run: part ", index, " out of range (", parts.size(), " parts)");
  PartState& p = parts[index];
  check_not_nested(index, "forward");
  bool any_trainable = false;
  for (bool t : p.trainable) any_trainable = any_trainable || t;
  bool input_grad = false;
  for (const auto& x : inputs) input_grad = input_grad || (x.defined() && x.requires_grad());
  bool with_graph = at::GradMode::is_enabled() && (any_trainable || input_grad);
  if (p.phase == PartPhase::abandoned) {
    p.phase = PartPhase::idle;
    ZOE_THROW(UsageError, "TorchModel: the outputs of part '", p.name, "' of an earlier forward were dropped "
              "without torch's backward reaching them: that forward's gradients are missing (run evaluation "
              "forwards under torch::NoGradGuard)");
  }
  if (with_graph && p.phase == PartPhase::graph_pending)
    ZOE_THROW(UsageError, "TorchModel: part '", p.name, "' ran a second forward before the backward of its first: "
              "either it is used twice in one forward (shared weights: zoe runs one backward per module and "
              "micro-batch; register the shared tensor in two parts instead) or torch's backward never reached "
              "its previous outputs (its gradients would be missing)");
  bool recompute = with_graph && (stage3 || p.checkpoint);

  std::vector<at::Tensor> ins;
  for (const auto& x : inputs) {
    at::Tensor d = x.defined() ? x.detach() : at::Tensor();
    if (x.defined() && x.requires_grad() && with_graph) d.requires_grad_(true);
    ins.push_back(std::move(d));
  }
  const ModuleTensors& t = engine.begin_forward(p.module);
  p.phase = PartPhase::forward;
  active = index;
  std::vector<at::Tensor> outs;
  try {
    bind(p, t);
    if (recompute) {
      at::NoGradGuard no_grad;
      outs = fn(ins);
    } else {
      outs = fn(with_graph ? ins : inputs);
    }
    unbind(p);
  } catch (...) {
    unbind(p);
    active.reset();
    p.phase = PartPhase::idle;
    engine.end_forward(p.module);
    throw;
  }
  active.reset();
  p.phase = PartPhase::idle;
  engine.end_forward(p.module);
  if (!with_graph) return outs;

  auto node = std::shared_ptr<PartBackward>(new PartBackward(self, index, p.name), torch::autograd::deleteNode);
  node->recompute = recompute;
  variable_list edge_inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      node->grad_inputs_.push_back(i);
      edge_inputs.push_back(inputs[i]);
    }
  node->set_next_edges(torch::autograd::collect_next_edges(edge_inputs));
  if (recompute) {
    node->fn_ = fn;
    for (const auto& x : ins) {
      node->saved_inputs_.push_back(x.defined() ? x.detach() : x);
      node->saved_versions_.push_back(x.defined() ? x._version() : 0);
      node->input_requires_grad_.push_back(x.defined() && x.requires_grad());
    }
  } else {
    node->inner_inputs_ = ins;
    node->inner_outputs_ = outs;
    for (const auto& v : t.params) node->forward_data_.push_back(v.data);
  }
  std::vector<at::Tensor> result(outs.size());
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !torch::autograd::isDifferentiableType(outs[k].scalar_type())) {
      result[k] = outs[k];
      continue;
    }
    result[k] = outs[k].detach();
    torch::autograd::set_history(result[k], node);
    node->output_index_.push_back(k);
  }
  p.phase = PartPhase::graph_pending;
  return result;
}

TorchModel::TorchModel(Engine& engine, std::shared_ptr<torch::nn::Module> root, const std::vector<TorchPart>& parts)
    : impl_(std::make_shared<Impl>(engine, std::move(root))) {
  Impl& im = *impl_;
  im.self = impl_;
  ZOE_CHECK_USAGE(im.root, "TorchModel: root module is null");
  ZOE_CHECK_USAGE(engine.compute_place().kind == DeviceKind::host,
                  "TorchModel: the engine computes on a CUDA device; the torch adapter runs on the host device only "
                  "(it does not set torch's current stream from Engine::compute_place())");
  auto modules = im.root->named_modules("", /*include_self=*/false);
  std::vector<std::string> module_names = modules.keys();
  for (const auto& part : parts) {
    ZOE_CHECK_USAGE(!part.name.empty(), "TorchModel: a part with an empty name (known submodules: ",
                    join_names(module_names), ")");
    ZOE_CHECK_USAGE(modules.contains(part.name), "TorchModel: part '", part.name,
                    "' is no submodule of the root (known submodules: ", join_names(module_names), ")");
    for (const auto& other : im.parts) {
      ZOE_CHECK_USAGE(other.name != part.name, "TorchModel: part '", part.name, "' given twice");
      bool nested = part.name.rfind(other.name + ".", 0) == 0 || other.name.rfind(part.name + ".", 0) == 0;
      ZOE_CHECK_USAGE(!nested, "TorchModel: parts '", other.name, "' and '", part.name, "' nest (one contains the other)");
    }
    PartState s;
    s.name = part.name;
    s.checkpoint = part.checkpoint;
    im.parts.push_back(std::move(s));
  }
  PartState rest;
  rest.name = "<rest>";
  // Register each distinct tensor once, in named_parameters() order.
  std::unordered_map<const void*, ParamId> ids;
  std::vector<std::vector<ParamId>> part_ids(im.parts.size() + 1);
  for (const auto& item : im.root->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const at::Tensor& tensor = item.value();
    ZOE_CHECK_USAGE(tensor.device().is_cpu(), "TorchModel: parameter '", name, "' is on ", tensor.device().str(),
                    "; the adapter takes CPU tensors");
    std::size_t owner = im.parts.size();
    for (std::size_t i = 0; i < im.parts.size(); ++i)
      if (name.rfind(im.parts[i].name + ".", 0) == 0) owner = i;
    PartState& p = owner < im.parts.size() ? im.parts[owner] : rest;
    const void* key = tensor.unsafeGetTensorImpl();
    auto found = ids.find(key);
    ParamId id;
    if (found == ids.end()) {
      at::Tensor value = tensor.detach().to(at::kFloat).contiguous();
      ParamOptions opts;
      opts.frozen = !tensor.requires_grad();
      id = engine.add_parameter(name, tensor.sizes().vec(),
                                std::span<const float>(value.data_ptr<float>(), value.numel()), opts);
      ids.emplace(key, id);
      im.registered.push_back({name, tensor, id});
    } else {
      id = found->second;
    }
    auto& list = part_ids[owner];
    bool already = false;
    for (ParamId x : list) already = already || x.index == id.index;
    if (already) continue;
    list.push_back(id);
    p.params.push_back(tensor);
    p.trainable.push_back(tensor.requires_grad());
  }
  for (std::size_t i = 0; i < im.parts.size(); ++i) {
    ZOE_CHECK_USAGE(!part_ids[i].empty(), "TorchModel: part '", im.parts[i].name, "' has no parameters");
    im.parts[i].module = engine.add_module(im.parts[i].name, part_ids[i]);
  }
  if (!part_ids.back().empty()) {
    rest.module = engine.add_module(rest.name, part_ids.back());
    im.parts.push_back(std::move(rest));
  }
  // Release torch's copies: zoe holds the values now.
  std::unordered_map<const c10::TensorImpl*, std::string> part_of;  // a tied parameter: its first part
  for (const PartState& p : im.parts)
    for (const at::Tensor& t : p.params) part_of.emplace(t.unsafeGetTensorImpl(), p.name);
  for (auto& reg : im.registered) {
    const c10::TensorImpl* impl = reg.tensor.unsafeGetTensorImpl();
    auto [it, added] = im.released.try_emplace(impl);
    if (added) {
      auto part = part_of.find(impl);  // every registered tensor is in a part; "<rest>" included
      it->second = torch_detail::released_parameter(
          reg.tensor.sizes(), im.compute,
          "parameter '" + reg.name + "'" + (part != part_of.end() ? " of part '" + part->second + "'" : std::string()));
    }
    reg.tensor.set_data(it->second);
  }
}

TorchModel::~TorchModel() = default;

std::vector<std::string> TorchModel::children_of(const torch::nn::Module& root, const std::string& container) {
  auto modules = root.named_modules("", /*include_self=*/false);
  ZOE_CHECK_USAGE(modules.contains(container), "TorchModel::children_of: no submodule '", container,
                  "' (known submodules: ", join_names(modules.keys()), ")");
  std::vector<std::string> names;
  for (const auto& child : modules[container]->named_children()) names.push_back(container + "." + child.key());
  return names;
}

TorchPartId TorchModel::part(const std::string& name) const {
  std::vector<std::string> names;
  for (std::uint32_t i = 0; i < impl_->parts.size(); ++i) {
    if (impl_->parts[i].name == name) return TorchPartId{i};
    names.push_back(impl_->parts[i].name);
  }
  ZOE_THROW(UsageError, "TorchModel: no part '", name, "' (parts: ", join_names(names), ")");
}

ModuleId TorchModel::module(TorchPartId part) const {
  ZOE_CHECK_USAGE(part.index < impl_->parts.size(), "TorchModel: part ", part.index, " out of range");
  return impl_->parts[part.index].module;
}

const std::string& TorchModel::part_name(TorchPartId part) const {
  ZOE_CHECK_USAGE(part.index < impl_->parts.size(), "TorchModel: part ", part.index, " out of range");
  return impl_->parts[part.index].name;
}

std::size_t TorchModel::part_count() const { return impl_->parts.size(); }

std::vector<at::Tensor> TorchModel::run(TorchPartId part, const TorchForward& fn, const std::vector<at::Tensor>& inputs) {
  return impl_->run(part.index, fn, inputs);
}

at::Tensor TorchModel::run(TorchPartId part, const std::function<at::Tensor(const at::Tensor&)>& fn,
                           const at::Tensor& input) {
  return impl_->run(part.index, [fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; },
                    {input})[0];
}

std::vector<std::pair<std::string, at::Tensor>> TorchModel::parameter_values() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& reg : impl_->registered) {
    const auto& shape = impl_->engine.parameter_shape(reg.id);
    at::Tensor value = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
    impl_->engine.read_parameter(reg.id, std::span<float>(value.data_ptr<float>(), value.numel()));
    out.emplace_back(reg.name, std::move(value));
  }
  return out;
}

torch::nn::Module& TorchModel::root() const { return *impl_->root; }

}  // namespace zoe
