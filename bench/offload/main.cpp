// zoe-offload-bench: ZeRO-Offload / ZeRO-Infinity optimizer step figures (issue 6).
//  (a) the optimizer step with states in host memory (cpu) and on NVMe for several model
//      sizes Ψ, next to its parts measured alone in the same run (step_bench.cpp);
//  (b) Engine::step() followed by the next forward, against each alone (overlap_bench.cpp);
//  (c) the whole CPU step (gradient add, norm, clip, AdamW, bf16 copy) with host-memory states
//      against the bound of its bytes (cpu_step_bench.cpp);
//  (d) construction with the states and parameters on NVMe against max(initializer alone,
//      writes alone) (construction_bench.cpp; not in the default cases);
//  (e) the NVMe bytes a ZeRO-3 step moves per parameter against zoe-estimate's formula
//      (nvme_bytes_bench.cpp; not in the default cases).
// Cases run one at a time and free their memory before the next (the 1B host case holds
// 16 GB of states and fp32 gradients). NVMe files go to a fresh directory under
// --nvme-path, removed at the end.
// --json: one {"bench","case","value","unit","bound","ratio"} object per line on stdout;
// progress and the load average on stderr.
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/offload/construction_bench.hpp"
#include "bench/offload/cpu_step_bench.hpp"
#include "bench/offload/nvme_bytes_bench.hpp"
#include "bench/offload/overlap_bench.hpp"
#include "bench/offload/step_bench.hpp"
#include "bench/offload/report.hpp"
#include "src/common/check.hpp"

namespace {

// A fresh directory under `parent`, removed (with everything in it) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& parent) {
    std::filesystem::create_directories(parent);
    std::string tmpl = (std::filesystem::path(parent) / "zoe-offload-bench-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) ZOE_THROW_ERRNO(errno, "cannot create a directory under --nvme-path ", parent);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

zoe::OffloadDevice tier_of(const std::string& s) {
  return s == "nvme" ? zoe::OffloadDevice::nvme : zoe::OffloadDevice::cpu;
}

}  // namespace

int main(int argc, char** argv) {
  zoe::bench::StepBenchOptions so;
  zoe::bench::OverlapBenchOptions oo;
  zoe::bench::CpuStepBenchOptions co;
  zoe::bench::ConstructionBenchOptions no;
  zoe::bench::NvmeBytesBenchOptions bo;
  double nvme_bytes_psi_m = 40;
  double construction_psi_m = 200;
  double cpu_step_psi_m = 100;
  std::vector<std::string> cases{"step", "overlap", "cpu-step"}, tiers{"cpu", "nvme"}, overlap_tiers{"cpu", "nvme"};
  std::vector<double> psi_m{100, 500, 1000};
  double group_m = 100, sub_group_m = 10, overlap_psi_m = 100;
  std::string nvme_parent = std::filesystem::temp_directory_path().string();
  bool json = false;
  int reps = 3;

  CLI::App app{"zoe-offload-bench: optimizer step over host/NVMe states vs its parts; step + next forward overlap"};
  app.add_option("--cases", cases, "which parts to run")
      ->check(CLI::IsMember({"step", "overlap", "cpu-step", "construction", "nvme-bytes"}));
  app.add_option("--nvme-bytes-psi", nvme_bytes_psi_m,
                 "(nvme-bytes) model size in millions of elements (about 38 bytes each moved per step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nvme-bytes-gas", bo.gas, "(nvme-bytes) gradient_accumulation_steps")->check(CLI::Range(1, 64));
  app.add_option("--host-memory-budget", bo.host_memory_budget,
                 "(nvme-bytes) zoe.host_memory_budget in bytes of the modes that have one (0: theirs, 2 or 4 bytes per parameter)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--construction-psi", construction_psi_m,
                 "(construction) model size in millions of elements (18 bytes each on NVMe, written twice)")
      ->check(CLI::PositiveNumber);
  app.add_option("--construction-modules", no.modules, "(construction) modules")->check(CLI::Range(1, 1024));
  app.add_option("--cpu-step-psi", cpu_step_psi_m, "(cpu-step) model size in millions of elements")
      ->check(CLI::PositiveNumber);
  app.add_flag("--thread-cpu", co.thread_cpu,
               "(cpu-step) with --threads 1: time by the thread's CPU clock (a loaded machine's other processes "
               "left out)");
  app.add_option("--psi", psi_m, "(step) model sizes in millions of elements")->check(CLI::PositiveNumber);
  app.add_option("--tiers", tiers, "(step) where the states live")->check(CLI::IsMember({"cpu", "nvme"}));
  app.add_option("--group", group_m, "(step) millions of elements per group (module shard)")
      ->check(CLI::PositiveNumber);
  app.add_option("--sub-group", sub_group_m, "millions of elements per sub-group (sub_group_size)")
      ->check(CLI::PositiveNumber);
  app.add_option("--buffer-count", so.buffer_count, "offload_optimizer.buffer_count")->check(CLI::Range(2, 64));
  app.add_option("--threads", so.threads, "CpuAdam threads (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", reps, "timed repetitions per case (medians printed)")->check(CLI::PositiveNumber);
  app.add_option("--overlap-psi", overlap_psi_m, "(overlap) model size in millions of elements")
      ->check(CLI::PositiveNumber);
  app.add_option("--overlap-tiers", overlap_tiers, "(overlap) where the states live")
      ->check(CLI::IsMember({"cpu", "nvme"}));
  app.add_option("--modules", oo.modules, "(overlap) modules")->check(CLI::Range(1, 1024));
  app.add_option("--stage", oo.stage, "(overlap) ZeRO stage")->check(CLI::Range(1, 3));
  app.add_option("--forward-ms", oo.forward_ms, "(overlap) synthetic forward length; 0 = the step alone's")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--launcher", oo.launcher,
               "(overlap) one rank from RANK/WORLD_SIZE/... (a CUDA build: the GPU) instead of the host device");
  app.add_option("--nvme-path", nvme_parent, "directory under which the NVMe files' directory is made");
  app.add_flag("--json", json, "one JSON object per line: {bench, case, value, unit, bound, ratio}");
  CLI11_PARSE(app, argc, argv);

  auto elements = [](double millions) { return static_cast<std::int64_t>(millions * 1e6) / 16 * 16; };
  so.group_numel = elements(group_m);
  so.sub_group_numel = std::max<std::int64_t>(16, elements(sub_group_m));
  so.reps = reps;
  oo.psi = elements(overlap_psi_m);
  oo.sub_group_numel = so.sub_group_numel;
  oo.buffer_count = so.buffer_count;
  oo.threads = so.threads;
  oo.reps = reps;
  co.psi = elements(cpu_step_psi_m);
  co.sub_group_numel = so.sub_group_numel;
  co.threads = so.threads;
  co.reps = std::max(reps, 5);
  no.psi = elements(construction_psi_m);
  no.sub_group_numel = so.sub_group_numel;
  no.buffer_count = so.buffer_count;
  no.reps = reps;
  bo.psi = elements(nvme_bytes_psi_m);
  bo.sub_group_numel = so.sub_group_numel;
  bo.threads = so.threads;
  bo.reps = reps;

  zoe::bench::Report report(json);
  try {
    TempDir dir(nvme_parent);
    so.nvme_dir = oo.nvme_dir = no.nvme_dir = bo.nvme_dir = dir.path();
    report.text("# zoe-offload-bench: load average %s (2 shared cores); NVMe files in %s\n",
                zoe::bench::load_average().c_str(), dir.path().c_str());
    auto has = [&](const std::string& c) { return std::find(cases.begin(), cases.end(), c) != cases.end(); };
    if (has("step"))
      for (double p : psi_m)
        for (const std::string& t : tiers) zoe::bench::run_step_case(so, tier_of(t), elements(p), report);
    if (has("overlap"))
      for (const std::string& t : overlap_tiers) zoe::bench::run_overlap_case(oo, tier_of(t), report);
    if (has("cpu-step")) zoe::bench::run_cpu_step_case(co, report);
    if (has("construction")) zoe::bench::run_construction_case(no, report);
    if (has("nvme-bytes")) zoe::bench::run_nvme_bytes_case(bo, report);
    report.text("# load average at the end: %s\n", zoe::bench::load_average().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zoe-offload-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
