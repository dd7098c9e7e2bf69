#include "src/device/copy_engine.hpp"

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "src/device/host_stream.hpp"

namespace zoe {

struct CopyEngine::Counters {
  std::atomic<std::int64_t> copies{0}, bytes{0};
};

std::chrono::nanoseconds CopyModel::duration(std::size_t bytes) const {
  double ns = latency_us * 1e3;
  if (gbps > 0) ns += static_cast<double>(bytes) / gbps;  // bytes / (gbps * 1e9 B/s) in ns
  return std::chrono::nanoseconds(std::llround(ns));
}

CopyEngine::CopyEngine(std::string name, CopyModel model)
    : model_(model), counters_(std::make_unique<Counters>()), queue_(std::make_unique<HostQueue>(std::move(name))) {}

CopyEngine::~CopyEngine() = default;  // ~HostQueue drains

void CopyEngine::copy(void* dst, const void* src, std::size_t bytes) {
  const auto modelled = model_.duration(bytes);
  const std::uint64_t ticket = queue_->enqueue([this, dst, src, bytes, modelled] {
    if (modelled.count() > 0) std::this_thread::sleep_until(std::chrono::steady_clock::now() + modelled);
    std::memmove(dst, src, bytes);
    counters_->copies.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  });
  queue_->wait_for(ticket);
}

std::int64_t CopyEngine::copies() const noexcept { return counters_->copies.load(std::memory_order_relaxed); }
std::int64_t CopyEngine::bytes() const noexcept { return counters_->bytes.load(std::memory_order_relaxed); }

}  // namespace zoe
