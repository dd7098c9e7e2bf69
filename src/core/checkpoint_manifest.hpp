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
// chunk_offset(i) + (s * chunk_len(i) + i % chunk) * 4. Padding elements are zero.
//
// The ranges are those of FlatLayout at the saved world size: stages 1-3 rank r holds shard r,
// stage 0 every rank holds the whole buffer. Parameter offsets inside a group do not depend
// on the world size (16-element alignment), so a reader at another world size or stage finds
// any parameter element by its flat index (checkpoint_reader.hpp).
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

inline constexpr int kFormatVersion = 2;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr std::uint64_t kHeaderBytes = 64;
/// The three fp32 states of every element, in their order within a chunk.
inline constexpr std::array<const char*, 3> kStateNames{"master", "exp_avg", "exp_avg_sq"};

struct ParamEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // first flat element of the group's buffer
  std::int64_t numel = 0;
};

/// One rank's part of a group: flat elements [begin, begin + numel) at byte `file_offset` of
/// its rank file, `crc32c` over those 12 * numel bytes.
struct RankRange {
  std::int64_t begin = 0, numel = 0;
  std::uint64_t file_offset = 0;
  std::uint32_t crc32c = 0;
};

struct GroupEntry {
  std::string name;
  std::int64_t padded_numel = 0;
  std::vector<ParamEntry> params;
  std::vector<RankRange> ranks;  // index = rank
};

struct RankFileEntry {
  std::string name;  // "rank<R>.zoe"
  std::uint64_t bytes = 0;
};

struct Manifest {
  int version = kFormatVersion;  // 1: synthesised for a format-1 directory (checkpoint_legacy)
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
  std::uint32_t version = kFormatVersion;
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

/// Bytes a rank file's group part takes: 12 bytes per element.
inline std::uint64_t range_bytes(std::int64_t numel) { return static_cast<std::uint64_t>(numel) * 12; }
/// Byte offset, within a range's bytes, of element `i` of state `s` (0..2) for chunks of
/// `chunk` elements of a range of `numel` elements.
std::uint64_t element_offset(std::int64_t i, int state, std::int64_t chunk, std::int64_t numel);

/// Fills every rank's range and file offset of `m.groups` (their params and padded_numel set)
/// and `m.files` from world_size and stage (FlatLayout's shards; stage 0: the whole buffer).
void lay_out_ranks(Manifest& m);

/// manifest.json's text (see the top of this file).
std::string serialize(const Manifest& m);
/// Parses and checks manifest.json's text: the envelope, the checksum, every field's type and
/// range, and that the groups' offsets, ranks and files are those lay_out_ranks gives (so a
/// reader may trust every offset). `path` names the file in errors. Throws CorruptionError
/// ("'<path>': field 'groups[2].params[0].shape': ...").
Manifest parse_manifest(std::string_view text, const std::string& path);

/// CRC32C as 8 lowercase hex digits.
std::string crc_hex(std::uint32_t crc);

}  // namespace zoe::ckpt
