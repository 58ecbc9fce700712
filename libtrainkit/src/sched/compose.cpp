#include "trainkit/sched/compose.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/sched/factory.h"

namespace trainkit::sched {
namespace {

void check_members(const torch::optim::Optimizer& optimizer, const std::vector<std::shared_ptr<LRScheduler>>& s,
                   const char* who) {
  if (s.empty()) {
    throw std::invalid_argument(fmt::format("{} expects at least one scheduler", who));
  }
  for (size_t i = 0; i < s.size(); ++i) {
    if (!s[i]) {
      throw std::invalid_argument(fmt::format("{}: scheduler {} is null", who, i));
    }
    if (s[i]->takes_metric()) {
      throw std::invalid_argument(fmt::format("{} does not support {} (scheduler {}): it needs a metric to step",
                                              who, s[i]->name(), i));
    }
    if (&s[i]->optimizer() != &optimizer) {
      throw std::invalid_argument(
          fmt::format("{}: scheduler {} ({}) drives a different optimizer", who, i, s[i]->name()));
    }
  }
}

void save_members(torch::serialize::OutputArchive& archive, const std::vector<std::shared_ptr<LRScheduler>>& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    torch::serialize::OutputArchive sub;
    s[i]->save(sub);
    archive.write("scheduler_" + std::to_string(i), sub);
  }
}

void load_members(torch::serialize::InputArchive& archive, const std::vector<std::shared_ptr<LRScheduler>>& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    torch::serialize::InputArchive sub;
    archive.read("scheduler_" + std::to_string(i), sub);
    s[i]->load(sub);
  }
}

}  // namespace

SequentialLR::SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  check_members(optimizer, schedulers_, "SequentialLR");
  if (milestones_.size() + 1 != schedulers_.size()) {
    throw std::invalid_argument(fmt::format("SequentialLR expects one milestone fewer than schedulers, got {} "
                                            "schedulers and {} milestones",
                                            schedulers_.size(), milestones_.size()));
  }
  for (size_t i = 1; i < milestones_.size(); ++i) {
    check_arg(milestones_[i] > milestones_[i - 1], name(), "milestones", static_cast<double>(milestones_[i]),
              "must increase");
  }
  last_epoch_ = 0;
  for (size_t i = 0; i < num_groups(); ++i) {
    optimizer_.param_groups()[i].options().set_lr(initial_lr(i));
  }
  for (auto& s : schedulers_) {
    undo_initial_step_of(*s);
  }
  const size_t idx = static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), 0) - milestones_.begin());
  initial_step_of(*schedulers_[idx]);
  last_lr_ = schedulers_[idx]->get_last_lr();
}

void SequentialLR::undo_initial_step() {
  for (auto& s : schedulers_) {
    undo_initial_step_of(*s);
  }
}

void ChainedScheduler::undo_initial_step() {
  for (auto& s : schedulers_) {
    undo_initial_step_of(*s);
  }
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto it = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_);
  const size_t idx = static_cast<size_t>(it - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_) {
    update_lr_of(s, 0);
  } else {
    s.step();
  }
  last_lr_ = s.get_last_lr();
}

void SequentialLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  save_members(archive, schedulers_);
}

void SequentialLR::load(torch::serialize::InputArchive& archive) {
  load_members(archive, schedulers_);
  LRScheduler::load(archive);
}

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler([&schedulers]() -> torch::optim::Optimizer& {
        if (schedulers.empty() || !schedulers.front()) {
          throw std::invalid_argument("ChainedScheduler expects at least one scheduler");
        }
        return schedulers.front()->optimizer();
      }()),
      schedulers_(std::move(schedulers)) {
  check_members(optimizer_, schedulers_, "ChainedScheduler");
  last_epoch_ = 0;
  last_lr_ = group_lrs();
}

void ChainedScheduler::step() {
  ++last_epoch_;
  for (auto& s : schedulers_) {
    s->step();
  }
  last_lr_ = group_lrs();
}

void ChainedScheduler::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  save_members(archive, schedulers_);
}

void ChainedScheduler::load(torch::serialize::InputArchive& archive) {
  load_members(archive, schedulers_);
  LRScheduler::load(archive);
}

namespace {

/// Members are parsed with the outer table's interval; SequentialLR also reads its milestones.
SchedulerMaker read_composite(ArgReader& a, const std::string& interval, bool sequential) {
  std::vector<SchedulerSpec> members;
  for (ArgReader& sub : a.required_tables("schedulers")) {
    members.push_back(parse_member_scheduler(sub.table(), sub.where(), interval));
  }
  std::vector<int64_t> milestones;
  if (sequential) {
    milestones = a.required_integers("milestones");
    if (milestones.size() + 1 != members.size()) {
      a.fail("milestones", fmt::format("{} milestones (one fewer than the {} schedulers)", members.size() - 1,
                                       members.size()));
    }
  }
  return [members, milestones, sequential](torch::optim::Optimizer& opt,
                                           const SchedulerContext& context) -> std::shared_ptr<LRScheduler> {
    std::vector<std::shared_ptr<LRScheduler>> subs;
    for (const auto& m : members) {
      subs.push_back(make_scheduler(m, opt, context).scheduler);
    }
    if (sequential) {
      return std::make_shared<SequentialLR>(opt, subs, milestones);
    }
    return std::make_shared<ChainedScheduler>(subs);
  };
}

}  // namespace

bool register_compose_schedulers() {
  const SchedulerArgDoc members{"schedulers", "array of tables", "required",
                                "The members, each a table with its own type and keys (no interval)"};
  register_scheduler(
      "SequentialLR", "epoch",
      [](ArgReader& a, const std::string& interval) { return read_composite(a, interval, true); },
      {members,
       {"milestones", "array of integers >= 0", "required",
        "Steps at which the next member takes over (one fewer than the members)"}});
  register_scheduler(
      "ChainedScheduler", "epoch",
      [](ArgReader& a, const std::string& interval) { return read_composite(a, interval, false); }, {members});
  return true;
}

}  // namespace trainkit::sched
