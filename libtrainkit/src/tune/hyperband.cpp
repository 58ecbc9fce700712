#include "trainkit/tune/hyperband.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::tune {
namespace {

/// One successive halving: its rungs' steps and rule.
struct Halving {
  int64_t min_resource;
  int64_t reduction_factor;
  int64_t min_early_stopping_rate;
  int64_t bootstrap_count;

  /// The step of rung `rung` (saturating: a rung beyond int64 is never reached).
  int64_t rung_step(size_t rung) const {
    int64_t s = min_resource;
    for (int64_t i = 0; i < min_early_stopping_rate + static_cast<int64_t>(rung); ++i) {
      if (s > std::numeric_limits<int64_t>::max() / reduction_factor) return std::numeric_limits<int64_t>::max();
      s *= reduction_factor;
    }
    return s;
  }

  /// The values trial `t` recorded at its rungs 0, 1, ... from its reports at steps below `before`: at each
  /// report, every rung it reaches takes the reported value (a NaN value records none).
  std::vector<double> rung_values(const Trial& t, int64_t before) const {
    std::vector<double> out;
    for (const auto& [s, v] : t.intermediate) {
      if (s >= before) break;
      while (!std::isnan(v) && s >= rung_step(out.size())) out.push_back(v);
    }
    return out;
  }

  /// Optuna's SuccessiveHalvingPruner.prune over `trials` for `trial`, asked after its report at its last step.
  bool prune(const std::vector<const Trial*>& trials, const Trial& trial, bool minimize) const {
    if (trial.intermediate.empty()) return false;
    const auto [step, value] = *trial.intermediate.rbegin();
    size_t rung = rung_values(trial, step).size();
    std::vector<std::vector<double>> others;
    for (const Trial* t : trials) {
      if (t->number != trial.number) others.push_back(rung_values(*t, std::numeric_limits<int64_t>::max()));
    }
    while (true) {
      if (step < rung_step(rung)) return false;
      if (std::isnan(value)) return true;
      std::vector<double> competing;
      for (const auto& rv : others) {
        if (rv.size() > rung) competing.push_back(rv[rung]);
      }
      competing.push_back(value);
      // `competing` includes the trial itself.
      if (static_cast<int64_t>(competing.size()) <= bootstrap_count) return true;
      // The best 1/eta go on; while fewer than eta trials reached the rung, only the best one.
      const auto promotable = static_cast<size_t>(
          std::max<int64_t>(static_cast<int64_t>(competing.size()) / reduction_factor - 1, 0));
      std::sort(competing.begin(), competing.end());
      const bool promoted = minimize ? value <= competing[promotable]
                                     : value >= competing[competing.size() - 1 - promotable];
      if (!promoted) return true;
      ++rung;
    }
  }
};

/// The last step of the longest completed trial; empty when no completed trial reported.
std::optional<int64_t> longest_completed(const std::vector<Trial>& trials) {
  std::optional<int64_t> out;
  for (const auto& t : trials) {
    if (t.state != TrialState::Complete || t.intermediate.empty()) continue;
    const int64_t last = t.intermediate.rbegin()->first;
    if (!out || last > *out) out = last;
  }
  return out;
}

std::vector<const Trial*> pointers(const std::vector<Trial>& trials) {
  std::vector<const Trial*> out;
  for (const auto& t : trials) out.push_back(&t);
  return out;
}

}  // namespace

uint32_t crc32(const std::string& text) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char c : text) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

SuccessiveHalvingPruner::SuccessiveHalvingPruner(SuccessiveHalvingPrunerOptions options) : options_(options) {
  const auto& o = options_;
  if (o.min_resource() && *o.min_resource() < 1) {
    throw std::invalid_argument(fmt::format("SuccessiveHalvingPrunerOptions: min_resource must be >= 1 or auto, got {}",
                                            *o.min_resource()));
  }
  if (o.reduction_factor() < 2) {
    throw std::invalid_argument(fmt::format("SuccessiveHalvingPrunerOptions: reduction_factor must be >= 2, got {}",
                                            o.reduction_factor()));
  }
  if (o.min_early_stopping_rate() < 0) {
    throw std::invalid_argument(fmt::format(
        "SuccessiveHalvingPrunerOptions: min_early_stopping_rate must be >= 0, got {}", o.min_early_stopping_rate()));
  }
  if (o.bootstrap_count() < 0) {
    throw std::invalid_argument(fmt::format("SuccessiveHalvingPrunerOptions: bootstrap_count must be >= 0, got {}",
                                            o.bootstrap_count()));
  }
  if (o.bootstrap_count() > 0 && !o.min_resource()) {
    throw std::invalid_argument(fmt::format(
        "SuccessiveHalvingPrunerOptions: bootstrap_count {} needs a min_resource (not auto)", o.bootstrap_count()));
  }
}

bool SuccessiveHalvingPruner::should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t /*step*/,
                                           bool minimize) const {
  const auto& o = options_;
  int64_t min_resource = 0;
  if (o.min_resource()) {
    min_resource = *o.min_resource();
  } else {
    const auto longest = longest_completed(trials);
    if (!longest) return false;
    min_resource = std::max<int64_t>(*longest / 100, 1);
  }
  const Halving halving{min_resource, o.reduction_factor(), o.min_early_stopping_rate(), o.bootstrap_count()};
  return halving.prune(pointers(trials), trial, minimize);
}

HyperbandPruner::HyperbandPruner(HyperbandPrunerOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.min_resource() < 1) {
    throw std::invalid_argument(fmt::format("HyperbandPrunerOptions: min_resource must be >= 1, got {}",
                                            o.min_resource()));
  }
  if (o.max_resource() && *o.max_resource() < o.min_resource()) {
    throw std::invalid_argument(fmt::format("HyperbandPrunerOptions: max_resource must be >= min_resource ({}) or auto, "
                                            "got {}",
                                            o.min_resource(), *o.max_resource()));
  }
  if (o.reduction_factor() < 2) {
    throw std::invalid_argument(fmt::format("HyperbandPrunerOptions: reduction_factor must be >= 2, got {}",
                                            o.reduction_factor()));
  }
  if (o.bootstrap_count() < 0) {
    throw std::invalid_argument(fmt::format("HyperbandPrunerOptions: bootstrap_count must be >= 0, got {}",
                                            o.bootstrap_count()));
  }
  if (o.bootstrap_count() > 0 && !o.max_resource()) {
    throw std::invalid_argument(fmt::format(
        "HyperbandPrunerOptions: bootstrap_count {} needs a max_resource (not auto)", o.bootstrap_count()));
  }
}

int64_t HyperbandPruner::n_brackets(int64_t max_resource) const {
  // Python's math.log(x, base) is log(x) / log(base).
  const double ratio = static_cast<double>(max_resource) / static_cast<double>(options_.min_resource());
  return static_cast<int64_t>(std::floor(std::log(ratio) / std::log(static_cast<double>(options_.reduction_factor())))) + 1;
}

int64_t HyperbandPruner::bracket(int64_t number, int64_t max_resource) const {
  const int64_t n = n_brackets(max_resource);
  std::vector<int64_t> budgets;
  int64_t total = 0;
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = n - 1 - b;
    double eta_s = 1;
    for (int64_t i = 0; i < s; ++i) eta_s *= static_cast<double>(options_.reduction_factor());
    budgets.push_back(static_cast<int64_t>(std::ceil(static_cast<double>(n) * eta_s / static_cast<double>(s + 1))));
    total += budgets.back();
  }
  auto left = static_cast<int64_t>(crc32(fmt::format("{}_{}", options_.study_name(), number)) % static_cast<uint64_t>(total));
  for (int64_t b = 0; b < n; ++b) {
    left -= budgets[static_cast<size_t>(b)];
    if (left < 0) return b;
  }
  return n - 1;
}

bool HyperbandPruner::should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t /*step*/,
                                   bool minimize) const {
  const auto& o = options_;
  int64_t max_resource = 0;
  if (o.max_resource()) {
    max_resource = *o.max_resource();
  } else {
    const auto longest = longest_completed(trials);
    if (!longest) return false;
    max_resource = *longest + 1;
  }
  if (max_resource < o.min_resource()) return false;  // auto, from trials shorter than min_resource
  const int64_t b = bracket(trial.number, max_resource);
  std::vector<const Trial*> members;
  for (const auto& t : trials) {
    if (bracket(t.number, max_resource) == b) members.push_back(&t);
  }
  const Halving halving{o.min_resource(), o.reduction_factor(), b, o.bootstrap_count()};
  return halving.prune(members, trial, minimize);
}

}  // namespace trainkit::tune
