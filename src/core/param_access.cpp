// The trainer's access to parameters and collectives between steps: per-parameter optimizer
// options as runs over a group's flat buffer, reading and writing a parameter's full value
// (master weights and compute-dtype copy; frozen groups: the compute-dtype copy only), and the
// trainer's own scalar all-reduce. Not on the training path: these synchronize.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe {
using namespace core;  // the engine's parts, in this file only

namespace {
// FNV-1a over bytes, for tags and value agreement.
std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

const char* reduce_name(ScalarReduce op) {
  switch (op) {
    case ScalarReduce::sum: return "sum";
    case ScalarReduce::mean: return "mean";
    case ScalarReduce::max: return "max";
    case ScalarReduce::min: return "min";
  }
  return "?";
}

CollectiveTag param_value_tag(const core::EngineImpl& I, std::uint32_t param, const char* what) {
  CollectiveTag t;
  t.kind = CollectiveTag::Kind::param_value;
  t.group = static_cast<std::int32_t>(param);
  t.step = I.rules.steps();
  t.label = detail::concat(what, " parameter ", detail::quoted(I.model.params[param].name));
  return t;
}
}  // namespace

void core::EngineImpl::write_states_and_params(Group& g, const std::vector<float>& all) {
  const std::size_t n = static_cast<std::size_t>(g.opt_numel);
  updater.write_states(g, all);
  if (tiers.params) {
    // Parameter offload: the shard's home is the parameter tier.
    std::vector<std::byte> shard(n * dtype_size(cx.dtype));
    host_ops::cast(all.data(), DType::f32, shard.data(), cx.dtype, n);
    tiers.params->write(g.param_id, shard.data());
    return;
  }
  // The compute parameters are the master weights in the compute dtype.
  DeviceBuffer master = cx.alloc(MemKind::buffer, DType::f32, g.opt_numel);
  cx.device.copy(master.data(), all.data(), n * sizeof(float), *cx.side);
  void* dst = cx.policy.shards_params ? g.param_shard.data() : g.param_full.at(g.opt_begin);
  if (cx.dtype == DType::f32) {
    cx.device.copy(dst, master.data(), n * sizeof(float), *cx.side);
  } else {
    cx.device.cast(master.data(), DType::f32, dst, cx.dtype, n, *cx.side);
  }
  if (cx.policy.gathers_updates) {
    DeviceBuffer shard = cx.alloc(MemKind::buffer, cx.dtype, g.opt_numel);
    cx.device.copy(shard.data(), dst, shard.bytes(), *cx.side);
    coll.all_gather(shard.data(), g.param_full.data(), g.opt_numel, cx.dtype, coll.params_tag(g));
    cx.device.synchronize(*cx.side);
  }
  cx.device.synchronize(*cx.side);
}

std::vector<std::byte> core::EngineImpl::read_frozen_shard(Group& g) {
  const FlatLayout& L = *g.layout;
  std::vector<std::byte> shard(static_cast<std::size_t>(L.shard_numel()) * dtype_size(cx.dtype));
  if (tiers.params) {
    tiers.params->read(g.param_id, shard.data());
    return shard;
  }
  const void* src = cx.policy.shards_params ? g.param_shard.data() : g.param_full.at(L.shard_begin(cx.rank));
  cx.device.copy(shard.data(), src, shard.size(), *cx.side);
  cx.device.synchronize(*cx.side);
  return shard;
}

void core::EngineImpl::write_frozen_shard(Group& g, const std::byte* shard) {
  const FlatLayout& L = *g.layout;
  const std::size_t bytes = static_cast<std::size_t>(L.shard_numel()) * dtype_size(cx.dtype);
  if (tiers.params) {
    tiers.params->write(g.param_id, shard);
    return;
  }
  if (cx.policy.shards_params) {
    cx.device.copy(g.param_shard.data(), shard, bytes, *cx.side);
  } else {
    // Every rank holds the full copy: each sends its shard (through device memory) to all.
    DeviceBuffer staged = cx.alloc(MemKind::buffer, cx.dtype, L.shard_numel());
    cx.device.copy(staged.data(), shard, bytes, *cx.side);
    coll.all_gather(staged.data(), g.param_full.data(), L.shard_numel(), cx.dtype, coll.params_tag(g));
    cx.device.synchronize(*cx.side);  // before `staged` is freed
  }
  cx.device.synchronize(*cx.side);
}

std::vector<float> core::EngineImpl::gather_group(Group& g, const CollectiveTag& tag) {
  const FlatLayout& L = *g.layout;
  const auto padded = static_cast<std::size_t>(L.padded_numel());
  std::vector<float> full(padded);
  Stream& s = *cx.side;
  if (g.frozen) {
    std::vector<std::byte> values(padded * dtype_size(cx.dtype));
    if (cx.policy.shards_params) {
      std::vector<std::byte> shard = read_frozen_shard(g);
      DeviceBuffer send = cx.alloc(MemKind::buffer, cx.dtype, L.shard_numel());
      DeviceBuffer recv = cx.alloc(MemKind::buffer, cx.dtype, L.padded_numel());
      cx.device.copy(send.data(), shard.data(), shard.size(), s);
      coll.all_gather(send.data(), recv.data(), L.shard_numel(), cx.dtype, tag);
      cx.device.copy(values.data(), recv.data(), values.size(), s);
      cx.device.synchronize(s);  // before send / recv are freed
    } else {
      cx.device.copy(values.data(), g.param_full.data(), values.size(), s);
      cx.device.synchronize(s);
    }
    host_ops::cast(values.data(), cx.dtype, full.data(), DType::f32, padded);
    return full;
  }
  std::vector<float> range = updater.master_range(g);
  if (!cx.policy.shards_optimizer) return range;  // the whole buffer
  DeviceBuffer shard = cx.alloc(MemKind::buffer, DType::f32, L.shard_numel());
  DeviceBuffer all = cx.alloc(MemKind::buffer, DType::f32, L.padded_numel());
  cx.device.copy(shard.data(), range.data(), shard.bytes(), s);
  coll.all_gather(shard.data(), all.data(), L.shard_numel(), DType::f32, tag);
  cx.device.copy(full.data(), all.data(), full.size() * sizeof(float), s);
  cx.device.synchronize(s);
  return full;
}

const ParamInfo& core::EngineImpl::param_between_steps(std::uint32_t index, const char* call) {
  ZOE_CHECK_USAGE(index < model.params.size(), call, ": unknown parameter id ", index, " (", model.params.size(),
                  " parameters registered)");
  const ParamInfo& param = model.params[index];
  for (std::size_t mi = 0; mi < model.modules.size(); ++mi) {
    const ModulePhase phase = rules.phase(static_cast<int>(mi));
    ZOE_CHECK_USAGE(phase == ModulePhase::idle, call, "(", detail::quoted(param.name), ") while module ", detail::quoted(model.modules[mi].name), " is in ", phase == ModulePhase::forward ? "forward" : "backward",
                    ": a parameter's value is read or written between steps (end_* first)");
  }
  lifecycle.check_usable(call);
  updater.check_no_update_in_backward(call);
  finalize();
  updater.finish_update();
  return param;
}

void core::EngineImpl::all_reduce_scalars(std::span<double> values, ScalarReduce op, const std::string& name) {
  ZOE_CHECK_USAGE(!name.empty(), "all_reduce: the trainer's reduction needs a name (e.g. \"loss\")");
  ZOE_CHECK_USAGE(op == ScalarReduce::sum || op == ScalarReduce::mean || op == ScalarReduce::max ||
                      op == ScalarReduce::min,
                  "all_reduce(", detail::quoted(name), "): unknown ScalarReduce ", static_cast<int>(op));
  const std::size_t n = values.size();
  if (n == 0 && cx.world == 1) return;
  // One all-gather of the raw fp64 words (as pairs of fp32 bit patterns: coll.all_gather copies,
  // never computes), then every rank combines them in rank order: identical bits everywhere,
  // for every op, on every backend.
  const std::int64_t words = static_cast<std::int64_t>(2 * std::max<std::size_t>(n, 1));
  DeviceBuffer send = cx.alloc(MemKind::buffer, DType::f32, words);
  DeviceBuffer recv = cx.alloc(MemKind::buffer, DType::f32, words * cx.world);
  auto* area = reinterpret_cast<double*>(cx.readback.get(sizeof(double) * static_cast<std::size_t>(words / 2) *
                                                       static_cast<std::size_t>(1 + cx.world)));
  std::fill_n(area, words / 2, 0.0);
  std::copy(values.begin(), values.end(), area);
  Stream& s = *cx.side;
  cx.device.copy(send.data(), area, static_cast<std::size_t>(words) * sizeof(float), s);
  CollectiveTag tag;
  tag.kind = CollectiveTag::Kind::trainer;
  const std::string identity = name + '\0' + reduce_name(op);
  tag.group = static_cast<std::int32_t>(fnv1a(identity.data(), identity.size()) & 0x7fffffffu);
  tag.step = rules.steps();
  tag.label = detail::concat("the trainer's all_reduce ", detail::quoted(name), " (", reduce_name(op), " of ", n, " values)");
  coll.all_gather(send.data(), recv.data(), words, DType::f32, std::move(tag));
  double* all = area + words / 2;
  cx.device.copy(all, recv.data(), static_cast<std::size_t>(words * cx.world) * sizeof(float), s);
  cx.device.synchronize(s);  // rethrows a mismatch (CommError) or timeout
  const auto stride = static_cast<std::size_t>(words / 2);
  for (std::size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < cx.world; ++r) {
      const double v = all[static_cast<std::size_t>(r) * stride + i];
      switch (op) {
        case ScalarReduce::sum:
        case ScalarReduce::mean: acc += v; break;
        case ScalarReduce::max: acc = (std::isnan(acc) || std::isnan(v)) ? std::numeric_limits<double>::quiet_NaN() : std::max(acc, v); break;
        case ScalarReduce::min: acc = (std::isnan(acc) || std::isnan(v)) ? std::numeric_limits<double>::quiet_NaN() : std::min(acc, v); break;
      }
    }
    if (op == ScalarReduce::mean) acc /= cx.world;
    values[i] = acc;
  }
}


// ---------------------------------------------------------------- the public calls

// read_parameter's work, its errors naming `call` (gather_parameter or read_parameter).
static void read_parameter_into(core::EngineImpl& I, ParamId id, std::span<float> out, const char* call) {
  const core::ParamInfo& p = I.param_between_steps(id.index, call);
  core::Group& g = I.model.group(p.group);
  // Tagged with the parameter, so a rank reading another one fails on the host backends even
  // when the two groups' shapes match. The collective runs before the size check, so a rank
  // with a wrong `out` fails alone instead of leaving its peers waiting.
  std::vector<float> full = I.gather_group(g, param_value_tag(I, id.index, "reading"));
  ZOE_CHECK_USAGE(static_cast<std::int64_t>(out.size()) == p.numel, call, "(", detail::quoted(p.name), "): out has ",
                  out.size(), " elements, the parameter has ", p.numel);
  std::copy_n(full.begin() + g.layout->offset(p.slot), out.size(), out.begin());
}

std::vector<float> Engine::gather_parameter(ParamId id) {
  return impl_->guarded("gather_parameter", [&] {
    ZOE_CHECK_USAGE(id.index < impl_->model.params.size(), "gather_parameter: unknown parameter id ", id.index, " (",
                    impl_->model.params.size(), " parameters registered)");
    std::vector<float> out(static_cast<std::size_t>(impl_->model.params[id.index].numel));
    read_parameter_into(*impl_, id, out, "gather_parameter");
    return out;
  });
}

void Engine::read_parameter(ParamId id, std::span<float> out) {
  impl_->guarded("read_parameter", [&] { read_parameter_into(*impl_, id, out, "read_parameter"); });
}

void Engine::write_parameter(ParamId id, std::span<const float> value) {
  impl_->guarded("write_parameter", [&] {
    Impl& I = *impl_;
    const core::ParamInfo& p = I.param_between_steps(id.index, "write_parameter");
    // Every rank must write the same finite value of the right size: the ranks exchange (hash,
    // size, first non-finite index) and all of them throw, before anything is written, when any
    // rank's differs, so no rank is left waiting in a collective its peer skipped.
    struct Summary {
      std::uint64_t hash;
      std::int64_t size, nonfinite;  // nonfinite: first index of a non-finite element, or -1
    };
    Summary mine{fnv1a(value.data(), value.size() * sizeof(float)), static_cast<std::int64_t>(value.size()), -1};
    for (std::size_t i = 0; i < value.size() && mine.nonfinite < 0; ++i)
      if (!std::isfinite(value[i])) mine.nonfinite = static_cast<std::int64_t>(i);
    const std::size_t W = static_cast<std::size_t>(I.cx.world);
    constexpr std::int64_t kWords = sizeof(Summary) / sizeof(float);
    std::vector<Summary> all(W);
    {
      core::DeviceBuffer send = I.cx.alloc(core::MemKind::buffer, DType::f32, kWords);
      core::DeviceBuffer recv = I.cx.alloc(core::MemKind::buffer, DType::f32, kWords * I.cx.world);
      auto* area = reinterpret_cast<Summary*>(I.cx.readback.get(sizeof(Summary) * (1 + W)));
      area[0] = mine;
      I.cx.device.copy(send.data(), area, sizeof(Summary), *I.cx.side);
      I.coll.all_gather(send.data(), recv.data(), kWords, DType::f32, param_value_tag(I, id.index, "writing"));
      I.cx.device.copy(area + 1, recv.data(), W * sizeof(Summary), *I.cx.side);
      I.cx.device.synchronize(*I.cx.side);
      std::copy_n(area + 1, W, all.begin());
    }
    ZOE_CHECK_USAGE(mine.size == p.numel, "write_parameter(", detail::quoted(p.name), "): value has ", value.size(),
                    " elements, the parameter has ", p.numel);
    if (mine.nonfinite >= 0)
      ZOE_THROW(UsageError, "write_parameter(", detail::quoted(p.name), "): element ", mine.nonfinite, " is ",
                value[static_cast<std::size_t>(mine.nonfinite)], " (values must be finite)");
    for (std::size_t r = 0; r < W; ++r) {
      ZOE_CHECK_USAGE(all[r].size == p.numel && all[r].nonfinite < 0, "write_parameter(", detail::quoted(p.name), "): rank ", r,
                      "'s value is wrong (", all[r].size, " elements",
                      all[r].nonfinite >= 0 ? detail::concat(", element ", all[r].nonfinite, " not finite") : "",
                      "; see its error); nothing was written");
      ZOE_CHECK_USAGE(all[r].hash == mine.hash, "write_parameter(", detail::quoted(p.name), "): rank ", r,
                      " passes a different value than rank ", I.cx.rank,
                      " (every rank writes the same full value); nothing was written");
    }
    core::Group& g = I.model.group(p.group);
    const core::FlatLayout& L = *g.layout;
    const std::int64_t off = L.offset(p.slot);
    if (g.frozen) {
      // The compute-dtype copy only: this rank's shard of it, rounded as at initialisation.
      std::vector<std::byte> shard = I.read_frozen_shard(g);
      const std::int64_t base = L.shard_begin(I.cx.rank), S = L.shard_numel();
      const std::int64_t a = std::max(base, off), b = std::min(base + S, off + p.numel);
      const std::size_t esz = dtype_size(I.cx.dtype);
      if (a < b)
        host_ops::cast(value.data() + (a - off), DType::f32, shard.data() + static_cast<std::size_t>(a - base) * esz,
                       I.cx.dtype, static_cast<std::size_t>(b - a));
      I.write_frozen_shard(g, shard.data());
    } else {
      // The master weights of the parameter's elements in this rank's range; the moments stay.
      std::vector<float> states = I.updater.read_states(g);
      const std::int64_t a = std::max(g.opt_begin, off), b = std::min(g.opt_begin + g.opt_numel, off + p.numel);
      if (a < b) std::copy(value.begin() + (a - off), value.begin() + (b - off), states.begin() + (a - g.opt_begin));
      I.write_states_and_params(g, states);
    }
    if (I.cx.policy.shards_params) I.gatherer.drop_all_gathered();  // a gathered copy would be stale
  });
}

void Engine::all_reduce(std::span<double> values, ScalarReduce op, const std::string& name) {
  impl_->guarded("all_reduce", [&] { impl_->all_reduce_scalars(values, op, name); });
}

double Engine::all_reduce(double value, ScalarReduce op, const std::string& name) {
  impl_->guarded("all_reduce", [&] { impl_->all_reduce_scalars(std::span<double>(&value, 1), op, name); });
  return value;
}

}  // namespace zoe
