#pragma once
/// @file
/// A Trainer hook that writes training metrics to metrics files, the console (or a progress bar) and
/// TensorBoard.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "trainkit/log/metrics.h"
#include "trainkit/log/progress.h"
#include "trainkit/log/summary_writer.h"
#include "trainkit/train/callback.h"
#include "trainkit/train/step_times.h"

namespace trainkit::train {

/// Every `every_steps` steps: one "train" metrics row (mean loss over the interval, LR of group 0,
/// samples/s, and the monitors: every group's LR and momentum or beta1, the clip's gradient norm) and a
/// console line, or a progress bar redrawn each step when `bar`. At each epoch end: an
/// "epoch" row with validation loss and accuracy. The same values go to TensorBoard when a writer is given
/// (tags train/loss, train/lr, train/samples_per_second, epoch/train_loss, val/loss, val/accuracy), and there
/// also every param group's LR and momentum or beta1 (train/lr/group_<i>, train/momentum/group_<i>), the
/// gradient norm that clipping computed (train/grad_norm, when grad-norm clipping is on) and what hooks add to
/// the epoch's metrics (val_ema/loss, ...).
/// Reads the loss from the device only at those points.
class MetricsLogger : public Callback {
 public:
  /// The monitor columns that the train rows fill for `optimizer`, for MetricsWriter: `lr_group_<i>` for
  /// every param group, `momentum_group_<i>` (momentum or beta1) for those that have one, and `grad_norm`
  /// when `grad_norm` (the Trainer clips by norm).
  static std::vector<std::string> monitor_columns(const torch::optim::Optimizer& optimizer, bool grad_norm);
  /// `metrics` and `tensorboard` may be null.
  MetricsLogger(std::shared_ptr<log::MetricsWriter> metrics, int64_t every_steps, bool bar,
                  std::shared_ptr<log::SummaryWriter> tensorboard = nullptr);
  void on_train_begin(Trainer& trainer) override;
  bool on_step_end(Trainer& trainer, const StepEvent& event) override;
  /// A mid-epoch validation: a row of kind "val" (the epoch's end writes its "epoch" row in on_epoch_end).
  bool on_validation_point(Trainer& trainer, const EpochEvent& event) override;
  bool on_epoch_end(Trainer& trainer, const EpochEvent& event) override;
  void on_train_end(Trainer& trainer) override;

  /// Samples trained and seconds spent in steps (evaluation excluded) since on_train_begin.
  int64_t samples_trained() const { return total_samples_; }
  /// See samples_trained().
  double train_seconds() const { return total_seconds_; }
  /// The step-time profile of every epoch trained since on_train_begin (a run stopped mid-epoch adds its
  /// partial last epoch), in order.
  const std::vector<StepTimes>& epoch_step_times() const { return epoch_times_; }
  /// Their sum.
  StepTimes step_times() const;
  /// Steps since on_train_begin at which norm clipping scaled the gradients down: the clip coefficient
  /// max_norm / (total norm + 1e-6) of grad::clip_grad_norm_ was below 1 (0 when norm clipping is off).
  /// Counted on the gradients' device without a sync; reading it syncs once.
  int64_t clipped_steps() const;

 private:
  /// The row, console line and TensorBoard scalars of a validation point ("epoch" or mid-epoch "val").
  void write_validation(Trainer& trainer, const EpochEvent& event);
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<log::MetricsWriter> metrics_;
  std::shared_ptr<log::SummaryWriter> tensorboard_;
  int64_t every_steps_;
  bool bar_;
  log::ProgressBar progress_;
  at::Tensor interval_loss_;
  int64_t interval_steps_ = 0;
  int64_t interval_samples_ = 0;
  double interval_seconds_ = 0;
  int64_t total_samples_ = 0;
  double total_seconds_ = 0;
  double last_loss_ = 0;
  double last_rate_ = 0;
  Clock::time_point last_;
  std::vector<StepTimes> epoch_times_;
  at::Tensor clipped_steps_;  ///< 0-dim int64 on the gradients' device; undefined until a clipped step
};

}  // namespace trainkit::train
