// Step + next forward: a real Engine (one rank as a thread on the host device, bf16 compute,
// AdamW, optimizer states offloaded to host memory or NVMe, zoe.overlap_step on) with
// `modules` modules of one parameter each. Gradients come from a backward pass that writes a
// constant into every module's gradient buffer. The synthetic forward holds each module for
// a fixed time (a sleep standing for GPU compute: it uses no CPU, as a kernel on the GPU
// would not) between begin_forward and end_forward.
//
// Per repetition: step alone (step() + synchronize()), forward alone (no update pending),
// and step() followed at once by the forward, which waits in begin_forward(k) only for
// module k's groups. Ideal overlap gives max(step, forward) + one module's forward, so the
// ratio (step + forward) / max(step, forward) has a floor of 1 + 1/modules when both are
// equally long (the default: forward length = step alone); target <= 1.10.
#include "bench/offload/bench_model.hpp"
#include "bench/offload/overlap_bench.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/half.hpp"
#include "src/device/device.hpp"
#include "src/offload/pinned_pool.hpp"
#include "zoe/engine.hpp"

namespace zoe::bench {
namespace {

// The device's copy rates between device memory and registered (pinned) host memory for a
// 256 MiB buffer, the bound the engine's staged transfers are measured against (on CUDA:
// pinned cudaMemcpyAsync), and the pageable rate beside it.
void transfer_rates(Device& device, const Report& report, const std::string& name) {
  const std::size_t bytes = std::size_t{256} << 20;
  void* dev = device.allocate(bytes);
  std::vector<std::byte> pageable(bytes, std::byte{1});
  offload::PinnedPoolOptions po;
  po.buffer_count = 1;
  po.buffer_bytes = bytes;
  po.register_fn = [&](void* p, std::size_t b) { return device.register_host_memory(p, b); };
  po.unregister_fn = [&](void* p) { device.unregister_host_memory(p); };
  offload::PinnedPool pool(po);
  offload::PinnedBuffer pinned = pool.acquire();
  auto stream = device.create_stream();
  auto rate = [&](void* dst, const void* src) {
    device.copy(dst, src, bytes, *stream);  // warm-up
    device.synchronize(*stream);
    const double t = seconds([&] {
      for (int i = 0; i < 4; ++i) device.copy(dst, src, bytes, *stream);
      device.synchronize(*stream);
    });
    return 4.0 * static_cast<double>(bytes) / t / 1e9;
  };
  const double h2d = rate(dev, pinned.data()), d2h = rate(pinned.data(), dev);
  const double h2d_pageable = rate(dev, pageable.data()), d2h_pageable = rate(pageable.data(), dev);
  report.line(name + " H2D pageable vs pinned copy", h2d_pageable, "GB/s", h2d, h2d_pageable / h2d);
  report.line(name + " D2H pageable vs pinned copy", d2h_pageable, "GB/s", d2h, d2h_pageable / d2h);
  device.deallocate(dev);
}

}  // namespace

void run_overlap_case(const OverlapBenchOptions& o, OffloadDevice tier, const Report& report) {
  Config c;
  c.zero_optimization.stage = o.stage;
  c.bf16.enabled = true;
  c.optimizer.weight_decay = 0.01;
  c.zero_optimization.sub_group_size = o.sub_group_numel;
  c.zero_optimization.offload_optimizer.device = tier;
  c.zero_optimization.offload_optimizer.nvme_path = o.nvme_dir;
  c.zero_optimization.offload_optimizer.buffer_count = o.buffer_count;
  c.zoe.optimizer_threads = o.threads;
  c.zoe.overlap_step = true;
  std::vector<RankContext> ranks;
  if (o.launcher) {
    ranks.push_back(rank_from_environment());
  } else {
    ranks = make_local_ranks(1);
  }
  Device& device = *ranks[0].device;
  Engine e(c, ranks[0]);

  const std::int64_t per_module = o.psi / o.modules / 16 * 16;
  const std::vector<ModuleId> modules = add_bench_modules(e, per_module, o.modules);
  const std::uint16_t grad_bits = kernels::f32_to_bf16(1e-3f);
  auto backward = [&] {
    for (int m = o.modules - 1; m >= 0; --m) {
      ModuleTensors t = e.begin_backward(modules[m]);
      std::fill_n(t.grads[0].as<std::uint16_t>(), t.grads[0].numel(), grad_bits);
      e.end_backward(modules[m]);
    }
    e.synchronize();  // the gradient reductions are not part of the step
  };
  std::chrono::duration<double> per_module_compute{0};
  // Where the overhead of step + forward over the forward alone goes: how long step() takes to
  // return, and how long the first module's compute waits for its groups' update.
  double step_return_s = 0, first_wait_s = 0;
  auto forward = [&] {
    for (std::size_t k = 0; k < modules.size(); ++k) {
      const ModuleId m = modules[k];
      const auto t0 = std::chrono::steady_clock::now();
      e.begin_forward(m);
      // The modelled kernel starts when the compute stream reaches it (on a GPU begin_forward
      // only queues the wait for the module's groups; on the host device this returns at once).
      device.synchronize(device.compute_stream());
      if (k == 0) first_wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::this_thread::sleep_for(per_module_compute);
      e.end_forward(m);
    }
  };
  auto step_alone = [&] {
    e.step();
    e.synchronize();
  };
  auto step_then_forward = [&] {
    step_return_s = seconds([&] { e.step(); });
    forward();  // its last begin_forward waited for the last group's update
  };

  const std::string name = std::string(tier == OffloadDevice::nvme ? "nvme" : "cpu") + " psi=" +
                           std::to_string(o.psi / 1'000'000) + "M modules=" + std::to_string(o.modules) + " stage " +
                           std::to_string(o.stage);
  report.text("# overlap %s: warm-up and calibration ...\n", name.c_str());
  forward();  // finalizes the engine (NVMe: writes the initial states)
  backward();
  const double calibration = seconds(step_alone);
  const double forward_s = o.forward_ms > 0 ? o.forward_ms / 1e3 : calibration;
  per_module_compute = std::chrono::duration<double>(forward_s / o.modules);
  report.text("#   step alone %.3f s; synthetic forward %.3f s (%d modules x %.1f ms)\n", calibration, forward_s,
              o.modules, per_module_compute.count() * 1e3);
  forward();
  backward();

  std::vector<double> steps, forwards, both, ratios, returns, first_waits;
  for (int r = 0; r < o.reps; ++r) {
    steps.push_back(seconds(step_alone));
    forwards.push_back(seconds(forward));
    backward();
    both.push_back(seconds(step_then_forward));
    returns.push_back(step_return_s);
    first_waits.push_back(first_wait_s);
    backward();
    ratios.push_back(both.back() / std::max(steps.back(), forwards.back()));
    report.text(
        "#   rep %d: step %.3f s, forward %.3f s, step+forward %.3f s, ratio %.3f (step() returned after %.1f ms, "
        "first module waited %.1f ms)\n",
        r, steps.back(), forwards.back(), both.back(), ratios.back(), returns.back() * 1e3, first_waits.back() * 1e3);
  }
  e.synchronize();
  const double ts = median(steps), tf = median(forwards), tb = median(both);
  report.line(name + " step+forward vs max", tb, "s", std::max(ts, tf), median(ratios),
              "(floor 1 + 1/modules with equal lengths)");
  // The overhead's two fixed parts, against one module's forward (the floor's 1/modules).
  report.line(name + " step() return vs one module's forward", median(returns), "s", per_module_compute.count(),
              median(returns) / per_module_compute.count());
  report.line(name + " first module's wait vs one module's forward", median(first_waits), "s",
              per_module_compute.count(), median(first_waits) / per_module_compute.count());
  // The part of the step hidden behind the forward: (step + forward - both) / step, 1 = all.
  const double hidden = std::clamp((ts + tf - tb) / ts, 0.0, 1.0);
  report.line(name + " step hidden behind forward", hidden, "frac", 1.0, hidden);
  transfer_rates(device, report, name);
}

}  // namespace zoe::bench
