#pragma once
/// @file
/// A Trainer hook that keeps an exponential moving average of the weights (ModelEma, train/ema.h) and
/// evaluates it beside the raw weights: Lightning's `EMAWeightAveraging`, with timm's `ModelEmaV3` rules.

#include <string>

#include <torch/nn/module.h>

#include "trainkit/train/callback.h"
#include "trainkit/train/ema.h"

namespace trainkit::train {

/// Updates a ModelEma after every optimizer step (with the step count) and, after each validation,
/// evaluates the averaged weights on the validation source with the Trainer's forward, loss and metrics,
/// adding "val_ema/loss" and "val_ema/<metric>" to the epoch's metrics (so EarlyStopping, ModelCheckpoint
/// and ReduceLROnPlateau can monitor them). Its state is saved under "ema" in the Trainer's checkpoints.
/// Add it before a TrainerCheckpoint, so that a checkpoint taken at a step holds that step's update.
class EMAWeightAveraging : public Callback {
 public:
  /// Averages `model` (the Trainer's module).
  EMAWeightAveraging(const torch::nn::Module& model, ModelEmaOptions options = {});
  bool on_step_end(Trainer& trainer, const StepEvent& event) override;
  void on_validation_end(Trainer& trainer, data::BatchSource* val, EpochEvent& event) override;
  /// Evaluates the averaged weights on `source` (the module's own weights are restored afterwards).
  EvalResult evaluate(Trainer& trainer, data::BatchSource& source);
  ModelEma& ema() { return ema_; }

  std::string state_key() const override { return "ema"; }
  void save(torch::serialize::OutputArchive& archive) const override { ema_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { ema_.load(archive); }

 private:
  ModelEma ema_;
};

}  // namespace trainkit::train
