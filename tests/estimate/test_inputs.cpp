// Inputs of zoe-estimate: counts, byte sizes, safetensors headers, GPT descriptions.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "src/config/estimate.hpp"
#include "src/config/model_size.hpp"
#include "src/config/quantity.hpp"
#include "zoe/config.hpp"
#include "zoe/error.hpp"

namespace {
using namespace zoe::estimate;

TEST(EstimateInputs, ParameterCounts) {
  EXPECT_EQ(parse_count("7.5e9", "p"), 7'500'000'000);
  EXPECT_EQ(parse_count("7.5B", "p"), 7'500'000'000);
  EXPECT_EQ(parse_count("175B", "p"), 175'000'000'000);
  EXPECT_EQ(parse_count("175b", "p"), 175'000'000'000);
  EXPECT_EQ(parse_count("1.1B", "p"), 1'100'000'000);  // 1.1 * 1e9 is not exact in binary: rounded
  EXPECT_EQ(parse_count("350M", "p"), 350'000'000);
  EXPECT_EQ(parse_count("1T", "p"), 1'000'000'000'000);
  EXPECT_EQ(parse_count("125k", "p"), 125'000);
  EXPECT_EQ(parse_count("124439808", "p"), 124'439'808);
  for (const char* bad : {"", "B", "7.5X", "-3B", "0", "nan", "1e30"}) {
    SCOPED_TRACE(bad);
    try {
      parse_count(bad, "--params");
      ADD_FAILURE() << "no exception";
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(e.key(), "--params");
    }
  }
}

TEST(EstimateInputs, ByteSizes) {
  EXPECT_EQ(parse_bytes("80GB", "m"), 80'000'000'000);
  EXPECT_EQ(parse_bytes("80 GiB", "m"), 80LL << 30);
  EXPECT_EQ(parse_bytes("1.5TB", "m"), 1'500'000'000'000);
  EXPECT_EQ(parse_bytes("2TiB", "m"), 2LL << 40);
  EXPECT_EQ(parse_bytes("512mib", "m"), 512LL << 20);
  EXPECT_EQ(parse_bytes("4K", "m"), 4000);
  EXPECT_EQ(parse_bytes("4096", "m"), 4096);
  EXPECT_EQ(parse_bytes("0", "m"), 0);
  EXPECT_THROW(parse_bytes("80GX", "m"), zoe::ConfigError);
  EXPECT_THROW(parse_bytes("-1GB", "m"), zoe::ConfigError);
  EXPECT_THROW(parse_bytes("GB", "m"), zoe::ConfigError);
}

TEST(EstimateInputs, GptDescriptionsMatchPublishedCounts) {
  // GPT-2 small and XL as Hugging Face's transformers counts them (tied output layer).
  const ModelShape small = gpt_model(12, 768, 50257, 1024);
  EXPECT_EQ(small.parameters, 124'439'808);
  EXPECT_EQ(small.largest_layer, 50257 * 768);  // the embedding
  const ModelShape xl = gpt_model(48, 1600, 50257, 1024);
  EXPECT_EQ(xl.parameters, 1'557'611'200);
  EXPECT_THROW(gpt_model(0, 768, 50257, 1024), zoe::ConfigError);
  // Products past int64 are refused, not wrapped (a probe: hidden 2^31 gave 36.5B parameters).
  try {
    gpt_model(1, 2147483648, 1, 1);
    ADD_FAILURE() << "no ConfigError";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "parameters");
    EXPECT_NE(std::string(e.what()).find("more than 2^63 - 1 parameters"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt_model(1'000'000, 1'000'000, 1'000'000, 1'000'000), zoe::ConfigError);
}

TEST(EstimateInputs, ModelsPastTheExactRangeAreRefused) {
  // 1e15 parameters is the largest the byte counts hold exactly; 2^62 (what --params takes)
  // times 16 bytes would wrap.
  ModelShape m;
  m.parameters = 1'000'000'000'000'000;
  EXPECT_NO_THROW(estimate_rank(m, 1024, zoe::Config{}));
  m.parameters = std::int64_t{1} << 62;
  try {
    estimate_rank(m, 1, zoe::Config{});
    ADD_FAILURE() << "no ConfigError";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "parameters");
    EXPECT_NE(std::string(e.what()).find("must be in [1, 1e15], got 4611686018427387904"), std::string::npos) << e.what();
  }
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zoe_safetensors_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A file as the format lays it out: u64 little-endian header length, header, data bytes.
  std::string write(const std::string& name, const std::string& header, std::size_t data_bytes,
                    std::uint64_t claimed_length = UINT64_MAX) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    const std::uint64_t n = claimed_length == UINT64_MAX ? header.size() : claimed_length;
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << std::string(data_bytes, '\0');
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(Safetensors, SumsElementsOfEveryTensor) {
  // wte 10x4 bf16 (80 bytes), ln 4 f32 (16 bytes), scalar f64 (8 bytes), empty 0x3 f16.
  const std::string header = R"({"__metadata__": {"format": "pt"},
    "wte": {"dtype": "BF16", "shape": [10, 4], "data_offsets": [0, 80]},
    "ln": {"dtype": "F32", "shape": [4], "data_offsets": [80, 96]},
    "step": {"dtype": "F64", "shape": [], "data_offsets": [96, 104]},
    "none": {"dtype": "F16", "shape": [0, 3], "data_offsets": [104, 104]}})";
  const auto s = read_safetensors_header(write("m.safetensors", header, 104));
  EXPECT_EQ(s.tensors, 4);
  EXPECT_EQ(s.elements, 40 + 4 + 1 + 0);
  EXPECT_EQ(s.largest_tensor, 40);
  EXPECT_EQ(s.data_bytes, 104);
  const std::string second = R"({"lm_head": {"dtype": "F16", "shape": [50, 4], "data_offsets": [0, 400]}})";
  const auto both = read_safetensors_headers({write("a.safetensors", header, 104), write("b.safetensors", second, 400)});
  EXPECT_EQ(both.elements, 245);
  EXPECT_EQ(both.largest_tensor, 200);
  EXPECT_EQ(both.tensors, 5);
}

TEST_F(Safetensors, MalformedFilesNameTheFileAndTheProblem) {
  struct Bad { std::string header; std::uint64_t claimed; const char* expect; };
  const Bad cases[] = {
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", UINT64_MAX, "span 4 bytes, shape and dtype need 8"},
      {R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", UINT64_MAX, "unknown dtype"},
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", UINT64_MAX, "non-negative"},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", UINT64_MAX, "needs dtype, shape and data_offsets"},
      {R"({"w": )", UINT64_MAX, "not valid JSON"},
      {R"({})", 1000, "exceeds the file"},
      {R"({})", 200'000'000, "100 MB"},
  };
  int i = 0;
  for (const auto& b : cases) {
    const std::string name = "bad" + std::to_string(i++) + ".safetensors";
    SCOPED_TRACE(b.header);
    try {
      read_safetensors_header(write(name, b.header, 8, b.claimed));
      ADD_FAILURE() << "no exception";
    } catch (const zoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(b.expect), std::string::npos) << e.what();
    }
  }
  const std::string tiny = (dir_ / "tiny.safetensors").string();
  std::ofstream(tiny) << "abc";
  EXPECT_THROW(read_safetensors_header(tiny), zoe::Error);
  try {
    read_safetensors_header((dir_ / "missing.safetensors").string());
    ADD_FAILURE() << "no exception";
  } catch (const zoe::SystemError& e) {
    EXPECT_EQ(e.error_code(), ENOENT);
  }
}
}  // namespace
