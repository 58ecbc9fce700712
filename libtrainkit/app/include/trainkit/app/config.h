#pragma once
/// @file
/// The TOML configuration of `trainkit train` and the apps (application layer): typed, validated, every
/// key documented in one table. Sections that configure a core component hold its Options struct, whose
/// keys, rules and help come from that struct's OptionBinding (trainkit/options.h); the core library knows
/// nothing of the config.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/args.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/optim/factory.h"
#include "trainkit/sched/factory.h"
#include "trainkit/train/callbacks/early_stopping.h"
#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/train/callbacks/profiler_trace.h"
#include "trainkit/train/callbacks/stochastic_weight_averaging.h"
#include "trainkit/train/ema.h"
#include "trainkit/train/trainer.h"

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

/// `[train]`: the loop's settings beyond the Trainer's (its epochs and max_steps are Config::trainer's).
struct LoopConfig {
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;
  int64_t seed = 0;
  int64_t threads = 0;
  std::string device = "auto";
  std::vector<std::string> metrics = {"accuracy"};
  std::string monitor = "val/loss";
};

/// `[amp]`: mixed precision; the scaler's keys are amp::GradScalerOptions's.
struct AmpConfig {
  bool enabled = false;
  std::string dtype = "bfloat16";
  bool grad_scaler = false;
  amp::GradScalerOptions scaler;
};

/// `[checkpoint]`: when checkpoints are written and how many are kept; the best-k keys are
/// train::ModelCheckpointOptions's (save_top_k 0 = off here; the directory is <run>/best).
struct CheckpointConfig {
  int64_t every_steps = 0;
  int64_t keep_last = 3;
  train::ModelCheckpointOptions best = train::ModelCheckpointOptions().save_top_k(0);
  /// Interchange copies of the final, EMA and SWA weights in <run>/: "safetensors" (<name>.safetensors) and
  /// "state_dict" (torch.save, <name>.pth); empty = none.
  std::vector<std::string> export_formats = {"safetensors"};
};

/// `[early_stopping]`: train::EarlyStopping when enabled, with its options.
struct EarlyStoppingConfig {
  bool enabled = false;
  train::EarlyStoppingOptions options;
};

/// `[ema]`: train::EMAWeightAveraging when enabled, with its options.
struct EmaConfig {
  bool enabled = false;
  train::ModelEmaOptions options;
};

/// `[swa]`: train::StochasticWeightAveraging when enabled, with its options.
struct SwaConfig {
  bool enabled = false;
  train::StochasticWeightAveragingOptions options;
};

/// `[log]`: console and metrics files.
struct LogConfig {
  int64_t every_steps = 100;
  std::string progress = "auto";
  bool tensorboard = false;
  bool layer_norms = false;
};

/// `[profile]`: the step-time profile (always on; its `sync` is Config::trainer's) and a LibTorch profiler
/// trace of `trace_steps` steps (0 = none) with train::ProfilerTraceOptions's other keys.
struct ProfileConfig {
  int64_t trace_steps = 0;
  train::ProfilerTraceOptions trace{"trace.json"};
};

/// `[distributed]`: used when the job runs under `trainkit launch` or torchrun (WORLD_SIZE > 1); the keys
/// are dist::InitOptions's and dist::DistributedDataParallelOptions's.
struct DistributedConfig {
  dist::InitOptions group;
  dist::DistributedDataParallelOptions ddp;
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
  /// The Trainer's options: `[train]` epochs and max_steps, `[grad]` (accumulation_steps, clip_norm =
  /// clip_grad_norm, norm_type, clip_value = clip_grad_value) and `[profile]` sync (= profile_sync).
  train::TrainerOptions trainer = train::TrainerOptions().epochs(12);
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
