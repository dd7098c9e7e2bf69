// zoe-device-bench: what the discrete host device's model costs and whether it overlaps.
//  - h2d / d2h: achieved GB/s of one copy of --mib MiB between pinned (registered) host memory
//    and the arena, against the modelled --gbps (ratio = achieved / modelled: 1 unless the
//    memmove itself is slower than the model, then the memmove's speed shows);
//  - duplex: one copy each way at once on two streams, against one copy alone (ratio ~1: the
//    two directions have their own engines);
//  - copy + kernel: a host-to-device copy on a copy stream while a modelled kernel of the same
//    length runs on the compute stream, against max(parts) (ratio ~1: they overlap).
//  - adam: the device optimizer's loop (Device::adam_step, host_ops::adam_range) on one thread,
//    its widest build (AVX-512 or AVX2, as the CPU allows) against the baseline x86-64 build in
//    the same run (ratio = how many times faster), for one tensor of --mib / 32 bytes elements
//    and for the same elements in tensors of 128 (thousands of small modules' groups, each in
//    an allocation of its own). Value: GB/s at 30 bytes per element (fp32 master, exp_avg,
//    exp_avg_sq read and written, fp32 gradient read, bf16 parameter written).
// --json: one {"bench":"device","case","value","unit","bound","ratio"} object per line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/device/host_device.hpp"
#include "src/device/host_elementwise.hpp"

namespace {
using Clock = std::chrono::steady_clock;

struct Options {
  double mib = 256;
  double gbps = 12;
  double latency_us = 10;
  int reps = 3;
  bool json = false;
};

void line(const Options& o, const std::string& name, double value, const std::string& unit, double bound) {
  const double ratio = bound > 0 ? value / bound : 0;
  if (o.json) {
    const nlohmann::json j{{"bench", "device"}, {"case", name},   {"value", value},
                           {"unit", unit},      {"bound", bound}, {"ratio", ratio}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-40s %10.3f %-4s bound %10.3f  ratio %6.3f\n", name.c_str(), value, unit.c_str(), bound, ratio);
  }
  std::fflush(stdout);
}

// Best of `reps` runs of fn (seconds).
template <class F>
double best_of(int reps, F&& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}
// The adam case (file comment): `elements` in tensors of `per_tensor` elements.
void bench_adam(const Options& o, std::size_t elements, std::size_t per_tensor, const std::string& name) {
  using namespace zoe;
  const std::size_t tensors = std::max<std::size_t>(1, elements / per_tensor);
  struct Tensor {
    std::vector<float> p, m, v, g;
    std::vector<std::uint16_t> out;
  };
  std::vector<Tensor> ts(tensors);
  for (Tensor& t : ts) {
    t.p.assign(per_tensor, 0.5f);
    t.m.assign(per_tensor, 0.01f);
    t.v.assign(per_tensor, 0.02f);
    t.g.assign(per_tensor, 0.1f);
    t.out.assign(per_tensor, 0);
  }
  const kernels::AdamCoeffs c = kernels::adam_coeffs(1e-4, 0.9, 0.999, 1e-8, 0.01, true, 1, 1.0f);
  auto run = [&](host_ops::AdamIsa isa) {
    return best_of(std::max(o.reps, 3), [&] {
      for (Tensor& t : ts)
        host_ops::adam_range(isa, c, t.p.data(), t.m.data(), t.v.data(), t.g.data(), DType::f32, t.out.data(),
                             DType::bf16, per_tensor);
    });
  };
  const host_ops::AdamIsa widest = host_ops::best_adam_isa();
  run(widest);  // untimed: first touch
  const double gb = static_cast<double>(tensors * per_tensor) * 30e-9;
  const double base = run(host_ops::AdamIsa::baseline), wide = run(widest);
  line(o, name, gb / wide, "GB/s", gb / base);
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zoe-device-bench: the discrete host device's copy engines"};
  app.add_option("--mib", o.mib, "MiB per copy")->check(CLI::PositiveNumber);
  app.add_option("--gbps", o.gbps, "modelled bandwidth per direction, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--latency-us", o.latency_us, "modelled latency per copy, microseconds")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", o.reps, "repetitions (best is reported)")->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);

  using namespace zoe;
  HostDevice d(HostDeviceOptions{
      .memory = HostMemoryModel::discrete, .copy_gbps = o.gbps, .copy_latency_us = o.latency_us});
  const auto bytes = static_cast<std::size_t>(o.mib * 1024 * 1024);
  std::vector<std::byte> up(bytes, std::byte{1}), down(bytes);
  d.register_host_memory(up.data(), bytes);
  d.register_host_memory(down.data(), bytes);
  void* a = d.allocate(bytes);
  void* b = d.allocate(bytes);
  auto s1 = d.create_stream();
  auto s2 = d.create_stream();
  const double modelled_s = CopyModel{o.gbps, o.latency_us}.duration(bytes).count() * 1e-9;
  const double gb = static_cast<double>(bytes) * 1e-9;

  // Untimed: fault in the arena blocks and the host buffers once (first touch is slow here).
  d.copy(a, up.data(), bytes, *s1);
  d.copy(b, up.data(), bytes, *s1);
  d.copy(down.data(), b, bytes, *s1);
  d.synchronize(*s1);
  const double h2d = best_of(o.reps, [&] {
    d.copy(a, up.data(), bytes, *s1);
    d.synchronize(*s1);
  });
  line(o, "discrete h2d", gb / h2d, "GB/s", gb / modelled_s);
  const double d2h = best_of(o.reps, [&] {
    d.copy(down.data(), b, bytes, *s2);
    d.synchronize(*s2);
  });
  line(o, "discrete d2h", gb / d2h, "GB/s", gb / modelled_s);
  const double duplex = best_of(o.reps, [&] {
    d.copy(a, up.data(), bytes, *s1);
    d.copy(down.data(), b, bytes, *s2);
    d.synchronize(*s1);
    d.synchronize(*s2);
  });
  line(o, "discrete duplex vs one copy", duplex, "s", std::max(h2d, d2h));
  const double kernel_s = h2d;
  const double both = best_of(o.reps, [&] {
    d.copy(a, up.data(), bytes, *s1);
    d.model_kernel(d.compute_stream(), kernel_s);
    d.synchronize(*s1);
    d.synchronize(d.compute_stream());
  });
  line(o, "discrete copy + kernel vs max", both, "s", std::max(h2d, kernel_s));
  const std::size_t adam_elements = bytes / 32;
  bench_adam(o, adam_elements, adam_elements, "adam one tensor vs baseline build");
  bench_adam(o, adam_elements, 128, "adam tensors of 128 vs baseline build");
  std::fprintf(stderr, "pageable copies: %lld (pinned buffers: expect 0)\n",
               static_cast<long long>(d.pageable_copy_count()));
  d.deallocate(a);
  d.deallocate(b);
  d.unregister_host_memory(up.data());
  d.unregister_host_memory(down.data());
  return d.pageable_copy_count() == 0 ? 0 : 1;
}
