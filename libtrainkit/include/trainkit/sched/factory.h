#pragma once
/// @file
/// Builds schedulers from TOML tables whose keys are PyTorch's argument names, e.g.
/// `type = "CosineAnnealingLR"`, `T_max = 100`, `eta_min = 1e-5`; SequentialLR and ChainedScheduler take
/// their members as `[[schedulers]]` tables. Used by `trainkit train` (`[scheduler]`) and `apps/schedule`.

#include <memory>
#include <string>
#include <vector>

#include "trainkit/sched/scheduler.h"

namespace trainkit::sched {

/// What the caller knows about the run, used for defaults (OneCycleLR's and WarmupCosine's length).
struct SchedulerContext {
  int64_t epochs = 0;           ///< epochs of the run (0 = unknown)
  int64_t steps_per_epoch = 0;  ///< optimizer steps per epoch (0 = unknown)
};

/// A scheduler built from a table, and when to step it.
struct BuiltScheduler {
  std::shared_ptr<LRScheduler> scheduler;
  /// "step" (after every optimizer step) or "epoch" (after every epoch); key `interval`, defaulting to
  /// "step" for CyclicLR, OneCycleLR and WarmupCosine and "epoch" for the others.
  std::string interval;
};

/// Builds the scheduler described by the TOML table `toml_text` for `optimizer`. Unknown types or keys,
/// wrong types and invalid values throw std::invalid_argument naming `source` and the key.
/// Without total_steps, OneCycleLR and WarmupCosine run for the whole run (`context`), counted in the
/// scheduler's interval.
BuiltScheduler make_scheduler(const std::string& toml_text, torch::optim::Optimizer& optimizer,
                              const std::string& source, const SchedulerContext& context = {});

/// The `type` names make_scheduler accepts.
std::vector<std::string> scheduler_types();

}  // namespace trainkit::sched
