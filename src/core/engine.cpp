// Engine: the public API. Each call checks the call rules and the lifecycle before it changes
// anything, then drives the parts Engine::Impl composes (engine_impl.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/common/log.hpp"
#include "src/common/boundary_errors.hpp"
#include "src/core/checkpoint/engine_checkpoint.hpp"
#include "src/core/engine_impl.hpp"
#include "src/core/state_access.hpp"
#include "src/core/names.hpp"

namespace zoe {

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
  if (config.dump_state && impl_->cx.rank == 0) ZOE_LOG_INFO("configuration (dump_state):\n{}", config.to_json());
}

Engine::~Engine() = default;

// Elements of a parameter of `shape`; throws UsageError after the first forward or for a
// negative dimension.
static std::int64_t checked_numel(const core::EngineImpl& I, const std::string& name,
                                  const std::vector<std::int64_t>& shape) {
  I.lifecycle.check_registering(detail::concat("add_parameter(", detail::quoted(name), ")"));
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
  const double wd = o.weight_decay.value_or(I.cx.config.optimizer.weight_decay);
  if (!(wd >= 0.0) || !std::isfinite(wd)) ZOE_THROW_CONFIG(who + ".weight_decay", "must be finite and >= 0, got ", wd);
  if (!(o.lr_scale >= 0.0) || !std::isfinite(o.lr_scale))
    ZOE_THROW_CONFIG(who + ".lr_scale", "must be finite and >= 0, got ", o.lr_scale);
  o.weight_decay = wd;
  return o;
}

ParamId Engine::add_parameter_from(const std::string& name, std::vector<std::int64_t> shape, ParamInitializer init,
                                   const ParamOptions& options) {
  Impl& I = *impl_;
  const std::int64_t numel = checked_numel(I, name, shape);
  core::check_name(core::NameKind::parameter, I.model.params.size(), name);
  ZOE_CHECK_USAGE(static_cast<bool>(init), "parameter ", detail::quoted(name), ": empty initializer");
  ZOE_CHECK_USAGE(!I.model.param_by_name.contains(name), "parameter ", detail::quoted(name), " is registered twice: parameter names are unique (find_parameter looks them up)");
  core::ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.numel = numel;
  p.init = std::move(init);
  p.options = resolved_options(I, "param " + detail::quoted(name), options);
  I.model.param_by_name.emplace(name, static_cast<std::uint32_t>(I.model.params.size()));
  I.model.params.push_back(std::move(p));
  return ParamId{static_cast<std::uint32_t>(I.model.params.size() - 1)};
}

int Engine::add_param_group(const ParamGroup& group) {
  Impl& I = *impl_;
  I.lifecycle.check_registering(detail::concat("add_param_group(", detail::quoted(group.name), ")"));
  core::check_name(core::NameKind::param_group, I.model.param_groups.size(), group.name);
  ZOE_CHECK_USAGE(static_cast<bool>(group.match), "add_param_group(", detail::quoted(group.name), "): empty matcher");
  ZOE_CHECK_USAGE(std::find(I.model.param_groups.begin(), I.model.param_groups.end(), group.name) == I.model.param_groups.end(),
                  "add_param_group(", detail::quoted(group.name), "): a group of that name exists already");
  const ParamOptions options = resolved_options(I, "param group " + detail::quoted(group.name), group.options);
  std::vector<std::uint32_t> matched;
  for (std::uint32_t i = 0; i < I.model.params.size(); ++i) {
    const core::ParamInfo& p = I.model.params[i];
    if (!detail::at_public_boundary("add_param_group: the matcher", [&] { return group.match(p.name); })) continue;
    ZOE_CHECK_USAGE(p.param_group.empty(), "add_param_group(", detail::quoted(group.name), "): parameter ", detail::quoted(p.name), " is already in group ", detail::quoted(p.param_group), " (a parameter belongs to one group)");
    matched.push_back(i);
  }
  ZOE_CHECK_USAGE(!matched.empty(), "add_param_group(", detail::quoted(group.name), ") matched none of the ", I.model.params.size(),
                  " parameters registered so far (register them first; check the matcher)");
  for (std::uint32_t i : matched) {
    I.model.params[i].options = options;
    I.model.params[i].param_group = group.name;
  }
  I.model.param_groups.push_back(group.name);
  return static_cast<int>(matched.size());
}

ParamOptions Engine::param_options(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->model.params.size(), "unknown parameter id ", id.index, " (", impl_->model.params.size(),
                  " parameters registered)");
  return impl_->model.params[id.index].options;
}

std::optional<ParamId> Engine::find_parameter(const std::string& name) const {
  auto it = impl_->model.param_by_name.find(name);
  if (it == impl_->model.param_by_name.end()) return std::nullopt;
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
  const auto& ps = impl_->model.params;
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const core::ParamInfo& p : ps) near.emplace_back(edit_distance(name, p.name), p.name);
  std::sort(near.begin(), near.end());
  std::string closest;
  for (std::size_t i = 0; i < near.size() && i < 3; ++i) closest += (i ? ", " : "") + detail::quoted(near[i].second);
  ZOE_THROW(UsageError, "no parameter named ", detail::quoted(name), " (", ps.size(), " registered",
            closest.empty() ? std::string() : "; closest: " + closest, ")");
}

const std::string& Engine::parameter_name(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->model.params.size(), "unknown parameter id ", id.index, " (", impl_->model.params.size(),
                  " parameters registered)");
  return impl_->model.params[id.index].name;
}
const std::vector<std::int64_t>& Engine::parameter_shape(ParamId id) const {
  ZOE_CHECK_USAGE(id.index < impl_->model.params.size(), "unknown parameter id ", id.index, " (", impl_->model.params.size(),
                  " parameters registered)");
  return impl_->model.params[id.index].shape;
}
std::size_t Engine::parameter_count() const { return impl_->model.params.size(); }

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
  I.lifecycle.check_registering(detail::concat("add_module(", detail::quoted(name), ")"));
  core::check_name(core::NameKind::module, I.model.modules.size(), name);
  ModuleInfo m;
  m.name = name;
  for (ParamId p : params) {
    ZOE_CHECK_USAGE(p.index < I.model.params.size(), "module ", detail::quoted(name), ": unknown parameter id ", p.index);
    ZOE_CHECK_USAGE(std::find(m.params.begin(), m.params.end(), p.index) == m.params.end(), "module ", detail::quoted(name), " lists parameter ", detail::quoted(I.model.params[p.index].name), " twice");
    m.params.push_back(p.index);
  }
  I.model.modules.push_back(std::move(m));
  I.rules.add_module(name, mode);
  return ModuleId{static_cast<std::uint32_t>(I.model.modules.size() - 1)};
}

const ModuleTensors& Engine::begin_forward(ModuleId id) {
  return impl_->guarded("begin_forward", [&]() -> const ModuleTensors& {
    Impl& I = *impl_;
    I.lifecycle.check_usable("begin_forward");
    I.finalize();
    I.model.check_module(id, "begin_forward");
    const ModuleInfo& m = I.model.modules[id.index];
    I.updater.check_forward_allowed(m);  // before any state changes
    I.rules.begin_forward(static_cast<int>(id.index));
    I.gatherer.acquire(static_cast<int>(id.index), false);
    return I.views(static_cast<int>(id.index), false);
  });
}

void Engine::end_forward(ModuleId id) {
  impl_->guarded("end_forward", [&] {
    Impl& I = *impl_;
    I.lifecycle.check_usable("end_forward");
    I.model.check_module(id, "end_forward");
    I.rules.end_forward(static_cast<int>(id.index));
    I.gatherer.release(static_cast<int>(id.index));
    if (I.cx.frees.poison()) I.cx.frees.show_poison();
  });
}

const ModuleTensors& Engine::begin_backward(ModuleId id) {
  return impl_->guarded("begin_backward", [&]() -> const ModuleTensors& {
    Impl& I = *impl_;
    I.lifecycle.check_usable("begin_backward");
    I.model.check_module(id, "begin_backward");
    I.rules.begin_backward(static_cast<int>(id.index));
    I.finalize();
    const ModuleInfo& m = I.model.modules[id.index];
    I.gatherer.acquire(static_cast<int>(id.index), true);
    I.reducer.prepare(m, I.rules.backwards(static_cast<int>(id.index)));
    return I.views(static_cast<int>(id.index), true);
  });
}

void Engine::end_backward(ModuleId id) {
  impl_->guarded("end_backward", [&] {
    Impl& I = *impl_;
    I.lifecycle.check_usable("end_backward");
    I.model.check_module(id, "end_backward");
    I.rules.end_backward(static_cast<int>(id.index));
    I.reducer.finish_backward(I.model.modules[id.index]);
    I.gatherer.release(static_cast<int>(id.index));
    if (I.cx.frees.poison()) I.cx.frees.show_poison();
  });
}

// The config's logging keys (DeepSpeed's steps_per_print, wall_clock_breakdown,
// memory_breakdown): rank 0's info lines after step() call number `calls` (skipped ones
// included; `skipped` of them skipped), which took `step_ms` after `since_last_ms` since the
// previous one returned.
static void log_step(const core::EngineImpl& I, std::int64_t calls, std::int64_t skipped, const StepResult& r,
                     double since_last_ms, double step_ms) {
  if (I.cx.rank != 0) return;
  const Config& c = I.cx.config;
  if (c.steps_per_print > 0 && calls % c.steps_per_print == 0)
    ZOE_LOG_INFO("step={}, skipped={}, lr={}, betas=({}, {}), loss_scale={}, grad_norm={}", calls, skipped, I.updater.lr(),
                 c.optimizer.betas[0], c.optimizer.betas[1], r.loss_scale, r.grad_norm);
  if (c.wall_clock_breakdown)
    ZOE_LOG_INFO("step={} time (ms) | forward+backward: {:.3f} | step: {:.3f}", calls, since_last_ms, step_ms);
  if (c.memory_breakdown) {
    const auto& L = I.cx.ledger;
    using core::MemKind;
    using core::Tier;
    const DeviceMemoryStats d = I.cx.device.memory_stats();
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
    I.lifecycle.check_usable("step");
    I.finalize();
    I.reducer.flush_bucket();  // the last gradients waiting in the bucket: their collective is part of the step
    I.coll.agree_on_step();    // every rank made the same calls this step
    // DeepSpeed's configured scheduler: the lr of this step follows from the steps applied so far.
    if (I.cx.config.scheduler.type != SchedulerType::none)
      I.updater.set_lr(I.cx.config.scheduler.lr_at(I.cx.config.optimizer.lr, I.updater.steps()));
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

// Checkpoints and exports (core/checkpoint/) reach the engine through StateAccess only.
void Engine::save_checkpoint(const std::string& dir, const std::string& client_state) {
  impl_->guarded("save_checkpoint", [&] {
    core::StateAccess S(*impl_);
    core::save_engine_checkpoint(S, dir, client_state);
  });
}

std::string Engine::load_checkpoint(const std::string& dir) {
  return impl_->guarded("load_checkpoint", [&] {
    core::StateAccess S(*impl_);
    return core::load_engine_checkpoint(S, dir);
  });
}

void Engine::export_safetensors(const std::string& path, DType dtype, const std::map<std::string, std::string>& metadata) {
  detail::at_public_boundary("export_safetensors", [&] {
    core::StateAccess S(*impl_);
    core::export_engine_safetensors(S, path, dtype, metadata);
  });
}

void Engine::synchronize() {
  impl_->guarded("synchronize", [&] {
    Impl& I = *impl_;
    I.lifecycle.check_usable("synchronize");
    I.updater.finish_update();
    I.updater.drain_gradients();
    I.cx.device.synchronize(*I.cx.side);
    I.cx.device.synchronize(I.cx.device.compute_stream());
    I.cx.frees.reap(true);
  });
}

void Engine::set_lr(double lr) {
  ZOE_CHECK_USAGE(impl_->cx.config.scheduler.type == SchedulerType::none, "set_lr(", lr,
                  ") with the config's scheduler set: the scheduler drives the learning rate; remove \"scheduler\" "
                  "from the config to set it yourself, or leave it to the scheduler");
  if (!(lr >= 0.0) || !std::isfinite(lr)) ZOE_THROW_CONFIG("optimizer.params.lr", "must be finite and >= 0, got ", lr);
  impl_->updater.check_no_update_in_backward("set_lr");
  impl_->updater.set_lr(lr);
}
double Engine::lr() const {
  const auto& I = *impl_;
  return I.cx.config.scheduler.type != SchedulerType::none ? I.cx.config.scheduler.lr_at(I.cx.config.optimizer.lr, I.updater.steps())
                                                        : I.updater.lr();
}
double Engine::loss_scale() const { return impl_->updater.scaler().scale(); }
std::int64_t Engine::global_step() const { return impl_->updater.steps(); }

MemoryReport Engine::memory_report() const {
  const Impl& I = *impl_;
  MemoryReport r;
  using core::MemKind;
  using core::Tier;
  r.device_model_states = I.cx.ledger.get(Tier::device, MemKind::model_state);
  r.device_buffers = I.cx.ledger.get(Tier::device, MemKind::buffer);
  const DeviceMemoryStats d = I.cx.device.memory_stats();
  r.device_peak = d.peak_bytes;
  r.device_reserved_peak = d.reserved_peak_bytes;
  r.host_model_states = I.cx.ledger.get(Tier::host, MemKind::model_state);
  r.host_buffers = I.cx.ledger.get(Tier::host, MemKind::buffer);
  r.host_pinned_peak = I.tiers.staging_bytes() + I.updater.staging_bytes();
  r.nvme_model_states = I.cx.ledger.get(Tier::nvme, MemKind::model_state);
  return r;
}

TrafficReport Engine::last_step_traffic() const { return impl_->coll.last_traffic(); }
const Config& Engine::config() const { return impl_->cx.config; }

ComputePlace Engine::compute_place() const {
  Device& d = impl_->cx.device;
  return ComputePlace{d.kind(), d.ordinal(), d.native_handle(d.compute_stream())};
}
int Engine::rank() const { return impl_->cx.rank; }
int Engine::world_size() const { return impl_->cx.world; }

}  // namespace zoe
