// The ZeRO paper's numbers (arXiv 1910.02054): §5 example and Table 1. The paper's GB are 1e9
// bytes; expected bytes below are worked out by hand from (2+2+K)Ψ, K = 12.
#include <gtest/gtest.h>

#include "zoe/error.hpp"

#include <cmath>

#include "tests/estimate/estimate_test_util.hpp"

namespace {
using namespace zoe::estimate;
using zoe::estimate::testing::knobs;

std::int64_t states(std::int64_t psi, int nd, int stage) {
  return estimate_rank({psi, 0}, nd, knobs(stage)).model_states.total();
}

double gb(std::int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

TEST(EstimatePaper, SevenPointFiveBillionOnSixtyFourRanks) {
  const std::int64_t psi = 7'500'000'000;  // shard: 117,187,500 elements
  EXPECT_EQ(states(psi, 64, 0), 120'000'000'000);  // 16Ψ
  EXPECT_EQ(states(psi, 64, 1), 31'406'250'000);   // 4Ψ + 12Ψ/64
  EXPECT_EQ(states(psi, 64, 2), 16'640'625'000);   // 2Ψ + 14Ψ/64
  EXPECT_EQ(states(psi, 64, 3), 1'875'000'000);    // 16Ψ/64
  // As the paper prints them: 120 / 31.4 / 16.6 / 1.9 GB.
  EXPECT_EQ(std::round(gb(states(psi, 64, 0)) * 10) / 10, 120.0);
  EXPECT_EQ(std::round(gb(states(psi, 64, 1)) * 10) / 10, 31.4);
  EXPECT_EQ(std::round(gb(states(psi, 64, 2)) * 10) / 10, 16.6);
  EXPECT_EQ(std::round(gb(states(psi, 64, 3)) * 10) / 10, 1.9);
  // Without offload everything is on the device.
  const auto r = estimate_rank({psi, 0}, 64, knobs(2));
  EXPECT_EQ(r.model_states.device, r.model_states.total());
  EXPECT_EQ(r.params.device, 15'000'000'000);
  EXPECT_EQ(r.gradients.device, 234'375'000);
  EXPECT_EQ(r.optimizer_states.device, 1'406'250'000);
}

TEST(EstimatePaper, Table1Rows) {
  // Table 1 of the paper: per-device GB of P_os / P_os+g / P_os+g+p as printed there (values
  // of 100 and more are printed as truncated integers, smaller ones rounded).
  struct Row { double psi; int nd; double os, os_g, os_g_p; };
  const Row rows[] = {
      {7.5e9, 1, 120, 120, 120},       {7.5e9, 4, 52.5, 41.3, 30},      {7.5e9, 16, 35.6, 21.6, 7.5},
      {7.5e9, 64, 31.4, 16.6, 1.88},   {7.5e9, 256, 30.4, 15.4, 0.47},  {7.5e9, 1024, 30.1, 15.1, 0.12},
      {128e9, 4, 896, 704, 512},       {128e9, 64, 536, 284, 32},       {128e9, 1024, 513, 257, 2},
      {1e12, 16, 4750, 2875, 1000},    {1e12, 64, 4187, 2218, 250},     {1e12, 1024, 4011, 2013, 15.6}};
  auto matches = [](double exact, double printed) {
    if (printed >= 100) return exact >= printed && exact < printed + 1;  // truncated
    const double half_unit = printed >= 1 ? 0.05 : 0.005;
    return std::abs(exact - printed) <= half_unit + 1e-9;
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(::testing::Message() << r.psi << " params, Nd " << r.nd);
    const auto psi = static_cast<std::int64_t>(r.psi);
    EXPECT_PRED2(matches, gb(states(psi, r.nd, 1)), r.os);
    EXPECT_PRED2(matches, gb(states(psi, r.nd, 2)), r.os_g);
    EXPECT_PRED2(matches, gb(states(psi, r.nd, 3)), r.os_g_p);
  }
}

TEST(EstimatePaper, OneSeventyFiveBillionOnSixtyFourGpus) {
  const std::int64_t psi = 175'000'000'000;  // GPT-3; shard 2,734,375,000 elements
  EXPECT_EQ(states(psi, 64, 0), 2'800'000'000'000);
  EXPECT_EQ(states(psi, 64, 1), 732'812'500'000);
  EXPECT_EQ(states(psi, 64, 2), 388'281'250'000);
  EXPECT_EQ(states(psi, 64, 3), 43'750'000'000);
  // Stage 3, optimizer and parameters on the host: 2 + 12 + 2 bytes per shard element there,
  // nothing on the GPU (ZeRO-Infinity's placement, which keeps a 4-byte fp32 gradient; with one
  // micro-batch per step zoe keeps the 16-bit reduced shard, which widens to the same values).
  const auto host = estimate_rank({psi, 0}, 64, knobs(3, zoe::OffloadDevice::cpu, zoe::OffloadDevice::cpu));
  EXPECT_EQ(host.model_states.device, 0);
  EXPECT_EQ(host.model_states.host, 16 * 2'734'375'000);
  // Optimizer on NVMe: 12 + 2 bytes per shard element on disk; the parameter shard on the GPU.
  const auto nvme = estimate_rank({psi, 0}, 64, knobs(3, zoe::OffloadDevice::nvme));
  EXPECT_EQ(nvme.model_states.nvme, 14 * 2'734'375'000);
  EXPECT_EQ(nvme.model_states.host, 0);
  EXPECT_EQ(nvme.model_states.device, 5'468'750'000);
}

TEST(EstimatePaper, TrafficIsTwoPsiOrThreePsi) {
  const std::int64_t psi = 7'500'000'000;
  for (int stage = 0; stage <= 3; ++stage) {
    const auto r = estimate_rank({psi, 0}, 64, knobs(stage));
    EXPECT_EQ(r.traffic_elements, (stage == 3 ? 3 : 2) * psi) << "stage " << stage;
    // A ring sends (Nd-1)/Nd of it, 2 bytes per element.
    EXPECT_EQ(r.traffic_bytes_sent, r.traffic_elements * 2 / 64 * 63) << "stage " << stage;
  }
  EXPECT_EQ(estimate_rank({psi, 0}, 1, knobs(1)).traffic_bytes_sent, 0);  // one rank sends nothing
}

TEST(EstimatePaper, FrozenParametersCostOnlyTheirComputeDtypeBytes) {
  // Fine-tuning 0.5B of a 7.5B model on 64 ranks: Ψ = 7.5e9 (s = 117,187,500), Ψt = 5e8
  // (t = 7,812,500). Parameters stay 2Ψ (2s at stage 3); gradients and states follow Ψt.
  const std::int64_t psi = 7'500'000'000, psi_t = 500'000'000, s = 117'187'500, t = 7'812'500;
  const std::int64_t expect[4] = {2 * psi + 2 * psi_t + 12 * psi_t, 2 * psi + 2 * psi_t + 12 * t,
                                  2 * psi + 2 * t + 12 * t, 2 * s + 2 * t + 12 * t};
  for (int stage = 0; stage <= 3; ++stage) {
    const auto r = estimate_rank({psi, 0, psi - psi_t}, 64, knobs(stage));
    EXPECT_EQ(r.model_states.device, expect[stage]) << "stage " << stage;
    EXPECT_EQ(r.trainable_shard_elements, t);
    EXPECT_EQ(r.traffic_elements, stage == 3 ? 2 * psi + psi_t : 2 * psi_t) << "stage " << stage;
  }
  // The optimizer on the CPU: 14 bytes per trainable shard element there (states and the 16-bit
  // gradient of one micro-batch).
  EXPECT_EQ(estimate_rank({psi, 0, psi - psi_t}, 64, knobs(3, zoe::OffloadDevice::cpu)).model_states.host, 14 * t);
  EXPECT_THROW(estimate_rank({psi, 0, psi + 1}, 64, knobs(0)), zoe::ConfigError);
  EXPECT_THROW(estimate_rank({psi, 0, -1}, 64, knobs(0)), zoe::ConfigError);
}
}  // namespace
