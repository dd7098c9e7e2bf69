// Host memory of the trainer is bounded by buffers, not by the model (issue 19): zoe-gpt's
// training loop (gpt::train: ZeRO-3, one rank, bf16, activation checkpointing, optimizer states,
// fp32 gradients and bf16 parameters on NVMe) trains, evaluates and saves a checkpoint, and a
// second run loads it and trains on, each in a forked child under an RLIMIT_DATA cap of
// kRoom (200 MiB) above the child's start, 3.6 times smaller than the model's optimizer states
// (12 B per element). What the run holds is buffers of a size fixed by the config and the
// largest module (measured uncapped: 172-180 MiB of VmData above the start with 24 blocks of
// width 384 and with 64 of width 256: staging buffers, one module's fp32 copies, the host
// device's gathered module and block cache, thread stacks, malloc arenas; under the cap the
// runs below reach 194-199 MiB, the block cache using what is there), so the cap leaves less
// room than the bf16 parameters (2 B per element).
// The cap is shown to bite where memory grows with the model: the same run with offload_param
// none (the bf16 parameters in the host device's memory) must fail under it, out of memory.
// Thread-safety: the test process creates no threads (run_in_child forks it).
#include <gtest/gtest.h>
#include <malloc.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>

#include "examples/gpt/model_spec.hpp"
#include "tests/gpt/tiny_run.hpp"
#include "tests/offload_memory/child_process.hpp"

namespace gpt {
namespace {

// 80 blocks of width 256 (0.79M elements each) and a 64-token vocabulary: 63.2M parameters,
// 723 MiB of optimizer states, 120 MiB of bf16 parameters; the largest module is one block.
TrainOptions capped_run(const std::string& nvme, zoe::OffloadDevice param_tier) {
  TrainOptions o = test::tiny(3, zoe::OffloadDevice::nvme, nvme, 2);
  o.model.n_layer = 80;
  o.model.n_head = 4;
  o.model.n_embd = 256;
  o.model.context = 16;
  o.world_size = 1;
  o.threads_per_rank = 1;
  o.activation_checkpointing = true;
  o.eval_batches = 1;
  o.engine.train_micro_batch_size_per_gpu = 1;
  o.engine.gradient_accumulation_steps = 1;
  o.engine.bf16.enabled = true;
  auto& z = o.engine.zero_optimization;
  z.sub_group_size = 1 << 18;  // 4 MiB of states + gradient per staging buffer
  z.reduce_bucket_size = 0;    // each group reduces on its own: no bucket of several blocks
  z.offload_optimizer.buffer_count = 3;
  z.offload_param.device = param_tier;
  z.offload_param.nvme_path = nvme;
  z.offload_param.buffer_count = 3;
  z.offload_param.buffer_size = 1 << 20;  // one block's shard (0.79M elements)
  return o;
}

constexpr long long kRoom = 200ll << 20;

// In the child: caps VmData at start + kRoom, runs `o`, and writes its losses to `out`.
void run_capped(const TrainOptions& o, const std::string& out) {
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);  // freed large blocks go back to the kernel
  pthread_attr_t attr;  // 2 MiB thread stacks (glibc's 8 MiB default would be counted per thread)
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 2 << 20) != 0 ||
      pthread_setattr_default_np(&attr) != 0)
    throw std::runtime_error("cannot set the default thread stack size");
  pthread_attr_destroy(&attr);
  const long long start = zoe::test::vm_data_bytes();
  if (!zoe::test::set_data_limit(static_cast<rlim_t>(start + kRoom))) throw std::runtime_error("setrlimit failed");
  // A thread polls VmData every millisecond: the test prints the most the run held above its start.
  std::atomic<long long> peak{start};
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) {
      const long long v = zoe::test::vm_data_bytes();
      if (v > peak) peak = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    long long start;
    std::atomic<long long>& peak;
    ~Join() {
      stop = true;
      t.join();
      std::fprintf(stderr, "child: VmData at most %lld MiB above its start (cap %lld MiB above it)\n",
                   (peak - start) >> 20, kRoom >> 20);
    }
  } join{stop, poller, start, peak};
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const TrainSummary s = train(o, data, no_tokenizer, false);
  zoe::test::set_data_limit(RLIM_INFINITY);
  std::ofstream f(out);
  for (double l : s.losses) f << l << "\n";
  f << "val " << s.final_val_loss << "\n";
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(TrainerMemoryCap, TrainsEvaluatesSavesAndLoadsUnderACapSeveralTimesSmallerThanTheStates) {
  ZOE_SKIP_CAP_TEST_UNDER_SANITIZERS();
  const test::TempDir dir("memcap");
  const std::string nvme = dir / "nvme", ckpt = dir / "ckpt";
  std::filesystem::create_directories(nvme);
  const TrainOptions base = capped_run(nvme, zoe::OffloadDevice::nvme);
  const std::int64_t psi = make_model_spec(base.model).parameter_count();
  const long long states = 12ll * psi;
  std::printf("model %lld parameters: optimizer states %lld MiB, bf16 parameters %lld MiB, fp32 gradients %lld MiB; "
              "cap %lld MiB above the start\n",
              static_cast<long long>(psi), states >> 20, (2ll * psi) >> 20, (4ll * psi) >> 20, kRoom >> 20);
  ASSERT_LE(7 * kRoom, 2 * states);  // the cap is more than 3.5 times smaller than the states
  ASSERT_LT(kRoom - (180ll << 20), 2ll * psi);  // no room for the bf16 parameters above the buffers
  constexpr unsigned kTimeout = 120;

  TrainOptions first = base;
  first.checkpoint_dir = ckpt;
  first.steps = 2;
  first.stop_after = 1;  // trains step 1, evaluates, checkpoints
  const zoe::test::ChildStatus a = zoe::test::run_in_child([&] { run_capped(first, dir / "first"); }, kTimeout);
  ASSERT_TRUE(a.exited && a.code == zoe::test::kChildOk) << "train + eval + save under the cap: " << a.describe();
  TrainOptions rest = first;
  rest.stop_after = 0;
  rest.resume = true;  // loads the checkpoint, trains step 2, evaluates, checkpoints again
  const zoe::test::ChildStatus b = zoe::test::run_in_child([&] { run_capped(rest, dir / "rest"); }, kTimeout);
  ASSERT_TRUE(b.exited && b.code == zoe::test::kChildOk) << "load + train + eval + save under the cap: " << b.describe();
  const auto la = lines(dir / "first"), lb = lines(dir / "rest");
  ASSERT_EQ(la.size(), 2u);  // 1 loss + val
  ASSERT_EQ(lb.size(), 3u);  // the resumed run's losses are the whole run's (2) + val
  EXPECT_EQ(lb[0], la[0]);
  for (const std::string& l : lb) {
    const double x = std::stod(l.starts_with("val ") ? l.substr(4) : l);
    EXPECT_TRUE(std::isfinite(x) && x > 0 && x < 2 * std::log(64.0)) << l;
  }

  // The control: the same training with the bf16 parameters in host memory (2 B per element,
  // 120 MiB) must not fit: a trainer whose memory grew with the model would fail like this.
  std::filesystem::remove_all(nvme);
  std::filesystem::create_directories(nvme);
  const TrainOptions resident = capped_run(nvme, zoe::OffloadDevice::none);
  const zoe::test::ChildStatus c = zoe::test::run_in_child([&] { run_capped(resident, dir / "resident"); }, kTimeout);
  EXPECT_TRUE(c.exited && c.code == zoe::test::kChildOutOfMemory)
      << "offload_param none under the same cap: " << c.describe() << " (expected out of memory)";
}

}  // namespace
}  // namespace gpt
