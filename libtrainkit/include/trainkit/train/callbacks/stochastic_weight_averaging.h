#pragma once
/// @file
/// Stochastic Weight Averaging as a Trainer hook (Lightning's `StochasticWeightAveraging`): averages the
/// weights of the last epochs with AveragedModel and anneals the LR with SWALR (train/swa.h).

#include <cstdint>
#include <memory>
#include <string>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "trainkit/options.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/swa.h"

namespace trainkit::train {

/// Options of StochasticWeightAveraging.
struct StochasticWeightAveragingOptions {
  StochasticWeightAveragingOptions() = default;
  explicit StochasticWeightAveragingOptions(double swa_lr) : swa_lr_(swa_lr) {}
  /// First epoch (0-based) whose end is averaged in.
  TORCH_ARG(int64_t, swa_start) = 0;
  /// SWALR's target LR (every param group); 0 = leave the LR to the Trainer's scheduler.
  TORCH_ARG(double, swa_lr) = 0.0;
  /// SWALR's anneal_epochs.
  TORCH_ARG(int64_t, anneal_epochs) = 10;
  /// SWALR's anneal_strategy.
  TORCH_ARG(std::string, anneal_strategy) = "cos";

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [swa]).
  static const OptionBinding<StochasticWeightAveragingOptions>& binding() {
    static const auto b =
        OptionBinding<StochasticWeightAveragingOptions>()
            .bind(TRAINKIT_OPTION(swa_start), rule::integer(0), "First epoch (0-based) averaged in")
            .bind(TRAINKIT_OPTION(swa_lr), rule::number(non_negative()),
                  "SWALR's target LR, which then overrides the scheduler (0 = keep the scheduler's LR)")
            .bind(TRAINKIT_OPTION(anneal_epochs), rule::integer(0), "SWALR's annealing epochs")
            .bind(TRAINKIT_OPTION(anneal_strategy), rule::one_of({"cos", "linear"}), "SWALR's annealing shape");
    return b;
  }
};

/// SWA as a Trainer hook. After the validation of every epoch e >= swa_start the model is averaged in
/// (AveragedModel, equal weights) and, when swa_lr > 0, SWALR steps (created at the first such epoch on the
/// groups' LRs then): from then on SWALR owns the LR — the hook writes SWALR's LR back after every
/// optimizer step and epoch end, overriding the Trainer's scheduler, as PyTorch's recipe steps
/// `swa_scheduler` instead of `scheduler`. The averaged weights are not evaluated per epoch (BatchNorm
/// statistics would need update_bn each time); use ScopedWeights + update_bn + Trainer::evaluate at the end.
/// State (average, count, SWALR) is saved under "swa" in the Trainer's checkpoints.
class StochasticWeightAveraging : public Callback {
 public:
  /// Averages `model` (the Trainer's module); SWALR drives `optimizer`.
  StochasticWeightAveraging(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                            StochasticWeightAveragingOptions options = {});
  bool on_step_end(Trainer& trainer, const StepEvent& event) override;
  void on_validation_end(Trainer& trainer, data::BatchSource* val, EpochEvent& event) override;
  bool on_epoch_end(Trainer& trainer, const EpochEvent& event) override;
  AveragedModel& averaged() { return averaged_; }
  /// The SWALR, once SWA has begun with swa_lr > 0 (else null).
  SWALR* scheduler() { return swalr_.get(); }

  std::string state_key() const override { return "swa"; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void apply_swa_lr();
  torch::optim::Optimizer& optimizer_;
  StochasticWeightAveragingOptions options_;
  AveragedModel averaged_;
  std::unique_ptr<SWALR> swalr_;
};

}  // namespace trainkit::train
