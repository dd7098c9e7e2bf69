// NVMe bytes per parameter per step: a real Engine (one rank on the host device, bf16 compute,
// ZeRO-3, optimizer states and parameter shards on NVMe) with `modules` modules of one
// parameter each; each micro-batch runs the forward, then the backward (a constant written into
// every gradient buffer), and each step ends with step() + synchronize(), so a step's record
// holds all of its update's I/O. Bytes are /proc/self/io's read_bytes / write_bytes of the
// process (every thread and io_uring worker; the tiers' files are O_DIRECT, so this is their
// traffic), from a step's start to its update's end, averaged over the measured steps, and
// compared with RankEstimate::nvme_traffic (src/config/estimate.hpp) for the same config: the
// bound is the formula, the ratio measured / formula. stage3_max_reuse_distance is 0, as for a
// model far larger than the reuse window, so each module is gathered in forward and again in
// backward. Reads can be below the formula: a shard still in one of the parameter tier's
// staging buffers when its backward starts is not read again.
#include "bench/offload/nvme_bytes_bench.hpp"

#include "bench/offload/bench_model.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "examples/gpt/proc_stats.hpp"
#include "kernels/half.hpp"
#include "src/config/estimate.hpp"
#include "zoe/engine.hpp"

namespace zoe::bench {

void run_nvme_bytes_case(const NvmeBytesBenchOptions& o, const Report& report) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.gradient_accumulation_steps = o.gas;
  c.zero_optimization.sub_group_size = o.sub_group_numel;
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard lives on NVMe
  // As a model far larger than the reuse window (ZeRO-Infinity's case): every module gathered
  // again in backward rather than kept from its forward.
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = o.nvme_dir;
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.nvme_path = o.nvme_dir;
  const std::int64_t per_module = std::max<std::int64_t>(16, o.psi / o.modules / 16 * 16);
  c.zero_optimization.offload_param.buffer_size = std::max(c.zero_optimization.offload_param.buffer_size, per_module);
  c.zoe.optimizer_threads = o.threads;
  c.zoe.host_memory_budget = o.host_memory_budget;

  Engine e(c, make_local_ranks(1)[0]);
  const std::vector<ModuleId> modules = add_bench_modules(e, per_module, o.modules);
  const std::int64_t psi = per_module * o.modules;
  const std::uint16_t grad_bits = kernels::f32_to_bf16(1e-3f);
  auto step = [&] {
    for (int mb = 0; mb < o.gas; ++mb) {
      for (ModuleId m : modules) ForwardScope f(e, m);
      for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
        ModuleTensors t = e.begin_backward(*it);
        std::fill_n(t.grads[0].as<std::uint16_t>(), t.grads[0].numel(), grad_bits);
        e.end_backward(*it);
      }
    }
    e.step();
    e.synchronize();
  };

  const std::string name = "nvme stage 3 psi=" + std::to_string(psi / 1'000'000) + "M modules=" +
                           std::to_string(o.modules) + " gas=" + std::to_string(o.gas) +
                           (o.host_memory_budget > 0 ? " host budget " + std::to_string(o.host_memory_budget >> 20) + " MiB" : "");
  report.text("# nvme-bytes %s: first step (construction) ...\n", name.c_str());
  step();
  std::int64_t read = 0, written = 0;
  for (int r = 0; r < o.reps; ++r) {
    const gpt::ProcIo before = gpt::ProcIo::now();
    step();
    const gpt::ProcIo after = gpt::ProcIo::now();
    read += after.read_bytes - before.read_bytes;
    written += after.write_bytes - before.write_bytes;
    report.text("#   step %d: read %.1f MB, written %.1f MB\n", r + 2, (after.read_bytes - before.read_bytes) / 1e6,
                (after.write_bytes - before.write_bytes) / 1e6);
  }
  estimate::ModelShape shape;
  shape.parameters = psi;
  shape.largest_layer = per_module;
  const estimate::RankEstimate::Traffic f = estimate::estimate_rank(shape, 1, c).nvme_traffic;
  const double P = static_cast<double>(psi), n = static_cast<double>(o.reps);
  const double rd = static_cast<double>(read) / n / P, wr = static_cast<double>(written) / n / P;
  const double frd = static_cast<double>(f.read) / P, fwr = static_cast<double>(f.written) / P;
  report.line(name + " NVMe read per parameter per step", rd, "B", frd, rd / frd, "(formula: zoe-estimate)");
  report.line(name + " NVMe written per parameter per step", wr, "B", fwr, wr / fwr, "(formula: zoe-estimate)");
  report.line(name + " NVMe moved per parameter per step", rd + wr, "B", frd + fwr, (rd + wr) / (frd + fwr),
              "(formula: zoe-estimate)");
}

}  // namespace zoe::bench
