// libFuzzer target: Config::from_json on arbitrary bytes must either return a Config or throw
// zoe::ConfigError. Anything else (another exception, a crash, a sanitizer report, a hang
// past libFuzzer's timeout) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zoe/config.hpp"
#include "zoe/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const zoe::Config c = zoe::Config::from_json(std::string(reinterpret_cast<const char*>(data), size));
    // A config that parses must also survive its own round trip.
    (void)zoe::Config::from_json(c.to_json());
  } catch (const zoe::ConfigError&) {
  }
  return 0;
}
