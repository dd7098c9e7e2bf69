// Lifecycle: the engine's state as a whole, with its named transitions.
//   registering --build()--> built        (the first call that needs the parameters)
//   registering --broke()--> broken       (a failure while building: initializers, tiers)
//   built       --broke()--> broken       (a failure that leaves the states unknown)
// Registration (add_parameter, add_param_group, add_module) is allowed while registering only;
// every call on a broken engine throws UsageError naming the original cause, registration
// included. A UsageError or ConfigError thrown by a call's checks changes nothing and leaves the
// state as it was (docs/architecture.md, "The engine's lifecycle").
// Not thread-safe: the thread that drives the Engine uses it.
#pragma once

#include <string>

#include "src/common/check.hpp"

namespace zoe::core {

class Lifecycle {
 public:
  enum class State { registering, built, broken };

  State state() const { return state_; }
  bool built() const { return state_ == State::built; }
  /// Throws UsageError naming `call` and the cause when broken.
  void check_usable(const std::string& call) const {
    ZOE_CHECK_USAGE(state_ != State::broken, call, ": this Engine is unusable: ", cause_,
                    "; destroy it and build a new one");
  }
  /// Throws UsageError unless registering (naming `call`): broken, or after the first forward.
  void check_registering(const std::string& call) const {
    check_usable(call);
    ZOE_CHECK_USAGE(state_ == State::registering, call, " after the first forward (the engine is built then: "
                    "register every parameter and module before the first begin_forward)");
  }
  /// registering -> built.
  void mark_built() {
    ZOE_CHECK(state_ == State::registering, "lifecycle: built twice");
    state_ = State::built;
  }
  /// Any state -> broken, keeping the first cause (a phrase: "its initialisation failed earlier
  /// (...)").
  void mark_broken(std::string cause) {
    if (state_ == State::broken) return;
    state_ = State::broken;
    cause_ = std::move(cause);
  }

 private:
  State state_ = State::registering;
  std::string cause_;  // why it broke, with the failing call's error
};

}  // namespace zoe::core
