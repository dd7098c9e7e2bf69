// StateAccess over the engine's parts (see state_access.hpp).
#include "src/core/state_access.hpp"

#include <algorithm>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

StateAccess::StateAccess(EngineImpl& engine) : e_(engine) {}

StateAccess::~StateAccess() {
  // The scratch buffer may still be read by the side stream's last collective.
  if (scratch_) e_.cx.frees.after_side(std::move(scratch_));
}

int StateAccess::rank() const { return e_.cx.rank; }
int StateAccess::world() const { return e_.cx.world; }
const Config& StateAccess::config() const { return e_.cx.config; }
const StagePolicy& StateAccess::policy() const { return e_.cx.policy; }
DType StateAccess::compute_dtype() const { return e_.cx.dtype; }
std::int64_t StateAccess::chunk_elements() const { return e_.cx.sub_group_numel(); }
const Model& StateAccess::model() const { return e_.model; }

void StateAccess::settle(const char* call) {
  e_.lifecycle.check_usable(call);
  e_.finalize();
  e_.updater.check_no_update_in_backward(call);
  e_.updater.finish_update();
  e_.updater.drain_gradients();
  e_.cx.device.synchronize(*e_.cx.side);
  e_.cx.device.synchronize(e_.cx.device.compute_stream());
  e_.cx.frees.reap(true);
}

void StateAccess::settle_for_export(const std::string& call) {
  // Between begin_* and end_* the gathered parameters are in use (and the trainer's thread is
  // inside a module): the same rule as step().
  for (std::size_t m = 0; m < e_.model.modules.size(); ++m) {
    const ModulePhase phase = e_.rules.phase(static_cast<int>(m));
    ZOE_CHECK_USAGE(phase == ModulePhase::idle, call, " while module ", detail::quoted(e_.model.modules[m].name),
                    " is still in ", phase == ModulePhase::forward ? "forward" : "backward", ": end it first");
  }
  e_.updater.check_no_update_in_backward("export_safetensors");
  e_.finalize();
  e_.updater.finish_update();  // the master weights of the last step (as gather_parameter)
}

void StateAccess::fail_together() { e_.agreed_failure = true; }

void StateAccess::mark_broken(const std::string& why) { e_.lifecycle.mark_broken(why); }

void* StateAccess::scratch(std::int64_t elements) {
  if (scratch_.numel() < elements) {
    if (scratch_) e_.cx.frees.after_side(std::move(scratch_));
    scratch_ = e_.cx.alloc(MemKind::buffer, DType::f32, elements);
  }
  return scratch_.data();
}

void StateAccess::barrier() {
  e_.cx.comm.barrier(*e_.cx.side);
  e_.cx.device.synchronize(*e_.cx.side);
}

std::vector<std::string> StateAccess::share(const std::string& mine) {
  EngineContext& cx = e_.cx;
  const auto world = static_cast<std::size_t>(cx.world);
  std::vector<double> lens(world, 0.0);
  lens[static_cast<std::size_t>(cx.rank)] = static_cast<double>(mine.size());
  {
    DeviceBuffer buf = cx.alloc(MemKind::buffer, DType::f32, 2 * cx.world);  // world doubles
    cx.device.copy(buf.data(), lens.data(), world * sizeof(double), *cx.side);
    cx.comm.all_reduce_f64(static_cast<double*>(buf.data()), world, *cx.side);
    cx.device.copy(lens.data(), buf.data(), world * sizeof(double), *cx.side);
    cx.device.synchronize(*cx.side);
  }
  double longest = 1;
  for (double l : lens) longest = std::max(longest, l);
  const std::size_t words = (static_cast<std::size_t>(longest) + 3) / 4;
  std::vector<char> send(words * 4, 0), recv(words * 4 * world, 0);
  std::copy(mine.begin(), mine.end(), send.begin());
  DeviceBuffer dsend = cx.alloc(MemKind::buffer, DType::f32, static_cast<std::int64_t>(words));
  DeviceBuffer drecv = cx.alloc(MemKind::buffer, DType::f32, static_cast<std::int64_t>(words * world));
  cx.device.copy(dsend.data(), send.data(), send.size(), *cx.side);
  cx.comm.all_gather(dsend.data(), drecv.data(), words, DType::f32, *cx.side);
  cx.device.copy(recv.data(), drecv.data(), recv.size(), *cx.side);
  cx.device.synchronize(*cx.side);
  std::vector<std::string> out(world);
  for (std::size_t r = 0; r < world; ++r) out[r].assign(recv.data() + r * words * 4, static_cast<std::size_t>(lens[r]));
  return out;
}

std::string StateAccess::ranks_with(bool flag) {
  EngineContext& cx = e_.cx;
  std::vector<double> flags(static_cast<std::size_t>(cx.world), 0.0);
  flags[static_cast<std::size_t>(cx.rank)] = flag ? 1.0 : 0.0;
  DeviceBuffer buf = cx.alloc(MemKind::buffer, DType::f32, 2 * cx.world);  // world doubles
  cx.device.copy(buf.data(), flags.data(), flags.size() * sizeof(double), *cx.side);
  cx.comm.all_reduce_f64(static_cast<double*>(buf.data()), flags.size(), *cx.side);
  cx.device.copy(flags.data(), buf.data(), flags.size() * sizeof(double), *cx.side);
  cx.device.synchronize(*cx.side);
  std::string set;
  for (int r = 0; r < cx.world; ++r)
    if (flags[static_cast<std::size_t>(r)] != 0.0) set += (set.empty() ? "" : ", ") + std::to_string(r);
  return set;
}

void StateAccess::broadcast(int root, std::span<float> values) {
  EngineContext& cx = e_.cx;
  const std::size_t bytes = values.size() * sizeof(float);
  void* buf = scratch(std::max<std::int64_t>(1, static_cast<std::int64_t>(values.size())));
  if (cx.rank == root) cx.device.copy(buf, values.data(), bytes, *cx.side);
  cx.comm.broadcast(buf, values.size(), DType::f32, root, *cx.side);
  if (cx.rank != root) cx.device.copy(values.data(), buf, bytes, *cx.side);
  cx.device.synchronize(*cx.side);
}

void StateAccess::read_stored_part(std::size_t gi, const std::function<void(const void*, std::size_t)>& sink) {
  EngineContext& cx = e_.cx;
  Group& g = e_.model.groups[gi];
  if (g.frozen) {
    const FlatLayout& L = *g.layout;
    const std::size_t esz = dtype_size(cx.dtype);
    if (e_.tiers.params) {  // the tier hands out the whole shard (what its read buffers hold)
      const std::vector<std::byte> shard = e_.read_frozen_shard(g);
      sink(shard.data(), shard.size());
      return;
    }
    // The rank's own part of the full copy at stages 0-2, its shard at stage 3.
    const DeviceBuffer& src = cx.policy.shards_params ? g.param_shard : g.param_full;
    const std::int64_t first = cx.policy.shards_params ? 0 : L.shard_begin(cx.rank);  // in `src`
    const std::int64_t piece = std::max<std::int64_t>(1, std::min(chunk_elements(), L.shard_numel()));
    std::vector<std::byte> host(static_cast<std::size_t>(piece) * esz);
    for (std::int64_t x = 0; x < L.shard_numel(); x += piece) {
      const std::size_t bytes = static_cast<std::size_t>(std::min(piece, L.shard_numel() - x)) * esz;
      cx.device.copy(host.data(), src.at(first + x), bytes, *cx.side);
      cx.device.synchronize(*cx.side);
      sink(host.data(), bytes);
    }
    return;
  }
  std::vector<float> chunk;
  const std::vector<std::uint16_t> high = e_.updater.master_high_halves(g);
  for (const SubGroup& sg : g.subgroups) {
    const std::size_t n = static_cast<std::size_t>(sg.numel);
    chunk.resize(3 * n);
    if (sg.offloaded()) {
      e_.tiers.states->read_all(sg.offload_id, chunk.data(), high.empty() ? nullptr : high.data() + sg.begin);
    } else {
      cx.device.copy(chunk.data(), sg.device_states.data(), 3 * n * sizeof(float), *cx.side);
      cx.device.synchronize(*cx.side);
    }
    sink(chunk.data(), 3 * n * sizeof(float));
  }
}

void StateAccess::read_master(std::size_t gi, std::size_t sg_index, float* dst) {
  EngineContext& cx = e_.cx;
  const SubGroup& sg = e_.model.groups[gi].subgroups[sg_index];
  if (sg.offloaded()) {
    const std::vector<std::uint16_t> high = e_.updater.master_high_halves(e_.model.groups[gi]);
    e_.tiers.states->read_master(sg.offload_id, dst, high.empty() ? nullptr : high.data() + sg.begin);
    return;
  }
  cx.device.copy(dst, sg.master(), static_cast<std::size_t>(sg.numel) * sizeof(float), *cx.side);
  cx.device.synchronize(*cx.side);
}

std::vector<float> StateAccess::gather_group(std::size_t gi, const CollectiveTag& tag) {
  return e_.gather_group(e_.model.groups[gi], tag);
}

void StateAccess::write_values(const ChunkSource& source, bool with_moments) { e_.write_values(source, with_moments); }

StateAccess::Counters StateAccess::counters() const {
  return Counters{e_.updater.steps(), e_.step_calls, e_.skipped_calls, e_.updater.lr(), e_.updater.scaler().state()};
}

void StateAccess::finish_load(const Counters& c) {
  e_.updater.set_steps(c.optimizer_steps);
  e_.step_calls = c.step_calls;
  e_.skipped_calls = c.skipped_calls;
  e_.updater.set_lr(c.lr);
  e_.updater.scaler().restore(c.scaler);
  if (e_.cx.policy.shards_params) e_.gatherer.drop_all_gathered();
}

}  // namespace zoe::core
