// offload::OptimizerStates construction: add(numel) registers sizes, finalize() opens the
// tier, write_initial() sets master = the given values and exp_avg = exp_avg_sq = gradient = 0
// (read back through read_all and for_each) on both tiers; the nvme tier keeps nothing of
// the states in host memory; using the states before every sub-group has its initial values
// is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/offload/optimizer_states.hpp"
#include "zoe/error.hpp"

using namespace zoe;

namespace {

std::string temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("zoe-states-init-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

offload::OptimizerStatesOptions options(OffloadDevice tier, const std::string& dir) {
  offload::OptimizerStatesOptions o;
  o.device = tier;
  o.nvme_path = dir;
  o.buffer_count = 2;  // fewer staging buffers than sub-groups: write-behind must reclaim
  return o;
}

float master_value(int id, std::int64_t i) { return static_cast<float>(id * 1000 + i) * 0.5f - 7.0f; }

}  // namespace

TEST(OptimizerStatesInit, WriteInitialSetsMasterAndZeroMomentsOnBothTiers) {
  const std::string dir = temp_dir();
  const std::vector<std::int64_t> sizes = {1000, 0, 4096, 17, 2500};
  for (OffloadDevice tier : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    SCOPED_TRACE(tier == OffloadDevice::cpu ? "cpu" : "nvme");
    {
      offload::OptimizerStates states(options(tier, dir));
      for (std::int64_t n : sizes) states.add(n);
      states.finalize();
      if (tier == OffloadDevice::nvme) {
        EXPECT_EQ(states.host_state_bytes(), 0);
        EXPECT_EQ(states.nvme_state_bytes(), 16 * (1000 + 4096 + 17 + 2500));
      }
      for (int id = 0; id < static_cast<int>(sizes.size()); ++id) {
        std::vector<float> m(static_cast<std::size_t>(sizes[id]));
        for (std::size_t i = 0; i < m.size(); ++i) m[i] = master_value(id, static_cast<std::int64_t>(i));
        states.write_initial(id, m);
        m.assign(m.size(), 123.0f);  // the values were taken by the call
      }
      states.finish_initial();
      for (int id = 0; id < static_cast<int>(sizes.size()); ++id) {
        const auto n = static_cast<std::size_t>(sizes[id]);
        std::vector<float> all(3 * n, -1.0f);
        states.read_all(id, all.data());
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], master_value(id, static_cast<std::int64_t>(i)));
        for (std::size_t i = n; i < 3 * n; ++i) ASSERT_EQ(all[i], 0.0f);
      }
      std::vector<int> ids = {0, 1, 2, 3, 4};
      int seen = 0;
      states.for_each(ids, [&](const offload::SubGroupStates& s) {
        EXPECT_EQ(s.id, ids[seen++]);
        for (std::int64_t i = 0; i < s.numel; ++i) {
          ASSERT_EQ(s.master[i], master_value(s.id, i));
          ASSERT_EQ(static_cast<const float*>(s.grad)[i], 0.0f);
        }
      });
      EXPECT_EQ(seen, 5);
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "files left behind";
  }
  std::filesystem::remove_all(dir);
}

TEST(OptimizerStatesInit, UseBeforeEveryInitialValueIsRefused) {
  const std::string dir = temp_dir();
  for (OffloadDevice tier : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    offload::OptimizerStates states(options(tier, dir));
    states.add(64);
    states.add(64);
    std::vector<float> m(64, 1.0f);
    EXPECT_THROW(states.write_initial(0, m), UsageError);  // before finalize
    states.finalize();
    EXPECT_THROW(states.add(8), UsageError);
    EXPECT_THROW(states.write_initial(0, std::vector<float>(63)), UsageError);
    states.write_initial(0, m);
    std::vector<float> out(64);
    EXPECT_THROW(states.read_master(0, out.data()), UsageError);  // sub-group 1 has no values yet
    EXPECT_THROW(states.for_each({0}, [](const offload::SubGroupStates&) {}), UsageError);
    states.write_initial(1, m);
    states.read_master(1, out.data());
    EXPECT_EQ(out, m);
  }
  std::filesystem::remove_all(dir);
}
