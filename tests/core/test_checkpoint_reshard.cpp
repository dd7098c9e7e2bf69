// Reshard on load: a checkpoint saved at world size N and stage S loads at any M and S' (and
// other sub_group_size / offload settings). At the same world size the continued run equals
// the uninterrupted run of the new settings bitwise (stages and offload are bitwise equal);
// at another world size the gradients' reduction order differs, so after 5 more steps the
// parameters are within 1e-6 relative of the uninterrupted run (fp32 compute here: bf16
// gradients would round differently by design).
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
using zoe::test::checkpoint_config;
using zoe::test::checkpoint_run;
using zoe::test::Params;

namespace {
struct Setting {
  int world, stage;
  OffloadDevice offload;
  std::int64_t sub_group_size;
};
std::string name(const Setting& s) {
  return "world " + std::to_string(s.world) + " stage " + std::to_string(s.stage) + " offload " +
         std::to_string(static_cast<int>(s.offload)) + " sub_group_size " + std::to_string(s.sub_group_size);
}
Config config(const Setting& s, const std::string& dir, bool bf16) {
  Config c = checkpoint_config(s.stage, s.offload, dir, bf16);
  c.zero_optimization.sub_group_size = s.sub_group_size;
  return c;
}
}  // namespace

TEST(CheckpointReshard, SameWorldOtherStageOrOffloadContinuesBitwise) {
  const std::string dir = zoe::test::temp_dir("ckpt-reshard-same");
  const Setting saved{2, 3, OffloadDevice::nvme, 64};
  checkpoint_run(config(saved, dir, true), 2, 0, 5, "", dir + "/ckpt");
  for (const Setting& to : {Setting{2, 1, OffloadDevice::none, 64}, Setting{2, 0, OffloadDevice::none, 48},
                            Setting{2, 2, OffloadDevice::cpu, 32}, Setting{2, 3, OffloadDevice::none, 1000}}) {
    const Params straight = checkpoint_run(config(to, dir, true), 2, 0, 10, "", "");
    const Params resumed = checkpoint_run(config(to, dir, true), 2, 5, 10, dir + "/ckpt", "");
    zoe::test::expect_bitwise(straight, resumed, "saved at " + name(saved) + ", loaded at " + name(to));
  }
  std::filesystem::remove_all(dir);
}

TEST(CheckpointReshard, OtherWorldSizeWithin1e6After5Steps) {
  const std::string dir = zoe::test::temp_dir("ckpt-reshard-world");
  for (const auto& [from, to] : {std::pair{Setting{2, 3, OffloadDevice::none, 64}, Setting{1, 3, OffloadDevice::none, 64}},
                                 std::pair{Setting{2, 2, OffloadDevice::nvme, 64}, Setting{4, 3, OffloadDevice::cpu, 32}},
                                 std::pair{Setting{4, 1, OffloadDevice::none, 64}, Setting{2, 0, OffloadDevice::none, 64}},
                                 std::pair{Setting{1, 0, OffloadDevice::none, 64}, Setting{4, 2, OffloadDevice::none, 16}}}) {
    const Params original = checkpoint_run(config(from, dir, false), from.world, 0, 10, "", "");
    const Params saved = checkpoint_run(config(from, dir, false), from.world, 0, 5, "", dir + "/ckpt");
    // The load itself is exact: the master weights come back bit for bit at the new layout.
    const Params loaded = checkpoint_run(config(to, dir, false), to.world, 5, 5, dir + "/ckpt", "");
    zoe::test::expect_bitwise(saved, loaded, "loaded at " + name(to));
    const Params resumed = checkpoint_run(config(to, dir, false), to.world, 5, 10, dir + "/ckpt", "");
    // The same 5 steps without any checkpoint at the new world size: how far the reduction
    // order alone moves the run.
    const Params other_world = checkpoint_run(config(to, dir, false), to.world, 0, 10, "", "");
    const double rel = zoe::test::norm_relative(original, resumed);
    std::printf("saved at %s, loaded at %s: after 5 steps |resumed - original| / |original| = %.3g, largest "
                "element %.3g; the uninterrupted run at world %d differs from the original by %.3g\n",
                name(from).c_str(), name(to).c_str(), rel, zoe::test::max_relative(original, resumed), to.world,
                zoe::test::norm_relative(original, other_world));
    EXPECT_LE(rel, 1e-6) << "saved at " << name(from) << ", loaded at " << name(to);
    // Loading changes the values: the resumed run is not the fresh one.
    const Params fresh = checkpoint_run(config(to, dir, false), to.world, 0, 5, "", "");
    EXPECT_GT(zoe::test::max_relative(fresh, resumed), 1e-3);
  }
  std::filesystem::remove_all(dir);
}
