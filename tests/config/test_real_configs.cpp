// How many of the real DeepSpeed configs in tests/config/real (from DeepSpeed, DeepSpeedExamples,
// transformers and accelerate; see SOURCES) zoe-estimate reads, and what blocks the rest
// (printed by frequency). zoe-estimate passes estimate::auto_values for "auto" keys; here as
// `zoe-estimate --gpt 24,1024,50257,1024 -n 8 -c FILE` would (hidden size 1024, 8 ranks, micro
// batch 1, no accumulation, bf16). The floor is the count measured when the files were added:
// a regression below it fails.
#include <gtest/gtest.h>

#include <iostream>

#include "src/config/estimate.hpp"
#include "tests/config/real_configs.hpp"
#include "zoe/config.hpp"

namespace {

constexpr int kAcceptedFloor = 42;  // measured 2026-12-01 (42 of 109, with gather_16bit_weights_on_model_save honoured)

TEST(RealConfigs, AsZoeEstimateReadsThem) {
  zoe::estimate::AutoInputs in;
  in.world_size = 8;
  in.hidden_size = 1024;
  const zoe::Config::AutoValues autos = zoe::estimate::auto_values(in);
  zoe::test::ConfigTally tally;
  for (const std::string& path : zoe::test::real_configs(ZOE_REAL_CONFIG_DIR))
    tally.read([&] { zoe::Config::from_json_file(path, autos); });
  std::cout << tally.report("zoe-estimate");
  EXPECT_GE(tally.files, 100);
  EXPECT_GE(tally.accepted, kAcceptedFloor);
}

}  // namespace
