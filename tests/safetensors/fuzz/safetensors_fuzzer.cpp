// libFuzzer target: zoe::io::parse_safetensors on arbitrary bytes (a whole file in memory) must
// either return a validated header or throw zoe::CorruptionError. Anything else (another
// exception, a crash, a sanitizer report, a hang past libFuzzer's timeout) is a bug. A header
// that parses must also describe a file the writer reproduces: writing its tensors (in file
// order) and metadata gives a header that parses to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "io/safetensors.hpp"
#include "zoe/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace zoe::io;
  SafetensorsHeader h;
  try {
    h = parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-input");
  } catch (const zoe::CorruptionError&) {
    return 0;
  }
  std::vector<SafetensorsTensorSpec> specs;
  for (const SafetensorsEntry& e : h.tensors) specs.push_back({e.name, e.dtype, e.shape});
  std::uint64_t data_bytes = 0;
  std::string again;
  try {
    again = safetensors_header_bytes(specs, h.metadata, &data_bytes);
  } catch (const zoe::UsageError&) {
    // Names the writer refuses but the format allows (e.g. ""): nothing more to compare.
    return 0;
  }
  if (data_bytes != h.data_bytes) std::abort();
  again.append(static_cast<std::size_t>(data_bytes), '\0');
  const SafetensorsHeader back = parse_safetensors(again, "fuzz-rewrite");  // must not throw
  if (back.tensors.size() != h.tensors.size() || back.metadata != h.metadata) std::abort();
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const SafetensorsEntry &a = h.tensors[i], &b = back.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin || a.end != b.end) std::abort();
  }
  return 0;
}
