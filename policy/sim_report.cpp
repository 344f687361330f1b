#include "policy/sim_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace tandem::policy {
namespace {

std::string ms_text(double ms) {
  if (std::isinf(ms)) return "never";
  char b[32];
  if (ms >= 10000)
    std::snprintf(b, sizeof b, "%.1f s", ms / 1000);
  else
    std::snprintf(b, sizeof b, "%.0f ms", ms);
  return b;
}

double finite_or(double v, double instead) { return std::isfinite(v) ? v : instead; }

}  // namespace

std::string format_sim_table(const std::vector<sim_result>& results) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %-12s %6s %9s %9s %9s %10s %8s %6s %8s %6s\n", "policy", "model", "reqs", "ttft p50", "ttft p95",
                "ttft p99", "e2e p95", "slo", "swaps", "GB moved", "busy");
  out += line;
  for (const auto& r : results)
    for (const auto& [name, m] : r.models) {
      char slo[32];
      if (m.slo_ttft_ms > 0)
        std::snprintf(slo, sizeof slo, "%.1f%%", m.slo_attainment * 100);
      else
        std::snprintf(slo, sizeof slo, "-");
      std::snprintf(line, sizeof line, "%-14s %-12s %6d %9s %9s %9s %10s %8s %6d %8.1f %5.0f%%\n", r.policy.c_str(), name.c_str(), m.requests,
                    ms_text(m.ttft_p50_ms).c_str(), ms_text(m.ttft_p95_ms).c_str(), ms_text(m.ttft_p99_ms).c_str(), ms_text(m.e2e_p95_ms).c_str(),
                    slo, m.swaps, m.gb_moved, r.device_busy * 100);
      out += line;
    }
  return out;
}

nlohmann::json sim_to_json(const std::vector<sim_result>& results) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& r : results) {
    nlohmann::json p = nlohmann::json::object();
    for (const auto& [name, m] : r.models) {
      // JSON has no infinity: a request never served reads as null.
      auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
      p[name] = {{"requests", m.requests},
                 {"served", m.served},
                 {"ttft_p50_ms", num(m.ttft_p50_ms)},
                 {"ttft_p95_ms", num(m.ttft_p95_ms)},
                 {"ttft_p99_ms", num(m.ttft_p99_ms)},
                 {"e2e_p95_ms", num(m.e2e_p95_ms)},
                 {"slo_ttft_ms", m.slo_ttft_ms},
                 {"slo_attainment", m.slo_attainment},
                 {"swaps", m.swaps},
                 {"gb_moved", m.gb_moved},
                 {"device_busy", r.device_busy}};
    }
    j[r.policy] = p;
  }
  return j;
}

std::string sim_plot_svg(const std::vector<sim_result>& results, const std::string& title) {
  std::vector<std::string> models;
  for (const auto& r : results)
    for (const auto& [name, m] : r.models)
      if (std::find(models.begin(), models.end(), name) == models.end()) models.push_back(name);
  const int pw = 420, ph = 300, ml = 60, mt = 50, gap = 40;
  const int width = ml + static_cast<int>(models.size()) * (pw + gap), height = mt + ph + 90;
  static const char* k_colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  // A log axis from 10 ms to the largest served TTFT, at least 10 s.
  double hi = 10000;
  for (const auto& r : results)
    for (const auto& [n, m] : r.models)
      if (!m.ttft_ms.empty()) hi = std::max(hi, m.ttft_ms.back());
  const double lo_l = std::log10(10.0), hi_l = std::ceil(std::log10(hi));
  auto x_of = [&](double ms) { return (std::log10(std::max(ms, 10.0)) - lo_l) / (hi_l - lo_l) * pw; };
  std::string s;
  char b[512];
  std::snprintf(b, sizeof b,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"24\" font-size=\"16\">%s</text>\n",
                width, height, ml, title.c_str());
  s += b;
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const int ox = ml + static_cast<int>(mi) * (pw + gap), oy = mt;
    std::snprintf(b, sizeof b, "<g transform=\"translate(%d,%d)\">\n<rect width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", ox, oy, pw,
                  ph);
    s += b;
    std::snprintf(b, sizeof b, "<text x=\"0\" y=\"-8\" font-size=\"14\">%s: share of requests with TTFT below x</text>\n", models[mi].c_str());
    s += b;
    for (double l = lo_l; l <= hi_l + 1e-9; l += 1) {
      const double x = (l - lo_l) / (hi_l - lo_l) * pw;
      const double ms = std::pow(10.0, l);
      std::snprintf(b, sizeof b,
                    "<line x1=\"%.1f\" y1=\"0\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                    x, x, ph, x, ph + 16, ms_text(ms).c_str());
      s += b;
    }
    for (int k = 0; k <= 4; ++k) {
      const double y = ph - k * ph / 4.0;
      std::snprintf(b, sizeof b,
                    "<line x1=\"0\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"-6\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                    y, pw, y, y + 4, k * 25);
      s += b;
    }
    for (size_t ri = 0; ri < results.size(); ++ri) {
      const auto it = results[ri].models.find(models[mi]);
      if (it == results[ri].models.end() || it->second.requests == 0) continue;
      const auto& v = it->second.ttft_ms;
      std::string pts = "0," + std::to_string(ph);
      for (size_t k = 0; k < v.size(); ++k) {
        const double x = x_of(finite_or(v[k], hi)), y = ph - static_cast<double>(k + 1) / it->second.requests * ph;
        std::snprintf(b, sizeof b, " %.1f,%.1f", x, y);
        pts += b;
      }
      s += std::string("<polyline fill=\"none\" stroke=\"") + k_colors[ri % 6] + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    }
    s += "</g>\n";
  }
  for (size_t ri = 0; ri < results.size(); ++ri) {
    const int x = ml + static_cast<int>(ri) * 150, y = mt + ph + 50;
    std::snprintf(b, sizeof b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"4\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", x, y - 4,
                  k_colors[ri % 6], x + 20, y, results[ri].policy.c_str());
    s += b;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace tandem::policy
