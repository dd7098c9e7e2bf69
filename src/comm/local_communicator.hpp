// LocalCommunicator: the Communicator of ranks that are threads of one process (one
// address space), used by make_local_ranks. No sockets and no staging copies: for each
// collective every rank publishes its buffer pointers in a shared LocalGroup, waits until
// all ranks have published, and then reads its peers' buffers directly.
//
// Algorithms (all deterministic, the same arithmetic as HostCommunicator, so results are
// bitwise identical to the Gloo backend; see kernels/reduce.hpp):
//   all_gather      each rank copies every peer's send block into its own recv.
//   reduce_scatter  each rank reduces its own slice over all ranks' send buffers, summing
//                   in rank order 0..N-1 in fp32, dividing by N for avg, rounding once.
//   all_reduce      each rank reduces part r of N near-equal parts (HostCommunicator's
//                   split) into its recv the same way, then, after a rendezvous, copies the
//                   other ranks' reduced parts from their recv buffers. So part r equals a
//                   reduce_scatter's result on rank r bitwise.
//   all_reduce_f64  each rank sums all ranks' values in rank order in fp64.
//   *_grouped       the same per part, straight between the ranks' own buffers, under one
//                   rendezvous for all the parts (no staging copy).
//   broadcast       every non-root rank copies the root's buffer.
//   barrier         the rendezvous alone.
// Each rank does 1/N of the copying and reduction work, in parallel on its stream thread.
// A closing rendezvous keeps every rank inside the collective until all peers have
// finished reading its buffers, so buffers may be reused as soon as the collective
// completes on the stream. Buffers that overlap in ways other than the in-place layouts
// NCCL allows (all_gather: send == recv + rank*count; reduce_scatter: recv == send +
// rank*count; all_reduce: send == recv) are first copied to a private scratch buffer.
//
// Ordering: collectives run in the order they were issued (a ticket per call), each on
// the thread of the stream it was queued on (Device::host_func), after the work queued on
// that stream before it. The k-th collective of every rank meets the k-th of every other.
// Mismatches: if ranks issue different collectives at the same position (name, count,
// dtype, reduce op, root or CollectiveTag differ), every rank throws CommError naming both.
// Timeouts: all ranks must join a collective within `timeout` of it starting to run on
// the rank; otherwise it throws TimeoutError naming the collective and the lowest rank
// that did not join (rethrown by Device::synchronize of the stream). After any failure
// the communicator is unusable (later collectives throw CommError quoting the first
// failure), and the whole group is marked failed: a rank joining a collective after a
// peer failed throws at once, quoting the peer's failure, instead of waiting for a peer
// that will not come (TimeoutError if the peer timed out, else CommError).
// Rank failures: abort(cause) records the first failing rank in the LocalGroup and wakes every
// waiting rank: a collective not yet joined by all ranks throws RankFailedError naming that
// rank and its cause on every peer (CommError on the aborting rank), at once.
// Byte counters: as Communicator documents; all_reduce_f64 counts as an all_reduce of
// count*8 bytes; barrier counts nothing.
// Thread-safety: as Communicator (one issuing thread per rank; stats() from any thread).
// The LocalGroup is shared by the ranks' communicators and is thread-safe.
#pragma once

#include <chrono>
#include <memory>

#include "src/comm/communicator.hpp"

namespace zoe {

/// The rendezvous state shared by the `world` communicators of one in-process group.
/// Create one with make_local_group and pass it to every rank's LocalCommunicator.
class LocalGroup;

/// A group of `world` ranks (>= 1) whose collectives must all join within `timeout`
/// (> 0). Throws UsageError otherwise. Thread-safe once created.
std::shared_ptr<LocalGroup> make_local_group(int world, std::chrono::milliseconds timeout);

class LocalCommunicator final : public Communicator {
 public:
  /// Rank `rank` of `group` on `device` (a host device: peers read its memory directly).
  /// Each rank of the group must have exactly one communicator. Construction does not
  /// wait for peers. Throws UsageError for a null group or device, a non-host device, a
  /// rank outside [0, world) or a rank that already has a communicator.
  LocalCommunicator(std::shared_ptr<Device> device, std::shared_ptr<LocalGroup> group, int rank);
  /// Waits until every collective issued has run (they may still be queued on streams).
  ~LocalCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device& device() override { return *device_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override;
  /// Each rank copies every peer's part straight into its own recv (reduce_scatter_grouped:
  /// reduces its slice of every peer's part into its recv), one rendezvous for all the parts.
  /// Throws UsageError (when issued) if a part's buffers overlap other than in place.
  void all_gather_grouped(std::span<const GroupedPart> parts, DType dtype, Stream& stream) override;
  void reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dtype, ReduceOp op, Stream& stream) override;
  bool gathers_parts_in_place() const override { return true; }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream& stream) override;
  void all_reduce_f64(double* data, std::size_t count, Stream& stream) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) override;
  void barrier(Stream& stream) override;
  /// See Communicator::abort: the group keeps the first failure; a peer waiting to join a
  /// collective (or joining later) throws RankFailedError at once. A collective every rank
  /// has already joined runs to its end (peers may still read this rank's buffers).
  void abort(const std::string& cause) noexcept override;

  struct Impl;

 private:
  std::shared_ptr<Device> device_;
  int rank_, world_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
