// KeyValueStore: the rendezvous store ranks use to find each other (Gloo addresses,
// the NCCL unique id). Backends: InMemoryStore (ranks as threads of one process), TcpStore
// (ranks as processes; rank 0 serves it at MASTER_ADDR:MASTER_PORT or on a local socket) and
// TorchStoreClient (a client of torchrun's agent store).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zoe {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  /// Sets (or overwrites) `key`.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  /// The value of `key`, or nullopt if it is not set yet. Never blocks for the key.
  virtual std::optional<std::vector<char>> try_get(const std::string& key) = 0;
  /// Blocks until `key` is set and returns it. Throws TimeoutError after `timeout`,
  /// naming `what` (e.g. "rendezvous of rank 3") and the key.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout,
                                const std::string& what);
};

/// A store in this process's memory (a mutex-guarded map).
class InMemoryStore final : public KeyValueStore {
 public:
  void set(const std::string& key, const std::vector<char>& value) override;
  std::optional<std::vector<char>> try_get(const std::string& key) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout,
                        const std::string& what) override;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> map_;
};

/// Every rank sets "<prefix>/arrived/<rank>" and waits until all `world` ranks have.
/// Throws TimeoutError listing the ranks that did not arrive within `timeout`.
void wait_for_all_ranks(KeyValueStore& store, const std::string& prefix, int rank, int world,
                        std::chrono::milliseconds timeout);

}  // namespace zoe
