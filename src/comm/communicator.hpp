// The Communicator interface: collectives over the data-parallel group, queued on a
// device stream (NCCL semantics). Backends: LocalCommunicator (ranks as threads of one
// process), HostCommunicator (Gloo, ranks as processes) and NcclCommunicator. All ranks
// must issue the same collectives in the same order. Buffers are device memory of the
// communicator's device. `count` is elements.
//
// Byte counters follow nccl-tests' bus-bandwidth accounting per rank, with S = bytes of
// the full (all ranks') buffer and N = world size: all_gather and reduce_scatter add
// S*(N-1)/N, all_reduce adds 2*S*(N-1)/N, broadcast adds S. Counters are updated when
// the call is issued. all_reduce_f64 counts as an all_reduce of count*8 bytes; barrier
// counts nothing; `calls` counts every collective except barrier. Fractions round down.
//
// Determinism (every backend): each element's contributions are summed in rank order
// 0, 1, ..., N-1 in fp32 (bf16/fp16 widened exactly), `avg` then divides that fp32 sum by
// N, and the result is rounded once to the dtype (kernels/reduce.hpp). So every rank gets
// identical bits, and all_reduce followed by taking slice r equals reduce_scatter's result
// on rank r bitwise, at every world size. all_reduce_f64 sums in rank order in fp64.
// Errors: a failed or timed-out collective throws (CommError / TimeoutError naming the
// collective and, where the backend can tell, the missing rank) from Device::synchronize
// of the stream it was queued on; the communicator is unusable afterwards.
// Identity: besides its shape (name, count, dtype, op, root) a collective carries a
// CollectiveTag saying what it is for (which group's gradients or parameters, which step,
// which micro-batch), set by tag_next() just before issuing it. The host backends compare
// every rank's shape and tag at each position and throw CommError on every rank naming both
// when they differ, so two different reductions can never pair even when their shapes
// match. NCCL pairs collectives by position only (comparing would cost an extra exchange
// per collective): the engine's once-per-step agreement (src/core/call_rules.hpp) catches a
// different sequence there, before the optimizer runs.
// Rank failures (ncclCommAbort's role): a rank that fails calls abort(cause) (the Engine does
// when one of its calls fails, run_ranks when a rank's function throws). Its peers' collectives,
// the running one and every later one, then throw RankFailedError naming that rank and the cause
// within about a second (src/comm/rank_failure.hpp: threads see it at once, processes through
// the rendezvous store's side channel, read every 100 ms), instead of blocking until the
// timeout. The communicator is unusable afterwards on every rank.
// Thread-safety: one thread issues collectives (and calls tag_next); stats() may be read
// from any thread; abort() from any thread, concurrently with collectives.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "src/device/device.hpp"
#include "zoe/dtype.hpp"

namespace zoe {

enum class ReduceOp { sum, avg };

struct CommStats {
  std::int64_t all_gather_bytes = 0;
  std::int64_t reduce_scatter_bytes = 0;
  std::int64_t all_reduce_bytes = 0;
  std::int64_t broadcast_bytes = 0;
  std::int64_t calls = 0;
  std::int64_t total() const {
    return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + broadcast_bytes;
  }
};

/// What a collective is for. Two collectives at the same position pair only if their tags
/// are equal (kind, group, step, micro_batch; `label` is for messages only). The default tag
/// (kind untagged) is what collectives issued without tag_next carry.
struct CollectiveTag {
  /// param_value: the trainer reading or writing a parameter (group = the parameter's index);
  /// trainer: the trainer's own scalars (Engine::all_reduce; group = a 31-bit hash of its name
  /// and op, so two different reductions never pair).
  enum class Kind : std::uint8_t { untagged, params, grads, step_agreement, param_value, trainer };
  Kind kind = Kind::untagged;
  std::int32_t group = -1;        // the engine's group index (see Kind); -1 when not about one group
  std::int64_t step = -1;         // step() calls completed when issued; -1 = not tied to a step
  std::int32_t micro_batch = -1;  // gradients: micro-batches of the group reduced before; else -1
  std::string label;              // e.g. "gradients of 'B'": names the module in errors

  bool same(const CollectiveTag& o) const {
    return kind == o.kind && group == o.group && step == o.step && micro_batch == o.micro_batch;
  }
  /// ", <label>, step S, micro-batch M" (empty when untagged), for error messages.
  std::string describe() const;
};

/// One tensor of a grouped collective (NCCL's ncclGroupStart / ncclGroupEnd around several
/// collectives of one kind): `count` elements per rank. For all_gather_grouped, send holds
/// count and recv count x world; for reduce_scatter_grouped, send holds count x world and
/// recv count. Each part follows the single collective's rules (in-place layouts included).
struct GroupedPart {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Device& device() = 0;

  /// recv[r*count .. (r+1)*count) = rank r's send[0..count). recv holds world*count.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) = 0;
  /// recv[0..count) = reduction over ranks of send[rank*count .. (rank+1)*count).
  /// send holds world*count. bf16/fp16 are reduced in fp32 and rounded once.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                              Stream& stream) = 0;
  /// recv[i] = reduction over ranks of send[i]; send == recv allowed.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                          Stream& stream) = 0;
  /// fp64 sum all-reduce for small scalars (norms, overflow flags); in place.
  virtual void all_reduce_f64(double* data, std::size_t count, Stream& stream) = 0;
  /// buf on every rank = buf on `root`.
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) = 0;
  /// Completes on every rank once all ranks have issued it.
  virtual void barrier(Stream& stream) = 0;

  /// Several all-gathers of one dtype as one collective: for every part, part.recv[r*count ..
  /// (r+1)*count) = rank r's part.send. Every rank passes the same number of parts with the
  /// same counts, in the same order. Bytes counted as the parts' all_gathers; calls: one
  /// where the backend groups them, one per part otherwise. The default issues one all_gather per part (carrying the tag set by tag_next each);
  /// a backend whose collectives read and write the parts where they lie overrides it and
  /// says so in gathers_parts_in_place().
  virtual void all_gather_grouped(std::span<const GroupedPart> parts, DType dtype, Stream& stream);
  /// Several reduce-scatters of one dtype and op as one collective: for every part,
  /// part.recv[0..count) = the reduction over ranks of part.send[rank*count .. (rank+1)*count),
  /// with the single collective's arithmetic (same bits). Counted, defaulted and overridden as
  /// all_gather_grouped.
  virtual void reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dtype, ReduceOp op,
                                      Stream& stream);
  /// Whether the grouped collectives above move each part straight between the ranks' own
  /// buffers (no staging copy, one rendezvous). When false the engine packs the parts into one
  /// buffer and issues a single collective instead (the same bits, two more copies).
  virtual bool gathers_parts_in_place() const { return false; }

  /// This rank failed with `cause` (the message of the error that stops it): aborts the
  /// communicator and tells every peer. This rank's collectives running or issued later throw
  /// CommError ("this rank aborted the communicator: <cause>"); every peer's throw
  /// RankFailedError naming this rank and `cause` (cut to 4000 characters). Only the first
  /// failure a communicator knows of is posted: after a peer's failure (or a second call) it
  /// posts nothing, so the root cause is the one every rank reports. On ranks as processes it
  /// waits until every peer has read the failure, at most 2 s (rank 0 serves the store).
  /// Never throws (a side channel that cannot be reached is logged).
  virtual void abort(const std::string& cause) noexcept = 0;

  CommStats stats() const;
  void reset_stats();

  /// Tags the next collective issued on this communicator (only that one; later ones are
  /// untagged unless tagged again). From the issuing thread.
  void tag_next(CollectiveTag tag) { next_tag_ = std::move(tag); }

 protected:
  /// Backends call this when a collective is issued: the tag set by tag_next (then cleared).
  CollectiveTag take_tag() { return std::exchange(next_tag_, CollectiveTag{}); }
  /// Backends call these when a collective is issued.
  void count_all_gather(std::size_t full_bytes);
  void count_reduce_scatter(std::size_t full_bytes);
  void count_all_reduce(std::size_t bytes);
  void count_broadcast(std::size_t bytes);

 private:
  CollectiveTag next_tag_;  // issuing thread only
  std::atomic<std::int64_t> ag_{0}, rs_{0}, ar_{0}, bc_{0}, calls_{0};
};

}  // namespace zoe
