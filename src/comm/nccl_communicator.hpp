// NcclCommunicator: the Communicator of CUDA devices, on NCCL. libnccl.so.2 is loaded at
// run time (dlopen), so zoe links and runs without NCCL when no GPU is used. The NCCL
// unique id travels through the same KeyValueStore as the host backend's addresses.
//
// Algorithms, chosen for the same determinism contract as the host backend
// (kernels/reduce.hpp): all_gather and broadcast are ncclAllGather / ncclBroadcast (no
// arithmetic); reduce_scatter is an all-to-all of slices (grouped ncclSend/ncclRecv) into
// a scratch buffer of world*count elements followed by the rank-order reduction kernel;
// all_reduce is that over N near-equal parts followed by a grouped all-gather of the
// parts; all_reduce_f64 is an ncclAllGather followed by an fp64 rank-order sum; barrier is
// an ncclAllReduce of one int. So the results equal the host backend's bitwise.
// Scratch buffers come from the CUDA stream-ordered pool and are not counted in the
// device's memory_stats (they live only during the collective).
// Timeouts: a watchdog thread aborts the NCCL communicator when a collective has been
// running (its stream reached it) for longer than the timeout; the collective then throws
// TimeoutError, naming it, from Device::synchronize of its stream (NCCL cannot tell which
// rank is missing). Later collectives throw CommError.
// Rank failures (what a DeepSpeed user gets from ncclCommAbort plus torch's store-based error
// propagation): abort(cause) aborts this rank's NCCL communicator and posts the failure to the
// store (src/comm/rank_failure.hpp); every peer's watcher reads it within 100 ms and aborts its
// own, so its running and later collectives throw RankFailedError naming the rank and cause.
// Identity: NCCL pairs collectives by position only; CollectiveTags are not compared here
// (that would cost an extra exchange per collective). Different shapes at one position hang
// until the watchdog's TimeoutError; equal shapes pair, and the engine's step agreement
// (src/core/call_rules.hpp, an all-gather of 16 bytes per step) fails every rank before the
// optimizer applies the mixed gradients.
// Built only when zoe has CUDA. Thread-safety: as Communicator.
#pragma once

#include <chrono>
#include <memory>

#include "src/comm/communicator.hpp"
#include "src/comm/store.hpp"

namespace zoe {

class NcclCommunicator final : public Communicator {
 public:
  /// `device` must be a CudaDevice. Every rank constructs its communicator concurrently
  /// with the same store. Throws CommError if NCCL cannot be loaded or initialised,
  /// TimeoutError listing the ranks that did not arrive at the rendezvous.
  NcclCommunicator(std::shared_ptr<Device> device, std::shared_ptr<KeyValueStore> store, int rank, int world,
                   std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

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
  /// See Communicator::abort: ncclCommAbort here (the kernels waiting for peers return), and
  /// the failure posted to the store; a peer's abort channel reads it within 100 ms and aborts
  /// its NCCL communicator too, so its collectives throw RankFailedError at synchronize.
  void abort(const std::string& cause) noexcept override;

  struct Impl;

 private:
  std::shared_ptr<Device> device_;
  int rank_, world_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
