#include "trainkit/optim/param_groups.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <regex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace trainkit::optim {

std::map<std::string, int64_t> layer_ids(const std::vector<std::string>& names,
                                         const std::vector<std::vector<LayerRule>>& groups) {
  struct Compiled {
    std::regex re;
    double ordinal;
    std::vector<double> suffix;
    std::string pattern;
  };
  std::vector<Compiled> rules;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const LayerRule& rule : groups[g]) {
      try {
        rules.push_back({std::regex(rule.pattern, std::regex::ECMAScript), static_cast<double>(g), rule.suffix,
                         rule.pattern});
      } catch (const std::regex_error& e) {
        throw std::invalid_argument(fmt::format("layer_ids: pattern \"{}\" does not compile: {}", rule.pattern, e.what()));
      }
    }
  }
  const auto key_of = [&rules](const std::string& name) {
    for (const Compiled& rule : rules) {
      std::smatch m;
      if (std::regex_search(name, m, rule.re, std::regex_constants::match_continuous)) {
        std::vector<double> key{rule.ordinal};
        for (size_t i = 1; i < m.size(); ++i) {
          if (!m[i].matched) {
            continue;
          }
          try {
            key.push_back(std::stod(m[i].str()));
          } catch (const std::exception&) {
            throw std::invalid_argument(fmt::format("layer_ids: pattern \"{}\" captured \"{}\" in \"{}\", not a number",
                                                    rule.pattern, m[i].str(), name));
          }
        }
        key.insert(key.end(), rule.suffix.begin(), rule.suffix.end());
        return key;
      }
    }
    return std::vector<double>{std::numeric_limits<double>::infinity()};  // a head: the last layer
  };
  std::map<std::vector<double>, std::vector<std::string>> by_key;  // sorted as Python sorts tuples
  for (const std::string& name : names) {
    by_key[key_of(name)].push_back(name);
  }
  std::map<std::string, int64_t> out;
  int64_t layer = -1;
  for (const auto& [key, members] : by_key) {
    if (layer < 0 || key.back() != kMatchPreviousLayer) {
      ++layer;
    }
    for (const std::string& name : members) {
      out[name] = layer;
    }
  }
  return out;
}

std::map<std::string, int64_t> child_layer_ids(const torch::nn::Module& model) {
  std::map<std::string, int64_t> ids;
  for (const auto& p : model.named_parameters(/*recurse=*/false)) {
    ids[p.key()] = 0;
  }
  int64_t layer = -1;
  for (const auto& child : model.named_children()) {
    const auto params = child.value()->named_parameters();
    if (params.is_empty()) {
      continue;
    }
    const bool starts_layer = std::any_of(params.begin(), params.end(), [](const auto& p) { return p.value().dim() >= 2; });
    if (starts_layer || layer < 0) {
      ++layer;
    }
    for (const auto& p : params) {
      ids[child.key() + "." + p.key()] = layer;
    }
  }
  return ids;
}

bool matches_wildcard(const std::string& name, const std::string& pattern) {
  // Iterative glob with backtracking to the last '*'.
  size_t n = 0, p = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++n;
      ++p;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') {
    ++p;
  }
  return p == pattern.size();
}

std::vector<LayerDecayGroup> layer_decay_groups(const torch::OrderedDict<std::string, at::Tensor>& named_params,
                                                const std::map<std::string, int64_t>& layer_of,
                                                const LayerDecayOptions& options) {
  if (!(options.layer_decay() > 0) || !std::isfinite(options.layer_decay())) {
    throw std::invalid_argument(fmt::format("layer_decay_groups: invalid layer_decay: {} (must be > 0)", options.layer_decay()));
  }
  if (!(options.weight_decay() >= 0)) {
    throw std::invalid_argument(fmt::format("layer_decay_groups: invalid weight_decay: {}", options.weight_decay()));
  }
  int64_t layers = 1;
  for (const auto& [name, id] : layer_of) {
    layers = std::max(layers, id + 1);
  }
  const int64_t layer_max = layers - 1;
  std::vector<LayerDecayGroup> groups;
  for (const auto& item : named_params) {
    const std::string& name = item.key();
    const at::Tensor& param = item.value();
    if (!param.requires_grad()) {
      continue;
    }
    const bool listed = std::any_of(options.no_weight_decay().begin(), options.no_weight_decay().end(),
                                    [&name](const std::string& pattern) { return matches_wildcard(name, pattern); });
    const bool no_decay = (options.exclude_1d() && param.dim() <= 1) || listed;
    const auto it = layer_of.find(name);
    const int64_t layer = it == layer_of.end() ? layer_max : it->second;
    const std::string group_name = fmt::format("layer_{}_{}", layer, no_decay ? "no_decay" : "decay");
    auto g = std::find_if(groups.begin(), groups.end(), [&](const LayerDecayGroup& x) { return x.name == group_name; });
    if (g == groups.end()) {
      LayerDecayGroup fresh;
      fresh.name = group_name;
      fresh.lr_scale = std::max(options.min_scale(), std::pow(options.layer_decay(), static_cast<double>(layer_max - layer)));
      fresh.weight_decay = no_decay ? 0.0 : options.weight_decay();
      groups.push_back(std::move(fresh));
      g = groups.end() - 1;
    }
    g->param_names.push_back(name);
    g->params.push_back(param);
  }
  return groups;
}

std::vector<LayerDecayGroup> lr_groups(const torch::OrderedDict<std::string, at::Tensor>& named_params,
                                       const std::vector<LrRule>& rules, const LrGroupsOptions& options) {
  if (!(options.weight_decay() >= 0)) {
    throw std::invalid_argument(fmt::format("lr_groups: invalid weight_decay: {}", options.weight_decay()));
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    const LrRule& rule = rules[r];
    if (rule.patterns.empty()) {
      throw std::invalid_argument(fmt::format("lr_groups: rule \"{}\" has no pattern", rule.name));
    }
    if (!(rule.lr > 0) || !std::isfinite(rule.lr)) {
      throw std::invalid_argument(fmt::format("lr_groups: rule \"{}\": invalid lr {} (must be > 0)", rule.name, rule.lr));
    }
    for (size_t other = 0; other < r; ++other) {
      if (rules[other].name == rule.name) {
        throw std::invalid_argument(fmt::format("lr_groups: two rules are called \"{}\"", rule.name));
      }
    }
    if (rule.name == "default") {
      throw std::invalid_argument("lr_groups: \"default\" names the group of the unmatched parameters");
    }
  }
  // Group g's decayed half at 2g, its no-decay half at 2g + 1; the unmatched parameters are group rules.size().
  std::vector<LayerDecayGroup> slots(2 * (rules.size() + 1));
  std::vector<bool> matched(rules.size(), false);
  std::vector<std::string> names;
  for (const auto& item : named_params) {
    const std::string& name = item.key();
    const at::Tensor& param = item.value();
    if (!param.requires_grad()) {
      continue;
    }
    names.push_back(name);
    size_t g = 0;
    while (g < rules.size() && std::none_of(rules[g].patterns.begin(), rules[g].patterns.end(),
                                            [&](const std::string& p) { return matches_wildcard(name, p); })) {
      ++g;
    }
    if (g < rules.size()) {
      matched[g] = true;
    }
    const bool no_decay = options.exclude_1d() && param.dim() <= 1;
    LayerDecayGroup& slot = slots[2 * g + (no_decay ? 1 : 0)];
    slot.param_names.push_back(name);
    slot.params.push_back(param);
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    if (!matched[r]) {
      const size_t shown = std::min<size_t>(names.size(), 8);
      throw std::invalid_argument(fmt::format(
          "lr_groups: rule \"{}\" ({}) matches no parameter; the parameters are named like {}{}", rules[r].name,
          fmt::join(rules[r].patterns, ", "), fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
          names.size() > shown ? ", ..." : ""));
    }
  }
  std::vector<LayerDecayGroup> groups;
  for (size_t g = 0; g <= rules.size(); ++g) {
    for (const bool no_decay : {false, true}) {
      LayerDecayGroup& slot = slots[2 * g + (no_decay ? 1 : 0)];
      if (slot.params.empty()) {
        continue;
      }
      const std::string base = g < rules.size() ? rules[g].name : "default";
      slot.name = no_decay ? base + "_no_decay" : base;
      if (g < rules.size()) {
        slot.lr = rules[g].lr;
      }
      slot.weight_decay = no_decay ? 0.0 : options.weight_decay();
      groups.push_back(std::move(slot));
    }
  }
  return groups;
}

}  // namespace trainkit::optim
