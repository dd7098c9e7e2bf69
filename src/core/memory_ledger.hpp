// Byte accounting of what one Engine holds, per tier and per kind (model states vs
// buffers), so the ZeRO memory claims are measured rather than assumed.
// Thread-safe (atomic counters).
#pragma once

#include <atomic>
#include <cstdint>

namespace zoe::core {

enum class Tier { device, host, nvme };
enum class MemKind { model_state, buffer };

// (A line of its own: every allocation and free, on any thread, writes it.)
class alignas(64) MemoryLedger {
 public:
  void add(Tier tier, MemKind kind, std::int64_t bytes) { slot(tier, kind).fetch_add(bytes); }
  void sub(Tier tier, MemKind kind, std::int64_t bytes) { slot(tier, kind).fetch_sub(bytes); }
  std::int64_t get(Tier tier, MemKind kind) const { return counters_[index(tier, kind)].load(); }

 private:
  static int index(Tier t, MemKind k) { return static_cast<int>(t) * 2 + static_cast<int>(k); }
  std::atomic<std::int64_t>& slot(Tier t, MemKind k) { return counters_[index(t, k)]; }
  std::atomic<std::int64_t> counters_[6] = {};
};

}  // namespace zoe::core
