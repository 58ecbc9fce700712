#pragma once
/// @file
/// Pruners stop unpromising trials early from the values they report per step (e.g. per epoch).

#include <cstdint>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/trial.h"

namespace trainkit::tune {

/// What decides whether a running trial stops. `trials` are all of the study's trials, `trial` the one that
/// just reported at `step`; `minimize` is the study's direction.
class Pruner {
 public:
  virtual ~Pruner() = default;
  virtual bool should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t step, bool minimize) const = 0;
};

/// Options of MedianPruner (Optuna's names and defaults).
struct MedianPrunerOptions {
  /// No pruning until this many trials have completed.
  TORCH_ARG(int64_t, n_startup_trials) = 5;
  /// No pruning at steps below this.
  TORCH_ARG(int64_t, n_warmup_steps) = 0;
  /// Check only every this many steps after the warm-up.
  TORCH_ARG(int64_t, interval_steps) = 1;
  /// Fewest completed trials with a report at the step for a median to count.
  TORCH_ARG(int64_t, n_min_trials) = 1;
};

/// Median stopping (Golovin et al. 2017, "Google Vizier"), with Optuna's MedianPruner rule: prune when the
/// trial's best value reported so far is worse than the median of the completed trials' values at the same step.
class MedianPruner : public Pruner {
 public:
  explicit MedianPruner(MedianPrunerOptions options = {});
  bool should_prune(const std::vector<Trial>& trials, const Trial& trial, int64_t step, bool minimize) const override;
  const MedianPrunerOptions& options() const { return options_; }

 private:
  MedianPrunerOptions options_;
};

}  // namespace trainkit::tune
