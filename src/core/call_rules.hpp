// The rules a trainer's calls must follow (docs/architecture.md, "Rules a trainer follows"),
// checked at the call that breaks one, and the identity every engine collective carries.
//
// CallRules is one rank's record of its modules' phases and of this step's forward and
// backward calls; every public Engine call consults it before doing anything, so a broken
// rule throws UsageError naming the module and the rule and leaves the Engine unchanged:
//  - begin_forward(m) / begin_backward(m) need m idle (not inside a forward or backward);
//    end_forward(m) / end_backward(m) close the phase that is open, nothing else;
//  - begin_backward(m) needs a completed forward of m since m's last backward in this step
//    (one backward per module per micro-batch, after its forward). A module registered with
//    ForwardMode::in_backward (its forward runs inside its backward scope, e.g. a fused loss
//    head) needs instead some module's forward since its last backward, when any ran;
//  - at most gradient_accumulation_steps backward passes of a module between two step()s.
// A recomputed forward (activation checkpointing: begin_forward(m)/end_forward(m) again
// before begin_backward(m)) and forwards without backward (evaluation) are allowed.
//
// Across ranks the calls must be the same too, which no rank can check alone: each engine
// collective carries a CollectiveTag (group, step, micro-batch; the host communicators
// compare them), and CallRules keeps a fingerprint of this step's tags, which
// Collectives::agree_on_step() all-gathers before the optimizer runs (every backend, NCCL included).
// Not thread-safe: the thread driving the Engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "zoe/engine.hpp"

namespace zoe::core {

/// Where a module is between its begin_* and end_* calls.
enum class ModulePhase : std::uint8_t { idle, forward, backward };

class CallRules {
 public:
  /// `gradient_accumulation_steps` (>= 1): backward passes of each module per step.
  explicit CallRules(int gradient_accumulation_steps) : gas_(gradient_accumulation_steps) {}

  /// Registers the next module (indices in registration order).
  void add_module(std::string name, ForwardMode mode);

  // The public calls, module index m (already checked < module count). Each throws
  // UsageError naming the module and the rule, before changing any state, or records the
  // call.
  void begin_forward(int m);
  void end_forward(int m);
  void begin_backward(int m);
  void end_backward(int m);
  /// After a successful step(): a new step begins (counts and forward records cleared).
  void step_done();

  ModulePhase phase(int m) const { return modules_[static_cast<std::size_t>(m)].phase; }
  /// Backward passes of module m begun this step.
  int backwards(int m) const { return modules_[static_cast<std::size_t>(m)].backwards; }
  /// step() calls completed on this rank (tags collectives with it).
  std::int64_t steps() const { return steps_; }

  /// Adds a collective's tag to this step's fingerprint.
  void note_collective(const CollectiveTag& tag);
  /// A 32-bit hash of this step's collective tags and begin_backward calls in issue order.
  std::uint32_t fingerprint() const { return static_cast<std::uint32_t>(hash_ ^ (hash_ >> 32)); }
  std::uint32_t collectives() const { return collectives_; }
  std::uint32_t backward_calls() const { return static_cast<std::uint32_t>(backward_log_.size()); }
  /// "'B', 'A'": this step's begin_backward calls in order (for messages).
  std::string backward_log() const;

 private:
  struct Module {
    std::string name;
    ForwardMode mode = ForwardMode::separate;
    ModulePhase phase = ModulePhase::idle;
    bool forwarded = false;           // a forward completed since its last backward (this step)
    std::int64_t forwards_seen = -1;  // forwards_ at its last begin_backward (-1: none this step)
    int backwards = 0;                // backward passes this step
  };
  Module& module(int m) { return modules_[static_cast<std::size_t>(m)]; }
  Module& close(int m, ModulePhase phase);  // the shared checks of end_forward / end_backward
  void fold_into_hash(std::int64_t word);   // into hash_ (fingerprint)

  int gas_;
  std::vector<Module> modules_;
  std::int64_t steps_ = 0;
  std::int64_t forwards_ = 0;  // forwards completed this step (any module)
  std::vector<int> backward_log_;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  std::uint32_t collectives_ = 0;
};


}  // namespace zoe::core
