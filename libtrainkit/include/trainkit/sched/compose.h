#pragma once
/// @file
/// Composition: SequentialLR (one scheduler after another at milestones) and ChainedScheduler (several
/// stepped together, their factors multiplying), with PyTorch's semantics.

#include <memory>
#include <vector>

#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// Runs schedulers[i] from milestones[i-1] on; at a milestone the next scheduler restarts from its
/// epoch 0 (closed form where it has one). All must drive `optimizer`; ReduceLROnPlateau is rejected.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  std::string name() const override { return "SequentialLR"; }
  void step() override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> get_lr() override { return group_lrs(); }
  /// Passes the undo on to every scheduler held.
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps every scheduler in order at each step(), so their multiplicative effects chain.
class ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  std::string name() const override { return "ChainedScheduler"; }
  void step() override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> get_lr() override { return group_lrs(); }
  /// Passes the undo on to every scheduler held.
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

/// Registers SequentialLR and ChainedScheduler (members as an array of tables `schedulers`) with the scheduler factory (sched/factory.h); runs once, before main.
bool register_compose_schedulers();
/// Makes every program that includes this header register them (and link their source).
inline const bool compose_schedulers_registered = register_compose_schedulers();

}  // namespace trainkit::sched
