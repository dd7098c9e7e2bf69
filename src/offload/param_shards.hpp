// Where stage 3's compute-dtype parameter shards live under parameter offload
// (offload_param, ZeRO-Infinity's parameter tier): in host memory (device = cpu) or in NVMe
// files (device = nvme), one shard per module group, instead of device memory.
//
// NVMe: the engine brings a shard in ahead of its all-gather through a pool of
// `buffer_count - 1` pinned buffers of `buffer_bytes` (offload_param.buffer_count ×
// buffer_size elements × dtype size); the remaining buffer is reserved for the optimizer's
// write-back of updated shards, so reads and the write-back never wait on each other.
// Pinned bytes are exactly buffer_count × buffer_bytes (rounded up to 4 KiB); no other host
// copy of a shard is kept (max_in_cpu is therefore always respected).
//
// Host memory first: on the nvme tier the shards host_budget covers (whole shards, in id order,
// while they fit) live in host memory as on the cpu tier and never touch NVMe: each saves its
// bytes read twice a step (forward, backward) and written once, the most NVMe bytes per byte of
// host memory of anything the engine keeps (zoe.host_memory_budget spends itself here first).
//
// Construction: add() registers sizes, finalize() opens the tier, then the engine writes each
// shard's initial bytes through write_buffer/commit (NVMe: the one write-back buffer, so no
// host copy of a shard exists at any time).
//
// Units: bytes. Thread-safety: add/finalize on one thread; begin_read/end-of-read, the write
// path and read/write may run on different threads for different shards, but a shard is
// never read and written at the same time (the engine orders them with events).
// Errors: ConfigError (offload_param.buffer_count / buffer_size too small), IoError /
// CorruptionError from the NVMe store, OutOfMemoryError from the pinned pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/common/aligned_buffer.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/pinned_pool.hpp"
#include "zoe/config.hpp"

namespace zoe::offload {

struct ParamShardsOptions {
  OffloadDevice device = OffloadDevice::cpu;  // cpu or nvme
  std::string nvme_path;
  int rank = 0;
  int buffer_count = 5;               // offload_param.buffer_count (>= 2 for nvme)
  std::size_t buffer_bytes = 1 << 20;  // offload_param.buffer_size × dtype size
  bool pin_memory = true;
  /// The rank's zoe.pinned_budget_bytes, shared with its other pinned consumers (null: unbudgeted).
  std::shared_ptr<PinnedBudget> pinned_budget;
  AioConfig aio;
  bool require_direct_io = false;
  /// As OptimizerStatesOptions; the cpu tier registers each shard's host memory too (the
  /// gather copies from it).
  /// Registers host memory with the device so copies from / to it are the pinned kind
  /// (e.g. Device::register_host_memory, cudaHostRegister); null: not registered.
  std::function<bool(void*, std::size_t)> register_fn;
  std::function<void(void*)> unregister_fn;
  /// nvme tier: bytes of host memory (pageable) for shards kept off NVMe, whole shards in id
  /// order while they fit (zoe.host_memory_budget). 0: every shard on NVMe. Ignored by cpu.
  std::int64_t host_budget = 0;
};

/// A shard on its way in: after wait(), data() holds its bytes. Owns its pinned buffer
/// (NVMe) until destroyed.
struct ShardRead {
  const void* data() const { return buffer ? buffer.data() : home; }
  /// NVMe: issues the read (if not yet issued) and waits for it; cpu: nothing.
  void wait();

  class ParamShards* owner = nullptr;
  int id = -1;
  const void* home = nullptr;  // cpu tier
  PinnedBuffer buffer;         // nvme tier
  std::optional<SwapHandle> io;
};

class ParamShards {
 public:
  explicit ParamShards(const ParamShardsOptions& options);
  ~ParamShards();

  /// Registers a shard of `bytes` bytes (its size only). Before finalize(). Returns its id
  /// (0, 1, ...). cpu tier: allocates its host memory (uninitialised); nvme: nothing in host
  /// memory. Throws ConfigError if it exceeds the NVMe buffer size.
  int add(std::size_t bytes);
  /// nvme tier: allocates the pinned buffers, opens the file and registers the shards.
  /// Writes nothing: every shard's initial bytes are then written with write_buffer(id) /
  /// commit(id) (or write()) before its first read.
  void finalize();

  /// Starts bringing shard `id` in: nullopt if no read buffer is free (NVMe; the caller
  /// returns one and retries). With `issue` the NVMe read starts now; otherwise at wait()
  /// (when the shard may still be being rewritten).
  std::optional<std::shared_ptr<ShardRead>> try_begin_read(int id, bool issue);
  /// Starts reading shard `id` into the caller's read `buffer` (see try_begin_read).
  void issue(ShardRead& read);

  /// The write of a shard's new bytes (initial values, the optimizer's update), after
  /// finalize(): write_buffer(id) is where the new bytes go, all bytes(id) of them (cpu:
  /// the shard itself; nvme: the reserved pinned buffer, leased until commit), commit(id)
  /// stores them (nvme: swap-out, waited). One write at a time. `with_stored_bytes`: the buffer
  /// starts with the shard's stored bytes (nvme: read into it and waited, bytes(id) more NVMe
  /// reads; split master weights rebuild the masters from them); otherwise its bytes are undefined.
  void* write_buffer(int id, bool with_stored_bytes = false);
  /// write_buffer(id, true) without reading NVMe: the buffer starts with the bytes of `stored`,
  /// a read of shard `id` made since its last commit (so it holds the stored bytes; waited for
  /// here if it is not complete). Throws UsageError if `stored` is another shard's or this
  /// tier's host-memory shard is asked for through it, IoError / CorruptionError from the read.
  void* write_buffer_from(int id, ShardRead& stored);
  void commit(int id);
  /// Gives the write buffer back without storing it (an update failed).
  void abort_write() { writing_.reset(); }

  /// Copies shard `id` out / in (checkpoints); not on the training path. After finalize().
  /// Throws UsageError if dst / src lies in device memory host code may not touch
  /// (check_host_accessible_in_process, src/device/host_access.hpp).
  void read(int id, void* dst);
  void write(int id, const void* src);

  /// How many reads may be held at once: nvme, the buffer_count - 1 read buffers; cpu, any
  /// number (INT_MAX: a read is the shard's home itself).
  int read_slots() const;
  std::size_t bytes(int id) const { return bytes_[id]; }
  std::int64_t host_bytes() const;     // shards in host memory (cpu tier; nvme: host_budget's)
  std::int64_t nvme_bytes() const;     // shards on NVMe
  std::int64_t staging_bytes() const;  // pinned buffers (nvme tier)
  /// Whether shard id lives in host memory (cpu tier, or host_budget's on nvme). After finalize().
  bool in_host(int id) const { return host_[id].data() != nullptr; }

 private:
  std::string name(int id) const { return "param.g" + std::to_string(id); }

  ParamShardsOptions options_;
  std::vector<std::size_t> bytes_;
  std::vector<AlignedBuffer> host_;  // cpu tier: the shards
  std::vector<char> registered_;     // cpu tier: host_[i] registered with register_fn
  std::size_t registered_bytes_ = 0;  // cpu tier: what the registered homes hold of the pinned budget
  std::unique_ptr<PinnedPool> read_pool_, write_pool_;
  std::unique_ptr<NvmeStore> store_;
  std::optional<PinnedBuffer> writing_;
  bool finalized_ = false;
};

}  // namespace zoe::offload
