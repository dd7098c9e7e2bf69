#include "src/config/estimate_report.hpp"

#include <cstdio>
#include <sstream>

namespace zoe::estimate {
namespace {
using OJson = nlohmann::ordered_json;

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

OJson tiers(const TierBytes& t) {
  return {{"device", t.device}, {"host", t.host}, {"nvme", t.nvme}, {"total", t.total()}};
}

std::string number(std::int64_t bytes, bool binary) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (binary ? 1073741824.0 : 1e9));
  return buf;
}

std::string with_commas(std::int64_t v) {
  std::string s = std::to_string(v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string pad(const std::string& s, std::size_t width, bool left) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}
}  // namespace

OJson rank_to_json(const RankEstimate& r) {
  return {{"stage", r.stage},
          {"offload_optimizer", device_name(r.offload_optimizer)},
          {"offload_param", device_name(r.offload_param)},
          {"compute_bytes", r.compute_bytes},
          {"shard_elements", r.shard_elements},
          {"trainable_shard_elements", r.trainable_shard_elements},
          {"params", tiers(r.params)},
          {"gradients", tiers(r.gradients)},
          {"optimizer_states", tiers(r.optimizer_states)},
          {"model_states", tiers(r.model_states)},
          {"buffers", tiers(r.buffers)},
          {"traffic_elements", r.traffic_elements},
          {"traffic_bytes_sent", r.traffic_bytes_sent},
          {"nvme_read_bytes_per_step", r.nvme_traffic.read},
          {"nvme_written_bytes_per_step", r.nvme_traffic.written}};
}

OJson plan_to_json(const Plan& plan, const std::optional<RankEstimate>& config_row) {
  const Cluster& c = plan.cluster;
  OJson j;
  j["model"] = {{"parameters", plan.model.parameters},
                {"frozen_parameters", plan.model.frozen_parameters},
                {"largest_layer", plan.model.largest_layer > 0 ? OJson(plan.model.largest_layer) : OJson(nullptr)},
                {"next_largest_layer",
                 plan.model.next_largest_layer > 0 ? OJson(plan.model.next_largest_layer) : OJson(nullptr)}};
  j["cluster"] = {{"world_size", c.world_size},
                  {"gpus_per_node", c.gpus_per_node},
                  {"gpu_bytes", c.gpu_bytes},
                  {"usable_gpu_bytes", c.usable_gpu_bytes()},
                  {"host_bytes_per_node", c.host_bytes_per_node},
                  {"usable_host_bytes_per_node", c.usable_host_bytes()},
                  {"nvme_bytes_per_node", c.nvme_bytes_per_node}};
  OJson rows = OJson::array();
  for (const auto& row : plan.rows) {
    OJson r = {{"label", row.label}};
    r.update(rank_to_json(row.rank));
    r["device_bytes"] = row.device_bytes;
    r["host_bytes_per_node"] = row.host_bytes_per_node;
    r["nvme_bytes_per_node"] = row.nvme_bytes_per_node;
    r["fits"] = row.fits();
    r["fits_device"] = row.fits_device;
    r["fits_host"] = row.fits_host;
    r["fits_nvme"] = row.fits_nvme;
    r["shortfall"] = row.shortfall;
    rows.push_back(std::move(r));
  }
  j["rows"] = std::move(rows);
  if (plan.recommended) {
    const auto& row = plan.rows[*plan.recommended];
    j["recommendation"] = {{"row", *plan.recommended},
                           {"label", row.label},
                           {"stage", row.rank.stage},
                           {"offload_optimizer", device_name(row.rank.offload_optimizer)},
                           {"offload_param", device_name(row.rank.offload_param)}};
  } else {
    j["recommendation"] = nullptr;
  }
  j["why"] = plan.why;
  if (config_row) j["config"] = rank_to_json(*config_row);
  return j;
}

// traffic / psi as "3" when whole, else with two decimals ("2.10": frozen parameters).
std::string psi_multiple(std::int64_t traffic, std::int64_t psi) {
  if (traffic % psi == 0) return std::to_string(traffic / psi);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(traffic) / static_cast<double>(psi));
  return buf;
}

std::string plan_to_table(const Plan& plan, const std::optional<RankEstimate>& config_row, bool binary) {
  const Cluster& c = plan.cluster;
  const char* unit = binary ? "GiB" : "GB";
  std::ostringstream os;
  os << "model: " << with_commas(plan.model.parameters) << " parameters";
  if (plan.model.frozen_parameters > 0)
    os << " (" << with_commas(plan.model.frozen_parameters) << " frozen: no gradients, no optimizer states)";
  os << "; largest layer "
     << (plan.model.largest_layer > 0 ? with_commas(plan.model.largest_layer) : std::string("unknown")) << "\n";
  os << "cluster: " << c.world_size << " ranks, " << c.ranks_per_node() << " per node; GPU "
     << format_bytes(c.gpu_bytes, binary) << " (" << format_bytes(c.usable_gpu_bytes(), binary) << " usable), host "
     << format_bytes(c.host_bytes_per_node, binary) << " per node (" << format_bytes(c.usable_host_bytes(), binary)
     << " usable), NVMe " << format_bytes(c.nvme_bytes_per_node, binary) << " per node\n";
  const int B = plan.rows.empty() ? 2 : plan.rows.front().rank.compute_bytes;
  os << "model states per rank: ZeRO (arXiv 1910.02054) (2+2+K)Psi with K = 12, " << B
     << "-byte compute dtype; sizes in " << unit << (binary ? " (2^30 bytes)" : " (1e9 bytes)")
     << "; traffic per step in parameters (Psi)\n\n";

  const std::vector<std::pair<std::string, std::size_t>> cols = {
      {"configuration", 40}, {"GPU states", 11}, {"GPU buffers", 12}, {"host/rank", 10}, {"NVMe/rank", 10},
      {"GPU total", 10},     {"host/node", 10},  {"NVMe/node", 10},   {"traffic", 8},    {"fits", 0}};
  for (std::size_t i = 0; i < cols.size(); ++i) os << pad(cols[i].first, cols[i].second, i == 0) << (i + 1 < cols.size() ? " " : "\n");
  for (std::size_t k = 0; k < plan.rows.size(); ++k) {
    const auto& row = plan.rows[k];
    const auto& r = row.rank;
    const std::string mark = plan.recommended && *plan.recommended == k ? "* " : "  ";
    const std::vector<std::string> cells = {
        mark + row.label,
        number(r.model_states.device, binary),
        number(r.buffers.device, binary),
        number(r.model_states.host + r.buffers.host, binary),
        number(r.model_states.nvme, binary),
        number(row.device_bytes, binary),
        number(row.host_bytes_per_node, binary),
        number(row.nvme_bytes_per_node, binary),
        psi_multiple(r.traffic_elements, plan.model.parameters) + " Psi",
        row.fits() ? "yes" : "no: " + row.shortfall};
    for (std::size_t i = 0; i < cells.size(); ++i)
      os << pad(cells[i], cols[i].second, i == 0) << (i + 1 < cells.size() ? " " : "\n");
  }
  os << "\nrecommendation: " << plan.why << "\n";
  if (config_row) {
    const auto& r = *config_row;
    os << "your configuration (stage " << r.stage << ", offload_optimizer " << device_name(r.offload_optimizer)
       << ", offload_param " << device_name(r.offload_param) << "): model states " << format_bytes(r.model_states.device, binary)
       << " GPU + " << format_bytes(r.model_states.host, binary) << " host + " << format_bytes(r.model_states.nvme, binary)
       << " NVMe per rank; buffers " << format_bytes(r.buffers.device, binary) << " GPU + "
       << format_bytes(r.buffers.host, binary) << " host per rank\n";
  }
  return os.str();
}

}  // namespace zoe::estimate
