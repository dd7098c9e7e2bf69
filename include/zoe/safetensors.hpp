// Importing parameters from a safetensors file (Hugging Face's format: an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, the tensors'
// bytes with no padding). The counterpart of Engine::export_safetensors.
//
// A SafetensorsFile is opened once (its header read and validated strictly: see
// SafetensorsFile::open) and hands out ParamInitializers, so an Engine initialises each
// parameter from the file through its usual mechanism (DeepSpeed's zero.Init): each rank reads
// only the elements it keeps, a sub-group at a time, never the whole file; a model larger than
// host memory imports shard by shard.
//
// Thread-safety: a SafetensorsFile is immutable after open(); its members and the initializers
// it returns may be used from several threads at once (each read is one pread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zoe/engine.hpp"

namespace zoe {

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  /// The file's dtype name: "F32", "BF16", "F16" (the ones zoe imports), or any other
  /// name the format defines ("I64", "U8", ...).
  std::string dtype;
  std::vector<std::int64_t> shape;  // elements per dimension, row-major; [] is a scalar
  std::int64_t numel = 0;           // product of shape
};

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  /// Opens `path` and validates its header against the file: the length (at most
  /// 100,000,000 bytes, within the file), the JSON (an object; no duplicate keys; "dtype",
  /// "shape", "data_offsets" per tensor and nothing else; "__metadata__" of strings), every
  /// dtype known and every tensor's byte range exactly numel x its dtype's size, the ranges
  /// covering the data section without overlap or hole up to the file's last byte, and only
  /// spaces after the JSON. Throws CorruptionError "safetensors file '<path>': <what is
  /// wrong>" (naming the tensor where one is at fault), SystemError if the file cannot be
  /// opened, IoError if a read fails. Reads nothing past the header.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const noexcept;
  /// Every tensor, in file order (ascending byte offsets).
  const std::vector<SafetensorsTensor>& tensors() const noexcept;
  /// The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(const std::string& name) const noexcept;
  /// The "__metadata__" strings (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const noexcept;

  /// Fills `out` with elements [offset, offset + out.size()) of tensor `name`'s flattened
  /// row-major value as fp32 (exact for F32, BF16 and F16). Reads only those bytes.
  /// Throws UsageError for an unknown tensor, an unsupported dtype or a range outside the
  /// tensor, IoError / CorruptionError (the file shrank since open) naming the file and tensor.
  void read_f32(const std::string& name, std::int64_t offset, std::span<float> out) const;

  /// A ParamInitializer for Engine::add_parameter reading tensor `name`, checked now against
  /// the parameter's `shape` (elements per dimension): throws UsageError naming the file and
  /// the tensor if the file has no such tensor, its shape differs, or its dtype is not F32,
  /// BF16 or F16. The initializer keeps the file open (a reference to this object) until the
  /// Engine releases it after initialisation; it reads exactly the elements the Engine asks
  /// for (read_f32), so its errors reach the Engine's first forward as an Error naming the
  /// parameter.
  ParamInitializer initializer(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
