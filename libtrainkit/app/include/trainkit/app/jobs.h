#pragma once
/// @file
/// The `trainkit` CLI's jobs (application layer): `train` (a TOML config in, a run directory out),
/// `lr-find` and `batch-size`.
///
/// Run directory: `config.toml` (the effective config), `metrics.csv`, `metrics.jsonl`,
/// `checkpoints/ckpt-<step>.tkpt`, `curves.svg` and `summary.json`.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/tune/batch_size_finder.h"
#include "trainkit/tune/lr_finder.h"

namespace trainkit::app {

/// What `trainkit train` was asked to do.
struct TrainJobOptions {
  std::string config_path;             ///< TOML config file
  std::vector<std::string> overrides;  ///< `section.key=value` applied after the file
  std::string out_dir;                 ///< run directory; empty = runs/<config name>-<time>
  std::string resume;                  ///< "" (fresh run), "auto" (newest good checkpoint in out_dir) or a path
  Catalog catalog = Catalog::builtin();  ///< the data sets, models and config keys the config may use
};

/// When validation accuracy first reached one of `log.time_to_accuracy`'s thresholds.
struct AccuracyReached {
  double threshold = 0;
  bool reached = false;
  double seconds = 0;  ///< wall time since the job started (config and data loading included)
  int64_t epoch = 0;   ///< the validation's epoch, 1-based (a mid-epoch validation: the epoch under way)
  int64_t step = 0;    ///< optimizer steps taken by then
  double accuracy = 0; ///< the validation accuracy measured then
};

/// What the job measured (also written to summary.json, a JSON object whose non-finite numbers, such as a
/// diverged run's test loss, are null).
struct TrainJobResult {
  std::string run_dir;
  double test_loss = 0;
  train::MetricValues test_metrics;  ///< train.metrics on the test set ("accuracy", ...)
  int64_t epochs = 0;  ///< completed epochs
  int64_t steps = 0;
  double wall_seconds = 0;
  double train_samples_per_second = 0;
  bool finished = false;  ///< all configured epochs done (not stopped by max_steps)
  /// Distributed runs: the all-reduces rank 0 started (gradient buckets, evaluation sums) and their bytes.
  int64_t all_reduces = 0;
  int64_t all_reduce_bytes = 0;
  /// Under the launcher: `[zero] stage` and the bytes of this rank's optimizer state at the end (its shard
  /// under ZeRO).
  int64_t zero_stage = 0;
  int64_t optimizer_state_bytes = 0;
  /// The dtype the Trainer's forwards ran under autocast ("bfloat16", "float16"); empty without autocast.
  std::string autocast_dtype;
  /// Rank 0's steps in this process at which norm clipping scaled the gradients down
  /// (train::MetricsLogger::clipped_steps).
  int64_t clipped_steps = 0;
  /// Micro-batches (forward and backward passes) per optimizer step over rank 0's steps in this process:
  /// grad.accumulation_steps when every accumulation window is full.
  double micro_batches_per_step = 0;
  /// The signal (SIGTERM) that stopped training at a step boundary, after the checkpoint of that step was
  /// written; the test evaluation, exports and summary.json were then skipped. 0 when none did.
  /// `trainkit train` exits with 128 + it (143).
  int stop_signal = 0;
  /// One entry per `log.time_to_accuracy` threshold, in its order (a resumed run times from its resume).
  std::vector<AccuracyReached> time_to_accuracy;
};

/// Validates the config and the run directory before writing anything, trains, evaluates on the test
/// set and writes the run directory. SIGTERM during training stops it at the next step boundary with that
/// step's checkpoint written (TrainJobResult::stop_signal); a second SIGTERM ends the process at once.
/// Throws ConfigError / UsageError (nothing written), data::DataError, CheckpointError.
TrainJobResult run_train_job(const TrainJobOptions& options);

/// What `trainkit lr-find` was asked to do (beyond the training config).
struct LrFindJobOptions {
  std::string out_dir = "lr_find";     ///< where lr_find.csv and lr_find.svg go
  tune::LRFinderOptions finder;        ///< range-test settings
  bool use_val = false;                ///< record the validation loss instead of the training loss
};

/// The curve and the suggestions (steepest, valley, minimum/10; those that exist).
struct LrFindJobResult {
  tune::LRFinderResult curve;
  std::vector<tune::Suggestion> suggestions;
};

/// Runs the LR range test on the model, optimizer and data of `config` (read from `source`) and writes
/// lr_find.csv and lr_find.svg to out_dir. Throws like run_train_job.
LrFindJobResult run_lr_find_job(const Config& config, const std::string& source, const LrFindJobOptions& options,
                                const Catalog& catalog = Catalog::builtin());

/// What `trainkit batch-size` was asked to do (beyond the training config).
struct BatchSizeJobOptions {
  tune::BatchSizeFinderOptions finder;  ///< search settings; memory_budget is ignored on CUDA (real OOM)
};

/// Runs the batch-size finder on the model, optimizer and training split of `config` (the validation split
/// excluded) and logs every trial. The data set must be held as tensors (RunData::train_split; the image
/// sets are). Throws like run_train_job, and UsageError for other data sets.
tune::BatchSizeFinderResult run_batch_size_job(const Config& config, const std::string& source,
                                               const BatchSizeJobOptions& options,
                                               const Catalog& catalog = Catalog::builtin());

}  // namespace trainkit::app
