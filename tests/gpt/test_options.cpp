// zoe-gpt's --config (issue 20): a key the file leaves out keeps zoe-gpt's own default (not
// zoe::Config's), a key it sets wins over the default, a flag given wins over the file, and
// "auto" takes the flags' values (Hugging Face's meaning).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt/options.hpp"
#include "zoe/error.hpp"

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

// Flags out of range are refused at start, naming the flag and the value (a probe: --min-lr-ratio
// nan failed at step 2 as "optimizer.params.lr"; --seed -1 became 2^64 - 1; --steps 0 trained
// nothing with exit status 0; --world-size 100000 said only "Resource temporarily unavailable";
// CLI11's own range printed 309 digits).
TEST(GptOptions, FlagsOutOfRangeAreRefusedAtStart) {
  const auto failed = [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) != 0; };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--min-lr-ratio", "nan"}, "--min-lr-ratio: must be a finite number in \\[0, 1\\], got 'nan'"},
      {{"--min-lr-ratio", "-5"}, "--min-lr-ratio: must be a finite number in \\[0, 1\\], got '-5'"},
      {{"--lr", "inf"}, "--lr: must be a finite number in \\[0, inf\\), got 'inf'"},
      {{"--warmup", "-5"}, "--warmup: must be an integer in \\[0, 2147483647\\], got '-5'"},
      {{"--steps", "0"}, "--steps: must be an integer in \\[1, 2147483647\\], got '0'"},
      {{"--steps", "1.5"}, "--steps: must be an integer"},
      {{"--seed", "-1"}, "--seed: must be an integer >= 0, got '-1'"},
      {{"--world-size", "100000"}, "--world-size: must be an integer in \\[1, 1024\\], got '100000'"},
      {{"--threads-per-rank", "-1"}, "--threads-per-rank: must be an integer in \\[0, 1024\\]"},
      {{"--eval-batches", "0"}, "--eval-batches: must be an integer in \\[1, "},
      {{"--eval-interval", "-1"}, "--eval-interval: must be an integer in \\[0, "},
      {{"--sample-length", "-1"}, "--sample-length: must be an integer in \\[0, "},
      {{"--head-chunk", "0"}, "--head-chunk: must be an integer in \\[1, 2147483647\\], got '0'"},
      {{"--checkpoint-interval", "-1"}, "--checkpoint-interval: must be an integer in \\[0, "},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args.front() + " " + args.back());
    EXPECT_EXIT(parse(args), failed, message);
  }
  // The bounds themselves are taken.
  const TrainOptions o = parse({"--min-lr-ratio", "1", "--warmup", "0", "--steps", "1", "--seed", "0", "--world-size", "1"});
  EXPECT_EQ(o.min_lr_ratio, 1.0);
  EXPECT_EQ(o.steps, 1);
}

// --profile is off unless given (it adds timers to every engine call of the step).
// stage3_gather_16bit_weights_on_model_save false forbids --export at stage 3: refused at start,
// naming both, not after the training; without --export, or at stage 2, the key is accepted.
TEST(GptOptions, ExportIsRefusedAtStartWhenTheConfigForbidsConsolidation) {
  const std::string path = write_config("zoe_gpt_no_gather.json",
                                        R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": false}})");
  EXPECT_FALSE(parse({"--config", path}).engine.zero_optimization.gather_16bit_weights_on_model_save);
  try {
    parse({"--config", path, "--export", "/tmp/zoe_gpt_never.safetensors"});
    ADD_FAILURE() << "no exception";
  } catch (const zoe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--export /tmp/zoe_gpt_never.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stage3_gather_16bit_weights_on_model_save is false"), std::string::npos) << msg;
  }
  EXPECT_EQ(parse({"--config", path, "--zero-stage", "2", "--export", "/tmp/x.safetensors"}).export_path,
            "/tmp/x.safetensors");
  std::filesystem::remove(path);
}

TEST(GptOptions, ProfileIsOffUnlessAsked) {
  EXPECT_FALSE(parse({}).profile);
  EXPECT_TRUE(parse({"--profile"}).profile);
}

// --precision sets bf16.enabled / fp16.enabled (default fp32); without the flag a file's sections
// apply, with their loss-scaler keys; the flag wins over the file; "auto" takes the flag's value.
TEST(GptOptions, PrecisionFromTheFlagOrTheFile) {
  EXPECT_EQ(parse({}).engine.compute_dtype(), zoe::DType::f32);
  EXPECT_EQ(parse({"--precision", "bf16"}).engine.compute_dtype(), zoe::DType::bf16);
  EXPECT_EQ(parse({"--precision", "fp16"}).engine.compute_dtype(), zoe::DType::f16);
  const std::string fp16 = write_config("zoe_gpt_fp16.json",
                                        R"({"fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 1}})");
  const TrainOptions f = parse({"--config", fp16});
  EXPECT_EQ(f.engine.compute_dtype(), zoe::DType::f16);
  EXPECT_EQ(f.engine.fp16.initial_scale_power, 12);
  EXPECT_EQ(f.engine.fp16.hysteresis, 1);
  EXPECT_EQ(f.engine.optimizer.lr, 3e-3);  // zoe-gpt's default kept
  EXPECT_EQ(parse({"--config", fp16, "--precision", "bf16"}).engine.compute_dtype(), zoe::DType::bf16);
  EXPECT_EQ(parse({"--config", fp16, "--precision", "fp32"}).engine.compute_dtype(), zoe::DType::f32);
  const std::string bf16 = write_config("zoe_gpt_bf16.json", R"({"bf16": {"enabled": true}})");
  EXPECT_EQ(parse({"--config", bf16}).engine.compute_dtype(), zoe::DType::bf16);
  const std::string automatic = write_config("zoe_gpt_auto.json", R"({"bf16": {"enabled": "auto"}})");
  EXPECT_EQ(parse({"--config", automatic}).engine.compute_dtype(), zoe::DType::f32);
  EXPECT_EQ(parse({"--config", automatic, "--precision", "bf16"}).engine.compute_dtype(), zoe::DType::bf16);
  for (const auto& p : {fp16, bf16, automatic}) std::filesystem::remove(p);
}

}  // namespace
}  // namespace gpt
