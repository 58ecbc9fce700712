#pragma once
/// @file
/// Stops training when a monitored metric stops improving, with PyTorch Lightning's `EarlyStopping` rules.

#include <cstdint>
#include <optional>
#include <string>

#include <torch/arg.h>

#include "trainkit/train/callback.h"

namespace trainkit::train {

/// Options of EarlyStopping; names and defaults are Lightning's.
struct EarlyStoppingOptions {
  EarlyStoppingOptions() = default;
  /// Monitors `monitor`, a name of EpochEvent::metrics ("val/loss", "val/accuracy", "val_ema/loss", ...).
  explicit EarlyStoppingOptions(std::string monitor) : monitor_(std::move(monitor)) {}
  /// The metric watched at each epoch end.
  TORCH_ARG(std::string, monitor) = "val/loss";
  /// "min" (lower is better) or "max".
  TORCH_ARG(std::string, mode) = "min";
  /// Validation points (epochs, without mid-epoch validation) without improvement before stopping (>= 0).
  TORCH_ARG(int64_t, patience) = 3;
  /// Least change that counts as an improvement (>= 0): improved when current < best - min_delta ("min")
  /// or current > best + min_delta ("max").
  TORCH_ARG(double, min_delta) = 0.0;
  /// Stop at once when the metric is NaN or infinite.
  TORCH_ARG(bool, check_finite) = true;
  /// Stop at once when the metric is better than this.
  TORCH_ARG(std::optional<double>, stopping_threshold) = std::nullopt;
  /// Stop at once when the metric is worse than this.
  TORCH_ARG(std::optional<double>, divergence_threshold) = std::nullopt;

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [early_stopping]).
  static const OptionBinding<EarlyStoppingOptions>& binding() {
    static const auto b =
        OptionBinding<EarlyStoppingOptions>()
            .bind(TRAINKIT_OPTION(monitor), epoch_metric_rule(), "The watched metric (as checkpoint.monitor)")
            .bind(TRAINKIT_OPTION(mode), rule::one_of({"min", "max"}), "Whether lower or higher is better")
            .bind(TRAINKIT_OPTION(patience), rule::integer(0), "Epochs without improvement before stopping")
            .bind(TRAINKIT_OPTION(min_delta), rule::number(non_negative()), "Least change that counts as an improvement")
            .bind(TRAINKIT_OPTION(check_finite), rule::boolean(), "Stop at once when the metric is NaN or infinite");
    return b;
  }
};

/// Lightning's EarlyStopping as a Trainer hook. At each validation point (every epoch's end, and every
/// mid-epoch validation when TrainerOptions::val_every_steps / val_fraction ask for them; `patience`
/// then counts validations, as in Lightning), with `current` the monitored value:
/// non-finite (check_finite) → stop; better than stopping_threshold → stop; worse than divergence_threshold
/// → stop; improved (see min_delta) → best = current, wait = 0; else wait += 1 and stop when
/// wait >= patience. Best and wait are saved in the Trainer's checkpoints (key "early_stopping").
class EarlyStopping : public Callback {
 public:
  /// Throws std::invalid_argument naming the bad option.
  explicit EarlyStopping(EarlyStoppingOptions options = {});

  /// Applies the rule to `current`; returns whether to stop (and records why in stop_reason()).
  bool check(double current);
  /// Reads the monitored metric from `event` (throws std::invalid_argument listing the metrics there are
  /// when it is missing) and applies check().
  bool on_validation_point(Trainer& trainer, const EpochEvent& event) override;

  /// Best value so far (+inf for "min", -inf for "max" before the first check).
  double best_score() const { return best_; }
  /// Epochs since the last improvement.
  int64_t wait_count() const { return wait_; }
  /// The epoch at which it stopped training (-1 while it has not).
  int64_t stopped_epoch() const { return stopped_epoch_; }
  /// Why the last check() stopped, empty when it did not.
  const std::string& stop_reason() const { return reason_; }
  const EarlyStoppingOptions& options() const { return options_; }

  std::string state_key() const override { return "early_stopping"; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  bool better(double a, double b) const { return max_ ? a > b : a < b; }
  EarlyStoppingOptions options_;
  bool max_ = false;
  double best_;
  int64_t wait_ = 0;
  int64_t stopped_epoch_ = -1;
  std::string reason_;
};

}  // namespace trainkit::train
