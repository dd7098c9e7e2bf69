// EngineImpl (Engine::Impl): one rank's ZeRO engine, composed of parts that each own one concern:
//   EngineContext  what all parts share: config, device, communicator, side stream, frees
//   Model          the registry: parameters, modules, groups (model.hpp)
//   CallRules      the order of the trainer's calls, the step's fingerprint (call_rules.hpp)
//   Collectives    counted, tagged all-gather / reduce-scatter / all-reduce (collectives.hpp)
//   OffloadTiers   the CPU optimizer and the optimizer / parameter tiers (offload_tiers.hpp)
//   Updater        the optimizer update, its one plan / host part / executor (update/)
//   Gatherer       stage 3's all-gather, prefetch and release (gatherer.hpp)
//   GradReducer    gradient buffers, the bucket and its reductions (grad_reducer.hpp)
//   Lifecycle      registering / built / broken (lifecycle.hpp)
// The public calls (engine.cpp) check the call rules, then drive the parts; the step
// (step.cpp) reads top-down. Declared in the order the parts use each other: destroyed in the
// reverse, the ones that queue work first.
// Not thread-safe: one thread drives an Engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/common/boundary_errors.hpp"
#include "src/common/check.hpp"
#include "src/core/call_rules.hpp"
#include "src/core/collectives.hpp"
#include "src/core/engine_context.hpp"
#include "src/core/gatherer.hpp"
#include "src/core/grad_reducer.hpp"
#include "src/core/lifecycle.hpp"
#include "src/core/model.hpp"
#include "src/core/offload_tiers.hpp"
#include "src/core/state_access.hpp"
#include "src/core/update/updater.hpp"
#include "zoe/engine.hpp"

namespace zoe::core {

struct EngineImpl {
  EngineImpl(const Config& config, RankContext rank);
  /// Waits for the update, the side stream and every deferred free before the parts go.
  ~EngineImpl();

  EngineContext cx;
  Model model;
  CallRules rules{cx.config.gradient_accumulation_steps};
  Collectives coll{cx, rules, model};
  OffloadTiers tiers{cx};
  Updater updater{cx, model, coll, tiers};
  Gatherer gatherer{cx, model, coll, updater, tiers};
  GradReducer reducer{cx, model, coll, updater};
  Lifecycle lifecycle;

  // Rank failures. guarded() runs a public call; an error that leaves this rank unable to go
  // on aborts the communicator first (Communicator::abort, cause "<call>: <what()>"), so the
  // peers' collectives throw RankFailedError naming this rank and the error at once instead of
  // waiting comm_timeout_s for it (DeepSpeed on NCCL: ncclCommAbort). Not aborted: UsageError
  // and ConfigError (the call rules and set_lr throw them before changing anything, so the
  // trainer may go on), and errors every rank throws together after agreeing on them
  // (checkpoint.cpp sets `agreed_failure` just before: a failed save or load leaves the engine
  // usable).
  bool agreed_failure = false;
  template <class F>
  decltype(auto) guarded(const char* call, F&& f);

  // The public step()'s bookkeeping for the config's logging keys: step() calls made, skipped
  // ones included (DeepSpeed's global_steps), those skipped, and when the last one returned
  // (the Engine's construction before the first).
  std::int64_t step_calls = 0, skipped_calls = 0;
  std::chrono::steady_clock::time_point last_step_end = std::chrono::steady_clock::now();

  // engine_build.cpp
  /// Builds the groups, places every state and writes the initial values (at the first call
  /// that needs them): registering -> built. A failure breaks the engine (Lifecycle), except
  /// the checks that run before anything is built (no module, an unused parameter).
  void finalize();
  /// The module's tensors for the trainer (its gathered parameters, its gradient buffers).
  const ModuleTensors& views(int module, bool with_grads) { return model.views(module, with_grads); }

  // step.cpp
  /// The optimizer step after the trainer's last backward (see step.cpp).
  StepResult step();

  // initialize.cpp
  /// Writes every group's initial values to their homes, chunk by chunk (see the file).
  void write_initial_values();
  /// write_initial_values with the values of `source` (a checkpoint): the same chunks, homes
  /// and roundings; `with_moments` also sets exp_avg / exp_avg_sq (else zero).
  void write_values(const ChunkSource& source, bool with_moments);
  /// Fills `out` with the group's fp32 initial values of flat elements [begin, begin +
  /// out.size()) from the parameters' initializers (padding zero). Throws Error naming the
  /// parameter whose initializer failed.
  void fill_initial(const Group& g, std::int64_t begin, std::span<float> out);

  // param_access.cpp: the trainer's and the checkpoints' access to states between steps
  /// Writes all three states of the group's range from `all` and recomputes its compute-
  /// dtype parameters from the master weights (stages 1-2: all-gathered into the full copy).
  void write_states_and_params(Group& g, const std::vector<float>& all);
  /// This rank's compute-dtype part of a frozen group: its shard [shard_begin(rank),
  /// + shard_numel) (stages 0-2: that slice of the full copy), host memory.
  std::vector<std::byte> read_frozen_shard(Group& g);
  void write_frozen_shard(Group& g, const std::byte* shard);
  /// The group's whole padded flat buffer in fp32 (the master weights; frozen: the compute-
  /// dtype values widened), gathered from every rank (tagged collective). Host memory.
  std::vector<float> gather_group(Group& g, const CollectiveTag& tag);
  /// What read_parameter / write_parameter (`call`) do first: the parameter of `index`, once
  /// it is known (UsageError otherwise), no module is between begin_* and end_* (UsageError
  /// naming the parameter and the module), the engine is built and the last update is done.
  const ParamInfo& param_between_steps(std::uint32_t index, const char* call);
  /// Counted, tagged all-gather of raw fp64 words for the trainer's scalars.
  void all_reduce_scalars(std::span<double> values, ScalarReduce op, const std::string& name);
};

template <class F>
decltype(auto) EngineImpl::guarded(const char* call, F&& f) {
  agreed_failure = false;
  try {
    return std::forward<F>(f)();
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    if (!std::exchange(agreed_failure, false)) cx.comm.abort(detail::concat(call, ": ", e.what()));
    detail::rethrow_as_zoe_error(call);
  } catch (...) {
    cx.comm.abort(detail::concat(call, ": an exception that is not a std::exception"));
    detail::rethrow_as_zoe_error(call);
  }
}

}  // namespace zoe::core

namespace zoe {
// The public class's handle (private in engine.hpp) is the core's EngineImpl, which the
// checkpoint and export code can name.
struct Engine::Impl : core::EngineImpl {
  using EngineImpl::EngineImpl;
};
}  // namespace zoe
