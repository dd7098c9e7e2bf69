// TcpStore: zoe's own rendezvous store for ranks as processes. Rank 0 serves the key-value
// map on MASTER_PORT (all interfaces) and every other rank connects to
// MASTER_ADDR:MASTER_PORT, or, for a job on one host with no address given (mpirun without
// MASTER_ADDR), rank 0 serves on a Linux abstract Unix socket named after the job id. Clients
// retry until the timeout so the order processes start in does not matter. Values are opaque
// bytes. (Under torchrun's agent store ranks use TorchStoreClient instead.)
// Wire format (one request at a time per connection, little-endian):
//   request  u8 op (1 set, 2 get), u32 key length, key, [set: u64 value length, value]
//   reply    set: u8 1;  get: u8 found, [found: u64 value length, value]
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/store.hpp"

namespace zoe {

class TcpStore final : public KeyValueStore {
 public:
  /// Server (rank 0): listens on `port`; throws SystemError if it cannot bind it.
  /// Client: connects to host:port; throws TimeoutError naming the address if that does
  /// not succeed within `timeout`.
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout);
  /// A Linux abstract Unix socket name (no file; one host, one network namespace).
  struct LocalSocket {
    std::string name;
  };
  /// Server: listens on the abstract socket `where` (throws SystemError if another process
  /// holds the name). Client: connects to it; throws TimeoutError naming it if that does not
  /// succeed within `timeout`.
  TcpStore(LocalSocket where, bool is_server, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value) override;
  std::optional<std::vector<char>> try_get(const std::string& key) override;

 private:
  void serve_accept();
  void serve_client(int fd);

  std::string address_;  // "host:port" or "abstract socket 'name'", for messages
  bool is_server_;
  // Server side.
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::mutex map_mutex_;
  std::map<std::string, std::vector<char>> map_;
  std::thread acceptor_;
  std::mutex clients_mutex_;
  std::vector<int> client_fds_;
  std::vector<std::thread> client_threads_;
  // Client side.
  int fd_ = -1;
  std::mutex request_mutex_;
};

}  // namespace zoe
