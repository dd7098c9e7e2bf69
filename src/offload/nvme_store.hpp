// The NVMe tier: named tensors of one rank (optimizer-state sub-groups: master weights,
// exp_avg, exp_avg_sq, gradient and parameter shards) in one preallocated file at
// 4 KiB-aligned extents, moved by the io_uring engine.
//
// File: <dir>/zoe-rank<R>-<pid>-<n>.swap, created with O_EXCL (n counts stores in the
// process and skips names that exist), so two engines, or two processes, on the same
// nvme_path never share or clobber a file; it is removed when the store is destroyed.
// Its first 4 KiB block names the owning process (swap_file_owner.hpp); before creating its
// file a store removes the files that dead zoe processes left in the directory (a killed
// run never runs its destructors), logging each. O_DIRECT is used when the filesystem allows
// it (see io/direct_file.hpp).
//
// Registration is growable: register_tensor() may be called at any time and reserves the
// extent on disk at once with fallocate, so running out of disk is an IoError (ENOSPC) at
// registration (start-up), never during a swap. Register everything up front to get one
// contiguous file.
//
// Extents follow the header block. Extent layout for a tensor of B bytes: the data, padded to a 4 KiB boundary, with a
// 32-byte trailer in the last 4 KiB block holding a magic number, B, the CRC32C of the B
// data bytes and the CRC32C of the tensor's name. Extent size = round_up(B + 32, 4096).
// swap_out computes the CRC (on the calling thread, see zoe-nvme-bench) and writes data and trailer
// in one transfer; swap_in reads them and checks everything in wait(): a mismatch is a
// CorruptionError naming the tensor, the file and the extent.
//
// Buffers: `src` / `dst` must be 4096-aligned host memory (PinnedPool buffers or
// zoe::AlignedBuffer) of at least `bytes` bytes; only [0, bytes) is read or written
// (the partial last block goes through a small internal bounce buffer).
//
// Ordering: operations on different tensors run concurrently. An operation on a tensor
// first waits (blocking the caller) until that tensor's previous operation has finished
// its I/O, so a swap_in always sees the last swap_out.
//
// Thread-safety: every method may be called from any thread. Handles may be waited on from
// any thread; the caller must not touch a buffer until its handle is ready.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/direct_file.hpp"
#include "io/engine.hpp"
#include "zoe/config.hpp"

namespace zoe::offload {

struct NvmeStoreOptions {
  /// Directory for the file (offload_*.nvme_path); created if missing.
  std::string dir = "/tmp/zoe_nvme";
  /// This store's rank (part of the file name).
  int rank = 0;
  /// The engine's block size, queue depth and threads (config section `aio`).
  io::EngineOptions aio;
  /// Raise ConfigError when the directory's filesystem refuses O_DIRECT (zoe.require_direct_io).
  bool require_direct_io = false;
  /// Buffers to register with io_uring (e.g. PinnedPool::buffers()); transfers from or to
  /// them use fixed-buffer requests.
  std::vector<std::span<std::byte>> fixed_buffers;
  /// Test hook: behave as if the filesystem refused O_DIRECT.
  bool simulate_direct_refusal = false;

  /// Options from the engine config: `aio` (block_size, queue_depth, intra_op_parallelism,
  /// single_submit, overlap_events: io::EngineOptions),
  /// zoe.require_direct_io, and `nvme_path` (offload_optimizer's or offload_param's).
  /// Throws ConfigError naming the aio key whose value the engine cannot use.
  static NvmeStoreOptions from_config(const Config& config, const std::string& nvme_path, int rank);
  /// The same from the `aio` section and zoe.require_direct_io alone.
  static NvmeStoreOptions from_aio(const AioConfig& aio, bool require_direct_io, const std::string& nvme_path,
                                   int rank);
};

/// Where a tensor lives in the file (bytes).
struct Extent {
  std::uint64_t offset = 0;    // 4096-aligned
  std::uint64_t capacity = 0;  // reserved bytes, data + padding + trailer
  std::size_t bytes = 0;       // logical tensor size
};

/// Completion handle of one swap. Copyable; an empty handle is ready.
class SwapHandle {
 public:
  struct State;
  SwapHandle() = default;
  explicit SwapHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  /// True once the I/O is complete (wait() then does not block on I/O). Never blocks.
  bool ready() const noexcept;
  /// Blocks until the I/O is done; for swap_in also copies the tail and checks the CRC.
  /// Throws IoError (file, offset, length, errno) or CorruptionError (tensor name); every
  /// wait() on a failed swap rethrows the same error.
  void wait() const;

 private:
  std::shared_ptr<State> state_;
};

class NvmeStore {
 public:
  /// Creates the directory (if needed), removes dead processes' swap files there
  /// (remove_stale_swap_files) and creates this store's file with its header. Throws
  /// SystemError if the directory or file cannot be created, IoError if the header cannot
  /// be written, ConfigError as described for require_direct_io,
  /// UsageError for bad aio options.
  explicit NvmeStore(const NvmeStoreOptions& options);
  /// Waits for every outstanding swap, then closes and removes the file.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  /// Reserves an extent for `bytes` (>= 1) bytes under a new `name`. Throws UsageError for
  /// a duplicate name or zero size, IoError (ENOSPC) if the disk cannot hold it.
  void register_tensor(const std::string& name, std::size_t bytes);
  /// Writes `bytes` (== the registered size) from 4096-aligned `src`. Throws UsageError for
  /// an unknown name, a size mismatch or a misaligned buffer; I/O errors surface in wait().
  SwapHandle swap_out(const std::string& name, const void* src, std::size_t bytes);
  /// Reads the tensor into 4096-aligned `dst` (`bytes` == the registered size). Throws
  /// UsageError for an unknown name, a tensor never swapped out, a size mismatch or a
  /// misaligned buffer; I/O and corruption errors surface in wait().
  SwapHandle swap_in(const std::string& name, void* dst, std::size_t bytes);

  bool contains(const std::string& name) const;
  /// The tensor's extent (UsageError if unknown); tests use it to corrupt the file.
  Extent extent(const std::string& name) const;
  const std::string& path() const noexcept { return file_.path(); }
  /// True if the file uses O_DIRECT.
  bool direct_io() const noexcept { return file_.direct(); }
  /// Bytes reserved in the file (the 4 KiB header and the extents).
  std::uint64_t file_bytes() const;
  io::Engine& engine() noexcept { return *engine_; }

 private:
  struct Tensor {
    Extent extent;
    bool written = false;
    io::Handle last;  // the tensor's most recent transfer
  };
  Tensor& find(const std::string& name, const char* op);
  void wait_previous(Tensor& t, std::unique_lock<std::mutex>& lock);

  io::DirectFile file_;
  std::unique_ptr<io::Engine> engine_;
  io::FileRef ref_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Tensor> tensors_;  // guarded by mutex_
  std::uint64_t end_ = 0;                            // guarded by mutex_
};

}  // namespace zoe::offload
