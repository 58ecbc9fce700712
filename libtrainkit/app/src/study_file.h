#pragma once
// The study file an older `trainkit tune` wrote (internal to the application layer): `study.jsonl`, JSON Lines,
// read once into a new journal (tune_job.cpp) and never written. Line 1
// is the header, {"trainkit_study":1,"space":FINGERPRINT,"metric":...,"direction":...,"seed":N}; every
// further line is one finished trial, {"number":N,"state":"complete"|"pruned"|"failed","value":V,
// "seconds":S,"dir":"trials/trial-NNNN","params":{NAME:"VALUE",...},"intermediate":[[EPOCH,V],...]}, with
// every parameter's value as text and a non-finite value as null.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainkit/tune/search_space.h"
#include "trainkit/tune/trial.h"

namespace trainkit::app {

/// What a study file's header records; the study read from it must have the same space, metric and direction.
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

/// The trials of the study file at `path`: its header must match `header` (space fingerprint, metric,
/// direction) and every trial line must name a value for each parameter of `space`; trials are numbered 0, 1, ...
/// in file order. A damaged last line (an interrupted write) is skipped with a warning. Throws UsageError naming
/// the file (and line) and what is wrong; `space_path` names the search-space file when the spaces differ.
std::vector<TrialRecord> read_study_file(const std::filesystem::path& path, const tune::SearchSpace& space,
                                         const StudyHeader& header, const std::string& space_path);

}  // namespace trainkit::app
