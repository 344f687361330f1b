// What `tandem sim` prints: one table row per policy and model, the same as one JSON object
// (keyed by policy, then model), and an SVG of the TTFT distributions. Pure string building.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "policy/sim.h"

namespace tandem::policy {

std::string format_sim_table(const std::vector<sim_result>& results);
nlohmann::json sim_to_json(const std::vector<sim_result>& results);
// TTFT CDFs: one panel per model, one line per policy, log time axis.
std::string sim_plot_svg(const std::vector<sim_result>& results, const std::string& title);

}  // namespace tandem::policy
