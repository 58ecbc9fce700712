#pragma once
/// @file
/// A Trainer hook that writes resumable checkpoints (the whole Trainer state) through a CheckpointManager.

#include <cstdint>
#include <memory>

#include "trainkit/train/callback.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::train {

/// Saves the Trainer through a CheckpointManager every `every_steps` steps (0 = never mid-epoch), at each
/// epoch end, and when training ends (unless that step is already saved).
class TrainerCheckpoint : public Callback {
 public:
  TrainerCheckpoint(std::shared_ptr<CheckpointManager> manager, int64_t every_steps);
  void on_train_begin(Trainer& trainer) override;
  bool on_step_end(Trainer& trainer, const StepEvent& event) override;
  bool on_epoch_end(Trainer& trainer, const EpochEvent& event) override;
  void on_train_end(Trainer& trainer) override;

 private:
  void write_checkpoint(Trainer& trainer);  // (not `save`: that would hide Callback::save)
  std::shared_ptr<CheckpointManager> manager_;
  int64_t every_steps_;
  int64_t last_saved_step_ = -1;
};

}  // namespace trainkit::train
