#pragma once
/// @file
/// One evaluation of a hyperparameter study: its parameters, state, objective value and per-step reports.

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "trainkit/tune/search_space.h"

namespace trainkit::tune {

/// Where a trial is: asked and not told yet, finished with a value, stopped by the pruner, or failed
/// (an error or a NaN/infinite value).
enum class TrialState { Running, Complete, Pruned, Failed };

/// "running", "complete", "pruned", "failed".
inline const char* to_string(TrialState s) {
  switch (s) {
    case TrialState::Running: return "running";
    case TrialState::Complete: return "complete";
    case TrialState::Pruned: return "pruned";
    case TrialState::Failed: return "failed";
  }
  return "?";
}

/// One trial of a Study.
struct Trial {
  int64_t number = 0;                                     ///< 0, 1, 2 ... in the order asked
  ParamSet params;                                        ///< the point evaluated
  TrialState state = TrialState::Running;                 ///< see TrialState
  /// objective as told (Complete); Pruned: the last reported value, as Optuna records it (NaN when none)
  double value = std::numeric_limits<double>::quiet_NaN();
  std::map<int64_t, double> intermediate;                 ///< step -> value reported during the trial
};

}  // namespace trainkit::tune
