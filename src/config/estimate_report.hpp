// Renders a zoe::estimate::Plan as zoe-estimate prints it: a text table or one JSON object.
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "src/config/estimate.hpp"

namespace zoe::estimate {

/// JSON of one rank estimate: every TierBytes as {"device","host","nvme","total"} in bytes,
/// traffic in elements and bytes, stage and offload devices as strings.
nlohmann::ordered_json rank_to_json(const RankEstimate& r);

/// {"model", "cluster", "rows": [...], "recommendation": {...} or null, "why"}; each row is
/// rank_to_json plus label, per-GPU / per-node totals and the fit flags. `config_row`, when
/// given, is added as "config": the estimate for the user's own configuration.
nlohmann::ordered_json plan_to_json(const Plan& plan, const std::optional<RankEstimate>& config_row);

/// The table: one row per configuration, sizes in GiB (binary) or GB (1e9, the ZeRO
/// paper's unit), then the recommendation and its reason.
std::string plan_to_table(const Plan& plan, const std::optional<RankEstimate>& config_row, bool binary_units);

}  // namespace zoe::estimate
