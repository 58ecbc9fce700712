#include "study_file.h"

#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "trainkit/app/run.h"

namespace trainkit::app {
namespace {

using nlohmann::ordered_json;
using tune::Param;
using tune::TrialState;

ordered_json parse_line(const std::string& line) {
  try {
    return ordered_json::parse(line);
  } catch (const ordered_json::exception& e) {
    throw std::runtime_error(e.what());
  }
}

std::optional<std::string> string_field(const ordered_json& json, const char* key) {
  if (!json.is_object()) return std::nullopt;
  const auto it = json.find(key);
  if (it == json.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

double number_or_nan(const ordered_json& json) { return json.is_number() ? json.get<double>() : NAN; }

tune::ParamValue parse_value(const Param& p, const std::string& text) {
  switch (p.kind) {
    case Param::Kind::Float: return std::stod(text);
    case Param::Kind::Int: return static_cast<int64_t>(std::stoll(text));
    case Param::Kind::Categorical: return text;
  }
  return text;
}

/// One trial line; std::runtime_error saying what is wrong with it.
TrialRecord parse_trial(const ordered_json& j, const tune::SearchSpace& space) {
  const auto state = string_field(j, "state");
  if (!state || !j.contains("params") || !j["params"].is_object()) throw std::runtime_error("not a trial record");
  const std::map<std::string, TrialState> states = {
      {"complete", TrialState::Complete}, {"pruned", TrialState::Pruned}, {"failed", TrialState::Failed}};
  const auto s = states.find(*state);
  if (s == states.end()) throw std::runtime_error(fmt::format("unknown state \"{}\"", *state));
  TrialRecord r;
  r.trial.state = s->second;
  if (j.contains("value")) r.trial.value = number_or_nan(j["value"]);
  if (j.contains("seconds") && j["seconds"].is_number()) r.seconds = j["seconds"].get<double>();
  r.dir = string_field(j, "dir").value_or("");
  for (const auto& p : space.params()) {
    const auto text = string_field(j["params"], p.name.c_str());
    if (!text) throw std::runtime_error(fmt::format("no value for {}", p.name));
    try {
      r.trial.params[p.name] = parse_value(p, *text);
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("{}: cannot read \"{}\"", p.name, *text));
    }
  }
  if (j.contains("intermediate") && j["intermediate"].is_array()) {
    for (const auto& pair : j["intermediate"]) {
      if (pair.is_array() && pair.size() == 2 && pair[0].is_number()) {
        r.trial.intermediate[static_cast<int64_t>(pair[0].get<double>())] = number_or_nan(pair[1]);
      }
    }
  }
  return r;
}

}  // namespace

std::vector<TrialRecord> read_study_file(const std::filesystem::path& path, const tune::SearchSpace& space,
                                         const StudyHeader& header, const std::string& space_path) {
  const std::string file = path.string();
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.empty()) throw UsageError(fmt::format("{}: empty study file (remove it to start afresh)", file));
  ordered_json h;
  try {
    h = parse_line(lines[0]);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}: line 1 is not a study header: {}", file, e.what()));
  }
  const auto fingerprint = string_field(h, "space");
  if (fingerprint != header.space) {
    throw UsageError(fmt::format("{}: the study was run on another search space\n  study file: {}\n  {}: {}", file,
                                 fingerprint.value_or("(none)"), space_path, header.space));
  }
  for (const auto& [key, want] : {std::pair{"metric", header.metric}, std::pair{"direction", header.direction}}) {
    const auto v = string_field(h, key);
    if (v != want) {
      throw UsageError(fmt::format("{}: the study's {} is \"{}\", this run's is \"{}\"", file, key, v.value_or(""), want));
    }
  }
  std::vector<TrialRecord> records;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    const std::string where = fmt::format("{}:{}", file, i + 1);
    try {
      TrialRecord r = parse_trial(parse_line(lines[i]), space);
      r.trial.number = static_cast<int64_t>(records.size());
      records.push_back(std::move(r));
    } catch (const std::runtime_error& e) {
      if (i + 1 == lines.size()) {
        spdlog::warn("{}: ignoring a damaged last line (an interrupted write): {}", where, e.what());
        continue;
      }
      throw UsageError(fmt::format("{}: {}", where, e.what()));
    }
  }
  return records;
}

}  // namespace trainkit::app
