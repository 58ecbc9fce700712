#pragma once
/// @file
/// Where a training step's wall time goes: waiting for data, forward, backward, optimizer, hooks
/// (Lightning's SimpleProfiler, per epoch). The Trainer fills one per epoch (EpochEvent::times).

#include <cstdint>
#include <string>

namespace trainkit::train {

/// Wall-clock seconds spent in each phase of training over some steps. On a device that runs
/// asynchronously (CUDA) a phase is charged only for launching its work unless
/// TrainerOptions::profile_sync is set; the waiting then shows up where the host next waits (usually
/// `other`, where the step's loss is read back).
struct StepTimes {
  double data = 0;        ///< waiting for the training source's next batch (loading, augmentation, copies)
  double forward = 0;     ///< forward and loss (under autocast when set)
  double backward = 0;    ///< backward
  double optimizer = 0;   ///< unscaling, clipping, the optimizer step, zero_grad and a per-step scheduler
  double callbacks = 0;   ///< on_step_end hooks (logging, checkpoints, EMA, ...)
  double total = 0;       ///< wall time of the steps, from the first batch request to the last hook
  double validation = 0;  ///< the epoch's evaluation and on_validation_end hooks (not part of `total`)
  int64_t steps = 0;          ///< optimizer steps timed
  int64_t micro_batches = 0;  ///< forward/backward passes timed

  /// `total` minus the five phases: the Trainer's own bookkeeping (reading the loss back, accumulation).
  double other() const { return total - (data + forward + backward + optimizer + callbacks); }
  /// Adds `o` phase by phase.
  StepTimes& operator+=(const StepTimes& o);
  /// One line for a log: "41.2 s in 430 steps (95.8 ms/step): data 2.1%, forward 30.5%, ...; validation 3.1 s".
  std::string to_string() const;
  /// A JSON object on one line: {"steps":N,"micro_batches":M,"total_s":...,"data_s":...,...,"validation_s":...}
  /// (seconds in their shortest round-trip form; a non-finite one is null).
  std::string to_json() const;
};

}  // namespace trainkit::train
