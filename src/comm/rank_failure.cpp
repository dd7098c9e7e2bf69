#include "src/comm/rank_failure.hpp"

#include <exception>

#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe {

std::string cut_cause(const std::string& cause) {
  if (cause.size() <= kMaxCauseChars) return cause;
  return detail::concat(cause.substr(0, kMaxCauseChars), "... (", cause.size() - kMaxCauseChars, " more characters)");
}

void throw_rank_failed(const char* op, std::uint64_t seq, int me, const RankFailure& failure, const char* file,
                       int line) {
  if (failure.rank == me)
    throw CommError(detail::concat(op, " (collective #", seq, ") on rank ", me,
                                   ": this rank aborted the communicator: ", failure.cause),
                    0, file, line);
  throw RankFailedError(detail::concat(op, " (collective #", seq, ") on rank ", me, ": rank ", failure.rank,
                                       " failed: ", failure.cause),
                        failure.rank, failure.cause, file, line);
}

StoreAbortChannel::StoreAbortChannel(std::shared_ptr<KeyValueStore> store, std::string prefix, int rank, int world,
                                     std::function<void(const RankFailure&)> on_peer_failure,
                                     std::chrono::milliseconds poll)
    : store_(std::move(store)), key_(prefix + "/abort"), ack_prefix_(prefix + "/abort_seen/"), rank_(rank),
      world_(world), on_peer_failure_(std::move(on_peer_failure)), poll_(poll) {
  ZOE_CHECK_USAGE(store_ != nullptr, "StoreAbortChannel: null store");
  watcher_ = std::thread([this] { watch(); });
}

StoreAbortChannel::~StoreAbortChannel() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

std::optional<RankFailure> StoreAbortChannel::read_store() {
  std::optional<std::vector<char>> value;
  try {
    value = store_->try_get(key_);
  } catch (const std::exception&) {
    return std::nullopt;  // the store is gone (rank 0 exited): the transfers report that
  }
  if (!value) return std::nullopt;
  std::string text(value->begin(), value->end());
  RankFailure f;
  auto newline = text.find('\n');
  try {
    f.rank = std::stoi(text.substr(0, newline));
  } catch (const std::exception&) {
    f.rank = -1;
  }
  f.cause = newline == std::string::npos ? text : text.substr(newline + 1);
  if (f.rank < 0) f.cause = "an unreadable failure record '" + cut_cause(text) + "'";
  return f;
}

void StoreAbortChannel::acknowledge() {
  try {
    store_->set(ack_prefix_ + std::to_string(rank_), {'1'});
  } catch (const std::exception&) {
  }
}

void StoreAbortChannel::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_ && !known_) {
    cv_.wait_for(lock, poll_, [&] { return stopping_; });
    if (stopping_ || known_) break;
    lock.unlock();
    std::optional<RankFailure> found = read_store();
    lock.lock();
    if (!found || known_ || stopping_) continue;
    known_ = found;
    lock.unlock();
    acknowledge();
    ZOE_LOG_DEBUG("rank {}: rank {} failed: {}", rank_, found->rank, found->cause);
    on_peer_failure_(*found);
    return;
  }
}

std::optional<RankFailure> StoreAbortChannel::check_now() {
  {
    std::lock_guard lock(mutex_);
    if (known_) return known_;
  }
  std::optional<RankFailure> found = read_store();
  if (!found) return std::nullopt;
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    if (!known_) {
      known_ = found;
      first = true;
    }
    found = known_;
  }
  if (first) {
    acknowledge();
    on_peer_failure_(*found);
  }
  return found;
}

std::optional<RankFailure> StoreAbortChannel::known() const {
  std::lock_guard lock(mutex_);
  return known_;
}

RankFailure StoreAbortChannel::post(const std::string& cause, std::chrono::milliseconds ack_wait) {
  RankFailure mine{rank_, cut_cause(cause)};
  {
    std::lock_guard lock(mutex_);
    if (known_) return *known_;
    known_ = mine;  // the watcher stops: this rank reports its own failure, not a peer's
  }
  cv_.notify_all();
  try {
    // A peer that failed at the same moment may have posted first: keep its record.
    if (auto earlier = read_store(); earlier && earlier->rank != rank_) {
      ZOE_LOG_DEBUG("rank {}: rank {} had failed first: {}", rank_, earlier->rank, earlier->cause);
      return *earlier;
    }
    std::string text = std::to_string(rank_) + "\n" + mine.cause;
    store_->set(key_, std::vector<char>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    ZOE_LOG_WARN("rank {}: could not tell the other ranks that this rank failed ({}): {}", rank_, e.what(),
                 mine.cause);
    return mine;
  }
  // Wait until every peer has read it (rank 0 serves the store: exiting sooner would take the
  // record with it), or ack_wait.
  const auto deadline = std::chrono::steady_clock::now() + ack_wait;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    for (;;) {
      bool seen = false;
      try {
        seen = store_->try_get(ack_prefix_ + std::to_string(p)).has_value();
      } catch (const std::exception&) {
        return mine;  // the store is gone
      }
      if (seen) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ZOE_LOG_DEBUG("rank {}: rank {} did not acknowledge this rank's failure within {} s", rank_, p,
                      ack_wait.count() / 1000.0);
        return mine;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return mine;
}

}  // namespace zoe
