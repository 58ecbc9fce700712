#pragma once
// What `trainkit tune` reads back from a trial's run directory (internal to the application layer): the
// per-epoch validation values in metrics.jsonl and the objective of a finished run.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace trainkit::app {

/// `metric`'s values in the run's per-epoch rows of metrics.jsonl (those carry the validation metrics), by
/// epoch; a null value (non-finite) reads as NaN. Empty when the file is absent. A line that is not whole
/// yet (being written while read) is skipped: the next call sees it whole.
std::map<int64_t, double> val_history(const std::filesystem::path& run_dir, const std::string& metric);

/// A finished run's objective: a `val_*` metric from the last epoch row of metrics.jsonl, any other from
/// summary.json; NaN when the run has no finite value for it. Throws std::runtime_error naming
/// summary.json when it cannot be read or is not JSON.
double run_objective(const std::filesystem::path& run_dir, const std::string& metric);

}  // namespace trainkit::app
