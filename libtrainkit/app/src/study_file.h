#pragma once
// The study file of `trainkit tune` (internal to the application layer): `study.jsonl`, JSON Lines. Line 1
// is the header, {"trainkit_study":1,"space":FINGERPRINT,"metric":...,"direction":...,"seed":N}; every
// further line is one finished trial, {"number":N,"state":"complete"|"pruned"|"failed","value":V,
// "seconds":S,"dir":"trials/trial-NNNN","params":{NAME:"VALUE",...},"intermediate":[[EPOCH,V],...]}, with
// every parameter's value as text and a non-finite value as null. Lines are appended and flushed as trials
// finish, so a killed study loses at most the line being written.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainkit/tune/search_space.h"
#include "trainkit/tune/trial.h"

namespace trainkit::app {

/// What a study file's header records. A study continued from the file must have the same space,
/// metric and direction.
struct StudyHeader {
  std::string space;      ///< the search space's fingerprint (tune::SearchSpace::fingerprint)
  std::string metric;     ///< the objective (`val_loss`, `test_accuracy`, ...)
  std::string direction;  ///< "minimize" or "maximize"
  uint64_t seed = 0;      ///< the study's seed (recorded; a continued study may use another)
};

/// One finished trial as the study file keeps it.
struct TrialRecord {
  tune::Trial trial;   ///< number, state, value, params and the reported per-epoch values
  double seconds = 0;  ///< wall time of the trial's run (written to the millisecond)
  std::string dir;     ///< the trial's run directory, relative to the study directory
};

/// `study.jsonl`, opened for a study run: read (and checked against this run) when it exists, else
/// created; then appended to as trials finish.
class StudyFile {
 public:
  /// Reads the study at `path` when it exists: its header must match `header` (space fingerprint, metric,
  /// direction) and every trial line must name a value for each parameter of `space`; trials are
  /// renumbered 0, 1, ... in file order. A damaged last line (an interrupted write) is skipped with a
  /// warning. Otherwise creates the file (and its directory) holding the header. Throws UsageError naming
  /// the file (and line) and what is wrong; the file is left as it was. `space_path` names the search-space
  /// file in the message when the spaces differ.
  StudyFile(const std::filesystem::path& path, const tune::SearchSpace& space, const StudyHeader& header,
            const std::string& space_path);

  /// The finished trials: the file's, then those appended.
  const std::vector<TrialRecord>& records() const { return records_; }
  /// Whether the file existed (the run continues a study).
  bool continued() const { return continued_; }
  /// Appends a finished trial's line and flushes it. Throws std::runtime_error naming the file when
  /// it cannot be written.
  void append(const TrialRecord& record);

 private:
  std::filesystem::path path_;
  std::vector<TrialRecord> records_;
  bool continued_ = false;
  std::ofstream out_;
};

}  // namespace trainkit::app
