// SmallBlocks: the host device's blocks under HostDevice::kCacheMinBytes, carved from slabs of
// one size class each (a slab allocator), with a flat table of every block's state per slab.
// Why: a model of thousands of small modules allocates and frees a block per module and call;
// finding a block's size in a hash map of every live block cost a cache miss per free (the
// map's node), and blocks of their own, each with malloc's header, scattered a step's buffers.
// Here a free finds its slab by the address's 64 KiB granule (a map of a few entries per MiB of
// slabs, which stays in cache) and its state in the slab's array of 4-byte entries (neighbouring
// blocks share a line), and the blocks of a size class lie side by side, in allocation order.
// A size class's first slab holds one granule's worth of blocks (at least one), each next one
// twice as many, up to 2 MiB: the memory reserved beyond its blocks is at most about half of
// what a class ever had live, plus a granule (address-space caps, RLIMIT_DATA, see it all).
// A block's state: free (never carved, or in its size class's free list), live (1 + the
// requested bytes, which may be 0), or retired (freed under the poison debug mode: never reused).
// Slabs go back to the system only with the SmallBlocks.
// Thread-safety: none; the owner (HostDevice) locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace zoe {

class SmallBlocks {
 public:
  static constexpr std::size_t kGranule = std::size_t{64} << 10;
  static constexpr std::size_t kMaxSlabBytes = std::size_t{2} << 20;
  /// `alignment`: every size class is a multiple of it, and so every block's address (a power
  /// of two dividing kGranule).
  explicit SmallBlocks(std::size_t alignment);
  ~SmallBlocks();
  SmallBlocks(const SmallBlocks&) = delete;
  SmallBlocks& operator=(const SmallBlocks&) = delete;

  /// A block of `rounded` bytes for `bytes` requested (bytes <= rounded; rounded a multiple
  /// of the alignment, 0 < rounded <= kMaxSlabBytes / 2: HostDevice's blocks under 1 MiB): the
  /// most recently freed one of its size class if any (and the lines of the one the next take
  /// of the class gets are prefetched for writing), else a new one carved from the class's
  /// slab (`*carved` set true: the caller counts it reserved), else from a new slab. Returns
  /// null if the system has no memory for a new slab.
  void* take(std::size_t rounded, std::size_t bytes, bool* carved);

  /// What release() found at an address.
  enum class Found { live, free, retired, foreign };
  /// Frees the live block at `p`: its requested bytes into `*bytes` and its size class into
  /// `*rounded`; with `reuse` it joins its free list, else it is retired. Returns what was at
  /// `p` (only `live` changes anything; `foreign`: not the start of a block here).
  Found release(void* p, bool reuse, std::size_t* bytes, std::size_t* rounded);

  /// Whether `p` lies in a slab (a block's memory, whatever its state).
  bool owns(const void* p) const { return granules_.contains(granule_of(p)); }

  /// Empties every free list (their blocks are retired: never handed out again).
  void retire_free_lists();

 private:
  static constexpr std::uint32_t kFree = 0, kRetired = 0xFFFFFFFFu;
  struct Slab {
    char* base = nullptr;
    std::size_t block_bytes = 0;
    std::size_t carved = 0, capacity = 0;
    std::unique_ptr<std::uint32_t[]> state;  // per block: kFree, kRetired or 1 + the requested bytes
  };
  static std::uintptr_t granule_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p) / kGranule; }
  Slab* new_slab(std::size_t rounded);
  Slab& slab_of(const void* p) { return *granules_.find(granule_of(p))->second; }
  std::uint32_t& state_of(Slab& s, const void* p) {
    return s.state[static_cast<std::size_t>(static_cast<const char*>(p) - s.base) / s.block_bytes];
  }

  std::size_t alignment_;
  std::vector<std::unique_ptr<Slab>> slabs_;
  std::unordered_map<std::uintptr_t, Slab*> granules_;  // every granule of every slab
  std::vector<Slab*> carving_;                          // per size class: the slab carved from, or null
  std::vector<std::size_t> next_capacity_;              // per size class: the blocks of its next slab
  std::vector<std::vector<void*>> free_;                // per size class: freed blocks, newest last
};

}  // namespace zoe
