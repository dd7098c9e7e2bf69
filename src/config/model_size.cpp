#include "src/config/model_size.hpp"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "src/common/check.hpp"

namespace zoe::estimate {
namespace {
constexpr std::uint64_t kMaxHeader = 100'000'000;  // the safetensors format's limit

std::int64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, std::int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

bool is_index(const nlohmann::json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0); }
}  // namespace

SafetensorsSummary read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) ZOE_THROW_ERRNO(errno, "cannot open safetensors file '", path, "'");
  const std::uint64_t file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char len_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8))
    ZOE_THROW(Error, "safetensors file '", path, "': shorter than its 8-byte header length (", file_size, " bytes)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
  if (n > kMaxHeader || n > file_size - 8)
    ZOE_THROW(Error, "safetensors file '", path, "': header length ", n, " exceeds ",
              n > kMaxHeader ? "the format's 100 MB limit" : "the file", " (file is ", file_size, " bytes)");
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n)))
    ZOE_THROW_ERRNO(errno ? errno : EIO, "cannot read the header of safetensors file '", path, "'");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    ZOE_THROW(Error, "safetensors file '", path, "': header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) ZOE_THROW(Error, "safetensors file '", path, "': header is not a JSON object");

  SafetensorsSummary s;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& why) {
      ZOE_THROW(Error, "safetensors file '", path, "': tensor '", name, "': ", why, " (", t.dump(), ")");
    };
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) bad("dtype is not a string");
    const std::int64_t esize = dtype_bytes(t["dtype"].get<std::string>());
    if (esize == 0) bad("unknown dtype");
    if (!t["shape"].is_array()) bad("shape is not an array");
    std::int64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!is_index(d)) bad("shape has a dimension that is not a non-negative integer");
      const auto dim = d.get<std::int64_t>();
      if (dim != 0 && numel > (std::int64_t{1} << 62) / dim) bad("shape has more than 2^62 elements");
      numel *= dim;
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !is_index(off[0]) || !is_index(off[1]) ||
        off[1].get<std::int64_t>() < off[0].get<std::int64_t>())
      bad("data_offsets is not [begin, end] with begin <= end");
    const std::int64_t bytes = off[1].get<std::int64_t>() - off[0].get<std::int64_t>();
    if (bytes != numel * esize) bad("data_offsets span " + std::to_string(bytes) + " bytes, shape and dtype need " +
                                    std::to_string(numel * esize));
    ++s.tensors;
    s.elements += numel;
    s.largest_tensor = std::max(s.largest_tensor, numel);
    s.data_bytes += bytes;
  }
  return s;
}

SafetensorsSummary read_safetensors_headers(const std::vector<std::string>& paths) {
  SafetensorsSummary total;
  for (const auto& p : paths) {
    const auto s = read_safetensors_header(p);
    total.tensors += s.tensors;
    total.elements += s.elements;
    total.largest_tensor = std::max(total.largest_tensor, s.largest_tensor);
    total.data_bytes += s.data_bytes;
  }
  return total;
}

ModelShape gpt_model(std::int64_t layers, std::int64_t hidden, std::int64_t vocab, std::int64_t seq_len) {
  if (layers < 1) ZOE_THROW_CONFIG("layers", "must be >= 1, got ", layers);
  if (hidden < 1) ZOE_THROW_CONFIG("hidden", "must be >= 1, got ", hidden);
  if (vocab < 1) ZOE_THROW_CONFIG("vocab", "must be >= 1, got ", vocab);
  if (seq_len < 1) ZOE_THROW_CONFIG("seq", "must be >= 1, got ", seq_len);
  // Exact in int64 or refused: a wrapped product would be a wrong model, not an error.
  bool overflow = false;
  auto mul = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow = overflow || __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow = overflow || __builtin_add_overflow(a, b, &r);
    return r;
  };
  const std::int64_t h = hidden;
  const std::int64_t block = add(mul(mul(12, h), h), mul(13, h));
  const std::int64_t wte = mul(vocab, h);
  ModelShape m;
  m.parameters = add(add(add(wte, mul(seq_len, h)), mul(layers, block)), mul(2, h));
  if (overflow)
    ZOE_THROW_CONFIG("parameters", "the GPT model (", layers, " layers, hidden ", hidden, ", vocabulary ", vocab,
                     ", sequence ", seq_len, ") has more than 2^63 - 1 parameters");
  m.largest_layer = std::max(wte, block);
  m.next_largest_layer = layers > 1 || wte >= block ? block : wte;  // a block (or wte)
  return m;
}

}  // namespace zoe::estimate
