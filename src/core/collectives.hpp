// Collectives: the engine's collectives over parameters and gradients, written once. Each is
// issued on the side stream, tagged with what it is for (the group, step and micro-batch: the
// host communicators compare tags, so ranks that disagree fail naming both sides), noted in
// the step's fingerprint (CallRules, compared by agree_on_step), and counted for
// Engine::last_step_traffic (elements as nccl-tests counts bus traffic).
// Not thread-safe: the thread that drives the Engine issues them, in program order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/core/call_rules.hpp"
#include "src/core/engine_context.hpp"
#include "src/core/model.hpp"

namespace zoe::core {

class Collectives {
 public:
  Collectives(EngineContext& cx, CallRules& rules, const Model& model)
      : cx_(cx), rules_(rules), model_(model) {}

  /// All-gather of `count` elements of `dt` per rank from `send` into `recv` (count x world).
  void all_gather(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  /// Reduce-scatter (sum) of count x world elements of `send` into `recv` (count).
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  /// All-reduce (sum) of `count` elements in place.
  void all_reduce(void* buf, std::int64_t count, DType dt, CollectiveTag tag);
  /// One all-gather for several groups (a coalesced prefetch): every part's send (count) into
  /// its recv (count x world). Straight between the parts' buffers where the communicator
  /// gathers parts in place; else packed into one buffer, all-gathered and unpacked (the same
  /// bits, the copies on the side stream). Counted as one all-gather either way.
  void all_gather_grouped(std::span<const GroupedPart> parts, DType dt, CollectiveTag tag);
  /// One reduce-scatter (sum) for several groups (a gradient bucket): every part's send
  /// (count x world) reduced into its recv (count); packed rank-major where the communicator
  /// cannot reduce parts in place. Counted as one reduce-scatter.
  void reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dt, CollectiveTag tag);

  /// The tag of a collective over group g's parameters / gradients (this step and micro-batch).
  CollectiveTag params_tag(const Group& g) const;
  CollectiveTag grads_tag(const Group& g) const;
  /// The tag of one collective over several groups' parameters / gradients (a reduce bucket,
  /// a coalesced all-gather): the first group's index and micro-batch, every group named.
  CollectiveTag coalesced_tag(const std::vector<int>& group_indices, CollectiveTag::Kind kind) const;

  /// The once-per-step agreement, at the start of step() (world > 1): every rank all-gathers
  /// [fingerprint, collectives, backward calls, steps] of this step and compares them. Throws
  /// UsageError on every rank naming the ranks that differ and this rank's backward calls when
  /// they do (then the step's gradients are mixed and the Engine must be destroyed), and
  /// rethrows the CommError / TimeoutError of any earlier collective of the step (e.g. the host
  /// communicators' "mismatched collectives", which names both modules).
  void agree_on_step();
  /// Starts counting a step: the traffic from here on is the next step's.
  void begin_step();
  /// Ends the step begun last: its traffic becomes last_traffic(), and the next step begins.
  void end_step();
  const TrafficReport& last_traffic() const { return last_traffic_; }

 private:
  /// What the counters held when the step began.
  struct Mark {
    CommStats comm;
    std::int64_t elements = 0, all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  };
  Mark now() const;
  CollectiveTag group_tag(const Group& g, CollectiveTag::Kind kind) const;
  /// "parameters of 'g'" / "gradients of 'g'" (and the modules sharing g), built on first use
  /// and kept: a group's name and users are fixed once modules run, and quoting them per call
  /// cost more than a small group's whole all-gather.
  const std::string& group_label(const Group& g, CollectiveTag::Kind kind) const;
  void note(CollectiveTag&& tag);

  EngineContext& cx_;
  CallRules& rules_;  // notes each collective in the step's fingerprint
  const Model& model_;
  std::int64_t elements_sent_ = 0;
  std::int64_t all_gather_calls_ = 0, reduce_scatter_calls_ = 0, all_reduce_calls_ = 0;
  mutable std::vector<std::string> labels_[2];  // group_label's cache: [params, grads][group]
  Mark step_start_;
  TrafficReport last_traffic_;
};

}  // namespace zoe::core
