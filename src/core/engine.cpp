// Engine: registration, partitioning into groups, the public API and counted collectives.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"
#include "src/core/names.hpp"

namespace zoe {

namespace core {

namespace {
// zoe.debug_poison on the host device: freed blocks kept poisoned before going back to the system.
constexpr std::size_t kPoisonQuarantineBytes = std::size_t{256} << 20;
}  // namespace

EngineImpl::EngineImpl(const Config& c, RankContext r)
    : config(c), ctx(std::move(r)), device(*ctx.device), comm(*ctx.comm), rank(comm.rank()),
      world(comm.world_size()), stage(c.zero_optimization.stage), policy(stage), dtype(c.compute_dtype()),
      side(device.create_stream()), scaler(c), lr(c.optimizer.lr), delayed(c.zoe.delayed_update) {
  update_stream = device.create_stream();
  // Freed blocks are poisoned and quarantined too where the device can (the host device), so a
  // stale view never reads a later buffer's values (the setting stays on the device).
  if (frees.poison()) device.set_poison_freed(kPoisonQuarantineBytes);
  adam = std::make_unique<optim::CpuAdam>(c.zoe.optimizer_threads);
  pinned_budget = std::make_shared<offload::PinnedBudget>(static_cast<std::size_t>(c.zoe.pinned_budget_bytes));
  // The tiers' pinned buffers are registered with the device: their copies are the pinned kind.
  Device* dev = &device;
  auto register_fn = [dev](void* p, std::size_t bytes) { return dev->register_host_memory(p, bytes); };
  auto unregister_fn = [dev](void* p) { dev->unregister_host_memory(p); };
  const auto& oo = c.zero_optimization.offload_optimizer;
  if (oo.device != OffloadDevice::none) {
    offload::OptimizerStatesOptions so;
    so.device = oo.device;
    so.nvme_path = oo.nvme_path;
    so.rank = rank;
    so.buffer_count = oo.buffer_count;
    so.pin_memory = oo.pin_memory;
    so.pinned_budget = pinned_budget;
    so.aio = c.aio;
    so.require_direct_io = c.zoe.require_direct_io;
    so.register_fn = register_fn;
    so.unregister_fn = unregister_fn;
    // The tier's gradient add (on the gradient sink's I/O worker) runs in the optimizer's own
    // arena: together with the update pipeline's step at most zoe.optimizer_threads threads.
    so.adam = adam.get();
    states = std::make_unique<offload::OptimizerStates>(so);
  }
  const auto& op = c.zero_optimization.offload_param;
  if (op.device != OffloadDevice::none && policy.shards_params) {
    offload::ParamShardsOptions po;
    po.device = op.device;
    po.nvme_path = op.nvme_path;
    po.rank = rank;
    po.buffer_count = op.buffer_count;
    po.buffer_bytes = static_cast<std::size_t>(op.buffer_size) * dtype_size(dtype);
    po.pin_memory = op.pin_memory;
    po.pinned_budget = pinned_budget;
    po.aio = c.aio;
    po.require_direct_io = c.zoe.require_direct_io;
    po.register_fn = register_fn;
    po.unregister_fn = unregister_fn;
    param_store = std::make_unique<offload::ParamShards>(po);
  }
  ZOE_LOG_DEBUG("rank {}/{}: engine on {}, stage {}, compute {}", rank, world, device.name(), stage,
                dtype_name(dtype));
}

EngineImpl::~EngineImpl() {
  pipeline.reset();   // waits for a running update
  grad_sink.reset();  // and for gradients on their way to the tier
  try {
    device.synchronize(*update_stream);
  } catch (...) {
  }
  try {
    device.synchronize(*side);
  } catch (...) {
  }
  frees.reap(true);
  if (readback_registered) device.unregister_host_memory(readback.data());
}

DeviceBuffer EngineImpl::alloc(MemKind kind, DType dt, std::int64_t numel) {
  return DeviceBuffer(device, ledger, kind, dt, numel);
}

void EngineImpl::check_module(ModuleId m) const {
  ZOE_CHECK_USAGE(m.index < modules.size(), "unknown module id ", m.index, " (", modules.size(),
                  " modules registered)");
}

void EngineImpl::finalize() {
  if (finalized) return;
  ZOE_CHECK_USAGE(finalize_error.empty(), "the engine's initialisation failed earlier (", finalize_error,
                  "); this Engine is unusable: destroy it and build a new one");
  try {
    build();
  } catch (const std::exception& e) {
    finalize_error = e.what();
    throw;
  }
}

void EngineImpl::build() {
  ZOE_CHECK_USAGE(!modules.empty(), "no modules registered: add_module before the first forward");
  for (const ParamInfo& p : params) {
    bool used = std::any_of(modules.begin(), modules.end(), [&](const ModuleInfo& m) {
      return std::find(m.params.begin(), m.params.end(), &p - params.data()) != m.params.end();
    });
    ZOE_CHECK_USAGE(used, "parameter ", detail::quoted(p.name), " is not used by any module");
  }
  // Each module owns the parameters it lists first; its group is their flat buffer. Its
  // frozen parameters form a second group (compute-dtype values only), made only when it has
  // some, so a model without frozen parameters has exactly one group per module.
  for (std::size_t mi = 0; mi < modules.size(); ++mi) {
    Group trainable, frozen;
    trainable.name = modules[mi].name;
    frozen.name = modules[mi].name + " (frozen)";
    frozen.frozen = true;
    const int at = static_cast<int>(groups.size());
    for (std::uint32_t pi : modules[mi].params) {
      if (params[pi].group >= 0) continue;
      Group& g = params[pi].options.frozen ? frozen : trainable;
      params[pi].group = params[pi].options.frozen ? at + 1 : at;
      params[pi].slot = g.params.size();
      g.params.push_back(pi);
    }
    groups.push_back(std::move(trainable));
    if (!frozen.params.empty()) groups.push_back(std::move(frozen));
  }
  for (std::size_t mi = 0; mi < modules.size(); ++mi) {
    auto& gs = modules[mi].groups;
    for (std::uint32_t pi : modules[mi].params) gs.push_back(params[pi].group);
    std::sort(gs.begin(), gs.end());
    gs.erase(std::unique(gs.begin(), gs.end()), gs.end());
    for (int g : gs) groups[g].users.push_back(static_cast<int>(mi));
  }

  for (Group& g : groups) {
    std::vector<std::int64_t> numels;
    for (std::uint32_t pi : g.params) numels.push_back(params[pi].numel);
    g.layout.emplace(numels, world);
    const FlatLayout& L = *g.layout;
    g.pending_users = static_cast<int>(g.users.size());
    g.persistent = policy.shards_params && L.live_numel() < config.zero_optimization.stage3_param_persistence_threshold;
    g.opt_begin = policy.shards_optimizer ? L.shard_begin(rank) : 0;
    g.opt_numel = g.frozen ? 0 : policy.shards_optimizer ? L.shard_numel() : L.padded_numel();
  }

  // Every state's home, sizes only: the offload tiers must know all their tensors before
  // they open (finalize), and the values are written after, chunk by chunk.
  int device_left = device_sub_group_count();
  Stream& s = *side;
  for (Group& g : groups) {
    const FlatLayout& L = *g.layout;
    place_sub_groups(g, device_left);
    // Compute-dtype parameters: stage 3 keeps the shard (on the device or in the parameter
    // tier), stages 0-2 the full flat buffer.
    if (!policy.shards_params) g.param_state = Group::ParamState::gathered;  // the persistent full copy
    if (param_store) {
      g.param_id = param_store->add(static_cast<std::size_t>(L.shard_numel()) * dtype_size(dtype));
    } else {
      (policy.shards_params ? g.param_shard : g.param_full) =
          alloc(MemKind::model_state, dtype, policy.shards_params ? L.shard_numel() : L.padded_numel());
    }
    if (g.frozen) {
      // no gradient buffer, no optimizer state
    } else if (!policy.shards_grads) {
      g.grad_full = alloc(MemKind::model_state, dtype, L.padded_numel());
      device.fill(g.grad_full.data(), dtype, L.padded_numel(), 0.0f, s);
    } else if (has_device_sub_groups(g)) {
      g.grad_shard = alloc(MemKind::model_state, grad_dtype(), L.shard_numel());
      device.fill(g.grad_shard.data(), grad_dtype(), L.shard_numel(), 0.0f, s);
    }
    g.param_ready = device.create_event();
    g.update_done = device.create_event();
  }
  if (states) {
    states->finalize();
    ledger.add(Tier::host, MemKind::model_state, states->host_state_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, states->nvme_state_bytes());
    ledger.add(Tier::host, MemKind::buffer, states->staging_bytes());
  }
  if (param_store) {
    param_store->finalize();
    ledger.add(Tier::host, MemKind::model_state, param_store->host_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, param_store->nvme_bytes());
    ledger.add(Tier::host, MemKind::buffer, param_store->staging_bytes());
  }
  build_update_paths();
  write_initial_values();
  for (ParamInfo& p : params) p.init = nullptr;  // releases what the initializers hold
  step_start_stats = comm.stats();
  finalized = true;
  std::int64_t live = 0;
  for (const Group& g : groups) live += g.layout->live_numel();
  ZOE_LOG_DEBUG("rank {}: {} parameters ({} elements) in {} groups, stage {}, {} on {}", rank, params.size(), live,
               groups.size(), stage, dtype_name(dtype), device.name());
}

void EngineImpl::build_update_paths() {
  if (!states && !param_store) return;  // every update is device work on the update stream
  // Pinned staging of one sub-group each: the largest offloaded one.
  std::int64_t largest = 0;
  for (const Group& g : groups)
    for (const SubGroup& sg : g.subgroups)
      if (sg.offloaded()) largest = std::max(largest, sg.numel);
  const auto& oo = config.zero_optimization.offload_optimizer;
  UpdatePipelineOptions po;
  po.out_dtype = dtype;
  // With parameter offload the outputs go into the parameter tier (host memory): no staging.
  po.staging_bytes = param_store ? 0 : static_cast<std::size_t>(largest) * dtype_size(dtype);
  po.pin_memory = oo.pin_memory;
  po.pinned_budget = pinned_budget;
  pipeline = std::make_unique<UpdatePipeline>(device, states.get(), *adam, po);
  ledger.add(Tier::host, MemKind::buffer, static_cast<std::int64_t>(pipeline->staging_bytes()));
  if (states && largest > 0) {
    GradientSinkOptions go;
    go.dtype = dtype;
    go.largest_numel = largest;
    go.pin_memory = oo.pin_memory;
    go.pinned_budget = pinned_budget;
    grad_sink = std::make_unique<GradientSink>(device, *states, go);
    ledger.add(Tier::host, MemKind::buffer, static_cast<std::int64_t>(grad_sink->staging_bytes()));
  }
}

ModuleTensors EngineImpl::views(const ModuleInfo& m, bool with_grads) {
  ModuleTensors t;
  for (std::uint32_t pi : m.params) {
    const ParamInfo& p = params[pi];
    Group& g = groups[p.group];
    std::int64_t off = g.layout->offset(p.slot);
    t.params.push_back(TensorView{g.param_full.at(off), dtype, p.shape});
    if (with_grads) t.grads.push_back(TensorView{g.frozen ? nullptr : g.grad_full.at(off), dtype, p.shape});
  }
  return t;
}

void EngineImpl::ready_for_compute(Event& event) { device.compute_waits(event); }

void EngineImpl::side_waits_for_compute() {
  auto e = device.create_event();
  device.record(*e, device.compute_stream());
  device.wait(*side, *e);
}

void EngineImpl::all_gather(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag) {
  rules.note_collective(tag);
  comm.tag_next(std::move(tag));
  comm.all_gather(send, recv, static_cast<std::size_t>(count), dt, *side);
  elements_sent += count * (world - 1);
  ++all_gather_calls;
}

void EngineImpl::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag) {
  rules.note_collective(tag);
  comm.tag_next(std::move(tag));
  comm.reduce_scatter(send, recv, static_cast<std::size_t>(count), dt, ReduceOp::sum, *side);
  elements_sent += count * (world - 1);
  ++reduce_scatter_calls;
}

void EngineImpl::all_reduce(void* buf, std::int64_t count, DType dt, CollectiveTag tag) {
  rules.note_collective(tag);
  comm.tag_next(std::move(tag));
  comm.all_reduce(buf, buf, static_cast<std::size_t>(count), dt, ReduceOp::sum, *side);
  elements_sent += world > 1 ? 2 * count * (world - 1) / world : 0;
  ++all_reduce_calls;
}

}  // namespace core

// ---------------------------------------------------------------- public API
using core::ModuleInfo;


Engine::Engine(const Config& config, RankContext rank) {
  config.validate();
  ZOE_CHECK_USAGE(rank.device && rank.comm, "Engine needs a RankContext with a device and a communicator");
  config.check_batch_size(rank.comm->world_size());
  // Accepted by the config (DeepSpeed's keys) but not built in the engine yet: refuse them
  // rather than ignore them.
  if (config.zoe.delayed_update && config.zero_optimization.offload_param.device != OffloadDevice::none)
    ZOE_THROW_CONFIG("zoe.delayed_update", "cannot be combined with zero_optimization.offload_param.device = ",
                     config.zero_optimization.offload_param.device == OffloadDevice::cpu ? "cpu" : "nvme",
                     " (the update writes the offloaded shards the next forward reads); set one of them off");
  impl_ = detail::at_public_boundary("Engine", [&] { return std::make_unique<Impl>(config, std::move(rank)); });
  if (config.dump_state && impl_->rank == 0) ZOE_LOG_INFO("configuration (dump_state):\n{}", config.to_json());
}

Engine::~Engine() = default;

// Elements of a parameter of `shape`; throws UsageError after the first forward or for a
// negative dimension.
static std::int64_t checked_numel(const core::EngineImpl& I, const std::string& name,
                                  const std::vector<std::int64_t>& shape) {
  ZOE_CHECK_USAGE(!I.finalized, "add_parameter(", detail::quoted(name), ") after the first forward");
  std::int64_t numel = 1;
  for (std::int64_t d : shape) {
    ZOE_CHECK_USAGE(d >= 0, "parameter ", detail::quoted(name), ": negative dimension ", d);
    numel *= d;
  }
  return numel;
}

// `options` with weight_decay resolved against the config; throws ConfigError naming the
// parameter for a negative or non-finite weight_decay / lr_scale.
static ParamOptions resolved_options(const core::EngineImpl& I, const std::string& who, ParamOptions o) {
  const double wd = o.weight_decay.value_or(I.config.optimizer.weight_decay);
  if (!(wd >= 0.0) || !std::isfinite(wd)) ZOE_THROW_CONFIG(who + ".weight_decay", "must be finite and >= 0, got ", wd);
  if (!(o.lr_scale >= 0.0) || !std::isfinite(o.lr_scale))
    ZOE_THROW_CONFIG(who + ".lr_scale", "must be finite and >= 0, got ", o.lr_scale);
  o.weight_decay = wd;
  return o;
}

ParamId Engine::add_parameter_from(const std::string& name, std::vector<std::int64_t> shape, ParamInitializer init,
                                   const ParamOptions& options) {
  Impl& I = *impl_;
  core::check_name(core::NameKind::parameter, I.params.size(), name);
  const std::int64_t numel = checked_numel(I, name, shape);
  ZOE_CHECK_USAGE(static_cast<bool>(init), "parameter ", detail::quoted(name), ": empty initializer");
  ZOE_CHECK_USAGE(!I.param_by_name.contains(name), "parameter ", detail::quoted(name),
                  " is registered twice: parameter names are unique (find_parameter looks them up)");
  core::ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.numel = numel;
  p.init = std::move(init);
  p.options = resolved_options(I, "param " + detail::quoted(name), options);
  I.param_by_name.emplace(name, static_cast<std::uint32_t>(I.params.size()));
  I.params.push_back(std::move(p));
  return ParamId{static_cast<std::uint32_t>(I.params.size() - 1)};
}

int Engine::add_param_group(const ParamGroup& group) {
  Impl& I = *impl_;
  core::check_name(core::NameKind::param_group, I.param_groups.size(), group.name);
  ZOE_CHECK_USAGE(!I.finalized, "add_param_group(", detail::quoted(group.name), ") after the first forward");
  ZOE_CHECK_USAGE(static_cast<bool>(group.match), "add_param_group(", detail::quoted(group.name), "): empty matcher");
  ZOE_CHECK_USAGE(std::find(I.param_groups.begin(), I.param_groups.end(), group.name) == I.param_groups.end(),
                  "add_param_group(", detail::quoted(group.name), "): a group of that name exists already");
  const ParamOptions options = resolved_options(I, "param group " + detail::quoted(group.name), group.options);
  std::vector<std::uint32_t> matched;
  for (std::uint32_t i = 0; i < I.params.size(); ++i) {
    const core::ParamInfo& p = I.params[i];
    if (!detail::at_public_boundary("add_param_group: the matcher", [&] { return group.match(p.name); })) continue;
    ZOE_CHECK_USAGE(p.param_group.empty(), "add_param_group(", detail::quoted(group.name), "): parameter ", detail::quoted(p.name),
                    " is already in group ", detail::quoted(p.param_group), " (a parameter belongs to one group)");
    matched.push_back(i);
  }
  ZOE_CHECK_USAGE(!matched.empty(), "add_param_group(", detail::quoted(group.name), ") matched none of the ", I.params.size(),
                  " parameters registered so far (register them first; check the matcher)");
  for (std::uint32_t i : matched) {
    I.params[i].options = options;
    I.params[i].param_group = group.name;
  }
  I.param_groups.push_back(group.name);
  return static_cast<int>(matched.size());
}

ParamOptions Engine::param_options(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->params.size(), "unknown parameter id ", id.index, " (", impl_->params.size(),
                  " parameters registered)");
  return impl_->params[id.index].options;
}

std::optional<ParamId> Engine::find_parameter(const std::string& name) const {
  auto it = impl_->param_by_name.find(name);
  if (it == impl_->param_by_name.end()) return std::nullopt;
  return ParamId{it->second};
}

// Edit distance (insertions, deletions, substitutions), for "did you mean" in errors.
static std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

ParamId Engine::parameter(const std::string& name) const {
  if (auto id = find_parameter(name)) return *id;
  const auto& ps = impl_->params;
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const core::ParamInfo& p : ps) near.emplace_back(edit_distance(name, p.name), p.name);
  std::sort(near.begin(), near.end());
  std::string closest;
  for (std::size_t i = 0; i < near.size() && i < 3; ++i) closest += (i ? ", " : "") + detail::quoted(near[i].second);
  ZOE_THROW(UsageError, "no parameter named ", detail::quoted(name), " (", ps.size(), " registered",
            closest.empty() ? std::string() : "; closest: " + closest, ")");
}

const std::string& Engine::parameter_name(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->params.size(), "unknown parameter id ", id.index, " (", impl_->params.size(),
                  " parameters registered)");
  return impl_->params[id.index].name;
}
const std::vector<std::int64_t>& Engine::parameter_shape(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->params.size(), "unknown parameter id ", id.index, " (", impl_->params.size(),
                  " parameters registered)");
  return impl_->params[id.index].shape;
}
std::size_t Engine::parameter_count() const { return impl_->params.size(); }

ParamId Engine::add_parameter(const std::string& name, std::vector<std::int64_t> shape,
                              std::span<const float> initial, const ParamOptions& options) {
  const std::int64_t numel = checked_numel(*impl_, name, shape);
  ZOE_CHECK_USAGE(static_cast<std::int64_t>(initial.size()) == numel, "parameter ", detail::quoted(name), ": initial has ",
                  initial.size(), " elements, shape has ", numel);
  auto values = detail::at_public_boundary(
      "add_parameter", [&] { return std::make_shared<const std::vector<float>>(initial.begin(), initial.end()); });
  return add_parameter_from(
      name, std::move(shape),
      [values](std::int64_t offset, std::span<float> out) {
        std::copy_n(values->begin() + offset, out.size(), out.begin());
      },
      options);
}

ModuleId Engine::add_module(const std::string& name, const std::vector<ParamId>& params, ForwardMode mode) {
  Impl& I = *impl_;
  ZOE_CHECK_USAGE(!I.finalized, "add_module(", detail::quoted(name), ") after the first forward");
  core::check_name(core::NameKind::module, I.modules.size(), name);
  ModuleInfo m;
  m.name = name;
  for (ParamId p : params) {
    ZOE_CHECK_USAGE(p.index < I.params.size(), "module ", detail::quoted(name), ": unknown parameter id ", p.index);
    ZOE_CHECK_USAGE(std::find(m.params.begin(), m.params.end(), p.index) == m.params.end(), "module ", detail::quoted(name),
                    " lists parameter ", detail::quoted(I.params[p.index].name), " twice");
    m.params.push_back(p.index);
  }
  I.modules.push_back(std::move(m));
  I.rules.add_module(name, mode);
  return ModuleId{static_cast<std::uint32_t>(I.modules.size() - 1)};
}

// Checks that module `id` is in phase `from` (naming `call` otherwise) and moves it to `to`.
static ModuleInfo& transition(core::EngineImpl& I, ModuleId id, ModuleInfo::Phase from, ModuleInfo::Phase to,
                              const char* call, const char* needs) {
  I.check_module(id);
  ModuleInfo& m = I.modules[id.index];
  ZOE_CHECK_USAGE(m.phase == from, call, "(", detail::quoted(m.name), ") ", needs);
  m.phase = to;
  return m;
}

ModuleTensors Engine::begin_forward(ModuleId id) {
  return impl_->guarded("begin_forward", [&] {
    impl_->finalize();
    impl_->check_module(id);
    impl_->check_forward_after_update_in_backward(static_cast<int>(id.index));  // before any state changes
    impl_->rules.begin_forward(static_cast<int>(id.index));
    ModuleInfo& m = transition(*impl_, id, ModuleInfo::Phase::idle, ModuleInfo::Phase::forward, "begin_forward",
                               "while it is already active");
    impl_->acquire(static_cast<int>(id.index), false);
    return impl_->views(m, false);
  });
}

void Engine::end_forward(ModuleId id) {
  impl_->guarded("end_forward", [&] {
    impl_->check_module(id);
    impl_->rules.end_forward(static_cast<int>(id.index));
    transition(*impl_, id, ModuleInfo::Phase::forward, ModuleInfo::Phase::idle, "end_forward",
               "without begin_forward");
    impl_->release(static_cast<int>(id.index));
    if (impl_->frees.poison()) impl_->frees.show_poison();
  });
}

ModuleTensors Engine::begin_backward(ModuleId id) {
  return impl_->guarded("begin_backward", [&] {
    impl_->check_module(id);
    impl_->rules.begin_backward(static_cast<int>(id.index));
    impl_->finalize();
    ModuleInfo& m = transition(*impl_, id, ModuleInfo::Phase::idle, ModuleInfo::Phase::backward, "begin_backward",
                               "while it is already active");
    impl_->acquire(static_cast<int>(id.index), true);
    impl_->prepare_grads(m);
    return impl_->views(m, true);
  });
}

void Engine::end_backward(ModuleId id) {
  impl_->guarded("end_backward", [&] {
    impl_->check_module(id);
    impl_->rules.end_backward(static_cast<int>(id.index));
    ModuleInfo& m = transition(*impl_, id, ModuleInfo::Phase::backward, ModuleInfo::Phase::idle, "end_backward",
                               "without begin_backward");
    impl_->finish_backward(m);
    impl_->release(static_cast<int>(id.index));
    if (impl_->frees.poison()) impl_->frees.show_poison();
  });
}

// The config's logging keys (DeepSpeed's steps_per_print, wall_clock_breakdown,
// memory_breakdown): rank 0's info lines after step() call number `calls` (skipped ones
// included; `skipped` of them skipped), which took `step_ms` after `since_last_ms` since the
// previous one returned.
static void log_step(const core::EngineImpl& I, std::int64_t calls, std::int64_t skipped, const StepResult& r,
                     double since_last_ms, double step_ms) {
  if (I.rank != 0) return;
  const Config& c = I.config;
  if (c.steps_per_print > 0 && calls % c.steps_per_print == 0)
    ZOE_LOG_INFO("step={}, skipped={}, lr={}, betas=({}, {}), loss_scale={}, grad_norm={}", calls, skipped, I.lr,
                 c.optimizer.betas[0], c.optimizer.betas[1], r.loss_scale, r.grad_norm);
  if (c.wall_clock_breakdown)
    ZOE_LOG_INFO("step={} time (ms) | forward+backward: {:.3f} | step: {:.3f}", calls, since_last_ms, step_ms);
  if (c.memory_breakdown) {
    const auto& L = I.ledger;
    using core::MemKind;
    using core::Tier;
    const DeviceMemoryStats d = I.device.memory_stats();
    ZOE_LOG_INFO("step={} memory (bytes) | device: model states {}, buffers {}, allocated peak {}, reserved peak {} | "
                 "host: model states {}, buffers {} | nvme: model states {}",
                 calls, L.get(Tier::device, MemKind::model_state), L.get(Tier::device, MemKind::buffer),
                 d.peak_bytes, d.reserved_peak_bytes, L.get(Tier::host, MemKind::model_state),
                 L.get(Tier::host, MemKind::buffer), L.get(Tier::nvme, MemKind::model_state));
  }
}

StepResult Engine::step() {
  return impl_->guarded("step", [&] {
    Impl& I = *impl_;
    I.finalize();
    I.flush_bucket();        // the last gradients waiting in the bucket: their collective is part of the step
    core::agree_on_step(I);  // every rank made the same calls this step
    // DeepSpeed's configured scheduler: the lr of this step follows from the steps applied so far.
    if (I.config.scheduler.type != SchedulerType::none) I.lr = I.config.scheduler.lr_at(I.config.optimizer.lr, I.step_count);
    const auto begin = std::chrono::steady_clock::now();
    const StepResult r = I.step();
    const auto end = std::chrono::steady_clock::now();
    I.rules.step_done();
    ++I.step_calls;
    I.skipped_calls += r.skipped ? 1 : 0;
    using ms = std::chrono::duration<double, std::milli>;
    log_step(I, I.step_calls, I.skipped_calls, r, ms(begin - I.last_step_end).count(), ms(end - begin).count());
    I.last_step_end = end;
    return r;
  });
}

void Engine::synchronize() {
  impl_->guarded("synchronize", [&] {
    impl_->finish_update();
    if (impl_->grad_sink) impl_->grad_sink->drain();
    impl_->device.synchronize(*impl_->side);
    impl_->device.synchronize(impl_->device.compute_stream());
    impl_->frees.reap(true);
  });
}

void Engine::set_lr(double lr) {
  ZOE_CHECK_USAGE(impl_->config.scheduler.type == SchedulerType::none, "set_lr(", lr,
                  ") with the config's scheduler set: the scheduler drives the learning rate; remove \"scheduler\" "
                  "from the config to set it yourself, or leave it to the scheduler");
  if (!(lr >= 0.0) || !std::isfinite(lr)) ZOE_THROW_CONFIG("optimizer.params.lr", "must be finite and >= 0, got ", lr);
  impl_->check_no_update_in_backward("set_lr");
  impl_->lr = lr;
}
double Engine::lr() const {
  const auto& I = *impl_;
  return I.config.scheduler.type != SchedulerType::none ? I.config.scheduler.lr_at(I.config.optimizer.lr, I.step_count)
                                                        : I.lr;
}
double Engine::loss_scale() const { return impl_->scaler.scale(); }
std::int64_t Engine::global_step() const { return impl_->step_count; }

MemoryReport Engine::memory_report() const {
  const Impl& I = *impl_;
  MemoryReport r;
  using core::MemKind;
  using core::Tier;
  r.device_model_states = I.ledger.get(Tier::device, MemKind::model_state);
  r.device_buffers = I.ledger.get(Tier::device, MemKind::buffer);
  const DeviceMemoryStats d = I.device.memory_stats();
  r.device_peak = d.peak_bytes;
  r.device_reserved_peak = d.reserved_peak_bytes;
  r.host_model_states = I.ledger.get(Tier::host, MemKind::model_state);
  r.host_buffers = I.ledger.get(Tier::host, MemKind::buffer);
  r.host_pinned_peak = (I.states ? I.states->staging_bytes() : 0) + (I.param_store ? I.param_store->staging_bytes() : 0) +
                       (I.pipeline ? static_cast<std::int64_t>(I.pipeline->staging_bytes()) : 0) +
                       (I.grad_sink ? static_cast<std::int64_t>(I.grad_sink->staging_bytes()) : 0);
  r.nvme_model_states = I.ledger.get(Tier::nvme, MemKind::model_state);
  return r;
}

TrafficReport Engine::last_step_traffic() const { return impl_->last_traffic; }
const Config& Engine::config() const { return impl_->config; }

ComputePlace Engine::compute_place() const {
  Device& d = impl_->device;
  return ComputePlace{d.kind(), d.ordinal(), d.native_handle(d.compute_stream())};
}
int Engine::rank() const { return impl_->rank; }
int Engine::world_size() const { return impl_->world; }

}  // namespace zoe
