#include "trainkit/tune/pruner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::tune {

MedianPruner::MedianPruner(MedianPrunerOptions options) : options_(options) {
  if (options_.n_startup_trials() < 0 || options_.n_warmup_steps() < 0 || options_.interval_steps() < 1 ||
      options_.n_min_trials() < 1) {
    throw std::invalid_argument(fmt::format(
        "MedianPrunerOptions: need n_startup_trials >= 0, n_warmup_steps >= 0, interval_steps >= 1, n_min_trials >= 1; "
        "got {}, {}, {}, {}",
        options_.n_startup_trials(), options_.n_warmup_steps(), options_.interval_steps(), options_.n_min_trials()));
  }
}

bool MedianPruner::should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t step, bool minimize) const {
  const auto& o = options_;
  if (step < o.n_warmup_steps() || (step - o.n_warmup_steps()) % o.interval_steps() != 0) return false;
  std::vector<double> at_step;
  int64_t completed = 0;
  for (const auto& t : trials) {
    if (t.state != TrialState::Complete) continue;
    ++completed;
    const auto it = t.intermediate.find(step);
    if (it != t.intermediate.end() && !std::isnan(it->second)) at_step.push_back(it->second);
  }
  if (completed < o.n_startup_trials() || static_cast<int64_t>(at_step.size()) < o.n_min_trials()) return false;
  double best = minimize ? INFINITY : -INFINITY;
  bool any = false;
  for (const auto& [s, v] : trial.intermediate) {
    if (s > step || std::isnan(v)) continue;
    best = minimize ? std::min(best, v) : std::max(best, v);
    any = true;
  }
  if (!any) return true;  // only NaN so far: Optuna prunes these too
  std::sort(at_step.begin(), at_step.end());
  const size_t n = at_step.size();
  const double median = n % 2 ? at_step[n / 2] : 0.5 * (at_step[n / 2 - 1] + at_step[n / 2]);
  return minimize ? best > median : best < median;
}

}  // namespace trainkit::tune
