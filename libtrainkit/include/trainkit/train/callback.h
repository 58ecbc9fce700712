#pragma once
/// @file
/// The Trainer's hook interface (`Callback`) and what its hooks receive: the step and epoch events and the
/// result of an evaluation pass. A hook includes this header, not the Trainer's; the ready-made hooks live
/// one per header under `trainkit/train/callbacks/`.

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/data/batch_source.h"
#include "trainkit/options.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/step_times.h"

namespace trainkit::train {

/// Loss and metrics of an evaluation pass.
struct EvalResult {
  double loss = 0;        ///< mean loss per sample
  int64_t samples = 0;    ///< samples evaluated (over every rank when a reducer is set)
  MetricValues metrics;   ///< the Trainer's metrics by name ("accuracy", "mse", ...)
  /// The value of metric `name`; throws std::out_of_range listing the metrics there are.
  double metric(const std::string& name) const { return metrics.at(name); }
};

/// Passed to Callback::on_step_end after each optimizer step.
struct StepEvent {
  int64_t epoch;
  int64_t batch;        ///< index of the (last) batch of this step
  int64_t num_batches;  ///< batches in this epoch (BatchSource::kUnknownLength when the source cannot tell)
  bool last_of_epoch;   ///< whether this step closed the epoch
  int64_t step;         ///< steps taken so far (this one included)
  int64_t samples;      ///< samples in the step (all micro-batches of an accumulation window)
  at::Tensor loss;      ///< detached mean loss over those samples (reading it syncs the device)
};

/// What a validation point measured: passed at each epoch's end (Callback::on_validation_end,
/// on_validation_point, on_epoch_end) and at each mid-epoch validation (the first two only, with
/// `epoch_end` false).
struct EpochEvent {
  int64_t epoch;                   ///< the epoch that ended, or that is under way (0-based)
  int64_t step;                    ///< steps taken so far
  double train_loss;               ///< mean training loss over the epoch (so far, mid-epoch)
  std::optional<EvalResult> val;   ///< validation result, when a validation source was given
  /// Everything measured this epoch by name: "train/loss", and with validation "val/loss" and
  /// "val/<metric>" for each metric.
  MetricValues metrics;
  /// Where the epoch's time went (zeros when TrainerOptions::profile is off). An epoch resumed mid-way
  /// covers only the steps run since the resume.
  StepTimes times;
  /// False for a mid-epoch validation (TrainerOptions::val_every_steps, val_fraction).
  bool epoch_end = true;
};

class Trainer;

/// Training-loop hooks; return true from on_step_end/on_epoch_end to stop training.
class Callback {
 public:
  virtual ~Callback() = default;
  /// Before the first step of fit().
  virtual void on_train_begin(Trainer& trainer) {}
  /// In optimizer_step(), after the step's backward passes and before clipping and the optimizer step,
  /// while the gradients are there to read (Lightning's on_before_optimizer_step). Under a GradScaler
  /// they are unscaled already when the Trainer clips, else still multiplied by the scale
  /// (Trainer::grad_scaler()->stage(optimizer) tells).
  virtual void on_before_optimizer_step(Trainer& trainer) {}
  /// After each optimizer step.
  virtual bool on_step_end(Trainer& trainer, const StepEvent& event) { return false; }
  /// After each validation (at an epoch's end also without a validation source, `val` then null), before
  /// a metric-driven scheduler steps: a hook may evaluate more (e.g. averaged weights on `val`) and add
  /// its values to `event.metrics`, which schedulers and later hooks then see. `event.epoch_end` tells a
  /// mid-epoch validation from an epoch's end.
  virtual void on_validation_end(Trainer& trainer, data::BatchSource* val, EpochEvent& event) {}
  /// After each validation point (every epoch's end and every mid-epoch validation), once the hooks have
  /// added their metrics and a metric-driven scheduler has stepped: where a hook acts on a monitored value
  /// (early stopping, best-k checkpoints). Return true to stop training.
  virtual bool on_validation_point(Trainer& trainer, const EpochEvent& event) { return false; }
  /// After each complete epoch (and its validation); the state already points at the next epoch.
  virtual bool on_epoch_end(Trainer& trainer, const EpochEvent& event) { return false; }
  /// When fit() returns, whether it finished or was stopped.
  virtual void on_train_end(Trainer& trainer) {}

  /// A non-empty key makes Trainer::save()/load() write/read this hook's state under "callbacks/<key>".
  virtual std::string state_key() const { return {}; }
  /// Writes the hook's resumable state (called by Trainer::save when state_key() is not empty).
  virtual void save(torch::serialize::OutputArchive& archive) const {}
  /// Restores what save() wrote.
  virtual void load(torch::serialize::InputArchive& archive) {}
};

/// The value of `monitor` in `event.metrics`; throws std::invalid_argument naming `who`, the epoch and the
/// metrics there are when it is missing. How a hook reads the metric it monitors.
double monitored_value(const EpochEvent& event, const std::string& monitor, const std::string& who);

/// Adds `prefix` + "loss" and `prefix` + each metric of `result` to `event.metrics` (a hook that evaluates
/// more in on_validation_end, e.g. with prefix "val_ema/").
void add_eval_metrics(EpochEvent& event, const std::string& prefix, const EvalResult& result);

/// The names a hook can monitor at an epoch's end: "train/loss", "val/<loss or metric>" or
/// "val_ema/<loss or metric>" (a config key's rule; whether the run measures it is checked when it runs).
ValueRule<std::string> epoch_metric_rule();

}  // namespace trainkit::train
