// zoe-estimate's JSON and table carry the plan's numbers.
#include <gtest/gtest.h>

#include "src/config/estimate_report.hpp"
#include "tests/estimate/estimate_test_util.hpp"

namespace {
using namespace zoe::estimate;

Plan paper_plan() {
  Cluster c;
  c.world_size = 64;
  c.gpus_per_node = 8;
  c.gpu_bytes = 32'000'000'000;
  c.host_bytes_per_node = 512'000'000'000;
  return plan({7'500'000'000, 0}, c, mixed_precision_knobs());
}

TEST(EstimateReport, JsonHasEveryRowInBytes) {
  const Plan p = paper_plan();
  const auto config_row = estimate_rank({7'500'000'000, 0}, 64, zoe::estimate::testing::knobs(3));
  // Round trip through text, as a consumer reads it.
  const auto j = nlohmann::json::parse(plan_to_json(p, config_row).dump());
  ASSERT_EQ(j["rows"].size(), 13u);
  EXPECT_EQ(j["model"]["parameters"], 7'500'000'000);
  EXPECT_TRUE(j["model"]["largest_layer"].is_null());
  EXPECT_EQ(j["rows"][0]["model_states"]["total"], 120'000'000'000);
  EXPECT_EQ(j["rows"][1]["model_states"]["device"], 31'406'250'000);
  EXPECT_EQ(j["rows"][4]["model_states"]["total"], 16'640'625'000);
  EXPECT_EQ(j["rows"][7]["model_states"]["total"], 1'875'000'000);
  EXPECT_EQ(j["rows"][7]["traffic_elements"], 22'500'000'000);
  EXPECT_EQ(j["rows"][8]["optimizer_states"]["host"], 12 * 117'187'500);
  EXPECT_EQ(j["rows"][8]["offload_optimizer"], "cpu");
  EXPECT_EQ(j["recommendation"]["label"], "stage 2");
  EXPECT_EQ(j["recommendation"]["stage"], 2);
  EXPECT_EQ(j["recommendation"]["offload_optimizer"], "none");
  EXPECT_EQ(j["why"], p.why);
  EXPECT_EQ(j["config"]["stage"], 3);
  EXPECT_EQ(j["config"]["model_states"]["total"], 1'875'000'000);
}

TEST(EstimateReport, TableShowsPaperNumbersInGB) {
  const std::string t = plan_to_table(paper_plan(), std::nullopt, false);
  EXPECT_NE(t.find("7,500,000,000 parameters"), std::string::npos) << t;
  for (const char* s : {"120.00", "31.41", "16.64", "1.88", "* stage 2", "recommendation: stage 2"})
    EXPECT_NE(t.find(s), std::string::npos) << s << " not in\n" << t;
  EXPECT_NE(plan_to_table(paper_plan(), std::nullopt, true).find("111.76"), std::string::npos);  // 120e9 / 2^30
}
}  // namespace
