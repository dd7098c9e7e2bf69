// StateAccess: the one door through which the checkpoint and export code (core/checkpoint/)
// reaches one rank's engine. It offers who this rank is, the registry (read-only), a group's
// states between steps (read, written, gathered), the counters a checkpoint keeps, and the
// small agreements between ranks those calls need. It hides the parts (EngineImpl), the
// device, the streams and the tiers: how a state moves between the device, the offload tiers
// and host memory is decided here; the formats and the files are checkpoint/'s.
// Not thread-safe: made by one public call, on the thread that drives the Engine, for that call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/config/stage_policy.hpp"
#include "src/core/device_buffer.hpp"
#include "src/core/group.hpp"
#include "src/core/loss_scaler.hpp"
#include "src/core/model.hpp"
#include "zoe/config.hpp"

namespace zoe::core {

struct EngineImpl;

/// Where write_values takes a chunk's values: the fp32 master weights of flat elements
/// [begin, begin + master.size()) of the group and, for a chunk of the optimizer range when
/// asked, its exp_avg then exp_avg_sq (`moments`: 2 * master.size() floats; else empty).
using ChunkSource =
    std::function<void(const Group& g, std::int64_t begin, std::span<float> master, std::span<float> moments)>;

class StateAccess {
 public:
  explicit StateAccess(EngineImpl& engine);
  ~StateAccess();
  StateAccess(const StateAccess&) = delete;
  StateAccess& operator=(const StateAccess&) = delete;

  // --- Who
  int rank() const;
  int world() const;
  const Config& config() const;
  const StagePolicy& policy() const;
  DType compute_dtype() const;
  /// Elements of one chunk of a rank's stored part: zero_optimization.sub_group_size, aligned.
  std::int64_t chunk_elements() const;
  /// The registry: parameters, modules, groups with their layouts and sub-groups.
  const Model& model() const;

  // --- Before a state is touched
  /// Checkpoint save and load (`call` names it): the engine usable and built, no update in
  /// backward, the last update, the gradients and the side stream done (Engine::synchronize).
  /// Throws UsageError for misuse, the build's error if building fails.
  void settle(const char* call);
  /// Export (`call`: "export_safetensors(<path>)"): every module between steps (UsageError
  /// naming the module), no update in backward, the engine built, the last update done.
  void settle_for_export(const std::string& call);
  /// The failure about to be thrown is thrown by every rank together: the engine's guard does
  /// not abort the communicator for it, and the engine stays usable.
  void fail_together();
  /// A failure left the states half-written: every later call is refused (Lifecycle broken).
  void mark_broken(const std::string& why);

  // --- Agreements between ranks (collectives on the side stream, waited for)
  void barrier();
  /// Every rank's `mine`, in rank order (UTF-8 or bytes; any length).
  std::vector<std::string> share(const std::string& mine);
  /// The ranks whose `flag` is set, as "0, 2" (empty if none), on every rank.
  std::string ranks_with(bool flag);
  /// Rank `root`'s `values` (host memory, the same size on every rank) on every rank.
  void broadcast(int root, std::span<float> values);

  // --- States, between steps (after settle)
  /// This rank's stored part of group `gi`, in order, to `sink(bytes, size)`: a frozen group's
  /// compute-dtype shard in pieces of chunk_elements() (parameter offload: the whole shard at
  /// once); a trainable group's sub-groups, each as [master | exp_avg | exp_avg_sq] (3 n fp32).
  void read_stored_part(std::size_t gi, const std::function<void(const void* bytes, std::size_t size)>& sink);
  /// This rank's fp32 master weights of sub-group `sg` of group `gi` into `dst` (its numel floats).
  void read_master(std::size_t gi, std::size_t sg, float* dst);
  /// Group `gi`'s whole padded flat buffer in fp32 (master weights; frozen: its compute-dtype
  /// values widened), gathered from every rank with one tagged collective. Host memory.
  std::vector<float> gather_group(std::size_t gi, const CollectiveTag& tag);
  /// Writes every group's states from `source`, chunk by chunk, as the initial values are
  /// written (the same homes and roundings); `with_moments`: exp_avg / exp_avg_sq too (else 0).
  void write_values(const ChunkSource& source, bool with_moments);

  // --- The counters a checkpoint keeps
  struct Counters {
    std::int64_t optimizer_steps = 0;  // updates applied (the step number of the last)
    std::int64_t step_calls = 0;       // step() calls, skipped ones included (DeepSpeed's global_steps)
    std::int64_t skipped_calls = 0;    // step() calls skipped for inf/NaN gradients
    double lr = 0.0;                   // the learning rate the next step uses
    LossScaler::State scaler;          // the dynamic loss scaler
  };
  Counters counters() const;
  /// After a load wrote the states: the counters set, and (stage 3) the gathered parameters,
  /// which hold the old values, dropped.
  void finish_load(const Counters& c);

 private:
  /// A device buffer of at least `elements` fp32 for the collectives above (kept for the call).
  void* scratch(std::int64_t elements);

  EngineImpl& e_;
  DeviceBuffer scratch_;
};

}  // namespace zoe::core
