// Averages a value over the ranks of this process (ranks as threads): each rank contributes,
// all wait for the others, all get the mean. For the progress bar and the validation loss, which
// the engine's API does not reduce. A rank that fails calls abort() so the others stop waiting.
// Thread-safety: mean() and abort() are called from the rank threads concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "examples/gpt/error.hpp"

namespace gpt {

class RankMeans {
 public:
  /// `ranks`: threads that call mean() each round; `timeout_s`: the longest wait for the others.
  RankMeans(int ranks, double timeout_s) : values_(ranks, 0.0), timeout_(timeout_s) {}

  /// Mean of `value` over all ranks for this round. Throws zoe::Error after abort() or when a
  /// rank does not arrive within the timeout.
  double mean(int rank, double value) {
    std::unique_lock lock(mu_);
    GPT_CHECK(!aborted_, "another rank failed");
    values_[rank] = value;
    const long my_round = round_;
    if (++arrived_ == static_cast<int>(values_.size())) {
      double sum = 0;
      for (double v : values_) sum += v;
      result_ = sum / static_cast<double>(values_.size());
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return result_;
    }
    const bool done = cv_.wait_for(lock, std::chrono::duration<double>(timeout_),
                                   [&] { return round_ != my_round || aborted_; });
    GPT_CHECK(done, "rank ", rank, " waited ", timeout_, " s for the other ranks");
    GPT_CHECK(round_ != my_round, "another rank failed");
    return result_;
  }

  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<double> values_;
  double timeout_;
  double result_ = 0;
  int arrived_ = 0;
  long round_ = 0;
  bool aborted_ = false;
};

}  // namespace gpt
