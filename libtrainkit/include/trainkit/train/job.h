#pragma once
/// @file
/// The `trainkit train` job: a TOML config in, a run directory out.
///
/// Run directory: `config.toml` (the effective config), `metrics.csv`, `metrics.jsonl`,
/// `checkpoints/ckpt-<step>.tkpt` and `summary.json`.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainkit::train {

/// What `trainkit train` was asked to do.
struct TrainJobOptions {
  std::string config_path;             ///< TOML config file
  std::vector<std::string> overrides;  ///< `section.key=value` applied after the file
  std::string out_dir;                 ///< run directory; empty = runs/<config name>-<time>
  std::string resume;                  ///< "" (fresh run), "auto" (newest good checkpoint in out_dir) or a path
};

/// What the job measured (also written to summary.json).
struct TrainJobResult {
  std::string run_dir;
  double test_accuracy = 0;
  double test_loss = 0;
  int64_t epochs = 0;  ///< completed epochs
  int64_t steps = 0;
  double wall_seconds = 0;
  double train_samples_per_second = 0;
  bool finished = false;  ///< all configured epochs done (not stopped by max_steps)
};

/// Raised for command-line misuse that is not a config key (e.g. a run directory that already holds a
/// run without --resume); `trainkit` exits with code 2, like for ConfigError.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Validates the config and the run directory before writing anything, trains, evaluates on the test
/// set and writes the run directory. Throws ConfigError / UsageError (nothing written),
/// data::DataError, CheckpointError.
TrainJobResult run_train_job(const TrainJobOptions& options);

}  // namespace trainkit::train
