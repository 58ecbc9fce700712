#include "trainkit/tune/study.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::tune {

Study::Study(SearchSpace space, std::shared_ptr<Sampler> sampler, StudyOptions options, std::shared_ptr<Pruner> pruner)
    : space_(std::move(space)), sampler_(std::move(sampler)), options_(std::move(options)), pruner_(std::move(pruner)) {
  if (options_.direction() != "minimize" && options_.direction() != "maximize") {
    throw std::invalid_argument(fmt::format("StudyOptions: direction must be minimize or maximize, got \"{}\"",
                                            options_.direction()));
  }
  if (space_.empty()) throw std::invalid_argument("Study: the search space has no parameters");
  if (!sampler_) sampler_ = std::make_shared<GPSampler>();
  if (!options_.journal().empty()) open_journal();
}

void Study::open_journal() {
  journal_ = std::make_shared<OptunaJournal>(options_.journal());
  const std::string& name = options_.study_name();
  if (const auto id = journal_->find_study(name)) {
    study_id_ = *id;
  } else {
    // Created under the lock: two processes opening a new study at once create one.
    journal_->transaction([&](JournalBatch& batch) {
      if (const auto found = journal_->find_study(name)) {
        study_id_ = *found;
        return;
      }
      study_id_ = journal_->next_study_id();
      batch.create_study(name, options_.direction());
    });
  }
  const std::vector<int>& directions = journal_->study(study_id_).directions;
  if (directions != std::vector<int>{minimize() ? 1 : 2}) {
    throw std::invalid_argument(fmt::format("{}: study \"{}\" has directions [{}] (1 minimize, 2 maximize); this study "
                                            "{}s one value",
                                            journal_->path(), name, fmt::join(directions, ","), options_.direction()));
  }
  sync();
}

void Study::sync() {
  if (!journal_) return;
  journal_->sync();
  trials_ = study_trials(*journal_, study_id_, space_);
}

void Study::write(int64_t number, const std::function<void(JournalBatch&, int64_t)>& fill) {
  if (!journal_) return;
  const int64_t id = journal_->study(study_id_).trial_ids.at(static_cast<size_t>(number));
  journal_->transaction([&](JournalBatch& batch) { fill(batch, id); });
}

Trial Study::ask() { return ask(1).front(); }

std::vector<Trial> Study::ask(int64_t q) {
  if (q < 1) throw std::invalid_argument(fmt::format("Study::ask: q must be >= 1, got {}", q));
  sync();
  std::vector<Observation> observed;
  std::vector<std::vector<double>> pending;
  const double sign = minimize() ? 1.0 : -1.0;
  for (const auto& t : trials_) {
    if (t.params.size() != space_.params().size()) continue;  // another process's trial without a point yet
    auto u = space_.encode(t.params);
    if (t.state == TrialState::Running) {
      pending.push_back(std::move(u));
    } else {
      Observation o{std::move(u), t.state == TrialState::Complete ? sign * t.value : NAN};
      if (t.state == TrialState::Pruned) {
        o.pruned = true;
        if (!t.intermediate.empty()) {
          o.last_step = t.intermediate.rbegin()->first;
          o.last_value = sign * t.intermediate.rbegin()->second;
        }
      }
      observed.push_back(std::move(o));
    }
  }
  // As Optuna: sampled without the journal's lock (a GP fit may outlast the lock's grace period), the trials
  // created under it, numbered as the journal numbers them then.
  const auto points = sampler_->suggest(space_, observed, pending, q, options_.seed());
  std::vector<Trial> out;
  for (const auto& u : points) {
    Trial t;
    t.number = static_cast<int64_t>(trials_.size()) + static_cast<int64_t>(out.size());
    t.params = space_.decode(u);
    out.push_back(std::move(t));
  }
  if (journal_) {
    journal_->transaction([&](JournalBatch& batch) {
      const auto next = static_cast<int64_t>(journal_->study(study_id_).trial_ids.size());
      for (size_t i = 0; i < out.size(); ++i) {
        out[i].number = next + static_cast<int64_t>(i);
        batch.create_trial(study_id_, space_, out[i].params);
      }
    });
    sync();
  } else {
    trials_.insert(trials_.end(), out.begin(), out.end());
  }
  return out;
}

Trial& Study::running(int64_t number, const char* what) {
  if (number < 0 || number >= static_cast<int64_t>(trials_.size())) {
    throw std::invalid_argument(fmt::format("Study::{}: no trial {} (the study has {})", what, number, trials_.size()));
  }
  auto& t = trials_[static_cast<size_t>(number)];
  if (t.state != TrialState::Running) {
    throw std::logic_error(fmt::format("Study::{}: trial {} is already {}", what, number, to_string(t.state)));
  }
  return t;
}

void Study::tell(int64_t number, double value) {
  auto& t = running(number, "tell");
  // Optuna's rule: a NaN or infinite objective fails the trial, its value left null.
  write(number, [&](JournalBatch& batch, int64_t id) {
    if (std::isfinite(value)) batch.set_trial_state_values(id, OptunaTrialState::Complete, {value});
    else batch.set_trial_state_values(id, OptunaTrialState::Fail, {});
  });
  t.value = value;
  t.state = std::isfinite(value) ? TrialState::Complete : TrialState::Failed;
}

void Study::tell_failed(int64_t number) {
  auto& t = running(number, "tell_failed");
  write(number, [](JournalBatch& batch, int64_t id) { batch.set_trial_state_values(id, OptunaTrialState::Fail, {}); });
  t.state = TrialState::Failed;
}

bool Study::report(int64_t number, int64_t step, double value) {
  auto& t = running(number, "report");
  write(number, [&](JournalBatch& batch, int64_t id) { batch.set_trial_intermediate_value(id, step, value); });
  t.intermediate[step] = value;
  return pruner_ && pruner_->should_prune(trials_, t, step, minimize());
}

void Study::prune(int64_t number) {
  auto& t = running(number, "prune");
  const std::vector<double> values = pruned_values(t.intermediate);
  write(number, [&](JournalBatch& batch, int64_t id) {
    batch.set_trial_state_values(id, OptunaTrialState::Pruned, values);
  });
  t.state = TrialState::Pruned;
  t.value = values.empty() ? NAN : values.front();
}

void Study::add_trial(Trial trial) {
  const auto check_number = [&](size_t next) {
    if (trial.number != static_cast<int64_t>(next)) {
      throw std::invalid_argument(fmt::format("Study::add_trial: trial number {} where {} comes next", trial.number,
                                              next));
    }
  };
  check_number(trials_.size());
  space_.encode(trial.params);  // throws naming a parameter that does not fit the space
  if (trial.state == TrialState::Complete && !std::isfinite(trial.value)) trial.state = TrialState::Failed;
  if (!journal_) {
    trials_.push_back(std::move(trial));
    return;
  }
  journal_->transaction([&](JournalBatch& batch) {
    check_number(journal_->study(study_id_).trial_ids.size());
    const int64_t id = journal_->next_trial_id();
    batch.create_trial(study_id_, space_, trial.params);
    for (const auto& [step, v] : trial.intermediate) batch.set_trial_intermediate_value(id, step, v);
    switch (trial.state) {
      case TrialState::Complete: batch.set_trial_state_values(id, OptunaTrialState::Complete, {trial.value}); break;
      case TrialState::Pruned:
        batch.set_trial_state_values(id, OptunaTrialState::Pruned, pruned_values(trial.intermediate));
        break;
      case TrialState::Failed: batch.set_trial_state_values(id, OptunaTrialState::Fail, {}); break;
      case TrialState::Running: break;
    }
  });
  sync();
}

std::optional<Trial> Study::best_trial() const {
  std::optional<Trial> best;
  for (const auto& t : trials_) {
    if (t.state != TrialState::Complete) continue;
    if (!best || (minimize() ? t.value < best->value : t.value > best->value)) best = t;
  }
  return best;
}

}  // namespace trainkit::tune
