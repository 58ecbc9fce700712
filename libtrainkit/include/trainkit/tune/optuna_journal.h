#pragma once
/// @file
/// Optuna's JournalStorage file (Optuna 5, `optuna.storages.journal.JournalFileBackend`): an append-only log of
/// one JSON operation per line (`{"op_code":4,"worker_id":"...","study_id":0,...}`), replayed from the start to
/// rebuild every study and trial. Python's `JournalStorage(JournalFileBackend(path))`, optuna-dashboard and
/// trainkit read and write the same file at once.
///
/// Reading follows Optuna's replay rules (an op on a missing study or on a finished trial is ignored, a
/// SET_TRIAL_PARAM whose distribution differs from an earlier trial's is ignored, trial ids count every trial
/// created on a live study). Only complete lines are applied: a last line without its newline is being written
/// and is read by a later sync(). A complete line that is not a valid op (edited by hand, a disk error) is
/// skipped with a warning naming the file and line, and the rest is read: one bad record does not stop every
/// worker of a study. A CREATE_TRIAL on a live study always creates its trial (later trial ids stay Optuna's);
/// a damaged field of it is left out with a warning and the trial is marked `damaged`.
///
/// The file, its lock and torn-tail repair are trainkit/tune/journal_file.h; this is what its lines mean. A
/// tune::Study keeps itself in such a file with `StudyOptions().journal(path)` (trainkit/tune/study.h).
///
/// ```
/// OptunaJournal journal("study.journal");
/// journal.transaction([&](JournalBatch& batch) { batch.create_study("s", "minimize"); });
/// for (const auto& t : journal.trials_of(*journal.find_study("s"))) { ... }
/// ```

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "trainkit/tune/journal_file.h"
#include "trainkit/tune/search_space.h"
#include "trainkit/tune/trial.h"

namespace trainkit::tune {

/// Optuna's TrialState values as the journal stores them.
enum class OptunaTrialState { Running = 0, Complete = 1, Pruned = 2, Fail = 3, Waiting = 4 };

/// "RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING" (Optuna's names).
const char* to_string(OptunaTrialState state);

/// A trial as the replay leaves it.
struct JournalTrial {
  int64_t trial_id = 0;  ///< storage-wide id (Optuna's trial_id)
  int64_t number = 0;    ///< 0, 1, ... within its study
  int64_t study_id = 0;
  OptunaTrialState state = OptunaTrialState::Running;
  std::vector<double> values;                        ///< objective values; empty when none (null)
  std::map<std::string, double> params;              ///< parameter -> internal value (categorical: index)
  std::map<std::string, std::string> distributions;  ///< parameter -> distribution JSON (distribution_to_json)
  std::map<std::string, int64_t> param_lines;        ///< parameter -> the journal line that set it
  std::map<int64_t, double> intermediate;            ///< step -> reported value
  std::map<std::string, std::string> user_attrs;     ///< key -> the value as JSON text
  std::map<std::string, std::string> system_attrs;   ///< key -> the value as JSON text
  std::map<std::string, int64_t> system_attr_lines;  ///< system attribute -> the journal line that last set it
  std::string datetime_start;                        ///< ISO 8601 as written; empty when none
  std::string datetime_complete;                     ///< ISO 8601 as written; empty when none
  std::string worker_id;                             ///< the worker that created it
  int64_t line = 0;                                  ///< the journal line that created it (1-based)
  bool damaged = false;                              ///< a field of its CREATE_TRIAL was unreadable and left out
};

/// A study as the replay leaves it.
struct JournalStudy {
  int64_t study_id = 0;
  std::string name;
  std::vector<int> directions;                      ///< Optuna's StudyDirection: 1 minimize, 2 maximize
  std::map<std::string, std::string> user_attrs;    ///< key -> the value as JSON text
  std::map<std::string, std::string> system_attrs;  ///< key -> the value as JSON text
  std::vector<int64_t> trial_ids;                   ///< by number
};

/// Operations to append in one locked write (OptunaJournal::transaction). Attribute values are JSON text
/// (json_text() quotes a string).
class JournalBatch {
 public:
  explicit JournalBatch(std::string worker_id) : worker_id_(std::move(worker_id)) {}
  /// CREATE_STUDY with one direction, "minimize" or "maximize".
  void create_study(const std::string& name, const std::string& direction);
  void delete_study(int64_t study_id);
  void set_study_user_attr(int64_t study_id, const std::string& key, const std::string& json_value);
  void set_study_system_attr(int64_t study_id, const std::string& key, const std::string& json_value);
  /// CREATE_TRIAL of a running trial that carries its parameters (internal values and distributions, as
  /// Optuna's template trials do) and user attributes, started now.
  void create_trial(int64_t study_id, const std::map<std::string, double>& params,
                    const std::map<std::string, std::string>& distributions,
                    const std::map<std::string, std::string>& user_attrs = {});
  /// CREATE_TRIAL of a running trial at `params` of `space`, each as Optuna's internal value and distribution.
  void create_trial(int64_t study_id, const SearchSpace& space, const ParamSet& params,
                    const std::map<std::string, std::string>& user_attrs = {});
  void set_trial_param(int64_t trial_id, const std::string& name, double internal, const std::string& distribution);
  /// SET_TRIAL_STATE_VALUES: `values` empty writes null; a finished state is dated now.
  void set_trial_state_values(int64_t trial_id, OptunaTrialState state, const std::vector<double>& values);
  /// SET_TRIAL_INTERMEDIATE_VALUE; a non-finite value is written as Python writes it (NaN, Infinity).
  void set_trial_intermediate_value(int64_t trial_id, int64_t step, double value);
  void set_trial_user_attr(int64_t trial_id, const std::string& key, const std::string& json_value);
  void set_trial_system_attr(int64_t trial_id, const std::string& key, const std::string& json_value);

  bool empty() const { return lines_.empty(); }
  /// The lines, each ending with '\n'.
  std::string text() const;

 private:
  std::string worker_id_;
  std::vector<std::string> lines_;
};

/// Options of OptunaJournal: `OptunaJournalOptions().grace_period_s(30)`.
struct OptunaJournalOptions {
  /// Seconds a lock may stand while the journal does not change before it is broken (JournalFileOptions).
  TORCH_ARG(double, grace_period_s) = JournalFileOptions().grace_period_s();
  /// Worker id written with every op; empty: a fresh "<uuid4>-<pid>".
  TORCH_ARG(std::string, worker_id) = "";
};

/// A journal file, replayed into studies and trials; appended to under Optuna's lock.
class OptunaJournal {
 public:
  /// Opens (creating an empty file when there is none, as Optuna does) and replays `path`. Throws
  /// std::runtime_error naming the file when it cannot be read.
  explicit OptunaJournal(std::string path, OptunaJournalOptions options = {});

  /// Applies the complete lines written since the last sync.
  void sync();
  /// Takes the lock, syncs, lets `fill` add ops (it sees the synced state), appends them in one write,
  /// releases the lock and syncs again. Throws std::runtime_error naming the file when it cannot write.
  void transaction(const std::function<void(JournalBatch&)>& fill);

  /// The live study named `name`.
  std::optional<int64_t> find_study(const std::string& name) const;
  const JournalStudy& study(int64_t study_id) const { return studies_.at(study_id); }
  const std::map<int64_t, JournalStudy>& studies() const { return studies_; }
  const JournalTrial& trial(int64_t trial_id) const { return trials_.at(static_cast<size_t>(trial_id)); }
  /// The study's trials by number.
  std::vector<const JournalTrial*> trials_of(int64_t study_id) const;
  /// The id the next CREATE_TRIAL on a live study gets.
  int64_t next_trial_id() const { return static_cast<int64_t>(trials_.size()); }
  /// The id the next CREATE_STUDY of a new name gets.
  int64_t next_study_id() const { return next_study_id_; }
  /// Complete lines read so far (applied or skipped).
  int64_t lines_read() const { return lines_read_; }
  /// The lines (1-based) skipped as damaged, or applied with a damaged field left out, each with a warning.
  const std::vector<int64_t>& skipped_lines() const { return skipped_lines_; }

  const std::string& path() const { return file_.path(); }
  const std::string& worker_id() const { return options_.worker_id(); }

 private:
  void apply(const std::string& line, int64_t line_number, std::vector<std::string>& ignored);
  JournalFile file_;
  OptunaJournalOptions options_;
  int64_t lines_read_ = 0;
  int64_t next_study_id_ = 0;
  std::map<int64_t, JournalStudy> studies_;
  std::vector<JournalTrial> trials_;
  std::vector<int64_t> skipped_lines_;
};

/// `value` as a JSON string literal ("a \"b\"" for a "b").
std::string json_text(const std::string& value);
/// `values` as a JSON array of strings.
std::string json_text(const std::vector<std::string>& values);

/// Optuna's distribution JSON for a search-space parameter: FloatDistribution (step null), IntDistribution
/// (step 1) or CategoricalDistribution (the choices as strings), attributes in Optuna's order.
std::string optuna_distribution(const Param& param);
/// Whether `distribution` (a journal's distribution JSON) is the distribution of `param`: same class, bounds,
/// log flag, step and choices. When not, `why` says what differs.
bool same_distribution(const std::string& distribution, const Param& param, std::string* why);
/// The internal value Optuna stores: the float itself, the integer as a float, a choice's index.
double optuna_internal(const Param& param, const ParamValue& value);
/// The value an internal one stands for (std::invalid_argument for a categorical index out of range).
ParamValue optuna_external(const Param& param, double internal);

/// The values Optuna records for a trial pruned after reporting `intermediate`: its last reported value when
/// finite, else none (null).
std::vector<double> pruned_values(const std::map<int64_t, double>& intermediate);

/// The trials of study `study_id` as a Study's trials over `space` (Optuna's states; a Complete or Pruned trial's
/// first value), numbered as Optuna numbers them. A trial without every parameter of the space (a Python trial still
/// suggesting, one that failed first, one whose CREATE_TRIAL was damaged) holds the parameters it has, Running or
/// Failed. std::invalid_argument "<path>:<line>: the study was run on another search space: ..." naming the line
/// for a parameter whose distribution is not the space's, one the space does not have, or a Complete or Pruned
/// trial that lacks one; "<path>:<line>: trial N: ..." for a value the space cannot hold.
std::vector<Trial> study_trials(const OptunaJournal& journal, int64_t study_id, const SearchSpace& space);

}  // namespace trainkit::tune
