#include "run_metrics.h"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace trainkit::app {
namespace {

double number_or_nan(const nlohmann::json& json) { return json.is_number() ? json.get<double>() : NAN; }

}  // namespace

std::map<int64_t, double> val_history(const std::filesystem::path& run_dir, const std::string& metric) {
  std::map<int64_t, double> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    if (line.find("\"kind\":\"epoch\"") == std::string::npos) continue;  // cheap: only epoch rows are parsed
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) continue;  // a partial line parses as "discarded"
    const auto kind = row.find("kind");
    if (kind == row.end() || *kind != "epoch") continue;
    const auto value = row.find(metric);
    const auto epoch = row.find("epoch");
    if (value != row.end() && epoch != row.end() && epoch->is_number()) {
      out[epoch->get<int64_t>()] = number_or_nan(*value);
    }
  }
  return out;
}

double run_objective(const std::filesystem::path& run_dir, const std::string& metric) {
  if (metric.rfind("val_", 0) == 0) {
    const auto history = val_history(run_dir, metric);
    return history.empty() ? NAN : history.rbegin()->second;
  }
  const std::filesystem::path path = run_dir / "summary.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not valid JSON: {}", path.string(), e.what()));
  }
  const auto value = summary.is_object() ? summary.find(metric) : summary.end();
  return value != summary.end() ? number_or_nan(*value) : NAN;
}

}  // namespace trainkit::app
