#pragma once
/// @file
/// The `trainkit train` job: a TOML config in, a run directory out.
///
/// Run directory: `config.toml` (the effective config), `metrics.csv`, `metrics.jsonl`,
/// `checkpoints/ckpt-<step>.tkpt` and `summary.json`.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include "trainkit/data/tensor_loader.h"
#include "trainkit/tune/batch_size_finder.h"
#include "trainkit/tune/lr_finder.h"

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

/// Data, model and optimizer built from a config: what `trainkit train` and `trainkit lr-find` share.
struct RunSetup {
  torch::Device device = torch::kCPU;
  std::unique_ptr<data::TensorLoader> train;
  std::unique_ptr<data::TensorLoader> val;  ///< null when data.val_size is 0
  std::unique_ptr<data::TensorLoader> test;
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

struct TrainConfig;

/// Loads the data, seeds, builds the model and the optimizer of `config`; errors name `source`.
/// With `num_replicas` > 1 the training loader yields shard `rank` of every epoch (DistributedSampler).
RunSetup build_run_setup(const TrainConfig& config, const std::string& source, int64_t num_replicas = 1,
                         int64_t rank = 0);

/// Validates the config and the run directory before writing anything, trains, evaluates on the test
/// set and writes the run directory. Throws ConfigError / UsageError (nothing written),
/// data::DataError, CheckpointError.
TrainJobResult run_train_job(const TrainJobOptions& options);

/// What `trainkit lr-find` was asked to do.
struct LrFindJobOptions {
  std::string config_path;             ///< the training config (model, optimizer, data)
  std::vector<std::string> overrides;  ///< `section.key=value`
  std::string out_dir = "lr_find";     ///< where lr_find.csv and lr_find.svg go
  tune::LRFinderOptions finder;        ///< range-test settings
  bool use_val = false;                ///< record the validation loss instead of the training loss
};

/// The curve and the suggestions (steepest, valley, minimum/10; those that exist).
struct LrFindJobResult {
  tune::LRFinderResult curve;
  std::vector<tune::Suggestion> suggestions;
};

/// Runs the LR range test on the config's model, optimizer and data and writes lr_find.csv and
/// lr_find.svg to out_dir. Throws like run_train_job.
LrFindJobResult run_lr_find_job(const LrFindJobOptions& options);

/// What `trainkit batch-size` was asked to do.
struct BatchSizeJobOptions {
  std::string config_path;             ///< the training config (model, optimizer, data)
  std::vector<std::string> overrides;  ///< `section.key=value`
  tune::BatchSizeFinderOptions finder;  ///< search settings; memory_budget is ignored on CUDA (real OOM)
};

/// Runs the batch-size finder on the config's model, optimizer and training split (the validation split
/// excluded) and logs every trial. Throws like run_train_job.
tune::BatchSizeFinderResult run_batch_size_job(const BatchSizeJobOptions& options);

}  // namespace trainkit::train
