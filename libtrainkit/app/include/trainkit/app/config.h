#pragma once
/// @file
/// The TOML configuration of `trainkit train` and the apps (application layer): typed, validated, every
/// key documented in one table. The core library knows nothing of it.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainkit/args.h"
#include "trainkit/optim/factory.h"
#include "trainkit/sched/factory.h"

namespace trainkit::app {

/// A configuration problem: unknown key, wrong type or out-of-range value. what() names the source
/// (file or `--set`), the key and what was expected. Apps exit with code 2 on it.
class ConfigError : public ArgError {
 public:
  using ArgError::ArgError;
};

/// `[data]`: where the data set is and how it is split.
struct DataConfig {
  std::string dataset = "fashion-mnist";
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t val_size = 5000;
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  int64_t workers = 0;
  bool normalize_on_device = false;
  int64_t crop_padding = 0;
  bool horizontal_flip = false;
};

/// `[model]`: the network trained. Defaults come from nn::CnnOptions (set by Config's constructor).
struct ModelConfig {
  std::string name = "cnn";
  int64_t depth = 20;
  bool zero_init_residual = false;
  std::vector<int64_t> channels;
  int64_t hidden = 0;
  double dropout = 0;
  bool batch_norm = false;
  int64_t checkpoint_segments = 0;
  std::string init = "default";
};

/// `[train]`: the loop.
struct LoopConfig {
  int64_t epochs = 12;
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;
  int64_t seed = 0;
  int64_t max_steps = 0;
  int64_t threads = 0;
  std::string device = "auto";
  std::vector<std::string> metrics = {"accuracy"};
  std::string monitor = "val/loss";
};

/// `[grad]`: gradient clipping and accumulation.
struct GradConfig {
  int64_t accumulation_steps = 1;
  double clip_norm = 0.0;
  double norm_type = 2.0;
  double clip_value = 0.0;
};

/// `[amp]`: mixed precision. Scaler defaults come from amp::GradScalerOptions (Config's constructor).
struct AmpConfig {
  bool enabled = false;
  std::string dtype = "bfloat16";
  bool grad_scaler = false;
  double init_scale = 0;
  int64_t growth_interval = 0;
};

/// `[checkpoint]`: when checkpoints are written and how many are kept.
struct CheckpointConfig {
  int64_t every_steps = 0;
  int64_t keep_last = 3;
  /// Best-k weights-only files (train::ModelCheckpoint) in <run>/best/; 0 = off. Monitor and mode default to
  /// train::ModelCheckpointOptions's (Config's constructor).
  int64_t save_top_k = 0;
  std::string monitor;
  std::string mode;
  bool save_last = false;
  /// Interchange copies of the final, EMA and SWA weights in <run>/: "safetensors" (<name>.safetensors) and
  /// "state_dict" (torch.save, <name>.pth); empty = none.
  std::vector<std::string> export_formats = {"safetensors"};
};

/// `[early_stopping]`: train::EarlyStopping; defaults from train::EarlyStoppingOptions (Config's constructor).
struct EarlyStoppingConfig {
  bool enabled = false;
  std::string monitor;
  std::string mode;
  int64_t patience = 0;
  double min_delta = 0;
  bool check_finite = true;
};

/// `[ema]`: train::EMAWeightAveraging; defaults from train::ModelEmaOptions (Config's constructor).
struct EmaConfig {
  bool enabled = false;
  double decay = 0;
  double min_decay = 0;
  int64_t update_after_step = 0;
  bool use_warmup = false;
  double warmup_gamma = 0;
  double warmup_power = 0;
  bool exclude_buffers = false;
};

/// `[swa]`: train::StochasticWeightAveraging; defaults from train::StochasticWeightAveragingOptions (Config's
/// constructor).
struct SwaConfig {
  bool enabled = false;
  int64_t swa_start = 0;
  double swa_lr = 0;
  int64_t anneal_epochs = 0;
  std::string anneal_strategy;
};

/// `[log]`: console and metrics files.
struct LogConfig {
  int64_t every_steps = 100;
  std::string progress = "auto";
  bool tensorboard = false;
  bool layer_norms = false;
};

/// `[profile]`: the step-time profile (always on) and a LibTorch profiler trace of a window of steps;
/// defaults from train::ProfilerTraceOptions (Config's constructor).
struct ProfileConfig {
  bool sync = false;
  int64_t trace_steps = 0;
  int64_t trace_wait = 0;
  bool record_shapes = false;
};

/// `[distributed]`: used when the job runs under `trainkit launch` or torchrun (WORLD_SIZE > 1). Defaults
/// come from dist::ProcessGroupOptions and dist::DistributedDataParallelOptions (Config's constructor).
struct DistributedConfig {
  std::string backend;
  double timeout = 0;
  double bucket_cap_mb = 0;
};

/// The whole configuration; default-constructed it is the documented defaults.
struct Config {
  Config();
  DataConfig data;
  ModelConfig model;
  /// `[optimizer]`: `name` plus PyTorch's argument names, read by optim::parse_optimizer (every value
  /// resolved: unset arguments hold the optimizer's own defaults).
  optim::OptimizerSpec optimizer;
  LoopConfig train;
  GradConfig grad;
  AmpConfig amp;
  CheckpointConfig checkpoint;
  EarlyStoppingConfig early_stopping;
  EmaConfig ema;
  SwaConfig swa;
  LogConfig log;
  ProfileConfig profile;
  DistributedConfig distributed;
  /// `[scheduler]` as written (`type`, PyTorch's argument names, `interval`); empty = constant LR.
  ArgTable scheduler_args;
  /// `[scheduler]` parsed and checked (sched::parse_scheduler); unset = constant LR.
  std::optional<sched::SchedulerSpec> scheduler;
};

/// Parses `path` and then applies `overrides` (each `section.key=value`, value in TOML syntax or a
/// bare string), validating every key; each table is read once. Throws ConfigError naming the file or
/// override, the key and what was expected.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same as load_config, from TOML text; `source` names it in errors.
Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});

/// The configuration as TOML text that parse_config reads back to the same values.
std::string to_toml(const Config& config);

/// A Markdown table of every key: `key | type | default | meaning`.
std::string config_keys_markdown();

}  // namespace trainkit::app
