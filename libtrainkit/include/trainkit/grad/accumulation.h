#pragma once
/// @file
/// Gradient accumulation: N micro-batches make one optimizer step. Works from a hand-written loop and
/// inside the Trainer; the distributed work uses sync_now() to skip gradient all-reduce (no_sync).
///
///   trainkit::grad::GradAccumulation acc(4, loader.num_batches());
///   for (int64_t b = 0; b < loader.num_batches(); ++b) {
///     (loss_of(b) * acc.loss_scale()).backward();
///     if (acc.sync_now()) { optimizer.step(); optimizer.zero_grad(); }
///     acc.next();
///   }

#include <cstdint>

namespace trainkit::grad {

/// Tracks the position in accumulation windows of `accumulation_steps` micro-batches over an epoch of
/// `micro_batches_per_epoch` (0 = unknown: every window is full). The last window of an epoch may be
/// shorter; its micro-batches are scaled by 1/(its real size) so that each step sees a mean gradient.
class GradAccumulation {
 public:
  /// Throws std::invalid_argument for accumulation_steps < 1 or micro_batches_per_epoch < 0.
  explicit GradAccumulation(int64_t accumulation_steps, int64_t micro_batches_per_epoch = 0);

  /// Factor for the current micro-batch's mean loss: 1 / (size of its window).
  double loss_scale() const;
  /// True when the current micro-batch closes its window: step the optimizer after its backward
  /// (and, under DDP, let this backward all-reduce).
  bool sync_now() const;
  /// Moves to the next micro-batch (wrapping to the first of the next epoch).
  void next();
  /// Jumps to micro-batch `index` of the epoch (for resuming).
  void seek(int64_t index);
  /// Index of the current micro-batch in its epoch.
  int64_t position() const { return position_; }
  /// Micro-batches per window.
  int64_t accumulation_steps() const { return steps_; }
  /// Size of the window holding the current micro-batch (steps, or the short remainder at epoch end).
  int64_t window_size() const;

 private:
  int64_t steps_;
  int64_t per_epoch_;
  int64_t position_ = 0;
};

}  // namespace trainkit::grad
