// Config::from_json / to_json: every key is read into its field, defaults, "auto", numbers
// written as 5e8, DeepSpeed's Adam/AdamW semantics, round trips and files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <array>
#include <fstream>
#include <vector>

#include "zoe/config.hpp"
#include "zoe/error.hpp"

namespace {
using zoe::Config;
using zoe::OffloadDevice;
using zoe::OptimizerType;

// Every key zoe reads, each set to a value different from its default.
constexpr const char* kEveryKey = R"({
  "train_batch_size": 96,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 3,
  "gradient_clipping": 1.5,
  "steps_per_print": 25, "wall_clock_breakdown": true, "dump_state": true, "memory_breakdown": true,
  "fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 12, "loss_scale_window": 500,
           "hysteresis": 3, "min_loss_scale": 0.5},
  "bf16": {"enabled": false},
  "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                "weight_decay": 0.1, "adam_w_mode": false, "bias_correction": false}},
  "zero_optimization": {
    "stage": 3, "overlap_comm": false, "contiguous_gradients": true,
    "reduce_bucket_size": 2e8, "allgather_bucket_size": 3e8, "sub_group_size": 4e8,
    "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e4,
    "stage3_max_live_parameters": 6e8, "stage3_max_reuse_distance": 7e8,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/a", "pin_memory": false,
                          "buffer_count": 6, "ratio": 0.3},
    "offload_param": {"device": "cpu", "nvme_path": "/mnt/b", "pin_memory": false, "buffer_count": 7,
                      "buffer_size": 2e8, "max_in_cpu": 2e9}
  },
  "aio": {"block_size": 262144, "queue_depth": 8, "intra_op_parallelism": 2, "single_submit": true,
          "overlap_events": false},
  "zoe": {"comm_timeout_s": 60.5, "optimizer_threads": 2, "require_direct_io": true,
          "pinned_budget_bytes": 8e9, "overlap_step": false, "delayed_update": true,
          "debug_poison": true}
})";

TEST(ConfigParse, EveryKeyReachesItsField) {
  const Config c = Config::from_json(kEveryKey);
  EXPECT_EQ(c.train_batch_size, 96);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.gradient_clipping, 1.5);
  EXPECT_EQ(c.steps_per_print, 25);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.dump_state);
  EXPECT_TRUE(c.memory_breakdown);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 128.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.5);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adam);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_FALSE(c.optimizer.bias_correction);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 3);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 200'000'000);
  EXPECT_EQ(z.allgather_bucket_size, 300'000'000);
  EXPECT_EQ(z.sub_group_size, 400'000'000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 10'000);
  EXPECT_EQ(z.stage3_max_live_parameters, 600'000'000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 700'000'000);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::nvme);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/mnt/a");
  EXPECT_FALSE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 6);
  EXPECT_EQ(z.offload_optimizer.ratio, 0.3);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::cpu);
  EXPECT_EQ(z.offload_param.nvme_path, "/mnt/b");
  EXPECT_FALSE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 7);
  EXPECT_EQ(z.offload_param.buffer_size, 200'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 2'000'000'000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_EQ(c.zoe.comm_timeout_s, 60.5);
  EXPECT_EQ(c.zoe.optimizer_threads, 2);
  EXPECT_TRUE(c.zoe.require_direct_io);
  EXPECT_EQ(c.zoe.pinned_budget_bytes, 8'000'000'000);
  EXPECT_FALSE(c.zoe.overlap_step);
  EXPECT_TRUE(c.zoe.delayed_update);
  EXPECT_TRUE(c.zoe.debug_poison);
  EXPECT_EQ(c.compute_dtype(), zoe::DType::f16);
}

TEST(ConfigParse, EmptyObjectGivesTheDocumentedDefaults) {
  const Config c = Config::from_json("{}");
  EXPECT_EQ(c, Config{});
  // The defaults docs/config.md lists (DeepSpeed's where it has one).
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 0);  // DeepSpeed's None: no progress lines
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.dump_state);
  EXPECT_FALSE(c.memory_breakdown);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adamw);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.betas[0], 0.9);
  EXPECT_EQ(c.optimizer.betas[1], 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.bias_correction);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.overlap_comm);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(z.allgather_bucket_size, 500'000'000);
  EXPECT_EQ(z.sub_group_size, 10'000'000);  // zoe's default (DeepSpeed's is 1e9; docs/config.md)
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1'000'000'000);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::none);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/tmp/zoe_nvme");
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::none);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1'000'000'000);
  EXPECT_EQ(c.aio.block_size, 1 << 20);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.zoe.comm_timeout_s, 300.0);
  EXPECT_EQ(c.zoe.optimizer_threads, 0);
  EXPECT_FALSE(c.zoe.require_direct_io);
  EXPECT_EQ(c.zoe.pinned_budget_bytes, 0);
  EXPECT_TRUE(c.zoe.overlap_step);
  EXPECT_FALSE(c.zoe.delayed_update);
  EXPECT_FALSE(c.zoe.debug_poison);
  EXPECT_EQ(c.compute_dtype(), zoe::DType::f32);
  EXPECT_NO_THROW(Config{}.validate());
}

// Hugging Face's "auto": every key transformers fills, as its ds_config_zero3.json writes them.
constexpr const char* kHfAuto = R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"}})";

TEST(ConfigParse, AutoTakesTheTrainersValue) {
  Config::AutoValues a;
  a.micro_batch_size_per_gpu = 4;
  a.gradient_accumulation_steps = 3;
  a.world_size = 2;
  a.max_grad_norm = 0.5;
  a.fp16 = false;
  a.bf16 = true;
  a.lr = 3e-4;
  a.betas = std::array<double, 2>{0.8, 0.95};
  a.eps = 1e-6;
  a.weight_decay = 0.1;
  a.warmup_steps = 100;
  a.total_steps = 2000;
  a.hidden_size = 1024;
  const Config c = Config::from_json(kHfAuto, a);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.total_num_steps, 2000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1024 * 1024);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 943718);  // int(0.9 * 1024 * 1024)
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 10240);
  EXPECT_NO_THROW(c.check_batch_size(2));
}

TEST(ConfigParse, AutoWithoutTheTrainersValueIsAProblemNamingTheKey) {
  try {
    Config::from_json(kHfAuto);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    // Every auto key but scheduler.params.warmup_min_lr (Hugging Face writes 0 there).
    ASSERT_EQ(e.problems().size(), 16u) << e.what();
    EXPECT_EQ(e.key(), "train_batch_size");
    EXPECT_NE(e.reason().find("Config::AutoValues::world_size, micro_batch_size_per_gpu and "
                              "gradient_accumulation_steps"), std::string::npos) << e.reason();
    EXPECT_EQ(e.problems()[6].key, "optimizer.params.lr");
    EXPECT_EQ(e.problems()[6].reason,
              "\"auto\" takes the trainer's value (Hugging Face's meaning) and none was given: set "
              "Config::AutoValues::lr for from_json, or write a value");
  }
  // The trainer's value is read and checked as if the file held it.
  Config::AutoValues bad;
  bad.lr = -1.0;
  try {
    Config::from_json(R"({"optimizer": {"params": {"lr": "auto"}}})", bad);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.message(), "config 'optimizer.params.lr': must be a finite number >= 0, got -1");
  }
  Config::AutoValues lr;
  lr.lr = 0.25;
  EXPECT_EQ(Config::from_json(R"({"optimizer": {"params": {"lr": "auto"}}})", lr).optimizer.lr, 0.25);
}

TEST(ConfigParse, IntegralDoublesAreIntegers) {
  const Config c = Config::from_json(R"({"zero_optimization": {"reduce_bucket_size": 5e8,
      "sub_group_size": 1.0e9, "stage": 2.0}, "aio": {"block_size": 1048576.0}})");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.aio.block_size, 1 << 20);
  // Integers are numbers too (gradient_clipping is a double field).
  EXPECT_EQ(Config::from_json(R"({"gradient_clipping": 1})").gradient_clipping, 1.0);
}

TEST(ConfigParse, DeepSpeedAdamIsAdamWUnlessAdamWModeIsFalse) {
  auto type = [](const char* json) { return Config::from_json(json).optimizer.type; };
  EXPECT_EQ(type(R"({"optimizer": {"type": "Adam"}})"), OptimizerType::adamw);
  EXPECT_EQ(type(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})"), OptimizerType::adamw);
  EXPECT_EQ(type(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"), OptimizerType::adam);
  EXPECT_EQ(type(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})"), OptimizerType::adamw);
  // Case-insensitive, as DeepSpeed compares optimizer names lowercased.
  EXPECT_EQ(type(R"({"optimizer": {"type": "adamw"}})"), OptimizerType::adamw);
  EXPECT_EQ(type(R"({"optimizer": {"type": "ADAM", "params": {"adam_w_mode": false}}})"), OptimizerType::adam);
}

TEST(ConfigParse, OffloadDevicesAndFixedKeys) {
  const Config c = Config::from_json(R"({"zero_optimization": {"stage": 2, "reduce_scatter": true,
      "allgather_partitions": true, "offload_optimizer": {"device": "CPU"}}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::cpu);
  const Config n = Config::from_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": null,
      "offload_param": {"device": "nvme"}}})");
  EXPECT_EQ(n.zero_optimization.offload_optimizer.device, OffloadDevice::none);
  EXPECT_EQ(n.zero_optimization.offload_param.device, OffloadDevice::nvme);
}

Config non_default_config() {
  Config c;
  c.train_batch_size = 64;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 4;
  c.gradient_clipping = 0.7;
  c.steps_per_print = 3;
  c.wall_clock_breakdown = true;
  c.dump_state = true;
  c.memory_breakdown = true;
  c.bf16.enabled = true;
  c.fp16.loss_scale = 0.1;  // not exactly representable: the JSON must keep all digits
  c.fp16.initial_scale_power = 20;
  c.fp16.loss_scale_window = 77;
  c.fp16.hysteresis = 5;
  c.fp16.min_loss_scale = 1.0 / 3.0;
  c.optimizer.type = OptimizerType::adam;
  c.optimizer.lr = 6.0e-5 / 7.0;
  c.optimizer.betas = {0.85, 0.98765};
  c.optimizer.eps = 1e-12;
  c.optimizer.weight_decay = 0.05;
  c.optimizer.bias_correction = false;
  auto& z = c.zero_optimization;
  z.stage = 3;
  z.overlap_comm = false;
  z.reduce_bucket_size = 0;  // DeepSpeed's 0: every group a bucket of its own
  z.allgather_bucket_size = 98'765'432'101;
  z.sub_group_size = 1;
  z.stage3_prefetch_bucket_size = 0;
  z.stage3_param_persistence_threshold = 0;
  z.stage3_max_live_parameters = 5;
  z.stage3_max_reuse_distance = 6;
  z.offload_optimizer = {OffloadDevice::nvme, "/x/y z", false, 9, 0.25};
  z.offload_param = {OffloadDevice::nvme, "/p\"q", false, 2, 3, 4};
  c.aio = {4096, 1, 3, true, false};
  c.zoe.comm_timeout_s = 0.001;
  c.zoe.optimizer_threads = 7;
  c.zoe.require_direct_io = true;
  c.zoe.pinned_budget_bytes = 123456789012345;
  c.zoe.host_memory_budget = 0;
  c.zoe.overlap_step = true;
  return c;
}

TEST(ConfigParse, RoundTripGivesTheSameStruct) {
  const Config c = non_default_config();
  ASSERT_NO_THROW(c.validate());
  const Config back = Config::from_json(c.to_json());
  EXPECT_EQ(back, c) << c.to_json();
  EXPECT_EQ(Config::from_json(Config{}.to_json()), Config{});
  Config adamw = c;
  adamw.optimizer.type = OptimizerType::adamw;
  EXPECT_EQ(Config::from_json(adamw.to_json()), adamw);
}

TEST(ConfigParse, FromJsonFileReadsAndNamesTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("zoe_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto good = (dir / "ds.json").string();
  std::ofstream(good) << non_default_config().to_json();
  EXPECT_EQ(Config::from_json_file(good), non_default_config());

  const auto bad = (dir / "bad.json").string();
  std::ofstream(bad) << R"({"zero_optimization": {"stage": 7}})";
  try {
    Config::from_json_file(bad);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.stage");
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got 7"), std::string::npos) << e.what();
  }
  const auto missing = (dir / "missing.json").string();
  try {
    Config::from_json_file(missing);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::SystemError& e) {
    EXPECT_EQ(e.error_code(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(ConfigParse, BatchSizeMustMatchMicroTimesStepsTimesWorld) {
  Config c;
  c.train_micro_batch_size_per_gpu = 4;
  c.gradient_accumulation_steps = 2;
  EXPECT_NO_THROW(c.check_batch_size(8));  // not given: unchecked
  c.train_batch_size = 64;
  EXPECT_NO_THROW(c.check_batch_size(8));
  try {
    c.check_batch_size(4);
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "train_batch_size");
    EXPECT_NE(std::string(e.what()).find("= 32"), std::string::npos) << e.what();
  }
}

// Issue 20: DeepSpeed's logging and timing keys, as real configs write them, are accepted and
// drive zoe's log (tests/core/test_engine_config.cpp); the keys with a value zoe cannot honour
// are refused with the reason.
TEST(ConfigParse, LoggingAndNoOpKeysOfRealConfigsAreAccepted) {
  const Config c = Config::from_json(R"({
    "steps_per_print": 2000, "wall_clock_breakdown": false, "prescale_gradients": false,
    "gradient_predivide_factor": 1.0, "zero_allow_untested_optimizer": true, "dump_state": false,
    "memory_breakdown": false,
    "tensorboard": {"enabled": false, "output_path": "logs/", "job_name": "x"},
    "wandb": {"enabled": false}, "csv_monitor": {"enabled": false}, "comet": {"enabled": false},
    "flops_profiler": {"enabled": false, "profile_step": 1}, "comms_logger": {"enabled": false},
    "autotuning": {"enabled": false, "arg_mappings": {}}, "elasticity": {"enabled": false},
    "curriculum_learning": {"enabled": false}, "data_efficiency": {"enabled": false}
  })");
  Config want;
  want.steps_per_print = 2000;
  EXPECT_EQ(c, want);
  EXPECT_EQ(Config::from_json(R"({"zero_allow_untested_optimizer": false, "gradient_predivide_factor": 1})"),
            Config{});
}

TEST(ConfigParse, LoggingKeysZoeCannotHonourAreRefusedWithTheReason) {
  struct Case {
    const char* json;
    const char* key;
    const char* reason;
  };
  const Case cases[] = {
      {R"({"prescale_gradients": 1})", "prescale_gradients", "expected true or false, got an integer 1"},
      {R"({"gradient_predivide_factor": 0})", "gradient_predivide_factor", "must be a finite number > 0, got 0"},
      {R"({"steps_per_print": -1})", "steps_per_print", "must be >= 0, got -1"},
      {R"({"steps_per_print": "often"})", "steps_per_print", "expected an integer, got a string \"often\""},
      {R"({"wall_clock_breakdown": 1})", "wall_clock_breakdown", "expected true or false, got an integer 1"},
      {R"({"zero_allow_untested_optimizer": "yes"})", "zero_allow_untested_optimizer", "expected true or false"},
      {R"({"tensorboard": {"enabled": true, "output_path": "logs/"}})", "tensorboard",
       "DeepSpeed key not supported by zoe (value {\"enabled\":true,\"output_path\":\"logs/\"}): zoe logs through "
       "spdlog (ZOE_LOG_LEVEL); remove the key; accepted only with \"enabled\": false"},
      {R"({"autotuning": true})", "autotuning", "use zoe-estimate; accepted only with \"enabled\": false"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.json);
    try {
      Config::from_json(k.json);
      ADD_FAILURE() << "no exception";
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(e.problems().size(), 1u) << e.what();
      EXPECT_EQ(e.key(), k.key);
      EXPECT_EQ(e.reason().rfind(k.reason, 0) == 0 || e.reason().find(k.reason) != std::string::npos, true)
          << e.reason();
    }
  }
}

// Issue 20, from the real configs of tests/config/real: keys whose DeepSpeed meaning zoe has.
TEST(ConfigParse, KeysDeepSpeedIgnoresOrMapsAreHonoured) {
  // A feature section without "enabled" is off in DeepSpeed (each defaults to false).
  EXPECT_EQ(Config::from_json(R"({"flops_profiler": {"profile_step": 1}, "autotuning": {"arg_mappings": {}}})"),
            Config{});
  // disable_allgather: read by DeepSpeed's config and never used; torch_adam: torch's
  // Adam / AdamW, the update zoe's optimizer computes.
  EXPECT_EQ(Config::from_json(R"({"disable_allgather": true, "optimizer": {"params": {"torch_adam": true}}})"),
            Config{});
  // The deprecated cpu_offload: true is DeepSpeed's offload_optimizer {"device": "cpu"}.
  const Config c = Config::from_json(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, zoe::OffloadDevice::cpu);
  EXPECT_EQ(Config::from_json(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})")
                .zero_optimization.offload_optimizer.device,
            zoe::OffloadDevice::none);
  try {
    Config::from_json(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
                          "offload_optimizer": {"device": "nvme"}}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.cpu_offload");
    EXPECT_NE(e.reason().find("give only one of them"), std::string::npos) << e.reason();
  }
}

// DeepSpeed's gather_16bit_weights_on_model_save under its three spellings (field name,
// pydantic alias, deprecated fp16 name); zoe's default true; two different values are refused.
TEST(ConfigParse, Gather16bitWeightsOnModelSaveUnderEverySpelling) {
  EXPECT_TRUE(Config{}.zero_optimization.gather_16bit_weights_on_model_save);
  for (const char* key : {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save"}) {
    for (bool v : {false, true}) {
      const std::string j = std::string(R"({"zero_optimization": {"stage": 3, ")") + key + "\": " + (v ? "true" : "false") + "}}";
      const Config c = Config::from_json(j);
      EXPECT_EQ(c.zero_optimization.gather_16bit_weights_on_model_save, v) << j;
      EXPECT_EQ(Config::from_json(c.to_json()), c) << j;  // round trip
    }
  }
  // "auto" (accelerate fills it from zero3_save_16bit_model): the trainer's value, else a problem.
  Config::AutoValues a;
  for (bool v : {false, true}) {
    a.gather_16bit_weights_on_model_save = v;
    EXPECT_EQ(Config::from_json(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": "auto"}})", a)
                  .zero_optimization.gather_16bit_weights_on_model_save,
              v);
  }
  try {
    Config::from_json(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": "auto"}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.stage3_gather_16bit_weights_on_model_save");
    EXPECT_NE(e.reason().find("gather_16bit_weights_on_model_save"), std::string::npos) << e.reason();
  }
  // The same value twice is DeepSpeed's alias given twice: accepted.
  EXPECT_FALSE(Config::from_json(R"({"zero_optimization": {"gather_16bit_weights_on_model_save": false,
                                     "stage3_gather_16bit_weights_on_model_save": false}})")
                   .zero_optimization.gather_16bit_weights_on_model_save);
  try {
    Config::from_json(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": true,
                          "stage3_gather_fp16_weights_on_model_save": false}})");
    ADD_FAILURE() << "no exception";
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.stage3_gather_fp16_weights_on_model_save");
    EXPECT_NE(e.reason().find("another value than an earlier spelling"), std::string::npos) << e.reason();
  }
}

// Issue 20: DeepSpeed's schedulers with DeepSpeed's names, defaults and formulas.
TEST(ConfigParse, SchedulersReadWithDeepSpeedsParameterNames) {
  const Config a = Config::from_json(R"({"scheduler": {"type": "WarmupLR", "params":
      {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 500, "warmup_type": "linear",
       "last_batch_iteration": -1}}})");
  EXPECT_EQ(a.scheduler.type, zoe::SchedulerType::warmup_lr);
  EXPECT_EQ(a.scheduler.warmup_min_lr, 1e-5);
  EXPECT_EQ(a.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(a.scheduler.warmup_num_steps, 500);
  EXPECT_EQ(a.scheduler.warmup_type, zoe::WarmupType::linear);
  const Config d = Config::from_json(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9000}}})");
  EXPECT_EQ(d.scheduler.type, zoe::SchedulerType::warmup_decay_lr);
  EXPECT_EQ(d.scheduler.total_num_steps, 9000);
  EXPECT_EQ(d.scheduler.warmup_num_steps, 1000);  // DeepSpeed's defaults
  EXPECT_EQ(d.scheduler.warmup_type, zoe::WarmupType::log);
  EXPECT_EQ(d.scheduler.warmup_min_lr, 0.0);
  EXPECT_FALSE(d.scheduler.warmup_max_lr.has_value());
  const Config c = Config::from_json(R"({"scheduler": {"type": "WarmupCosineLR", "params":
      {"total_num_steps": 100, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05, "warmup_num_steps": 10}}})");
  EXPECT_EQ(c.scheduler.type, zoe::SchedulerType::warmup_cosine_lr);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 0.05);
  EXPECT_EQ(Config::from_json(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1}}})")
                .scheduler.cos_min_ratio,
            0.0001);
  for (const Config& k : {a, d, c}) EXPECT_EQ(Config::from_json(k.to_json()), k) << k.to_json();
  EXPECT_EQ(Config{}.scheduler.type, zoe::SchedulerType::none);
}

TEST(ConfigParse, SchedulerProblemsNameTheKeyAndWhy) {
  struct Case {
    const char* json;
    const char* key;
    const char* reason;
  };
  const Case cases[] = {
      {R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
       "scheduler.params.total_num_steps", "WarmupDecayLR needs total_num_steps >= 1 (a required argument of DeepSpeed's WarmupDecayLR), got none"},
      {R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})", "scheduler.type",
       "DeepSpeed's OneCycle is not implemented by zoe"},
      {R"({"scheduler": {"type": "Cosine"}})", "scheduler.type", "\"Cosine\" is not one of"},
      {R"({"scheduler": {"params": {"warmup_num_steps": 10}}})", "scheduler.type", "missing"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})", "scheduler.params.cos_min_ratio",
       "unknown key"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})", "scheduler.params.warmup_num_steps",
       "must be a positive integer (as DeepSpeed's WarmupLR requires), got 0"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})", "scheduler.params.warmup_type",
       "\"exp\" is not one of log|linear"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": [1e-3]}}})", "scheduler.params.warmup_max_lr",
       "expected a number"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 7}}})",
       "scheduler.params.last_batch_iteration", "engine's step count"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5, "cos_min_ratio": 2}}})",
       "scheduler.params.cos_min_ratio", "must be in [0, 1]"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.json);
    try {
      Config::from_json(k.json);
      ADD_FAILURE() << "no exception";
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(e.problems().size(), 1u) << e.what();
      EXPECT_EQ(e.key(), k.key) << e.what();
      EXPECT_NE(e.reason().find(k.reason), std::string::npos) << e.reason();
    }
  }
}

// lr_at against DeepSpeed: the numbers below are DeepSpeed's lr_schedules.py math run in
// Python 3 (float64, its libm log and cos), driven as its engine drives the scheduler: built at
// last_batch_iteration -1, stepped after each applied optimizer step. Element k is the lr of
// applied step k + 1, i.e. lr_at(optimizer_lr, k).
TEST(ConfigParse, ScheduleValuesEqualDeepSpeeds) {
  auto check = [](const zoe::SchedulerConfig& s, double optimizer_lr, const std::vector<double>& want) {
    for (std::size_t k = 0; k < want.size(); ++k)
      EXPECT_EQ(s.lr_at(optimizer_lr, static_cast<std::int64_t>(k)), want[k]) << "applied steps " << k;
  };
  zoe::SchedulerConfig s;
  s.type = zoe::SchedulerType::warmup_lr;
  s.warmup_min_lr = 1e-5;
  s.warmup_max_lr = 3e-4;
  s.warmup_num_steps = 5;
  check(s, 1.0, {1e-05, 1e-05, 0.00013489620184128397, 0.00020795579640093571, 0.00025979240368256796, 0.0003,
                 0.0003, 0.0003});
  // warmup_max_lr not given: WarmupLR warms up to the optimizer's lr.
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr.reset();
  s.warmup_num_steps = 4;
  s.warmup_type = zoe::WarmupType::linear;
  check(s, 2e-3, {0.0, 0.0, 0.0005, 0.001, 0.0015, 0.002, 0.002});
  // warmup_num_steps 1 is DeepSpeed's max(2, 1) = 2.
  s.warmup_num_steps = 1;
  s.warmup_type = zoe::WarmupType::log;
  check(s, 1e-3, {0.0, 0.0, 0.001, 0.001});
  // WarmupDecayLR without warmup_max_lr: DeepSpeed's 0.001, whatever the optimizer's lr.
  zoe::SchedulerConfig d;
  d.type = zoe::SchedulerType::warmup_decay_lr;
  d.warmup_num_steps = 3;
  d.warmup_type = zoe::WarmupType::linear;
  d.total_num_steps = 8;
  check(d, 0.5, {0.0, 0.0, 0.0003333333333333333, 0.0006666666666666666, 0.001, 0.0008, 0.0006, 0.0004, 0.0002,
                 0.0, 0.0});
  zoe::SchedulerConfig c;
  c.type = zoe::SchedulerType::warmup_cosine_lr;
  c.total_num_steps = 10;
  c.warmup_num_steps = 3;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  check(c, 1e-3, {0.0, 0.0001, 0.0006678367782143116, 0.001, 0.0009509795896116974, 0.0008136274519200731,
                  0.0006151478623083756, 0.00039485213769162444, 0.00019637254807992693, 5.902041038830258e-05,
                  1e-05, 1e-05, 1e-05});
  EXPECT_EQ(zoe::SchedulerConfig{}.lr_at(0.25, 7), 0.25);  // none: the optimizer's lr
}
}  // namespace

// zoe.host_memory_budget: bytes, or "auto" (what the machine can spare, resolved by the
// engine at construction; Hugging Face's trainer values play no part in it).
TEST(ConfigParse, HostMemoryBudgetTakesBytesOrAuto) {
  const std::string nvme = R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})";
  const Config a = Config::from_json("{" + nvme + R"(, "zoe": {"host_memory_budget": "auto"}})");
  EXPECT_EQ(a.zoe.host_memory_budget, zoe::ZoeConfig::kHostMemoryBudgetAuto);
  EXPECT_NE(a.to_json().find(R"("host_memory_budget": "auto")"), std::string::npos) << a.to_json();
  EXPECT_EQ(Config::from_json(a.to_json()), a);
  EXPECT_EQ(Config::from_json("{" + nvme + R"(, "zoe": {"host_memory_budget": 4096}})").zoe.host_memory_budget, 4096);
  for (const char* bad : {R"("Auto")", R"("4096")", "-2", "true"}) {
    SCOPED_TRACE(bad);
    try {
      (void)Config::from_json("{" + nvme + R"(, "zoe": {"host_memory_budget": )" + bad + "}}");
      ADD_FAILURE() << "accepted";
    } catch (const zoe::ConfigError& e) {
      EXPECT_EQ(e.key(), "zoe.host_memory_budget") << e.what();
    }
  }
}
