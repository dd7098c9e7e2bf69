// TorchStoreClient: a client of PyTorch's c10d TCPStore, the store torchrun's agent serves at
// MASTER_ADDR:MASTER_PORT when it tells its workers TORCHELASTIC_USE_AGENT_STORE=True (the
// default static rendezvous). zoe's ranks rendezvous through it instead of serving their own
// store on a port the agent already holds.
//
// Wire protocol (torch/csrc/distributed/c10d/TCPStore.cpp, TCPStoreBackend.{hpp,cpp},
// TCPStoreLibUvBackend.cpp): a query is one command byte, then its arguments in host
// (little-endian) order; a string or byte vector is a u64 length and the bytes; CHECK is a u64
// key count and the keys. SET has no reply; CHECK replies one byte (0 READY: every key is
// set, 1 NOT_READY); GET replies a u64 length and the value (and a GET of a missing key makes
// the server drop the connection, so this client GETs only after CHECK said READY). Two dialects:
//   unvalidated  torch 1.x and 2.0 (Debian's 1.13 tested): SET 0, GET 2, CHECK 4; no handshake.
//   validated    torch since the VALIDATE handshake (PR #107607, Aug 2023; 2.1/2.2 on): the first
//                query of a connection must be VALIDATE (0) + u32 0x3C85F7CE, and the commands
//                moved up by one: SET 1, GET 3, CHECK 5. The classic backend closes a
//                connection whose first query is not VALIDATE; the libuv backend (the default
//                server since 2.4) ignores it. The libuv backend refuses keys over 8 KiB and
//                values over 8 MiB.
// Dialect detection: the client first sends an unvalidated CHECK of no keys (harmless to both:
// an old server answers READY, a new one closes or ignores it), and only when no READY comes
// within `probe_wait` reconnects and speaks the validated dialect. It never sends VALIDATE
// first, because an old server would read those bytes as a SET with a ~1 GB key length.
// Keys are stored as "/" + key_prefix + key: torch's own client adds "/" to every key, so
// Python's TCPStore.get(key_prefix + key) reads what zoe wrote.
// Thread-safety: every method may be called from any thread (one request at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "src/comm/store.hpp"

namespace zoe {

/// Which of torch's TCPStore protocols the server speaks (see the file comment).
enum class TorchStoreDialect : std::uint8_t {
  unvalidated,  // torch < 2.1: no handshake, SET 0 / GET 2 / CHECK 4
  validated,    // VALIDATE handshake, SET 1 / GET 3 / CHECK 5
};
/// "unvalidated (torch < 2.1)" or "validated (torch >= 2.1)", for messages.
const char* dialect_name(TorchStoreDialect d);

class TorchStoreClient final : public KeyValueStore {
 public:
  /// Connects to the torch TCPStore at host:port (retrying until `timeout`) and detects its
  /// dialect, waiting at most `probe_wait` for the unvalidated probe's answer. Throws
  /// TimeoutError naming the address (MASTER_ADDR:MASTER_PORT) when it cannot connect, and
  /// CommError when the server answers neither dialect (not a torch TCPStore).
  TorchStoreClient(const std::string& host, int port, std::string key_prefix, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds probe_wait = std::chrono::seconds(3));
  ~TorchStoreClient() override;
  TorchStoreClient(const TorchStoreClient&) = delete;
  TorchStoreClient& operator=(const TorchStoreClient&) = delete;

  /// Throws UsageError for a key over 8 KiB or a value over 8 MiB (torch's libuv server
  /// limits), CommError when the connection is lost.
  void set(const std::string& key, const std::vector<char>& value) override;
  /// Throws CommError when the connection is lost or the reply is malformed.
  std::optional<std::vector<char>> try_get(const std::string& key) override;

  TorchStoreDialect dialect() const { return dialect_; }

 private:
  [[noreturn]] void lost(const std::string& doing, const std::string& key) const;

  std::string address_;  // "host:port", for messages
  std::string prefix_;   // "/" + key_prefix
  TorchStoreDialect dialect_ = TorchStoreDialect::unvalidated;
  int fd_ = -1;
  std::mutex request_mutex_;
};

}  // namespace zoe
