// Checkpoint and resume through zoe's Engine (ZeRO-3, optimizer states on NVMe, 2 ranks): a run
// split by --stop-after and continued with --resume is the same run as one without the break
// (bitwise: every step's loss, every parameter, the validation loss, the metrics rows); a trainer
// state written before a failed engine save is ignored; bad checkpoints fail naming the path; a
// run resumed at another world size keeps the global batch and the data order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "examples/gpt/checkpoint.hpp"
#include "examples/gpt/data_layout.hpp"
#include "examples/gpt/options.hpp"
#include "zoe/error.hpp"
#include "tests/gpt/tiny_run.hpp"

namespace gpt {
namespace {
namespace fs = std::filesystem;

constexpr int kSteps = 8;

TrainOptions resumable(const test::TempDir& dir, const std::string& ckpt) {
  TrainOptions o = test::tiny(3, zoe::OffloadDevice::nvme, dir / "nvme", kSteps);
  fs::create_directories(dir / "nvme");
  o.checkpoint_dir = ckpt;
  o.checkpoint_interval = 3;
  o.eval_interval = 4;
  return o;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Columns step, loss and val_loss of a metrics CSV (the others are timings).
std::vector<std::string> loss_columns(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::size_t comma = 0;
    for (int i = 0; i < 3 && comma != std::string::npos; ++i) comma = line.find(',', comma + 1);
    rows.push_back(line.substr(0, comma));
  }
  return rows;
}

void expect_same_run(const TrainSummary& a, const TrainSummary& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_TRUE(same_bits(a.losses[i], b.losses[i]))
        << "step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i];
  EXPECT_TRUE(same_bits(a.final_val_loss, b.final_val_loss)) << a.final_val_loss << " vs " << b.final_val_loss;
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (const auto& [name, value] : a.parameters) {
    const auto& other = b.parameters.at(name);
    ASSERT_EQ(value.size(), other.size()) << name;
    EXPECT_EQ(std::memcmp(value.data(), other.data(), value.size() * sizeof(float)), 0) << name;
  }
}

TEST(GptResume, StopAndResumeIsTheSameRunBitwise) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("resume");

  TrainOptions whole = resumable(dir, dir / "ckpt_whole");
  whole.metrics_file = dir / "whole.csv";
  const TrainSummary full = train(whole, data, no_tokenizer, false, true);

  TrainOptions part = resumable(dir, dir / "ckpt_split");
  part.metrics_file = dir / "split.csv";
  part.stop_after = kSteps / 2;
  const TrainSummary first = train(part, data, no_tokenizer, false, true);
  EXPECT_EQ(first.losses.size(), static_cast<std::size_t>(kSteps / 2));
  EXPECT_TRUE(fs::exists(dir / "ckpt_split/trainer-4.json"));
  EXPECT_FALSE(fs::exists(dir / "ckpt_split/trainer-3.json"));  // superseded by step 4's

  // A row past the checkpoint, as a run killed after step 4 would leave: resuming drops it.
  { std::ofstream(part.metrics_file, std::ios::app) << "5,9.99,,0.01,1,1,1\n"; }
  part.stop_after = 0;
  part.resume = true;
  const TrainSummary rest = train(part, data, no_tokenizer, false, true);
  EXPECT_EQ(rest.start_step, kSteps / 2);
  EXPECT_TRUE(same_bits(rest.first_loss, full.first_loss));
  expect_same_run(full, rest);
  for (int i = 0; i < kSteps / 2; ++i) EXPECT_TRUE(same_bits(first.losses[i], full.losses[i]));

  const std::vector<std::string> rows = loss_columns(whole.metrics_file);
  EXPECT_EQ(rows.size(), static_cast<std::size_t>(kSteps + 1));  // header + one row per step
  EXPECT_EQ(loss_columns(part.metrics_file), rows);
  EXPECT_LT(full.losses.back(), full.losses.front() - 0.05);  // it did train
}

TEST(GptResume, IgnoresTheTrainerStateOfAnEngineSaveThatFailed) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("resume_failed_save");
  TrainOptions o = resumable(dir, dir / "ckpt");
  const TrainSummary full = train(o, data, no_tokenizer, false, true);

  // Checkpoint after step 2, kept aside; then the same run on to step 4.
  o.checkpoint_dir = dir / "ckpt2";
  o.stop_after = 2;
  train(o, data, no_tokenizer, false);
  fs::copy(dir / "ckpt2", dir / "crashed", fs::copy_options::recursive);
  o.resume = true;
  o.stop_after = 4;
  train(o, data, no_tokenizer, false);
  // A save of step 4 that wrote its trainer state and died before the engine's files: the
  // engine files are still step 2's, next to a trainer-4.json.
  fs::copy(dir / "ckpt2/trainer-4.json", dir / "crashed/trainer-4.json");
  ASSERT_TRUE(fs::exists(dir / "crashed/trainer-2.json"));

  o.checkpoint_dir = dir / "crashed";
  o.stop_after = 0;
  const TrainSummary resumed = train(o, data, no_tokenizer, false, true);
  EXPECT_EQ(resumed.start_step, 2);
  expect_same_run(full, resumed);
}

// The message of the zoe::Error that `fn` throws ("" if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const zoe::Error& e) {
    return e.what();
  }
  return "";
}

TEST(GptResume, BadCheckpointsFailNamingThePath) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("resume_bad");
  TrainOptions o = resumable(dir, dir / "ckpt");
  o.stop_after = 2;
  train(o, data, no_tokenizer, false);
  o.stop_after = 0;
  o.resume = true;

  TrainOptions missing = o;
  missing.checkpoint_dir = dir / "nowhere";
  EXPECT_NE(error_of([&] { train(missing, data, no_tokenizer, false); }).find(dir / "nowhere"),
            std::string::npos);

  TrainOptions other_seed = o;  // a checkpoint of another run
  other_seed.seed = 8;
  const std::string seed_error = error_of([&] { train(other_seed, data, no_tokenizer, false); });
  EXPECT_NE(seed_error.find(dir / "ckpt"), std::string::npos) << seed_error;
  EXPECT_NE(seed_error.find("seed"), std::string::npos) << seed_error;

  fs::copy(dir / "ckpt", dir / "bad_state", fs::copy_options::recursive);
  { std::ofstream(dir / "bad_state/trainer-2.json", std::ios::trunc) << "{\"version\": 1, \"ste"; }
  TrainOptions bad_state = o;
  bad_state.checkpoint_dir = dir / "bad_state";
  const std::string state_error = error_of([&] { train(bad_state, data, no_tokenizer, false); });
  EXPECT_NE(state_error.find(dir / "bad_state/trainer-2.json"), std::string::npos) << state_error;

  fs::copy(dir / "ckpt", dir / "bad_engine", fs::copy_options::recursive);
  const std::string rank_file = dir / "bad_engine/engine/rank0.zoe";
  fs::resize_file(rank_file, fs::file_size(rank_file) - 100);
  TrainOptions bad_engine = o;
  bad_engine.checkpoint_dir = dir / "bad_engine";
  // Rank 1's file is intact; the ranks agree on the outcome before anything is loaded, so it
  // fails at once too (the short timeout would show a rank left waiting).
  bad_engine.engine.zoe.comm_timeout_s = 3;
  const std::string engine_error = error_of([&] { train(bad_engine, data, no_tokenizer, false); });
  EXPECT_NE(engine_error.find(rank_file), std::string::npos) << engine_error;

  fs::remove(dir / "ckpt/trainer-2.json");  // engine files without the trainer's
  const std::string no_state = error_of([&] { train(o, data, no_tokenizer, false); });
  EXPECT_NE(no_state.find(dir / "ckpt"), std::string::npos) << no_state;
  EXPECT_NE(no_state.find("trainer"), std::string::npos) << no_state;
}

// Losing a rank: a world-2 run resumed at world 1 runs 4 micro-batches per step instead of 2, on
// the same sequences in the same order, so its losses continue the world-2 continuation's (they
// differ only in the order of the gradient and loss sums). A world size that cannot split the
// step's 4 micro-batches is refused, naming the ones that can.
TEST(GptResume, AtAnotherWorldSizeKeepsTheGlobalBatchAndTheDataOrder) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("resume_world");
  TrainOptions o = resumable(dir, dir / "ckpt2");
  o.stop_after = kSteps / 2;
  train(o, data, no_tokenizer, false);
  fs::copy(dir / "ckpt2", dir / "ckpt1", fs::copy_options::recursive);
  fs::copy(dir / "ckpt2", dir / "ckpt3", fs::copy_options::recursive);
  o.stop_after = 0;
  o.resume = true;
  const TrainSummary at2 = train(o, data, no_tokenizer, false, true);

  TrainOptions one = o;
  one.checkpoint_dir = dir / "ckpt1";
  one.world_size = 1;
  const TrainSummary at1 = train(one, data, no_tokenizer, false, true);
  EXPECT_EQ(at1.start_step, kSteps / 2);
  ASSERT_EQ(at1.losses.size(), at2.losses.size());
  double largest = 0;
  for (std::size_t i = 0; i < at1.losses.size(); ++i) {
    EXPECT_NEAR(at1.losses[i], at2.losses[i], 1e-3) << "step " << i + 1;
    largest = std::max(largest, std::abs(at1.losses[i] - at2.losses[i]));
  }
  std::printf("world 1 vs world 2 continuation: largest loss difference %.3g nats over %zu steps\n", largest,
              at1.losses.size() - kSteps / 2);
  EXPECT_EQ(relayout_message({2, 2}, 1, 2, 16),
            "resuming a run of world size 2 x 2 micro-batches at world size 1 x 4 micro-batches (gradient "
            "accumulation 4): the same 8 sequences (128 tokens) per step, in the same order");
  for (const auto& [name, value] : at2.parameters)
    for (std::size_t i = 0; i < value.size(); ++i)
      ASSERT_NEAR(at1.parameters.at(name)[i], value[i], 1e-3) << name << "[" << i << "]";
  // The world-1 run saved its checkpoint with the original layout: it resumes at world 2 again.
  EXPECT_EQ(saved_run_identity(dir / "ckpt1").at("world_size"), 2);
  EXPECT_EQ(saved_run_identity(dir / "ckpt1").at("micro_batches"), 2);

  TrainOptions three = o;
  three.checkpoint_dir = dir / "ckpt3";
  three.world_size = 3;
  const std::string refused = error_of([&] { train(three, data, no_tokenizer, false); });
  EXPECT_NE(refused.find("--resume at world size 3"), std::string::npos) << refused;
  EXPECT_NE(refused.find("world sizes that work: 1, 2, 4"), std::string::npos) << refused;
}

TEST(GptResume, ResumingAFinishedRunTrainsNothing) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("resume_done");
  TrainOptions o = resumable(dir, dir / "ckpt");
  const TrainSummary full = train(o, data, no_tokenizer, false, true);
  o.resume = true;
  const TrainSummary again = train(o, data, no_tokenizer, false, true);
  EXPECT_EQ(again.start_step, kSteps);
  expect_same_run(full, again);  // the validation loss is evaluated again, same bits
}

TEST(GptResume, ResumeAndStopAfterNeedACheckpointDir) {
  const auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "zoe-gpt");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return error_of([&] { parse_options(static_cast<int>(argv.size()), argv.data()); });
  };
  EXPECT_NE(parse({"--resume"}).find("--checkpoint-dir"), std::string::npos);
  EXPECT_NE(parse({"--stop-after", "5"}).find("--checkpoint-dir"), std::string::npos);
  EXPECT_EQ(parse({"--resume", "--checkpoint-dir", "x"}), "");
}

}  // namespace
}  // namespace gpt
