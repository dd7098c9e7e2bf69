// zoe-estimate: per-rank model-state memory of plain DP and ZeRO stages 1-3 with offload
// none/cpu/nvme for a model on a cluster, the traffic per step, and which configuration to
// use. The arithmetic lives in src/config/estimate.hpp (tested); this file is the CLI.
#include <CLI/CLI.hpp>

#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/host_memory.hpp"
#include "src/config/estimate.hpp"
#include "src/config/estimate_report.hpp"
#include "src/config/model_size.hpp"
#include "src/config/quantity.hpp"
#include "zoe/config.hpp"
#include "zoe/error.hpp"

namespace {
using namespace zoe::estimate;

// "48,1600,50257,1024" -> layers, hidden, vocab, sequence length.
ModelShape parse_gpt(const std::string& text, std::int64_t* hidden) {
  std::vector<std::int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(parse_count(item, "--gpt"));
  if (v.size() != 4)
    throw zoe::ConfigError("--gpt", "expected LAYERS,HIDDEN,VOCAB,SEQ (4 numbers), got '" + text + "'", __FILE__, __LINE__);
  if (hidden) *hidden = v[1];
  return gpt_model(v[0], v[1], v[2], v[3]);
}
}  // namespace

// CLI11's PositiveNumber prints its range as 0.000000 to 1.797...e308 in 309 digits.
const CLI::Range kPositiveInt(1, std::numeric_limits<int>::max());
const CLI::Range kPositiveCount(std::int64_t{1}, std::numeric_limits<std::int64_t>::max());

int main(int argc, char** argv) {
  CLI::App app{
      "zoe-estimate: model-state memory per rank for plain data parallelism and ZeRO stages 1-3 with\n"
      "optimizer/parameter offload to CPU or NVMe (ZeRO, arXiv 1910.02054: (2+2+K)Psi, K = 12),\n"
      "traffic per step, and a recommended configuration."};
  std::string params, gpt, largest, next_largest, frozen, gpu_mem, host_mem, nvme = "0", config_path;
  std::vector<std::string> safetensors;
  int world_size = 1, gpus_per_node = 8;
  AutoInputs auto_inputs;  // a config's "auto" keys (Hugging Face's trainer values)
  std::int64_t hidden_size = 0;
  double gpu_headroom = 0.2, host_headroom = 0.1;
  bool json = false, decimal = false;

  auto* model = app.add_option_group("model", "what is trained (exactly one)");
  model->add_option("-p,--params", params, "parameter count: 7.5e9, 7.5B, 175B, 350M");
  model->add_option("--safetensors", safetensors, "safetensors file(s); their headers' tensor elements are summed");
  model->add_option("--gpt", gpt, "GPT-2-style model: LAYERS,HIDDEN,VOCAB,SEQ (e.g. 48,1600,50257,1024)");
  model->require_option(1);
  app.add_option("--largest-layer", largest,
                 "parameters of the largest module (default: from --gpt, the largest safetensors tensor, else unknown)");
  app.add_option("--next-largest-layer", next_largest,
                 "parameters of the second largest module (default: from --gpt, a block; else taken as the largest)");
  app.add_option("--frozen", frozen,
                 "how many of the parameters are frozen (fine-tuning: no gradients, no optimizer states), e.g. 6.5B");
  app.add_option("-n,--world-size", world_size, "data-parallel ranks (GPUs in all)")->check(kPositiveInt);
  app.add_option("-g,--gpus-per-node", gpus_per_node, "GPUs per node")->check(kPositiveInt)->capture_default_str();
  app.add_option("--gpu-memory", gpu_mem, "memory per GPU: 80GB, 40GiB")->required();
  app.add_option("--host-memory", host_mem, "host memory per node: 1TB, 512GiB")->required();
  app.add_option("--nvme", nvme, "free NVMe per node: 3.84TB (default 0: no NVMe)")->capture_default_str();
  app.add_option("--gpu-headroom", gpu_headroom, "fraction of GPU memory kept for activations")->capture_default_str();
  app.add_option("--host-headroom", host_headroom, "fraction of host memory kept for the OS and data")->capture_default_str();
  app.add_option("-c,--config", config_path,
                 "DeepSpeed-style JSON config: buffer knobs and compute dtype from it, and its own estimate");
  // What a Hugging Face trainer would fill into the config's "auto" keys.
  app.add_option("--micro-batch", auto_inputs.micro_batch, "\"auto\" train_micro_batch_size_per_gpu")
      ->check(kPositiveInt)->capture_default_str();
  app.add_option("--grad-accum", auto_inputs.gradient_accumulation, "\"auto\" gradient_accumulation_steps")
      ->check(kPositiveInt)->capture_default_str();
  app.add_option("--precision", auto_inputs.precision, "\"auto\" fp16.enabled / bf16.enabled: bf16, fp16 or fp32")
      ->capture_default_str();
  app.add_option("--hidden-size", hidden_size,
                 "\"auto\" bucket sizes and persistence threshold from the hidden size (default: from --gpt)")
      ->check(kPositiveCount);
  app.add_flag("--json", json, "print one JSON object instead of the table");
  app.add_flag("--gb", decimal, "sizes in GB (1e9 bytes, the ZeRO paper's unit) instead of GiB");
  CLI11_PARSE(app, argc, argv);

  try {
    ModelShape shape;
    if (!params.empty()) {
      shape.parameters = parse_count(params, "--params");
    } else if (!gpt.empty()) {
      shape = parse_gpt(gpt, hidden_size == 0 ? &hidden_size : nullptr);
    } else {
      const auto s = read_safetensors_headers(safetensors);
      shape.parameters = s.elements;
      shape.largest_layer = s.largest_tensor;
    }
    if (!largest.empty()) shape.largest_layer = parse_count(largest, "--largest-layer");
    if (!next_largest.empty()) shape.next_largest_layer = parse_count(next_largest, "--next-largest-layer");
    if (!frozen.empty()) {
      shape.frozen_parameters = parse_count(frozen, "--frozen");
      if (shape.frozen_parameters > shape.parameters)
        throw zoe::ConfigError("--frozen", "is " + std::to_string(shape.frozen_parameters) +
                                               ", more than the model's " + std::to_string(shape.parameters) +
                                               " parameters", __FILE__, __LINE__);
    }

    Cluster cluster;
    cluster.world_size = world_size;
    cluster.gpus_per_node = gpus_per_node;
    cluster.gpu_bytes = parse_bytes(gpu_mem, "--gpu-memory");
    cluster.host_bytes_per_node = parse_bytes(host_mem, "--host-memory");
    cluster.nvme_bytes_per_node = parse_bytes(nvme, "--nvme");
    cluster.gpu_headroom = gpu_headroom;
    cluster.host_headroom = host_headroom;

    zoe::Config knobs = mixed_precision_knobs();
    std::optional<RankEstimate> config_row;
    if (!config_path.empty()) {
      auto_inputs.world_size = world_size;
      if (hidden_size > 0) auto_inputs.hidden_size = hidden_size;
      knobs = zoe::Config::from_json_file(config_path, auto_values(auto_inputs));
      knobs.check_batch_size(world_size);  // as DeepSpeed: train_batch_size = micro x accumulation x ranks
      if (knobs.zoe.host_memory_budget == zoe::ZoeConfig::kHostMemoryBudgetAuto) {
        // "auto" as the engine resolves it on a node whose MemAvailable is the usable host
        // memory (--host-memory less --host-headroom). A run logs the MemAvailable it saw:
        // --host-memory <that> --host-headroom 0 predicts that run.
        const auto usable = static_cast<std::int64_t>(static_cast<double>(cluster.host_bytes_per_node) * (1.0 - cluster.host_headroom));
        const zoe::HostMemoryReading node{cluster.host_bytes_per_node, usable, std::nullopt};
        if (!json) std::cout << "zoe.host_memory_budget \"auto\": " << zoe::describe_spare_host_memory(node, cluster.ranks_per_node()) << "\n";
        knobs = with_host_memory_budget_resolved(knobs, node.available, node.total, cluster.ranks_per_node());
      }
      config_row = estimate_rank(shape, world_size, knobs);
    }
    const Plan p = plan(shape, cluster, knobs, !decimal);
    if (json) std::cout << plan_to_json(p, config_row).dump() << "\n";
    else std::cout << plan_to_table(p, config_row, !decimal);
    return 0;
  } catch (const zoe::Error& e) {
    std::cerr << "zoe-estimate: " << e.message() << "\n";
    if (e.message().find("AutoValues::hidden_size") != std::string::npos)
      std::cerr << "zoe-estimate: give --hidden-size (or --gpt) for those \"auto\" keys\n";
    return 2;
  }
}
