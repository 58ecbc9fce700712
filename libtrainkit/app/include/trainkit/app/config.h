#pragma once
/// @file
/// The TOML configuration of `trainkit train` and the apps (application layer): typed, validated, every
/// key documented in one table. Sections that configure a core component hold its Options struct, whose
/// keys, rules and help come from that struct's OptionBinding (trainkit/options.h); the core library knows
/// nothing of the config.

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainkit/amp/grad_scaler.h"
#include "trainkit/args.h"
#include "trainkit/dist/ddp.h"
#include "trainkit/dist/process_group.h"
#include "trainkit/dist/zero.h"
#include "trainkit/optim/factory.h"
#include "trainkit/options.h"
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

/// Config keys that a program adds, bound once to an Options struct of its own (trainkit/options.h): in an
/// existing section (a data set's `[data]` keys, a model's `[model]` keys) or in a section of their own.
/// They are read, checked, printed and listed like the built-in keys; their values live in Config::extra
/// (every key, defaults filled in) and read_extra gives them back typed.
struct ConfigKeys {
  std::string section;  ///< "data", "model", ... or a new section's name
  /// When the keys apply, for the key table ("data.dataset = \"fortunes\""); empty = always.
  std::string applies;
  /// One field per key: reading checks the value by the Options' rule and stores it in a section table.
  OptionBinding<ArgTable> keys;
  ArgTable defaults;  ///< every key and its default value

  /// The keys of `binding` in `section`, with the defaults of `defaults`.
  template <class Options>
  static ConfigKeys of(std::string section, const OptionBinding<Options>& binding, std::string applies = "",
                       const Options& defaults = Options{}) {
    ConfigKeys out{std::move(section), std::move(applies), {}, options_table(binding, defaults)};
    for (const auto& f : binding.fields()) {
      OptionField<ArgTable> g{f.key, f.type, f.expected, f.doc, {}, {}, f.required, f.default_text};
      g.read = [key = f.key, read = f.read, show = f.show, defaults](const ArgValue& value, ArgTable& table) {
        Options options = defaults;
        if (!read(value, options)) {
          return false;
        }
        if (auto shown = show(options)) {
          set_arg(table, key, std::move(*shown));
        }
        return true;
      };
      g.show = [key = f.key](const ArgTable& table) -> std::optional<ArgValue> {
        const ArgValue* v = find_arg(table, key);
        return v != nullptr ? std::optional<ArgValue>(*v) : std::nullopt;
      };
      out.keys.bind(std::move(g));
    }
    return out;
  }
};

/// What the providers of a program add to the config (Catalog::extensions()): the names data.dataset and
/// model.name take, and their keys.
struct ConfigExtensions {
  std::vector<std::string> datasets;  ///< the values of data.dataset
  std::vector<std::string> models;    ///< the values of model.name
  std::vector<ConfigKeys> keys;       ///< further keys and sections
};

/// The built-in providers' names and keys (Catalog::builtin().extensions()): what a config is read with
/// when a program names no extensions.
ConfigExtensions builtin_extensions();

/// `[data]`: which data set, where it is and how it is split; a data set's own keys are its provider's.
struct DataConfig {
  std::string dataset = "fashion-mnist";
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t val_size = 5000;
  int64_t limit_train = 0;
  int64_t limit_test = 0;
};

/// `[model]`: which network and how it is initialized and trained; a model's own keys are its provider's.
struct ModelConfig {
  std::string name = "cnn";
  int64_t checkpoint_segments = 0;
  std::string init = "default";
  std::string torchscript;  ///< model.name = "torchscript": the torch.jit.save file
};

/// `[train]`: the loop's settings beyond the Trainer's (its epochs and max_steps are Config::trainer's).
struct LoopConfig {
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;
  int64_t seed = 0;
  int64_t threads = 0;
  bool host_cache = true;  ///< train::enable_host_caching_allocator() once the data is loaded
  std::string device = "auto";
  std::vector<std::string> metrics = {"accuracy"};
  std::string monitor = "val/loss";
  double label_smoothing = 0.0;  ///< of the training loss (cross-entropy); validation and test stay plain
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

/// `[log]`: console, metrics files, TensorBoard and MLflow tracking.
struct LogConfig {
  int64_t every_steps = 100;
  std::string progress = "auto";
  bool tensorboard = false;
  bool layer_norms = false;
  std::string mlflow_uri;                   ///< "" = no MLflow tracking
  std::string mlflow_experiment = "trainkit";
  std::string mlflow_run_name;              ///< "" = the run directory's name
  /// Validation accuracies whose first time reached summary.json reports (time_to_accuracy); empty = none.
  std::vector<double> time_to_accuracy;
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
  /// `[zero]`: dist::ZeroOptions's keys; stage 0 (the default here) trains with plain DDP.
  dist::ZeroOptions zero = dist::ZeroOptions().stage(0);
  /// `[zero] offload_optimizer`: the optimizer (each rank's shard under stages 1 and 2, the whole optimizer
  /// under stage 0 or in one process) keeps its state and step on the host (optim::OffloadOptimizer).
  bool offload_optimizer = false;
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
  /// The values of the providers' and the program's keys (ConfigExtensions::keys: the built-in image sets' and
  /// models' too) by section, every key present; read_extra gives them back typed.
  std::map<std::string, ArgTable> extra;
};

/// The values of `binding`'s keys in `section` of `config` (ConfigKeys::of(section, binding) was among the
/// extensions the config was read with; keys not there keep `options`' values).
template <class Options>
Options read_extra(const Config& config, const std::string& section, const OptionBinding<Options>& binding,
                   Options options = Options{}) {
  const auto it = config.extra.find(section);
  if (it != config.extra.end()) {
    ArgReader args(it->second, "[" + section + "]");
    read_options(binding, args, options);
  }
  return options;
}

/// Parses `path` and then applies `overrides` (each `section.key=value`, value in TOML syntax or a
/// bare string), validating every key, the built-in ones and those of `extensions`; each table is read once.
/// Throws ConfigError naming the file or override, the key and what was expected.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   const ConfigExtensions& extensions = builtin_extensions());

/// Same as load_config, from TOML text; `source` names it in errors.
Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {},
                    const ConfigExtensions& extensions = builtin_extensions());

/// The configuration as TOML text that parse_config reads back to the same values, but for log.mlflow_uri,
/// which is written without the credentials it may hold (log::mlflow_redacted_uri).
std::string to_toml(const Config& config);

/// A Markdown table of every key, the built-in ones and those of `extensions`: `key | type | default | meaning`.
std::string config_keys_markdown(const ConfigExtensions& extensions = builtin_extensions());

}  // namespace trainkit::app
