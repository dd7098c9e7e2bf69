// Where a training step's time goes on one rank (zoe-gpt --profile), measured with steady_clock
// timers on the rank's thread (perf has no counters in the build VM). The EngineProvider stamps
// every engine call: time inside begin/end_forward and begin/end_backward is the engine's (gathers,
// waits for the previous update, reduce-scatter launches, gradient offload, waits for the side
// stream), time between a begin and its end is the model's compute for that module; the trainer
// adds batch sampling and Engine::step (gradient sink drain = tier I/O waits, the norm's
// all-reduce, the update's start). What no timer covers is "other" (model glue between modules).
// Work on other threads (the update pipeline, I/O, collectives on the host device's streams)
// shows only where the rank's thread waits for it.
// Each phase gets its wall time and the rank thread's CPU time (CLOCK_THREAD_CPUTIME_ID): with
// one compute thread per rank (--threads-per-rank 1, the default on 2 cores with 2 ranks) the CPU
// column is the compute's own cost even on a loaded machine, while the wall column also holds
// the time the scheduler gave to others, and a wait shows as wall time without CPU time.
// Thread-safety: one StepProfile per rank thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace gpt {

class StepProfile {
 public:
  enum Phase {
    batch,                // sample_batch (host)
    embeddings_forward,   // compute inside module 0's forward scope
    blocks_forward,       // compute inside the blocks' forward scopes
    head,                 // the head's fused forward + backward (its backward scope)
    blocks_backward,      // compute inside the blocks' backward scopes
    embeddings_backward,  // compute inside module 0's backward scope
    engine_begin_forward,
    engine_end_forward,
    engine_begin_backward,
    engine_end_backward,
    engine_step,
    other,  // the step's wall time no phase above covers
    kPhases
  };
  static const char* name(Phase p) {
    static const char* names[] = {"batch sampling",        "embeddings forward",    "blocks forward",
                                  "head forward+backward", "blocks backward",       "embeddings backward",
                                  "engine begin_forward",  "engine end_forward",    "engine begin_backward",
                                  "engine end_backward",   "engine step()",         "other (model glue)"};
    return names[p];
  }
  /// A moment: wall (steady_clock) and this thread's CPU clock, in seconds.
  struct Stamp {
    double wall = 0, cpu = 0;
  };
  static Stamp now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
            static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec)};
  }

  /// Counts time only while active (training steps after the warm-up; not evaluation).
  bool active = false;
  void add(Phase p, Stamp from, Stamp to) {
    if (!active) return;
    wall_[p] += to.wall - from.wall;
    cpu_[p] += to.cpu - from.cpu;
  }
  /// One whole step; "other" is what the phases leave of it.
  void add_step(Stamp from, Stamp to) {
    if (!active) return;
    step_.wall += to.wall - from.wall;
    step_.cpu += to.cpu - from.cpu;
    ++steps_;
  }
  int steps() const { return steps_; }
  /// Seconds over the counted steps: wall (cpu = false) or the rank thread's CPU time.
  double seconds(Phase p, bool cpu = false) const {
    const auto& x = cpu ? cpu_ : wall_;
    if (p != other) return x[p];
    double covered = 0;
    for (int k = 0; k < other; ++k) covered += x[k];
    return (cpu ? step_.cpu : step_.wall) - covered;
  }

  /// Prints ms per step and share of the step per phase, wall and CPU (stdout).
  void print(int rank) const {
    if (steps_ == 0) return;
    std::printf("profile of rank %d over %d steps (after the first ones): %.1f ms per step wall, %.1f ms CPU of the "
                "rank's thread\n", rank, steps_, 1e3 * step_.wall / steps_, 1e3 * step_.cpu / steps_);
    std::printf("  %-24s %9s %6s %9s %6s\n", "phase", "wall ms", "share", "CPU ms", "share");
    for (int k = 0; k < kPhases; ++k) {
      const auto p = static_cast<Phase>(k);
      std::printf("  %-24s %9.1f %5.1f%% %9.1f %5.1f%%\n", name(p), 1e3 * seconds(p) / steps_,
                  100.0 * seconds(p) / step_.wall, 1e3 * seconds(p, true) / steps_,
                  100.0 * seconds(p, true) / step_.cpu);
    }
  }

 private:
  std::array<double, kPhases> wall_{}, cpu_{};
  Stamp step_;
  int steps_ = 0;
};

}  // namespace gpt
