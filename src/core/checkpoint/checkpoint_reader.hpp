// Reading a checkpoint's states by flat element, whatever world size and stage wrote them:
// the manifest says which rank file holds which range of each group's flat buffer (and where
// in the file), so any range of any group is read from the files that hold it (a reshard is
// reading another rank's ranges). Padding elements read as zero.
//
// Every read is pread(2) of the bytes asked for: host memory holds only the caller's span.
// verify() reads a whole group part of a file through a 1 MiB buffer and checks its CRC32C;
// the engine and zoe-ckpt verify every part they will read before they read any (nothing
// half-loaded on a corrupt file).
//
// Thread-safety: one thread per reader. Errors: CorruptionError naming the file and what is
// wrong (a header of another rank, another save or format, a size that is not the
// manifest's: truncated, a part whose CRC32C differs: corrupt), SystemError (a missing file:
// ENOENT), IoError (a failed read).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/core/checkpoint/checkpoint_manifest.hpp"

namespace zoe::ckpt {

class CheckpointReader {
 public:
  /// `dir` holds the rank files `m` names (m is trusted: parse_manifest or read_legacy made it).
  CheckpointReader(std::string dir, Manifest m);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }
  std::string file_path(int rank) const;

  /// Opens rank file `rank` (once) and checks its header and size against the manifest.
  void check_file(int rank);
  /// Checks group `g`'s part of rank file `rank` against its CRC32C (reads all of it).
  void verify(int rank, std::size_t g);
  /// The rank files holding some of flat elements [begin, end) of group g, ascending; where
  /// several hold an element (stage 0), `prefer` if it is one of them, else the lowest.
  std::vector<int> sources(std::size_t g, std::int64_t begin, std::int64_t end, int prefer) const;
  /// Fills `out` with state `state` (0 master, 1 exp_avg, 2 exp_avg_sq; a frozen group: 0,
  /// its values, widened exactly from the compute dtype) of flat elements [begin, begin +
  /// out.size()) of group g: parameter elements from the files (see sources), padding and
  /// elements past the saved buffer 0.
  void read(std::size_t g, int state, std::int64_t begin, std::span<float> out, int prefer);
  /// As read, but the stored bytes: `count` elements of state_bytes(manifest, group) each
  /// (fp32; a frozen group's compute dtype) into `out` (count * state_bytes bytes).
  void read_stored(std::size_t g, int state, std::int64_t begin, std::size_t count, void* out, int prefer);

 private:
  int owner(std::size_t g, std::int64_t x, int prefer) const;
  void pread_exact(int rank, void* dst, std::size_t bytes, std::uint64_t offset);

  std::string dir_;
  Manifest m_;
  std::vector<int> fds_;  // per rank file, -1 until check_file
};

/// A directory of format 1 (rank<R>.zoe files of "ZOECKP1", no manifest.json) as a manifest
/// (version 1, one chunk per group), for the model given as groups (names, params' names,
/// shapes, numels; ranges and offsets are filled here from the saved world size and stage in
/// rank 0's header). Reads the headers and the groups' (count, CRC) prefixes of every rank
/// file. Throws CorruptionError naming the file when a header or a group's element count does
/// not fit the model (UsageError if the model has another number of groups).
Manifest read_legacy(const std::string& dir, std::vector<GroupEntry> model);

/// Whether `dir` holds a format-1 checkpoint (rank0.zoe starting with "ZOECKP1", no manifest).
bool is_legacy(const std::string& dir);

}  // namespace zoe::ckpt
