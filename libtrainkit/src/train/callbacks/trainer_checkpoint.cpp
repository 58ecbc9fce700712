#include "trainkit/train/callbacks/trainer_checkpoint.h"

#include <string>
#include <utility>

#include <spdlog/spdlog.h>
#include <torch/serialize/output-archive.h>

#include "trainkit/train/trainer.h"

namespace trainkit::train {

TrainerCheckpoint::TrainerCheckpoint(std::shared_ptr<CheckpointManager> manager, int64_t every_steps)
    : manager_(std::move(manager)), every_steps_(every_steps) {}

void TrainerCheckpoint::write_checkpoint(Trainer& trainer) {
  torch::serialize::OutputArchive archive;
  trainer.save(archive);
  const std::string path = manager_->save(trainer.state().step, archive);
  last_saved_step_ = trainer.state().step;
  spdlog::debug("saved checkpoint {}", path);
}

void TrainerCheckpoint::on_train_begin(Trainer& trainer) { last_saved_step_ = trainer.state().step; }

bool TrainerCheckpoint::on_step_end(Trainer& trainer, const StepEvent& event) {
  // The last batch of an epoch is saved by on_epoch_end, after validation, pointing at the next epoch.
  if (every_steps_ > 0 && event.step % every_steps_ == 0 && !event.last_of_epoch) {
    write_checkpoint(trainer);
  }
  return false;
}

bool TrainerCheckpoint::on_epoch_end(Trainer& trainer, const EpochEvent&) {
  write_checkpoint(trainer);
  return false;
}

void TrainerCheckpoint::on_train_end(Trainer& trainer) {
  if (trainer.state().step != last_saved_step_) {
    write_checkpoint(trainer);
  }
}

}  // namespace trainkit::train
