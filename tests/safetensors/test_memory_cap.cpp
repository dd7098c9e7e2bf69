// Import and export of a safetensors file larger than the memory the process may allocate:
// a forked child, under RLIMIT_DATA (see tests/offload_memory/test_allocation_cap.cpp for why
// that limit and how it is set) from before anything of the engine exists, builds a ZeRO-3
// engine (2 ranks as threads, optimizer states and bf16 parameter shards on NVMe) whose
// parameters come from file A through SafetensorsFile initializers, then exports them to
// file B. B equals A byte for byte (the fp32 master weights are the file's values, the header
// the same), while A is larger than the cap: neither direction ever holds the model in memory.
// With the optimizer states in host memory instead, the same child fails under the same cap,
// so the cap is real.
#include <gtest/gtest.h>
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/safetensors.hpp"
#include "tests/core/test_net.hpp"
#include "tests/offload_memory/child_process.hpp"
#include "zoe/safetensors.hpp"

using namespace zoe;

namespace {

constexpr int kModules = 48;
constexpr std::int64_t kModuleNumel = 1 << 20;  // 48 Mi elements: a 192 MiB fp32 file
// What the child may allocate beyond what it holds when it starts: the pinned staging of both
// tiers, the export's two sub-groups, the threads' 2 MiB stacks, io_uring rings, malloc's arenas.
constexpr long long kBeyondStart = 128ll << 20;

Config config(OffloadDevice states, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 1 << 18;
  c.zero_optimization.offload_optimizer.device = states;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.nvme_path = dir;
  c.zero_optimization.offload_param.buffer_count = 2;
  c.zero_optimization.offload_param.buffer_size = kModuleNumel / 2;
  return c;
}

void write_model(const std::string& path) {
  std::vector<io::SafetensorsTensorSpec> specs;
  for (int m = 0; m < kModules; ++m) specs.push_back({"w" + std::to_string(m), "F32", {kModuleNumel}});
  io::SafetensorsWriter w(path, specs);
  std::vector<float> chunk(1 << 16);
  for (int m = 0; m < kModules; ++m)
    for (std::int64_t at = 0; at < kModuleNumel; at += static_cast<std::int64_t>(chunk.size())) {
      for (std::size_t i = 0; i < chunk.size(); ++i)
        chunk[i] = test::hashed_uniform(static_cast<std::uint64_t>(m), at + static_cast<std::int64_t>(i), 0.5f);
      w.write(chunk.data(), chunk.size() * sizeof(float));
    }
  w.commit();
}

// In the child: import `from`, export `to`, all under the cap.
void import_export(OffloadDevice states, const std::string& from, const std::string& to, const std::string& nvme,
                   double comm_timeout_s) {
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 2 << 20) != 0 ||
      pthread_setattr_default_np(&attr) != 0)
    throw std::runtime_error("cannot set the default thread stack size");
  pthread_attr_destroy(&attr);
  const long long start = test::vm_data_bytes();
  std::fprintf(stderr, "child: VmData %lld MiB at start, cap %lld MiB\n", start >> 20, (start + kBeyondStart) >> 20);
  if (!test::set_data_limit(static_cast<rlim_t>(start + kBeyondStart))) throw std::runtime_error("setrlimit failed");
  auto file = SafetensorsFile::open(from);
  auto ranks = make_local_ranks(2, comm_timeout_s);
  std::atomic<bool> out_of_memory{false};
  try {
    run_ranks(ranks, [&](RankContext& ctx) {
      try {
        Engine e(config(states, nvme), ctx);
        for (const SafetensorsTensor& t : file->tensors()) {
          ParamId p = e.add_parameter(t.name, t.shape, file->initializer(t.name, t.shape));
          e.add_module("m" + t.name, {p});
        }
        e.export_safetensors(to);
      } catch (const std::bad_alloc&) {
        out_of_memory = true;
        throw;
      } catch (const OutOfMemoryError&) {
        out_of_memory = true;
        throw;
      }
    });
  } catch (const std::exception& e) {
    // The other rank may fail later with a timeout: the allocation failure is the cause.
    if (out_of_memory) throw OutOfMemoryError(std::string("an allocation failed: ") + e.what(), __FILE__, __LINE__);
    throw;
  }
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

TEST(SafetensorsMemoryCap, AFileLargerThanTheCapImportsAndExportsBitwise) {
  ZOE_SKIP_CAP_TEST_UNDER_SANITIZERS();
  const std::string dir = test::temp_dir("st-cap");
  const std::string a = dir + "/a.safetensors", b = dir + "/b.safetensors";
  std::filesystem::create_directories(dir + "/nvme");
  write_model(a);
  const auto file_bytes = static_cast<long long>(std::filesystem::file_size(a));
  ASSERT_GT(file_bytes, kBeyondStart) << "the file must be larger than the cap";

  const test::ChildStatus ok =
      test::run_in_child([&] { import_export(OffloadDevice::nvme, a, b, dir + "/nvme", 60.0); }, 300);
  ASSERT_TRUE(ok.exited && ok.code == test::kChildOk) << "import + export under the cap: " << ok.describe();
  EXPECT_TRUE(files_equal(a, b)) << "the export differs from the imported file";

  // The control: states in host memory (16 bytes per element) cannot fit under the cap.
  const test::ChildStatus capped =
      test::run_in_child([&] { import_export(OffloadDevice::cpu, a, dir + "/c.safetensors", dir + "/nvme", 5.0); }, 300);
  EXPECT_TRUE(capped.exited && capped.code == test::kChildOutOfMemory) << capped.describe();
  EXPECT_FALSE(std::filesystem::exists(dir + "/c.safetensors"));
  std::filesystem::remove_all(dir);
}

}  // namespace
