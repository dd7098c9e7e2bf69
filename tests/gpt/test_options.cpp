// zoe-gpt's --config (issue 20): a key the file leaves out keeps zoe-gpt's own default (not
// zoe::Config's), a key it sets wins over the default, a flag given wins over the file, and
// "auto" takes the flags' values (Hugging Face's meaning).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "examples/gpt/options.hpp"

namespace gpt {
namespace {

TrainOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "zoe-gpt");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

std::string write_config(const std::string& name, const std::string& json) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << json;
  return path;
}

TEST(GptOptions, AConfigWithOneKeyChangesOnlyThatKey) {
  const zoe::Config plain = parse({}).engine;
  const std::string path = write_config("zoe_gpt_one_key.json", R"({"zoe": {"comm_timeout_s": 20}})");
  const TrainOptions o = parse({"--config", path});
  zoe::Config want = plain;
  want.zoe.comm_timeout_s = 20;
  EXPECT_EQ(o.engine, want) << o.engine.to_json();
  EXPECT_EQ(o.engine.optimizer.lr, 3e-3);  // zoe-gpt's, not zoe::Config's 1e-3
  EXPECT_EQ(o.engine.optimizer.betas[1], 0.95);
  EXPECT_EQ(o.engine.optimizer.weight_decay, 0.1);
  EXPECT_EQ(o.engine.gradient_clipping, 1.0);
  EXPECT_EQ(o.engine.zero_optimization.stage, 3);
  EXPECT_EQ(o.engine.zero_optimization.offload_optimizer.device, zoe::OffloadDevice::nvme);
  std::filesystem::remove(path);
}

TEST(GptOptions, TheFileWinsOverDefaultsAndFlagsWinOverTheFile) {
  const std::string path = write_config("zoe_gpt_keys.json", R"({"optimizer": {"params": {"lr": 5e-4,
      "betas": [0.9, 0.999]}}, "zero_optimization": {"stage": 2}, "gradient_clipping": "auto"})");
  const TrainOptions o = parse({"--config", path, "--zero-stage", "1", "--grad-clip", "0.5"});
  EXPECT_EQ(o.engine.optimizer.lr, 5e-4);
  EXPECT_EQ(o.lr, 5e-4);
  EXPECT_EQ(o.engine.optimizer.betas[1], 0.999);
  EXPECT_EQ(o.engine.zero_optimization.stage, 1);
  EXPECT_EQ(o.engine.gradient_clipping, 0.5);
  EXPECT_EQ(o.engine.optimizer.weight_decay, 0.1);  // not in the file: zoe-gpt's
  std::filesystem::remove(path);
}

// --profile is off unless given (it adds timers to every engine call of the step).
TEST(GptOptions, ProfileIsOffUnlessAsked) {
  EXPECT_FALSE(parse({}).profile);
  EXPECT_TRUE(parse({"--profile"}).profile);
}

}  // namespace
}  // namespace gpt
