#pragma once
/// @file
/// A hyperparameter study with an ask/tell interface: ask for a point (or a batch of q), evaluate it, tell the
/// value (NaN or infinite marks it failed); report per-step values to be pruned early. Seeded and
/// reproducible: the same seed, space, sampler and sequence of tells give the same suggestions, also for a
/// study rebuilt from its trials with add_trial.
///
/// With `StudyOptions().journal(path)` the study lives in an Optuna journal file (JournalFileStorage, see
/// trainkit/tune/optuna_journal.h): every ask, report and tell is appended under Optuna's lock, reopening the
/// file continues the study, and Python Optuna, optuna-dashboard and other processes read and extend it at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/optuna_journal.h"
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
  /// An Optuna journal file to keep the study in, created when missing; empty: the study is kept in memory.
  TORCH_ARG(std::string, journal) = "";
  /// The study's name in the journal: continued when it is there (same direction and space), else created.
  TORCH_ARG(std::string, study_name) = "default";
};

/// An ask/tell study over a SearchSpace.
///
/// ```
/// Study study(SearchSpace().add_float("lr", 1e-5, 1e-1, true), std::make_shared<GPSampler>());
/// for (int i = 0; i < 30; ++i) { auto t = study.ask(); study.tell(t.number, f(t.params)); }
/// ```
/// Kept in a journal, a trial's number is Optuna's; trials other processes created without every parameter of the
/// space (a Python trial still suggesting, or one that failed first) hold the parameters they have and are not
/// points to the sampler. Copies of a journal study share its file.
class Study {
 public:
  /// `sampler` defaults to a GPSampler; `pruner` may be null (never prune). With a journal, opens (or creates)
  /// the study in it and reads its trials: std::invalid_argument naming the file (and line) when the study there
  /// has another direction or a trial of another search space, the file left as it was; std::runtime_error
  /// naming the file when it cannot be read or written.
  explicit Study(SearchSpace space, std::shared_ptr<Sampler> sampler = nullptr, StudyOptions options = {},
                 std::shared_ptr<Pruner> pruner = nullptr);

  /// A new running trial at the sampler's next point (pending trials count as taken). With a journal, the trials
  /// other processes appended are read first, the point is sampled without the lock and the trial created under
  /// it.
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
  /// Finishes trial `number` as Pruned, its value the last reported one (Optuna's rule; none when that is
  /// not finite).
  void prune(int64_t number);
  /// Appends a trial restored from a file: its number must be trials().size() (with a journal: the number the
  /// journal gives the next trial), its params must encode in the space (std::invalid_argument naming the
  /// parameter otherwise). With a journal it is written there, with its state, value and reported values.
  void add_trial(Trial trial);
  /// With a journal, reads the trials other processes appended since (in memory: nothing to do).
  void sync();

  const std::vector<Trial>& trials() const { return trials_; }
  const SearchSpace& space() const { return space_; }
  const StudyOptions& options() const { return options_; }
  bool minimize() const { return options_.direction() == "minimize"; }
  /// The completed trial with the best value (the first on ties); empty when none completed.
  std::optional<Trial> best_trial() const;

 private:
  Trial& running(int64_t number, const char* what);
  void open_journal();
  /// Appends what `fill` writes for trial `number` (its journal trial id given), when there is a journal.
  void write(int64_t number, const std::function<void(JournalBatch&, int64_t)>& fill);
  SearchSpace space_;
  std::shared_ptr<Sampler> sampler_;
  StudyOptions options_;
  std::shared_ptr<Pruner> pruner_;
  std::vector<Trial> trials_;
  std::shared_ptr<OptunaJournal> journal_;  // null: in memory
  int64_t study_id_ = 0;                    // the study's id in journal_
};

}  // namespace trainkit::tune
