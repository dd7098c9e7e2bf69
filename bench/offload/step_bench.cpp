// The optimizer step with states on host (cpu) or NVMe, driven through core::UpdatePipeline
// exactly as the engine's step does (one for_each over every group's sub-groups, AdamW on the
// tier's fp32 gradient on the pipeline's worker, the bf16 updated weights staged in pinned
// memory and copied to the host device's memory, each group's completion awaited in forward
// order as the next forward would), not through a whole Engine: an Engine
// of 1B elements also holds its fp32 initial values (4 bytes/element) and the bf16
// parameters and gradients until its first forward, ~20 GB at 1B, more than this shared
// 23 GB machine can spare. The step's other work (gradient norm, one small all-reduce) is
// not part of this pipeline and not timed here; the gradients are put in the tier once
// (add_grad, as the backward does) before the timed steps.
//
// Parts, each measured alone in the same run, alternating order between repetitions:
//  - NVMe read + write: the same for_each over the same sub-groups with an empty callback
//    (read-ahead and write-behind through the same pinned staging buffers, nothing to hide).
//  - AdamW: CpuAdam over one group's states and fp32 gradient held in ordinary memory (four
//    fp32 arrays), over the same sub-group ranges, for every group.
// Printed: step seconds against max(parts) seconds (target step / max(parts) <= 1.10), and
// the rates (GB/s) the step achieved for each part against the part alone.
// Bytes: NVMe 28 bytes/element (master, exp_avg, exp_avg_sq and the fp32 gradient read, the
// first three written back); AdamW 30 bytes/element (16 read + 12 written + 2 bf16 weights).
#include "bench/offload/step_bench.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/half.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/core/update/update_pipeline.hpp"
#include "src/device/host_device.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {
namespace {

struct GroupLayout {
  std::vector<int> ids;                  // sub-group ids in the states, in order
  std::vector<std::int64_t> begin;       // element offset of each sub-group in its group
  std::vector<std::int64_t> numel;       // elements of each sub-group
};

std::string millions(std::int64_t n) {
  return n % 1'000'000 == 0 ? std::to_string(n / 1'000'000) + "M" : std::to_string(n);
}

}  // namespace

void run_step_case(const StepBenchOptions& o, OffloadDevice tier, std::int64_t psi, const Report& report) {
  const bool nvme = tier == OffloadDevice::nvme;
  offload::OptimizerStatesOptions so;
  so.device = tier;
  so.nvme_path = o.nvme_dir;
  so.buffer_count = o.buffer_count;
  so.aio = o.aio;
  offload::OptimizerStates states(so);

  // Groups of group_numel elements (the last one shorter), cut into sub-groups as
  // EngineImpl::finalize cuts a group's shard.
  const std::int64_t sub = o.sub_group_numel;
  std::vector<float> initial(static_cast<std::size_t>(std::min(sub, psi)));
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
  std::vector<GroupLayout> groups;
  std::int64_t largest_group = 0;
  for (std::int64_t g0 = 0; g0 < psi; g0 += o.group_numel) {
    const std::int64_t gn = std::min(o.group_numel, psi - g0);
    largest_group = std::max(largest_group, gn);
    GroupLayout g;
    for (std::int64_t c = 0; c < gn; c += sub) {
      const std::int64_t n = std::min(sub, gn - c);
      g.ids.push_back(states.add(n));
      g.begin.push_back(c);
      g.numel.push_back(n);
    }
    groups.push_back(std::move(g));
  }
  const std::string name = std::string(nvme ? "nvme" : "cpu") + " psi=" + millions(psi);
  report.text("# %s: %zu groups, %zu sub-groups of <= %s elements%s\n", name.c_str(), groups.size(), states.count(),
              millions(sub).c_str(), nvme ? ", writing the initial states ..." : "");
  const double t_init = seconds([&] {
    states.finalize();
    for (std::size_t id = 0; id < states.count(); ++id) {
      const int i = static_cast<int>(id);
      states.write_initial(i, std::span<const float>(initial.data(), static_cast<std::size_t>(states.numel(i))));
    }
    states.finish_initial();
  });
  if (nvme) report.text("#   initial write of %.2f GB: %.1f s\n", 16.0 * static_cast<double>(psi) / 1e9, t_init);

  // One group's bf16 reduced gradient (the backward's input to add_grad) and bf16 weight
  // output, reused for every group (the engine has each group's own; the bytes moved per
  // element are the same).
  const auto gsize = static_cast<std::size_t>(largest_group);
  AlignedBuffer grad(gsize * 2), out(gsize * 2);
  auto* g16 = grad.as<std::uint16_t>().data();
  for (std::size_t i = 0; i < gsize; ++i)
    g16[i] = kernels::f32_to_bf16((static_cast<float>(i % 997) - 498.0f) * 1e-4f + 1e-5f);
  std::memset(out.data(), 0, out.size());
  for (const GroupLayout& g : groups)
    for (std::size_t k = 0; k < g.ids.size(); ++k) states.add_grad(g.ids[k], g16 + g.begin[k], DType::bf16, true, true);
  // AdamW alone: one group's states and fp32 gradient in ordinary memory.
  AlignedBuffer master(gsize * 4), exp_avg(gsize * 4), exp_avg_sq(gsize * 4), grad32(gsize * 4);
  for (std::size_t i = 0; i < gsize; ++i) {
    master.as<float>()[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
    grad32.as<float>()[i] = kernels::bf16_to_f32(g16[i]);
  }
  std::memset(exp_avg.data(), 0, exp_avg.size());
  std::memset(exp_avg_sq.data(), 0, exp_avg_sq.size());

  optim::CpuAdam adam(o.threads);
  optim::AdamHyper h;
  h.weight_decay = 0.01;
  std::int64_t t_step = 0, t_alone = 0;
  // The step is the engine's: core::UpdatePipeline over every group's sub-groups in one pass
  // (reads run ahead across groups), new bf16 weights staged in pinned memory and copied to
  // the (host) device's memory on the pipeline's copy stream, each group's GroupDone awaited.
  HostDevice device;
  void* device_out = device.allocate(gsize * 2);
  core::UpdatePipelineOptions po;
  po.out_dtype = DType::bf16;
  po.staging_bytes = static_cast<std::size_t>(std::min(sub, largest_group)) * 2;
  core::UpdatePipeline pipeline(device, &states, adam, po);
  auto step = [&] {
    ++t_step;
    std::vector<core::PipelineGroup> parts;
    std::vector<std::shared_ptr<core::GroupDone>> done;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const GroupLayout& g = groups[gi];
      core::PipelineGroup pg;
      pg.index = static_cast<int>(gi);
      pg.out = device_out;
      for (std::size_t k = 0; k < g.ids.size(); ++k)
        pg.subgroups.push_back(core::PipelineSubGroup{g.ids[k], g.numel[k], static_cast<std::size_t>(g.begin[k]) * 2});
      pg.done = std::make_shared<core::GroupDone>();
      done.push_back(pg.done);
      parts.push_back(std::move(pg));
    }
    pipeline.start(std::move(parts), core::UpdatePlan{h, t_step, 1.0f});
    for (auto& d : done) d->wait();  // as the next forward would, group by group
    pipeline.finish();
  };
  std::vector<int> all_ids;
  for (const GroupLayout& g : groups) all_ids.insert(all_ids.end(), g.ids.begin(), g.ids.end());
  auto io_alone = [&] { states.for_each(all_ids, [](const offload::SubGroupStates&) {}); };
  auto adam_alone = [&] {
    ++t_alone;
    float *p = master.as<float>().data(), *m = exp_avg.as<float>().data(), *v = exp_avg_sq.as<float>().data();
    const float* gr = grad32.as<float>().data();
    for (const GroupLayout& g : groups)
      for (std::size_t k = 0; k < g.ids.size(); ++k) {
        const auto c = static_cast<std::size_t>(g.begin[k]);
        adam.step(h, t_alone, 1.0f, p + c, m + c, v + c, gr + c, DType::f32, static_cast<std::size_t>(g.numel[k]),
                  out.as<std::uint16_t>().data() + c, DType::bf16);
      }
  };
  adam_alone();  // warm-up: starts the arena's threads
  // NVMe: one untimed step, so the first timed one does not meet the disk still absorbing the
  // initial write (seen: 14 s then 7.4 s at 1B).
  if (nvme) step();

  std::vector<double> t_steps, t_ios, t_adams, ratios;
  for (int r = 0; r < o.reps; ++r) {
    double ts = 0, ti = 0, ta = 0;
    if (r % 2 == 0) {
      ts = seconds(step);
      if (nvme) ti = seconds(io_alone);
      ta = seconds(adam_alone);
    } else {
      ta = seconds(adam_alone);
      if (nvme) ti = seconds(io_alone);
      ts = seconds(step);
    }
    t_steps.push_back(ts);
    t_ios.push_back(ti);
    t_adams.push_back(ta);
    ratios.push_back(ts / std::max(ti, ta));
    const std::string io = nvme ? "NVMe read+write alone " + std::to_string(ti) + " s, " : "";
    report.text("#   rep %d: step %.3f s, %sAdamW alone %.3f s, step / max(parts) %.3f\n", r, ts, io.c_str(), ta,
                ratios.back());
  }
  device.deallocate(device_out);
  const double ts = median(t_steps), ti = median(t_ios), ta = median(t_adams);
  const double io_bytes = 28.0 * static_cast<double>(psi), adam_bytes = 30.0 * static_cast<double>(psi);
  report.line(name + " step vs max(parts)", ts, "s", std::max(ti, ta), median(ratios),
              nvme ? "(parts: NVMe r+w alone, AdamW alone)" : "(part: AdamW alone)");
  if (nvme)
    report.line(name + " NVMe r+w in step vs alone", io_bytes / ts / 1e9, "GB/s", io_bytes / ti / 1e9, ti / ts);
  report.line(name + " AdamW in step vs alone", adam_bytes / ts / 1e9, "GB/s", adam_bytes / ta / 1e9, ta / ts);
}

}  // namespace zoe::bench
