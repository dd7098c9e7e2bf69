// Hostile configuration input (issue: "never crash on a config"): every case is a clean
// ConfigError naming the key, with the offending value quoted as a short excerpt.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "zoe/config.hpp"
#include "zoe/engine.hpp"
#include "zoe/error.hpp"

namespace {
using zoe::Config;
namespace fs = std::filesystem;

// The ConfigError of parsing `json`; fails the test when none is thrown.
zoe::ConfigError error_of(const std::string& json) {
  try {
    Config::from_json(json);
  } catch (const zoe::ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError for: " << json.substr(0, 200);
  return zoe::ConfigError("", "", "", 0);
}

void expect(const std::string& json, const std::string& key, const std::string& text) {
  const zoe::ConfigError e = error_of(json);
  EXPECT_EQ(e.key(), key) << e.what();
  EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << "'" << text << "' not in: " << e.what();
  EXPECT_LT(std::string(e.what()).size(), 600u) << "the message must quote an excerpt only";
}

TEST(ConfigHostile, DeepNestingIsRefusedWithoutRecursion) {
  const std::string deep = "{\"zero_optimization\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const zoe::ConfigError e = error_of(deep);
  EXPECT_EQ(e.key().rfind("zero_optimization[0]", 0), 0u) << e.key();
  EXPECT_NE(std::string(e.what()).find("nested deeper than 64 levels"), std::string::npos) << e.what();
  // 64 levels is the limit, not less: a real file nests 4.
  std::string ok = "{\"zoe\": {\"x\": " + std::string(62, '[') + std::string(62, ']') + "}}";
  expect(ok, "zoe.x", "unknown key");
}

TEST(ConfigHostile, NumberOverflowNamesTheKey) {
  expect(R"({"optimizer": {"params": {"lr": 1e999}}})", "optimizer.params.lr", "outside the range of a double");
  expect(R"({"optimizer": {"params": {"betas": [0.9, -1e400]}}})", "optimizer.params.betas[1]",
         "outside the range of a double");
}

TEST(ConfigHostile, DuplicateKeysAreRefused) {
  expect(R"({"zero_optimization": {"stage": 0, "stage": 3}})", "zero_optimization.stage", "duplicate key");
  expect(R"({"fp16": {}, "fp16": {"enabled": true}})", "fp16", "duplicate key");
  // The same key in two different objects is fine.
  EXPECT_NO_THROW(Config::from_json(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "none"}, "stage": 3}})"));
}

TEST(ConfigHostile, HugeValuesAreQuotedAsAnExcerpt) {
  const std::string big(8u << 20, 'a');  // the probe's was 50 MB; 8 MB keeps the test quick
  const zoe::ConfigError e = error_of(R"({"zero_optimization": {"not_a_key": ")" + big + "\"}}");
  EXPECT_EQ(e.key(), "zero_optimization.not_a_key");
  const std::string what = e.what();
  EXPECT_LT(what.size(), 600u);
  EXPECT_NE(what.find("(8388608 characters)"), std::string::npos) << what;
  // Cut once and counted once (a probe: a long enum value read "AAAA... (66 characters)..."
  // (10000000 characters)).
  const zoe::ConfigError t = error_of(R"({"optimizer": {"type": ")" + std::string(1u << 20, 'A') + "\"}}");
  EXPECT_EQ(t.key(), "optimizer.type");
  EXPECT_NE(std::string(t.what()).find("\"" + std::string(64, 'A') + "...\" (1048576 characters) is not one of"),
            std::string::npos) << t.what();
  EXPECT_EQ(std::string(t.what()).find("(66 characters)"), std::string::npos) << t.what();
  // A huge key name is cut too.
  const zoe::ConfigError k = error_of("{\"" + std::string(1u << 20, 'k') + "\": 1}");
  EXPECT_LT(std::string(k.what()).size(), 600u);
  EXPECT_NE(std::string(k.what()).find("unknown key"), std::string::npos) << k.what();
  // A wrong type of a huge value.
  expect("{\"gradient_clipping\": \"" + big + "\"}", "gradient_clipping", "expected a number");
}

TEST(ConfigHostile, NulInAStringIsRefused) {
  expect(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/zoe\u0000/x"}}})",
         "zero_optimization.offload_optimizer.nvme_path", "NUL character");
}

TEST(ConfigHostile, TimeoutsThatOverflowTheClockAreRefused) {
  expect(R"({"zoe": {"comm_timeout_s": 1e10}})", "zoe.comm_timeout_s", "at most 2.592e+06 seconds");
  expect(R"({"zoe": {"comm_timeout_s": 1e300}})", "zoe.comm_timeout_s", "got 1e+300");
  EXPECT_NO_THROW(Config::from_json(R"({"zoe": {"comm_timeout_s": 86400}})"));
  EXPECT_THROW(zoe::make_local_ranks(1, 1e10), zoe::UsageError);
}

TEST(ConfigHostile, TheConfigCheckAgreesWithTheEngineOnAioThreads) {
  expect(R"({"aio": {"intra_op_parallelism": 100000}})", "aio.intra_op_parallelism", "[1, 64]");
  EXPECT_NO_THROW(Config::from_json(R"({"aio": {"intra_op_parallelism": 64}})"));
}

// Values that passed the check but crashed the engine or that the engine refused (a probe:
// SIGSEGV for offload_param.buffer_size 2^63-1 and zoe.optimizer_threads 2^31-1, std::bad_alloc
// for 1e8 threads): the check refuses them, naming the key.
TEST(ConfigHostile, TheConfigCheckAgreesWithTheEngineOnBufferSizesAndThreads) {
  const std::string nvme3 = R"("stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp")";
  expect("{\"zero_optimization\": {" + nvme3 + R"(, "buffer_size": 9223372036854775807}}})",
         "zero_optimization.offload_param.buffer_size", "[1, 1099511627776], got 9223372036854775807");
  expect("{\"zero_optimization\": {" + nvme3 + R"(, "buffer_count": 1}}})", "zero_optimization.offload_param.buffer_count",
         "must be >= 2 when device is \"nvme\"");
  expect(R"({"zero_optimization": {"offload_param": {"buffer_count": 100000}}})",
         "zero_optimization.offload_param.buffer_count", "[1, 1024]");
  expect(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 1}}})",
         "zero_optimization.offload_optimizer.buffer_count", "must be >= 2 when device is \"nvme\"");
  expect(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 1025}}})",
         "zero_optimization.offload_optimizer.buffer_count", "[1, 1024]");
  expect(R"({"zoe": {"optimizer_threads": 2147483647}})", "zoe.optimizer_threads", "[0, 1024]");
  expect(R"({"zoe": {"optimizer_threads": 100000000}})", "zoe.optimizer_threads", "got 100000000");
  expect(R"({"aio": {"block_size": 2147483648}})", "aio.block_size", "up to 1 GiB");
  // The bounds themselves are taken; one buffer is fine on the cpu tier.
  EXPECT_NO_THROW(Config::from_json("{\"zero_optimization\": {" + nvme3 +
                                    R"(, "buffer_size": 1099511627776, "buffer_count": 1024}}})"));
  EXPECT_NO_THROW(Config::from_json(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "buffer_count": 1}},
      "zoe": {"optimizer_threads": 1024}, "aio": {"block_size": 1073741824}})"));
}

// A config path that names no regular file: a FIFO would hang the reader, /dev/zero would grow
// its memory without bound (the probe: zoe-estimate aborted with std::bad_alloc).
TEST(ConfigHostile, AConfigPathThatIsNotARegularFileIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("zoe-config-fifo-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "config.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir.string()}) {
    try {
      Config::from_json_file(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const zoe::ConfigError& e) {
      ADD_FAILURE() << "a ConfigError, not the file's error: " << e.what();
    } catch (const zoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + path + "' is not a regular file (it is a"), std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(ConfigHostile, SyntaxErrorsSayWhereWithAShortExcerpt) {
  const zoe::ConfigError e = error_of("{\"stage\": \"" + std::string(1u << 20, 'x'));
  EXPECT_EQ(e.key(), "");
  EXPECT_NE(std::string(e.what()).find("not valid JSON at byte"), std::string::npos) << e.what();
  EXPECT_LT(std::string(e.what()).size(), 600u);
}

// Every file of the corpus (the fuzzer's seeds too) is refused cleanly.
TEST(ConfigHostile, EveryCorpusFileIsAConfigError) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(ZOE_CONFIG_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    SCOPED_TRACE(entry.path().filename().string());
    EXPECT_THROW(Config::from_json(text.str()), zoe::ConfigError);
    try {
      Config::from_json_file(entry.path().string());
      ADD_FAILURE() << "no ConfigError";
    } catch (const zoe::ConfigError& e) {
      // The key is said once, the file once.
      const std::string what = e.what(), prefix = "config '" + e.key() + "': ";
      EXPECT_EQ(what.rfind(prefix, 0), 0u) << what;
      EXPECT_EQ(what.find(prefix, 1), std::string::npos) << "prefix repeated: " << what;
      EXPECT_NE(what.find("(in '" + entry.path().string() + "')"), std::string::npos) << what;
    }
    ++files;
  }
  EXPECT_GE(files, 9);
}
}  // namespace
