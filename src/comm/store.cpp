#include "src/comm/store.hpp"

#include <thread>

#include "src/common/check.hpp"

namespace zoe {

std::vector<char> KeyValueStore::get(const std::string& key, std::chrono::milliseconds timeout,
                                     const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (auto value = try_get(key)) return *value;
    if (std::chrono::steady_clock::now() >= deadline)
      ZOE_THROW(TimeoutError, what, ": key '", key, "' was not set within ", timeout.count() / 1000.0, " s");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

void InMemoryStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard lock(mutex_);
    map_[key] = value;
  }
  cv_.notify_all();
}

std::optional<std::vector<char>> InMemoryStore::try_get(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::vector<char> InMemoryStore::get(const std::string& key, std::chrono::milliseconds timeout,
                                     const std::string& what) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return map_.count(key) > 0; }))
    ZOE_THROW(TimeoutError, what, ": key '", key, "' was not set within ", timeout.count() / 1000.0, " s");
  return map_[key];
}

void wait_for_all_ranks(KeyValueStore& store, const std::string& prefix, int rank, int world,
                        std::chrono::milliseconds timeout) {
  auto key = [&](int r) { return prefix + "/arrived/" + std::to_string(r); };
  store.set(key(rank), {'1'});
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string missing;
    int n_missing = 0;
    for (int r = 0; r < world; ++r) {
      if (!store.try_get(key(r))) {
        missing += (n_missing++ ? ", " : "") + std::to_string(r);
      }
    }
    if (n_missing == 0) return;
    if (std::chrono::steady_clock::now() >= deadline)
      ZOE_THROW(TimeoutError, "rendezvous '", prefix, "' (world size ", world, ", this is rank ", rank, "): ",
                n_missing, " rank(s) did not arrive within ", timeout.count() / 1000.0, " s: rank(s) ", missing);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace zoe
