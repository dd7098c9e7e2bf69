// Parameter counts for zoe-estimate from a model's files or a description. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/config/estimate.hpp"

namespace zoe::estimate {

/// What a safetensors file's header says (the format: an 8-byte little-endian header length
/// N, then N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets"},
/// plus an optional "__metadata__"; https://github.com/huggingface/safetensors).
struct SafetensorsSummary {
  std::int64_t tensors = 0;
  std::int64_t elements = 0;         // sum over tensors of the product of the shape
  std::int64_t largest_tensor = 0;   // elements of the largest tensor
  std::int64_t data_bytes = 0;       // sum of data_offsets[1] - data_offsets[0]
};

/// Reads only the header of `path`. Throws SystemError if it cannot be opened or read, and
/// zoe::Error naming the file when the header is malformed: shorter than 8 bytes, a length
/// over 100 MB (the format's limit) or past the end of the file, invalid JSON, a tensor
/// without dtype/shape/data_offsets, a negative dimension, an unknown dtype, or
/// data_offsets whose length differs from elements times the dtype's size.
SafetensorsSummary read_safetensors_header(const std::string& path);

/// Sum over several files (a sharded checkpoint); largest_tensor is the maximum.
SafetensorsSummary read_safetensors_headers(const std::vector<std::string>& paths);

/// A GPT-2-style decoder (Radford et al. 2019): token embedding V·h (tied with the output
/// layer), position embedding S·h, per layer 12h² + 13h (attention QKV 3h² + 3h, projection
/// h² + h, MLP 8h² + 5h, two layer norms 4h), final layer norm 2h. The largest layer is
/// max(V·h, 12h² + 13h), the next largest a block (V·h for one block larger than it). GPT-2 small (12, 768, 50257, 1024) gives 124,439,808. Throws
/// ConfigError unless every argument is >= 1, and ConfigError "parameters" when the count
/// would not fit in int64.
ModelShape gpt_model(std::int64_t layers, std::int64_t hidden, std::int64_t vocab, std::int64_t seq_len);

}  // namespace zoe::estimate
