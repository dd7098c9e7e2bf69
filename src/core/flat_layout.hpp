// Partitioning of one parameter group (the parameters a module owns) into a flat buffer
// and equal per-rank shards (ZeRO, arXiv 1910.02054 §5).
//
// Each parameter starts at an offset aligned to kAlign elements; the flat buffer is padded
// to a multiple of world_size * kAlign so every rank's shard has the same size, a multiple
// of kAlign (SIMD- and sub-group-friendly). Padding elements are zero in every buffer and
// never reach results, norms or checkpoints. Units: elements. Plain value; thread-safe reads.
#pragma once

#include <cstdint>
#include <vector>

namespace zoe::core {

class FlatLayout {
 public:
  static constexpr std::int64_t kAlign = 16;

  /// numels[i] = elements of the i-th parameter (0 allowed). world_size >= 1.
  FlatLayout(const std::vector<std::int64_t>& numels, int world_size);

  int world_size() const { return world_size_; }
  std::size_t param_count() const { return offsets_.size(); }
  /// Start of parameter i in the flat buffer.
  std::int64_t offset(std::size_t i) const { return offsets_[i]; }
  std::int64_t numel(std::size_t i) const { return numels_[i]; }
  /// Live (non-padding) elements of all parameters.
  std::int64_t live_numel() const { return live_; }
  /// Flat buffer elements including padding: world_size * shard_numel().
  std::int64_t padded_numel() const { return shard_ * world_size_; }
  /// Elements per rank's shard (equal for all ranks, a multiple of kAlign, >= kAlign).
  std::int64_t shard_numel() const { return shard_; }
  /// First flat element of `rank`'s shard.
  std::int64_t shard_begin(int rank) const { return shard_ * rank; }
  /// Live elements inside `rank`'s shard (they add up to live_numel() over ranks).
  std::int64_t live_in_shard(int rank) const;

  /// [begin, end) flat ranges of live elements (one per non-empty parameter), ascending.
  struct Range {
    std::int64_t begin, end;
  };
  const std::vector<Range>& live_ranges() const { return live_ranges_; }

 private:
  // The sizes first: padded_numel() / shard_numel(), read per module and call, in one line.
  int world_size_;
  std::int64_t live_ = 0, shard_ = 0;
  std::vector<std::int64_t> numels_, offsets_;
  std::vector<Range> live_ranges_;
};

}  // namespace zoe::core
