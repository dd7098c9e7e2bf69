// The checkpoint's manifest (format 2): what a checkpoint directory holds, written by
// Engine::save_checkpoint as <dir>/manifest.json next to one data file per rank
// (<dir>/rank<R>.zoe), read by Engine::load_checkpoint and tools/zoe-ckpt.
//
// manifest.json is {"format": "zoe-checkpoint", "version": 2, "crc32c": "<8 hex>", "manifest":
// {...}}: the CRC32C is over the inner object's compact dump (nlohmann's: sorted keys, numbers
// that round-trip), so any edit of a value (a flipped digit of the loss scale) is refused while
// whitespace is not. The inner object holds the run's counters (step, step() calls, skipped
// steps, lr, the loss scaler), an opaque client state (the trainer's), the model (every group:
// its parameters' names, shapes and flat offsets, and each rank's range of the flat buffer) and
// per rank file its size and, per group, the CRC32C of its bytes.
//
// A rank file: a 64-byte header (RankFileHeader: magic, version, rank, world size, the
// manifest's id, size; CRC32C of its first 60 bytes), then per group the rank's range of the
// flat buffer in chunks of `chunk_elements` elements, each chunk [master | exp_avg |
// exp_avg_sq] (fp32, little-endian), the chunk the save's sub-group (one sub-group's data
// moves at a time). Element i of the range, state s (0 master, 1 exp_avg, 2 exp_avg_sq) is at
// chunk_offset(i) + (s * chunk_len(i) + i % chunk) * 4 (element_offset). Padding elements are
// zero.
//
// A frozen group (ParamOptions::frozen: compute-dtype values, no master weights or moments;
// format version 3, below) is stored as one state, its values in the manifest's compute dtype
// (2 bytes each for bf16 / fp16, 4 for fp32), and rank r holds shard r at every stage (at
// stages 0-2 every rank keeps the whole buffer, so shards store it once).
//
// Versions: a save writes version 2 when it has no frozen group (the layout zoe wrote before
// frozen records existed, so older readers still read it) and version 3 when it has one
// (groups[].frozen; a reader of version 2 only refuses it by its version, naming it). Both
// are read.
//
// The ranges are those of FlatLayout at the saved world size: stages 1-3 rank r holds shard r,
// stage 0 every rank holds the whole buffer (frozen groups: shard r at every stage). Parameter
// offsets inside a group do not depend on the world size (16-element alignment), so a reader
// at another world size or stage finds any parameter element by its flat index
// (checkpoint_reader.hpp).
//
// Thread-safety: plain values and pure functions.
// Errors: parse_manifest throws CorruptionError naming the file and the field.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zoe::ckpt {

/// The newest format this zoe writes and reads (version 3: frozen groups); it reads 2 as well.
inline constexpr int kFormatVersion = 3;
/// The oldest manifest version it reads (format 1 has no manifest: checkpoint_reader.hpp).
inline constexpr int kOldestManifestVersion = 2;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr std::uint64_t kHeaderBytes = 64;
/// The three fp32 states of every element of a trainable group, in their order within a chunk.
inline constexpr std::array<const char*, 3> kStateNames{"master", "exp_avg", "exp_avg_sq"};

struct ParamEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // first flat element of the group's buffer
  std::int64_t numel = 0;
};

/// One rank's part of a group: flat elements [begin, begin + numel) at byte `file_offset` of
/// its rank file, `crc32c` over those element_bytes(m, group) * numel bytes.
struct RankRange {
  std::int64_t begin = 0, numel = 0;
  std::uint64_t file_offset = 0;
  std::uint32_t crc32c = 0;
};

struct GroupEntry {
  std::string name;
  /// A frozen group: its values in the compute dtype, one state (version 3 only).
  bool frozen = false;
  std::int64_t padded_numel = 0;
  std::vector<ParamEntry> params;
  std::vector<RankRange> ranks;  // index = rank
};

struct RankFileEntry {
  std::string name;  // "rank<R>.zoe"
  std::uint64_t bytes = 0;
};

struct Manifest {
  int version = kFormatVersion;  // 2 or 3 (version_for); 1: synthesised for a format-1 directory
  std::uint64_t id = 0;          // random per save; every rank file's header repeats it
  int world_size = 1, stage = 0;
  std::string compute_dtype = "fp32";
  std::int64_t chunk_elements = 1;  // elements per chunk (format 1: one chunk per group)
  std::int64_t step = 0;            // optimizer steps applied (Engine::global_step)
  std::int64_t step_calls = 0, skipped_steps = 0;
  double lr = 0;
  double loss_scale = 1;
  int good_steps = 0, hysteresis_left = 0;
  std::string client_state;  // the caller's (Engine::save_checkpoint), opaque
  std::vector<GroupEntry> groups;
  std::vector<RankFileEntry> files;  // index = rank
};

/// The fixed header of a rank file (little-endian on disk as in memory: x86-64 / aarch64).
struct RankFileHeader {
  char magic[8] = {'Z', 'O', 'E', 'C', 'K', 'P', '2', '\n'};
  std::uint32_t version = kFormatVersion;  // the manifest's version (2 or 3): set it from there
  std::int32_t rank = 0, world_size = 0;
  std::uint32_t reserved = 0;
  std::uint64_t id = 0;
  std::uint64_t file_bytes = 0;
  std::uint8_t pad[16] = {};
  std::uint32_t reserved2 = 0;
  std::uint32_t crc32c = 0;  // of the 60 bytes before it
};
static_assert(sizeof(RankFileHeader) == kHeaderBytes);

/// The header's checksum (over every byte before `crc32c`).
std::uint32_t header_crc(const RankFileHeader& h);

/// The version a save of `m` writes: 3 if some group is frozen, else 2.
int version_for(const Manifest& m);

/// States per element of group `g`: 3 (master, exp_avg, exp_avg_sq), frozen 1 (the value).
inline int state_count(const GroupEntry& g) { return g.frozen ? 1 : 3; }
/// Bytes of one state of one element: 4 (fp32), frozen the compute dtype's (2 or 4).
std::uint64_t state_bytes(const Manifest& m, const GroupEntry& g);
/// Bytes per element of group `g` in a rank file: 12, frozen state_bytes.
inline std::uint64_t element_bytes(const Manifest& m, const GroupEntry& g) {
  return state_bytes(m, g) * static_cast<std::uint64_t>(state_count(g));
}
/// Bytes a rank file's part of group `g` with `numel` elements takes.
inline std::uint64_t range_bytes(const Manifest& m, const GroupEntry& g, std::int64_t numel) {
  return static_cast<std::uint64_t>(numel) * element_bytes(m, g);
}
/// Byte offset, within a range's bytes of group `g`, of element `i` of state `s` (0 ..
/// state_count(g) - 1) for chunks of `chunk` elements of a range of `numel` elements.
std::uint64_t element_offset(const Manifest& m, const GroupEntry& g, std::int64_t i, int state, std::int64_t chunk,
                             std::int64_t numel);
/// Whether group `g`'s ranks hold disjoint shards (stages 1-3, and frozen groups at every
/// stage) rather than each the whole buffer (stage 0's trainable groups).
inline bool sharded(const Manifest& m, const GroupEntry& g) { return m.stage >= 1 || g.frozen; }

/// Fills every rank's range and file offset of `m.groups` (their params, padded_numel and
/// frozen set) and `m.files` from world_size and stage (FlatLayout's shards; stage 0's
/// trainable groups: the whole buffer).
void lay_out_ranks(Manifest& m);

/// The most bytes a manifest.json may hold (about 1 KiB per parameter: millions of them).
inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{1} << 30;
/// The text of the manifest file `path`. Throws SystemError (ENOENT, ...) naming it when it
/// cannot be opened, CorruptionError naming it when it is not a regular file (a FIFO,
/// /dev/zero, a directory: never read) or exceeds kMaxManifestBytes, IoError on a failed read.
std::string read_manifest_text(const std::string& path);

/// manifest.json's text (see the top of this file).
std::string serialize(const Manifest& m);
/// Parses and checks manifest.json's text: the envelope, the checksum, every field's type and
/// range, that the groups' offsets, ranks and files are those lay_out_ranks gives (so a
/// reader may trust every offset), that each parameter's dtype and ranks are the derived ones
/// serialize writes, lr finite >= 0, step = step_calls - skipped_steps, and no key repeated
/// in an object. `path` names the file in errors. Throws CorruptionError naming the field and
/// its value, cut to a short excerpt ("'<path>': field 'manifest.groups[2].params[0].shape':
/// ...").
Manifest parse_manifest(std::string_view text, const std::string& path);

/// CRC32C as 8 lowercase hex digits.
std::string crc_hex(std::uint32_t crc);

}  // namespace zoe::ckpt
