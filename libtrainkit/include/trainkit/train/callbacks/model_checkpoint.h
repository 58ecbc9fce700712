#pragma once
/// @file
/// Keeps the best K models by a monitored metric (PyTorch Lightning's `ModelCheckpoint` rules) as
/// weights-only files (save_weights, train/checkpoint.h) that plain LibTorch loads with
/// `torch::load(model, path)`. The resumable checkpoints (model, optimizer, schedulers, hooks) are
/// TrainerCheckpoint's, through a CheckpointManager that keeps the last K by step.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

#include "trainkit/train/callback.h"

namespace trainkit::train {

/// Options of ModelCheckpoint; names and defaults are Lightning's where it has them.
struct ModelCheckpointOptions {
  ModelCheckpointOptions() = default;
  /// Files go to `dir` (created on first save).
  explicit ModelCheckpointOptions(std::string dir) : dir_(std::move(dir)) {}
  /// Directory of the weight files.
  TORCH_ARG(std::string, dir);
  /// A name of EpochEvent::metrics ("val/loss", "val/accuracy", "val_ema/loss", ...).
  TORCH_ARG(std::string, monitor) = "val/loss";
  /// "min" (lower is better) or "max".
  TORCH_ARG(std::string, mode) = "min";
  /// Models kept: 0 = none, -1 = every validation point's.
  TORCH_ARG(int64_t, save_top_k) = 1;
  /// Also write "last.pt" at every epoch end.
  TORCH_ARG(bool, save_last) = false;
  /// Beside every file written, interchange copies of the same weights (io::export_weights: "safetensors",
  /// "state_dict"), deleted with it.
  TORCH_ARG(std::vector<std::string>, export_formats) = {};

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [checkpoint]; `dir` is the run's).
  static const OptionBinding<ModelCheckpointOptions>& binding() {
    static const auto b =
        OptionBinding<ModelCheckpointOptions>()
            .bind(TRAINKIT_OPTION(save_top_k), rule::integer(-1),
                  "Keep the best K models by checkpoint.monitor as weights-only files in <run>/best/ that torch::load "
                  "reads (0 = off, -1 = every epoch's)")
            .bind(TRAINKIT_OPTION(monitor), epoch_metric_rule(),
                  "The metric ranking the best models (\"val/loss\", \"val/<metric>\", \"val_ema/<loss or metric>\", "
                  "\"train/loss\")")
            .bind(TRAINKIT_OPTION(mode), rule::one_of({"min", "max"}), "Whether lower or higher checkpoint.monitor is better")
            .bind(TRAINKIT_OPTION(save_last), rule::boolean(), "Also write <run>/best/last.pt (weights only) every epoch");
    return b;
  }
};

/// Lightning's ModelCheckpoint top-k rule at each validation point (every epoch's end and every mid-epoch
/// validation), with `current` the monitored value (NaN
/// is kept as the worst value, +inf for "min" / -inf for "max"):
/// - fewer than k kept, or k == -1 → save;
/// - else save when current is strictly better than the k-th best, which is then deleted.
/// Files are named "epoch=<E>-step=<S>.pt" (E 0-based as Lightning). The kept list is saved in the
/// Trainer's checkpoints (key "model_checkpoint") and restored on resume.
class ModelCheckpoint : public Callback {
 public:
  /// Throws std::invalid_argument naming the bad option.
  explicit ModelCheckpoint(ModelCheckpointOptions options);

  /// Applies the rule for a model named `name` scoring `current`; returns {saved?, file deleted or ""}
  /// and updates the kept list without touching files (on_validation_point writes and deletes them).
  std::pair<bool, std::string> update(const std::string& name, double current);
  /// Reads the monitored metric, applies update() and writes/deletes the weight files.
  bool on_validation_point(Trainer& trainer, const EpochEvent& event) override;

  /// The kept models as (file name, score), in the order they were saved.
  const std::vector<std::pair<std::string, double>>& best_k_models() const { return best_k_; }
  /// File name of the best model kept ("" when none).
  std::string best_model_path() const;
  /// Its score (NaN when none).
  double best_model_score() const;
  const ModelCheckpointOptions& options() const { return options_; }

  std::string state_key() const override { return "model_checkpoint"; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  bool better(double a, double b) const { return max_ ? a > b : a < b; }
  /// Index of the k-th (worst) kept model: the first maximum for "min" (Python's max over the dict).
  size_t worst_index() const;
  ModelCheckpointOptions options_;
  bool max_ = false;
  std::vector<std::pair<std::string, double>> best_k_;
};

}  // namespace trainkit::train
