#pragma once
/// @file
/// ReduceLROnPlateau: lower the LR when a metric stops improving — a real LRScheduler like the others
/// (same base, same save/load), stepped with the metric.

#include <limits>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/options.h"
#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// Options of ReduceLROnPlateau (PyTorch's names and defaults).
struct ReduceLROnPlateauOptions {
  /// "min" (lower metric is better) or "max".
  TORCH_ARG(std::string, mode) = "min";
  /// new_lr = lr · factor (in [0, 1)).
  TORCH_ARG(double, factor) = 0.1;
  /// Steps without improvement tolerated before reducing (>= 0).
  TORCH_ARG(int64_t, patience) = 10;
  /// Minimum change that counts as improvement (>= 0).
  TORCH_ARG(double, threshold) = 1e-4;
  /// "rel" (best · (1 ∓ threshold)) or "abs" (best ∓ threshold).
  TORCH_ARG(std::string, threshold_mode) = "rel";
  /// Steps to wait after a reduction before counting bad steps again (>= 0).
  TORCH_ARG(int64_t, cooldown) = 0;
  /// Lower bound on the LR (one value, or one per group; >= 0).
  TORCH_ARG(std::vector<double>, min_lr) = std::vector<double>{0.0};
  /// Reductions smaller than eps are skipped (>= 0).
  TORCH_ARG(double, eps) = 1e-8;

 public:
  /// The config keys (`[scheduler]` of type ReduceLROnPlateau): names, rules and help.
  static const OptionBinding<ReduceLROnPlateauOptions>& binding() {
    static const auto b =
        OptionBinding<ReduceLROnPlateauOptions>()
            .bind(TRAINKIT_OPTION(mode), rule::one_of({"min", "max"}), "Whether a lower or higher metric is better")
            .bind(TRAINKIT_OPTION(factor), rule::number(unit_interval()), "new_lr = lr x factor")
            .bind(TRAINKIT_OPTION(patience), rule::integer(0), "Bad steps tolerated before reducing")
            .bind(TRAINKIT_OPTION(threshold), rule::number(non_negative()), "Least significant change")
            .bind(TRAINKIT_OPTION(threshold_mode), rule::one_of({"rel", "abs"}), "Relative or absolute threshold")
            .bind(TRAINKIT_OPTION(cooldown), rule::integer(0), "Steps to wait after a reduction")
            .bind(TRAINKIT_OPTION(min_lr), rule::numbers(non_negative()), "Lower LR bound")
            .bind(TRAINKIT_OPTION(eps), rule::number(non_negative()),
                  "A reduction smaller than this is not applied");
    return b;
  }
};

/// Reduces each group's LR by `factor` (not below min_lr) after more than `patience` steps without
/// improvement of the metric given to step(metric).
class ReduceLROnPlateau : public LRScheduler {
 public:
  /// Throws std::invalid_argument naming the option and value unless `options` is valid; needs no optimizer
  /// (the constructor runs it, and so does the scheduler factory's parse step).
  static void validate(const ReduceLROnPlateauOptions& options);
  ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  std::string name() const override { return "ReduceLROnPlateau"; }
  /// Always throws std::logic_error: the plateau scheduler needs the metric.
  void step() override;
  /// Records `metric` and reduces the LRs when it has not improved for more than `patience` steps.
  void step(double metric) override;
  bool takes_metric() const override { return true; }

  /// The best metric seen.
  double best() const { return best_; }
  /// Consecutive steps without improvement.
  int64_t num_bad_epochs() const { return num_bad_epochs_; }

 protected:
  std::vector<double> get_lr() override;
  void save_extra(torch::serialize::OutputArchive& archive) const override;
  void load_extra(torch::serialize::InputArchive& archive) override;

 private:
  bool is_better(double a, double best) const;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  bool reduce_ = false;
};

/// Registers ReduceLROnPlateau with the scheduler factory (sched/factory.h); runs once, before main.
bool register_plateau_scheduler();
/// Makes every program that includes this header register them (and link their source).
inline const bool plateau_scheduler_registered = register_plateau_scheduler();

}  // namespace trainkit::sched
