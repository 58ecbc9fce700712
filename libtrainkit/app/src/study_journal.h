#pragma once
// The study of `trainkit tune` kept in an Optuna journal file (internal to the application layer; the file
// format is trainkit/tune/optuna_journal.h). One named study in the journal is the search: every trial of it,
// whoever wrote it (this process, another `trainkit tune`, Python Optuna), is an observation or a pending
// point of the sampler. As in Optuna, a worker reads the journal, samples without the lock and appends the new
// trial under it, its number the one the replay gives it then, so that concurrent workers never create the
// same trial number twice nor miss each other's, and a slow sampler never holds the lock.
//
// trainkit writes per trial: CREATE_TRIAL carrying the parameters, user attributes `trainkit_dir` (the run
// directory, relative to the study directory: `trials/<study>/trial-NNNN`) and `trainkit_overrides` (every
// `--set` the trial ran with), system attribute `trainkit_worker` ("host:pid boot=<boot id> pidns=<PID
// namespace> start=<start ticks>"; older trainkit wrote "host:pid"), then SET_TRIAL_INTERMEDIATE_VALUE per
// reported epoch and SET_TRIAL_STATE_VALUES when it ends. The study's user attribute `trainkit_metric` names
// the objective.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "study_file.h"
#include "trainkit/tune/optuna_journal.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/study.h"

namespace trainkit::app {

/// A study's name as one directory name (its trials' parent, `trials/<this>/`): itself when it is a plain name
/// (letters, digits, '.', '_', '-'; not starting with '.'; at most 100 characters), else those characters of it
/// (others as '_', at most 64) and 8 hex digits of a hash (FNV-1a) of the whole name, so that names differing
/// only in other characters stay apart.
std::string study_dir_name(const std::string& name);

/// What a StudyJournal is opened with.
struct StudyJournalSetup {
  std::string study_name;   ///< the study's name in the journal
  std::string metric;       ///< recorded as the study's `trainkit_metric`; a continued study must match
  std::string direction;    ///< "minimize" or "maximize"; a continued study must match
  std::string space_path;   ///< named in errors about another search space
  double grace_period_s = 30;  ///< the lock's grace period (Optuna's)
};

/// A `trainkit tune` study in a journal file.
class StudyJournal {
 public:
  /// Opens (or creates) the journal and the study in it, checks every trial of it against `space` (same
  /// parameters with the same distributions, same direction and metric) and marks failed the running trials
  /// of trainkit workers that are certainly gone (a killed study), which then do not count: a worker of this
  /// kernel (boot id) and PID namespace whose pid is gone or now another process's (start time), one of an
  /// earlier boot of this host, or an old-form "host:pid" of this hostname whose pid is gone. A trial whose
  /// worker attribute is unreadable is left as it is, with a warning naming the file and line. Throws
  /// UsageError naming the file and line of what does not match, the file left as it was.
  /// `make_study` returns an empty tune::Study (space, sampler, seed, pruner) that the trials are added to.
  StudyJournal(const std::filesystem::path& path, const tune::SearchSpace& space, StudyJournalSetup setup,
               std::function<tune::Study()> make_study);

  /// Whether the study existed with trials before this run.
  bool continued() const { return continued_; }
  /// Trials that count toward --trials: every trial of the study but those trainkit marked as not counted.
  int64_t counted() const;

  /// When fewer than `max_trials` count, asks the sampler for a trial given every trial in the journal (without
  /// the lock), then under the lock, unless the study filled meanwhile, creates it (number = the study's next
  /// then) with its directory `trials/<study>/trial-NNNN` (created here; `<study>` the study's name as a
  /// directory name) and `overrides` (the trial's `--set` list, computed from its params) recorded. Empty when
  /// the study is full.
  std::optional<TrialRecord> ask(int64_t max_trials,
                                 const std::function<std::vector<std::string>(const tune::Trial&)>& overrides);
  /// Whether trial `number` has a value reported at `step`.
  bool reported(int64_t number, int64_t step) const;
  /// Appends `value` at `step` for trial `number`; returns whether the pruner says to stop it, given every
  /// trial of the study.
  bool report(int64_t number, int64_t step, double value);
  /// Ends trial `number`: Complete with `value` when finite, else Fail; or `state` Pruned / Fail.
  /// `uncounted` non-empty: Fail, not counted toward --trials (a configuration error), with that reason.
  void finish(int64_t number, tune::OptunaTrialState state, double value, const std::string& uncounted = {});

  /// The finished trials that count, by number (all workers', Python's included).
  std::vector<TrialRecord> records();
  /// Rebuilds the local view from the lines other workers appended.
  void refresh();

  /// Appends the trials of an old `study.jsonl` (already checked against the space) to this new study.
  void import(const std::vector<TrialRecord>& records);

 private:
  void rebuild();
  std::string claim_dir(int64_t number) const;
  const tune::JournalTrial& trial(int64_t number) const;

  tune::OptunaJournal journal_;
  std::filesystem::path root_;  // the study directory: the journal's
  tune::SearchSpace space_;
  StudyJournalSetup setup_;
  std::function<tune::Study()> make_study_;
  int64_t study_id_ = 0;
  bool continued_ = false;
  int64_t built_at_ = -1;  // journal lines the local study was built from
  tune::Study study_;
  std::map<int64_t, int64_t> local_of_;  // journal number -> number in study_
};

}  // namespace trainkit::app
