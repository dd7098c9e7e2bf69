// Config errors: each names the JSON path and the offending value; unknown keys get a
// "did you mean"; DeepSpeed keys zoe lacks are refused as unsupported; cross-field checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "zoe/config.hpp"
#include "zoe/error.hpp"

namespace {
using zoe::Config;

struct Case {
  const char* json;
  const char* path;                    // expected ConfigError::key()
  std::vector<const char*> contains;   // substrings of what()
};

void expect_error(const Case& c) {
  SCOPED_TRACE(c.json);
  try {
    Config::from_json(c.json);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), c.path) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("'") + c.path + "'"), std::string::npos) << what;
    for (const char* s : c.contains) EXPECT_NE(what.find(s), std::string::npos) << "'" << s << "' not in: " << what;
  }
}

TEST(ConfigErrors, WrongTypesNameThePathAndValue) {
  const std::vector<Case> cases = {
      {R"({"train_micro_batch_size_per_gpu": "4"})", "train_micro_batch_size_per_gpu", {"expected an integer", "\"4\""}},
      {R"({"gradient_accumulation_steps": 1.5})", "gradient_accumulation_steps", {"expected an integer", "1.5"}},
      {R"({"gradient_clipping": true})", "gradient_clipping", {"expected a number", "true"}},
      {R"({"fp16": {"enabled": 1}})", "fp16.enabled", {"expected true or false", "1"}},
      {R"({"fp16": []})", "fp16", {"expected an object", "[]"}},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "optimizer.params.betas", {"two numbers", "[0.9]"}},
      {R"({"zero_optimization": {"offload_optimizer": {"nvme_path": 5}}})",
       "zero_optimization.offload_optimizer.nvme_path", {"expected a string", "5"}},
      {R"({"zero_optimization": {"stage": "auto"}})", "zero_optimization.stage", {"\"auto\" is not accepted"}},
      {R"({"zero_optimization": {"reduce_bucket_size": 1e30}})", "zero_optimization.reduce_bucket_size",
       {"out of range", "1e+30"}},
      {R"({"aio": {"queue_depth": 3000000000}})", "aio.queue_depth", {"out of range", "3000000000"}},
      {R"({"zoe": {"overlap_step": "yes"}})", "zoe.overlap_step", {"expected true or false", "\"yes\""}},
      {R"([1, 2])", "", {"must be a JSON object"}},
      {R"({"stage": )", "", {"not valid JSON"}},
  };
  for (const auto& c : cases) expect_error(c);
}

// A null says so once ("got null", not "got null null", as every key's message read before).
TEST(ConfigErrors, NullIsNamedOnce) {
  const std::vector<Case> cases = {
      {R"({"zoe": {"optimizer_threads": null}})", "zoe.optimizer_threads", {"expected an integer, got null"}},
      {R"({"zoe": {"small_module_threshold": null}})", "zoe.small_module_threshold", {"expected an integer, got null"}},
      {R"({"gradient_clipping": null})", "gradient_clipping", {"expected a number, got null"}},
      {R"({"fp16": {"enabled": null}})", "fp16.enabled", {"expected true or false, got null"}},
      {R"({"zero_optimization": {"offload_optimizer": {"nvme_path": null}}})",
       "zero_optimization.offload_optimizer.nvme_path", {"expected a string, got null"}},
  };
  for (const auto& c : cases) {
    expect_error(c);
    try {
      Config::from_json(c.json);
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("null null"), std::string::npos) << e.what();
    }
  }
}

TEST(ConfigErrors, OutOfRangeValuesNameThePathAndValue) {
  const std::vector<Case> cases = {
      {R"({"train_micro_batch_size_per_gpu": 0})", "train_micro_batch_size_per_gpu", {">= 1", "got 0"}},
      {R"({"gradient_accumulation_steps": -2})", "gradient_accumulation_steps", {"got -2"}},
      {R"({"gradient_clipping": -1})", "gradient_clipping", {"got -1"}},
      {R"({"fp16": {"initial_scale_power": 65}})", "fp16.initial_scale_power", {"[0, 64]", "got 65"}},
      {R"({"fp16": {"loss_scale_window": 0}})", "fp16.loss_scale_window", {"got 0"}},
      {R"({"fp16": {"hysteresis": 0}})", "fp16.hysteresis", {"got 0"}},
      {R"({"fp16": {"min_loss_scale": 0}})", "fp16.min_loss_scale", {"> 0", "got 0"}},
      {R"({"fp16": {"loss_scale": -4}})", "fp16.loss_scale", {"got -4"}},
      {R"({"optimizer": {"params": {"lr": -0.1}}})", "optimizer.params.lr", {"got -0.1"}},
      {R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})", "optimizer.params.betas", {"[0, 1)", "1]"}},
      {R"({"optimizer": {"params": {"eps": -1e-8}}})", "optimizer.params.eps", {"got -1e-08"}},
      {R"({"optimizer": {"params": {"weight_decay": -0.5}}})", "optimizer.params.weight_decay", {"got -0.5"}},
      {R"({"optimizer": {"type": "SGD"}})", "optimizer.type", {"\"SGD\"", "Adam|AdamW"}},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage", {"[0, 3]", "got 4"}},
      {R"({"zero_optimization": {"reduce_bucket_size": -1}})", "zero_optimization.reduce_bucket_size", {"got -1"}},
      {R"({"zero_optimization": {"allgather_bucket_size": 0}})", "zero_optimization.allgather_bucket_size", {"got 0"}},
      {R"({"zero_optimization": {"contiguous_gradients": false}})", "zero_optimization.contiguous_gradients",
       {"not supported by zoe with value false", "one contiguous flat buffer"}},
      {R"({"zero_optimization": {"allgather_bucket_size": -1}})", "zero_optimization.allgather_bucket_size", {"got -1"}},
      {R"({"zero_optimization": {"sub_group_size": 0}})", "zero_optimization.sub_group_size", {"got 0"}},
      {R"({"zero_optimization": {"stage3_prefetch_bucket_size": -1}})", "zero_optimization.stage3_prefetch_bucket_size", {"got -1"}},
      {R"({"zero_optimization": {"stage3_param_persistence_threshold": -1}})",
       "zero_optimization.stage3_param_persistence_threshold", {"got -1"}},
      {R"({"zoe": {"small_module_threshold": -1}})", "zoe.small_module_threshold", {">= 0", "got -1"}},
      {R"({"zero_optimization": {"stage3_max_live_parameters": -1}})", "zero_optimization.stage3_max_live_parameters", {"got -1"}},
      {R"({"zero_optimization": {"stage3_max_reuse_distance": -1}})", "zero_optimization.stage3_max_reuse_distance", {"got -1"}},
      {R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})", "zero_optimization.offload_optimizer.device",
       {"\"gpu\"", "none|cpu|nvme"}},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"buffer_count": 0}}})",
       "zero_optimization.offload_optimizer.buffer_count", {"[1, 1024]", "got 0"}},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0}}})",
       "zero_optimization.offload_optimizer.ratio", {"(0, 1]", "got 0"}},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
       "zero_optimization.offload_optimizer.ratio", {"got 1.5"}},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ""}}})",
       "zero_optimization.offload_optimizer.nvme_path", {"\"nvme\""}},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"buffer_count": 0}}})",
       "zero_optimization.offload_param.buffer_count", {"got 0"}},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"buffer_size": 0}}})",
       "zero_optimization.offload_param.buffer_size", {"got 0"}},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"max_in_cpu": -5}}})",
       "zero_optimization.offload_param.max_in_cpu", {"got -5"}},
      {R"({"aio": {"block_size": 1000}})", "aio.block_size", {"4096", "got 1000"}},
      {R"({"aio": {"queue_depth": 0}})", "aio.queue_depth", {"got 0"}},
      {R"({"aio": {"intra_op_parallelism": 0}})", "aio.intra_op_parallelism", {"got 0"}},
      {R"({"zoe": {"comm_timeout_s": 0}})", "zoe.comm_timeout_s", {"> 0", "got 0"}},
      {R"({"zoe": {"optimizer_threads": -1}})", "zoe.optimizer_threads", {"got -1"}},
      {R"({"zoe": {"pinned_budget_bytes": -1}})", "zoe.pinned_budget_bytes", {"got -1"}},
      {R"({"train_batch_size": -8})", "train_batch_size", {"got -8"}},
  };
  for (const auto& c : cases) expect_error(c);
}

TEST(ConfigErrors, CrossFieldChecks) {
  const std::vector<Case> cases = {
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "bf16.enabled", {"fp16.enabled"}},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       "zero_optimization.offload_param.device", {"\"cpu\"", "stage 3", "got stage 2"}},
      {R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})",
       "zero_optimization.offload_optimizer.device", {"\"nvme\"", "stage >= 1", "got stage 0"}},
      {R"({"zero_optimization": {"stage": 1}, "zoe": {"delayed_update": true}})", "zoe.delayed_update",
       {"offload_optimizer.device", "\"none\""}},
  };
  for (const auto& c : cases) expect_error(c);
}

TEST(ConfigErrors, ValidateOnTheStructNamesTheField) {
  Config c;
  c.zero_optimization.stage = -1;
  try {
    c.validate();
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.stage");
    EXPECT_NE(std::string(e.what()).find("got -1"), std::string::npos);
  }
}

TEST(ConfigErrors, UnknownKeysSuggestTheNearestKnownOne) {
  const std::vector<Case> cases = {
      {R"({"zero_optimization": {"stgae": 3}})", "zero_optimization.stgae", {"unknown key", "3", "did you mean 'stage'?"}},
      {R"({"zero_optimization": {"reduce_bucket_sise": 5e8}})", "zero_optimization.reduce_bucket_sise",
       {"did you mean 'reduce_bucket_size'?"}},
      {R"({"zero_optimization": {"prefetch_bucket_size": 5e7}})", "zero_optimization.prefetch_bucket_size",
       {"did you mean 'stage3_prefetch_bucket_size'?"}},
      {R"({"zero_optimization": {"offload_optimiser": {"device": "cpu"}}})", "zero_optimization.offload_optimiser",
       {"did you mean 'offload_optimizer'?"}},
      {R"({"train_micro_batch_size": 4})", "train_micro_batch_size", {"did you mean 'train_micro_batch_size_per_gpu'?"}},
      {R"({"fp16": {"enable": true}})", "fp16.enable", {"true", "did you mean 'enabled'?"}},
      {R"({"optimizer": {"params": {"beta": [0.9, 0.99]}}})", "optimizer.params.beta", {"did you mean 'betas'?"}},
      // The right key in the wrong section.
      {R"({"stage": 2})", "stage", {"did you mean 'zero_optimization.stage'?"}},
      {R"({"zero_optimization": {"lr": 0.1}})", "zero_optimization.lr", {"did you mean 'optimizer.params.lr'?"}},
      // Nothing near: no suggestion, but still the path and value.
      {R"({"zoe": {"quux": [1]}})", "zoe.quux", {"unknown key", "[1]"}},
      // Near misses of enumeration values.
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvm"}}})",
       "zero_optimization.offload_optimizer.device", {"\"nvm\"", "did you mean 'nvme'?"}},
      {R"({"optimizer": {"type": "AdamX"}})", "optimizer.type", {"did you mean 'Adam'?"}},
  };
  for (const auto& c : cases) expect_error(c);
  try {
    Config::from_json(R"({"zoe": {"quux": 1}})");
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(ConfigErrors, DeepSpeedKeysZoeLacksAreRefusedAsUnsupported) {
  const std::vector<Case> cases = {
      {R"({"activation_checkpointing": {"partition_activations": true}})", "activation_checkpointing",
       {"not supported", "partition_activations", "activations belong to the trainer"}},
      {R"({"bfloat16": {"enabled": true}})", "bfloat16", {"not supported", "bf16"}},
      {R"({"zero_optimization": {"cpu_offload_params": true}})", "zero_optimization.cpu_offload_params",
       {"not supported", "offload_param.device"}},
      {R"({"aio": {"use_gds": false}})", "aio.use_gds", {"not supported"}},
      // Accepted only with zoe's fixed behaviour.
      {R"({"zero_optimization": {"reduce_scatter": false}})", "zero_optimization.reduce_scatter",
       {"supports only true", "got false"}},
      {R"({"optimizer": {"params": {"amsgrad": true}}})", "optimizer.params.amsgrad", {"supports only false"}},
  };
  for (const auto& c : cases) expect_error(c);
}

// Issue 20: a file's problems come in one error, each with its path and reason, in reading
// order (then unknown keys, then the checks across fields).
TEST(ConfigErrors, EveryProblemOfAFileIsReportedAtOnce) {
  try {
    Config::from_json(R"({"zero_optimization": {"stgae": 3, "stage": 5, "reduce_bucket_size": "big"},
                          "optimizer": {"params": {"lr": -1, "betas": [0.9]}}, "amp": {}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    const std::vector<std::string> keys = {"optimizer.params.betas", "zero_optimization.reduce_bucket_size", "amp",
                                           "zero_optimization.stgae", "optimizer.params.lr",
                                           "zero_optimization.stage"};
    ASSERT_EQ(e.problems().size(), keys.size()) << e.what();
    for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(e.problems()[i].key, keys[i]) << e.what();
    EXPECT_EQ(e.key(), "optimizer.params.betas");
    EXPECT_EQ(e.reason(), "expected an array of two numbers, got [0.9]");
    EXPECT_EQ(e.problems()[3].reason, "unknown key (value 3); did you mean 'stage'?");
    EXPECT_EQ(e.problems()[4].reason, "must be a finite number >= 0, got -1");
    EXPECT_EQ(e.problems()[5].reason, "must be in [0, 3], got 5");
    EXPECT_EQ(e.message(),
              "config 'optimizer.params.betas': expected an array of two numbers, got [0.9]\n"
              "config 'zero_optimization.reduce_bucket_size': expected an integer, got a string \"big\"\n"
              "config 'amp': DeepSpeed key not supported by zoe (value {}): use fp16 or bf16\n"
              "config 'zero_optimization.stgae': unknown key (value 3); did you mean 'stage'?\n"
              "config 'optimizer.params.lr': must be a finite number >= 0, got -1\n"
              "config 'zero_optimization.stage': must be in [0, 3], got 5\n"
              "(6 problems)");
  }
}

TEST(ConfigErrors, OneProblemReadsExactlyAsBefore) {
  try {
    Config::from_json(R"({"zero_optimization": {"stgae": 3}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.message(), "config 'zero_optimization.stgae': unknown key (value 3); did you mean 'stage'?");
  }
}

TEST(ConfigErrors, ChecksAcrossFieldsAreAllReported) {
  try {
    Config::from_json(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
                          "fp16": {"enabled": true, "hysteresis": 0}, "bf16": {"enabled": true}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 3u) << e.what();
    EXPECT_EQ(e.problems()[0].key, "fp16.hysteresis");
    EXPECT_EQ(e.problems()[1].key, "bf16.enabled");
    EXPECT_EQ(e.problems()[2].key, "zero_optimization.offload_param.device");
    EXPECT_NE(e.problems()[2].reason.find("got stage 2"), std::string::npos) << e.what();
  }
  Config c;
  c.zero_optimization.stage = -1;
  c.optimizer.lr = -1;
  try {
    c.validate();
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 2u) << e.what();
    EXPECT_EQ(e.problems()[0].key, "optimizer.params.lr");
    EXPECT_EQ(e.problems()[1].key, "zero_optimization.stage");
  }
}

// A check that would read a key which failed to read is not reported: it would blame the
// file for zoe's default ("got stage 0" when the file says "3").
TEST(ConfigErrors, NoCheckBlamesAValueThatFailedToRead) {
  const std::vector<Case> cases = {
      {R"({"zero_optimization": {"stage": "3", "offload_param": {"device": "cpu"}}})", "zero_optimization.stage",
       {"expected an integer"}},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": 7}}})",
       "zero_optimization.offload_param.nvme_path", {"expected a string"}},
      {R"({"zero_optimization": [], "zoe": {"delayed_update": true}})", "zero_optimization", {"expected an object"}},
  };
  for (const auto& c : cases) {
    expect_error(c);
    try {
      Config::from_json(c.json);
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(e.problems().size(), 1u) << e.what();
    }
  }
}

TEST(ConfigErrors, EveryRefusalSaysWhy) {
  expect_error({R"({"zero_optimization": {"stage": 3, "stage3_model_persistence_threshold": 1000}})",
                "zero_optimization.stage3_model_persistence_threshold",
                {"not supported", "no cap on the total of persistent parameters", "stage3_param_persistence_threshold"}});
  for (const char* key : {"round_robin_gradients", "legacy_stage1"}) {
    const std::string json = std::string(R"({"zero_optimization": {")") + key + "\": true}}";
    try {
      Config::from_json(json);
      ADD_FAILURE() << json;
    } catch (const zoe::ConfigError& e) {
      EXPECT_FALSE(e.reason().ends_with("not supported by zoe")) << e.what();
    }
  }
}

TEST(ConfigErrors, AFileWithSeveralProblemsIsNamedOnce) {
  const std::string path = ::testing::TempDir() + "zoe_several_problems.json";
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 7}, "gradient_clipping": -1})";
  }
  try {
    Config::from_json_file(path);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.message(), "config 'gradient_clipping': must be a finite number >= 0, got -1 (in '" + path +
                               "')\nconfig 'zero_optimization.stage': must be in [0, 3], got 7\n(2 problems)");
  }
  std::remove(path.c_str());
}
}  // namespace
