#include "src/common/quote.hpp"
#include "src/core/call_rules.hpp"

#include <cstring>
#include <span>

#include "src/common/check.hpp"

namespace zoe::core {

void CallRules::add_module(std::string name, ForwardMode mode) {
  Module m;
  m.name = std::move(name);
  m.mode = mode;
  modules_.push_back(std::move(m));
}

void CallRules::begin_forward(int i) {
  Module& m = module(i);
  ZOE_CHECK_USAGE(m.phase != ModulePhase::forward, "begin_forward(", detail::quoted(m.name), ") while ", detail::quoted(m.name),
                  " is already in forward: end_forward(", detail::quoted(m.name), ") first (rule: begin and end alternate)");
  ZOE_CHECK_USAGE(m.phase != ModulePhase::backward, "begin_forward(", detail::quoted(m.name), ") while ", detail::quoted(m.name),
                  " is in backward: end_backward(", detail::quoted(m.name),
                  ") first (rule: a module is in one phase at a time; to recompute a checkpointed forward, run "
                  "begin_forward/end_forward before begin_backward, or compute it inside the backward scope from "
                  "its parameters)");
  m.phase = ModulePhase::forward;
}

// end_forward / end_backward: the module must be in `phase` (rule: each end_* closes its own
// begin_*); it becomes idle.
CallRules::Module& CallRules::close(int i, ModulePhase phase) {
  Module& m = module(i);
  const bool fwd = phase == ModulePhase::forward;
  const char* call = fwd ? "end_forward" : "end_backward";
  const char* begin = fwd ? "begin_forward" : "begin_backward";
  const ModulePhase other = fwd ? ModulePhase::backward : ModulePhase::forward;
  ZOE_CHECK_USAGE(m.phase != other, call, "(", detail::quoted(m.name), ") while ", detail::quoted(m.name), " is in ", fwd ? "backward" : "forward",
                  ": ", fwd ? "end_backward closes a backward" : "end_forward closes a forward",
                  " (rule: each end_* closes its own begin_*)");
  ZOE_CHECK_USAGE(m.phase == phase, call, "(", detail::quoted(m.name), ") without ", begin, "(", detail::quoted(m.name),
                  ") (rule: each end_* closes its own begin_*)");
  m.phase = ModulePhase::idle;
  return m;
}

void CallRules::end_forward(int i) {
  Module& m = close(i, ModulePhase::forward);
  m.forwarded = true;
  ++forwards_;
}

void CallRules::begin_backward(int i) {
  Module& m = module(i);
  ZOE_CHECK_USAGE(m.phase != ModulePhase::forward, "begin_backward(", detail::quoted(m.name), ") while ", detail::quoted(m.name),
                  " is still in forward: end_forward(", detail::quoted(m.name),
                  ") first (rule: a module's backward follows its completed forward)");
  ZOE_CHECK_USAGE(m.phase != ModulePhase::backward, "begin_backward(", detail::quoted(m.name), ") while ", detail::quoted(m.name),
                  " is already in backward: end_backward(", detail::quoted(m.name), ") first (rule: begin and end alternate)");
  if (m.mode == ForwardMode::separate) {
    ZOE_CHECK_USAGE(m.forwarded || m.backwards == 0, "begin_backward(", detail::quoted(m.name), "): ", detail::quoted(m.name),
                    " already ran its backward in this micro-batch (no forward of ", detail::quoted(m.name),
                    " since its last end_backward; rule: each module runs one backward per micro-batch, after its "
                    "forward; to apply a module twice in one micro-batch, register a second module with the same "
                    "parameters, as tied weights)");
    ZOE_CHECK_USAGE(m.forwarded, "begin_backward(", detail::quoted(m.name), ") with no forward of ", detail::quoted(m.name),
                    " in this micro-batch (rule: a module's backward follows its forward: begin_forward/end_forward(",
                    detail::quoted(m.name), ") first, or register ", detail::quoted(m.name),
                    " with ForwardMode::in_backward if its forward runs inside its backward scope)");
  } else {
    ZOE_CHECK_USAGE(forwards_ == 0 || m.forwards_seen < forwards_, "begin_backward(", detail::quoted(m.name), "): ", detail::quoted(m.name),
                    " already ran its backward in this micro-batch (no module's forward since its last "
                    "end_backward; rule: each module runs one backward per micro-batch)");
  }
  ZOE_CHECK_USAGE(m.backwards < gas_, "begin_backward(", detail::quoted(m.name), "): ", detail::quoted(m.name), " already ran its backward in all ",
                  gas_, " micro-batch(es) of this step (gradient_accumulation_steps = ", gas_,
                  "): call step() first (rule: each module runs one backward per micro-batch)");
  m.phase = ModulePhase::backward;
  m.forwarded = false;
  m.forwards_seen = forwards_;
  ++m.backwards;
  backward_log_.push_back(i);
  // In the fingerprint too: modules that share a group issue the same collectives in any
  // order, and the step agreement still sees a rank whose backward calls came in another.
  fold_into_hash(i | (std::int64_t{1} << 40));
}

void CallRules::end_backward(int i) {
  close(i, ModulePhase::backward);
}

void CallRules::step_done() {
  for (Module& m : modules_) {
    m.forwarded = false;
    m.forwards_seen = -1;
    m.backwards = 0;
  }
  forwards_ = 0;
  backward_log_.clear();
  hash_ = 0xcbf29ce484222325ull;
  collectives_ = 0;
  ++steps_;
}

void CallRules::note_collective(const CollectiveTag& tag) {
  const std::int64_t words[4] = {static_cast<std::int64_t>(tag.kind), tag.group, tag.step, tag.micro_batch};
  for (std::int64_t w : words) fold_into_hash(w);
  ++collectives_;
}

void CallRules::fold_into_hash(std::int64_t word) {
  // FNV-1a over the word's bytes.
  unsigned char bytes[sizeof(word)];
  std::memcpy(bytes, &word, sizeof(word));
  for (unsigned char b : bytes) hash_ = (hash_ ^ b) * 0x100000001b3ull;
}

std::string CallRules::backward_log() const {
  std::string s;
  for (int i : backward_log_) s += (s.empty() ? "" : ", ") + detail::quoted(modules_[static_cast<std::size_t>(i)].name);
  return s.empty() ? "none" : s;
}

}  // namespace zoe::core
