#pragma once
/// @file
/// The base of every LR scheduler. It drives any torch::optim::Optimizer through its param groups'
/// options (`get_lr`/`set_lr`), with the semantics of PyTorch's `torch.optim.lr_scheduler.LRScheduler`:
/// construction performs the initial step (last_epoch -1 → 0), `step()` advances one epoch or batch,
/// `get_last_lr()` returns one LR per param group.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace trainkit::sched {

/// Base class of all schedulers (ReduceLROnPlateau and the compositions included).
class LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one step and writes the new LR of every param group. Metric-driven schedulers
  /// (takes_metric()) throw std::logic_error here; call step(metric).
  virtual void step();
  /// Advances one step given a metric (ReduceLROnPlateau); others throw std::logic_error.
  virtual void step(double metric);
  /// True for schedulers stepped with a metric.
  virtual bool takes_metric() const { return false; }

  /// The LRs written by the last step, one per param group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Steps taken since the initial step (PyTorch's `last_epoch`).
  int64_t last_epoch() const { return last_epoch_; }
  /// The LRs the schedule is relative to (PyTorch's `base_lrs`).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The driven optimizer.
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  /// PyTorch's class name, e.g. "CosineAnnealingLR".
  virtual std::string name() const = 0;

  /// Writes the scheduler's state (counters, base and last LRs, subclass state).
  virtual void save(torch::serialize::OutputArchive& archive) const;
  /// Restores save()'s state and writes the restored last LRs into the optimizer's param groups.
  virtual void load(torch::serialize::InputArchive& archive);

 protected:
  /// Records each group's `initial_lr` (shared by all schedulers of the optimizer, as PyTorch keeps it
  /// in the param group) and takes base_lrs from it. Subclasses finish construction with initial_step().
  explicit LRScheduler(torch::optim::Optimizer& optimizer);

  /// One LR per param group for the step that has just set last_epoch_ — the hook every scheduler
  /// implements (PyTorch's get_lr; chainable forms read the groups' current LRs).
  virtual std::vector<double> get_lr() = 0;
  /// The closed form at last_epoch_, for schedulers that have one (used by SequentialLR at milestones).
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  /// Subclass state for save()/load().
  virtual void save_extra(torch::serialize::OutputArchive& archive) const {}
  /// See save_extra().
  virtual void load_extra(torch::serialize::InputArchive& archive) {}

  /// PyTorch's `_initial_step`: step count 0, then one step in "initial" mode.
  void initial_step();
  /// Takes back the epoch counted by the initial step, as PyTorch's SequentialLR does to the schedulers it
  /// composes (`last_epoch -= 1`); compositions pass it on to the schedulers they hold.
  virtual void undo_initial_step() { --last_epoch_; }

  /// For compositions, which drive other schedulers through these (protected members of another object
  /// are out of a subclass's reach): `s.initial_step()`.
  static void initial_step_of(LRScheduler& s) { s.initial_step(); }
  /// `s.undo_initial_step()`.
  static void undo_initial_step_of(LRScheduler& s) { s.undo_initial_step(); }
  /// `s.update_lr(epoch)`: jumps `s` to `epoch` (closed form where it has one).
  static void update_lr_of(LRScheduler& s, int64_t epoch) { s.update_lr(epoch); }
  /// PyTorch's `_update_lr`: advance (or jump to `epoch` with the closed form) and write the LRs.
  void update_lr(std::optional<int64_t> epoch = std::nullopt);
  /// Writes `lrs` into the param groups and records them as the last LRs.
  void apply_lrs(const std::vector<double>& lrs);
  /// The current LR of every param group.
  std::vector<double> group_lrs() const;
  /// Number of param groups.
  size_t num_groups() const { return optimizer_.param_groups().size(); }
  /// Shared `initial_lr` of group `i` of this optimizer.
  double initial_lr(size_t i) const;
  /// Overwrites the shared `initial_lr` of group `i` (OneCycleLR sets it to max_lr / div_factor).
  void set_initial_lr(size_t i, double lr);
  /// PyTorch's `group.setdefault("initial_lr", lr)` run after the subclass changed the group's LR: sets it
  /// only where this scheduler was the first of the group, then refreshes base_lrs_.
  void setdefault_initial_lrs();

  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  bool is_initial_ = false;
  std::vector<bool> first_of_group_;                 // this scheduler recorded the group's initial_lr
  std::vector<std::shared_ptr<double>> initial_lrs_;  // each group's initial_lr, shared by its schedulers
};

/// Throws std::invalid_argument("<scheduler>: invalid <name>: <value> (<expected>)") unless `ok`.
void check_arg(bool ok, const std::string& scheduler, const std::string& name, double value,
               const std::string& expected);

}  // namespace trainkit::sched
