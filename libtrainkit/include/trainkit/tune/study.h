#pragma once
/// @file
/// A hyperparameter study with an ask/tell interface: ask for a point (or a batch of q), evaluate it, tell the
/// value (NaN or infinite marks it failed); report per-step values to be pruned early. Seeded and
/// reproducible: the same seed, space, sampler and sequence of tells give the same suggestions, also for a
/// study rebuilt from its trials with add_trial.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/pruner.h"
#include "trainkit/tune/sampler.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/trial.h"

namespace trainkit::tune {

/// Options of a Study: `StudyOptions().direction("maximize").seed(3)`.
struct StudyOptions {
  /// "minimize" or "maximize".
  TORCH_ARG(std::string, direction) = "minimize";
  /// Seed of the sampler's streams.
  TORCH_ARG(uint64_t, seed) = 0;
};

/// An ask/tell study over a SearchSpace.
///
/// ```
/// Study study(SearchSpace().add_float("lr", 1e-5, 1e-1, true), std::make_shared<GPSampler>());
/// for (int i = 0; i < 30; ++i) { auto t = study.ask(); study.tell(t.number, f(t.params)); }
/// ```
class Study {
 public:
  /// `sampler` defaults to a GPSampler; `pruner` may be null (never prune).
  explicit Study(SearchSpace space, std::shared_ptr<Sampler> sampler = nullptr, StudyOptions options = {},
                 std::shared_ptr<Pruner> pruner = nullptr);

  /// A new running trial at the sampler's next point (pending trials count as taken).
  Trial ask();
  /// q new running trials at once (a batch for parallel evaluation).
  std::vector<Trial> ask(int64_t q);
  /// Finishes trial `number` with `value`; a NaN or infinite value marks it Failed. std::invalid_argument for
  /// an unknown number, std::logic_error when it is already finished.
  void tell(int64_t number, double value);
  /// Finishes trial `number` as Failed.
  void tell_failed(int64_t number);
  /// Records `value` at `step` for running trial `number` and returns whether the pruner says to stop it
  /// (the caller then calls prune()).
  bool report(int64_t number, int64_t step, double value);
  /// Finishes trial `number` as Pruned.
  void prune(int64_t number);
  /// Appends a trial restored from a file: its number must be trials().size(), its params must encode in
  /// the space (std::invalid_argument naming the parameter otherwise).
  void add_trial(Trial trial);

  const std::vector<Trial>& trials() const { return trials_; }
  const SearchSpace& space() const { return space_; }
  const StudyOptions& options() const { return options_; }
  bool minimize() const { return options_.direction() == "minimize"; }
  /// The completed trial with the best value (the first on ties); empty when none completed.
  std::optional<Trial> best_trial() const;

 private:
  Trial& running(int64_t number, const char* what);
  SearchSpace space_;
  std::shared_ptr<Sampler> sampler_;
  StudyOptions options_;
  std::shared_ptr<Pruner> pruner_;
  std::vector<Trial> trials_;
};

}  // namespace trainkit::tune
