// The safetensors file format (Hugging Face, https://github.com/huggingface/safetensors, the
// README's "Format" section): an 8-byte little-endian unsigned header length N, N bytes of a
// UTF-8 JSON object (it begins with '{' and may be padded at the end with spaces, 0x20), then
// the data section: every tensor's bytes, little-endian, row-major, in the order of their
// data_offsets, with no padding or hole between them and nothing after the last one.
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets":
// [BEGIN, END]} (byte offsets relative to the data section, END one past the last byte) and
// may hold "__metadata__", an object of string values. Duplicate keys are not allowed.
//
// The reader is strict, as the format demands of a file that may come from anywhere: a header
// that lies about offsets (overlaps, holes, a range past the end of the file, END - BEGIN not
// numel x the dtype's size), an unknown dtype, a non-integer or negative number, a duplicate or
// unknown key, a header length over 100,000,000 bytes (the reference implementation's limit)
// or past the file's end, anything but spaces after the JSON: each is a CorruptionError naming
// the file and what is wrong. Nothing is read beyond the header until asked.
// The writer streams: the header is computed from the tensors' shapes up front, the data is
// appended tensor by tensor in the order given (bounded memory: the caller's chunks), and the
// file appears under its name only when complete (temporary file, fsync, rename, fsync of the
// directory).
//
// Thread-safety: parse functions are pure. A SafetensorsReader's const members (read()) may be
// called from several threads at once (pread on one descriptor). A SafetensorsWriter is driven
// by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/file_writer.hpp"

namespace zoe::io {

/// The reference implementation's largest header (bytes): a larger N is refused before any
/// allocation.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// Bytes per element of a safetensors dtype ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3",
/// "F8_E8M0", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64", "C64");
/// 0 for a name it does not know (the sub-byte F4 / F6 types included: refused).
std::size_t safetensors_dtype_size(std::string_view dtype) noexcept;

/// One tensor as a header describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // the file's name for it, e.g. "BF16"
  std::vector<std::int64_t> shape;   // elements per dimension, row-major; [] is a scalar
  std::int64_t numel = 0;            // product of shape (1 for a scalar)
  std::uint64_t begin = 0, end = 0;  // byte range in the data section (relative to its start)
  std::uint64_t bytes() const { return end - begin; }
};

/// A validated header.
struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;  // N, padding included
  std::uint64_t data_bytes = 0;    // the data section's size: the file's size - 8 - N
  /// Every tensor, in file order (ascending data offsets; zero-size tensors at equal
  /// offsets keep the header's order).
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty if absent)
  /// Absolute file offset of the data section.
  std::uint64_t data_begin() const { return 8 + header_bytes; }
  /// The tensor named `name`, or nullptr.
  const SafetensorsEntry* find(std::string_view name) const;
};

/// Parses and validates the N header bytes `json` of a file whose data section has
/// `data_bytes` bytes. `file` names the file in errors. Throws CorruptionError
/// "safetensors file '<file>': <what is wrong>" for any departure from the format (see the top
/// of this file).
SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t data_bytes, const std::string& file);

/// Parses the structure of a whole file held in memory (`bytes`: the length prefix, the header
/// and the data section): what SafetensorsReader checks, for tests and the fuzzer. Throws
/// CorruptionError as parse_safetensors_header, and for a file shorter than 8 bytes or a header
/// length over kSafetensorsMaxHeaderBytes or past the end.
SafetensorsHeader parse_safetensors(std::string_view bytes, const std::string& file);

/// A tensor to write: name (non-empty, not "__metadata__", unique), dtype (a name
/// safetensors_dtype_size knows), shape (non-negative dimensions).
struct SafetensorsTensorSpec {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
};

/// The first bytes of the file the writer writes for `tensors` in this order with `metadata`:
/// the length prefix and the header (JSON with "__metadata__" first if not empty, then the
/// tensors in the order given, offsets contiguous from 0), padded with spaces so that the data
/// section starts at a multiple of 8 bytes, as the reference implementation pads.
/// `data_bytes` (if not null) receives the data section's size. Throws UsageError for an
/// invalid spec (naming the tensor) or a total size that overflows 64 bits.
std::string safetensors_header_bytes(const std::vector<SafetensorsTensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     std::uint64_t* data_bytes = nullptr);

/// An open safetensors file with its validated header.
class SafetensorsReader {
 public:
  /// Opens `path`, reads and validates its header against the file's size. Throws
  /// SystemError if it cannot be opened, IoError if a read fails, CorruptionError (naming the
  /// file and the problem) for a malformed file.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const noexcept { return path_; }
  const SafetensorsHeader& header() const noexcept { return header_; }
  /// Reads `bytes` bytes of tensor `t` (an entry of header()) from its byte `offset` into
  /// `dst` (host memory). Throws UsageError if the range leaves the tensor, IoError if the
  /// read fails, CorruptionError if the file ends early (it shrank after it was opened).
  /// Thread-safe.
  void read(const SafetensorsEntry& t, std::uint64_t offset, void* dst, std::size_t bytes) const;

 private:
  void pread_all(void* dst, std::size_t bytes, std::uint64_t at, const std::string& what) const;

  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
};

/// Writes a safetensors file tensor by tensor.
class SafetensorsWriter {
 public:
  /// Validates the specs (UsageError naming the tensor), creates `path`.tmp, reserves the
  /// file's whole size (IoError ENOSPC when it does not fit) and writes the header
  /// (safetensors_header_bytes). Throws SystemError if the file cannot be created.
  SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                    std::map<std::string, std::string> metadata = {});
  /// Without commit(): removes the temporary file (the target path is untouched).
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// Appends the next `bytes` bytes of the data section: the tensors' bytes in the order
  /// given, little-endian, with no padding; a call may span tensors. Throws UsageError past
  /// the data section's end, IoError if the write fails.
  void write(const void* data, std::size_t bytes);
  /// Bytes of the data section still to write.
  std::uint64_t remaining() const noexcept { return data_bytes_ - written_; }
  /// Makes the file durable and visible under `path`: UsageError unless every byte was
  /// written; fsync of the file, rename over `path`, fsync of the directory (IoError /
  /// SystemError on failure; the temporary file is then removed).
  void commit();

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_, tmp_;
  std::uint64_t data_bytes_ = 0, written_ = 0;
  std::unique_ptr<FileWriter> out_;  // the open temporary file; null once committed
};

}  // namespace zoe::io
