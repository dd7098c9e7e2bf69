// libFuzzer target: zoe::ckpt::parse_manifest on arbitrary bytes must either return a
// Manifest or throw zoe::CorruptionError. Anything else (another exception, a crash, a
// sanitizer report, a hang past libFuzzer's timeout) is a bug. Inputs whose first byte is odd
// are also tried with their checksum re-stamped (when they are JSON with a "manifest" object),
// so mutations reach the field checks behind the checksum; a manifest that parses must survive
// its own round trip (serialize, parse) unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "io/crc32c.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "zoe/error.hpp"

namespace {
void parse(const std::string& text) {
  try {
    const zoe::ckpt::Manifest m = zoe::ckpt::parse_manifest(text, "fuzz.json");
    const std::string again = zoe::ckpt::serialize(m);
    const zoe::ckpt::Manifest n = zoe::ckpt::parse_manifest(again, "fuzz-again.json");
    if (zoe::ckpt::serialize(n) != again) __builtin_trap();
  } catch (const zoe::CorruptionError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parse(text);
  if (size == 0 || (data[0] & 1) == 0) return 0;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("manifest") || !j["manifest"].is_object()) return 0;
  const std::string inner = j["manifest"].dump();
  j["crc32c"] = zoe::ckpt::crc_hex(zoe::io::crc32c(inner.data(), inner.size()));
  parse(j.dump());
  return 0;
}
