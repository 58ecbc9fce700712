#pragma once
/// @file
/// A small, explicit training loop with hooks. It hides nothing that a hand-written LibTorch loop needs:
/// train_step() is forward → loss → backward → optimizer step, and every technique trainkit adds stays
/// usable without the Trainer.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/amp/autocast.h"
#include "trainkit/amp/grad_scaler.h"
#include "trainkit/data/batch_source.h"
#include "trainkit/sched/scheduler.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/metric.h"
#include "trainkit/train/step_times.h"
#include "trainkit/train/task.h"

namespace trainkit::train {

/// Where training stands; all of it is saved in checkpoints.
struct TrainerState {
  int64_t epoch = 0;  ///< current epoch (0-based)
  int64_t batch = 0;  ///< next batch of the current epoch
  int64_t step = 0;   ///< optimizer steps taken
  /// Sum of (mean batch loss × batch size) over the current epoch so far, and its sample count; kept in
  /// the state so that an epoch resumed mid-way reports the same training loss.
  at::Tensor epoch_loss_sum;
  int64_t epoch_samples = 0;
};

/// Options of a Trainer.
struct TrainerOptions {
  /// Epochs to train (fit() continues from the current state up to this many).
  TORCH_ARG(int64_t, epochs) = 1;
  /// Stop after this many optimizer steps in total (0 = no limit).
  TORCH_ARG(int64_t, max_steps) = 0;
  /// Micro-batches accumulated into one optimizer step (the last window of an epoch may be shorter).
  TORCH_ARG(int64_t, accumulation_steps) = 1;
  /// Clip the total gradient norm to this before each step (0 = no clipping).
  TORCH_ARG(double, clip_grad_norm) = 0.0;
  /// Order of that norm (p > 0 or infinity).
  TORCH_ARG(double, norm_type) = 2.0;
  /// Clamp every gradient element to [-v, v] before each step (0 = off).
  TORCH_ARG(double, clip_grad_value) = 0.0;
  /// Time each phase of every step (EpochEvent::times, epoch_times()); costs two clock reads per phase.
  TORCH_ARG(bool, profile) = true;
  /// Synchronize the device after each timed phase so that asynchronous (CUDA) work is charged to the
  /// phase that launched it; this removes the overlap of host and device work, so leave it off except
  /// to find where time goes. No effect on the CPU.
  TORCH_ARG(bool, profile_sync) = false;
  /// Also validate after every this many optimizer steps (counted over the run, so across epochs and
  /// resumes; 0 = at each epoch's end only). Lightning's integer `val_check_interval`.
  TORCH_ARG(int64_t, val_every_steps) = 0;
  /// Also validate after every `val_fraction` of an epoch's optimizer steps (1 = at each epoch's end
  /// only; 0.25 = four times per epoch). Lightning's fractional `val_check_interval`; needs a training
  /// source that knows its length.
  TORCH_ARG(double, val_fraction) = 1.0;

 public:
  /// The options by key, with their rules and help (`trainkit train`'s [train], [grad] and [profile]).
  static const OptionBinding<TrainerOptions>& binding() {
    static const auto b =
        OptionBinding<TrainerOptions>()
            .bind(TRAINKIT_OPTION(epochs), rule::integer(1), "Passes over the training set")
            .bind(TRAINKIT_OPTION(max_steps), rule::integer(0), "Stop after this many optimizer steps (0 = no limit)")
            .bind(TRAINKIT_OPTION(accumulation_steps), rule::integer(1),
                  "Micro-batches (of train.batch_size) accumulated into one optimizer step")
            .bind(TRAINKIT_OPTION(clip_grad_norm), rule::number(non_negative()),
                  "Clip the total gradient norm to this (0 = off)")
            .bind(TRAINKIT_OPTION(norm_type), rule::positive_or_inf(), "Order of the clipped norm")
            .bind(TRAINKIT_OPTION(clip_grad_value), rule::number(non_negative()),
                  "Clamp gradient elements to [-v, v] (0 = off)")
            .bind(TRAINKIT_OPTION(profile_sync), rule::boolean(),
                  "Synchronize the device after each timed phase of a step so that CUDA work is charged to the phase "
                  "that launched it (slower; the CPU is unaffected)")
            .bind(TRAINKIT_OPTION(val_every_steps), rule::integer(0),
                  "Also validate after every this many optimizer steps, counted over the run (0 = at epoch ends only)")
            .bind(TRAINKIT_OPTION(val_fraction), rule::number({"number in (0, 1]", 0.0, true, 1.0}),
                  "Also validate after every this fraction of an epoch's steps (1 = at epoch ends only)");
    return b;
  }
};

/// Trains a model with any torch::optim::Optimizer over any BatchSource, calling Callbacks.
class Trainer {
 public:
  using ForwardFn = train::ForwardFn;
  using LossFn = train::LossFn;

  /// `module` owns the parameters (saved in checkpoints); `forward` maps a batch to the output. The
  /// classification defaults apply until replaced: cross-entropy loss and the accuracy metric.
  Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, torch::optim::Optimizer& optimizer,
          TrainerOptions options = {});

  /// Convenience for module holders with a `forward(Tensor)` (torch::nn::Sequential, Linear, ...): the
  /// forward runs on the batch's input 0.
  template <class Holder>
  Trainer(Holder model, torch::optim::Optimizer& optimizer, TrainerOptions options = {})
      : Trainer(model.ptr(), forward_first_input(model), optimizer, options) {}

  /// Replaces the loss. Unless set_metrics() was called, this also drops the default accuracy metric
  /// (a task with its own loss chooses its own metrics).
  void set_loss(LossFn loss);
  /// The loss evaluate() reports, when it differs from the training loss (a smoothed or regularized
  /// training loss against the plain one on held-out data); an empty function = the training loss.
  void set_eval_loss(LossFn loss) { eval_loss_ = std::move(loss); }
  /// The metrics evaluate() computes besides the loss (replaces the defaults; empty = loss only).
  void set_metrics(std::vector<std::shared_ptr<Metric>> metrics);
  /// Sums a 1-D float64 CPU tensor in place across data-parallel ranks (e.g. an all-reduce of the
  /// process group). With it, evaluate() reports loss and metrics over the data of every rank.
  void set_metric_reducer(std::function<void(at::Tensor&)> reducer) { reducer_ = std::move(reducer); }
  /// Steps `scheduler` after every optimizer step (`per_step`) or after every epoch; a metric-driven
  /// scheduler (ReduceLROnPlateau) is stepped per epoch with `monitor`, a name of EpochEvent::metrics
  /// ("val/loss", "val/accuracy", "train/loss", ...); "val/loss" falls back to "train/loss" when there is
  /// no validation source. Its state is saved and loaded with the Trainer's.
  void set_scheduler(std::shared_ptr<sched::LRScheduler> scheduler, bool per_step,
                     std::string monitor = "val/loss");
  /// Runs every forward (and the loss) under autocast to `dtype` on `device` (evaluation too).
  void set_autocast(c10::DeviceType device, c10::ScalarType dtype);
  /// Scales the loss, unscales before clipping, skips steps with inf/NaN gradients and updates the scale;
  /// its state is saved and loaded with the Trainer's.
  void set_grad_scaler(std::shared_ptr<amp::GradScaler> scaler) { scaler_ = std::move(scaler); }
  /// Makes a guard under which backward does not synchronise gradients across data-parallel ranks.
  using NoSyncFn = std::function<std::shared_ptr<void>()>;
  /// fit() calls `no_sync` before the backward of every micro-batch that is not the last of its
  /// accumulation window and keeps the guard until that backward returns, so gradients are communicated
  /// once per optimizer step. For DDP: `[&ddp] { return std::make_shared<DistributedDataParallel::
  /// NoSyncGuard>(ddp); }`. Without it every backward synchronises (the same result, more traffic).
  void set_no_sync(NoSyncFn no_sync) { no_sync_ = std::move(no_sync); }
  /// Clips the gradients to `max_norm` and returns their total norm before clipping (0-dim).
  using ClipGradNormFn = std::function<at::Tensor(double max_norm, double norm_type)>;
  /// Replaces grad::clip_grad_norm_ over the optimizer's parameters for TrainerOptions::clip_grad_norm:
  /// e.g. dist::ZeroRedundancyOptimizer::clip_grad_norm_, whose norm spans every rank's gradient shard.
  void set_clip_grad_norm(ClipGradNormFn clip) { clip_grad_norm_fn_ = std::move(clip); }
  /// Writes or reads the model's part of a checkpoint (the archive under "model").
  using ModelSaveFn = std::function<void(torch::serialize::OutputArchive&)>;
  using ModelLoadFn = std::function<void(torch::serialize::InputArchive&)>;
  /// Replaces how save() and load() write and read the model (by default its parameters and buffers, read
  /// back in place): e.g. dist::FullyShardedDataParallel::save_model / load_model, where each rank holds
  /// only its shard of the parameters. Empty functions restore the default.
  void set_model_state(ModelSaveFn save, ModelLoadFn load) {
    save_model_ = std::move(save);
    load_model_ = std::move(load);
  }
  /// Adds a hook; hooks run in the order added.
  void add_callback(std::shared_ptr<Callback> callback) { callbacks_.push_back(std::move(callback)); }

  /// One step on one batch: backward() then optimizer_step(). Returns the detached loss (no host sync).
  /// Does not touch the TrainerState. Batches are used on the device they are on (see DeviceSource).
  at::Tensor train_step(const data::Batch& batch);
  /// Forward, loss, and backward of loss · `loss_scale` (accumulation). Returns the detached, unscaled
  /// mean loss.
  at::Tensor backward(const data::Batch& batch, double loss_scale = 1.0);
  /// Clips (per the options), steps the optimizer and zeroes the gradients.
  void optimizer_step();
  /// Mean loss and the metrics over epoch 0 of `source`, in eval mode without gradients. Throws
  /// std::invalid_argument when the source yields no batch.
  EvalResult evaluate(data::BatchSource& source);
  /// Trains from the current state until `epochs` or `max_steps`, or until a hook stops it. Each epoch
  /// e reads `train` after set_epoch(e) (and skip() to the saved batch when resuming mid-epoch). When the
  /// source cannot tell its length, the end of an epoch is found by reading one batch ahead, and the
  /// last, shorter accumulation window is scaled like a full one. `val` (optional) is evaluated after
  /// every epoch, and mid-epoch as TrainerOptions::val_every_steps / val_fraction ask (see
  /// Callback::on_validation_point).
  void fit(data::BatchSource& train, data::BatchSource* val = nullptr);
  /// Asks fit() to stop after the current step.
  void request_stop() { stop_ = true; }

  /// Writes model parameters and buffers (or what set_model_state() writes), optimizer state, scheduler state,
  /// TrainerState and the CPU RNG state.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores everything save() wrote.
  void load(torch::serialize::InputArchive& archive);

  /// Where training stands.
  const TrainerState& state() const { return state_; }
  /// The options (mutable, e.g. to extend `epochs` on resume).
  TrainerOptions& options() { return options_; }
  /// The trained module.
  torch::nn::Module& module() { return *module_; }
  /// The optimizer.
  torch::optim::Optimizer& optimizer() { return optimizer_; }
  /// The GradScaler set by set_grad_scaler() (null when none).
  const std::shared_ptr<amp::GradScaler>& grad_scaler() const { return scaler_; }
  /// The device type and dtype set by set_autocast() (empty when none).
  const std::optional<std::pair<c10::DeviceType, c10::ScalarType>>& autocast() const { return autocast_; }
  /// The metrics evaluate() computes.
  const std::vector<std::shared_ptr<Metric>>& metrics() const { return metrics_; }
  /// The total gradient norm that the last optimizer_step()'s clip_grad_norm_ returned (before clipping;
  /// a 0-dim tensor on the gradients' device, not synced); undefined when norm clipping is off.
  const at::Tensor& last_grad_norm() const { return grad_norm_; }
  /// Where the current epoch's time went so far (reset when an epoch starts); see StepTimes.
  const StepTimes& epoch_times() const { return times_; }
  /// The forward the Trainer runs on every batch (training and evaluation), as given to the constructor.
  const ForwardFn& forward_fn() const { return forward_; }

 private:
  std::vector<at::Tensor> optimizer_params() const;
  at::Tensor forward_loss(const data::Batch& batch);
  /// An autocast region when set_autocast() was called, else nothing.
  std::optional<amp::Autocast> autocast_region() const;
  /// With profile_sync, waits for the work queued on `device` (nothing on the CPU).
  void sync_for_profile(const c10::Device& device) const;
  /// Whether the step just taken (state_ already counts it) is a mid-epoch validation point.
  bool validation_due(int64_t num_batches) const;
  /// Evaluates `val` into `event` (when given), runs the hooks' on_validation_end, steps a metric-driven
  /// scheduler and runs on_validation_point; returns whether a hook asked to stop.
  bool validation_point(data::BatchSource* val, EpochEvent& event);

  std::shared_ptr<torch::nn::Module> module_;
  ModelSaveFn save_model_;
  ModelLoadFn load_model_;
  ForwardFn forward_;
  torch::optim::Optimizer& optimizer_;
  TrainerOptions options_;
  LossFn loss_;
  LossFn eval_loss_;  ///< empty: evaluate() reports loss_
  std::vector<std::shared_ptr<Metric>> metrics_;
  bool metrics_set_ = false;
  std::function<void(at::Tensor&)> reducer_;
  NoSyncFn no_sync_;
  ClipGradNormFn clip_grad_norm_fn_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::shared_ptr<sched::LRScheduler> scheduler_;
  bool scheduler_per_step_ = false;
  std::string monitor_ = "val/loss";
  std::shared_ptr<amp::GradScaler> scaler_;
  std::optional<std::pair<c10::DeviceType, c10::ScalarType>> autocast_;
  TrainerState state_;
  at::Tensor grad_norm_;
  StepTimes times_;
  bool stop_ = false;
};

}  // namespace trainkit::train
