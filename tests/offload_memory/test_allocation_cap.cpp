// Optimizer states on NVMe larger than the memory the process may allocate: the engine is
// built, initialised and trained entirely under the cap (world size 2, ranks as threads,
// stage 3) and gives bit for bit the parameters and losses of
// the same run with the states in host memory and no cap; with states in host memory the cap
// makes the run fail, so it is real.
//
// The cap is RLIMIT_DATA (soft limit), which Linux enforces on every mmap/brk/mprotect that
// grows private writable memory, so malloc returns null and new throws; it needs no
// privileges. A memory cgroup would need root and a writable cgroup tree (the only one on
// this machine belongs to its process supervisor, not to tests), and RLIMIT_AS also counts
// the 64 MiB PROT_NONE reservations of glibc's per-thread malloc arenas. Each run is a
// forked child (the parent stays single-threaded).
//
// When the cap starts: in the child, before anything of the training exists (ranks, Engine,
// parameters), at what the forked process holds then plus kBeyondStart; every step, the
// engine's construction and its first forward (where the initial states are written) run
// under it. The parameters are registered with initializers (a hash of (module, index)), so
// the engine materialises one sub-group of fp32 values at a time and writes it straight to
// NVMe: no whole-model array exists at any time. With M_MMAP_THRESHOLD at 1 MiB, the
// engine's gather and gradient buffers (2 MiB each here) go back to the kernel between uses,
// so the process holds its live bytes and little more. The cap is lifted after the last step
// to read the parameters out.
//
// On the host device a rank's "device" memory is this process's memory too: the bf16
// parameter shards (2 bytes/element over both ranks) count against the cap, as do the pinned
// staging buffers, the gather and gradient buffers and the threads' stacks, so the states
// (12 bytes/element, plus the fp32 gradient shard's 4) exceed it by less than 8x; here they
// are 3.3x the cap.
#include <gtest/gtest.h>
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "src/common/check.hpp"
#include "src/common/sanitizers.hpp"
#include "tests/core/test_net.hpp"
#include "tests/offload_memory/child_process.hpp"

using namespace zoe;
using zoe::test::ChildStatus;

namespace {

constexpr int kWorld = 2;
constexpr int kModules = 56;
// 56 Mi elements: 784 MiB of states and bf16 gradients (one micro-batch: kept as reduced)
constexpr std::int64_t kModuleNumel = 1 << 20;
constexpr int kSteps = 3;
// The cap: what the child holds when training starts (under 1 MiB) plus this, for the bf16
// parameter shards (112 MiB over both ranks), the pinned staging (13 MiB per rank), stage-3
// gather buffers (capped below at 2 prefetched and 3 live modules of 2 MiB per rank), a
// module's full gradient, the reduce-scatter and norm buffers, the threads' 2 MiB stacks and
// malloc's arenas: ~180 MiB at most was seen at module boundaries (with 48 modules), and 232 MiB
// keeps the states 3.3x the cap.
constexpr long long kBeyondStart = 232ll << 20;

Config config(OffloadDevice tier, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 1 << 18;  // 3 MiB of states: 3 staging buffers per rank
  c.zero_optimization.stage3_prefetch_bucket_size = 2 * kModuleNumel;
  c.zero_optimization.stage3_max_live_parameters = 3 * kModuleNumel;
  // One module per gradient bucket: the default (5e8 elements) would hold every module's
  // gradient until the end of backward, and their flattened copy, far past the cap.
  c.zero_optimization.reduce_bucket_size = kModuleNumel;
  c.zero_optimization.offload_optimizer.device = tier;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  return c;
}

float initial_value(int module, std::int64_t i) { return test::hashed_uniform(static_cast<std::uint64_t>(module), i, 0.5f); }
// Rank r's data pulls parameter element i towards this target (loss 0.5 (w - t)^2).
float target(std::int64_t i, int rank) { return static_cast<float>((i * 7 + rank * 3) % 17) * 0.02f - 0.1f; }

// What a child reports back (rank 0's view), in `dir`/info.
struct RunInfo {
  long long cap = 0;            // RLIMIT_DATA set when training starts (0 = none)
  long long vm_data_at_start = 0;
  long long vm_data_max = 0;    // largest VmData seen at module boundaries
  long long init_elements = 0;  // elements the initializers were asked for, both ranks
  long long nvme_states = 0;   // both ranks, bytes
  long long host_states = 0;
  long long host_buffers = 0;
  std::vector<double> losses;  // rank 0's loss per step
};

void write_info(const std::string& dir, const RunInfo& r) {
  std::ofstream f(dir + "/info");
  f << "cap " << r.cap << "\nvm_data_at_start " << r.vm_data_at_start << "\nvm_data_max " << r.vm_data_max
    << "\ninit_elements " << r.init_elements
    << "\nnvme_states " << r.nvme_states << "\nhost_states " << r.host_states << "\nhost_buffers " << r.host_buffers
    << "\n";
  f.precision(17);
  for (double l : r.losses) f << "loss " << l << "\n";
}

RunInfo read_info(const std::string& dir) {
  std::ifstream f(dir + "/info");
  RunInfo r;
  std::map<std::string, long long*> fields{{"cap", &r.cap},
                                           {"vm_data_at_start", &r.vm_data_at_start},
                                           {"init_elements", &r.init_elements},
                                           {"vm_data_max", &r.vm_data_max},
                                           {"nvme_states", &r.nvme_states},
                                           {"host_states", &r.host_states},
                                           {"host_buffers", &r.host_buffers}};
  std::string key;
  while (f >> key) {
    if (key == "loss") {
      double l;
      f >> l;
      r.losses.push_back(l);
    } else if (fields.count(key)) {
      f >> *fields[key];
    }
  }
  return r;
}

// `cap`: < 0 none; 0 = VmData when training starts + kBeyondStart; > 0 these bytes.
// Trains kSteps steps, writes `out`/params (rank 0's gathered fp32 parameters) and `out`/info.
// Throws OutOfMemoryError if an allocation failed on any rank (the others then stop at their
// next collective, after `comm_timeout_s`).
void train_in_child(OffloadDevice tier, long long cap, const std::string& nvme_dir, const std::string& out,
                    double comm_timeout_s) {
  // Blocks of 1 MiB and more are mapped on their own, so what the engine frees (buffers
  // between uses) goes back to the kernel instead of staying in malloc's arenas.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Threads made from here on (ranks, streams, I/O) get 2 MiB stacks instead of 8 MiB: every
  // stack counts against RLIMIT_DATA whole, and a dozen of them would dwarf what is measured.
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 2 << 20) != 0 ||
      pthread_setattr_default_np(&attr) != 0)
    throw std::runtime_error("cannot set the default thread stack size");
  pthread_attr_destroy(&attr);
  std::atomic<bool> out_of_memory{false};
  RunInfo info;
  info.vm_data_at_start = test::vm_data_bytes();
  info.cap = cap == 0 ? info.vm_data_at_start + kBeyondStart : std::max(cap, 0ll);
  std::fprintf(stderr, "child: VmData %lld MiB when training starts, cap %lld MiB\n", info.vm_data_at_start >> 20,
               cap < 0 ? -1ll : info.cap >> 20);
  if (cap >= 0 && !test::set_data_limit(static_cast<rlim_t>(info.cap)))
    throw std::runtime_error("setrlimit(RLIMIT_DATA) failed");
  std::barrier sync(kWorld);
  std::atomic<long long> vm_max{info.vm_data_at_start}, init_elements{0};
  auto sample = [&] {
    long long v = test::vm_data_bytes(), seen = vm_max.load();
    while (v > seen && !vm_max.compare_exchange_weak(seen, v)) {
    }
  };
  auto ranks = make_local_ranks(kWorld, comm_timeout_s);
  auto train_rank = [&](RankContext& ctx) {
    Engine e(config(tier, nvme_dir), ctx);
    std::vector<ModuleId> modules;
    std::vector<ParamId> params;
    for (int m = 0; m < kModules; ++m) {
      params.push_back(e.add_parameter("w" + std::to_string(m), {kModuleNumel},
                                       [m, &init_elements](std::int64_t offset, std::span<float> out) {
                                         init_elements += static_cast<long long>(out.size());
                                         for (std::size_t i = 0; i < out.size(); ++i)
                                           out[i] = initial_value(m, offset + static_cast<std::int64_t>(i));
                                       }));
      modules.push_back(e.add_module("m" + std::to_string(m), {params.back()}));
    }
    for (int step = 0; step < kSteps; ++step) {
      double loss = 0;
      for (int m = 0; m < kModules; ++m) {
        ModuleTensors t = e.begin_forward(modules[m]);
        for (std::int64_t i = 0; i < kModuleNumel; i += 4096) {  // a sample of the loss
          const double d = test::load(t.params[0], i) - target(i, ctx.rank);
          loss += 0.5 * d * d;
        }
        sample();
        e.end_forward(modules[m]);
      }
      for (int m = kModules - 1; m >= 0; --m) {
        ModuleTensors t = e.begin_backward(modules[m]);
        for (std::int64_t i = 0; i < kModuleNumel; ++i)
          test::add(t.grads[0], i, test::load(t.params[0], i) - target(i, ctx.rank));
        sample();
        e.end_backward(modules[m]);
      }
      StepResult r = e.step();
      if (r.skipped) throw std::runtime_error("step skipped");
      if (ctx.rank == 0) info.losses.push_back(loss);
    }
    e.synchronize();
    sample();
    sync.arrive_and_wait();
    if (ctx.rank == 0) test::set_data_limit(RLIM_INFINITY);  // reading the parameters out is not training
    sync.arrive_and_wait();
    const MemoryReport mem = e.memory_report();
    static std::mutex mu;
    {
      std::lock_guard lock(mu);
      info.nvme_states += mem.nvme_model_states;
      info.host_states += mem.host_model_states;
      info.host_buffers += mem.host_buffers;
    }
    std::ofstream f;
    if (ctx.rank == 0) f.open(out + "/params", std::ios::binary);
    for (ParamId p : params) {
      std::vector<float> v = e.gather_parameter(p);
      if (ctx.rank == 0) f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    }
    if (ctx.rank == 0 && !f) throw std::runtime_error("cannot write " + out + "/params");
  };
  try {
    run_ranks(ranks, [&](RankContext& ctx) {
      try {
        train_rank(ctx);
      } catch (const std::bad_alloc&) {
        out_of_memory = true;
        throw;
      } catch (const OutOfMemoryError&) {
        out_of_memory = true;
        throw;
      }
    });
  } catch (const std::exception& e) {
    if (out_of_memory) ZOE_THROW(OutOfMemoryError, "an allocation failed on a rank (first error: ", e.what(), ")");
    throw;
  }
  info.vm_data_max = vm_max.load();
  info.init_elements = init_elements.load();
  write_info(out, info);
}

bool files_equal(const std::string& a, const std::string& b) {
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 20), bb(1 << 20);
  while (true) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() || std::memcmp(ba.data(), bb.data(), static_cast<std::size_t>(fa.gcount())) != 0)
      return false;
    if (fa.gcount() == 0) return true;
  }
}

std::string make_dir(const std::string& base, const std::string& name) {
  const std::string d = base + "/" + name;
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace

TEST(AllocationCap, NvmeStatesLargerThanTheCapTrainAndEqualUncappedHostStatesBitwise) {
  // The cap is RLIMIT_DATA on VmData: a sanitizer's shadow memory (and ASan's quarantine) are
  // private writable mappings and count too, so the cap would measure the sanitizer, not zoe;
  // and an allocation refused under the cap aborts the process in the sanitizer's allocator
  // (which is how a TSan run "crashed in OptimizerStates::add": its host arrays are the first
  // allocation the cap refuses) instead of throwing the OutOfMemoryError this test expects.
  ZOE_SKIP_CAP_TEST_UNDER_SANITIZERS();
  const std::string base =
      (std::filesystem::temp_directory_path() / ("zoe-allocation-cap-" + std::to_string(getpid()))).string();
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() { std::filesystem::remove_all(dir); }
  } cleanup{base};
  const std::string nvme = make_dir(base, "nvme"), ref_out = make_dir(base, "ref"), cap_out = make_dir(base, "cap"),
                    fail_out = make_dir(base, "fail");
  constexpr unsigned kTimeout = 240;

  // Reference: states in host memory, no cap.
  ChildStatus ref = test::run_in_child([&] { train_in_child(OffloadDevice::cpu, -1, nvme, ref_out, 60.0); }, kTimeout);
  ASSERT_TRUE(ref.exited && ref.code == test::kChildOk) << "uncapped host-memory run " << ref.describe();
  const RunInfo ri = read_info(ref_out);

  // States on NVMe under the cap.
  ChildStatus capped = test::run_in_child([&] { train_in_child(OffloadDevice::nvme, 0, nvme, cap_out, 60.0); }, kTimeout);
  ASSERT_TRUE(capped.exited && capped.code == test::kChildOk) << "capped NVMe run " << capped.describe();
  const RunInfo ci = read_info(cap_out);
  // master, exp_avg, exp_avg_sq and the bf16 gradient: 14 bytes per element.
  const long long states = 14ll * kModules * kModuleNumel;
  std::printf("cap %lld MiB (VmData %lld MiB when training starts + %lld MiB); states on NVMe %lld MiB = "
              "%.2fx the cap; VmData at most %lld MiB capped, %lld MiB uncapped with host states\n",
              ci.cap >> 20, ci.vm_data_at_start >> 20, kBeyondStart >> 20, ci.nvme_states >> 20,
              static_cast<double>(ci.nvme_states) / static_cast<double>(ci.cap), ci.vm_data_max >> 20,
              ri.vm_data_max >> 20);
  EXPECT_EQ(ci.nvme_states, states);
  EXPECT_EQ(ci.host_states, 0);
  EXPECT_GE(ci.nvme_states, ci.cap * 3) << "the states should exceed the cap at least 3x";
  EXPECT_LE(ci.vm_data_max, ci.cap);
  EXPECT_EQ(ri.host_states, states);
  // Stage 3: the initializers were asked for each rank's shard only, every element once.
  EXPECT_EQ(ci.init_elements, static_cast<long long>(kModules) * kModuleNumel);

  // Bitwise the same training.
  EXPECT_TRUE(files_equal(ref_out + "/params", cap_out + "/params")) << "parameters differ";
  EXPECT_EQ(std::filesystem::file_size(cap_out + "/params"), static_cast<std::uintmax_t>(4 * kModules * kModuleNumel));
  ASSERT_EQ(ci.losses.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(ri.losses.size(), static_cast<std::size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(ci.losses[s], ri.losses[s]) << "step " << s;
  EXPECT_LT(ci.losses.back(), ci.losses.front()) << "the model did not train";
  EXPECT_TRUE(std::filesystem::is_empty(nvme)) << "NVMe files left behind";

  // The cap is real: the same run with its states in host memory fails under it.
  ChildStatus failed =
      test::run_in_child([&] { train_in_child(OffloadDevice::cpu, ci.cap, nvme, fail_out, 5.0); }, kTimeout);
  EXPECT_FALSE(failed.exited && failed.code == test::kChildOk) << "host-memory states trained under the cap";
  // An allocation fails on a rank's thread (kChildOutOfMemory) or, if it fails on a worker
  // thread, std::terminate aborts the child (SIGABRT).
  EXPECT_TRUE((failed.exited && failed.code == test::kChildOutOfMemory) || (!failed.exited && failed.signal == SIGABRT))
      << "host-memory run under the cap " << failed.describe();
}
