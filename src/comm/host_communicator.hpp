// HostCommunicator: the Communicator of the host device, on Gloo's TCP transport
// (libgloo-dev). One Gloo context (a full mesh of TCP pairs) per communicator.
//
// Algorithms (all deterministic; see kernels/reduce.hpp for the arithmetic):
//   all_gather      every rank sends its block to every peer (full-mesh exchange).
//   reduce_scatter  all-to-all exchange of slices, then a local sum in rank order 0..N-1.
//   all_reduce      the same reduce-scatter over N near-equal parts of the buffer, then
//                   an all-gather of the reduced parts; so all_reduce's part r equals a
//                   reduce-scatter's result on rank r bitwise.
//   all_reduce_f64  all-gather of every rank's values, then an fp64 sum in rank order.
//   broadcast       the root sends the buffer to every peer.
//   barrier         every rank exchanges a one-byte token with every peer.
// Each rank sends (N-1)/N of the full buffer for all_gather and reduce_scatter, like a ring.
// Before each collective every rank sends its peers a 160-byte header (name, count, dtype,
// op, root, CollectiveTag) and compares theirs with its own: ranks issuing different
// collectives at the same position all throw CommError naming both (one small message
// round per collective).
//
// Ordering: collectives run in the order they were issued (a ticket per call), each on
// the thread of the stream it was queued on (Device::host_func), after the work queued
// on that stream before it. So every rank runs the same sequence over its one context.
// Timeouts: every collective must complete within `timeout`; otherwise it throws
// TimeoutError (rethrown by Device::synchronize on that stream) naming the collective and
// the lowest rank whose data did not arrive. After any failure the communicator is
// unusable: later collectives throw CommError quoting the first failure.
// Rank failures: abort(cause) posts "rank R failed: cause" to the rendezvous store
// (src/comm/rank_failure.hpp); every rank's watcher thread reads the store every 100 ms and, on
// a peer's failure, interrupts the transfers its collective waits for (Gloo's abortWaitRecv /
// abortWaitSend): the collective throws RankFailedError naming the rank and the cause. A
// transfer that fails because the peer's process exited also reads the store once, so a peer
// that posted its failure before exiting is named with its cause.
// Byte counters: as Communicator documents; all_reduce_f64 counts as an all_reduce of
// count*8 bytes; barrier counts nothing.
// Thread-safety: as Communicator (one issuing thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "src/comm/communicator.hpp"
#include "src/comm/store.hpp"

namespace zoe {

struct HostCommOptions {
  /// Bound on every collective and on the initial rendezvous.
  std::chrono::milliseconds timeout{300'000};
  /// Address this rank's Gloo pairs listen on: "127.0.0.1" when all ranks share a host,
  /// else a name or address the other hosts can reach.
  std::string hostname = "127.0.0.1";
  /// Keys of this group in the store start with it (several groups may share a store).
  std::string prefix = "zoe";
};

/// `timeout_s` seconds as milliseconds (at least 1). Throws UsageError unless finite and > 0.
std::chrono::milliseconds timeout_from_seconds(double timeout_s);

class HostCommunicator final : public Communicator {
 public:
  /// Joins the group: every rank of `world` must construct its communicator concurrently
  /// with the same store and prefix. `device` must be a host device. Throws TimeoutError
  /// listing the ranks that did not arrive, CommError if Gloo fails to connect.
  HostCommunicator(std::shared_ptr<Device> device, std::shared_ptr<KeyValueStore> store, int rank, int world,
                   HostCommOptions options = {});
  /// Waits until every collective issued has run (they may still be queued on streams).
  ~HostCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device& device() override { return *device_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream& stream) override;
  void all_reduce_f64(double* data, std::size_t count, Stream& stream) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) override;
  void barrier(Stream& stream) override;
  /// See Communicator::abort: posts the failure to the store (StoreAbortChannel) and ends this
  /// rank's waits; the peers' watchers read it within 100 ms and end theirs.
  void abort(const std::string& cause) noexcept override;

  struct Impl;

 private:
  std::shared_ptr<Device> device_;
  int rank_, world_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
