// A rank's failure as its peers learn it (Communicator::abort), and the error side channel of
// ranks as processes: StoreAbortChannel posts a failure to the rendezvous store and watches the
// store for a peer's. ncclCommAbort's counterpart for every backend: a rank that fails makes
// its peers' collectives throw RankFailedError naming it and its cause within about
// kAbortPollInterval, instead of leaving them blocked until the collective timeout.
//
// Protocol (one key per communicator group in the store):
//   "<prefix>/abort"          = "<rank>\n<cause>", set by the first rank that fails (a rank that
//                               already knows a failure posts nothing, so a peer's
//                               RankFailedError never overwrites the cause);
//   "<prefix>/abort_seen/<r>" = "1", set by rank r once it has read the failure.
// Every rank's watcher thread reads "<prefix>/abort" every kAbortPollInterval (one small store
// request; on rank 0, which serves the TcpStore, a map lookup). The failing rank waits after
// posting until every peer has acknowledged, at most kAbortAckWait: rank 0 serves the store,
// so if it exited at once its peers could no longer read why.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "src/comm/store.hpp"

namespace zoe {

/// How often a watcher reads the store for a peer's failure.
inline constexpr std::chrono::milliseconds kAbortPollInterval{100};
/// How long a failing rank waits for its peers to acknowledge its failure.
inline constexpr std::chrono::milliseconds kAbortAckWait{2000};
/// The longest cause kept (longer ones are cut, with a note saying so).
inline constexpr std::size_t kMaxCauseChars = 4000;

/// A rank that failed and why (its error message).
struct RankFailure {
  int rank = -1;
  std::string cause;
};

/// `cause` cut to kMaxCauseChars characters (a note says how many were dropped).
std::string cut_cause(const std::string& cause);

/// Throws RankFailedError "<op> (collective #<seq>) on rank <me>: rank <R> failed: <cause>"; when
/// R is `me` (this rank aborted its own communicator) a CommError saying so instead.
[[noreturn]] void throw_rank_failed(const char* op, std::uint64_t seq, int me, const RankFailure& failure,
                                    const char* file, int line);

class StoreAbortChannel {
 public:
  /// Rank `rank` of `world` (>= 2) ranks sharing `store` under `prefix`. Starts the watcher
  /// thread, which calls `on_peer_failure` once (from that thread) when another rank's failure
  /// appears in the store, after acknowledging it. A store that cannot be read (rank 0 exited)
  /// is retried at each poll. Thread-safety: every method from any thread.
  StoreAbortChannel(std::shared_ptr<KeyValueStore> store, std::string prefix, int rank, int world,
                    std::function<void(const RankFailure&)> on_peer_failure,
                    std::chrono::milliseconds poll = kAbortPollInterval);
  /// Stops the watcher (waits for a store request in progress).
  ~StoreAbortChannel();
  StoreAbortChannel(const StoreAbortChannel&) = delete;
  StoreAbortChannel& operator=(const StoreAbortChannel&) = delete;

  /// Posts this rank's failure with `cause` unless a failure is already known (then posts
  /// nothing), waits up to `ack_wait` for every peer to acknowledge, and returns the failure
  /// now known (this rank's, or the earlier one). Never throws: a store error is logged.
  RankFailure post(const std::string& cause, std::chrono::milliseconds ack_wait = kAbortAckWait);
  /// The failure known so far, reading the store once more if none is known yet (for a
  /// transfer that failed because the peer exited). Never throws.
  std::optional<RankFailure> check_now();
  /// The failure known so far, without reading the store.
  std::optional<RankFailure> known() const;

 private:
  void watch();
  std::optional<RankFailure> read_store();
  void acknowledge();

  std::shared_ptr<KeyValueStore> store_;
  const std::string key_, ack_prefix_;
  const int rank_, world_;
  const std::function<void(const RankFailure&)> on_peer_failure_;
  const std::chrono::milliseconds poll_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<RankFailure> known_;  // guarded by mutex_
  bool stopping_ = false;             // guarded by mutex_
  std::thread watcher_;
};

}  // namespace zoe
