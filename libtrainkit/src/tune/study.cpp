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
}

Trial Study::ask() { return ask(1).front(); }

std::vector<Trial> Study::ask(int64_t q) {
  if (q < 1) throw std::invalid_argument(fmt::format("Study::ask: q must be >= 1, got {}", q));
  std::vector<Observation> observed;
  std::vector<std::vector<double>> pending;
  const double sign = minimize() ? 1.0 : -1.0;
  for (const auto& t : trials_) {
    auto u = space_.encode(t.params);
    if (t.state == TrialState::Running) {
      pending.push_back(std::move(u));
    } else {
      observed.push_back({std::move(u), t.state == TrialState::Complete ? sign * t.value : NAN});
    }
  }
  const auto points = sampler_->suggest(space_, observed, pending, q, options_.seed());
  std::vector<Trial> out;
  for (const auto& u : points) {
    Trial t;
    t.number = static_cast<int64_t>(trials_.size());
    t.params = space_.decode(u);
    trials_.push_back(t);
    out.push_back(std::move(t));
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
  t.value = value;
  t.state = std::isfinite(value) ? TrialState::Complete : TrialState::Failed;
}

void Study::tell_failed(int64_t number) {
  auto& t = running(number, "tell_failed");
  t.state = TrialState::Failed;
}

bool Study::report(int64_t number, int64_t step, double value) {
  auto& t = running(number, "report");
  t.intermediate[step] = value;
  return pruner_ && pruner_->should_prune(trials_, t, step, minimize());
}

void Study::prune(int64_t number) {
  auto& t = running(number, "prune");
  t.state = TrialState::Pruned;
}

void Study::add_trial(Trial trial) {
  if (trial.number != static_cast<int64_t>(trials_.size())) {
    throw std::invalid_argument(fmt::format("Study::add_trial: trial number {} where {} comes next", trial.number,
                                            trials_.size()));
  }
  space_.encode(trial.params);  // throws naming a parameter that does not fit the space
  if (trial.state == TrialState::Complete && !std::isfinite(trial.value)) trial.state = TrialState::Failed;
  trials_.push_back(std::move(trial));
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
