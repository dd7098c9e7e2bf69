// zoe-zero-bench: per-rank model-state bytes and elements sent per step, measured on real
// engines (host device, ranks as threads) for stages 0-3 and Nd = 1, 2, 4, 8, next to the
// ZeRO paper's formulas (arXiv 1910.02054 §5, §7): memory 16Ψ, 4Ψ+12Ψ/Nd, 2Ψ+14Ψ/Nd,
// 16Ψ/Nd bytes (bf16 compute, fp32 Adam states); traffic 2Ψ(Nd-1)/Nd elements for stages
// 0-2 and 3Ψ(Nd-1)/Nd for stage 3. ratio = measured / formula (1.00 = the claim holds).
// Usage: zoe-zero-bench [--json] [--max-world N]
#include <cstdio>
#include <cstring>
#include <string>

#include "tests/core/test_net.hpp"

using namespace zoe;

int main(int argc, char** argv) {
  bool json = false;
  int max_world = 8;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--max-world") && i + 1 < argc) max_world = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--json] [--max-world N]\n", argv[0]);
      return 2;
    }
  }
  // Widths are multiples of 16 * 8 so no world size up to 8 pads: Ψ = live elements.
  test::NetSpec spec{{128, 128, 128, 128}, false, 1};
  const double psi = 3 * (128 * 128 + 128);
  if (!json) {
    std::printf("Ψ = %.0f parameters, bf16 compute, fp32 Adam states; per rank, last of 2 steps\n", psi);
    std::printf("%-6s %-3s %14s %14s %6s %14s %14s %6s\n", "stage", "Nd", "state bytes", "formula", "ratio",
                "elems sent", "formula", "ratio");
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world = 1; world <= max_world; world *= 2) {
      Config c;
      c.zero_optimization.stage = stage;
      c.bf16.enabled = true;
      c.zoe.optimizer_threads = 1;
      c.zero_optimization.stage3_param_persistence_threshold = 0;
      c.zero_optimization.stage3_max_reuse_distance = 0;
      test::RunResult r = test::train(c, spec, world, 2, 8 * world);
      const double nd = world;
      const double mem[4] = {16 * psi, 4 * psi + 12 * psi / nd, 2 * psi + 14 * psi / nd, 16 * psi / nd};
      const double traffic = (stage == 3 ? 3 : 2) * psi * (nd - 1) / nd;
      const double got_mem = static_cast<double>(r.memory[0].device_model_states);
      const double got_traffic = static_cast<double>(r.traffic[0].elements_sent);
      const std::string tag = "stage" + std::to_string(stage) + "_nd" + std::to_string(world);
      if (json) {
        std::printf("{\"bench\":\"zero\",\"case\":\"%s_memory\",\"value\":%.0f,\"unit\":\"bytes\",\"bound\":%.0f,"
                    "\"ratio\":%.4f}\n", tag.c_str(), got_mem, mem[stage], got_mem / mem[stage]);
        std::printf("{\"bench\":\"zero\",\"case\":\"%s_traffic\",\"value\":%.0f,\"unit\":\"elements\",\"bound\":%.0f,"
                    "\"ratio\":%.4f}\n", tag.c_str(), got_traffic, traffic, traffic > 0 ? got_traffic / traffic : 1.0);
      } else {
        std::printf("%-6d %-3d %14.0f %14.0f %6.3f %14.0f %14.0f %6.3f\n", stage, world, got_mem, mem[stage],
                    got_mem / mem[stage], got_traffic, traffic, traffic > 0 ? got_traffic / traffic : 1.0);
      }
    }
  }
  return 0;
}
